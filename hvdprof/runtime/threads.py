"""Intra-op threads: a fair share of the host's cores per rank, for the launcher and the
runtime's own threads.

Left alone, every rank's torch starts one OpenMP thread per core. With N ranks on a host
that is N times too many, and OpenMP's threads spin-wait between parallel regions: on 2
cores at 2 ranks, ResNet-50's gradient allreduce through shared memory took 185-216 ms
per step instead of 27-37 ms with ``OMP_NUM_THREADS=1``. Two places act on it:

* ``hvdprof run`` gives every rank ``OMP_NUM_THREADS = max(1, cores // ranks)`` when the
  user set neither ``OMP_NUM_THREADS`` nor ``MKL_NUM_THREADS`` (as ``torchrun`` does),
  unless ``HVDPROF_THREADS_DEFAULT=0``;
* the cycle thread, which runs the reductions while the user's threads compute, limits
  *its own* OpenMP team to that share whatever launched the rank (``mpirun`` and
  ``srun`` set nothing). OpenMP's thread count is a per-thread setting, but
  ``torch.set_num_threads`` also changes the default that threads started later inherit,
  so we call ``omp_set_num_threads`` of the OpenMP library torch loaded, on the cycle
  thread only: the user's threads keep their own setting.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
from collections.abc import Mapping

#: Variables that already say how many threads a rank should use.
THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: Shared libraries that implement ``omp_set_num_threads`` (GNU, LLVM, Intel OpenMP).
_OPENMP_LIBS = ("libgomp", "libomp", "libiomp")


def usable_cores() -> int:
    """Cores this process may run on (its CPU affinity, which containers restrict)."""
    with contextlib.suppress(AttributeError, OSError):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def per_rank_threads(local_size: int, cores: int | None = None) -> int:
    """One rank's fair share of the host's cores: ``max(1, cores // local_size)``."""
    return max(1, (usable_cores() if cores is None else cores) // max(1, local_size))


def cores_filled(local_size: int, training_threads: int, cores: int | None = None) -> bool:
    """Whether this host's ranks' training threads (torch's intra-op threads each) fill its
    cores: a reduction started while they compute then only takes CPU from them."""
    return max(1, local_size) * max(1, training_threads) >= (
        usable_cores() if cores is None else cores
    )


def user_thread_setting(environ: Mapping[str, str]) -> str | None:
    """The first of ``THREAD_VARS`` that ``environ`` sets (non-empty), else None."""
    return next((name for name in THREAD_VARS if environ.get(name, "").strip()), None)


@functools.cache
def openmp_set_num_threads() -> ctypes._CFuncPtr | None:  # type: ignore[name-defined]
    """``omp_set_num_threads`` of the OpenMP runtime torch loaded (None if torch does not
    parallelise with OpenMP: its other backend has one process-wide pool, which only the
    user may resize)."""
    import torch

    if "parallel backend: OpenMP" not in torch.__config__.parallel_info():
        return None
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        if any(os.path.basename(path).startswith(lib) for lib in _OPENMP_LIBS):
            with contextlib.suppress(OSError, AttributeError):
                fn = ctypes.CDLL(path).omp_set_num_threads
                fn.argtypes = [ctypes.c_int]
                fn.restype = None
                return fn
    return None


def limit_this_thread(share: int) -> int:
    """Cap the calling thread's intra-op threads at ``share``; returns what it now uses.

    Only the calling thread changes, and only downwards. Does nothing unless torch
    parallelises with OpenMP.
    """
    import torch

    # Also runs torch's lazy per-thread initialisation, which would otherwise reset the
    # count we set at this thread's first parallel op.
    current = torch.get_num_threads()
    if current <= share:
        return current
    set_threads = openmp_set_num_threads()
    if set_threads is None:
        return current
    set_threads(share)
    return torch.get_num_threads()
