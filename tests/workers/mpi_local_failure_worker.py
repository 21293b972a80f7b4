"""Under MPI, one rank fails alone inside a collective (its backend raises) while the
others wait inside MPI: the job must end, with that rank's reason, not hang.

Usage: mpi_local_failure_worker.py FAILING_RANK."""

from __future__ import annotations

import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime.backends import mpi  # noqa: E402

FAILING = int(sys.argv[1])
hvd.init()
if hvd.rank() == FAILING:

    def broken(self, output, tensor, rows):  # type: ignore[no-untyped-def]
        raise RuntimeError("injected: this rank's allgatherv failed before joining")

    mpi.MpiBackend.allgatherv = broken
print(hvd.allgather(torch.ones(hvd.rank() + 1, 2)).shape, flush=True)
hvd.shutdown()
print("OK", flush=True)
