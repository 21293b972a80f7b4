"""The device path: collectives on GPU tensors, ordered by events and timed by events.

Everything here is device-independent except :class:`StreamClock`, the one interface
to the device: events, streams and which stream runs what. :class:`CudaStreams` is the
CUDA implementation (``torch.cuda.Event`` / ``torch.cuda.Stream``); :class:`HostStreams`
is a stand-in with the same interface whose events stamp the host clock when recorded.
With ``HVDPROF_DEVICE_PATH_ON_CPU=1`` the runtime sends CPU tensors down this path with
host events and a Gloo process group, so the CPU tests run every line a GPU job runs
except the few in :class:`CudaStreams` and the NCCL group itself.

What the path does, per fusion group of allreduces (other collectives: the same, without
the two copies):

- ``WAIT_FOR_DATA``: the executor's stream waits for the event recorded on the user's
  current stream when the op was submitted (the kernel that produced the gradient).
- ``MEMCPY_IN_FUSION_BUFFER``: ``torch.cat`` into a buffer kept on the device, per device,
  pipeline slot and dtype, sized by the fusion threshold.
- ``<BACKEND>_ALLREDUCE`` (``NCCL_ALLREDUCE``): the process group orders NCCL's stream
  after the executor's; a completion stream waits for NCCL and records the end, and the
  executor's stream waits for that event before unpacking.
- ``MEMCPY_OUT_FUSION_BUFFER``: ``torch.split_with_sizes_copy`` back into the tensors.
- a done event on the executor's stream, which the user's current stream waits on in
  ``synchronize`` (:meth:`DevicePath.follow`): no host synchronize anywhere on the way.

Each boundary is an event; the phases are read with ``elapsed_time`` once the last event
is complete, on the cycle thread after the cycle's work is queued, and only when a
timeline is recorded (:meth:`DevicePath.resolve`). Phases are placed on the host clock
from the host time at which the group's first event was recorded; their durations are
the device's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any, Protocol

import torch

from hvdprof.common import activities as act
from hvdprof.common import timebase
from hvdprof.runtime import collective_core as core
from hvdprof.runtime.requests import OpType, ReduceOp

# ------------------------------------------------------------------------ phase names


def phase_names(backend: str, op: str, fused: bool) -> list[str]:
    """The timeline/NVTX phases of one group, in order (Horovod's names)."""
    names = [act.WAIT_FOR_DATA]
    if fused:
        names.append(act.MEMCPY_IN_FUSION_BUFFER)
    names.append(act.collective_name(backend, op))
    if fused:
        names.append(act.MEMCPY_OUT_FUSION_BUFFER)
    return names


# ------------------------------------------------------------------- the device interface


class StreamClock(Protocol):
    """Events and streams of one kind of device (``cuda``, or ``cpu`` for the stand-in)."""

    kind: str

    def event(self) -> Any:
        """A new timing event (``torch.cuda.Event(enable_timing=True)``)."""

    def current_stream(self, device: torch.device) -> Any:
        """The calling thread's current stream on ``device``."""

    def executor_stream(self, device: torch.device) -> Any:
        """The stream the runtime packs, reduces and unpacks on (one per device)."""

    def completion_stream(self, device: torch.device) -> Any:
        """A stream that only waits for collectives to end (one per device)."""

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        """Make ``stream`` the current one inside the block."""

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:
        """Tell the allocator ``tensor`` is used on ``stream`` too (``record_stream``)."""

    def default_device(self) -> torch.device: ...


class HostEvent:
    """``torch.cuda.Event``'s interface on the host: ``record`` stamps the host clock.

    Host work is done when the call that queued it returns, so the stamp is when the
    event's position in the stream is reached, as a CUDA event's is on the device.
    Misuse that CUDA would let pass silently raises here: waiting on an event never
    recorded (on a GPU: no ordering at all, a race), timing one never recorded.
    """

    __slots__ = ("t_ns",)

    def __init__(self, enable_timing: bool = True) -> None:
        self.t_ns: int | None = None

    def record(self, stream: Any = None) -> None:
        self.t_ns = timebase.now_ns()

    def query(self) -> bool:
        return self.t_ns is not None

    def synchronize(self) -> None:
        if self.t_ns is None:
            raise RuntimeError("synchronize() on an event that was never recorded")

    def wait(self, stream: Any = None) -> None:
        (stream or HostStream()).wait_event(self)

    def elapsed_time(self, end_event: HostEvent) -> float:
        """Milliseconds from this event to ``end_event``, as ``torch.cuda.Event``'s."""
        if self.t_ns is None or end_event.t_ns is None:
            raise RuntimeError("elapsed_time() on an event that was never recorded")
        return (end_event.t_ns - self.t_ns) / 1e6


class HostStream:
    """A stream stand-in: counts the waits, and refuses to wait on an unrecorded event."""

    __slots__ = ("name", "waits")

    def __init__(self, name: str = "host") -> None:
        self.name = name
        self.waits = 0

    def wait_event(self, event: HostEvent) -> None:
        if not event.query():
            raise RuntimeError(
                f"stream {self.name!r} waits on an event that was never recorded "
                "(on a GPU this wait would order nothing: a race)"
            )
        self.waits += 1


class HostStreams:
    """The stand-in device: host events and streams, CPU tensors."""

    kind = "cpu"

    def __init__(self) -> None:
        self.executor = HostStream("executor")
        self.completion = HostStream("completion")
        self.user = HostStream("user")

    def event(self) -> HostEvent:
        return HostEvent()

    def current_stream(self, device: torch.device) -> HostStream:
        return self.user

    def executor_stream(self, device: torch.device) -> HostStream:
        return self.executor

    def completion_stream(self, device: torch.device) -> HostStream:
        return self.completion

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:
        return None

    def default_device(self) -> torch.device:
        return torch.device("cpu")


class CudaStreams:
    """CUDA: ``torch.cuda`` events and streams (needs a GPU; not exercised on CPU)."""

    kind = "cuda"

    def __init__(self) -> None:
        self._executor: dict[int, Any] = {}
        self._completion: dict[int, Any] = {}

    def event(self) -> Any:
        return torch.cuda.Event(enable_timing=True)

    def current_stream(self, device: torch.device) -> Any:
        return torch.cuda.current_stream(device)

    def _stream(self, table: dict[int, Any], device: torch.device) -> Any:
        index = device.index if device.index is not None else torch.cuda.current_device()
        stream = table.get(index)
        if stream is None:
            stream = table[index] = torch.cuda.Stream(device=index)
        return stream

    def executor_stream(self, device: torch.device) -> Any:
        return self._stream(self._executor, device)

    def completion_stream(self, device: torch.device) -> Any:
        return self._stream(self._completion, device)

    def use(self, stream: Any) -> contextlib.AbstractContextManager[Any]:
        return torch.cuda.stream(stream)

    def keep_for(self, tensor: torch.Tensor, stream: Any) -> None:
        tensor.record_stream(stream)

    def default_device(self) -> torch.device:
        return torch.device("cuda", torch.cuda.current_device())


# ------------------------------------------------------------------- the phase record


class PhaseEvents:
    """One group's phases as (name, start event, end event), recorded in stream order.

    ``anchor_ns`` is the host time at which the first event was recorded; ``resolve``
    places every phase at ``anchor_ns + first.elapsed_time(start)``.
    """

    __slots__ = ("anchor_ns", "first", "last", "phases")

    def __init__(self, clock: StreamClock, stream: Any) -> None:
        self.first = clock.event()
        self.anchor_ns = timebase.now_ns()
        self.first.record(stream)
        self.last = self.first
        self.phases: list[tuple[str, Any, Any]] = []

    def add(self, name: str, start: Any, end: Any) -> None:
        self.phases.append((name, start, end))
        self.last = end

    def resolve(self) -> list[tuple[str, int, int]]:
        """(name, start ns, end ns) on the host clock; waits for the last event first."""
        self.last.synchronize()
        first, anchor = self.first, self.anchor_ns
        out = []
        for name, start, end in self.phases:
            t0 = anchor + round(first.elapsed_time(start) * 1e6)
            t1 = t0 + round(start.elapsed_time(end) * 1e6)
            out.append((name, t0, max(t1, t0)))
        return out


def fill_record(record: Any, spans: list[tuple[str, int, int]]) -> int:
    """Copy resolved spans into a ``GroupRecord``; returns the last end (ns)."""
    last = 0
    for name, t0, t1 in spans:
        if name == act.WAIT_FOR_DATA:
            record.t_wait_start, record.t_wait_end = t0, t1
        elif name == act.MEMCPY_IN_FUSION_BUFFER:
            record.t_pack_start, record.t_pack_end = t0, t1
        elif name == act.MEMCPY_OUT_FUSION_BUFFER:
            record.t_unpack_start, record.t_unpack_end = t0, t1
        else:
            record.t_collective_start, record.t_collective_end = t0, t1
        last = max(last, t1)
    return last


# ------------------------------------------------------------------- the path


class DevicePath:
    """Runs the executor's device groups: the hooks in ``executor.py`` call in here."""

    def __init__(self, backend: Any, clock: StreamClock, rank: int, size: int) -> None:
        self.backend = backend
        self.clock = clock
        self.rank = rank
        self.size = size
        self.kind = clock.kind
        self.pool = core.FusionBufferPool()
        #: (GroupRecord, PhaseEvents, op positions) waiting for ``resolve``
        self.pending: list[tuple[Any, PhaseEvents, Any]] = []
        self.groups = 0  # groups run (tests read it)

    def routes(self, device: str) -> bool:
        """Whether ops on ``device`` (a Signature's device: ``cpu``/``cuda``) come here."""
        return device == self.kind

    # ----------------------------------------------------------- user's thread
    def ready_event(self, tensor: torch.Tensor) -> Any:
        """At submit: an event on the user's current stream, after the producing kernel."""
        event = self.clock.event()
        event.record(self.clock.current_stream(tensor.device))
        return event

    def follow(self, event: Any, result: Any) -> None:
        """In ``synchronize``: the user's next kernels wait for the op's done event."""
        if event is None:
            return
        device = _device_of(result) or self.clock.default_device()
        stream = self.clock.current_stream(device)
        stream.wait_event(event)
        for t in _tensors(result):
            if t.device == device:  # (alltoall's received splits are on the host)
                self.clock.keep_for(t, stream)

    # ----------------------------------------------------------- cycle thread
    def _device(self, requests: list[Any]) -> torch.device:
        for r in requests:
            if r is not None:
                return r.tensor.device
        return self.clock.default_device()

    def _begin(self, requests: list[Any], device: torch.device, nvtx: Any) -> PhaseEvents:
        clock = self.clock
        stream = clock.executor_stream(device)
        phases = PhaseEvents(clock, stream)
        if nvtx is not None:
            nvtx.push(act.WAIT_FOR_DATA)
        for r in requests:
            if r is not None and r.stream_event is not None:
                stream.wait_event(r.stream_event)
        ready = clock.event()
        ready.record(stream)
        phases.add(act.WAIT_FOR_DATA, phases.first, ready)
        if nvtx is not None:
            nvtx.pop()
        return phases

    def start_allreduce(self, run: Any, slot: int, threshold: int, nvtx: Any) -> None:
        ops, requests = run.ops, run.requests
        sig = ops[0].signature
        dtype = core.torch_dtype(sig.dtype)
        device = self._device(requests)
        clock = self.clock
        stream = clock.executor_stream(device)
        name = act.collective_name(self.backend.name, "ALLREDUCE")
        if nvtx is not None:
            nvtx.push(act.OPS[OpType.ALLREDUCE])
        with clock.use(stream):
            phases = self._begin(requests, device, nvtx)
            if run.group.fused:
                if nvtx is not None:
                    nvtx.push(act.MEMCPY_IN_FUSION_BUFFER)
                numel = run.group.nbytes // dtype.itemsize
                flat = self.pool.get(device, dtype, slot, numel, threshold)
                run.inputs = core.pack_inputs(ops, requests, dtype, device)
                torch.cat(run.inputs, out=flat)
                packed = clock.event()
                packed.record(stream)
                phases.add(act.MEMCPY_IN_FUSION_BUFFER, phases.last, packed)
                if nvtx is not None:
                    nvtx.pop()
            else:
                flat = core.single_buffer(sig, requests[0], dtype, device)
            if sig.prescale != 1.0:
                core.scale(flat, sig.prescale)
            if nvtx is not None:
                nvtx.push(name)
            started = clock.event()
            started.record(stream)
            run.flat = flat
            run.work = self.backend.allreduce_async(flat, ReduceOp(sig.reduce_op))
            if nvtx is not None:
                nvtx.pop()
        if nvtx is not None:
            nvtx.pop()
        run.device = (phases, started, device)

    def finish_allreduce(self, run: Any, nvtx: Any) -> Any:
        """Queue the end of ``run``'s allreduce and its unpack; returns the done event."""
        phases, started, device = run.device
        clock = self.clock
        stream = clock.executor_stream(device)
        completion = clock.completion_stream(device)
        flat = run.flat
        name = act.collective_name(self.backend.name, "ALLREDUCE")
        if nvtx is not None:
            nvtx.push(act.OPS[OpType.ALLREDUCE])
            nvtx.push(name)
        with clock.use(completion):  # NCCL: the completion stream waits, not the host
            run.work.wait()
            reduced = clock.event()
            reduced.record(completion)
        stream.wait_event(reduced)
        phases.add(name, started, reduced)
        if nvtx is not None:
            nvtx.pop()
        with clock.use(stream):
            core.postscale(flat, run.ops[0].signature, self.size)
            if run.group.fused:
                if nvtx is not None:
                    nvtx.push(act.MEMCPY_OUT_FUSION_BUFFER)
                outs = core.unpack_targets(run.ops, run.requests, run.inputs, flat.dtype)
                torch.split_with_sizes_copy(flat, [op.numel for op in run.ops], out=outs)
                unpacked = clock.event()
                unpacked.record(stream)
                phases.add(act.MEMCPY_OUT_FUSION_BUFFER, reduced, unpacked)
                if nvtx is not None:
                    nvtx.pop()
                done = unpacked
            else:
                done = clock.event()
                done.record(stream)
                phases.last = done
        if nvtx is not None:
            nvtx.pop()
        self._finished(run.record, phases, run.positions)
        for r in run.requests:
            if r is not None:
                r.stream_event = done
        return done

    def _finished(self, record: Any, phases: PhaseEvents, positions: Any) -> None:
        self.groups += 1
        if record is not None:
            self.pending.append((record, phases, positions))

    def run_other(self, op: Any, req: Any, record: Any, nvtx: Any, position: int) -> Any:
        """A broadcast, allgather, alltoall or reducescatter of one tensor."""
        sig = op.signature
        device = req.tensor.device
        clock = self.clock
        stream = clock.executor_stream(device)
        opname = sig.op.name
        name = act.collective_name(self.backend.name, opname)
        if nvtx is not None:
            nvtx.push(opname)
        with clock.use(stream):
            phases = self._begin([req], device, nvtx)
            if nvtx is not None:
                nvtx.push(name)
            started = phases.last
            result = self._collective(op, req)
            ended = clock.event()
            ended.record(stream)
            phases.add(name, started, ended)
            if nvtx is not None:
                nvtx.pop()
        if nvtx is not None:
            nvtx.pop()
        self._finished(record, phases, (position,))
        req.stream_event = ended
        return result

    def _collective(self, op: Any, req: Any) -> Any:
        sig = op.signature
        t = req.tensor
        if sig.op == OpType.BROADCAST:
            return core.broadcast(self.backend, req, sig.root_rank)
        if sig.op == OpType.ALLGATHER:
            return core.allgather_padded(self.backend, t, op.first_dims or (), self.size)
        if sig.op == OpType.ALLTOALL:
            return core.alltoall(self.backend, t, op.splits or (), self.rank, self.size)
        if sig.op == OpType.REDUCESCATTER:
            even = t.shape[0] % self.size == 0  # NCCL's reduce-scatter wants even splits
            return core.reducescatter(self.backend, t, sig, self.rank, self.size, native=even)
        raise ValueError(f"{opname_of(sig)} is not supported on {self.kind} tensors")

    def resolve(self, op_done: list[int] | None) -> None:
        """Fill the pending groups' records from their events (timeline on only).

        Waits for the cycle's last GPU phase on the cycle thread, never on the user's.
        Each op of a group then ends no earlier than its group's last phase.
        """
        pending, self.pending = self.pending, []
        for record, phases, positions in pending:
            last = fill_record(record, phases.resolve())
            if op_done is not None:
                for p in positions:
                    op_done[p] = max(op_done[p], last)

    def close(self) -> None:
        self.pool.clear()
        self.pending.clear()


def opname_of(sig: Any) -> str:
    return sig.op.name.lower()


def _tensors(result: Any) -> Iterator[torch.Tensor]:
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, (tuple, list)):
        for item in result:
            yield from _tensors(item)


def _device_of(result: Any) -> torch.device | None:
    for t in _tensors(result):
        return t.device
    return None


# ------------------------------------------------------------------- opening


def open_device_path(
    config: Any, store: Any, rank: int, size: int, local_rank: int, gloo_group: Any
) -> DevicePath | None:
    """The runtime's device path: NCCL when CUDA and NCCL are there, the CPU stand-in
    when ``config.device_path_on_cpu``, else None (CUDA tensors are then refused).

    The group is made on the runtime's store, beside the Gloo data group, by every rank
    at the same point of ``init()``. With CUDA, each rank first takes the GPU of its local
    rank (``torch.cuda.set_device(local_rank)``, as Horovod's examples do themselves).
    """
    import datetime
    import logging

    import torch.distributed as dist

    from hvdprof.runtime.backends.nccl import ProcessGroupCollectives

    timeout = datetime.timedelta(seconds=config.collective_timeout_s)
    if config.device_path_on_cpu:
        if store is None:
            return None
        pg = gloo_group(store, "hvdprof/device/", timeout)
        return DevicePath(
            ProcessGroupCollectives(pg, rank, size, "GLOO"), HostStreams(), rank, size
        )
    if not (torch.cuda.is_available() and dist.is_nccl_available()):
        return None
    if store is None:  # (the whole job on MPI: no store to meet on)
        logging.getLogger("hvdprof").warning(
            "hvdprof: CUDA tensors are refused: the MPI data backend has no store for NCCL"
        )
        return None
    torch.cuda.set_device(local_rank % torch.cuda.device_count())
    options = dist.ProcessGroupNCCL.Options()
    options._timeout = timeout
    pg = dist.ProcessGroupNCCL(dist.PrefixStore("hvdprof/nccl/", store), rank, size, options)
    return DevicePath(ProcessGroupCollectives(pg, rank, size, "NCCL"), CudaStreams(), rank, size)
