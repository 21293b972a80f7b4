"""Runs one cycle's ready ops on the backend: fusion buffers, pipelining, completion.

Allreduce groups are pipelined: up to ``max_inflight`` buffers are reduced at once, so
packing the next buffer overlaps the reduction of the previous one. A group of one tensor
is reduced in place, with no copy at all.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import torch

from hvdprof.errors import TensorMismatchError
from hvdprof.runtime import timebase
from hvdprof.runtime.backends.base import CollectiveBackend
from hvdprof.runtime.dtypes import ITEMSIZE, torch_attr
from hvdprof.runtime.fusion import (
    FusionGroup,
    FusionKey,
    fusion_key,
    plan_fusion,
    signature_nbytes,
)
from hvdprof.runtime.handles import notify_waiters
from hvdprof.runtime.records import GroupRecord
from hvdprof.runtime.requests import OpType, ReduceOp, Request, Signature
from hvdprof.timeline.activities import NVTX_COLLECTIVE, NVTX_MEMCPY_IN, NVTX_MEMCPY_OUT

_DTYPES = {name: getattr(torch, torch_attr(name)) for name in ITEMSIZE}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


class ReadyOp:
    """One op every rank agreed to run now. ``request`` is None on a rank that has joined.

    A plain slots class: thousands are made per step on the cycle thread.
    """

    __slots__ = (
        "error",
        "first_dims",
        "flat",
        "group_id",
        "key",
        "name",
        "nbytes",
        "output",
        "request",
        "signature",
        "splits",
        "t_done",
    )

    def __init__(
        self,
        name: str,
        signature: Signature,
        request: Request | None,
        key: FusionKey | None = None,
        nbytes: int = -1,
        error: str | None = None,
        first_dims: tuple[int, ...] | None = None,
        splits: tuple[tuple[int, ...], ...] | None = None,
    ) -> None:
        self.name = name
        self.signature = signature
        self.request = request
        self.key = key if key is not None else fusion_key(signature)
        self.nbytes = nbytes if nbytes >= 0 else signature_nbytes(signature)
        self.error = error
        self.first_dims = first_dims
        self.splits = splits
        self.group_id = -1
        self.output: Any = None
        self.flat: torch.Tensor | None = None
        self.t_done = 0  # when its handle completed (recorded for the timeline only)


class _BufferPool:
    """Fusion buffers reused across cycles: one per pipeline slot and dtype."""

    def __init__(self) -> None:
        self._buffers: dict[tuple[str, int], torch.Tensor] = {}

    def get(self, dtype: torch.dtype, slot: int, numel: int, capacity_bytes: int) -> torch.Tensor:
        key = (str(dtype), slot)
        buf = self._buffers.get(key)
        want = max(numel, capacity_bytes // dtype.itemsize)
        if buf is None or buf.numel() < numel or buf.numel() > 2 * max(want, 1):
            # (Re)allocated between groups on the cycle thread only, so an autotune
            # resize can never pull a buffer from under an in-flight reduction.
            buf = torch.empty(want, dtype=dtype)
            self._buffers[key] = buf
        return buf[:numel]

    def clear(self) -> None:
        self._buffers.clear()


class Executor:
    def __init__(self, backend: CollectiveBackend, rank: int, size: int) -> None:
        self.backend = backend
        self.rank = rank
        self.size = size
        self.pool = _BufferPool()
        self.next_group_id = 0
        self.nvtx: Any = None  # PhaseRanges (no-ops when NVTX is off)
        #: frees completed names for reuse, one call per group (set by the runtime)
        self.retire: Any = None
        # counters the tests and benchmarks read
        self.fused_groups = 0
        self.fused_tensors = 0
        self.backend_calls = 0

    # ----------------------------------------------------------------------------------
    def run(
        self,
        ops: list[ReadyOp],
        threshold_bytes: int,
        max_inflight: int,
        detailed: bool,
    ) -> tuple[int, list[GroupRecord]]:
        """Run ``ops`` (same order on every rank); returns allreduce bytes and group records."""
        records: list[GroupRecord] = []
        allreduces: list[ReadyOp] = []
        others: list[ReadyOp] = []
        for op in ops:
            if op.error is not None:
                _fail(op, TensorMismatchError(op.error))
            elif op.signature.op == OpType.ALLREDUCE:
                allreduces.append(op)
            else:
                others.append(op)
        reduced = 0
        if allreduces:
            reduced = self._run_allreduces(
                allreduces, threshold_bytes, max_inflight, detailed, records
            )
        for op in others:
            self._run_other(op, detailed, records)
        return reduced, records

    # ----------------------------------------------------------------------------------
    def _run_allreduces(
        self,
        ops: list[ReadyOp],
        threshold: int,
        max_inflight: int,
        detailed: bool,
        records: list[GroupRecord],
    ) -> int:
        groups = plan_fusion([(op.key, op.nbytes) for op in ops], threshold)
        inflight: deque[
            tuple[FusionGroup, list[ReadyOp], Any, torch.Tensor, GroupRecord | None]
        ] = deque()
        total = 0
        for slot_counter, group in enumerate(groups):
            members = [ops[i] for i in group.indices]
            if len(inflight) >= max_inflight:
                self._finish_allreduce(*inflight.popleft())
            record = None
            if detailed:
                record = GroupRecord(
                    group_id=self.next_group_id,
                    op="ALLREDUCE",
                    backend=self.backend.name,
                    num_tensors=len(members),
                    nbytes=group.nbytes,
                    buffer_bytes=group.nbytes if group.fused else 0,
                    dtype=group.key.dtype,
                )
                records.append(record)
            for m in members:
                m.group_id = self.next_group_id
            self.next_group_id += 1
            flat, work = self._start_allreduce(
                group, members, slot_counter % max_inflight, threshold, record
            )
            inflight.append((group, members, work, flat, record))
            total += group.nbytes
        while inflight:
            self._finish_allreduce(*inflight.popleft())
        return total

    def _start_allreduce(
        self,
        group: FusionGroup,
        members: list[ReadyOp],
        slot: int,
        threshold: int,
        record: GroupRecord | None,
    ) -> tuple[torch.Tensor, Any]:
        sig = members[0].signature
        dtype = torch_dtype(sig.dtype)
        if group.fused:
            if record is not None:
                record.t_pack_start = timebase.now_ns()
            numel = sum(_numel(m.signature.shape) for m in members)
            flat = self.pool.get(dtype, slot, numel, threshold)
            views = []
            for m in members:
                m.flat = _input_flat(m, dtype)
                views.append(m.flat)
            nvtx = self.nvtx
            if nvtx is not None:
                nvtx.push(NVTX_MEMCPY_IN)
            torch.cat(views, out=flat)
            if nvtx is not None:
                nvtx.pop()
            if record is not None:
                record.t_pack_end = timebase.now_ns()
            self.fused_groups += 1
            self.fused_tensors += len(members)
        else:
            m = members[0]
            if m.request is None:
                flat = torch.zeros(m.signature.shape, dtype=dtype)
                m.output = flat
            else:
                out = m.request.output
                if out is not m.request.tensor:
                    out.copy_(m.request.tensor)
                flat = out
                m.output = out
        if sig.prescale != 1.0:
            _scale(flat, sig.prescale)
        if record is not None:
            record.t_collective_start = timebase.now_ns()
        self.backend_calls += 1
        work = self.backend.allreduce_async(flat, ReduceOp(sig.reduce_op))
        return flat, work

    def _finish_allreduce(
        self,
        group: FusionGroup,
        members: list[ReadyOp],
        work: Any,
        flat: torch.Tensor,
        record: GroupRecord | None,
    ) -> None:
        nvtx = self.nvtx
        if nvtx is not None:
            nvtx.push(NVTX_COLLECTIVE)
        work.wait()
        if nvtx is not None:
            nvtx.pop()
        if record is not None:
            record.t_collective_end = timebase.now_ns()
        sig = members[0].signature
        _postscale(flat, sig, self.size)
        if group.fused:
            if record is not None:
                record.t_unpack_start = timebase.now_ns()
            outs = []
            sizes = []
            for m in members:
                req = m.request
                if req is None:
                    m.output = torch.empty(m.signature.shape, dtype=flat.dtype)
                    out = m.output.view(-1)
                else:
                    m.output = req.output
                    if req.output is req.tensor:
                        out = m.flat
                    elif len(m.signature.shape) == 1:
                        out = req.output
                    else:
                        out = req.output.view(-1)
                sizes.append(out.numel())
                outs.append(out)
            if nvtx is not None:
                nvtx.push(NVTX_MEMCPY_OUT)
            torch.split_with_sizes_copy(flat, sizes, out=outs)
            if nvtx is not None:
                nvtx.pop()
            if record is not None:
                record.t_unpack_end = timebase.now_ns()
        if record is not None:
            t_done = timebase.now_ns()
            for m in members:
                m.t_done = t_done
        done = [m.request for m in members if m.request is not None]
        if self.retire is not None:
            self.retire([req.name for req in done])
        for req in done:
            req.handle.complete(req.output)
        notify_waiters()

    # ----------------------------------------------------------------------------------
    def _run_other(self, op: ReadyOp, detailed: bool, records: list[GroupRecord]) -> None:
        sig = op.signature
        record = None
        if detailed:
            record = GroupRecord(
                group_id=self.next_group_id,
                op=sig.op.name,
                backend=self.backend.name,
                num_tensors=1,
                nbytes=op.nbytes,
                buffer_bytes=0,
                dtype=sig.dtype,
            )
            records.append(record)
        op.group_id = self.next_group_id
        self.next_group_id += 1
        if record is not None:
            record.t_collective_start = timebase.now_ns()
        try:
            result = self._dispatch(op)
        except (ValueError, TypeError) as exc:  # bad input caught late: fail this op only
            _fail(op, TensorMismatchError(f"{sig.op.name.lower()} of {op.name!r} failed: {exc}"))
            return
        if record is not None:
            record.t_collective_end = op.t_done = timebase.now_ns()
        if op.request is not None:
            if self.retire is not None:
                self.retire([op.name])
            op.request.handle.complete(result)
            notify_waiters()

    def _dispatch(self, op: ReadyOp) -> Any:
        sig = op.signature
        req = op.request
        assert req is not None or sig.op == OpType.ALLREDUCE
        if sig.op == OpType.BARRIER:
            return None
        self.backend_calls += 1
        if sig.op == OpType.BROADCAST:
            out = req.output
            if out is not req.tensor:
                out.copy_(req.tensor)
            self.backend.broadcast(out, sig.root_rank)
            return out
        if sig.op == OpType.ALLGATHER:
            return self._allgather(req, op.first_dims or ())
        if sig.op == OpType.ALLTOALL:
            return self._alltoall(req, op.splits or ())
        if sig.op == OpType.REDUCESCATTER:
            return self._reducescatter(req, sig)
        raise AssertionError(f"unknown op {sig.op}")

    def _allgather(self, req: Request, first_dims: tuple[int, ...]) -> torch.Tensor:
        t = req.tensor
        rest = tuple(t.shape[1:]) if t.dim() else ()
        src = t if t.dim() else t.reshape(1)
        longest = max(first_dims)
        if src.shape[0] != longest:
            padded = torch.zeros((longest, *rest), dtype=t.dtype)
            padded[: src.shape[0]] = src
            src = padded
        outs = [torch.empty((longest, *rest), dtype=t.dtype) for _ in range(self.size)]
        self.backend.allgather(outs, src)
        return torch.cat([o[:d] for o, d in zip(outs, first_dims, strict=True)], dim=0)

    def _alltoall(
        self, req: Request, splits: tuple[tuple[int, ...], ...]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        t = req.tensor
        send = list(splits[self.rank])
        recv = [splits[r][self.rank] for r in range(self.size)]
        out = torch.empty((sum(recv), *t.shape[1:]), dtype=t.dtype)
        self.backend.alltoall(out, t, recv, send)
        return out, torch.tensor(recv, dtype=torch.int32)

    def _reducescatter(self, req: Request, sig: Signature) -> torch.Tensor:
        # Gloo has no reduce_scatter: reduce everything, keep this rank's rows.
        work = req.tensor.clone()
        if sig.prescale != 1.0:
            _scale(work, sig.prescale)
        self.backend.allreduce_async(work, ReduceOp(sig.reduce_op)).wait()
        _postscale(work, sig, self.size)
        start, stop = reducescatter_rows(work.shape[0], self.size, self.rank)
        return work[start:stop].clone()


def reducescatter_rows(rows: int, size: int, rank: int) -> tuple[int, int]:
    """Horovod's split of the first dimension: as even as possible, extra rows to low ranks."""
    base, extra = divmod(rows, size)
    start = rank * base + min(rank, extra)
    return start, start + base + (1 if rank < extra else 0)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _input_flat(op: ReadyOp, dtype: torch.dtype) -> torch.Tensor:
    if op.request is None:
        return torch.zeros(_numel(op.signature.shape), dtype=dtype)
    tensor = op.request.tensor
    # view() costs ~1 us per call; a 1-D tensor is already flat
    return tensor if len(op.signature.shape) == 1 else tensor.view(-1)


def _scale(t: torch.Tensor, factor: float) -> None:
    if t.is_floating_point():
        t.mul_(factor)
    else:
        t.copy_(t * factor)


def _postscale(t: torch.Tensor, sig: Signature, size: int) -> None:
    factor = sig.postscale
    if sig.reduce_op == ReduceOp.AVERAGE:
        if t.is_floating_point():
            factor = factor / size
        else:
            t.copy_(torch.div(t, size, rounding_mode="floor"))
    if factor != 1.0:
        _scale(t, factor)


def _fail(op: ReadyOp, error: BaseException) -> None:
    if op.request is not None:
        op.request.handle.fail(error)
