"""Collective backends. The cycle talks to ``CollectiveBackend`` only, so MPI (mpi4py) and
NCCL slot in without touching it."""

from hvdprof.runtime.backends.base import CollectiveBackend, Work

__all__ = ["CollectiveBackend", "Work"]
