"""The columnar model of a parsed run: what every analysis, the CLI and the dashboard read.

A trace of a million events as a million Python dicts costs gigabytes and seconds to walk,
so a run is held as numpy arrays, one row per slice (and one row per readiness mark).
Strings (tensor names, slice names, backends, dtypes) are interned into small tables and
the rows hold their index. numpy was chosen over Arrow or Polars because the analyses are
a few vectorised group-bys and interval sweeps that numpy does directly, numpy is already
installed with torch, and ``np.savez`` gives a cache file with no extra dependency.

Phase codes (:data:`PHASES`) classify each slice name once, by the names in
:mod:`hvdprof.common.activities`, so Horovod's ``GLOO_BCAST`` and our ``SHM_ALLREDUCE``
both read as the backend collective.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hvdprof.common import activities as act
from hvdprof.trace.manifest import Manifest

#: Phase of a slice, by code. ``op`` is the whole ``<OP>`` slice (it contains the
#: queue/memcpy/collective children); ``other`` is a child we do not classify
#: (Horovod's ``INIT_FUSION_BUFFER``, ``ALLOCATE_OUTPUT``).
PHASES: tuple[str, ...] = (
    "negotiate",
    "op",
    "queue",
    "memcpy_in",
    "collective",
    "memcpy_out",
    "other",
    "cycle",
)
PHASE_NEGOTIATE, PHASE_OP, PHASE_QUEUE, PHASE_MEMCPY_IN = 0, 1, 2, 3
PHASE_COLLECTIVE, PHASE_MEMCPY_OUT, PHASE_OTHER, PHASE_CYCLE = 4, 5, 6, 7
#: Child phases of an op, in the order they run.
CHILD_PHASES: tuple[int, ...] = (
    PHASE_QUEUE,
    PHASE_MEMCPY_IN,
    PHASE_COLLECTIVE,
    PHASE_MEMCPY_OUT,
    PHASE_OTHER,
)

#: Op names by code (``Run.slices.op``); -1 is "not an op slice / unknown".
OPS: tuple[str, ...] = act.OPS
_OP_CODE = {name: i for i, name in enumerate(OPS)}
#: Horovod's backend names for ops whose word differs from the op's (``GLOO_BCAST``).
_OP_ALIASES = {"BCAST": "BROADCAST"}


def classify(name: str) -> tuple[int, int]:
    """``(phase code, op code)`` of a slice name; op code -1 when the name carries none."""
    if name.startswith(act.NEGOTIATE_PREFIX):
        return PHASE_NEGOTIATE, _OP_CODE.get(name[len(act.NEGOTIATE_PREFIX) :], -1)
    if name in _OP_CODE:
        return PHASE_OP, _OP_CODE[name]
    if name == act.QUEUE or name == act.WAIT_FOR_DATA:  # (both: waiting before the copy)
        return PHASE_QUEUE, -1
    if name == act.MEMCPY_IN_FUSION_BUFFER:
        return PHASE_MEMCPY_IN, -1
    if name == act.MEMCPY_OUT_FUSION_BUFFER:
        return PHASE_MEMCPY_OUT, -1
    if name.startswith(act.CYCLE_PREFIX):
        return PHASE_CYCLE, -1
    backend, _, word = name.rpartition("_")  # "MPI_CONTROL_ALLREDUCE": the last word
    word = _OP_ALIASES.get(word, word)
    if backend and word in _OP_CODE:
        return PHASE_COLLECTIVE, _OP_CODE[word]
    return PHASE_OTHER, -1


#: Columns of :class:`SliceTable` and their dtypes (one source for parser, cache, merge).
SLICE_COLUMNS: dict[str, Any] = {
    "rank": np.int32,  # the rank whose timeline the slice is on
    "tensor": np.int32,  # index into Run.tensors (-1: not on a tensor lane)
    "name": np.int32,  # index into Run.names (the slice's name as written)
    "phase": np.int8,  # index into PHASES
    "op": np.int8,  # index into OPS, -1 unknown
    "start_us": np.float64,  # aligned to rank 0's clock
    "dur_us": np.float64,
    "bytes": np.int64,  # the tensor's bytes, -1 unknown
    "group": np.int64,  # fusion group id (per rank), -1 none
    "group_tensors": np.int32,  # tensors in the fusion group, 0 unknown
    "group_bytes": np.int64,  # bytes of the whole group, -1 unknown
    "buffer_bytes": np.int64,  # fusion buffer bytes used (0: reduced in place), -1 unknown
    "backend": np.int16,  # index into Run.backends, -1 unknown
    "dtype": np.int16,  # index into Run.dtypes, -1 unknown
    "cached": np.int8,  # response-cache hit: 1, miss: 0, unknown: -1
    "occurrence": np.int32,  # n-th op of this tensor on this rank (0-based); children inherit
}
#: Columns of :class:`MarkTable` (readiness marks: when ``observer`` learned that
#: ``ready_rank`` was ready for the op whose negotiate slice is row ``slice``).
MARK_COLUMNS: dict[str, Any] = {
    "observer": np.int32,
    "tensor": np.int32,
    "ts_us": np.float64,
    "ready_rank": np.int32,
    "slice": np.int64,  # row in Run.slices of the NEGOTIATE slice (-1 unknown)
}


class _Table:
    """A bundle of equally long numpy columns."""

    COLUMNS: dict[str, Any] = {}

    def __init__(self, **columns: np.ndarray) -> None:
        n = None
        for name, dtype in self.COLUMNS.items():
            col = columns.get(name)
            col = np.zeros(0, dtype) if col is None else np.asarray(col, dtype)
            setattr(self, name, col)
            if n is None:
                n = len(col)
            elif len(col) != n:
                raise ValueError(f"column {name} has {len(col)} rows, expected {n}")

    def __len__(self) -> int:
        first = next(iter(self.COLUMNS))
        return len(getattr(self, first))

    def columns(self) -> dict[str, np.ndarray]:
        return {name: getattr(self, name) for name in self.COLUMNS}

    def take(self, index: np.ndarray) -> _Table:
        return type(self)(**{k: v[index] for k, v in self.columns().items()})

    @classmethod
    def concat(cls, tables: list[_Table]) -> _Table:
        if not tables:
            return cls()
        return cls(**{k: np.concatenate([getattr(t, k) for t in tables]) for k in cls.COLUMNS})


class SliceTable(_Table):
    """One row per slice; see :data:`SLICE_COLUMNS` for the columns and units."""

    COLUMNS = SLICE_COLUMNS
    rank: np.ndarray
    tensor: np.ndarray
    name: np.ndarray
    phase: np.ndarray
    op: np.ndarray
    start_us: np.ndarray
    dur_us: np.ndarray
    bytes: np.ndarray
    group: np.ndarray
    group_tensors: np.ndarray
    group_bytes: np.ndarray
    buffer_bytes: np.ndarray
    backend: np.ndarray
    dtype: np.ndarray
    cached: np.ndarray
    occurrence: np.ndarray

    @property
    def end_us(self) -> np.ndarray:
        return self.start_us + self.dur_us


class MarkTable(_Table):
    """One row per readiness mark; see :data:`MARK_COLUMNS`."""

    COLUMNS = MARK_COLUMNS
    observer: np.ndarray
    tensor: np.ndarray
    ts_us: np.ndarray
    ready_rank: np.ndarray
    slice: np.ndarray


#: How a problem about a file's cut last event begins (see ``Problem.partial_tail``).
PARTIAL_TAIL = "incomplete last event"


@dataclass(frozen=True)
class Problem:
    """Something that could not be read: which file, where in it, and why."""

    file: str
    where: str  # "line 12", "byte 4096", "" when it concerns the whole file
    reason: str

    @property
    def partial_tail(self) -> bool:
        """The file ends in an event not written whole: what a file still being written
        almost always looks like (the dashboard says so instead of counting a problem)."""
        return self.reason.startswith(PARTIAL_TAIL)

    def __str__(self) -> str:
        where = f" ({self.where})" if self.where else ""
        return f"{os.path.basename(self.file) or self.file}{where}: {self.reason}"

    def to_dict(self) -> dict[str, str]:
        return {"file": self.file, "where": self.where, "reason": self.reason}


@dataclass
class AutotuneSample:
    """One scored autotune sample as the timeline recorded it (rank 0's autotune lane)."""

    ts_us: float  # when it was scored (end of its window)
    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_enabled: bool
    score_bytes_per_s: float
    first_step: int = -1
    last_step: int = -1
    is_best: bool = False
    phase: str = ""
    rank: int = 0
    # What the tuner decided by this sample (recorded since the paired tuner; absent in
    # older traces): the window's role (incumbent, candidate, watch), its configuration's
    # paired ratio to the default, the incumbent after it, the recommendation then
    # ({fusion_threshold_bytes, cycle_time_ms, cache_enabled, ratio_to_default,
    # ratio_lower_bound, kept_default}), the noise of one comparison (log units), and the
    # tuner's verdict once its round ended.
    role: str = ""
    ratio_to_default: float | None = None
    incumbent: dict[str, Any] | None = None
    recommendation: dict[str, Any] | None = None
    comparison_noise: float | None = None
    decision: str | None = None


@dataclass
class ParamsChange:
    """The autotuner applied new parameters at this instant (``AUTOTUNE_PARAMS``)."""

    ts_us: float
    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_enabled: bool
    rank: int = 0


@dataclass
class Notice:
    """An instant the runtime raised because something went wrong on a rank (e.g.
    ``DIVERGENCE``), with its arguments as recorded; the analysis turns it into a verdict."""

    name: str
    ts_us: float
    rank: int
    args: dict[str, Any] = field(default_factory=dict)


#: instants kept as :class:`Notice` (by name)
NOTICE_NAMES = frozenset({act.DIVERGENCE})


@dataclass
class StallRecord:
    """A stall line rank 0 logged (``STALL`` instant): ranks kept the others waiting."""

    ts_us: float  # when it was reported
    line: str
    missing: list[int]
    names: list[str]
    waited_s: float  # how long the oldest name had waited when it was reported
    step: int = -1  # the runtime's step counter then
    #: late rank -> where it was: ``load_batch (train.py:4) <- <module> (train.py:8)``
    where: dict[int, str] = field(default_factory=dict)
    #: late rank -> the op of ours it waited in (``allgather 'x'``), absent when none
    collective: dict[int, str] = field(default_factory=dict)
    shutdown: bool = False
    rank: int = 0


def stall_record(ts_us: float, args: dict[str, Any], rank: int) -> StallRecord:
    """A ``STALL`` instant's args (see ``CycleLoop._stall_args``) as a record."""
    ranks = args.get("ranks") or {}
    where: dict[int, str] = {}
    collective: dict[int, str] = {}
    for key, info in ranks.items():
        where[int(key)] = str(info.get("where", ""))
        coll = info.get("collective")
        if coll:
            collective[int(key)] = f"{str(coll['kind']).lower()} {coll['name']!r}"
    return StallRecord(
        ts_us=ts_us,
        line=str(args.get("line", "")),
        missing=[int(r) for r in args.get("missing", [])],
        names=[str(n) for n in args.get("names", [])],
        waited_s=float(args.get("waited_s", 0.0)),
        step=int(args.get("step", -1)),
        where=where,
        collective=collective,
        shutdown=bool(args.get("shutdown", False)),
        rank=rank,
    )


@dataclass
class TraceSteps:
    """A rank's steps as its own trace marks them (torch.profiler's ``ProfilerStep#N``):
    the step the user counts, rather than one inferred from the collectives.

    Index = step number in the run's numbering (the collectives' ``occurrence``); NaN
    where this rank's trace has no such step."""

    start_us: np.ndarray
    end_us: np.ndarray


@dataclass
class UserRanges:
    """A rank's outermost ``record_function`` ranges on its training thread ("forward",
    "## backward ##", "Optimizer.step#SGD.step"): the phases in the user's own words.

    Outermost only, so they never overlap and a step's ranges add up to at most the step.
    """

    start_us: np.ndarray
    dur_us: np.ndarray
    name: np.ndarray  # index into ``names``
    step: np.ndarray  # step number (run's numbering), -1 outside every step
    names: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Capabilities:
    """What a run's traces can and cannot tell, as its format's reader says (in its
    ``finish_run``): the analyses ask these questions, never which format the run is.

    The typed tables a reader may fill are on the run itself (:attr:`Run.gpu`,
    :attr:`Run.trace_steps`, :attr:`Run.user_ranges`, :attr:`Run.marks`); these flags say
    how to read what is there."""

    #: each rank's readiness comes from its own trace, matched across the ranks' files by
    #: the reader (torch.profiler): the marks are filed under the lowest traced rank's
    #: collectives, and no matched arrival at all means the traces could not be paired,
    #: not that the run recorded none (hvdprof's runtime records readiness itself)
    readiness_matched_across_files: bool = False
    #: the traced ranks can be a part of the job's world (a profiler run on 2 of 128
    #: ranks): ranks not traced are unknown, not idle
    ranks_may_be_a_subset: bool = False
    #: the trace records a few steps by design (a profiler's schedule), so a verdict
    #: cannot wait for the steps a statistical test needs
    steps_sampled: bool = False
    #: the fusion threshold the recording tool uses when its run does not say one (Horovod's
    #: 64 MiB default; None: not known)
    default_fusion_threshold_bytes: int | None = None


@dataclass
class Run:
    """A parsed run: every rank's timeline as columns, with what could not be read.

    Build one with :func:`hvdprof.analysis.load_run`; :meth:`refresh` re-reads only what
    was appended to files still being written.
    """

    path: str
    #: the registered format's name, for people (the report's header, a summary's
    #: provenance): analyses ask :attr:`capabilities`, never this (``tests/test_layering.py``)
    source_format: str
    ranks: list[int] = field(default_factory=list)
    hosts: dict[int, str] = field(default_factory=dict)
    #: each rank's manifest, read and typed (ranks whose manifest is missing or unreadable
    #: left out: the unreadable ones are in :attr:`problems`)
    manifests: dict[int, Manifest] = field(default_factory=dict)
    #: lane (tensor) names; ``slices.tensor`` indexes this
    tensors: list[str] = field(default_factory=list)
    #: slice names as written; ``slices.name`` indexes this
    names: list[str] = field(default_factory=list)
    backends: list[str] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    problems: list[Problem] = field(default_factory=list)
    #: per rank's trace file (Horovod: the one file, rank 0): True when it ended
    #: properly (closing ``]``, nothing left open)
    complete: dict[int, bool] = field(default_factory=dict)
    #: the trace file read for each rank
    files: dict[int, str] = field(default_factory=dict)
    t0_us: float = 0.0
    t1_us: float = 0.0
    size: int = 0  # ranks in the job (manifest, else ranks seen)
    slices: SliceTable = field(default_factory=SliceTable)
    marks: MarkTable = field(default_factory=MarkTable)
    autotune_samples: list[AutotuneSample] = field(default_factory=list)
    params_changes: list[ParamsChange] = field(default_factory=list)
    notices: list[Notice] = field(default_factory=list)
    stalls: list[StallRecord] = field(default_factory=list)
    #: counter tracks: name -> (rank, ts_us, value) arrays
    counters: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)
    events: int = 0  # events read, all files
    #: what a reader wants said about how it read the run (e.g. how clocks were aligned)
    notes: list[str] = field(default_factory=list)
    #: per rank's GPU activity (traces with a GPU): :class:`hvdprof.trace.kineto_format.GpuActivity`
    gpu: dict[int, Any] = field(default_factory=dict)
    #: per rank, the steps its trace marks (Kineto ``ProfilerStep#N``), when it does
    trace_steps: dict[int, TraceSteps] = field(default_factory=dict)
    #: per rank, its outermost ``record_function`` ranges (Kineto), when it has any
    user_ranges: dict[int, UserRanges] = field(default_factory=dict)
    #: what the traces can tell (set by the format's reader); analyses ask this
    capabilities: Capabilities = field(default_factory=Capabilities)
    _loader: Any = field(default=None, repr=False, compare=False)
    #: results derived from the slices that several analyses share (the exclusive
    #: segments of the breakdown and the binned timeline), keyed with the slice table's
    #: identity and length so that a refreshed run recomputes them
    _memo: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def format(self) -> str:
        """The format's name (:attr:`source_format`), as the dashboard's API shows it."""
        return self.source_format

    def memo(self, key: Any, compute: Any) -> Any:
        """``compute()``, once per ``key`` and state of the slice table (a few kept)."""
        full = (key, id(self.slices.start_us), len(self.slices))
        if full not in self._memo:
            if len(self._memo) >= 8:
                self._memo.clear()
            self._memo[full] = compute()
        return self._memo[full]

    @property
    def clean(self) -> bool:
        """Nothing skipped, nothing dropped while recording, every file complete."""
        return not self.problems and not self.dropped_events and all(self.complete.values())

    @property
    def dropped_events(self) -> dict[int, int]:
        """Events each rank's manifest says its timeline dropped while recording (ranks
        with none left out). The files were read whole: the loss happened before them, so
        it is not a reading problem, and the report's first verdicts say it once."""
        return {r: m.events_dropped for r, m in self.manifests.items() if m.events_dropped > 0}

    def refresh(self) -> bool:
        """Read what was appended since the last read; True when anything changed."""
        if self._loader is None:
            return False
        return bool(self._loader.refresh(self))

    def fusion_threshold_bytes(self) -> int | None:
        """The fusion threshold the run started with (manifest), None when unknown."""
        for rank in sorted(self.manifests):
            value = self.manifests[rank].config.fusion_threshold_bytes
            if value is not None:
                return value
        return None

    def summary(self) -> dict[str, Any]:
        """Small JSON-safe description of the run (for reports and the dashboard)."""
        return {
            "path": self.path,
            "format": self.source_format,
            "ranks": list(self.ranks),
            "size": self.size,
            "hosts": {str(k): v for k, v in sorted(self.hosts.items())},
            "events": int(self.events),
            "slices": len(self.slices),
            "tensors": len(self.tensors),
            "t0_us": float(self.t0_us),
            "t1_us": float(self.t1_us),
            "duration_ms": float(self.t1_us - self.t0_us) / 1000.0,
            "complete": {str(k): v for k, v in sorted(self.complete.items())},
            "files": {str(k): v for k, v in sorted(self.files.items())},
            "problems": [p.to_dict() for p in self.problems],
            "events_dropped": {str(k): v for k, v in sorted(self.dropped_events.items())},
            "notes": list(self.notes),
        }
