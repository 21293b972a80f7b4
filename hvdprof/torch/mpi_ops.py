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
from hvdprof.runtime.adasum import AdasumUnsupportedError, is_power_of_two
from hvdprof.runtime.backends.gloo import SUPPORTED_DTYPES
from hvdprof.runtime.dtypes import ADASUM_DTYPES
from hvdprof.runtime.handles import Handle
from hvdprof.runtime.requests import OpType, ReduceOp, Signature
from hvdprof.torch import process_sets as _sets
from hvdprof.torch.compression import Compression
from hvdprof.torch.process_sets import (
    ProcessSet,
    global_process_set,
    in_set,
    rank_in,
    set_of,
    set_size,
    size_of,
)

HorovodInternalError = HvdprofInternalError

Average = int(ReduceOp.AVERAGE)
Sum = int(ReduceOp.SUM)
Adasum = int(ReduceOp.ADASUM)
Min = int(ReduceOp.MIN)
Max = int(ReduceOp.MAX)
Product = int(ReduceOp.PRODUCT)


# ------------------------------------------------------------------ set-up and topology
def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start the runtime (idempotent). Reads every HVDPROF_* variable once.

    ``process_sets``: the sets to register now (``ProcessSet`` objects, lists of ranks or
    mpi4py communicators; every rank passes the same), or ``"dynamic"`` to allow
    ``add_process_set``/``remove_process_set`` later.
    """
    if comm is not None:
        raise ValueError(
            "hvdprof.torch.init(comm=...) is not supported: ranks come from `hvdprof run`"
        )
    fresh = not is_initialized()
    _rt.init(Config.from_env())
    _sets.set_up(process_sets, fresh)


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
    """Whether this job's collectives run on MPI (``HVDPROF_BACKEND=mpi`` under mpirun)."""
    runtime = _rt.current()
    return runtime is not None and is_initialized() and runtime.data_engine == "mpi"


def mpi_built() -> bool:
    """Whether the MPI engine can be used here (mpi4py is installed)."""
    from hvdprof.runtime.environment import mpi4py_installed

    return mpi4py_installed()


def gloo_enabled() -> bool:
    return is_initialized() and not mpi_enabled()


def gloo_built() -> bool:
    return True


def nccl_built() -> bool:
    """Whether this torch has NCCL (CUDA tensors then go through an NCCL group)."""
    return bool(torch.cuda.is_available() and torch.distributed.is_nccl_available())


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return bool(torch.backends.cuda.is_built())


def rocm_built() -> bool:
    return False


def sycl_built() -> bool:
    """Intel's Horovod (SYCL, XPU devices) asks this; hvdprof has no SYCL path."""
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
#: (the table's parts, for the per-op path of ``allreduce_async_``)
_handles_counter, _handles_items = _handles._counter, _handles._items


def poll(handle: int) -> bool:
    """True when the op is done and ``synchronize`` will not block."""
    if all(h.done_flag for h in _handles.handles(handle)):
        return True
    runtime = _rt.current()
    if runtime is not None:  # a polling loop must see the op progress without waiting on it
        runtime.nudge()
    return False


def synchronize(handle: int) -> Any:
    """Wait for the op and return its output (a tensor, or a list for grouped ops).

    An unknown or already synchronized handle returns None, as in Horovod. The function
    :func:`sparse_allreduce_async` returns is called.
    """
    if callable(handle):
        return handle()
    item = _handles.take(handle)
    if item is None:
        return None
    if type(item) is not tuple:
        if getattr(item, "stream_event", None) is None:
            return item.wait()
        return _follow([item], [item.wait()])[0]
    handles, finish = item
    if handles and getattr(handles[0], "stream_event", None) is not None:  # device path
        return finish(_follow(handles, [h.wait() for h in handles]))
    return finish([h.wait() for h in handles])


def _follow(handles: list[Any], outputs: list[Any]) -> list[Any]:
    """Device path: the caller's stream waits for each op's done event (no host sync)."""
    runtime = _rt.current()
    device = None if runtime is None else runtime.device_path
    if device is not None:
        for h, out in zip(handles, outputs, strict=True):
            device.follow(getattr(h, "stream_event", None), out)
    return outputs


def _as_tuple(outputs: list[Any]) -> Any:
    return tuple(outputs)


# ------------------------------------------------------------------ validation
_OPS_BY_VALUE = {int(o): o for o in ReduceOp}
#: (an enum member read through its class is a descriptor call in Python 3.11, ~0.2 us:
#: the per-op path compares against this instead)
_ADASUM = ReduceOp.ADASUM
_AVERAGE = ReduceOp.AVERAGE
_DTYPE_NAMES = {d: str(d) for d in SUPPORTED_DTYPES}


def _resolve_op(op: int | None, average: bool | None) -> ReduceOp:
    if average is None and op is not None:
        resolved = _OPS_BY_VALUE.get(op)
        if resolved is not None:
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
            f"unknown reduction op {op!r}; use hvd.Average, Sum, Adasum, Min, Max or Product"
        ) from None
    return resolved


def _check_adasum(
    tensor: torch.Tensor, runtime: _rt.Runtime, what: str, ranks: int | None = None
) -> None:
    """What Horovod requires of an Adasum allreduce on CPU, checked before submitting."""
    if not tensor.is_cpu:
        raise AdasumUnsupportedError(
            f"hvdprof rank {runtime.rank}: {what} with op=Adasum is supported on CPU tensors "
            f"only, got one on {tensor.device}"
        )
    if _DTYPE_NAMES[tensor.dtype] not in ADASUM_DTYPES:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} with op=Adasum needs a floating-point tensor, "
            f"got {tensor.dtype}"
        )
    ranks = runtime.size if ranks is None else ranks
    if not is_power_of_two(ranks):
        raise AdasumUnsupportedError(
            f"hvdprof rank {runtime.rank}: {what} with op=Adasum needs a power-of-two number "
            f"of ranks (as Horovod's), this job has {ranks}"
        )


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
    if not tensor.is_cpu:  # device path (issue 28): CUDA tensors go to the NCCL group
        device = runtime.device_path
        if device is None or not device.routes(tensor.device.type):
            raise ValueError(
                f"hvdprof rank {runtime.rank}: {what} got a tensor on {tensor.device}; this "
                "job has no NCCL group for it (CUDA and NCCL must be available when init() "
                "runs), only Gloo for CPU tensors"
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
    # the device's kind, not its index: every rank's tensor is on its own GPU
    return Signature(
        op,
        _DTYPE_NAMES[tensor.dtype],
        tuple(tensor.shape),
        reduce_op,
        root_rank,
        float(prescale),
        float(postscale),
        "cpu" if tensor.is_cpu else tensor.device.type,
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
        "cpu" if tensor.is_cpu else tensor.device.type,
    )
    key = (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor, tensor.is_cpu)
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
    set_id: int = 0,
    members: tuple[int, ...] | None = None,
) -> Handle:
    runtime = _rt.get()
    # The per-op path (thousands of calls per step): a CPU tensor whose signature is
    # known passed every check of _check_tensor but three, read here once each (each
    # torch attribute read costs ~60 ns); anything else takes the checked path.
    sig = None
    if not checked and op is not _ADASUM:
        try:
            sig = _ALLREDUCE_SIGNATURES[
                (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor, True)
            ]
        except (AttributeError, KeyError, TypeError):  # (no contextlib: per op)
            sig = None
        if sig is not None and not (
            tensor.is_cpu
            and tensor.is_contiguous()
            and not tensor.requires_grad
            and isinstance(tensor, torch.Tensor)
        ):
            sig = None
    if sig is None:
        if not checked:
            tensor = _check_tensor(tensor, what, runtime, in_place)
            if op is _ADASUM:
                _check_adasum(tensor, runtime, what, set_size(set_id, members, runtime))
        try:
            sig = _ALLREDUCE_SIGNATURES[
                (tensor.dtype, tensor.shape, op, prescale_factor, postscale_factor, tensor.is_cpu)
            ]
        except (KeyError, TypeError):
            sig = _allreduce_signature(tensor, op, prescale_factor, postscale_factor)
    output = tensor if in_place else torch.empty_like(tensor)
    if name is not None and (name.__class__ is not str or not name):
        _check_name(name)
    if set_id:
        sig = sig._replace(process_set=set_id)
    return runtime.submit(name, "allreduce", sig, tensor, output)


def _per_op_allreduce(
    tensor: torch.Tensor,
    in_place: bool,
    name: str | None,
    op: int | None,
    prescale_factor: float,
    postscale_factor: float,
) -> int | None:
    """The per-op path of the global set with no ``average`` (a step's burst of thousands
    of small gradients): the op is resolved and the handle stored here, one call where
    ``_resolve_op`` and ``_handles.add_single`` were two (~0.1 µs each). None: an op this
    path does not know, left to ``_resolve_op`` to name."""
    reduce_op = _AVERAGE if op is None else _OPS_BY_VALUE.get(op)
    if reduce_op is None:
        return None
    what = "allreduce_" if in_place else "allreduce"
    h = _allreduce_async(tensor, in_place, name, reduce_op, prescale_factor, postscale_factor, what)
    key = next(_handles_counter)
    _handles_items[key] = h
    return key


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
    if process_set is global_process_set and average is None:
        key = _per_op_allreduce(tensor, False, name, op, prescale_factor, postscale_factor)
        if key is not None:
            return key
    set_id, members = 0, None
    if process_set is not global_process_set:
        set_id, members = set_of(process_set, "allreduce_async")
    reduce_op = _resolve_op(op, average)
    h = _allreduce_async(
        tensor,
        False,
        name,
        reduce_op,
        prescale_factor,
        postscale_factor,
        "allreduce",
        set_id=set_id,
        members=members,
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
    if process_set is global_process_set and average is None:
        key = _per_op_allreduce(tensor, True, name, op, prescale_factor, postscale_factor)
        if key is not None:
            return key
    set_id, members = 0, None
    if process_set is not global_process_set:
        set_id, members = set_of(process_set, "allreduce_async_")
    reduce_op = _resolve_op(op, average)
    h = _allreduce_async(
        tensor,
        True,
        name,
        reduce_op,
        prescale_factor,
        postscale_factor,
        "allreduce_",
        set_id=set_id,
        members=members,
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
            process_set=ctx.process_set,
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
    process_set: Any,
) -> int:
    set_id, members = 0, None
    if process_set is not global_process_set:
        set_id, members = set_of(process_set, "grouped_allreduce")
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    name = _check_name(name)
    runtime = _rt.get()
    # Validate every member before submitting any: a bad member fails the whole group.
    checked = [_check_tensor(t, "grouped_allreduce", runtime, in_place) for t in tensors]
    if op is ReduceOp.ADASUM:
        for t in checked:
            _check_adasum(t, runtime, "grouped_allreduce", set_size(set_id, members, runtime))
    names = [None if name is None else f"{name}.{i}" for i in range(len(checked))]
    busy = [n for n in names if n is not None and runtime.is_in_flight(n)]
    if busy:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: grouped_allreduce {name!r} has members already in flight: {busy}"
        )
    handles = [
        _allreduce_async(
            t,
            in_place,
            n,
            op,
            prescale_factor,
            postscale_factor,
            "grouped_allreduce",
            checked=True,
            set_id=set_id,
        )
        for t, n in zip(checked, names, strict=True)
    ]
    return _handles.add(handles, _as_tuple)


def grouped_allreduce_async(
    tensors: Sequence[torch.Tensor],
    average: bool | None = None,
    name: str | None = None,
    op: int | None = None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set: ProcessSet = global_process_set,
) -> int:
    """One handle for a list of tensors reduced together (fused when they fit).

    ``synchronize`` returns a tuple of outputs, as Horovod's.
    """
    return _grouped_async(
        tensors,
        False,
        name,
        _resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        process_set,
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
        tensors,
        True,
        name,
        _resolve_op(op, average),
        prescale_factor,
        postscale_factor,
        process_set,
    )


class _GroupedAllreduceFunction(torch.autograd.Function):
    """Differentiable like ``allreduce``: the gradient of a grouped allreduce is a grouped
    allreduce of the gradients, with the same op and scale factors (as Horovod's)."""

    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):  # type: ignore[override]
        ctx.average = average
        ctx.op = op
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        handle = grouped_allreduce_async(
            list(tensors), average, name, op, prescale_factor, postscale_factor, process_set
        )
        return synchronize(handle)

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        grads = grouped_allreduce(
            [g.contiguous() for g in grad_outputs],
            average=ctx.average,
            op=ctx.op,
            prescale_factor=ctx.scales[0],
            postscale_factor=ctx.scales[1],
            process_set=ctx.process_set,
        )
        return (None, None, None, None, None, None, *grads)


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
    """Reduce a list of tensors together; a list of outputs. Differentiable."""
    if not tensors:
        raise ValueError("grouped_allreduce needs at least one tensor")
    compressed = [compression.compress(t) for t in tensors]
    outputs = _GroupedAllreduceFunction.apply(
        average,
        name,
        op,
        prescale_factor,
        postscale_factor,
        process_set,
        *[c for c, _ in compressed],
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
) -> tuple[torch.Tensor, ...]:
    """In place; returns the tuple that ``synchronize`` gives, as Horovod's."""
    return synchronize(
        grouped_allreduce_async_(
            tensors, average, name, op, prescale_factor, postscale_factor, process_set
        )
    )


# ------------------------------------------------------------------ allgather
def _allgather_submit(tensor: torch.Tensor, name: str | None, what: str, set_id: int = 0) -> Handle:
    runtime = _rt.get()
    tensor = _check_tensor(tensor, what, runtime, False)
    sig = in_set(_signature(OpType.ALLGATHER, tensor), set_id)
    return runtime.submit(_check_name(name), "allgather", sig, tensor, None)


def allgather_async(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> int:
    """Concatenate every rank's tensor along the first dimension (which may differ)."""
    set_id, _ = set_of(process_set, "allgather_async")
    return _handles.add_single(_allgather_submit(tensor, name, "allgather", set_id))


def _gather_first_dims(dims: list[int], process_set: Any) -> torch.Tensor:
    """(ranks, len(dims)): every rank's first dimensions, one allgather for all."""
    mine = torch.tensor([dims], dtype=torch.int64)
    return synchronize(allgather_async(mine, process_set=process_set))


class _AllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):  # type: ignore[override]
        ctx.dim = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        # as Horovod's: the average of the gradients, this rank's rows of it
        reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = _gather_first_dims([ctx.dim], ctx.process_set)[:, 0]
        offset = int(dims[: rank_in(ctx.process_set)].sum())
        return reduced.narrow(0, offset, ctx.dim), None, None


def allgather(
    tensor: torch.Tensor, name: str | None = None, process_set: ProcessSet = global_process_set
) -> torch.Tensor:
    """Blocking allgather; differentiable."""
    return _AllgatherFunction.apply(tensor, name, process_set)


def grouped_allgather_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Allgather each tensor of the list; ``synchronize`` gives a tuple of outputs."""
    set_id, _ = set_of(process_set, "grouped_allgather_async")
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    name = _check_name(name)
    names = [None if name is None else f"{name}.{i}" for i in range(len(tensors))]
    runtime = _rt.get()
    checked = [_check_tensor(t, "grouped_allgather", runtime, False) for t in tensors]
    handles = [
        _allgather_submit(t, n, "grouped_allgather", set_id)
        for t, n in zip(checked, names, strict=True)
    ]
    return _handles.add(handles, _as_tuple)


class _GroupedAllgatherFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):  # type: ignore[override]
        ctx.dims = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return synchronize(grouped_allgather_async(list(tensors), name, process_set))

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        reduced = grouped_allreduce(
            [g.contiguous() for g in grad_outputs], op=Average, process_set=ctx.process_set
        )
        dims = _gather_first_dims(ctx.dims, ctx.process_set)
        me = rank_in(ctx.process_set)
        offsets = dims[:me].sum(0).tolist() if me else [0] * len(ctx.dims)
        grads = [g.narrow(0, int(o), d) for g, o, d in zip(reduced, offsets, ctx.dims, strict=True)]
        return (None, None, *grads)


def grouped_allgather(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> list[torch.Tensor]:
    """Allgather each tensor of the list; a list of outputs. Differentiable."""
    if not tensors:
        raise ValueError("grouped_allgather needs at least one tensor")
    return list(_GroupedAllgatherFunction.apply(name, process_set, *tensors))


# ------------------------------------------------------------------ broadcast
def _broadcast_async(
    tensor: torch.Tensor, root_rank: int, name: str | None, in_place: bool, process_set: Any
) -> int:
    what = "broadcast_" if in_place else "broadcast"
    set_id, members = 0, None
    if process_set is not global_process_set:
        set_id, members = set_of(process_set, what)
    runtime = _rt.get()
    tensor = _check_tensor(tensor, what, runtime, in_place)
    if not isinstance(root_rank, int) or not 0 <= root_rank < runtime.size:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} root_rank={root_rank!r} is out of range for {runtime.size} ranks"
        )
    if members is not None and root_rank not in members:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} root_rank={root_rank} is not in process set "
            f"{set_id} (ranks {list(members)})"
        )
    output = tensor if in_place else torch.empty_like(tensor)
    sig = in_set(_signature(OpType.BROADCAST, tensor, ReduceOp.SUM, root_rank), set_id)
    h = runtime.submit(_check_name(name), "broadcast", sig, tensor, output)
    return _handles.add_single(h)


def broadcast_async(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _broadcast_async(tensor, root_rank, name, False, process_set)


def broadcast_async_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    return _broadcast_async(tensor, root_rank, name, True, process_set)


class _BroadcastFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):  # type: ignore[override]
        ctx.root_rank = root_rank
        ctx.process_set = process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        # as Horovod's: the average of the gradients on the root, zero elsewhere
        grad = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if rank() != ctx.root_rank:
            grad = grad * 0
        return grad, None, None, None


def broadcast(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    """Blocking broadcast from ``root_rank``; differentiable."""
    return _BroadcastFunction.apply(tensor, root_rank, name, process_set)


def broadcast_(
    tensor: torch.Tensor,
    root_rank: int,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> torch.Tensor:
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ------------------------------------------------------------------ alltoall
def _even_splits(
    tensor: torch.Tensor, runtime: _rt.Runtime, ranks: int | None = None
) -> tuple[int, ...]:
    rows = tensor.shape[0] if tensor.dim() else 1
    ranks = runtime.size if ranks is None else ranks
    if rows % ranks:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: alltoall without splits needs the first dimension "
            f"({rows}) divisible by the number of ranks ({ranks})"
        )
    return (rows // ranks,) * ranks


def alltoall_async(
    tensor: torch.Tensor,
    splits: Any = None,
    name: str | None = None,
    process_set: ProcessSet = global_process_set,
) -> int:
    """Send ``splits[r]`` rows to rank r; receive from each. Returns a handle.

    As Horovod's, ``synchronize`` gives ``(output, received_splits)`` with or without
    ``splits``; the received splits are int32, or ``splits``' dtype when it is a tensor.
    """
    set_id, members = set_of(process_set, "alltoall_async")
    runtime = _rt.get()
    ranks = set_size(set_id, members, runtime)
    tensor = _check_tensor(tensor, "alltoall", runtime, False)
    rows = tensor.shape[0] if tensor.dim() else 1
    if splits is None:
        split_list = _even_splits(tensor, runtime, ranks)
    else:
        values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
        split_list = tuple(int(v) for v in values)
        if len(split_list) != ranks or any(v < 0 for v in split_list) or sum(split_list) != rows:
            raise ValueError(
                f"hvdprof rank {runtime.rank}: alltoall splits {list(split_list)} must have one "
                f"non-negative entry per rank ({ranks}) summing to the first dimension ({rows})"
            )
    sig = in_set(_signature(OpType.ALLTOALL, tensor), set_id)
    h = runtime.submit(_check_name(name), "alltoall", sig, tensor, None, split_list)
    if isinstance(splits, torch.Tensor) and splits.dtype != torch.int32:
        dtype = splits.dtype
        return _handles.add([h], lambda outputs: (outputs[0][0], outputs[0][1].to(dtype)))
    return _handles.add_single(h)


class _AlltoallFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):  # type: ignore[override]
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received = received
        ctx.process_set = process_set
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, _grad_splits):  # type: ignore[override]
        # what each rank received is what it sends back
        grad, _ = synchronize(
            alltoall_async(grad_output.contiguous(), ctx.received, process_set=ctx.process_set)
        )
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
        set_id, members = set_of(process_set, "alltoall")
        runtime = _rt.get()
        output, _ = _AlltoallFunction.apply(
            tensor,
            list(_even_splits(tensor, runtime, set_size(set_id, members, runtime))),
            name,
            process_set,
        )
        return output
    return _AlltoallFunction.apply(tensor, splits, name, process_set)


# ------------------------------------------------------------------ reducescatter
def _reducescatter_submit(
    tensor: torch.Tensor,
    name: str | None,
    reduce_op: ReduceOp,
    prescale_factor: float,
    postscale_factor: float,
    what: str,
    set_id: int = 0,
) -> Handle:
    runtime = _rt.get()
    if reduce_op is ReduceOp.ADASUM:  # a RuntimeError (NotImplementedError), as Horovod's
        raise AdasumUnsupportedError(
            f"hvdprof rank {runtime.rank}: {what} does not support op=Adasum"
        )
    tensor = _check_tensor(tensor, what, runtime, False)
    if tensor.dim() == 0:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} needs a tensor with at least one dimension"
        )
    sig = _signature(OpType.REDUCESCATTER, tensor, reduce_op, -1, prescale_factor, postscale_factor)
    sig = in_set(sig, set_id)
    return runtime.submit(_check_name(name), "reducescatter", sig, tensor, None)


def reducescatter_async(
    tensor: torch.Tensor,
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Reduce, then give rank r its share of the first dimension (extra rows to low ranks)."""
    set_id, _ = set_of(process_set, "reducescatter_async")
    h = _reducescatter_submit(
        tensor,
        name,
        _resolve_op(op, None),
        prescale_factor,
        postscale_factor,
        "reducescatter",
        set_id,
    )
    return _handles.add_single(h)


def _reducescatter_grad(
    grad: torch.Tensor, op: ReduceOp, scales: tuple[float, float], process_set: Any = None
) -> Any:
    """Horovod's gradient of a reducescatter, before the allgather: Sum scales by the
    number of ranks, and both scale factors apply."""
    if op not in (ReduceOp.SUM, ReduceOp.AVERAGE):
        raise ValueError(f"reducescatter with op={op.name.title()} has no gradient")
    ranks = size() if process_set is None else size_of(process_set)
    factor = float(ranks) if op == ReduceOp.SUM else 1.0
    factor *= scales[0] * scales[1]
    return grad.contiguous() * factor if factor != 1.0 else grad.contiguous()


class _ReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):  # type: ignore[override]
        ctx.op = _resolve_op(op, None)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        return synchronize(
            reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor)
        )

    @staticmethod
    def backward(ctx, grad_output):  # type: ignore[override]
        grad = _reducescatter_grad(grad_output, ctx.op, ctx.scales, ctx.process_set)
        return allgather(grad, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(
    tensor: torch.Tensor,
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> torch.Tensor:
    """Blocking reducescatter; differentiable (Sum and Average)."""
    compressed, ctx = compression.compress(tensor)
    out = _ReducescatterFunction.apply(
        compressed, name, op, process_set, prescale_factor, postscale_factor
    )
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> int:
    """Reducescatter each tensor of the list; ``synchronize`` gives a tuple of outputs."""
    set_id, _ = set_of(process_set, "grouped_reducescatter_async")
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    reduce_op = _resolve_op(op, None)
    name = _check_name(name)
    names = [None if name is None else f"{name}.{i}" for i in range(len(tensors))]
    runtime = _rt.get()
    checked = [_check_tensor(t, "grouped_reducescatter", runtime, False) for t in tensors]
    handles = [
        _reducescatter_submit(
            t, n, reduce_op, prescale_factor, postscale_factor, "grouped_reducescatter", set_id
        )
        for t, n in zip(checked, names, strict=True)
    ]
    return _handles.add(handles, _as_tuple)


class _GroupedReducescatterFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):  # type: ignore[override]
        ctx.op = _resolve_op(op, None)
        ctx.scales = (prescale_factor, postscale_factor)
        ctx.process_set = process_set
        handle = grouped_reducescatter_async(
            list(tensors), name, op, process_set, prescale_factor, postscale_factor
        )
        return synchronize(handle)

    @staticmethod
    def backward(ctx, *grad_outputs):  # type: ignore[override]
        grads = [_reducescatter_grad(g, ctx.op, ctx.scales, ctx.process_set) for g in grad_outputs]
        return (
            None,
            None,
            None,
            None,
            None,
            *grouped_allgather(grads, process_set=ctx.process_set),
        )


def grouped_reducescatter(
    tensors: Sequence[torch.Tensor],
    name: str | None = None,
    compression: Any = Compression.none,
    op: int = Average,
    process_set: ProcessSet = global_process_set,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
) -> list[torch.Tensor]:
    """Reducescatter each tensor of the list; a list of outputs. Differentiable."""
    if not tensors:
        raise ValueError("grouped_reducescatter needs at least one tensor")
    compressed = [compression.compress(t) for t in tensors]
    outputs = _GroupedReducescatterFunction.apply(
        name, op, process_set, prescale_factor, postscale_factor, *[c for c, _ in compressed]
    )
    return [compression.decompress(o, ctx) for o, (_, ctx) in zip(outputs, compressed, strict=True)]


# ------------------------------------------------------------------ barrier and join
def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Return once every rank of ``process_set`` has called barrier."""
    set_id, _ = set_of(process_set, "barrier")
    runtime = _rt.get()
    sig = Signature(OpType.BARRIER, "none", (), ReduceOp.SUM, -1, 1.0, 1.0, "cpu", set_id)
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
    from hvdprof.timeline.session import start_timeline as _start

    _start(_rt.get(), file_path, mark_cycles)


def stop_timeline() -> None:
    from hvdprof.timeline.session import stop_timeline as _stop

    _stop(_rt.get())
