"""The collective ops of ``horovod.torch``, same names, signatures and defaults.

Every op is an ``*_async`` returning an integer handle plus ``synchronize(handle)``; the
blocking op is the pair called together. This module only turns tensors into runtime
requests and handles back into tensors.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hvdprof.config import Config
from hvdprof.errors import HvdprofInternalError
from hvdprof.runtime import runtime as _rt
from hvdprof.runtime.backends.gloo import SUPPORTED_DTYPES
from hvdprof.runtime.handles import Handle
from hvdprof.runtime.requests import OpType, ReduceOp, Signature
from hvdprof.torch.compression import Compression

HorovodInternalError = HvdprofInternalError

Average = int(ReduceOp.AVERAGE)
Sum = int(ReduceOp.SUM)
Adasum = int(ReduceOp.ADASUM)
Min = int(ReduceOp.MIN)
Max = int(ReduceOp.MAX)
Product = int(ReduceOp.PRODUCT)


class ProcessSet:
    """Only the global process set exists; accepted for signature compatibility."""

    process_set_id = 0

    def __repr__(self) -> str:
        return "ProcessSet(global)"


global_process_set = ProcessSet()


# ------------------------------------------------------------------ set-up and topology
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start the runtime (idempotent). Reads every HVDPROF_* variable once."""
    if comm is not None:
        raise ValueError(
            "hvdprof.torch.init(comm=...) is not supported: ranks come from `hvdprof run`"
        )
    _rt.init(Config.from_env())


def shutdown() -> None:
    _rt.shutdown()
    _handles.clear()


def is_initialized() -> bool:
    runtime = _rt.current()
    return runtime is not None and not runtime.cycle.shutdown_requested


def _topology() -> _rt.Topology:
    return _rt.get().topology


def size() -> int:
    return _topology().size


def rank() -> int:
    return _topology().rank


def local_size() -> int:
    return _topology().local_size


def local_rank() -> int:
    return _topology().local_rank


def cross_size() -> int:
    return _topology().cross_size


def cross_rank() -> int:
    return _topology().cross_rank


def is_homogeneous() -> bool:
    return True


def mpi_threads_supported() -> bool:
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return is_initialized()


def gloo_built() -> bool:
    return True


def nccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


# ------------------------------------------------------------------ handles
class _HandleTable:
    """int handle -> the runtime handle, or (runtime handles, finisher) for the rest.

    Ints, as Horovod returns them. A single op whose result is its handle's result (most
    of them: every allreduce) is stored as the handle itself, with no list or tuple
    around it: these entries are made once per tensor per step.
    """

    def __init__(self) -> None:
        # itertools.count and single dict operations are atomic under the GIL: no lock
        # on the per-op path.
        self._counter = itertools.count()
        self._items: dict[int, Handle | tuple[list[Handle], Callable[[list[Any]], Any]]] = {}

    def add_single(self, handle: Handle) -> int:
        key = next(self._counter)
        self._items[key] = handle
        return key

    def add(self, handles: list[Handle], finish: Callable[[list[Any]], Any]) -> int:
        key = next(self._counter)
        self._items[key] = (handles, finish)
        return key

    def handles(self, key: int) -> list[Handle]:
        item = self._items.get(key)
        if item is None:
            raise ValueError(f"handle {key!r} is unknown or was already synchronized")
        return item[0] if type(item) is tuple else [item]

    def take(self, key: int) -> Handle | tuple[list[Handle], Callable[[list[Any]], Any]] | None:
        return self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()


_handles = _HandleTable()


def poll(handle: int) -> bool:
    """True when the op is done and ``synchronize`` will not block."""
    return all(h.done_flag for h in _handles.handles(handle))


def synchronize(handle: int) -> Any:
    """Wait for the op and return its output (a tensor, or a list for grouped ops).

    An unknown or already synchronized handle returns None, as in Horovod.
    """
    item = _handles.take(handle)
    if item is None:
        return None
    if type(item) is not tuple:
        return item.wait()
    handles, finish = item
    return finish([h.wait() for h in handles])


def _single(outputs: list[Any]) -> Any:
    return outputs[0]


def _as_list(outputs: list[Any]) -> Any:
    return outputs


# ------------------------------------------------------------------ validation
_OPS_BY_VALUE = {int(o): o for o in ReduceOp}
_DTYPE_NAMES = {d: str(d) for d in SUPPORTED_DTYPES}


def _resolve_op(op: int | None, average: bool | None) -> ReduceOp:
    if average is None and op is not None:
        resolved = _OPS_BY_VALUE.get(op)
        if resolved is not None and resolved != ReduceOp.ADASUM:
            return resolved
    if op is not None and average is not None:
        raise ValueError("The op parameter supersedes average. Please provide only one of them.")
    if average is not None:
        warnings.warn(
            "Parameter `average` has been replaced with `op` and will be removed in v1.0",
            DeprecationWarning,
            stacklevel=3,
        )
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    if op is None:
        return ReduceOp.AVERAGE
    try:
        resolved = ReduceOp(int(op))
    except ValueError:
        raise ValueError(
            f"unknown reduction op {op!r}; use hvd.Average, Sum, Min, Max or Product"
        ) from None
    if resolved == ReduceOp.ADASUM:
        raise NotImplementedError("Adasum is not supported by hvdprof; use Average or Sum")
    return resolved


def _check_tensor(tensor: Any, what: str, runtime: _rt.Runtime, in_place: bool) -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(
            f"hvdprof rank {runtime.rank}: {what} expects a torch.Tensor, got {type(tensor).__name__}"
        )
    if tensor.dtype not in _DTYPE_NAMES:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} does not support dtype {tensor.dtype}; supported: "
            + ", ".join(sorted(str(d).replace("torch.", "") for d in SUPPORTED_DTYPES))
        )
    if not tensor.is_cpu:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} got a tensor on {tensor.device}; this build has "
            "the Gloo backend only (CPU tensors)"
        )
    if not tensor.is_contiguous():
        if in_place:
            raise ValueError(
                f"hvdprof rank {runtime.rank}: {what} requires a contiguous tensor to work in place"
            )
        tensor = tensor.contiguous()
    return tensor.detach() if tensor.requires_grad else tensor


def _check_name(name: Any) -> str | None:
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ValueError(f"op name must be a non-empty string, got {name!r}")
    return name


def _signature(
    op: OpType,
    tensor: torch.Tensor,
    reduce_op: ReduceOp = ReduceOp.SUM,
    root_rank: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> Signature:
    # CPU only (checked by _check_tensor); the device field is there for NCCL later.
    return Signature(
        op,
        _DTYPE_NAMES[tensor.dtype],
        tuple(tensor.shape),
        reduce_op,
        root_rank,
        float(prescale),
        float(postscale),
        "cpu",
    )


# ------------------------------------------------------------------ allreduce
#: (dtype, shape, op, prescale, postscale) -> Signature. A training step submits the same
#: few signatures every step; sharing one object per signature saves building a tuple
#: per op here, and makes the cycle thread's cache check an identity test.
_ALLREDUCE_SIGNATURES: dict[tuple[Any, ...], Signature] = {}
_SIGNATURES_KEPT = 4096


def _allreduce_signature(
    tensor: torch.Tensor, op: ReduceOp, prescale_factor: float, postscale_factor: float
) -> Signature:
    sig = Signature(
        OpType.ALLREDUCE,
        _DTYPE_NAMES[tensor.dtype],
        tuple(tensor.shape),
        op,
        -1,
        float(prescale_factor),
        float(postscale_factor),
        "cpu",
    )
    key = (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor)
    try:
        if len(_ALLREDUCE_SIGNATURES) >= _SIGNATURES_KEPT:
            _ALLREDUCE_SIGNATURES.clear()
        _ALLREDUCE_SIGNATURES[key] = sig
    except TypeError:  # an unhashable scale factor (a tensor): nothing to remember
        pass
    return sig


def _allreduce_async(
    tensor: torch.Tensor,
    in_place: bool,
    name: str | None,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    what: str,
    checked: bool = False,
) -> Handle:
    runtime = _rt.get()
    if not checked:
        tensor = _check_tensor(tensor, what, runtime, in_place)
    output = tensor if in_place else torch.empty_like(tensor)
    # the per-op path: _signature and _check_name inlined (a few hundred ns per op)
    try:
        sig = _ALLREDUCE_SIGNATURES[
            (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor)
        ]
    except (KeyError, TypeError):
        sig = _allreduce_signature(tensor, op, prescale_factor, postscale_factor)
    if name is not None and (name.__class__ is not str or not name):
        _check_name(name)
    return runtime.submit(name, "allreduce", sig, tensor, output)


def allreduce_async(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an allreduce; the input is not modified. Returns a handle."""
    reduce_op = _resolve_op(op, average)
    h = _allreduce_async(
        tensor, False, name, reduce_op, prescale_factor, postscale_factor, "allreduce"
    )
    return _handles.add_single(h)


def allreduce_async_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Start an in-place allreduce. Returns a handle."""
    reduce_op = _resolve_op(op, average)
    h = _allreduce_async(
        tensor, True, name, reduce_op, prescale_factor, postscale_factor, "allreduce_"
    )
    return _handles.add_single(h)


class _AllreduceFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):  # type: ignore[override]
        ctx.op = op
        ctx.average = average
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return synchronize(
            allreduce_async(
                tensor, average, name, op, prescale_factor, postscale_factor, process_set
            )
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = allreduce(
            grad_output,
            average=ctx.average,
            op=ctx.op,
            prescale_factor=ctx.scales[0],
            postscale_factor=ctx.scales[1],
        )
        return grad, None, None, None, None, None, None


def allreduce(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Average (default) or reduce ``tensor`` over all ranks; differentiable."""
    compressed, ctx = compression.compress(tensor)
    reduced = _AllreduceFunction.apply(
        compressed, average, name, op, prescale_factor, postscale_factor, process_set
    )
    return compression.decompress(reduced, ctx)


def allreduce_(
    tensor: torch.Tensor,
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return synchronize(
        allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set)
    )


# ------------------------------------------------------------------ grouped allreduce
def _grouped_async(
    tensors: Sequence[torch.Tensor],
    in_place: bool,
    name: str | None,
    op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
) -> int:
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    name = _check_name(name)
    runtime = _rt.get()
    # Validate every member before submitting any: a bad member fails the whole group.
    checked = [_check_tensor(t, "grouped_allreduce", runtime, in_place) for t in tensors]
    names = [None if name is None else f"{name}.{i}" for i in range(len(checked))]
    busy = [n for n in names if n is not None and runtime.is_in_flight(n)]
    if busy:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: grouped_allreduce {name!r} has members already in flight: {busy}"
        )
    handles = [
        _allreduce_async(
            t, in_place, n, op, prescale_factor, postscale_factor, "grouped_allreduce", checked=True
        )
        for t, n in zip(checked, names, strict=True)
    ]
    return _handles.add(handles, _as_list)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """One handle for a list of tensors reduced together (fused when they fit)."""
    return _grouped_async(
        tensors, False, name, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def grouped_allreduce_async_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _grouped_async(
        tensors, True, name, _resolve_op(op, average), prescale_factor, postscale_factor
    )


def grouped_allreduce(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    compressed = [compression.compress(t) for t in tensors]
    outputs = synchronize(
        grouped_allreduce_async(
            [c for c, _ in compressed], average, name, op, prescale_factor, postscale_factor
        )
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outputs, compressed, strict=True)]


def grouped_allreduce_(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    return synchronize(
        grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor)
    )


# ------------------------------------------------------------------ allgather
def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Concatenate every rank's tensor along the first dimension (which may differ)."""
    runtime = _rt.get()
    tensor = _check_tensor(tensor, "allgather", runtime, False)
    sig = _signature(OpType.ALLGATHER, tensor)
    h = runtime.submit(_check_name(name), "allgather", sig, tensor, None)
    return _handles.add_single(h)


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):  # type: ignore[override]
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        output = synchronize(allgather_async(tensor, name))
        return output

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        reduced = allreduce(grad_output, op=Average)
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64)))
        offset = int(dims[: rank()].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    return _AllgatherFunction.apply(tensor, name, process_set)


# ------------------------------------------------------------------ broadcast
def _broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None, in_place: bool) -> int:
    runtime = _rt.get()
    what = "broadcast_" if in_place else "broadcast"
    tensor = _check_tensor(tensor, what, runtime, in_place)
    if not isinstance(root_rank, int) or not 0 <= root_rank < runtime.size:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} root_rank={root_rank!r} is out of range for {runtime.size} ranks"
        )
    output = tensor if in_place else torch.empty_like(tensor)
    sig = _signature(OpType.BROADCAST, tensor, ReduceOp.SUM, root_rank)
    h = runtime.submit(_check_name(name), "broadcast", sig, tensor, output)
    return _handles.add_single(h)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _broadcast_async(tensor, root_rank, name, False)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _broadcast_async(tensor, root_rank, name, True)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank = root_rank
        return synchronize(broadcast_async(tensor, root_rank, name))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = allreduce(grad_output, op=Average)
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name))


# ------------------------------------------------------------------ alltoall
def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Send ``splits[r]`` rows to rank r; receive from each. Returns a handle."""
    runtime = _rt.get()
    tensor = _check_tensor(tensor, "alltoall", runtime, False)
    rows = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        if rows % runtime.size:
            raise ValueError(
                f"hvdprof rank {runtime.rank}: alltoall without splits needs the first dimension "
                f"({rows}) divisible by the number of ranks ({runtime.size})"
            )
        split_list = (rows // runtime.size,) * runtime.size
    else:
        values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
        split_list = tuple(int(v) for v in values)
        if (
            len(split_list) != runtime.size
            or any(v < 0 for v in split_list)
            or sum(split_list) != rows
        ):
            raise ValueError(
                f"hvdprof rank {runtime.rank}: alltoall splits {list(split_list)} must have one "
                f"non-negative entry per rank ({runtime.size}) summing to the first dimension ({rows})"
            )
    sig = _signature(OpType.ALLTOALL, tensor)
    h = runtime.submit(_check_name(name), "alltoall", sig, tensor, None, split_list)
    finish = _single if splits is not None else (lambda outputs: outputs[0][0])
    return _handles.add([h], finish)


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        output, received = synchronize(alltoall_async(tensor, splits, name))
        ctx.received = received
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):  # type: ignore[override]
        # what each rank received is what it sends back
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.received))
        return grad, None, None, None


def alltoall(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> Any:
    """As Horovod: the output alone without ``splits``; ``(output, received_splits)`` with.

    Differentiable: the gradient flows back through the inverse alltoall.
    """
    if splits is None:
        runtime = _rt.get()
        rows = tensor.shape[0] if tensor.dim() else 1
        if rows % runtime.size:
            raise ValueError(
                f"hvdprof rank {runtime.rank}: alltoall without splits needs the first dimension "
                f"({rows}) divisible by the number of ranks ({runtime.size})"
            )
        even = [rows // runtime.size] * runtime.size
        output, _ = _AlltoallFunction.apply(tensor, even, name, process_set)
        return output
    return _AlltoallFunction.apply(tensor, splits, name, process_set)


# ------------------------------------------------------------------ reducescatter
def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Reduce, then give rank r its share of the first dimension (extra rows to low ranks)."""
    runtime = _rt.get()
    reduce_op = _resolve_op(op, None)
    tensor = _check_tensor(tensor, "reducescatter", runtime, False)
    if tensor.dim() == 0:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: reducescatter needs a tensor with at least one dimension"
        )
    sig = _signature(OpType.REDUCESCATTER, tensor, reduce_op, -1, prescale_factor, postscale_factor)
    h = runtime.submit(_check_name(name), "reducescatter", sig, tensor, None)
    return _handles.add_single(h)


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    compressed, ctx = compression.compress(tensor)
    out = synchronize(
        reducescatter_async(compressed, name, op, process_set, prescale_factor, postscale_factor)
    )
    return compression.decompress(out, ctx)


# ------------------------------------------------------------------ barrier and join
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank has called barrier."""
    runtime = _rt.get()
    sig = Signature(OpType.BARRIER, "none", (), ReduceOp.SUM, -1, 1.0, 1.0, "cpu")
    h = runtime.submit(None, "barrier", sig, None, None)
    h.wait()


def join(device: int = -1) -> int:
    """Stop submitting; contribute zeros to other ranks' allreduces until every rank joins.

    Returns the rank that joined last.
    """
    return _rt.get().join()


# ------------------------------------------------------------------ timeline control
def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Start recording, at the same cycle on every rank (call it on every rank)."""
    from hvdprof.timeline.control import start_timeline as _start

    _start(_rt.get(), file_path, mark_cycles)


def stop_timeline() -> None:
    from hvdprof.timeline.control import stop_timeline as _stop

    _stop(_rt.get())
