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
from typing import Any

import msgspec
import numpy as np

from hvdprof.analysis.model import (
    MARK_COLUMNS,
    OPS,
    PHASE_COLLECTIVE,
    PHASE_NEGOTIATE,
    PHASE_OP,
    SLICE_COLUMNS,
    MarkTable,
    Problem,
    Run,
    SliceTable,
)
from hvdprof.common import limits
from hvdprof.common.activities import NEGOTIATE_PREFIX
from hvdprof.config import name_of

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
_RANK_IN_NAME = re.compile(r"(?:rank|worker)[._-]?(\d+)", re.IGNORECASE)
#: bytes of a file's start searched for the Kineto keys (and the rank)
SNIFF_BYTES = 1 << 16

#: GPU activity kinds, as HTA names its kernel types
GPU_KINDS: tuple[str, ...] = ("computation", "communication", "memory", "other")
GPU_COMPUTE, GPU_COMM, GPU_MEMORY, GPU_OTHER = 0, 1, 2, 3
_NCCL_KERNEL = re.compile(r"nccl.*Kernel")

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
            return zlib.decompressobj(31).decompress(raw, size)
        return raw
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
    n = _RANK_IN_NAME.search(os.path.basename(path))
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


def gpu_kind(name: str) -> int:
    """HTA's kernel type of a GPU event (as HTA 0.5.0 classifies names): communication
    (starts ``nccl`` and has ``Kernel`` after it), memory (starts ``Memcpy``, ``Memset`` or
    ``dma``), other (``Memcpy`` or ``Sync`` elsewhere in the name), else computation."""
    if _NCCL_KERNEL.match(name):
        return GPU_COMM
    if name.startswith(("Memcpy", "Memset", "dma")):
        return GPU_MEMORY
    if "Memcpy" in name or "Sync" in name:
        return GPU_OTHER
    return GPU_COMPUTE


@dataclass
class GpuActivity:
    """One rank's GPU events (``stream`` set), on the run's clock."""

    start_us: np.ndarray
    dur_us: np.ndarray
    kind: np.ndarray  # GPU_KINDS code
    stream: np.ndarray
    #: what HTA counts by default: launched before the last ProfilerStep began
    in_hta: np.ndarray
    #: start and end as HTA reads them (whole microseconds when it rounds the file),
    #: on the file's own clock (shares do not depend on the shift)
    hta_start: np.ndarray
    hta_end: np.ndarray


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
        out.rank_from = "file name" if _RANK_IN_NAME.search(path) else "file order"
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
    """Columns of one file's events (typed or lenient structs)."""
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
        return
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

    def arg(e: Any, key: str) -> Any:
        a = e.args
        if a is None:
            return None
        return a.get(key) if lenient and isinstance(a, dict) else getattr(a, key, None)

    if lenient:
        stream = np.array(
            [s if isinstance(s := arg(e, "stream"), int) else -1 for e in xs], np.int64
        )
    else:
        stream = np.fromiter(
            (-1 if e.args is None or e.args.stream is None else e.args.stream for e in xs),
            np.int64,
            n,
        )
    # per unique name: what it is
    n_names = len(name_list)
    step_of_name = np.full(n_names, -1, np.int64)
    op_of_name = np.full(n_names, -1, np.int64)
    role_of_name = np.zeros(n_names, np.int8)  # 1 c10d launch, 2 nccl cpu, 3 gloo, 4 nccl gpu
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
            role_of_name[code] = 5  # carries the message size; not a collective itself
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
    role = role_of_name[name_code]
    is_gpu = stream >= 0
    role = np.where((role == 2) & is_gpu, 0, role)  # a "nccl:" name on a stream is GPU work
    role = np.where((role == 4) & ~is_gpu, 0, role)
    # CPU side of each correlation id: (thread, ts) of the runtime call that launched it
    gpu_rows = np.flatnonzero(is_gpu)
    corr_ts: dict[int, tuple[int, float, int]] = {}
    if len(gpu_rows):
        for i in np.flatnonzero(~is_gpu).tolist():
            c = arg(xs[i], "correlation")
            if isinstance(c, int):
                corr_ts[c] = (int(tid[i]), float(ts[i]), i)
    # GPU activity, HTA's way. HTA rounds a file's times to whole microseconds (start
    # up, end down) when its ts column is not all integers (fractional or missing ts);
    # and, when there are two or more ProfilerSteps, it leaves out the GPU events
    # launched (by correlation) in the last one, and those without a launch after it
    if len(gpu_rows):
        if out.ns_rounding:
            h_start, h_end = np.ceil(ts), np.floor(ts + dur)
        else:
            h_start, h_end = ts, ts + dur
        step_rows = np.flatnonzero((step_of_name[name_code] >= 0) & ~is_gpu)
        if len(np.unique(name_code[step_rows])) >= 2:
            last_start = float(h_start[step_rows].max())
            cpu_start = {c: float(h_start[i]) for c, (_, _, i) in corr_ts.items()}
            kept = []
            for i in gpu_rows.tolist():
                c = arg(xs[i], "correlation")
                if isinstance(c, int) and c != -1:
                    kept.append(cpu_start.get(c, np.inf) < last_start)
                else:  # HTA takes it for a CPU event: kept when it began before
                    kept.append(h_start[i] < last_start)
            launched = np.array(kept, bool)
        else:
            launched = np.ones(len(gpu_rows), bool)
        out.gpu = GpuActivity(
            ts[gpu_rows].copy(),
            dur[gpu_rows].copy(),
            kind_of_name[name_code[gpu_rows]].astype(np.int8),
            stream[gpu_rows].copy(),
            launched,
            h_start[gpu_rows].copy(),
            h_end[gpu_rows].copy(),
        )
    # launches: c10d ops if any, else nccl CPU ranges, else gloo ranges
    present = {int(r) for r in np.unique(role)}
    launch_role = 1 if 1 in present else 2 if 2 in present else 3 if 3 in present else 0
    if not launch_role:
        return
    launches = np.flatnonzero(role == launch_role)
    launches = launches[np.argsort(ts[launches], kind="stable")]
    work_role = 3 if 3 in present and launch_role != 3 else 4 if 4 in present else 0
    works = (
        np.flatnonzero(role == work_role) if work_role else np.zeros(0, np.int64)
    )  # gloo ranges or nccl kernels
    works = works[np.argsort(ts[works], kind="stable")]
    l_op = op_of_name[name_code[launches]]
    w_op = op_of_name[name_code[works]]
    work_of = np.full(len(launches), -1, np.int64)  # first work row per launch
    work_end = np.full(len(launches), -np.inf)
    work_start = np.full(len(launches), np.inf)
    matched = np.zeros(len(works), bool)
    if work_role == 4:  # by correlation: kernel -> runtime call -> launch range on its thread
        by_tid: dict[int, np.ndarray] = {}
        for t in np.unique(tid[launches]).tolist():
            by_tid[t] = np.flatnonzero(tid[launches] == t)
        for k, w in enumerate(works.tolist()):
            c = arg(xs[w], "correlation")
            hit = corr_ts.get(c) if isinstance(c, int) else None
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
    # steps
    steps = np.flatnonzero(step_of_name[name_code] >= 0)
    steps = steps[np.argsort(ts[steps], kind="stable")]
    s_start, s_end = ts[steps], ts[steps] + dur[steps]
    s_num = step_of_name[name_code[steps]]
    out.step_starts = {
        int(n): float(x) for n, x in zip(s_num.tolist(), s_start.tolist(), strict=True)
    }
    l_ts = ts[launches]
    k = np.searchsorted(s_start, l_ts, side="right") - 1
    in_step = (
        (k >= 0) & (l_ts <= s_end[np.maximum(k, 0)]) if len(steps) else np.zeros(len(l_ts), bool)
    )
    step = np.where(in_step, s_num[np.maximum(k, 0)] if len(steps) else -1, -1)
    lane = np.zeros(len(launches), np.int64)
    occurrence = np.zeros(len(launches), np.int64)
    counts: dict[tuple[int, int], int] = {}
    loose: dict[int, int] = {}
    lane_names: list[str] = []
    for i, (op, st) in enumerate(zip(l_op.tolist(), step.tolist(), strict=True)):
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

    # sizes: from the launch, else from a range inside it that has them
    # (record_param_comms, nccl:<op>), on the same thread
    def size_of(e: Any) -> tuple[int, str | None]:
        if e.args is None:
            return -1, None
        if lenient:
            elems, tname = arg(e, "In msg nelems"), arg(e, "dtype")
        else:
            elems, tname = arg(e, "nelems"), arg(e, "dtype")
            if not isinstance(elems, int) or not isinstance(tname, str):
                elems = _elements(arg(e, "input_dims"))
                tname = _first_type(arg(e, "input_type"))
        if (
            isinstance(elems, int)
            and 0 <= elems <= MAX_ELEMENTS
            and isinstance(tname, str)
            and tname in ITEMSIZE
        ):
            return elems * ITEMSIZE[tname], tname
        return -1, tname if isinstance(tname, str) and tname in ITEMSIZE else None

    carriers = np.flatnonzero(((role == 5) | (role == 2) | (role == 1)) & ~is_gpu)
    carriers = carriers[np.lexsort((ts[carriers], tid[carriers]))]
    c_key = ts[carriers]
    c_tid = tid[carriers]
    nbytes = np.full(len(launches), -1, np.int64)
    dtype = np.full(len(launches), -1, np.int16)
    for i, row in enumerate(launches.tolist()):
        size, tname = size_of(xs[row])
        if size < 0 and len(carriers):
            lo = int(np.searchsorted(c_tid, tid[row], side="left"))
            hi = int(np.searchsorted(c_tid, tid[row], side="right"))
            k = lo + int(np.searchsorted(c_key[lo:hi], ts[row], side="left"))
            end = ts[row] + dur[row]
            while k < hi and c_key[k] <= end and size < 0:
                if carriers[k] != row:
                    size, tname = size_of(xs[int(carriers[k])])
                k += 1
        nbytes[i] = size
        if tname is not None:
            dtype[i] = tables.dtypes.code(tname)
    backend = tables.backends.code(out.backend or ("NCCL" if launch_role == 2 else "GLOO"))
    l_end = np.maximum(l_ts + dur[launches], np.where(np.isfinite(work_end), work_end, -np.inf))
    # rows: one op row per launch, one collective row per launch with work
    has_work = work_of >= 0
    n_op, n_coll = len(launches), int(has_work.sum())
    cols = {k: np.empty(n_op + n_coll, dt) for k, dt in SLICE_COLUMNS.items()}
    glob_name = np.full(len(name_list), -1, np.int32)
    for code in np.unique(np.concatenate([name_code[launches], name_code[works]])).tolist():
        glob_name[code] = tables.names.code(name_list[code])
    cols["rank"][:] = out.rank
    cols["tensor"][:n_op] = lane
    cols["tensor"][n_op:] = lane[has_work]
    cols["name"][:n_op] = glob_name[name_code[launches]]
    cols["name"][n_op:] = glob_name[name_code[work_of[has_work]]]
    cols["phase"][:n_op] = PHASE_OP
    cols["phase"][n_op:] = PHASE_COLLECTIVE
    cols["op"][:n_op] = l_op
    cols["op"][n_op:] = l_op[has_work]
    cols["start_us"][:n_op] = l_ts
    cols["dur_us"][:n_op] = l_end - l_ts
    cols["start_us"][n_op:] = work_start[has_work]
    cols["dur_us"][n_op:] = (work_end - work_start)[has_work]
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
    out.slices = cols


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
            shifts[r] = float(np.median(delta))
            aligned.append(
                f"rank {r} by {shifts[r] / 1000.0:+.3f} ms ({int(ok.sum())} collectives)"
            )
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
            g = f.gpu
            gpu[f.rank] = GpuActivity(
                g.start_us + shifts.get(f.rank, 0.0),
                g.dur_us,
                g.kind,
                g.stream,
                g.in_hta,
                g.hta_start,
                g.hta_end,
            )
            gpu[f.rank].ns_rounding = f.ns_rounding  # type: ignore[attr-defined]
    run.gpu = gpu
    # readiness: when each rank launched each collective, seen from the lowest rank's rows
    run.marks = _marks(run, _in_step_offsets(run, files, shifts, lo))
    if tables is not None:
        _split_waiting(run, tables)
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


def _marks(run: Run, offsets: np.ndarray | None = None) -> MarkTable:
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    if not len(ops):
        return MarkTable()
    observer = int(s.rank[ops].min())
    obs_rows = ops[s.rank[ops] == observer]
    obs_keys = _match_keys(s, obs_rows)
    order = np.argsort(obs_keys, kind="stable")
    obs_keys, obs_rows = obs_keys[order], obs_rows[order]
    keys = _match_keys(s, ops)
    pos = np.searchsorted(obs_keys, keys)
    ok = (pos < len(obs_keys)) & (obs_keys[np.minimum(pos, len(obs_keys) - 1)] == keys)
    rows = ops[ok]
    cols = {
        "observer": np.full(len(rows), observer, np.int32),
        "tensor": s.tensor[rows],
        "ts_us": s.start_us[rows] + (offsets[rows] if offsets is not None else 0.0),
        "ready_rank": s.rank[rows],
        "slice": obs_rows[pos[ok]].astype(np.int64),
    }
    return MarkTable(**{k: np.asarray(v, MARK_COLUMNS[k]) for k, v in cols.items()})


def _split_waiting(run: Run, tables: Any) -> None:
    """Waiting for the last rank as negotiation, as the other formats record it.

    A collective cannot start before every rank launched it: from a rank's launch to the
    last rank's launch it waits (a ``NEGOTIATE_<OP>`` row), and its op and backend rows
    begin when the last rank arrived. So the breakdown, the diff and the page show the
    waiting where it is, on the ranks that waited."""
    s = run.slices
    ops = np.flatnonzero(s.phase == PHASE_OP)
    if not len(ops):
        return
    keys = _match_keys(s, ops)
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
        op_keys = (rk << 48) ^ keys
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
    neg.phase[:] = PHASE_NEGOTIATE
    codes = {
        int(op): tables.names.code(NEGOTIATE_PREFIX + OPS[int(op)])
        for op in np.unique(neg.op).tolist()
        if op >= 0
    }
    neg.name[:] = [codes.get(int(op), -1) for op in neg.op.tolist()]
    neg.dur_us[:] = (ready - launch)[waits]
    s.start_us[ops] = ready
    s.dur_us[ops] = end - ready
    run.slices = SliceTable.concat([s, neg])  # type: ignore[assignment]
    run.names = tables.names.items
