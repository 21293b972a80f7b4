"""``import hvdprof.torch as hvd``: a drop-in replacement for ``import horovod.torch as hvd``."""

# First: a folder named hvdprof that hides the installed package is noticed and undone
# before anything reads the package itself (hvdprof/shadowing.py).
from hvdprof.shadowing import repair_if_shadowed

repair_if_shadowed()

from hvdprof.excepthook import install_excepthook
from hvdprof.runtime import stacks as _stacks
from hvdprof.torch import elastic
from hvdprof.torch.compression import Compression
from hvdprof.torch.functions import (
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from hvdprof.torch.mpi_ops import (
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_async,
    allreduce,
    allreduce_,
    allreduce_async,
    allreduce_async_,
    alltoall,
    alltoall_async,
    barrier,
    broadcast,
    broadcast_,
    broadcast_async,
    broadcast_async_,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    gloo_built,
    gloo_enabled,
    grouped_allgather,
    grouped_allgather_async,
    grouped_allreduce,
    grouped_allreduce_,
    grouped_allreduce_async,
    grouped_allreduce_async_,
    grouped_reducescatter,
    grouped_reducescatter_async,
    init,
    is_homogeneous,
    is_initialized,
    join,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    poll,
    rank,
    reducescatter,
    reducescatter_async,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
    sycl_built,
    synchronize,
)
from hvdprof.torch.optimizer import DistributedOptimizer
from hvdprof.torch.process_sets import (
    ProcessSet,
    add_process_set,
    global_process_set,
    process_set_by_id,
    process_sets,
    remove_process_set,
)
from hvdprof.torch.sparse import sparse_allreduce_async
from hvdprof.torch.sync_batch_norm import SyncBatchNorm

install_excepthook()
# under ``hvdprof run``, SIGUSR1 prints this rank's stacks from now on (init installs it
# in any case): the earlier, the smaller the window in which the signal is dropped
_stacks.install_under_launcher()


def runtime_stats() -> dict:
    """hvdprof's counters (cycles, fused groups, cache hits, bytes reduced...), this rank."""
    from hvdprof.runtime import runtime as _rt

    return _rt.get().stats()


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "SyncBatchNorm",
    "add_process_set",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "alltoall",
    "alltoall_async",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allgather",
    "grouped_allgather_async",
    "grouped_allreduce",
    "grouped_allreduce_",
    "grouped_allreduce_async",
    "grouped_allreduce_async_",
    "grouped_reducescatter",
    "grouped_reducescatter_async",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "process_set_by_id",
    "process_sets",
    "rank",
    "reducescatter",
    "reducescatter_async",
    "remove_process_set",
    "rocm_built",
    "runtime_stats",
    "shutdown",
    "size",
    "sparse_allreduce_async",
    "start_timeline",
    "stop_timeline",
    "sycl_built",
    "synchronize",
]
