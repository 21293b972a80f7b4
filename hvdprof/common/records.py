"""What the cycle thread reports after each cycle, for the timeline sink and the autotuner.

The cycle builds one ``CycleRecord`` per cycle and hands it to its observers. Observers
never call back into the runtime: data flows one way (cycle -> sink, cycle -> autotuner).
Times are ``time.perf_counter_ns()`` of this rank unless stated otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: "not known" in :attr:`OpBatch.ready` (a time can be any int64 once clocks are shifted)
NO_TIME = np.iinfo(np.int64).min


@dataclass(frozen=True, slots=True)
class TunableParams:
    """The knobs the autotuner may change; every rank applies the same values at the same cycle."""

    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_enabled: bool = True


@dataclass(slots=True)
class GroupRecord:
    """One backend call: a fusion group of allreduces, or a single other collective."""

    group_id: int  # identical on every rank for the same group
    op: str  # "ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER", "BARRIER", "JOIN"
    backend: str  # "SHM", "TCP" (the control channel), "GLOO"; later "MPI", "NCCL"
    num_tensors: int
    nbytes: int  # payload bytes of the tensors in the group
    buffer_bytes: int  # bytes of the fusion buffer used (0 when reduced in place)
    dtype: str
    t_pack_start: int = 0  # MEMCPY_IN_FUSION_BUFFER (0/0 when not fused)
    t_pack_end: int = 0
    t_collective_start: int = 0  # the backend call
    t_collective_end: int = 0
    t_unpack_start: int = 0  # MEMCPY_OUT_FUSION_BUFFER (0/0 when not fused)
    t_unpack_end: int = 0
    t_wait_start: int = 0  # WAIT_FOR_DATA (device path only; 0/0 otherwise)
    t_wait_end: int = 0


@dataclass(slots=True)
class OpRecord:
    """One tensor op completed (or failed) in this cycle."""

    name: str
    op: str  # as GroupRecord.op
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    t_submit: int  # where its negotiation began on this rank (see OpBatch.t_submit)
    t_negotiated: int  # when this rank learned every rank was ready
    #: rank -> local time at which this rank learned that rank was ready (cycle granularity;
    #: exact for this rank itself). Present on the cached and the uncached path.
    ready_times: dict[int, int]
    cached: bool  # negotiated through the response cache
    group_id: int  # index into CycleRecord.groups' group_id; -1 when it failed before running
    t_done: int = 0
    error: str | None = None
    process_set: int = 0  # the op's process set (0: every rank)


@dataclass(frozen=True, slots=True)
class CacheTable:
    """The response cache's names and signatures by bit, as of one version of it.

    A cycle whose ops all came through the cache sends their bits and this table instead
    of a name and a signature per op; the timeline's stream carries the table once per
    version (the cache changes only on the slow path), not once per op and cycle.
    """

    version: int
    names: list[str | None]  # None: a free bit
    kinds: list[tuple[Any, ...] | None]


@dataclass(slots=True)
class OpBatch:
    """One cycle's completed ops on this rank, by column.

    What the cycle thread hands the timeline instead of one :class:`OpRecord` per op:
    each column is one list comprehension or one numpy operation per cycle, so recording
    thousands of small tensors per step costs well under a microsecond per op on the
    critical path. ``to_records`` (run by the renderer, off that path) gives the records.
    """

    #: None when ``bits`` names the ops instead
    names: list[str] | None
    #: per op, (op, dtype, shape, nbytes): one shared tuple per distinct signature, with
    #: the process set's id as a fifth item for an op of a set other than the global one;
    #: None with ``bits``
    kinds: list[tuple[Any, ...]] | None
    #: where each op's negotiation began on this rank: its submission, or for an op held
    #: for its rank's wait (``HVDPROF_WAKE_ON_SUBMIT_BYTES``) when the cycle took it (its
    #: submission is then only in ``ready``'s own column)
    t_submit: list[int]
    t_negotiated: list[int]
    #: (ops, ranks) int64: when this rank learned each rank was ready; NO_TIME if unknown.
    #: None with ``ready_fill``: read it with :meth:`ready_rows`
    ready: np.ndarray | None
    cached: bytes  # one byte per op: 1 when it came through the response cache
    group_ids: list[int]
    t_done: list[int]
    errors: dict[int, str] = field(default_factory=dict)  # position -> message
    #: the ops' response-cache bits (native int64 bytes) when every op came through the
    #: cache, and the table that names them
    bits: bytes | None = None
    table: CacheTable | None = None
    #: (time, this rank, ranks) instead of ``ready``: every rank showed every op at
    #: ``time`` (the cycle's start), this rank at its ``t_submit``. The common cycle then
    #: builds no matrix; whoever reads the readiness (the renderer, off the training's
    #: cores) does.
    ready_fill: tuple[int, int, int] | None = None

    def __len__(self) -> int:
        return len(self.t_submit)

    def ready_rows(self) -> np.ndarray:
        """``ready``, built from ``ready_fill`` where the cycle left it to the reader."""
        if self.ready is not None:
            return self.ready
        assert self.ready_fill is not None
        t, rank, ranks = self.ready_fill
        ready = np.full((len(self.t_submit), ranks), t, dtype=np.int64)
        ready[:, rank] = self.t_submit
        return ready

    def resolved(self) -> OpBatch:
        """This batch with ``names`` and ``kinds`` filled in from its table."""
        if self.names is not None and self.kinds is not None:
            return self
        assert self.bits is not None and self.table is not None
        bits = np.frombuffer(self.bits, dtype=np.int64).tolist()
        names, kinds = self.table.names, self.table.kinds
        return OpBatch(
            names=[names[b] for b in bits],  # type: ignore[misc]
            kinds=[kinds[b] for b in bits],  # type: ignore[misc]
            t_submit=self.t_submit,
            t_negotiated=self.t_negotiated,
            ready=self.ready,
            cached=self.cached,
            group_ids=self.group_ids,
            t_done=self.t_done,
            errors=self.errors,
            ready_fill=self.ready_fill,
        )

    def __iter__(self) -> Iterator[OpRecord]:
        return iter(self.to_records())

    def to_records(self) -> list[OpRecord]:
        if self.names is None or self.kinds is None:
            return self.resolved().to_records()
        out = []
        errors = self.errors
        ready_rows = self.ready_rows().tolist()
        cached = self.cached
        for i, name in enumerate(self.names):
            kind = self.kinds[i]
            op, dtype, shape, nbytes = kind[:4]
            out.append(
                OpRecord(
                    name,
                    op,
                    dtype,
                    shape,
                    nbytes,
                    self.t_submit[i],
                    self.t_negotiated[i],
                    {r: t for r, t in enumerate(ready_rows[i]) if t != NO_TIME},
                    bool(cached[i]),
                    self.group_ids[i],
                    self.t_done[i],
                    errors.get(i),
                    kind[4] if len(kind) > 4 else 0,
                )
            )
        return out

    @classmethod
    def from_records(cls, records: list[OpRecord]) -> OpBatch:
        ranks = 1 + max((r for rec in records for r in rec.ready_times), default=-1)
        ready = np.full((len(records), ranks), NO_TIME, dtype=np.int64)
        for i, rec in enumerate(records):
            for r, t in rec.ready_times.items():
                ready[i, r] = t
        return cls(
            names=[r.name for r in records],
            kinds=[
                (r.op, r.dtype, tuple(r.shape), r.nbytes)
                + ((r.process_set,) if r.process_set else ())
                for r in records
            ],
            t_submit=[r.t_submit for r in records],
            t_negotiated=[r.t_negotiated for r in records],
            ready=ready,
            cached=bytes(bool(r.cached) for r in records),
            group_ids=[r.group_id for r in records],
            t_done=[r.t_done for r in records],
            errors={i: r.error for i, r in enumerate(records) if r.error is not None},
        )


@dataclass(slots=True)
class CycleRecord:
    cycle: int  # cycle index, identical across ranks
    step: int  # runtime step (see StepCounter), identical across ranks
    t_start: int
    t_negotiated: int
    t_end: int
    params: TunableParams
    bytes_reduced: int  # allreduce payload bytes completed this cycle
    #: the ops this rank completed: an OpBatch from the cycle, or records (tests, tools)
    ops: OpBatch | list[OpRecord] = field(default_factory=list)
    groups: list[GroupRecord] = field(default_factory=list)
    #: parameters applied at the start of this cycle (same cycle on all ranks), if changed
    params_changed: bool = False


class CycleObserver(Protocol):
    """Something that watches the cycle: the timeline sink, the autotuner.

    ``detailed`` observers get per-op and per-group timings (which cost a few
    perf_counter calls per op); the others get ops/groups empty.

    ``per_cycle`` observers get every cycle's record; the others get one call per step
    (:meth:`on_step`) and no record is built for them. The cycle does that work while the
    training thread, woken by the ops the cycle just completed, waits for the GIL: a
    watching autotuner fed every cycle cost the cycle benchmark job (nine cycles a step)
    about 2% of its step time.
    """

    detailed: bool
    per_cycle: bool

    def on_cycle(self, record: CycleRecord) -> None:
        """Called on the cycle thread after each cycle (``per_cycle``). Must return
        quickly."""

    def on_step(self, step: int, t_start: int, bytes_before: int, params: TunableParams) -> None:
        """Called on the cycle thread at the end of each step's first cycle, when not
        ``per_cycle``: that cycle's ``t_start``, the bytes this rank had reduced before it,
        and the parameters it ran with. Must return quickly."""

    def close(self) -> None:
        """Called once at shutdown, on the cycle thread's owner."""
