"""Runs one cycle's ready ops on the backend: fusion buffers, pipelining, completion.

Allreduce groups are pipelined: up to ``max_inflight`` buffers are reduced at once, so
packing the next buffer overlaps the reduction of the previous one. A group of one tensor
is reduced in place, with no copy at all.
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import torch

from hvdprof.common import timebase
from hvdprof.common.activities import NVTX_COLLECTIVE, NVTX_MEMCPY_IN, NVTX_MEMCPY_OUT
from hvdprof.common.records import GroupRecord
from hvdprof.errors import TensorMismatchError
from hvdprof.runtime.adasum import combine_tree
from hvdprof.runtime.backends.base import DONE, CollectiveBackend
from hvdprof.runtime.backends.shm import SharedMemoryAllreduce
from hvdprof.runtime.collective_core import (
    FusionBufferPool,
    UnpackViews,
    allgather_padded,
    alltoall,
    broadcast,
    flat_view,
    pack_inputs,
    postscale,
    reducescatter,
    scale,
    single_buffer,
    torch_dtype,
    unpack_targets,
)
from hvdprof.runtime.fusion import FusionGroup, plan_fusion_columns
from hvdprof.runtime.handles import notify_waiters
from hvdprof.runtime.negotiation import AgreedOp
from hvdprof.runtime.requests import OpType, ReduceOp, Request, Signature

#: Through shared memory, a fused group is reduced straight from its tensors when they
#: average at least this size; below it, a few torch calls per tensor cost more than
#: packing the group with one ``torch.cat`` (measured break-even: tens of KiB).
SHM_IN_PLACE_BYTES = 64 * 1024


#: the host, where this path's tensors and fusion buffers are
_CPU = torch.device("cpu")


class Executor:
    def __init__(self, backend: CollectiveBackend, rank: int, size: int) -> None:
        self.backend = backend
        self.rank = rank
        self.size = size
        self.pool = FusionBufferPool()
        self.unpack = UnpackViews(self.pool)
        self.next_group_id = 0
        self.nvtx: Any = None  # PhaseRanges (no-ops when NVTX is off)
        #: frees completed names for reuse, one call per group (set by the runtime)
        self.retire: Any = None
        # counters the tests and benchmarks read
        self.fused_groups = 0
        self.fused_tensors = 0
        self.backend_calls = 0
        #: small buffers go here instead (the control channel's star), if set
        self.small: CollectiveBackend | Any = None
        self.small_bytes = 0
        self.small_calls = 0  # of backend_calls, how many went to ``small``
        #: allreduces go here (shared memory: every rank on one host), if set
        self.shm: SharedMemoryAllreduce | None = None
        self.shm_calls = 0  # of backend_calls, how many went to ``shm``
        #: per op of the last detailed run: its group id (-1: failed) and completion time
        self.op_group: list[int] = []
        self.op_done: list[int] = []
        #: whether the last run failed some op's request (its error is on the request)
        self.failed = False
        #: device path (issue 28): ops on a GPU go to this DevicePath, if set
        self.device: Any = None
        #: process sets this rank belongs to, other than the global one: id -> an
        #: executor on the set's own group (its rank and size are the set's)
        self.subsets: dict[int, Executor] = {}
        #: global rank -> this executor's rank (a set's executor; None: the same)
        self.rank_of: dict[int, int] | None = None

    # ----------------------------------------------------------------------------------
    def run(
        self,
        ops: list[AgreedOp],
        requests: list[Request | None],
        threshold_bytes: int,
        max_inflight: int,
        detailed: bool,
    ) -> tuple[int, list[GroupRecord]]:
        """Run ``ops`` (same order on every rank); returns allreduce bytes and group records.

        ``requests[i]`` is this rank's request for ``ops[i]``, None where this rank has
        joined. Per-op results go straight to the requests, which are their handles.
        With ``detailed``, ``op_group`` and ``op_done`` give each op's group id and
        completion time afterwards (for the timeline).
        """
        if self.subsets:
            for op in ops:
                if op.signature.process_set:
                    return self._run_by_set(ops, requests, threshold_bytes, max_inflight, detailed)
        return self._run_one_set(ops, requests, threshold_bytes, max_inflight, detailed)

    def _run_by_set(
        self,
        ops: list[AgreedOp],
        requests: list[Request | None],
        threshold_bytes: int,
        max_inflight: int,
        detailed: bool,
    ) -> tuple[int, list[GroupRecord]]:
        """Each process set's ops on its own executor: the global set's first, then by id.

        Every rank runs the sets it belongs to in that order, so members of two sets meet
        in both in the same order. Group ids stay unique across sets (one counter).
        """
        by_set: dict[int, list[int]] = {}
        for i, op in enumerate(ops):
            by_set.setdefault(op.signature.process_set, []).append(i)
        n = len(ops)
        op_group, op_done = [-1] * n, [0] * n
        reduced, records, failed = 0, [], False
        for set_id in sorted(by_set):
            where = by_set[set_id]
            runner = self if set_id == 0 else self.subsets.get(set_id)
            if runner is None:  # (the cycle runs only this rank's sets' ops)
                raise AssertionError(f"process set {set_id} ran on a rank outside it")
            runner.next_group_id = self.next_group_id
            part, part_records = runner._run_one_set(
                [ops[i] for i in where],
                [requests[i] for i in where],
                threshold_bytes,
                max_inflight,
                detailed,
            )
            self.next_group_id = runner.next_group_id
            reduced += part
            records.extend(part_records)
            failed = failed or runner.failed
            if detailed:
                for j, i in enumerate(where):
                    op_group[i] = runner.op_group[j]
                    op_done[i] = runner.op_done[j]
        self.failed = failed
        if detailed:
            self.op_group, self.op_done = op_group, op_done
        return reduced, records

    def _run_one_set(
        self,
        ops: list[AgreedOp],
        requests: list[Request | None],
        threshold_bytes: int,
        max_inflight: int,
        detailed: bool,
    ) -> tuple[int, list[GroupRecord]]:
        n = len(ops)
        self.failed = False
        if detailed:
            self.op_group = [-1] * n
            self.op_done = [0] * n
        records: list[GroupRecord] = []
        fusable = [i for i, op in enumerate(ops) if op.fusable]
        others: list[int] = []
        if len(fusable) != n:
            chosen = set(fusable)
            for i, op in enumerate(ops):
                if i in chosen:
                    continue
                if op.error is not None:
                    _fail(requests[i], TensorMismatchError(op.error))
                    self.failed = True
                else:
                    others.append(i)
        reduced = 0
        if fusable:
            reduced = self._run_allreduces(
                ops, requests, fusable, threshold_bytes, max_inflight, detailed, records
            )
        for i in others:
            self._run_other(i, ops[i], requests[i], detailed, records)
        if detailed and self.device is not None and self.device.pending:  # device path
            self.device.resolve(self.op_done)
        return reduced, records

    # ----------------------------------------------------------------------------------
    def _run_allreduces(
        self,
        ops: list[AgreedOp],
        requests: list[Request | None],
        positions: list[int],
        threshold: int,
        max_inflight: int,
        detailed: bool,
        records: list[GroupRecord],
    ) -> int:
        if len(positions) != len(ops):
            ops = [ops[i] for i in positions]
            requests = [requests[i] for i in positions]
        device = self.device  # device path (issue 28): its groups keep the threshold
        if (
            self.shm is not None
            and threshold > 0  # (0 still means: no fusion)
            and not (device is not None and any(device.routes(op.key.device) for op in ops))
        ):
            # Through shared memory a group is one pair of barriers, whatever its size up to
            # the segment's: fill the segment. (Groups reduced in place have no fusion
            # buffer to bound, and waiting at fewer barriers is what saves time: 22 groups
            # of ResNet-50's gradients at 4 MiB spent 6.5 ms per step at 44 barriers.)
            threshold = max(threshold, self.shm.capacity)
        groups = plan_fusion_columns([op.key for op in ops], [op.nbytes for op in ops], threshold)
        inflight: deque[_Running] = deque()
        total = 0
        for slot_counter, group in enumerate(groups):
            if len(inflight) >= max_inflight:
                self._finish_allreduce(inflight.popleft())
            indices = group.indices
            run = _Running(
                group,
                [ops[i] for i in indices],
                [requests[i] for i in indices],
                self.next_group_id,
                self.backend,
            )
            if device is not None and device.routes(group.key.device):  # device path
                run.backend = device.backend
            elif self.small is not None and group.nbytes <= self.small_bytes:
                run.backend = self.small
                self.small_calls += 1
            elif self.shm is not None:
                run.backend = self.shm
                self.shm_calls += 1
            if detailed:
                run.record = GroupRecord(
                    group_id=run.group_id,
                    op="ALLREDUCE",
                    backend=run.backend.name,
                    num_tensors=len(indices),
                    nbytes=group.nbytes,
                    buffer_bytes=group.nbytes if group.fused else 0,
                    dtype=group.key.dtype,
                )
                records.append(run.record)
                run.positions = _positions(positions, indices)
                _fill(self.op_group, run.positions, run.group_id)
            self.next_group_id += 1
            # (shared memory finishes inside the call: one buffer slot is enough)
            slot = 0 if run.backend is self.shm else slot_counter % max_inflight
            self._start_allreduce(run, slot, threshold)
            if run.backend is self.shm:  # finished inside the call: complete it now
                self._finish_allreduce(run)
            else:
                inflight.append(run)
            total += group.nbytes
        while inflight:
            self._finish_allreduce(inflight.popleft())
        return total

    def _start_allreduce(self, run: _Running, slot: int, threshold: int) -> None:
        ops, requests, record = run.ops, run.requests, run.record
        sig = ops[0].signature
        dtype = torch_dtype(sig.dtype)
        if run.backend is self.shm and run.group.fused and self._shm_in_place(run):
            return
        if self.device is not None and run.backend is self.device.backend:  # device path
            self.device.start_allreduce(run, slot, threshold, self.nvtx)
            self.backend_calls += 1
            if run.group.fused:
                self.fused_groups += 1
                self.fused_tensors += len(ops)
            return
        if run.group.fused:
            if record is not None:
                record.t_pack_start = timebase.now_ns()
            numel = run.group.nbytes // dtype.itemsize
            flat = self.pool.get(_CPU, dtype, slot, numel, threshold)
            inputs = run.inputs = pack_inputs(ops, requests, dtype, _CPU)
            nvtx = self.nvtx
            if nvtx is not None:
                nvtx.push(NVTX_MEMCPY_IN)
            torch.cat(inputs, out=flat)
            if nvtx is not None:
                nvtx.pop()
            if record is not None:
                record.t_pack_end = timebase.now_ns()
            self.fused_groups += 1
            self.fused_tensors += len(ops)
        else:
            flat = single_buffer(sig, requests[0], dtype, _CPU)
        if sig.prescale != 1.0:
            scale(flat, sig.prescale)
        if record is not None:
            record.t_collective_start = timebase.now_ns()
        self.backend_calls += 1
        run.flat = flat
        if run.backend is self.shm:
            # Finished inside the call, and each rank scales only the slice it reduces,
            # before sharing it: no second pass over the whole buffer for Average.
            finish = None
            if sig.postscale != 1.0 or sig.reduce_op == ReduceOp.AVERAGE:
                size = self.size

                def finish(t: torch.Tensor) -> None:
                    postscale(t, sig, size)

            both = [flat.view(-1)]  # (the same list: reduced in place)
            self.shm.allreduce(both, both, ReduceOp(sig.reduce_op), finish, None)
            run.scaled = True
            run.work = DONE
            return
        run.work = run.backend.allreduce_async(flat, ReduceOp(sig.reduce_op))

    def _shm_in_place(self, run: _Running) -> bool:
        """Reduce a fused group straight from and into its tensors, with no fusion buffer.

        The shared segments stand in for the buffer (see ``backends/shm.py``): each rank
        stages the pieces its peers reduce there, so packing and unpacking are the
        segment's copies, not extra ones. Groups of many small tensors still go through
        the buffer: one ``torch.cat`` beats a few torch calls per tensor.
        """
        shm = self.shm
        assert shm is not None
        group, ops, requests, record = run.group, run.ops, run.requests, run.record
        # Collective: every rank sees the same group here, whatever path it takes below.
        shm.reserve(group.nbytes)
        sig = ops[0].signature
        if sig.prescale != 1.0 or None in requests or group.nbytes < SHM_IN_PLACE_BYTES * len(ops):
            return False
        inputs = pack_inputs(ops, requests, torch_dtype(sig.dtype), _CPU)
        if all(r.output is r.tensor for r in requests):
            outputs = inputs
        else:
            outputs = [flat_view(r.output) for r in requests]
        finish = None
        if sig.postscale != 1.0 or sig.reduce_op == ReduceOp.AVERAGE:
            size = self.size

            def finish(t: torch.Tensor) -> None:
                postscale(t, sig, size)

        marks: list[int] | None = None
        if record is not None:
            marks = []
            record.t_pack_start = timebase.now_ns()
        nvtx = self.nvtx
        if nvtx is not None:
            nvtx.push(NVTX_COLLECTIVE)
        self.backend_calls += 1
        shm.allreduce(inputs, outputs, ReduceOp(sig.reduce_op), finish, marks)
        if nvtx is not None:
            nvtx.pop()
        if record is not None:
            assert marks is not None
            if len(marks) == 2:  # one chunk: staging, reduction, collection in turn
                record.t_pack_end = record.t_collective_start = marks[0]
                record.t_collective_end = record.t_unpack_start = marks[1]
                record.t_unpack_end = timebase.now_ns()
            else:  # chunked: the three interleave, so it is all one collective
                record.t_collective_start = record.t_pack_start
                record.t_pack_start = 0
                record.t_collective_end = timebase.now_ns()
            record.buffer_bytes = group.nbytes
        self.fused_groups += 1
        self.fused_tensors += len(ops)
        run.flat = None
        run.work = DONE
        return True

    def _finish_allreduce(self, run: _Running) -> None:
        nvtx = self.nvtx
        record = run.record
        if run.device is not None:  # device path: the end and the unpack, by events
            self.device.finish_allreduce(run, nvtx)
            self._complete(run)
            return
        flat = run.flat
        if flat is None:  # reduced in place through shared memory, already complete
            self._complete(run)
            return
        if nvtx is not None:
            nvtx.push(NVTX_COLLECTIVE)
        run.work.wait()
        if nvtx is not None:
            nvtx.pop()
        if record is not None:
            record.t_collective_end = timebase.now_ns()
        if not run.scaled:
            postscale(flat, run.ops[0].signature, self.size)
        if run.group.fused:
            if record is not None:
                record.t_unpack_start = timebase.now_ns()
            outs = unpack_targets(run.ops, run.requests, run.inputs, flat.dtype)
            if nvtx is not None:
                nvtx.push(NVTX_MEMCPY_OUT)
            self.unpack.copy_out(flat, run.ops, outs)
            if nvtx is not None:
                nvtx.pop()
            if record is not None:
                record.t_unpack_end = timebase.now_ns()
        self._complete(run)

    def _complete(self, run: _Running) -> None:
        requests = run.requests
        if run.record is not None:
            t_done = timebase.now_ns()
            _fill(self.op_done, run.positions, t_done)
        done = requests if None not in requests else [r for r in requests if r is not None]
        if self.retire is not None:
            self.retire([r.name for r in done])
        for r in done:  # Handle.complete, inlined: thousands per step
            r.result = r.output
            r.done_flag = True
        notify_waiters()

    # ----------------------------------------------------------------------------------
    def _run_other(
        self,
        position: int,
        op: AgreedOp,
        req: Request | None,
        detailed: bool,
        records: list[GroupRecord],
    ) -> None:
        sig = op.signature
        record = None
        group_id = self.next_group_id
        self.next_group_id += 1
        if detailed:
            device = self.device  # device path (issue 28): its backend's name
            on_device = device is not None and device.routes(sig.device)
            record = GroupRecord(
                group_id=group_id,
                op=sig.op.name,
                backend=device.backend.name if on_device else self.backend.name,
                num_tensors=1,
                nbytes=op.nbytes,
                buffer_bytes=0,
                dtype=sig.dtype,
            )
            records.append(record)
            self.op_group[position] = group_id
            record.t_collective_start = timebase.now_ns()
        try:
            device = self.device
            if (
                device is not None
                and req is not None
                and device.routes(sig.device)
                and sig.op not in (OpType.BARRIER, OpType.ALLREDUCE)
            ):  # device path (issue 28)
                result = device.run_other(op, req, record, self.nvtx, position)
            else:
                result = self._dispatch(op, req)
        except (ValueError, TypeError) as exc:  # bad input caught late: fail this op only
            _fail(req, TensorMismatchError(f"{sig.op.name.lower()} of {op.name!r} failed: {exc}"))
            self.failed = True
            return
        if record is not None:
            record.t_collective_end = self.op_done[position] = timebase.now_ns()
        if req is not None:
            if self.retire is not None:
                self.retire([op.name])
            req.complete(result)
            notify_waiters()

    def _dispatch(self, op: AgreedOp, req: Request | None) -> Any:
        sig = op.signature
        if sig.op == OpType.BARRIER:
            return None
        if sig.op == OpType.ALLREDUCE:  # the only allreduce that is not fusable: Adasum
            self.backend_calls += 1
            return self._adasum(req, sig)
        assert req is not None, f"{sig.op.name} ran on a rank that has joined"
        self.backend_calls += 1
        if sig.op == OpType.BROADCAST:
            root = sig.root_rank if self.rank_of is None else self.rank_of[sig.root_rank]
            return broadcast(self.backend, req, root)
        if sig.op == OpType.ALLGATHER:
            return self._allgather(req, op.first_dims or ())
        if sig.op == OpType.ALLTOALL:
            return alltoall(self.backend, req.tensor, op.splits or (), self.rank, self.size)
        if sig.op == OpType.REDUCESCATTER:
            native = getattr(self.backend, "reducescatter", None) is not None
            return reducescatter(self.backend, req.tensor, sig, self.rank, self.size, native)
        raise AssertionError(f"unknown op {sig.op}")

    def _adasum(self, req: Request | None, sig: Signature) -> torch.Tensor | None:
        """Gather every rank's tensor and fold them as Horovod's recursive halving pairs
        them (``adasum.py``). A joined rank contributes zeros, which Adasum leaves out."""
        dtype = torch_dtype(sig.dtype)
        if req is None:
            mine = torch.zeros(math.prod(sig.shape), dtype=dtype)
        else:
            mine = req.tensor.reshape(-1).clone()
        if sig.prescale != 1.0:
            scale(mine, sig.prescale)
        gathered = [torch.empty_like(mine) for _ in range(self.size)]
        self.backend.allgather(gathered, mine)
        combined = combine_tree([g.double() for g in gathered]).to(dtype)
        postscale(combined, sig, self.size)
        if req is None:
            return None
        out = req.output
        out.copy_(combined.view(out.shape))
        return out

    def _allgather(self, req: Request, first_dims: tuple[int, ...]) -> torch.Tensor:
        t = req.tensor
        allgatherv = getattr(self.backend, "allgatherv", None)
        if allgatherv is not None and t.dim():  # (MPI: uneven rows, no padding)
            out = torch.empty((sum(first_dims), *t.shape[1:]), dtype=t.dtype)
            allgatherv(out, t.contiguous(), list(first_dims))
            return out
        return allgather_padded(self.backend, t, first_dims, self.size)


class _Running:
    """One fusion group between its backend call and its completion."""

    __slots__ = (
        "backend",
        "device",
        "flat",
        "group",
        "group_id",
        "inputs",
        "ops",
        "positions",
        "record",
        "requests",
        "scaled",
        "work",
    )

    def __init__(
        self,
        group: FusionGroup,
        ops: list[AgreedOp],
        requests: list[Request | None],
        group_id: int,
        backend: Any,
    ) -> None:
        self.backend = backend
        self.group = group
        self.ops = ops
        self.requests = requests
        self.group_id = group_id
        self.record: GroupRecord | None = None
        #: the ops' positions in the run (detailed only)
        self.positions: range | list[int] = range(0)
        self.inputs: list[torch.Tensor] = []
        self.flat: torch.Tensor | None = None
        self.work: Any = None
        #: the backend already applied the postscale / Average division
        self.scaled = False
        #: device path: (PhaseEvents, start event, torch.device) between start and finish
        self.device: Any = None


def _positions(positions: list[int], indices: list[int]) -> range | list[int]:
    """``[positions[i] for i in indices]``, as a range when it is one (the usual case).

    Both lists increase strictly, so equal spans at both ends mean consecutive runs.
    """
    a, b = indices[0], indices[-1]
    if b - a + 1 == len(indices) and positions[b] - positions[a] == b - a:
        return range(positions[a], positions[b] + 1)
    return [positions[i] for i in indices]


def _fill(column: list[int], where: range | list[int], value: int) -> None:
    if type(where) is range and where.step == 1:
        column[where.start : where.stop] = [value] * len(where)
    else:
        for p in where:
            column[p] = value


def _fail(req: Request | None, error: BaseException) -> None:
    if req is not None:
        req.fail(error)
