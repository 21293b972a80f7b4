"""Reader of torch.profiler (Kineto) traces, one file per rank, into the run's columns.

What a Kineto trace holds and how it becomes the columns every other format fills:

- The launch of each collective on the training thread: ``c10d::allreduce_`` (and the
  other ``c10d::`` ops) when present, else NCCL's ``nccl:all_reduce``-style CPU ranges,
  else Gloo's ``gloo:all_reduce`` ranges. Each becomes an ``op`` row (launch to the end
  of its work); the instant it was launched is the rank's *readiness* for that
  collective, which is what the straggler question compares across ranks.
- The work of each collective: Gloo's ``gloo:<op>`` ranges on its worker threads, or
  the ``ncclKernel_*`` / ``ncclDevKernel_*`` GPU kernels. Each becomes a ``collective``
  row (the backend call), matched to its launch by CUDA correlation id where the trace
  has one, else in launch order per op.
- ``ProfilerStep#N`` ranges give steps: the j-th collective of an op in step N is on
  lane ``<OP> #j`` with occurrence N, so the same collective has the same lane and
  occurrence on every rank. Without steps, the k-th collective of an op is occurrence k.
- GPU activity (every event with a ``stream`` argument: kernels, memcpy, memset) is
  kept per rank as intervals classified the way HTA classifies them, for
  :mod:`hvdprof.analysis.device`.

A file is decoded by msgspec into small typed structs (never a dict per event), then
turned into numpy columns; the structs are dropped when the file is done. Ranks come
from ``distributedInfo.rank``; clocks from ``baseTimeNanoseconds`` when every file has
it, else by aligning the ends of matching collectives (and the run says so).
"""

from __future__ import annotations

import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from hvdprof.common import limits
from hvdprof.common.activities import NEGOTIATE_PREFIX
from hvdprof.config import name_of
from hvdprof.trace import byte_order
from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.files import (
    TRACE_SUFFIXES,
    Detection,
    FileRead,
    FoundFile,
    not_a_file,
    whole_bytes,
)
from hvdprof.trace.gpu import (
    GpuActivity,
    gpu_kind,
    kernel_rows,
)
from hvdprof.trace.manifest import RANK_IN_NAME
from hvdprof.trace.model import (
    MARK_COLUMNS,
    OPS,
    PHASE_COLLECTIVE,
    PHASE_NEGOTIATE,
    PHASE_OP,
    SLICE_COLUMNS,
    Capabilities,
    MarkTable,
    Problem,
    Run,
    SliceTable,
    TraceSteps,
    UserRanges,
)

#: file names ``tensorboard_trace_handler`` writes: ``<worker>.<id>.pt.trace.json[.gz]``
KINETO_NAME_RE = re.compile(r"^.+\.pt\.trace\.json(\.gz)?$")
#: (at most 18 digits: a longer number is no rank, and int() of thousands of digits raises)
_RANK_RE = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(-?\d{1,18})(?![\d.eE])')
_WORLD_RE = re.compile(
    rb'"distributedInfo"\s*:\s*\{[^{}]*?"world_size"\s*:\s*(-?\d{1,18})(?![\d.eE])'
)
#: ``ProfilerStep#N``: a step number is a plain non-negative integer of at most 9 digits
_STEP_NUMBER = re.compile(r"\d{1,9}")
#: a timestamp or duration beyond this many microseconds (3,000 years) is not one
MAX_TIME_US = 1e17
#: ``baseTimeNanoseconds`` past this (the year 2116) is not a clock
MAX_BASE_NS = 1 << 62
#: a message of more elements than this is not a message size
MAX_ELEMENTS = 1 << 48
#: step numbers spread wider than this are renumbered 0, 1, 2 ... (never an array that wide)
MAX_STEP_SPAN = 100_000
#: bytes of a file's start searched for the Kineto keys (and the rank)
SNIFF_BYTES = 1 << 16

#: bytes per element of the type names Kineto and ``record_param_comms`` write
ITEMSIZE = {
    "float": 4,
    "Float": 4,
    "float32": 4,
    "double": 8,
    "Double": 8,
    "float64": 8,
    "c10::Half": 2,
    "Half": 2,
    "float16": 2,
    "c10::BFloat16": 2,
    "BFloat16": 2,
    "bfloat16": 2,
    "int": 4,
    "Int": 4,
    "int32": 4,
    "long int": 8,
    "long": 8,
    "Long": 8,
    "int64": 8,
    "short int": 2,
    "short": 2,
    "Short": 2,
    "unsigned char": 1,
    "Byte": 1,
    "uint8": 1,
    "signed char": 1,
    "Char": 1,
    "int8": 1,
    "bool": 1,
    "Bool": 1,
}


class _Args(msgspec.Struct):
    stream: int | None = None
    correlation: int | None = None
    nbytes: int | None = msgspec.field(default=None, name="bytes")  # a memcpy's size
    nelems: int | None = msgspec.field(default=None, name="In msg nelems")
    dtype: str | None = None
    group_size: int | None = msgspec.field(default=None, name="Group size")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input Dims")
    input_type: msgspec.Raw = msgspec.field(default=msgspec.Raw(b""), name="Input type")


class _Event(msgspec.Struct):
    ph: str = ""
    name: str = ""
    cat: str = ""
    pid: int | str = 0
    tid: int | str = 0
    ts: float = float("nan")  # missing: NaN (it turns HTA's ts column to floats)
    dur: float = 0.0
    args: _Args | None = None


class _Trace(msgspec.Struct):
    traceEvents: list[_Event] = []
    distributedInfo: dict[str, Any] | None = None
    baseTimeNanoseconds: int | None = None
    deviceProperties: list[Any] | None = None
    host_name: str | None = None


_DECODER = msgspec.json.Decoder(_Trace)


class _LenientEvent(msgspec.Struct):
    """Any JSON values: the fallback when a trace's types differ from Kineto's usual."""

    ph: Any = ""
    name: Any = ""
    cat: Any = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = 0.0
    dur: Any = 0.0
    args: Any = None


class _LenientTrace(msgspec.Struct):
    traceEvents: list[_LenientEvent] = []
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    deviceProperties: Any = None
    host_name: Any = None


_LENIENT = msgspec.json.Decoder(_LenientTrace)


def looks_like_kineto(head: bytes) -> bool:
    """True when the start of a (decompressed) file looks like a Kineto trace."""
    return b'"traceEvents"' in head or (
        head.lstrip().startswith(b"{")
        and any(
            k in head for k in (b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')
        )
    )


def read_head(path: str, size: int = SNIFF_BYTES) -> bytes:
    """The first ``size`` bytes of a file, decompressed when it is gzip; b"" on failure."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open
            return b""
        with open(path, "rb") as f:
            raw = f.read(size)
        if raw[:2] == b"\x1f\x8b":
            raw = zlib.decompressobj(31).decompress(raw, size)
        return byte_order.head_as_utf8(raw)
    except (OSError, zlib.error):
        return b""


def is_kineto_file(path: str) -> bool:
    """A Kineto trace, by its name (``*.pt.trace.json[.gz]``) or its keys."""
    name = os.path.basename(path)
    if KINETO_NAME_RE.match(name):
        return True
    if not (name.endswith(".json") or name.endswith(".json.gz")):
        return False
    head = read_head(path)
    return b'"traceEvents"' in head and any(
        k in head for k in (b'"schemaVersion"', b'"distributedInfo"', b'"deviceProperties"')
    )


def sniff_rank(path: str, bound: int | None = None) -> int | None:
    """The rank from ``distributedInfo`` near the file's start, else from its name; None
    when neither gives one below the bound (:func:`rank_bound`)."""
    head = read_head(path)
    m = _RANK_RE.search(head)
    w = _WORLD_RE.search(head)
    limit = rank_bound(int(w.group(1)) if w else None, bound)
    if m:
        rank = int(m.group(1))
        return rank if 0 <= rank < limit else None
    n = RANK_IN_NAME.search(os.path.basename(path))
    if n and len(n.group(1)) < 10 and int(n.group(1)) < limit:
        return int(n.group(1))
    return None


def rank_bound(world_size: Any, files: int | None = None) -> int:
    """Ranks of a Kineto run are ``0 .. bound - 1``: its declared world size when that is
    sane (at most ``Config.read_max_ranks``), else the number of trace files read (each
    is one rank), else that bound. So a rank of 2000000000 in one of two
    files is refused, never an array of that many entries."""
    most = limits.max_ranks()
    if isinstance(world_size, int) and not isinstance(world_size, bool) and 0 < world_size <= most:
        return world_size
    return min(files, most) if files else most


def op_code_of(name: str) -> int:
    """OPS code of a collective's name (``c10d::allreduce_``, ``nccl:all_reduce``,
    ``gloo:all_reduce``, ``ncclKernel_AllReduce_RING_LL_Sum_float``), -1 for none."""
    word = name
    for prefix in ("c10d::", "nccl:", "gloo:", "ncclDevKernel_", "ncclKernel_"):
        if name.startswith(prefix):
            word = name[len(prefix) :]
            break
    else:
        return -1
    w = word.split("(")[0].lower().replace("_", "")
    for key, op in (
        ("allreduce", "ALLREDUCE"),
        ("allgather", "ALLGATHER"),
        ("broadcast", "BROADCAST"),
        ("alltoall", "ALLTOALL"),
        ("reducescatter", "REDUCESCATTER"),
        ("barrier", "BARRIER"),
    ):
        if w.startswith(key):
            return OPS.index(op)
    return -1


@dataclass
class KinetoFile:
    """What one file gave: rows in the run's columns plus what the run-level pass needs."""

    path: str
    rank: int
    slices: dict[str, np.ndarray]
    problems: list[Problem] = field(default_factory=list)
    complete: bool = True
    events: int = 0
    base_ns: int | None = None
    backend: str | None = None
    world_size: int | None = None
    host: str | None = None
    rank_from: str = "distributedInfo"
    gpu: GpuActivity | None = None
    #: HTA would round this file's times to whole microseconds (see ``_build``)
    ns_rounding: bool = False
    #: ProfilerStep number -> its start (file's clock)
    step_starts: dict[int, float] = field(default_factory=dict)
    #: ProfilerStep start -> its end (file's clock; keyed by start, which survives the
    #: run's renumbering of the steps)
    step_end_of_start: dict[float, float] = field(default_factory=dict)
    #: outermost user ranges on the training thread: start, dur (file's clock), index
    #: into the names, names
    ranges: tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None = None


def _empty_slices() -> dict[str, np.ndarray]:
    return {k: np.zeros(0, dt) for k, dt in SLICE_COLUMNS.items()}


def _decompress(path: str, raw: bytes, problems: list[Problem]) -> tuple[bytes, bool]:
    """The JSON text of a ``.gz`` file, inflated within the bounds of
    :mod:`hvdprof.common.limits` (past them: nothing, and a problem); a cut or corrupt
    stream gives what came before."""
    try:
        out, trouble = limits.inflate(raw)
    except limits.InflateLimitError as exc:
        problems.append(Problem(path, "gzip", f"not read: it {exc}"))
        return b"", False
    if trouble is not None:
        where = f"byte {len(raw)}" if "cut" in trouble else ""
        problems.append(Problem(path, where, trouble))
        return out, False
    return out, True


def _salvage(path: str, text: bytes, problems: list[Problem]) -> Any:
    """The events before the cut of a truncated trace (up to its last whole event)."""
    start = text.find(b'"traceEvents"')
    if start < 0:
        return None
    end = len(text)
    for _ in range(64):
        cut = text.rfind(b"}", start, end)
        if cut < 0:
            return None
        try:
            trace = _LENIENT.decode(text[: cut + 1] + b"]}")
        except msgspec.DecodeError:
            end = cut
            continue
        except (RecursionError, UnicodeDecodeError):
            return None
        problems.append(
            Problem(
                path,
                f"byte {cut + 1}",
                f"the trace is cut ({len(text) - cut - 1} bytes after its last whole event): "
                f"read {len(trace.traceEvents)} events before it",
            )
        )
        return trace
    return None


def _decode_any(data: bytes) -> Any:
    """The trace with Kineto's usual types, else with any JSON values (lenient)."""
    try:
        return _DECODER.decode(data)
    except msgspec.ValidationError:
        return _LENIENT.decode(data)
    except msgspec.DecodeError:
        return _LENIENT.decode(data)


def decode_trace(path: str, data: bytes, problems: list[Problem]) -> tuple[Any, bool]:
    """``(trace, complete)``: the decoded file, or None when nothing could be read."""
    complete = True
    if data[:2] == b"\x1f\x8b":
        data, complete = _decompress(path, data, problems)
        if not data and problems:
            return None, False
    data = byte_order.as_utf8(data)  # a byte-order mark (an editor's UTF-8 or UTF-16)
    if not data.strip():
        problems.append(Problem(path, "", "empty file: no events"))
        return None, False
    reason = ""
    for attempt in range(2):
        try:
            return _decode_any(data), complete
        except UnicodeDecodeError as exc:
            if attempt:
                raise
            problems.append(
                Problem(path, f"byte {exc.start}", "invalid UTF-8: such bytes were read as U+FFFD")
            )
            data = data.decode("utf-8", errors="replace").encode()
        except RecursionError:
            problems.append(
                Problem(path, "", "JSON nested deeper than any trace (a thousand levels): not read")
            )
            return None, False
        except msgspec.DecodeError as exc:  # cut: salvage what is whole
            reason = str(exc)
            break
    trace = _salvage(path, data, problems)
    if trace is None:
        problems.append(Problem(path, "", f"not a readable Kineto trace ({reason})"))
        return None, False
    return trace, False


@dataclass
class BackwardCompute:
    """A torch.profiler trace's backward compute (``...Backward...`` ranges and GPU
    kernels), on the file's own clock: what the overlap question compares with the
    collectives of an hvdprof run."""

    start_us: np.ndarray
    end_us: np.ndarray
    #: ``distributedInfo.rank``, None when the trace does not say
    rank: int | None
    #: ``baseTimeNanoseconds`` (0: absent, ``ts`` is then Unix microseconds)
    base_ns: int


def backward_compute(path: str, problems: list[Problem]) -> BackwardCompute | None:
    """The backward compute of the trace at ``path`` (None, with why in ``problems``,
    when it cannot be read), read as :func:`parse_kineto` reads a run's traces."""
    why = not_a_file(path)  # (a FIFO is never opened: it would block)
    if why is not None:
        problems.append(Problem(path, "", f"cannot read ({why})"))
        return None
    try:
        data = whole_bytes(path)
    except OSError as exc:
        problems.append(Problem(path, "", f"cannot read ({exc.strerror or exc})"))
        return None
    trace, _ = decode_trace(path, data, problems)
    if trace is None:
        return None
    starts, ends = [], []
    for e in trace.traceEvents:
        if e.ph != "X" or ("backward" not in str(e.name).lower() and e.cat != "kernel"):
            continue
        ts, dur = e.ts, e.dur
        if isinstance(ts, (int, float)) and isinstance(dur, (int, float)) and ts == ts:
            starts.append(float(ts))
            ends.append(float(ts) + float(dur))
    info = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    rank = info.get("rank")
    base = trace.baseTimeNanoseconds
    return BackwardCompute(
        np.array(starts, dtype=np.float64),
        np.array(ends, dtype=np.float64),
        int(rank) if isinstance(rank, int) else None,
        int(base) if isinstance(base, (int, float)) and base == base and base else 0,
    )


def _num(x: Any, default: float = 0.0) -> float:
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        return default


def _key(x: Any) -> int | str | tuple[str]:
    """A thread's pid or tid as a key: Kineto writes ints and strings; anything else
    (an object, a list) is one key per kind of value, never hashed or printed whole."""
    if isinstance(x, int | str):
        return x
    return (type(x).__name__,)


def _elements(raw: msgspec.Raw | None) -> int | None:
    """Elements of the first input of ``Input Dims`` (``[[n, m], ...]``)."""
    if not raw:
        return None
    try:
        dims = msgspec.json.decode(raw)
        first = dims[0]
        while isinstance(first, list) and first and isinstance(first[0], list):
            first = first[0]
        if not isinstance(first, list) or not first:
            return None
        n = 1
        for d in first:
            n *= int(d)
            if not 0 <= n <= MAX_ELEMENTS:
                return None
        return n
    except (msgspec.DecodeError, IndexError, TypeError, ValueError, OverflowError):
        return None


def _first_type(raw: msgspec.Raw | None) -> str | None:
    if not raw:
        return None
    try:
        types = msgspec.json.decode(raw)
        return types[0] if types and isinstance(types[0], str) else None
    except (msgspec.DecodeError, IndexError, TypeError):
        return None


class _Strings:
    def __init__(self) -> None:
        self.index: dict[Any, int] = {}

    def code(self, key: Any) -> int:
        found = self.index.get(key)
        if found is None:
            found = self.index[key] = len(self.index)
        return found


def _short(value: Any) -> str:
    """A value from a file, for a message: at most 40 characters, never walked deeply."""
    text = (
        repr(value)
        if isinstance(value, int | float | str | bool) or value is None
        else (f"a {type(value).__name__}")
    )
    return text if len(text) <= 40 else text[:37] + "..."


def parse_kineto(
    path: str, data: bytes, rank: int, tables: Any, files: int | None = None
) -> KinetoFile:
    """One Kineto file into columns (rank: the one found at discovery, replaced by
    ``distributedInfo.rank`` when the file has it and it is below :func:`rank_bound`;
    ``files``: how many trace files the run has)."""
    problems: list[Problem] = []
    trace, complete = decode_trace(path, data, problems)
    out = KinetoFile(path, rank, _empty_slices(), problems, complete)
    if trace is None:
        return out
    info = trace.distributedInfo if isinstance(trace.distributedInfo, dict) else {}
    bound = rank_bound(info.get("world_size"), files)
    given = info.get("rank")
    if isinstance(given, int) and not isinstance(given, bool) and 0 <= given < bound:
        out.rank = int(given)
    else:
        if "rank" in info:
            problems.append(
                Problem(
                    path,
                    "distributedInfo.rank",
                    f"{_short(given)} is not a rank of this run (0 to {bound - 1}): "
                    f"read as rank {rank}",
                )
            )
        out.rank_from = "file name" if RANK_IN_NAME.search(path) else "file order"
    ws = info.get("world_size")
    if isinstance(ws, int) and not isinstance(ws, bool):
        if 0 < ws <= limits.max_ranks():
            out.world_size = int(ws)
        else:
            problems.append(
                Problem(
                    path,
                    "distributedInfo.world_size",
                    f"{_short(ws)} is not a world size (1 to {limits.max_ranks()}, "
                    f"{name_of('read_max_ranks')}): ignored",
                )
            )
    if isinstance(info.get("backend"), str):
        out.backend = info["backend"].upper()
    base = trace.baseTimeNanoseconds
    if isinstance(base, int) and not isinstance(base, bool):
        if 0 <= base < MAX_BASE_NS:
            out.base_ns = int(base)
        else:
            problems.append(
                Problem(
                    path,
                    "baseTimeNanoseconds",
                    f"{_short(base)} is not a clock (0 to 2**62 ns): ignored",
                )
            )
    if isinstance(trace.host_name, str):
        out.host = trace.host_name
    events = trace.traceEvents
    out.events = len(events)
    del trace
    _build(out, events, tables)
    return out


def _build(out: KinetoFile, events: list[Any], tables: Any) -> None:
    """Columns of one file's events (typed or lenient structs). The stages: the usable
    complete events as columns (:func:`_event_columns`), what each name is
    (:func:`_classify_names`), the GPU activity (:func:`_gpu_activity`), each collective
    launch and the work it started (:func:`_match_launches`), its step and lane
    (:func:`_launch_lanes`) and size (:func:`_launch_sizes`), then the rows."""
    c = _event_columns(out, events)
    if c is None:
        return
    step_of_name, op_of_name, role_of_name, kind_of_name = _classify_names(out, c.name_list)
    c.step_of_name, c.op_of_name = step_of_name, op_of_name
    role = role_of_name[c.name_code]
    is_gpu = c.stream >= 0
    role = np.where((role == 2) & is_gpu, 0, role)  # a "nccl:" name on a stream is GPU work
    c.role = np.where((role == 4) & ~is_gpu, 0, role)
    c.is_gpu = is_gpu
    # CPU side of each correlation id: (thread, ts) of the runtime call that launched it
    c.gpu_rows = np.flatnonzero(is_gpu)
    if len(c.gpu_rows):
        for i in np.flatnonzero(~is_gpu).tolist():
            corr = c.arg(c.xs[i], "correlation")
            if isinstance(corr, int):
                c.corr_ts[corr] = (int(c.tid[i]), float(c.ts[i]), i)
        out.gpu = _gpu_activity(out, c, kind_of_name)
    # launches: c10d ops if any, else nccl CPU ranges, else gloo ranges
    present = {int(r) for r in np.unique(c.role)}
    launch_role = 1 if 1 in present else 2 if 2 in present else 3 if 3 in present else 0
    if not launch_role:
        return
    m = _match_launches(c, launch_role, present)
    occurrence, lane = _launch_lanes(out, c, m, tables)
    nbytes, dtype = _launch_sizes(c, m.launches, tables)
    backend = tables.backends.code(out.backend or ("NCCL" if launch_role == 2 else "GLOO"))
    out.slices = _launch_slices(out.rank, c, m, tables, backend, (occurrence, lane, nbytes, dtype))


@dataclass
class _EventColumns:
    """One file's usable complete (``X``) events as columns, and what the stages of
    :func:`_build` learn of them."""

    xs: list[Any]
    lenient: bool  # lenient structs (args a dict) rather than typed ones
    name_code: np.ndarray
    name_list: list[str]
    ts: np.ndarray
    dur: np.ndarray
    tid: np.ndarray  # a code per (pid, tid)
    stream: np.ndarray  # -1: not on a GPU stream
    step_of_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    op_of_name: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    role: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))
    is_gpu: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))
    gpu_rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    #: correlation id -> (thread, ts, row) of the CPU runtime call that launched it
    corr_ts: dict[int, tuple[int, float, int]] = field(default_factory=dict)

    def arg(self, e: Any, key: str) -> Any:
        a = e.args
        if a is None:
            return None
        return a.get(key) if self.lenient and isinstance(a, dict) else getattr(a, key, None)


def _event_columns(out: KinetoFile, events: list[Any]) -> _EventColumns | None:
    """The complete events with a usable ts and dur as columns (None: none); the others
    counted in one problem."""
    if events and type(events[0]) is _LenientEvent:
        all_ts = np.fromiter((_num(e.ts, np.nan) for e in events), np.float64, len(events))
    else:
        all_ts = np.fromiter((e.ts for e in events), np.float64, len(events))
    out.ns_rounding = bool(np.isnan(all_ts).any() or (all_ts != np.floor(all_ts)).any())
    del all_ts
    xs = [e for e in events if e.ph == "X" and e.ts == e.ts]  # (NaN: no ts)
    bad = 0
    if xs and type(xs[0]) is _LenientEvent:
        good = []
        for e in xs:
            try:
                e.ts, e.dur = float(e.ts), float(e.dur or 0.0)
                if not isinstance(e.name, str):
                    raise TypeError("name")
                e.cat = e.cat if isinstance(e.cat, str) else ""
                good.append(e)
            except (TypeError, ValueError, OverflowError):
                bad += 1
        xs = good
    n_all = len(xs)
    xs = [e for e in xs if -MAX_TIME_US < e.ts < MAX_TIME_US and 0 <= e.dur < MAX_TIME_US]
    bad += n_all - len(xs)
    if bad:
        out.problems.append(Problem(out.path, "", f"{bad} events without a usable ts/dur skipped"))
    n = len(xs)
    if not n:
        return None
    names = _Strings()
    name_code = np.fromiter((names.code(e.name) for e in xs), np.int32, n)
    name_list = list(names.index)
    ts = np.fromiter((e.ts for e in xs), np.float64, n)
    dur = np.fromiter((e.dur for e in xs), np.float64, n)
    threads = _Strings()
    tid = np.fromiter((threads.code((_key(e.pid), _key(e.tid))) for e in xs), np.int32, n)
    odd_threads = sum(1 for key in threads.index for part in key if isinstance(part, tuple))
    if odd_threads:
        out.problems.append(
            Problem(
                out.path,
                "pid/tid",
                "events whose pid or tid is neither a number nor a string: read as one "
                "thread per kind of value",
            )
        )
    lenient = type(xs[0]) is _LenientEvent
    c = _EventColumns(xs, lenient, name_code, name_list, ts, dur, tid, np.zeros(0, np.int64))
    if lenient:
        c.stream = np.array(
            [s if isinstance(s := c.arg(e, "stream"), int) else -1 for e in xs], np.int64
        )
    else:
        c.stream = np.fromiter(
            (-1 if e.args is None or e.args.stream is None else e.args.stream for e in xs),
            np.int64,
            n,
        )
    return c


def _classify_names(
    out: KinetoFile, name_list: list[str]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per unique name, what it is: ``(step number, op code, role, GPU kind)``, -1/0 where
    none. Roles: 1 c10d launch, 2 nccl CPU range, 3 gloo range, 4 nccl GPU kernel, 5
    ``record_param_comms`` (carries the message size; not a collective itself)."""
    n_names = len(name_list)
    step_of_name = np.full(n_names, -1, np.int64)
    op_of_name = np.full(n_names, -1, np.int64)
    role_of_name = np.zeros(n_names, np.int8)
    kind_of_name = np.zeros(n_names, np.int8)
    for code, name in enumerate(name_list):
        kind_of_name[code] = gpu_kind(name)
        if name.startswith("ProfilerStep#"):
            number = name[len("ProfilerStep#") :]
            if _STEP_NUMBER.fullmatch(number):
                step_of_name[code] = int(number)
            else:
                out.problems.append(
                    Problem(out.path, _short(name), "not a step number: not taken as a step")
                )
            continue
        op = op_code_of(name)
        if name.startswith(("ncclKernel_", "ncclDevKernel_")):
            role_of_name[code] = 4  # its op may be unknown (SendRecv): the launch tells
            op_of_name[code] = op
            continue
        if name == "record_param_comms":
            role_of_name[code] = 5
            continue
        if op < 0:
            continue
        op_of_name[code] = op
        if name.startswith("c10d::"):
            role_of_name[code] = 1
        elif name.startswith("gloo:"):
            role_of_name[code] = 3
        elif name.startswith("nccl:"):
            role_of_name[code] = 2
        else:
            role_of_name[code] = 4
    return step_of_name, op_of_name, role_of_name, kind_of_name


def _gpu_activity(out: KinetoFile, c: _EventColumns, kind_of_name: np.ndarray) -> GpuActivity:
    """GPU activity, HTA's way. HTA rounds a file's times to whole microseconds (start
    up, end down) when its ts column is not all integers (fractional or missing ts);
    and, when there are two or more ProfilerSteps, it leaves out the GPU events
    launched (by correlation) in the last one, and those without a launch after it."""
    ts, dur, name_code, gpu_rows, corr_ts = c.ts, c.dur, c.name_code, c.gpu_rows, c.corr_ts
    if out.ns_rounding:
        h_start, h_end = np.ceil(ts), np.floor(ts + dur)
    else:
        h_start, h_end = ts, ts + dur
    step_rows = np.flatnonzero((c.step_of_name[name_code] >= 0) & ~c.is_gpu)
    if len(np.unique(name_code[step_rows])) >= 2:
        last_start = float(h_start[step_rows].max())
        cpu_start = {corr: float(h_start[i]) for corr, (_, _, i) in corr_ts.items()}
        kept = []
        for i in gpu_rows.tolist():
            corr = c.arg(c.xs[i], "correlation")
            if isinstance(corr, int) and corr != -1:
                kept.append(cpu_start.get(corr, np.inf) < last_start)
            else:  # HTA takes it for a CPU event: kept when it began before
                kept.append(h_start[i] < last_start)
        launched = np.array(kept, bool)
    else:
        launched = np.ones(len(gpu_rows), bool)
    used, g_name = np.unique(name_code[gpu_rows], return_inverse=True)
    g_corr = np.full(len(gpu_rows), -1, np.int64)
    g_launch = np.full(len(gpu_rows), np.nan)
    g_bytes = np.full(len(gpu_rows), -1, np.int64)
    for j, i in enumerate(gpu_rows.tolist()):
        corr = c.arg(c.xs[i], "correlation")
        if isinstance(corr, int) and not isinstance(corr, bool):
            g_corr[j] = corr
            hit = corr_ts.get(corr)
            if hit is not None:
                g_launch[j] = hit[1]
        b = c.arg(c.xs[i], "bytes" if c.lenient else "nbytes")
        if isinstance(b, int) and not isinstance(b, bool) and 0 <= b <= MAX_ELEMENTS:
            g_bytes[j] = b
    return GpuActivity(
        ts[gpu_rows].copy(),
        dur[gpu_rows].copy(),
        kind_of_name[name_code[gpu_rows]].astype(np.int8),
        c.stream[gpu_rows].copy(),
        launched,
        h_start[gpu_rows].copy(),
        h_end[gpu_rows].copy(),
        g_name.reshape(-1).astype(np.int32),
        [c.name_list[code] for code in used.tolist()],
        g_corr,
        g_launch,
        g_bytes,
    )


@dataclass
class _Launches:
    """The collective launches (rows, by start) and the work each started."""

    launches: np.ndarray  # rows of the launches
    works: np.ndarray  # rows of gloo ranges or nccl kernels
    l_op: np.ndarray  # per launch: its op code
    work_of: np.ndarray  # per launch: its first work row (-1: none)
    work_start: np.ndarray
    work_end: np.ndarray


def _match_launches(c: _EventColumns, launch_role: int, present: set[int]) -> _Launches:
    """Each launch's work: NCCL kernels by correlation (kernel -> runtime call -> the
    launch range on its thread), the rest in order, per op."""
    ts, dur, tid, name_code = c.ts, c.dur, c.tid, c.name_code
    launches = np.flatnonzero(c.role == launch_role)
    launches = launches[np.argsort(ts[launches], kind="stable")]
    work_role = 3 if 3 in present and launch_role != 3 else 4 if 4 in present else 0
    works = (
        np.flatnonzero(c.role == work_role) if work_role else np.zeros(0, np.int64)
    )  # gloo ranges or nccl kernels
    works = works[np.argsort(ts[works], kind="stable")]
    l_op = c.op_of_name[name_code[launches]]
    w_op = c.op_of_name[name_code[works]]
    work_of = np.full(len(launches), -1, np.int64)  # first work row per launch
    work_end = np.full(len(launches), -np.inf)
    work_start = np.full(len(launches), np.inf)
    matched = np.zeros(len(works), bool)
    if work_role == 4:  # by correlation: kernel -> runtime call -> launch range on its thread
        by_tid: dict[int, np.ndarray] = {}
        for t in np.unique(tid[launches]).tolist():
            by_tid[t] = np.flatnonzero(tid[launches] == t)
        for k, w in enumerate(works.tolist()):
            corr = c.arg(c.xs[w], "correlation")
            hit = c.corr_ts.get(corr) if isinstance(corr, int) else None
            if hit is None or hit[0] not in by_tid:
                continue
            cand = by_tid[hit[0]]
            j = int(np.searchsorted(ts[launches[cand]], hit[1], side="right")) - 1
            if j < 0:
                continue
            li = int(cand[j])
            if ts[launches[li]] + dur[launches[li]] < hit[1]:
                continue
            matched[k] = True
            if work_of[li] < 0:
                work_of[li] = w
            work_start[li] = min(work_start[li], ts[w])
            work_end[li] = max(work_end[li], ts[w] + dur[w])
    # the rest in order, per op
    for op in np.unique(l_op).tolist():
        li = np.flatnonzero((l_op == op) & (work_of < 0))
        wi = np.flatnonzero((w_op == op) & ~matched)
        m = min(len(li), len(wi))
        for a, b in zip(li[:m].tolist(), wi[:m].tolist(), strict=True):
            w = int(works[b])
            work_of[a] = w
            work_start[a] = ts[w]
            work_end[a] = ts[w] + dur[w]
    return _Launches(launches, works, l_op, work_of, work_start, work_end)


def _launch_lanes(
    out: KinetoFile, c: _EventColumns, m: _Launches, tables: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``(occurrence, lane)`` per launch: its ProfilerStep (the n-th ``<op>`` of a step
    is lane ``<op> #n``), or its count among the launches outside any step. Also the
    file's steps and user ranges, on ``out``."""
    ts, dur, name_code, step_of_name = c.ts, c.dur, c.name_code, c.step_of_name
    steps = np.flatnonzero(step_of_name[name_code] >= 0)
    steps = steps[np.argsort(ts[steps], kind="stable")]
    s_start, s_end = ts[steps], ts[steps] + dur[steps]
    s_num = step_of_name[name_code[steps]]
    out.step_starts = {
        int(n): float(x) for n, x in zip(s_num.tolist(), s_start.tolist(), strict=True)
    }
    out.step_end_of_start = dict(zip(s_start.tolist(), s_end.tolist(), strict=True))
    out.ranges = _user_ranges(c.xs, c.name_list, name_code, c.role, c.is_gpu, c.tid, ts, dur, steps)
    l_ts = ts[m.launches]
    k = np.searchsorted(s_start, l_ts, side="right") - 1
    in_step = (
        (k >= 0) & (l_ts <= s_end[np.maximum(k, 0)]) if len(steps) else np.zeros(len(l_ts), bool)
    )
    step = np.where(in_step, s_num[np.maximum(k, 0)] if len(steps) else -1, -1)
    occurrence = np.zeros(len(m.launches), np.int64)
    counts: dict[tuple[int, int], int] = {}
    loose: dict[int, int] = {}
    lane_names: list[str] = []
    for i, (op, st) in enumerate(zip(m.l_op.tolist(), step.tolist(), strict=True)):
        if st >= 0:
            j = counts.get((op, st), 0)
            counts[(op, st)] = j + 1
            lane_names.append(f"{OPS[op]} #{j}")
            occurrence[i] = st
        else:
            j = loose.get(op, 0)
            loose[op] = j + 1
            lane_names.append(OPS[op])
            occurrence[i] = j
    lane = np.array([tables.tensors.code(x) for x in lane_names], np.int32)
    return occurrence, lane


def _size_of(c: _EventColumns, e: Any) -> tuple[int, str | None]:
    """``(bytes, dtype)`` an event's args give (-1, None: not given)."""
    if e.args is None:
        return -1, None
    if c.lenient:
        elems, tname = c.arg(e, "In msg nelems"), c.arg(e, "dtype")
    else:
        elems, tname = c.arg(e, "nelems"), c.arg(e, "dtype")
        if not isinstance(elems, int) or not isinstance(tname, str):
            elems = _elements(c.arg(e, "input_dims"))
            tname = _first_type(c.arg(e, "input_type"))
    if (
        isinstance(elems, int)
        and 0 <= elems <= MAX_ELEMENTS
        and isinstance(tname, str)
        and tname in ITEMSIZE
    ):
        return elems * ITEMSIZE[tname], tname
    return -1, tname if isinstance(tname, str) and tname in ITEMSIZE else None


def _launch_sizes(
    c: _EventColumns, launches: np.ndarray, tables: Any
) -> tuple[np.ndarray, np.ndarray]:
    """``(bytes, dtype code)`` per launch: from the launch, else from a range inside it
    that has them (record_param_comms, nccl:<op>), on the same thread."""
    ts, dur, tid, role = c.ts, c.dur, c.tid, c.role
    carriers = np.flatnonzero(((role == 5) | (role == 2) | (role == 1)) & ~c.is_gpu)
    carriers = carriers[np.lexsort((ts[carriers], tid[carriers]))]
    c_key = ts[carriers]
    c_tid = tid[carriers]
    nbytes = np.full(len(launches), -1, np.int64)
    dtype = np.full(len(launches), -1, np.int16)
    for i, row in enumerate(launches.tolist()):
        size, tname = _size_of(c, c.xs[row])
        if size < 0 and len(carriers):
            lo = int(np.searchsorted(c_tid, tid[row], side="left"))
            hi = int(np.searchsorted(c_tid, tid[row], side="right"))
            k = lo + int(np.searchsorted(c_key[lo:hi], ts[row], side="left"))
            end = ts[row] + dur[row]
            while k < hi and c_key[k] <= end and size < 0:
                if carriers[k] != row:
                    size, tname = _size_of(c, c.xs[int(carriers[k])])
                k += 1
        nbytes[i] = size
        if tname is not None:
            dtype[i] = tables.dtypes.code(tname)
    return nbytes, dtype


def _launch_slices(
    rank: int,
    c: _EventColumns,
    m: _Launches,
    tables: Any,
    backend: int,
    per_launch: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
) -> dict[str, np.ndarray]:
    """The rows: one op row per launch, one collective row per launch with work.
    ``per_launch``: ``(occurrence, lane, bytes, dtype)``."""
    occurrence, lane, nbytes, dtype = per_launch
    launches, name_code, l_op = m.launches, c.name_code, m.l_op
    l_ts = c.ts[launches]
    l_end = np.maximum(
        l_ts + c.dur[launches], np.where(np.isfinite(m.work_end), m.work_end, -np.inf)
    )
    has_work = m.work_of >= 0
    n_op, n_coll = len(launches), int(has_work.sum())
    cols = {k: np.empty(n_op + n_coll, dt) for k, dt in SLICE_COLUMNS.items()}
    glob_name = np.full(len(c.name_list), -1, np.int32)
    for code in np.unique(np.concatenate([name_code[launches], name_code[m.works]])).tolist():
        glob_name[code] = tables.names.code(c.name_list[code])
    cols["rank"][:] = rank
    cols["tensor"][:n_op] = lane
    cols["tensor"][n_op:] = lane[has_work]
    cols["name"][:n_op] = glob_name[name_code[launches]]
    cols["name"][n_op:] = glob_name[name_code[m.work_of[has_work]]]
    cols["phase"][:n_op] = PHASE_OP
    cols["phase"][n_op:] = PHASE_COLLECTIVE
    cols["op"][:n_op] = l_op
    cols["op"][n_op:] = l_op[has_work]
    cols["start_us"][:n_op] = l_ts
    cols["dur_us"][:n_op] = l_end - l_ts
    cols["start_us"][n_op:] = m.work_start[has_work]
    cols["dur_us"][n_op:] = (m.work_end - m.work_start)[has_work]
    cols["bytes"][:n_op] = nbytes
    cols["bytes"][n_op:] = nbytes[has_work]
    for name in ("group", "group_bytes", "buffer_bytes"):
        cols[name][:] = -1
    cols["group_tensors"][:] = 0
    cols["backend"][:] = backend
    cols["dtype"][:n_op] = dtype
    cols["dtype"][n_op:] = dtype[has_work]
    cols["cached"][:] = -1
    cols["occurrence"][:n_op] = occurrence
    cols["occurrence"][n_op:] = occurrence[has_work]
    return cols


#: ``record_function`` names that are not the user's phases: the profiler's own step,
#: and the collectives' ranges (read as ops above)
_NOT_A_PHASE = ("ProfilerStep#", "nccl:", "gloo:", "c10d::", "record_param_comms")


def _user_ranges(
    xs: list[Any], name_list: list[str], name_code: np.ndarray, role: np.ndarray,
    is_gpu: np.ndarray, tid: np.ndarray, ts: np.ndarray, dur: np.ndarray, steps: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]] | None:  # fmt: skip
    """The outermost ``user_annotation`` ranges of the training thread (the thread of the
    ``ProfilerStep`` ranges; without steps, the thread with most such ranges).

    Outermost only: "## forward ##" holds "## encoder ##", and counting both would count
    the time twice. A range that starts inside an earlier one is inside it, whatever its
    end says (a range cut by the end of the trace)."""
    keep_name = np.array([not n.startswith(_NOT_A_PHASE) for n in name_list] or [False], bool)[
        name_code
    ]
    cats = np.fromiter((e.cat == "user_annotation" for e in xs), bool, len(xs))
    rows = np.flatnonzero(cats & keep_name & (role == 0) & ~is_gpu)
    if not len(rows):
        return None
    if len(steps):
        thread = int(np.bincount(tid[steps]).argmax())
    else:
        thread = int(np.bincount(tid[rows]).argmax())
    rows = rows[tid[rows] == thread]
    if len(steps):  # inside a step (the profiler's warm-up ranges before it are not one)
        s0, s1 = ts[steps].min(), (ts[steps] + dur[steps]).max()
        rows = rows[(ts[rows] >= s0) & (ts[rows] < s1)]
    rows = rows[np.lexsort((-dur[rows], ts[rows]))]
    if not len(rows):
        return None
    start, end = ts[rows], ts[rows] + dur[rows]
    reach = np.maximum.accumulate(end)
    outer = np.ones(len(rows), bool)
    outer[1:] = start[1:] >= reach[:-1]
    rows = rows[outer]
    used, code = np.unique(name_code[rows], return_inverse=True)
    names = [name_list[c] for c in used.tolist()]
    return ts[rows].copy(), dur[rows].copy(), code.reshape(-1).astype(np.int32), names


def attach_steps_and_ranges(
    run: Run, files: list[KinetoFile], shifts: dict[int, float], lo: int
) -> None:
    """Each rank's ``ProfilerStep`` spans and outermost user ranges on the run's clock,
    numbered as the collectives' steps are (``ProfilerStep#N`` is step ``N - lo``; steps
    before the first with a collective are left out, as they are for the collectives)."""
    run.trace_steps, run.user_ranges = {}, {}
    for f in files:
        shift = shifts.get(f.rank, 0.0)
        numbered = sorted((n - lo, t) for n, t in f.step_starts.items() if n - lo >= 0)
        if numbered and numbered[-1][0] < MAX_STEP_SPAN:
            start = np.full(numbered[-1][0] + 1, np.nan)
            end = np.full(len(start), np.nan)
            for n, t in numbered:
                start[n] = t + shift
                end[n] = f.step_end_of_start.get(t, t) + shift
            run.trace_steps[f.rank] = TraceSteps(start, end)
        if f.ranges is None:
            continue
        r_start, r_dur, r_name, names = f.ranges
        r_start = r_start + shift
        step = np.full(len(r_start), -1, np.int64)
        found = run.trace_steps.get(f.rank)
        if found is not None:
            known = np.flatnonzero(np.isfinite(found.start_us))
            k = np.searchsorted(found.start_us[known], r_start, side="right") - 1
            ok = k >= 0
            at = known[np.maximum(k, 0)]
            ok &= r_start < found.end_us[at]
            step = np.where(ok, at, -1)
        run.user_ranges[f.rank] = UserRanges(r_start, r_dur, r_name, step, names)


# --- the run-level pass: one clock, readiness marks ---------------------------------------


def _match_keys(s: Any, rows: np.ndarray) -> np.ndarray:
    return s.tensor[rows].astype(np.int64) * (1 << 32) + s.occurrence[rows].astype(np.int64)


def finish_run(run: Run, files: list[KinetoFile], tables: Any = None) -> None:
    """Put the ranks on one clock, number steps from 0 and add the readiness marks.

    Called on the assembled run (its slices are the files' rows, concatenated)."""
    s = run.slices
    notes: list[str] = []
    ranks = sorted({f.rank for f in files})
    shifts: dict[int, float] = {}
    if files and all(f.base_ns is not None for f in files):
        for f in files:
            shifts[f.rank] = f.base_ns / 1000.0  # type: ignore[operator]
    else:
        ops = np.flatnonzero(s.phase == PHASE_OP)
        # the reference clock: the lowest rank that has collectives to align on
        with_ops = set(np.unique(s.rank[ops]).tolist())
        ref = next((r for r in ranks if r in with_ops), ranks[0] if ranks else 0)
        ref_rows = ops[s.rank[ops] == ref]
        ref_keys = _match_keys(s, ref_rows)
        order = np.argsort(ref_keys)
        ref_keys, ref_rows = ref_keys[order], ref_rows[order]
        aligned, unaligned = [], []
        for r in ranks:
            if r == ref:
                shifts[r] = 0.0
                continue
            rows = ops[s.rank[ops] == r]
            keys = _match_keys(s, rows)
            pos = np.searchsorted(ref_keys, keys)
            ok = (
                (pos < len(ref_keys)) & (ref_keys[np.minimum(pos, len(ref_keys) - 1)] == keys)
                if len(ref_keys)
                else np.zeros(len(keys), bool)
            )
            if not ok.any():
                shifts[r] = 0.0
                unaligned.append(r)
                continue
            mine = rows[ok]
            theirs = ref_rows[pos[ok]]
            delta = (s.start_us[theirs] + s.dur_us[theirs]) - (s.start_us[mine] + s.dur_us[mine])
            shifts[r], agreed = _end_shift(
                s, ref_rows, rows, float(np.median(delta)), int(ok.sum())
            )
            aligned.append(f"rank {r} by {shifts[r] / 1000.0:+.3f} ms ({agreed} collectives)")
        if len(ranks) > 1:
            text = (
                "The torch.profiler traces have no baseTimeNanoseconds: their clocks were "
                f"aligned on the ends of matching collectives, to rank {ref}'s"
            )
            if aligned:
                text += ": " + ", ".join(aligned[:8]) + (" ..." if len(aligned) > 8 else "")
            if unaligned:
                text += (
                    f"; ranks {', '.join(map(str, unaligned))} share no collective with rank "
                    f"{ref} and were left on their own clocks"
                )
            notes.append(text + ".")
    for r, shift in shifts.items():
        if shift:
            s.start_us[s.rank == r] += shift
    # steps from 0 (ProfilerStep numbers are absolute)
    occ = s.occurrence
    lo = 0
    if len(occ):
        lo = int(occ[occ >= 0].min()) if (occ >= 0).any() else 0
        if lo:
            occ[occ >= 0] -= lo
        if (occ >= 0).any() and int(occ.max()) > MAX_STEP_SPAN:
            # ProfilerStep#2 and #2000000000: number the steps 0, 1, 2 ... in order, so no
            # analysis makes an array as wide as the gap
            steps, dense = np.unique(occ[occ >= 0], return_inverse=True)
            occ[occ >= 0] = dense.reshape(-1)
            renumber = {int(n) + lo: i for i, n in enumerate(steps.tolist())}
            for f in files:
                f.step_starts = {renumber[n]: v for n, v in f.step_starts.items() if n in renumber}
            notes.append(
                f"The ProfilerStep numbers span more than {MAX_STEP_SPAN} steps "
                f"({int(steps[0]) + lo} to {int(steps[-1]) + lo}): steps are numbered 0 to "
                f"{len(steps) - 1} in their order."
            )
            lo = 0
    # GPU activity on the same clock
    gpu: dict[int, GpuActivity] = {}
    for f in files:
        if f.gpu is not None:
            gpu[f.rank] = f.gpu.shifted(shifts.get(f.rank, 0.0))
            gpu[f.rank].ns_rounding = f.ns_rounding  # type: ignore[attr-defined]
    run.gpu = gpu
    attach_steps_and_ranges(run, files, shifts, lo)
    # readiness: when each rank's GPU reached each NCCL collective (its kernel's start),
    # else when it launched it, timed from its own step's start; seen from the lowest
    # rank's rows
    kernels = _kernel_times(run)
    if kernels is not None:
        run.marks = _marks(run, kernels=kernels)
        notes += _unmatched_note(run, kernels)
    else:
        run.marks = _marks(run, _in_step_offsets(run, files, shifts, lo))
    if tables is not None:
        _split_waiting(run, tables, kernels)
    sizes = [f.world_size for f in files if f.world_size]
    if sizes:
        run.size = max(max(sizes), run.size)
    for f in files:
        if f.host:
            run.hosts[f.rank] = f.host
    named = [f for f in files if f.rank_from != "distributedInfo"]
    if named:
        notes.append(
            "No distributedInfo in "
            + ", ".join(
                f"{f.path.rsplit('/', 1)[-1]} (rank {f.rank}, from its {f.rank_from})"
                for f in named[:4]
            )
            + "."
        )
    run.notes = notes


def _in_step_offsets(
    run: Run, files: list[KinetoFile], shifts: dict[int, float], lo: int
) -> np.ndarray | None:
    """Per slice row, what to add to its start to time it from its own step's start.

    A rank's readiness is when it launched the collective *counted from the start of its
    own step*, put on the earliest rank's step start: a rank that merely began the step
    late (it was the last to be woken by the previous step's collective, which on a busy
    machine is the same rank step after step) is not taken for a straggler; a rank that
    took longer within the step (data, forward, backward) is. Without ``ProfilerStep``
    ranges on every rank, readiness is the launch itself (None)."""
    s = run.slices
    by_rank = {f.rank: f.step_starts for f in files}
    if not by_rank or any(not v for v in by_rank.values()):
        return None
    common = set.intersection(*(set(v) for v in by_rank.values()))
    if not common:
        return None
    # occurrence = N - lo for a collective inside ProfilerStep#N
    earliest = {n: min(v[n] + shifts.get(r, 0.0) for r, v in by_rank.items()) for n in common}
    out = np.zeros(len(s))
    for r, starts in by_rank.items():
        rows = np.flatnonzero(s.rank == r)
        occ = s.occurrence[rows].astype(np.int64) + lo
        for n in np.unique(occ).tolist():
            if n in common:
                out[rows[occ == n]] = earliest[n] - (starts[n] + shifts.get(r, 0.0))
    return out


def _marks(
    run: Run,
    offsets: np.ndarray | None = None,
    kernels: tuple[np.ndarray, np.ndarray] | None = None,
) -> MarkTable:
    """Each rank's arrival at each collective the lowest rank also ran (its row there).

    ``kernels`` (per slice row, its NCCL kernel's start and end, NaN: none): the arrival
    is the kernel's start, and a rank's collective is the lowest rank's that ends with it
    (:func:`_pairs_by_end`), not the one in the same lane: a sampled trace or another
    thread's collectives shift the lanes. Else the launch, plus ``offsets``."""
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    if kernels is not None:
        ops = ops[np.isfinite(kernels[0][ops])]
    if not len(ops):
        return MarkTable()
    observer = int(s.rank[ops].min())
    obs_rows = ops[s.rank[ops] == observer]
    if kernels is not None:
        rows, theirs = _kernel_pairs(run, kernels)
        ts = kernels[0][rows]
    else:
        obs_keys = _match_keys(s, obs_rows)
        order = np.argsort(obs_keys, kind="stable")
        obs_keys, obs_rows = obs_keys[order], obs_rows[order]
        keys = _match_keys(s, ops)
        pos = np.searchsorted(obs_keys, keys)
        ok = (pos < len(obs_keys)) & (obs_keys[np.minimum(pos, len(obs_keys) - 1)] == keys)
        rows = ops[ok]
        theirs = obs_rows[pos[ok]]
        ts = s.start_us[rows] + (offsets[rows] if offsets is not None else 0.0)
    cols = {
        "observer": np.full(len(rows), observer, np.int32),
        "tensor": s.tensor[rows],
        "ts_us": ts,
        "ready_rank": s.rank[rows],
        "slice": theirs.astype(np.int64),
    }
    return MarkTable(**{k: np.asarray(v, MARK_COLUMNS[k]) for k, v in cols.items()})


def _mark_negotiate(neg: Any, tables: Any) -> None:
    """Slices taken as negotiation waits: their phase, and their name from the op's."""
    neg.phase[:] = PHASE_NEGOTIATE
    codes = {
        int(op): tables.names.code(NEGOTIATE_PREFIX + OPS[int(op)])
        for op in np.unique(neg.op).tolist()
        if op >= 0
    }
    neg.name[:] = [codes.get(int(op), -1) for op in neg.op.tolist()]


def _split_waiting(
    run: Run, tables: Any, kernels: tuple[np.ndarray, np.ndarray] | None = None
) -> None:
    """Waiting for the last rank as negotiation, as the other formats record it.

    A collective cannot start before every rank launched it: from a rank's launch to the
    last rank's launch it waits (a ``NEGOTIATE_<OP>`` row), and its op and backend rows
    begin when the last rank arrived. So the breakdown, the diff and the page show the
    waiting where it is, on the ranks that waited. With NCCL kernels (``kernels``) the
    GPU waits, not the CPU: :func:`_split_kernel_waiting`."""
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    if not len(ops):
        return
    if kernels is not None:
        _split_kernel_waiting(run, tables, kernels)
        return
    keys = lanes = _match_keys(s, ops)
    uniq, inv = np.unique(keys, return_inverse=True)
    inv = inv.reshape(-1)
    t_last = np.full(len(uniq), -np.inf)
    np.maximum.at(t_last, inv, s.start_us[ops])
    shared = np.bincount(inv, minlength=len(uniq))[inv] >= 2
    launch = s.start_us[ops].copy()
    end = launch + s.dur_us[ops]
    ready = np.where(shared, np.minimum(np.maximum(t_last[inv], launch), end), launch)
    waits = ready > launch
    # the backend rows of the same collective (same rank, lane and occurrence)
    coll = np.flatnonzero(s.phase == PHASE_COLLECTIVE)
    if len(coll):
        rk = s.rank[ops].astype(np.int64)
        op_keys = (rk << 48) ^ lanes
        order = np.argsort(op_keys)
        sorted_keys = op_keys[order]
        c_keys = (s.rank[coll].astype(np.int64) << 48) ^ _match_keys(s, coll)
        pos = np.minimum(np.searchsorted(sorted_keys, c_keys), len(sorted_keys) - 1)
        hit = sorted_keys[pos] == c_keys
        c_rows, of_op = coll[hit], order[pos[hit]]
        c_end = s.start_us[c_rows] + s.dur_us[c_rows]
        c_start = np.minimum(np.maximum(s.start_us[c_rows], ready[of_op]), c_end)
        s.start_us[c_rows] = c_start
        s.dur_us[c_rows] = c_end - c_start
    rows = ops[waits]
    neg = s.take(rows)
    _mark_negotiate(neg, tables)
    neg.dur_us[:] = (ready - launch)[waits]
    s.start_us[ops] = ready
    s.dur_us[ops] = end - ready
    run.slices = SliceTable.concat([s, neg])  # type: ignore[assignment]
    run.names = tables.names.items


# --- matching collectives across ranks by their ends; arrivals at NCCL kernels -----------

#: The same collective ends within this of itself on every rank it spans (its last transfer
#: lands on all of them): on the real NCCL pair (tests/data/kineto-hta) matched kernels end
#: within 0.4 ms of each other, and a rank's other collectives of the op in the step 28 ms
#: or more from them.
END_MATCH_US = 1000.0
#: At most this many same-step pairs are weighed per rank (else the lanes alone decide).
MAX_END_PAIRS = 2_000_000


def _step_groups(s: Any, rows: np.ndarray) -> np.ndarray:
    """(op, step) of each op row: the collectives of another rank it can be."""
    return s.op[rows].astype(np.int64) * (1 << 32) + s.occurrence[rows].astype(np.int64)


def _end_pairs(
    s: Any, ref_rows: np.ndarray, rows: np.ndarray, ref_end: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Every pair of a row of ``rows`` and one of ``ref_rows`` of the same op and step:
    (index into rows, index into ref_rows, ref end - end). None past MAX_END_PAIRS."""
    ga, gb = _step_groups(s, rows), _step_groups(s, ref_rows)
    common = np.intersect1d(ga, gb)
    ia, ib = np.argsort(ga, kind="stable"), np.argsort(gb, kind="stable")
    a0, a1 = np.searchsorted(ga[ia], common, "left"), np.searchsorted(ga[ia], common, "right")
    b0, b1 = np.searchsorted(gb[ib], common, "left"), np.searchsorted(gb[ib], common, "right")
    if int(((a1 - a0) * (b1 - b0)).sum()) > MAX_END_PAIRS:
        return None
    out_a, out_b = [], []
    for x0, x1, y0, y1 in zip(a0.tolist(), a1.tolist(), b0.tolist(), b1.tolist(), strict=True):
        mine, theirs = np.meshgrid(ia[x0:x1], ib[y0:y1], indexing="ij")
        out_a.append(mine.ravel())
        out_b.append(theirs.ravel())
    if not out_a:
        return np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0)
    a, b = np.concatenate(out_a), np.concatenate(out_b)
    return a, b, ref_end[ref_rows[b]] - end[rows[a]]


def _densest(delta: np.ndarray) -> tuple[float, int]:
    """The centre (median) of the END_MATCH_US-wide window holding the most of ``delta``,
    and how many it holds: the shift on which the most collectives end together. A wrong
    pairing of one op's collectives in a step agrees with fewer pairs than the right one."""
    if not len(delta):
        return 0.0, 0
    d = np.sort(delta)
    hi = np.searchsorted(d, d + END_MATCH_US, side="right")
    count = hi - np.arange(len(d))
    best = int(np.argmax(count))
    return float(np.median(d[best : hi[best]])), int(count[best])


def _end_shift(
    s: Any, ref_rows: np.ndarray, rows: np.ndarray, lane_shift: float, lane_count: int
) -> tuple[float, int]:
    """A rank's clock shift onto the reference's, and on how many collectives it agrees.

    The shift that makes the most of its collectives end with one of the reference's of
    the same op in the same step; the lanes' median (the j-th allreduce of the step with
    the j-th) where no two agree. Lanes alone mislead where a rank's trace lacks some
    collectives (a sampled trace) or another thread issued them in another order: on the
    real NCCL pair 4 of its 10 lane pairs end together, and their median was right only
    because the wrong ones fell on both sides."""
    end = s.start_us + s.dur_us
    found = _end_pairs(s, ref_rows, rows, end, end)
    if found is None:
        return lane_shift, lane_count
    shift, count = _densest(found[2])
    if count < 2:
        return lane_shift, lane_count
    return shift, count


def _kernel_times(run: Run) -> tuple[np.ndarray, np.ndarray] | None:
    """Per slice row of a collective's launch, its NCCL kernels' start and end on the run's
    clock (NaN: none); None when the run has no NCCL kernels on every rank.

    Why the kernel's start is the rank's arrival: on NCCL the CPU only enqueues the
    collective (its launch returns at once) and the GPU stream reaches it after the
    kernels before it, so the kernel's start is when that rank was ready; the kernel then
    spins until every rank's has started, so the peers of a late rank have the long
    kernels, and all of them end together."""
    coll = kernel_rows(run)
    if coll is None:
        return None
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    op_keys = (s.rank[ops].astype(np.int64) << 48) ^ _match_keys(s, ops)
    c_keys = (s.rank[coll].astype(np.int64) << 48) ^ _match_keys(s, coll)
    order = np.argsort(c_keys)
    sorted_keys = c_keys[order]
    pos = np.minimum(np.searchsorted(sorted_keys, op_keys), len(sorted_keys) - 1)
    hit = sorted_keys[pos] == op_keys
    rows = coll[order[pos[hit]]]
    start, end = np.full(len(s), np.nan), np.full(len(s), np.nan)
    start[ops[hit]] = s.start_us[rows]
    end[ops[hit]] = s.start_us[rows] + s.dur_us[rows]
    return start, end


def _kernel_pairs(
    run: Run, kernels: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """Each rank's collective launches (slice rows) with an NCCL kernel, and the lowest
    rank's launch of the same collective (:func:`_pairs_by_end`), where it has one."""
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    ops = ops[np.isfinite(kernels[0][ops])]
    if not len(ops):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    obs_rows = ops[s.rank[ops] == int(s.rank[ops].min())]
    rows, theirs = [], []
    for r in np.unique(s.rank[ops]).tolist():
        mine = ops[s.rank[ops] == r]
        a, b = _pairs_by_end(s, obs_rows, mine, kernels[1])
        rows.append(mine[a])
        theirs.append(obs_rows[b])
    return np.concatenate(rows).astype(np.int64), np.concatenate(theirs).astype(np.int64)


def _pairs_by_end(
    s: Any, obs_rows: np.ndarray, rows: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``rows`` is which of ``obs_rows`` (indices into each): the collective of the
    same op and step whose kernel ends with it, within END_MATCH_US once the clocks'
    residual offset (the densest shift: 0 on clocks aligned on the ends) is taken off;
    one to one, nearest first. Lanes where there are too many pairs to weigh."""
    found = _end_pairs(s, obs_rows, rows, end, end)
    if found is None:
        keys, obs_keys = _match_keys(s, rows), _match_keys(s, obs_rows)
        order = np.argsort(obs_keys, kind="stable")
        pos = np.minimum(np.searchsorted(obs_keys[order], keys), len(order) - 1)
        ok = obs_keys[order][pos] == keys
        return np.flatnonzero(ok), order[pos[ok]]
    a, b, delta = found
    residual, count = _densest(delta)
    off = np.abs(delta - (residual if count >= 2 else 0.0))
    near = np.flatnonzero(off <= END_MATCH_US)
    near = near[np.argsort(off[near], kind="stable")]
    used_a, used_b = np.zeros(len(rows), bool), np.zeros(len(obs_rows), bool)
    out_a, out_b = [], []
    for k in near.tolist():
        i, j = int(a[k]), int(b[k])
        if not used_a[i] and not used_b[j]:
            used_a[i] = used_b[j] = True
            out_a.append(i)
            out_b.append(j)
    return np.array(out_a, np.int64), np.array(out_b, np.int64)


def _unmatched_note(run: Run, kernels: tuple[np.ndarray, np.ndarray]) -> list[str]:
    """What the run's notes say when some ranks' NCCL collectives ended with none of the
    lowest rank's (nothing when all did); a few ranks named, never a long list."""
    s, m = run.slices, run.marks
    ops = np.flatnonzero((s.phase == PHASE_OP) & np.isfinite(kernels[0]))
    if not len(ops) or not len(m):
        return []
    observer = int(m.observer[0])
    parts = []
    for r in np.unique(s.rank[ops]).tolist():
        ran = int((s.rank[ops] == r).sum())
        found = int((m.ready_rank == r).sum())
        if r != observer and found < ran:
            parts.append(f"{found} of rank {r}'s {ran}")
    if not parts:
        return []
    more = f" (and on {len(parts) - 4} more ranks)" if len(parts) > 4 else ""
    return [
        "Arrivals at NCCL collectives are their kernels' starts; a collective is matched "
        f"across ranks by its kernels ending together (within {END_MATCH_US / 1000:g} ms): "
        f"{', '.join(parts[:4])}{more} ended with one of rank {observer}'s; the rest with "
        "none (a sampled trace, or groups without it), so they are not compared."
    ]


def _split_kernel_waiting(run: Run, tables: Any, kernels: tuple[np.ndarray, np.ndarray]) -> None:
    """NCCL's waiting, where it happens: inside the kernel. A rank's kernel spins from its
    start until the last rank's kernel of the same collective (matched by its end, as the
    arrivals are) has started: that part of its backend row becomes a ``NEGOTIATE_<OP>``
    row, the rest stays the transfer. The launch's row stays whole (the CPU only enqueued
    the collective and went on); a collective matched on no other rank waits for nobody.
    So the breakdown's waiting is the time the straggler analysis says the others waited.
    """
    s = run.slices
    rows, theirs = _kernel_pairs(run, kernels)
    if not len(rows):
        return
    _, inv = np.unique(theirs, return_inverse=True)
    inv = inv.reshape(-1)
    k_start, k_end = kernels[0][rows], kernels[1][rows]
    last = np.full(int(inv.max()) + 1, -np.inf)
    np.maximum.at(last, inv, k_start)
    shared = np.bincount(inv)[inv] >= 2
    ready = np.where(shared, np.minimum(np.maximum(last[inv], k_start), k_end), k_start)
    waits = ready > k_start
    # the backend (kernel) row of each of those launches: same rank, lane and occurrence
    coll = kernel_rows(run)
    if coll is not None:
        c_keys = (s.rank[coll].astype(np.int64) << 48) ^ _match_keys(s, coll)
        order = np.argsort(c_keys)
        op_keys = (s.rank[rows].astype(np.int64) << 48) ^ _match_keys(s, rows)
        pos = np.minimum(np.searchsorted(c_keys[order], op_keys), len(order) - 1)
        hit = c_keys[order][pos] == op_keys
        c_rows = coll[order[pos[hit]]]
        s.start_us[c_rows] = ready[hit]
        s.dur_us[c_rows] = k_end[hit] - ready[hit]
    neg = s.take(rows[waits])
    _mark_negotiate(neg, tables)
    neg.start_us[:] = k_start[waits]
    neg.dur_us[:] = (ready - k_start)[waits]
    run.slices = SliceTable.concat([s, neg])  # type: ignore[assignment]
    run.names = tables.names.items


#: what a run of torch.profiler traces can tell: each rank's readiness is its own launch
#: (or kernel), matched across the files here; a profiler may trace a few of the job's
#: ranks, and records the few steps of its schedule
KINETO_CAPABILITIES = Capabilities(
    readiness_matched_across_files=True, ranks_may_be_a_subset=True, steps_sampled=True
)


# --- the format -----------------------------------------------------------------------------


class KinetoFormat:
    """torch.profiler traces, one per rank (``*.pt.trace.json[.gz]`` or Kineto's keys)."""

    name = "kineto"
    incremental = False
    last_resort = False

    def detect_dir(self, directory: str, names: list[str]) -> Detection:
        found = Detection(self.name)
        files = []
        for n in names:
            full = os.path.join(directory, n)
            why = not_a_file(full)
            if why is None:
                if is_kineto_file(full):
                    files.append(full)
            elif KINETO_NAME_RE.match(n):
                found.problems.append(Problem(full, "", f"not read: {why}"))
        taken: dict[int, str] = {}
        unranked = []
        for full in files:
            rank = sniff_rank(full, len(files))
            if rank is None or rank in taken:
                if rank is not None:
                    found.problems.append(
                        Problem(
                            full,
                            "",
                            f"rank {rank} is also {os.path.basename(taken[rank])}; "
                            "this one is read as another rank",
                        )
                    )
                unranked.append(full)
                continue
            taken[rank] = full
        for full in unranked:  # by file order, the lowest ranks no file claims
            rank = next(r for r in range(len(taken) + 1) if r not in taken)
            taken[rank] = full
        found.files = [FoundFile(full, rank) for rank, full in sorted(taken.items())]
        return found

    def holds_run(self, directory: Path, entries: list[Path]) -> bool:
        return any(self._is_trace(p) for p in entries)

    def part_of_run(self, path: Path) -> bool:
        return bool(KINETO_NAME_RE.match(path.name)) or self._is_trace(path)

    @staticmethod
    def _is_trace(path: Path) -> bool:
        return path.name.endswith(TRACE_SUFFIXES) and path.is_file() and is_kineto_file(str(path))

    def detect_file(self, path: str) -> Detection | None:
        if not is_kineto_file(path):
            return None
        rank = sniff_rank(path, 1)
        return Detection(self.name, [FoundFile(path, 0 if rank is None else rank)])

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        k = parse_kineto(path, whole_bytes(path), rank, tables, files_in_run)
        cols = Columns()
        cols.slice_chunks.append(k.slices)
        cols.rows = len(k.slices["rank"])
        return FileRead(cols, k.problems, k.complete, k.events, k.rank, {k.rank}, k.host, k)

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        run.capabilities = KINETO_CAPABILITIES
        finish_run(run, [r.detail for r in reads], tables)
