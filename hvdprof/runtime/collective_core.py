"""The steps of a collective that the CPU path and the device path share.

:mod:`hvdprof.runtime.executor` runs a cycle's groups on host tensors, and
:mod:`hvdprof.runtime.device_path` runs them on a device's streams, timed by events.
What they do to the data is the same, and lives here once, so the two paths cannot
drift: the fusion buffers and how a group is packed into one and unpacked from it, the
prescale and postscale (Horovod's ``ScaleBuffer`` and its Average), and the collectives
of one tensor (allgather padded to the longest rank, alltoall, reducescatter). Each
function takes tensors where they live (``tensor.device``), so neither path passes a
device it does not have.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from hvdprof.runtime.dtypes import ITEMSIZE, torch_attr
from hvdprof.runtime.requests import ReduceOp, Signature

_DTYPES = {name: getattr(torch, torch_attr(name)) for name in ITEMSIZE}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


# ------------------------------------------------------------------- fusion buffers


class FusionBufferPool:
    """Fusion buffers reused across cycles: one per device, pipeline slot and dtype,
    each at least the fusion threshold (``HOROVOD_FUSION_THRESHOLD`` applies per device).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str, int], torch.Tensor] = {}

    def get(
        self, device: torch.device, dtype: torch.dtype, slot: int, numel: int, capacity: int
    ) -> torch.Tensor:
        key = (str(device), str(dtype), slot)
        buf = self._buffers.get(key)
        want = max(numel, capacity // dtype.itemsize)
        if buf is None or buf.numel() < numel or buf.numel() > 2 * max(want, 1):
            # (Re)allocated between groups on the cycle thread only, so an autotune
            # resize can never pull a buffer from under an in-flight reduction.
            buf = self._buffers[key] = torch.empty(want, dtype=dtype, device=device)
        return buf[:numel]

    def clear(self) -> None:
        self._buffers.clear()

    def addresses(self) -> set[int]:
        """Where the buffers now held start (a replaced buffer's address is not here)."""
        return {buf.data_ptr() for buf in self._buffers.values()}


def flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view (``view()`` costs about a microsecond: skipped when already 1-D)."""
    return tensor if tensor.dim() == 1 else tensor.view(-1)


def pack_inputs(
    ops: Sequence[Any], requests: Sequence[Any], dtype: torch.dtype, device: torch.device
) -> list[torch.Tensor]:
    """The 1-D tensors a fused group is packed from, in order; a joined rank (no
    request) contributes zeros for the tensors it lacks."""
    if None not in requests:
        return [flat_view(r.tensor) for r in requests]
    return [
        torch.zeros(op.numel, dtype=dtype, device=device) if r is None else flat_view(r.tensor)
        for op, r in zip(ops, requests, strict=True)
    ]


def single_buffer(
    sig: Signature, request: Any, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """What a group of one tensor is reduced in: its output (the tensor itself when in
    place), or zeros of its shape on a joined rank."""
    if request is None:
        return torch.zeros(sig.shape, dtype=dtype, device=device)
    out = request.output
    if out is not request.tensor:
        out.copy_(request.tensor)
    return out


class UnpackViews:
    """The fusion buffers' slices, one per member, kept while the same groups repeat.

    ``torch.split_with_sizes_copy`` makes a view per member on every call (about a third
    of a microsecond each, before its copy): 2,000 small gradients paid 1.1 ms a step
    to unpack, of which the copies were 0.75 (measured on a 2-core VM, 256 floats each).
    A training step submits the same tensors in the same order, so the same cached ops
    form the same groups in the same buffers: the views are made once and reused, and
    one ``torch._foreach_copy_`` writes them back. The kept list holds its ops, so their
    ids cannot be reused while kept; a buffer the pool has replaced is let go at the next
    miss (a view keeps its storage alive: an autotuned threshold must not pin old ones).
    """

    #: groups kept at most (a job's distinct groups per step); all are dropped beyond it
    LIMIT = 256

    def __init__(self, pool: FusionBufferPool) -> None:
        self._pool = pool
        self._kept: dict[tuple[int, int, int], tuple[list[Any], tuple[torch.Tensor, ...]]] = {}

    def copy_out(self, flat: torch.Tensor, ops: list[Any], outs: list[torch.Tensor]) -> None:
        """Copy each member's slice of ``flat`` (1-D, a pool buffer's head, packed in
        ``ops`` order) to ``outs``."""
        key = (flat.data_ptr(), len(ops), id(ops[0]))
        kept = self._kept.get(key)
        # (a list compares its items by identity first: the cache's entries are the
        # same objects from one step to the next, so this costs a few ns per op)
        if kept is None or kept[0] != ops:
            self._let_go_of_old_buffers()
            kept = self._kept[key] = (list(ops), flat.split_with_sizes([op.numel for op in ops]))
        torch._foreach_copy_(outs, kept[1])

    def _let_go_of_old_buffers(self) -> None:
        if len(self._kept) >= self.LIMIT:
            self._kept.clear()
            return
        live = self._pool.addresses()
        for key in [k for k in self._kept if k[0] not in live]:
            del self._kept[key]

    def __len__(self) -> int:
        return len(self._kept)


def unpack_targets(
    ops: Sequence[Any], requests: Sequence[Any], packed: list[torch.Tensor], dtype: torch.dtype
) -> list[torch.Tensor]:
    """Where each member's slice of the reduced buffer goes (1-D views); ``packed`` are
    the tensors :func:`pack_inputs` gave."""
    if None not in requests and all(r.output is r.tensor for r in requests):
        return packed  # in place: back into the tensors that were packed
    outs = []
    for op, r, source in zip(ops, requests, packed, strict=True):
        if r is None:  # a joined rank: the result is discarded
            outs.append(torch.empty(op.numel, dtype=dtype, device=source.device))
        elif r.output is r.tensor:
            outs.append(source)
        else:
            outs.append(flat_view(r.output))
    return outs


# ------------------------------------------------------------------- scaling


def scale(t: torch.Tensor, factor: float) -> None:
    """Multiply in place. Integers as Horovod's ScaleBuffer does: the product in double,
    truncated toward zero on the way back."""
    if t.is_floating_point():
        t.mul_(factor)
    else:
        t.copy_(t.double().mul_(factor))


def postscale(t: torch.Tensor, sig: Signature, size: int) -> None:
    """Postscale and, for Average, divide by the number of ranks (Horovod folds the
    division into the postscale factor; an integer quotient truncates toward zero:
    -75 / 2 = -37)."""
    factor = sig.postscale
    if sig.reduce_op == ReduceOp.AVERAGE:
        if not t.is_floating_point() and factor == 1.0:
            t.copy_(torch.div(t, size, rounding_mode="trunc"))
            return
        factor = factor / size
    if factor != 1.0:
        scale(t, factor)


def prescaled(t: torch.Tensor, sig: Signature) -> torch.Tensor:
    """``t``, or a scaled copy of it when the op has a prescale (the input is the user's)."""
    if sig.prescale == 1.0:
        return t
    work = t.clone()
    scale(work, sig.prescale)
    return work


# ------------------------------------------------------------------- one-tensor collectives


def reducescatter_rows(rows: int, size: int, rank: int) -> tuple[int, int]:
    """Horovod's split of the first dimension: as even as possible, extra rows to low ranks."""
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def reducescatter(
    backend: Any, t: torch.Tensor, sig: Signature, rank: int, size: int, native: bool
) -> torch.Tensor:
    """This rank's rows of the reduced ``t``: through the backend's own reduce-scatter
    when ``native`` (each rank receives only its rows), else by reducing everything."""
    if native:
        work = prescaled(t.contiguous(), sig)
        rows = [
            stop - start
            for start, stop in (reducescatter_rows(t.shape[0], size, r) for r in range(size))
        ]
        out = torch.empty((rows[rank], *t.shape[1:]), dtype=t.dtype, device=t.device)
        backend.reducescatter(out, work, ReduceOp(sig.reduce_op), rows)
        postscale(out, sig, size)
        return out
    work = t.clone()
    if sig.prescale != 1.0:
        scale(work, sig.prescale)
    backend.allreduce_async(work, ReduceOp(sig.reduce_op)).wait()
    postscale(work, sig, size)
    start, stop = reducescatter_rows(work.shape[0], size, rank)
    return work[start:stop].clone()


def allgather_padded(
    backend: Any, t: torch.Tensor, first_dims: Sequence[int], size: int
) -> torch.Tensor:
    """Every rank's rows, concatenated: each rank's tensor padded to the longest first
    dimension (a backend's allgather takes equal shapes), the padding cut off after."""
    rest = tuple(t.shape[1:]) if t.dim() else ()
    src = t if t.dim() else t.reshape(1)
    longest = max(first_dims)
    if src.shape[0] != longest:
        padded = torch.zeros((longest, *rest), dtype=t.dtype, device=t.device)
        padded[: src.shape[0]] = src
        src = padded
    outs = [torch.empty((longest, *rest), dtype=t.dtype, device=t.device) for _ in range(size)]
    backend.allgather(outs, src)
    return torch.cat([o[:d] for o, d in zip(outs, first_dims, strict=True)], dim=0)


def alltoall(
    backend: Any, t: torch.Tensor, splits: Sequence[Sequence[int]], rank: int, size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows every rank sent this one, and how many came from each (on the host)."""
    send = list(splits[rank])
    recv = [splits[r][rank] for r in range(size)]
    out = torch.empty((sum(recv), *t.shape[1:]), dtype=t.dtype, device=t.device)
    backend.alltoall(out, t, recv, send)
    return out, torch.tensor(recv, dtype=torch.int32)


def broadcast(backend: Any, request: Any, root: int) -> torch.Tensor:
    """The root's tensor, into this rank's output."""
    out = request.output
    if out is not request.tensor:
        out.copy_(request.tensor)
    backend.broadcast(out, root)
    return out
