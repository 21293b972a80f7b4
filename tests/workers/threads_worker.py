"""What a rank sees of its intra-op threads (for ``tests/test_threads.py``).

``threads_worker.py env``: no torch; prints ``OMP <value or UNSET>`` and
``MKL <value or UNSET>``: what the launcher put in the rank's environment.

``threads_worker.py torch [N]``: optionally ``torch.set_num_threads(N)`` (the user's own
choice), then ``hvd.init()`` and one allreduce; prints ``MAIN_THREADS <n>`` (the user's
thread, which hvdprof must leave alone), ``CYCLE_THREADS <n>`` (measured on the cycle
thread itself) and ``NEW_THREAD_THREADS <n>`` (a thread the user starts after init, which
must still get the process default). Checks the allreduce.
"""

from __future__ import annotations

import os
import sys
import threading


def env() -> None:
    for tag, name in (("OMP", "OMP_NUM_THREADS"), ("MKL", "MKL_NUM_THREADS")):
        print(f"{tag} {os.environ.get(name, 'UNSET')}", flush=True)


def with_torch(user_threads: int | None) -> None:
    import _common

    _common.start_watchdog()
    import torch

    import hvdprof.torch as hvd
    from hvdprof.runtime import runtime

    if user_threads is not None:
        torch.set_num_threads(user_threads)
    hvd.init()
    ck = _common.Checks(hvd.rank())
    with ck.section("threads"):
        out = hvd.allreduce(torch.ones(1 << 18), op=hvd.Sum, name="threads.sum")
        ck.tensor(out, torch.full((1 << 18,), float(hvd.size())), "allreduce")
        seen: list[int] = []
        runtime.get().run_collectively(lambda: seen.append(torch.get_num_threads()))
        print(f"MAIN_THREADS {torch.get_num_threads()}", flush=True)
        print(f"CYCLE_THREADS {seen[0]}", flush=True)
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        print(f"NEW_THREAD_THREADS {later[0]}", flush=True)
    hvd.shutdown()
    ck.done()


if __name__ == "__main__":
    if sys.argv[1] == "env":
        env()
    else:
        with_torch(int(sys.argv[2]) if len(sys.argv) > 2 else None)
