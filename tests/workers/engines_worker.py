"""What hvdprof makes of the launcher and the hosts, checked on every rank.

Usage: engines_worker.py HOSTS [--skew-us US]. HOSTS is every rank's expected host name,
comma-separated (``-``: the machine's name for every rank). Run under any launcher (through
``launched.py`` for the non-hvdprof ones); ``HVDPROF_HOSTNAME`` makes ranks report other
host names. Ranks that are not on rank 0's host run their timeline clock ``US`` ahead.

Sections: topology (rank/size as the launcher's own variables say, local and cross ranks
as the host names say), engine (which launcher and backend the runtime chose; shared
memory only when every rank is on one host), collectives (allreduce big and small,
allgather of uneven rows, broadcast, alltoall, reducescatter: values checked).
Prints ``INFO launcher <name>``, ``INFO engine <backend>``, ``INFO shm <0|1>``.
"""

from __future__ import annotations

import argparse
import os
import socket

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("hosts")
parser.add_argument("--skew-us", type=float, default=0.0)
ARGS = parser.parse_args()

EXPECTED_RANK = int(os.environ.get("HVDTEST_RANK") or os.environ["HVDPROF_RANK"])
EXPECTED_SIZE = int(os.environ.get("HVDTEST_SIZE") or os.environ["HVDPROF_SIZE"])
HOSTS = [socket.gethostname()] * EXPECTED_SIZE if ARGS.hosts == "-" else ARGS.hosts.split(",")
if ARGS.skew_us and HOSTS[EXPECTED_RANK] != HOSTS[0]:
    os.environ["HVDPROF_CLOCK_SKEW_US"] = str(ARGS.skew_us)

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime import runtime as rt  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)


def check_topology() -> None:
    ck.eq(R, EXPECTED_RANK, "rank as the launcher says")
    ck.eq(N, EXPECTED_SIZE, "size as the launcher says")
    mine = HOSTS[R]
    on_my_host = [r for r in range(N) if HOSTS[r] == mine]
    hosts_in_order = list(dict.fromkeys(HOSTS))
    ck.eq(hvd.local_rank(), on_my_host.index(R), "local_rank: position on this host")
    ck.eq(hvd.local_size(), len(on_my_host), "local_size: ranks on this host")
    ck.eq(hvd.cross_rank(), hosts_in_order.index(mine), "cross_rank: this host's number")
    ck.eq(hvd.cross_size(), len(hosts_in_order), "cross_size: hosts")
    ck.eq(rt.current().host_name, mine, "the runtime's host name")


def check_engine() -> None:
    runtime = rt.current()
    print(f"INFO launcher {runtime.launch.launcher}", flush=True)
    print(f"INFO engine {runtime.data_engine}", flush=True)
    print(f"INFO shm {int(runtime.shm is not None)}", flush=True)
    print(f"INFO control {type(runtime.control).__name__}", flush=True)
    if len(set(HOSTS)) > 1:
        ck.true(runtime.shm is None, "no shared memory across hosts")


def check_collectives() -> None:
    before = hvd.runtime_stats()
    for i in range(12):  # above the small-allreduce size: the backend (or shared memory)
        t = torch.full((300_000,), float(R + 1 + i))
        out = hvd.allreduce(t, op=hvd.Sum, name=f"big.{i}")
        expected = sum(r + 1 + i for r in range(N))
        ck.true(bool((out == expected).all()), f"big allreduce {i}: {out[:3]} != {expected}")
    small = hvd.allreduce(torch.tensor([float(R)]), op=hvd.Max, name="small")
    ck.eq(small.item(), float(N - 1), "small allreduce (Max)")
    avg = hvd.allreduce(torch.arange(6, dtype=torch.float16) + R, name="half")
    ck.tensor(avg, torch.arange(6, dtype=torch.float16) + (N - 1) / 2, "float16 average")
    after = hvd.runtime_stats()
    if rt.current().shm is None:
        ck.eq(after["shm_allreduces"], before["shm_allreduces"], "no shared-memory allreduce")
    rows = hvd.allgather(torch.full((R + 1, 2), R, dtype=torch.int32), name="gather")
    expected_rows = torch.cat([torch.full((r + 1, 2), r, dtype=torch.int32) for r in range(N)])
    ck.tensor(rows, expected_rows, "allgather of uneven rows")
    for root in range(N):
        b = hvd.broadcast(torch.tensor([R * 10, 7], dtype=torch.int64), root, name=f"b{root}")
        ck.tensor(b, torch.tensor([root * 10, 7]), f"broadcast from {root}")
    send = torch.arange(N, dtype=torch.float64) + 100 * R
    got = hvd.alltoall(send, name="a2a")
    ck.tensor(got, torch.tensor([100.0 * r + R for r in range(N)], dtype=torch.float64), "alltoall")
    rs = hvd.reducescatter(torch.ones(N * 2 + 1, 3), op=hvd.Sum, name="rs")
    base, extra = divmod(N * 2 + 1, N)
    ck.tensor(rs, torch.full((base + int(extra > R), 3), float(N)), "reducescatter")


def main() -> None:
    for name, check in (
        ("topology", check_topology),
        ("engine", check_engine),
        ("collectives", check_collectives),
    ):
        with ck.section(name):
            check()
    with ck.section("shutdown"):
        hvd.shutdown()
    ck.done()


if __name__ == "__main__":
    main()
