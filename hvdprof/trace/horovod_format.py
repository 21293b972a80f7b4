"""Parser of Horovod's own timeline (``HOROVOD_TIMELINE``) into the same columns.

Horovod's format differs from ours in every way that matters to a reader: only rank 0
writes, covering every rank; one ``pid`` per tensor (named by a ``process_name``
record); ``B``/``E`` pairs whose ``E`` has no name; readiness as zero-length ``X``
events named by the rank (``"0"``, ``"1"``) inside the ``NEGOTIATE_*`` pair; cycle marks
as ``i`` events with no ``pid``. A killed file still ends in ``}]`` but leaves ``B``
events open. Fusion is not recorded: ops whose backend call started at the same
instant are taken as one fused group.
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hvdprof.common import limits
from hvdprof.trace import byte_order
from hvdprof.trace.chrome_json import parse_trace_text
from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.files import TRACE_SUFFIXES, Detection, FileRead, FoundFile
from hvdprof.trace.kineto_format import read_head
from hvdprof.trace.model import (
    MARK_COLUMNS,
    PHASE_COLLECTIVE,
    PHASE_MEMCPY_IN,
    PHASE_NEGOTIATE,
    PHASE_OP,
    SLICE_COLUMNS,
    Capabilities,
    Problem,
    Run,
    classify,
)

#: a timestamp beyond this many microseconds (3,000 years) is not one
MAX_TIME_US = 1e17
#: a tensor of more elements than this is not a tensor size
MAX_ELEMENTS = 1 << 48

#: bytes per element of the dtype names Horovod writes
ITEMSIZE = {
    "uint8": 1,
    "int8": 1,
    "bool": 1,
    "uint16": 2,
    "int16": 2,
    "float16": 2,
    "bfloat16": 2,
    "int32": 4,
    "float32": 4,
    "int64": 8,
    "float64": 8,
}


def looks_like_horovod(head: bytes) -> bool:
    """True when the first bytes of a file look like a Horovod timeline."""
    return b"start_time_since_epoch_in_micros" in head or (
        head.lstrip().startswith(b"[") and b'"ph": "B"' in head
    )


def read_horovod_bytes(path: str) -> tuple[bytes, list[Problem], bool]:
    """``(JSON text, problems, whole)`` of a Horovod timeline file: a ``.gz`` one inflated
    within :mod:`hvdprof.common.limits` (a cut stream gives what it held, said once), a
    byte-order mark's UTF-8 or UTF-16 made into the UTF-8 the parser reads."""
    with open(path, "rb") as f:
        data = f.read()
    problems: list[Problem] = []
    whole = True
    if data[:2] == b"\x1f\x8b":
        try:
            data, trouble = limits.inflate(data)
        except limits.InflateLimitError as exc:
            return b"", [Problem(path, "gzip", f"not read: it {exc}")], False
        if trouble is not None:
            problems.append(Problem(path, "gzip", trouble))
            whole = False
    return byte_order.as_utf8(data), problems, whole


def _shape_elements(shape: Any) -> int | None:
    if isinstance(shape, str):
        text = shape.strip().strip("[]()")
        try:
            dims = [int(x) for x in text.split(",") if x.strip()]
        except ValueError:
            return None
    elif isinstance(shape, list):
        try:
            dims = [int(x) for x in shape]
        except (TypeError, ValueError, OverflowError):
            return None
    else:
        return None
    n = 1
    for d in dims:
        n *= d
        if not 0 <= n <= MAX_ELEMENTS:
            return None
    return n


def _time(value: Any) -> float:
    """A timestamp in microseconds; ValueError for anything that is not a finite one."""
    t = float(value)
    if not -MAX_TIME_US < t < MAX_TIME_US:
        raise ValueError(f"ts {t!r} is not a time")
    return t


class _Open:
    """A ``B`` waiting for its ``E``."""

    __slots__ = ("children", "marks", "name", "occurrence", "ts")

    def __init__(self, name: str, ts: float, occurrence: int) -> None:
        self.name = name
        self.ts = ts
        self.occurrence = occurrence
        self.marks: list[tuple[float, int]] = []
        self.children: list[int] = []


def parse_horovod(
    path: str, data: bytes, tables: Tables
) -> tuple[Columns, list[Problem], bool, int, set[int]]:
    """``(columns, problems, complete, events read, ranks seen)`` of one Horovod timeline."""
    events, problems, complete = _decode_events(path, data)
    if not isinstance(events, list):
        return Columns(), [Problem(path, "", "not a Chrome trace array")], False, 0, set()
    reader = _HorovodEvents(tables)
    n_events = 0
    for index, e in enumerate(events):
        try:
            reader.read(e)
            n_events += 1
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            text = " ".join(str(exc).split())[:120]
            problems.append(Problem(path, f"element {index}", f"unusable event ({text})"))
    cut = _never_ended(path, reader.stacks)
    if cut is not None:
        complete = False
        problems.append(cut)
    cols = Columns()
    arrays = {k: np.asarray(v, dtype=SLICE_COLUMNS[k]) for k, v in reader.s.items()}
    _infer_groups(arrays, tables)
    cols.slice_chunks.append(arrays)
    cols.rows = len(arrays["rank"])
    cols.mark_chunks.append({k: np.asarray(v, dtype=MARK_COLUMNS[k]) for k, v in reader.m.items()})
    return cols, problems, complete, n_events, reader.ranks


def _decode_events(path: str, data: bytes) -> tuple[Any, list[Problem], bool]:
    """``(events, problems, complete)``: the JSON array (or a trace object's
    ``traceEvents``); a cut or broken file through the tolerant line parser."""
    problems: list[Problem] = []
    complete = True
    try:
        events = orjson.loads(data)
        if isinstance(events, dict):
            events = events.get("traceEvents", [])
    except orjson.JSONDecodeError:  # (also UTF-8 errors and nesting past orjson's limit)
        trace = parse_trace_text(data.decode("utf-8", errors="replace"), path)
        events = trace.events
        complete = trace.complete
        problems += [
            Problem(path, f"line {s.line}" if s.line else "", s.reason) for s in trace.skipped
        ]
        if not complete:
            problems.append(Problem(path, "", "no closing ']': the file was cut"))
    return events, problems, complete


def _never_ended(path: str, stacks: dict[int, list[_Open]]) -> Problem | None:
    """The slices a cut recording left open (None: none), counted per name."""
    still_open: dict[str, int] = {}
    for stack in stacks.values():
        for opened in stack:
            still_open[opened.name] = still_open.get(opened.name, 0) + 1
    if not still_open:
        return None
    what = ", ".join(f"{n} {name}" for name, n in sorted(still_open.items()))
    return Problem(
        path,
        "end of file",
        f"{sum(still_open.values())} slices never ended ({what}): the recording was "
        "cut (killed?); they are left out",
    )


class _HorovodEvents:
    """One file's events in order, into slice and readiness-mark columns: a ``B`` opens a
    slice on its pid's stack, its ``E`` closes it into a row, an ``X`` named by a rank
    number inside a negotiation is that rank's readiness mark, an ``M`` names a pid's
    tensor. A bad event raises (the caller lists it and reads on)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables
        self.max_ranks = limits.max_ranks()
        self.s: dict[str, list[Any]] = {k: [] for k in SLICE_COLUMNS}
        self.m: dict[str, list[Any]] = {k: [] for k in MARK_COLUMNS}
        self.pid_tensor: dict[int, int] = {}
        self.stacks: dict[int, list[_Open]] = {}
        self.occ: dict[int, int] = {}
        self.after_negotiate: dict[int, bool] = {}
        self.info_of: dict[str, tuple[int, int, int]] = {}
        self.ranks: set[int] = {0}

    def info(self, name: str) -> tuple[int, int, int]:
        """``(phase, op, name code)`` of a slice name."""
        found = self.info_of.get(name)
        if found is None:
            phase, op = classify(name)
            found = self.info_of[name] = (phase, op, self.tables.names.code(name))
        return found

    def read(self, e: Any) -> None:
        ph = e["ph"]
        if ph == "M":
            args = e.get("args") or {}
            if e.get("name") == "process_name" and isinstance(args.get("name"), str):
                self.pid_tensor[int(e["pid"])] = self.tables.tensors.code(args["name"])
        elif ph == "B":
            self._begin(e)
        elif ph == "E":
            self._end(e)
        elif ph == "X":
            self._mark(e)

    def _begin(self, e: Any) -> None:
        pid = int(e["pid"])
        name = e["name"]
        ts = _time(e["ts"])
        tensor = self.pid_tensor.get(pid, -1)
        phase = self.info(name)[0]
        stack = self.stacks.setdefault(pid, [])
        occ = self.occ
        if phase == PHASE_NEGOTIATE:
            occ[tensor] = occ.get(tensor, 0) + 1
            self.after_negotiate[pid] = True
        elif phase == PHASE_OP and not stack:
            if not self.after_negotiate.pop(pid, False):
                occ[tensor] = occ.get(tensor, 0) + 1
            self.after_negotiate.pop(pid, None)
        stack.append(_Open(name, ts, occ.get(tensor, 1) - 1))

    def _end(self, e: Any) -> None:
        pid = int(e["pid"])
        ts = _time(e["ts"])
        stack = self.stacks.get(pid)
        if not stack:
            raise ValueError("'E' without an open 'B' on its pid")
        opened = stack.pop()
        phase, op, code = self.info(opened.name)
        tensor = self.pid_tensor.get(pid, -1)
        s = self.s
        row = len(s["rank"])
        nbytes, dtype = -1, -1
        args = e.get("args") or {}
        if phase == PHASE_OP and args:
            elements = _shape_elements(args.get("shape"))
            dname = args.get("dtype")
            if isinstance(dname, str):
                dtype = self.tables.dtypes.code(dname)
                if elements is not None and dname in ITEMSIZE:  # (at most 2**51)
                    nbytes = elements * ITEMSIZE[dname]
        if stack:
            stack[-1].children.append(row)
            if op < 0:
                op = self.info(stack[-1].name)[1]
        for k, v in (
            ("rank", 0),
            ("tensor", tensor),
            ("name", code),
            ("phase", phase),
            ("op", op),
            ("start_us", opened.ts),
            ("dur_us", ts - opened.ts),
            ("bytes", nbytes),
            ("group", -1),
            ("group_tensors", 0),
            ("group_bytes", -1),
            ("buffer_bytes", -1),
            ("backend", -1),
            ("dtype", dtype),
            ("cached", -1),
            ("occurrence", opened.occurrence),
        ):
            s[k].append(v)
        if phase == PHASE_OP:
            for child in opened.children:
                s["bytes"][child] = nbytes
                s["dtype"][child] = dtype
                if s["op"][child] < 0:
                    s["op"][child] = op
        m = self.m
        for mts, mrank in opened.marks:
            m["observer"].append(0)
            m["tensor"].append(tensor)
            m["ts_us"].append(mts)
            m["ready_rank"].append(mrank)
            m["slice"].append(row)

    def _mark(self, e: Any) -> None:
        pid = int(e["pid"])
        name = str(e["name"])
        ts = _time(e["ts"])
        stack = self.stacks.get(pid)
        if name.isdigit() and stack and self.info(stack[-1].name)[0] == PHASE_NEGOTIATE:
            if len(name) > 9 or int(name) >= self.max_ranks:
                raise ValueError(
                    f"rank {name[:20]} is past the largest world size ({self.max_ranks})"
                )
            stack[-1].marks.append((ts, int(name)))
            self.ranks.add(int(name))


def _infer_groups(a: dict[str, np.ndarray], tables: Tables) -> None:
    """Fusion groups: ops whose backend call began at the same instant with the same name."""
    coll = np.flatnonzero(a["phase"] == PHASE_COLLECTIVE)
    if not len(coll):
        return
    keys = np.stack([a["start_us"][coll], a["name"][coll].astype(np.float64)], axis=1)
    _, group_of = np.unique(keys, axis=0, return_inverse=True)
    group_of = group_of.reshape(-1)
    # each op row (and its children) gets the group of its collective child: the op row
    # of a child is the nearest earlier-starting OP row of the same tensor containing it
    op_rows = np.flatnonzero(a["phase"] == PHASE_OP)
    by_tensor: dict[int, np.ndarray] = {}
    for t in np.unique(a["tensor"][op_rows]):
        rows = op_rows[a["tensor"][op_rows] == t]
        by_tensor[int(t)] = rows[np.argsort(a["start_us"][rows], kind="stable")]
    op_group: dict[int, int] = {}
    for c, g in zip(coll.tolist(), group_of.tolist(), strict=True):
        rows = by_tensor.get(int(a["tensor"][c]))
        if rows is None:
            continue
        k = int(np.searchsorted(a["start_us"][rows], a["start_us"][c], side="right")) - 1
        if k >= 0:
            op_group[int(rows[k])] = g
    members: dict[int, list[int]] = {}
    for row, g in op_group.items():
        members.setdefault(g, []).append(row)
    memcpy_groups: set[int] = set()
    for row in np.flatnonzero(a["phase"] == PHASE_MEMCPY_IN).tolist():
        rows = by_tensor.get(int(a["tensor"][row]))
        if rows is None:
            continue
        k = int(np.searchsorted(a["start_us"][rows], a["start_us"][row], side="right")) - 1
        if k >= 0 and int(rows[k]) in op_group:
            memcpy_groups.add(op_group[int(rows[k])])
    for g, rows in members.items():
        total = int(sum(max(int(a["bytes"][r]), 0) for r in rows))
        for r in rows:
            a["group"][r] = g
            a["group_tensors"][r] = len(rows)
            a["group_bytes"][r] = total
            a["buffer_bytes"][r] = total if g in memcpy_groups else 0
    # children inherit from their op
    for t, rows in by_tensor.items():
        kids = np.flatnonzero((a["tensor"] == t) & (a["phase"] > PHASE_OP) & (a["phase"] < 7))
        if not len(kids):
            continue
        k = np.searchsorted(a["start_us"][rows], a["start_us"][kids], side="right") - 1
        ok = k >= 0
        parents = rows[k[ok]]
        for col in ("group", "group_tensors", "group_bytes", "buffer_bytes"):
            a[col][kids[ok]] = a[col][parents]
    backend = tables.backends.code("GLOO")  # Horovod names its backend in the slice names
    names = tables.names.items
    for code in np.unique(a["name"][coll]).tolist():
        prefix = names[code].partition("_")[0]
        b = tables.backends.code(prefix) if prefix else backend
        sel = (a["name"] == code) & (a["phase"] == PHASE_COLLECTIVE)
        a["backend"][sel] = b


#: Horovod's fusion threshold when ``HOROVOD_FUSION_THRESHOLD`` is not set (64 MiB): its
#: timeline does not record the one in force
HOROVOD_DEFAULT_THRESHOLD = 64 << 20
HOROVOD_CAPABILITIES = Capabilities(default_fusion_threshold_bytes=HOROVOD_DEFAULT_THRESHOLD)


# --- the format -----------------------------------------------------------------------------


class HorovodFormat:
    """Horovod's ``HOROVOD_TIMELINE``: one file holding every rank (each file a run)."""

    name = "horovod"
    incremental = False
    last_resort = False

    def detect_dir(self, directory: str, names: list[str]) -> Detection:
        found = Detection(self.name)
        for name in names:
            full = os.path.join(directory, name)
            if not name.endswith(TRACE_SUFFIXES) or not os.path.isfile(full):
                continue
            if _is_horovod(full):
                found.files.append(FoundFile(full, 0))
            elif name.endswith(".gz") and (why := _cut_too_soon(full)):
                found.problems.append(Problem(full, "gzip", why))
        return found

    def holds_run(self, directory: Path, entries: list[Path]) -> bool:
        return False  # each timeline is a run of its own (see single_file_run)

    def part_of_run(self, path: Path) -> bool:
        return False

    def detect_file(self, path: str) -> Detection | None:
        return Detection(self.name, [FoundFile(path, 0)]) if _is_horovod(path) else None

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        data, opened, whole = read_horovod_bytes(path)
        cols, problems, complete, events, ranks = parse_horovod(path, data, tables)
        if not whole:  # a cut .gz: said once (not again as a cut last event, a missing ']')
            said = ("no closing ']'", "incomplete event at the end")
            problems = [p for p in problems if not p.reason.startswith(said)]
        return FileRead(cols, opened + problems, complete and whole, events, rank, ranks)

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        run.capabilities = HOROVOD_CAPABILITIES


def _is_horovod(path: str) -> bool:
    return looks_like_horovod(read_head(path, 4096))  # (gzip, byte-order mark)


def _cut_too_soon(path: str) -> str | None:
    """Why a ``.gz`` file says nothing of what it holds: its stream ends (cut) before its
    first bytes could be told apart, so no format claims it (None: not so)."""

    try:
        with open(path, "rb") as f:
            raw = f.read(65536 + 1)
    except OSError:
        return None
    if raw[:2] != b"\x1f\x8b" or len(raw) > 65536:
        return None
    inflater = zlib.decompressobj(31)
    try:
        held = inflater.decompress(raw, 4096)
    except zlib.error:
        return None
    if inflater.eof or inflater.unconsumed_tail:
        return None
    return (
        f"not read: its gzip stream is cut after {len(raw):,} bytes, which held "
        f"{len(held):,} bytes: too few to tell what trace it was"
    )
