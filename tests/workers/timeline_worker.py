"""The workload behind tests/test_timeline_e2e.py: real ranks recording real timelines.

Usage: ``timeline_worker.py MODE OUT_DIR [--skew-rank1-us US]``

Modes (the test decides the environment: HVDPROF_TIMELINE and friends):

* ``main``: fused allreduces over repeated names (uncached first step, cached after), a
  straggler (rank 1 sleeps before submitting) on both paths, an escaped tensor name, 50
  back-to-back blocking allreduces of one name (``repeat.x``), broadcast/allgather, a small model trained with ``DistributedOptimizer`` under
  ``torch.profiler`` (one Chrome trace per rank), then the start/stop window sequence;
* ``windows``: only the start/stop window sequence (run at 3 ranks);
* ``steps``: ten steps, each ending with a marker op ``mark.steps.<k>`` (for the step
  window and sampling);
* ``kill``: steps until this rank's timeline holds some events, then rank 1 SIGKILLs
  itself with ops in flight;
* ``init``: only ``hvd.init()``, as a user script would (for unwritable paths).

Every step submits the same gradient names, then a marker op named after the phase and
step, after the gradients are done (so the marker lands in the same runtime step). Lines
``INFO <key> <json>`` carry what the test needs (window bounds on the rank's own clock);
sections end with ``SECTION <name> OK <n>`` as in the other workers.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("mode", choices=("main", "windows", "steps", "kill", "init"))
parser.add_argument("out", type=Path)
parser.add_argument("--skew-rank1-us", type=float, default=0.0)
ARGS = parser.parse_args()

# The clock skew is a per-rank setting: only rank 1 gets it (read by hvd.init()).
if ARGS.skew_rank1_us and os.environ.get("HVDPROF_RANK") == "1":
    os.environ["HVDPROF_CLOCK_SKEW_US"] = str(ARGS.skew_rank1_us)

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

if ARGS.mode == "init":
    hvd.init()  # a user script: no try/except around it
    print("INIT SUCCEEDED", flush=True)
    sys.exit(0)

from hvdprof.common import timebase  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
OUT: Path = ARGS.out

#: One fusion group's worth of gradients (all float32, far below the fusion threshold).
GRAD_SHAPES = [(64,), (32, 16), (128,), (8, 8, 4), (1000,), (3,)]
GRADS = [torch.zeros(s) for s in GRAD_SHAPES]
WEIRD_NAME = 'grad/"quoted"\\back\nslash \u00fcnic\u00f8de \u2713 \U0001f680'
STRAGGLER = 1
STRAGGLE_S = 0.3
REPEATS = 50
TOTAL = N * (N + 1) / 2


def info(key: str, value: object) -> None:
    print(f"INFO {key} {json.dumps(value)}", flush=True)


def step(phase: str, k: int, straggle: float = 0.0) -> None:
    """Allreduce every gradient (same names every step), then the marker of this step."""
    if straggle and R == STRAGGLER:
        time.sleep(straggle)
    handles = []
    for i, g in enumerate(GRADS):
        g.fill_((R + 1) * (i + 1))
        handles.append(hvd.allreduce_async_(g, name=f"grad.{i}", op=hvd.Sum))
    for h in handles:
        hvd.synchronize(h)
    ck.true(
        all(bool(torch.all(g == TOTAL * (i + 1))) for i, g in enumerate(GRADS)),
        f"{phase} step {k}: gradient sums",
    )
    mark = hvd.allreduce(torch.tensor([float(k + R)]), name=f"mark.{phase}.{k}", op=hvd.Sum)
    ck.eq(float(mark[0]), float(N * k + N * (N - 1) / 2), f"{phase} step {k}: marker sum")


def window_sequence(keep_last_open: bool) -> None:
    """pre (off) -> win1 -> mid (off) -> win2 (.json.gz) -> post (off, unless kept open).

    ``INFO window <name> [t_before_start_ns, t_after_stop_ns]`` on this rank's clock.
    """
    with ck.section("window_pre"):
        for k in range(2):
            step("pre", k)
    with ck.section("window_win1"):
        t0 = timebase.now_ns()
        hvd.start_timeline(str(OUT / "win1"), mark_cycles=True)
        for k in range(3):
            step("win1", k)
        hvd.stop_timeline()
        info("window", ["win1", t0, timebase.now_ns()])
    with ck.section("window_mid"):
        for k in range(2):
            step("mid", k)  # the runtime keeps working after stop
    with ck.section("window_win2"):
        t0 = timebase.now_ns()
        hvd.start_timeline(str(OUT / "win2.json.gz"), mark_cycles=True)  # restart, gzipped
        for k in range(3):
            step("win2", k)
        if not keep_last_open:
            hvd.stop_timeline()
        info("window", ["win2", t0, None if keep_last_open else timebase.now_ns()])
    if not keep_last_open:
        with ck.section("window_post"):
            for k in range(2):
                step("post", k)


def train_with_profiler() -> None:
    """A small MLP trained with DistributedOptimizer; 3 profiled steps, one trace per rank."""
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.manual_seed(0)
    width = 256
    model = torch.nn.Sequential(
        torch.nn.Linear(64, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, width),
        torch.nn.ReLU(),
        torch.nn.Linear(width, 10),
    )
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01), named_parameters=model.named_parameters()
    )
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    gen = torch.Generator().manual_seed(R)
    x = torch.randn(512, 64, generator=gen)
    y = torch.randint(0, 10, (512,), generator=gen)

    def train_step() -> float:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    for _ in range(2):  # the first step negotiates the names; the profiled ones are cached
        train_step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for k in range(3):
            with record_function(f"train_step_{k}"):
                train_step()
    path = OUT / "kineto" / f"kineto.rank{R}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(path))
    # the replicas stayed identical: the gradients really were averaged
    flat = torch.cat([p.detach().view(-1) for p in model.parameters()])
    everyone = hvd.allgather(flat.view(1, -1), name="check.params")
    ck.true(torch.allclose(everyone[0], everyone[-1]), "replicas identical after training")
    info("kineto", str(path))


def main_mode() -> None:
    with ck.section("record"):
        # step 0: every name new (coordinator path); rank 1 late on both paths
        for k in range(6):
            step("main", k, straggle=STRAGGLE_S if k in (0, 3) else 0.0)
        for k in range(2):  # uncached, then cached
            t = torch.full((5,), float(R + 1))
            out = hvd.allreduce(t, name=WEIRD_NAME, op=hvd.Sum)
            ck.eq(out.tolist(), [TOTAL] * 5, f"weird name allreduce {k}")
        for k in range(REPEATS):  # back to back: each submitted after the previous returned
            out = hvd.allreduce(torch.full((3,), float(k)), name="repeat.x", op=hvd.Sum)
            ck.eq(out.tolist(), [float(N * k)] * 3, f"repeat.x {k}")
        b = hvd.broadcast(torch.full((4,), float(R)), root_rank=0, name="bcast.x")
        ck.eq(b.tolist(), [0.0] * 4, "broadcast")
        g = hvd.allgather(torch.full((2,), float(R)), name="gather.x")
        ck.eq(g.tolist(), [float(r) for r in range(N) for _ in range(2)], "allgather")
        info("straggler", {"rank": STRAGGLER, "steps": [0, 3], "seconds": STRAGGLE_S})
    with ck.section("profile"):
        train_with_profiler()
    with ck.section("stop_init"):
        hvd.stop_timeline()  # ends the recording started by HVDPROF_TIMELINE at init
    window_sequence(keep_last_open=True)


def steps_mode() -> None:
    with ck.section("steps"):
        for k in range(10):
            step("steps", k)
            ck.eq(hvd.runtime_stats()["steps"], k, f"runtime step after step {k}")


def kill_mode() -> None:
    # what the rank recorded: its spool (rendered into the trace when it closes, or
    # after it died) and what its renderer already wrote
    recorded = [
        Path(os.environ["HVDPROF_TIMELINE"]) / f for f in (f"rank.{R}.json", f".rank.{R}.spool")
    ]
    k = 0
    while True:
        # every rank takes the same path through the collectives until rank 1 dies
        size = sum(p.stat().st_size for p in recorded if p.exists())
        mine = R == 1 and k >= 5 and size > 20_000
        ready = hvd.allreduce(torch.tensor([float(mine)]), name="kill.ready", op=hvd.Max)
        if float(ready[0]) == 1.0 and R == 1:
            handles = [
                hvd.allreduce_async_(g, name=f"grad.{i}", op=hvd.Sum) for i, g in enumerate(GRADS)
            ]
            info("killing", {"after_steps": k, "bytes": size, "inflight": len(handles)})
            os.kill(os.getpid(), signal.SIGKILL)
        step("kill", k)
        k += 1


if ARGS.mode == "main":
    main_mode()
elif ARGS.mode == "windows":
    window_sequence(keep_last_open=False)
elif ARGS.mode == "steps":
    steps_mode()
elif ARGS.mode == "kill":
    kill_mode()
if ck.failed_sections:
    print(f"FAILED SECTIONS {ck.failed_sections}", flush=True)
hvd.shutdown()
ck.done()
