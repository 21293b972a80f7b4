"""What the cycle thread reports after each cycle, for the timeline sink and the autotuner.

The cycle builds one ``CycleRecord`` per cycle and hands it to its observers. Observers
never call back into the runtime: data flows one way (cycle -> sink, cycle -> autotuner).
Times are ``time.perf_counter_ns()`` of this rank unless stated otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


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
    backend: str  # "GLOO", "MPI", "NCCL"
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


@dataclass(slots=True)
class OpRecord:
    """One tensor op completed (or failed) in this cycle."""

    name: str
    op: str  # as GroupRecord.op
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    t_submit: int  # when the user enqueued it on this rank
    t_negotiated: int  # when this rank learned every rank was ready
    #: rank -> local time at which this rank learned that rank was ready (cycle granularity;
    #: exact for this rank itself). Present on the cached and the uncached path.
    ready_times: dict[int, int]
    cached: bool  # negotiated through the response cache
    group_id: int  # index into CycleRecord.groups' group_id; -1 when it failed before running
    t_done: int = 0
    error: str | None = None


@dataclass(slots=True)
class CycleRecord:
    cycle: int  # cycle index, identical across ranks
    step: int  # runtime step (see StepCounter), identical across ranks
    t_start: int
    t_negotiated: int
    t_end: int
    params: TunableParams
    bytes_reduced: int  # allreduce payload bytes completed this cycle
    ops: list[OpRecord] = field(default_factory=list)
    groups: list[GroupRecord] = field(default_factory=list)
    #: parameters applied at the start of this cycle (same cycle on all ranks), if changed
    params_changed: bool = False


class CycleObserver(Protocol):
    """Something that watches the cycle: the timeline sink, the autotuner.

    ``detailed`` observers get per-op and per-group timings (which cost a few
    perf_counter calls per op); the others get ops/groups empty.
    """

    detailed: bool

    def on_cycle(self, record: CycleRecord) -> None:
        """Called on the cycle thread after each cycle. Must return quickly."""

    def close(self) -> None:
        """Called once at shutdown, on the cycle thread's owner."""
