"""Chrome-trace JSON as whole events (dicts): one file, or a run directory of them.

The trace layer's reader for what passes events on unchanged: ``hvdprof timeline merge``
(its ``--kineto`` traces included: every event is written back, shifted), the Horovod
reader's fallback for a cut file, and tests. The analyses never read events as dicts:
each format's reader (:mod:`hvdprof.trace.formats`) turns its files into columns,
torch.profiler's with typed structs that keep only the fields it uses. It accepts what
Chrome and Perfetto accept: a JSON array of events, possibly without its closing ``]`` and
cut anywhere (a crash, SIGKILL, a full disk), or a ``{"traceEvents": [...]}`` object such
as torch.profiler writes, plain or gzipped. Unlike tools that drop what they cannot parse
without a word, every event it could not use is listed in :attr:`Trace.skipped` with where
and why.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import zlib
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from hvdprof.common import limits
from hvdprof.trace.manifest import MANIFEST_RE, TRACE_RE, Manifest, read_manifest

_GZIP_MAGIC = b"\x1f\x8b"
_CHUNK = 1 << 16
_SEPARATORS = re.compile(r"[\s,]*")
_TRACE_EVENTS_KEY = re.compile(r'"traceEvents"\s*:\s*\[')
_NEXT_OBJECT = re.compile(r"\n[ \t]*\{")


class Skip(NamedTuple):
    """Something in a trace that did not become an event: where (1-based line of the
    decompressed text, 0 when not known) and why."""

    line: int
    reason: str


@dataclass
class Trace:
    """The events of one trace file and an account of what was not usable."""

    path: str
    events: list[dict[str, Any]]
    #: what could not be read, with where and why (never silently dropped)
    skipped: list[Skip] = field(default_factory=list)
    #: True when the file was syntactically complete (closing ``]`` present)
    complete: bool = False
    #: top-level keys besides ``traceEvents`` of an object-form trace (e.g. Kineto's
    #: ``baseTimeNanoseconds`` and ``distributedInfo``)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: remarks about the container rather than events (e.g. a truncated gzip stream)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.events)


def load_trace(path: str) -> Trace:
    """Load a ``.json`` or ``.json.gz`` Chrome trace, complete or truncated anywhere."""
    path = os.fspath(path)
    if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block the open: never open it
        raise OSError(errno.EINVAL, "not a regular file (a directory, a FIFO ...)", path)
    with open(path, "rb") as f:
        raw = f.read()
    notes: list[str] = []
    if path.endswith(".gz") or raw[:2] == _GZIP_MAGIC:
        raw = _gunzip_tolerant(raw, notes)
    text = _decode(raw, notes)
    trace = parse_trace_text(text, path)
    trace.notes[:0] = notes
    return trace


def _gunzip_tolerant(raw: bytes, notes: list[str]) -> bytes:
    """Decompress every gzip member, keeping all output up to a truncation or corruption,
    within the bounds of :mod:`hvdprof.common.limits` (past them: what came before)."""
    out: list[bytes] = []
    inflater = limits.Inflater()
    chunk_start = 0
    try:
        while chunk_start < len(raw):
            chunk = raw[chunk_start : chunk_start + _CHUNK]
            out.append(inflater.feed(chunk))
            chunk_start += len(chunk)
    except zlib.error as exc:
        notes.append(
            f"gzip data is corrupt near compressed byte {chunk_start} ({exc}); "
            "only the data before it was read"
        )
        return b"".join(out)
    except limits.InflateLimitError as exc:
        notes.append(f"the gzip stream {exc}")
        return b"".join(out)
    if not inflater.eof:
        notes.append("gzip stream is truncated (no end marker): read up to the last flushed batch")
    return b"".join(out)


def _decode(raw: bytes, notes: list[str]) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(raw) - 3 and exc.reason == "unexpected end of data":
            return raw[: exc.start].decode("utf-8")  # a character cut by truncation
        notes.append(f"invalid UTF-8 at byte {exc.start}; such bytes were replaced by U+FFFD")
        return raw.decode("utf-8", errors="replace")


def _line_of(text: str, pos: int) -> int:
    return text.count("\n", 0, pos) + 1


def _accept(
    obj: Any, line: int, where: str, events: list[dict[str, Any]], skipped: list[Skip]
) -> None:
    if not isinstance(obj, dict):
        skipped.append(Skip(line, f"{where}: not a JSON object ({type(obj).__name__})"))
    elif not isinstance(obj.get("ph"), str):
        skipped.append(Skip(line, f"{where}: event without a 'ph' phase"))
    else:
        events.append(obj)


def parse_trace_text(text: str, path: str = "<text>") -> Trace:
    """Parse trace text (see :func:`load_trace`); exposed for tests and in-memory traces."""
    events: list[dict[str, Any]] = []
    skipped: list[Skip] = []
    stripped = text.lstrip("\ufeff \t\r\n")
    if not stripped:
        return Trace(path, events, [Skip(1, "empty file: no JSON array or object")], False)

    # Fast path: a complete file.
    try:
        data = json.loads(text.lstrip("\ufeff"))
    except (json.JSONDecodeError, RecursionError):  # (nesting too deep: event by event)
        data = None
    if data is not None:
        metadata: dict[str, Any] = {}
        if isinstance(data, dict) and isinstance(data.get("traceEvents"), list):
            metadata = {k: v for k, v in data.items() if k != "traceEvents"}
            items = data["traceEvents"]
        elif isinstance(data, list):
            items = data
        else:
            return Trace(path, events, [Skip(1, "valid JSON but not a Chrome trace")], True)
        for index, obj in enumerate(items):
            if isinstance(obj, dict) and isinstance(obj.get("ph"), str):
                events.append(obj)
            else:
                _accept(obj, 0, f"element {index}", events, skipped)
        return Trace(path, events, skipped, True, metadata)

    # Tolerant path: find the array, then read event by event.
    offset = len(text) - len(stripped)
    if stripped[0] == "[":
        start = offset + 1
    elif stripped[0] == "{":
        match = _TRACE_EVENTS_KEY.search(text)
        if match is None:
            return Trace(
                path, events, [Skip(1, "an incomplete JSON object without a 'traceEvents' array")]
            )
        start = match.end()
    else:
        return Trace(
            path, events, [Skip(1, "neither a JSON array nor an object: not a Chrome trace")]
        )
    complete = _scan(text, start, events, skipped)
    return Trace(path, events, skipped, complete)


def _scan(text: str, pos: int, events: list[dict[str, Any]], skipped: list[Skip]) -> bool:
    """Read events from ``pos`` to the closing ``]`` or the end; True if ``]`` was found."""
    n = len(text)
    # Most truncated files are intact up to their last ",\n": parse that prefix in one go.
    cut = text.rfind(",\n", pos)
    if cut > pos:
        try:
            prefix = json.loads("[" + text[pos:cut] + "]")
        except (json.JSONDecodeError, RecursionError):
            prefix = None
        if prefix is not None:
            first_line = _line_of(text, pos)
            for index, obj in enumerate(prefix):
                _accept(obj, 0, f"element {index} (after line {first_line})", events, skipped)
            pos = cut + 1
    decoder = json.JSONDecoder()
    while True:
        pos = _SEPARATORS.match(text, pos).end()
        if pos >= n:
            return False
        if text[pos] == "]":
            return True
        try:
            obj, end = decoder.raw_decode(text, pos)
        except (json.JSONDecodeError, RecursionError) as exc:
            line = _line_of(text, pos)
            nxt = _NEXT_OBJECT.search(text, pos)
            if nxt is None:
                skipped.append(
                    Skip(
                        line,
                        f"incomplete event at the end of the file ({n - pos} characters cut off)",
                    )
                )
                return False
            skipped.append(
                Skip(
                    line,
                    f"invalid JSON ({getattr(exc, 'msg', 'nested too deep')}); skipped to "
                    f"line {_line_of(text, nxt.start() + 1)}",
                )
            )
            pos = nxt.start() + 1
            continue
        if isinstance(obj, dict) and isinstance(obj.get("ph"), str):
            events.append(obj)
        else:
            _accept(obj, _line_of(text, pos), "event", events, skipped)
        pos = end


# --- whole runs ------------------------------------------------------------------------------


@dataclass
class RankTrace:
    """One rank of a run: its trace and its typed manifest (None when missing)."""

    rank: int
    trace: Trace
    manifest: Manifest | None
    trace_path: str
    manifest_path: str | None


@dataclass
class TraceDirectory:
    """Every rank's trace and manifest in one directory, as raw events, with problems
    found across files (the analysis' columnar :class:`hvdprof.analysis.Run` is another
    thing: this is what merging and the tests read)."""

    directory: str
    ranks: dict[int, RankTrace] = field(default_factory=dict)
    #: inconsistencies (missing manifests, mixed runs, dropped events), in words
    problems: list[str] = field(default_factory=list)

    @property
    def traces(self) -> dict[int, Trace]:
        return {r: rt.trace for r, rt in self.ranks.items()}

    @property
    def manifests(self) -> dict[int, Manifest | None]:
        return {r: rt.manifest for r, rt in self.ranks.items()}


def load_traces(directory: str) -> TraceDirectory:
    """Load ``rank.<r>.json[.gz]`` and ``manifest.rank.<r>.json`` of every rank in ``directory``."""
    directory = os.fspath(directory)
    run = TraceDirectory(directory)
    traces: dict[int, str] = {}
    manifests: dict[int, str] = {}
    for name in sorted(os.listdir(directory)):
        full = os.path.join(directory, name)
        if (TRACE_RE.match(name) or MANIFEST_RE.match(name)) and not os.path.isfile(full):
            # a directory, a FIFO (opening it would block), a dangling link or a loop
            run.problems.append(f"{name}: not a regular file; not read")
            continue
        if m := TRACE_RE.match(name):
            rank = int(m.group(1))
            if rank in traces:
                older, newer = sorted((traces[rank], full), key=os.path.getmtime)
                run.problems.append(
                    f"rank {rank} has both {os.path.basename(older)} and {os.path.basename(newer)}; using the newer"
                )
                full = newer
            traces[rank] = full
        elif m := MANIFEST_RE.match(name):
            manifests[int(m.group(1))] = full
    if not traces:
        run.problems.append(f"no rank.<r>.json timeline files in {directory}")
    known: list[Manifest] = []
    for rank in sorted(traces):
        manifest = None
        mpath = manifests.get(rank)
        if mpath is None:
            run.problems.append(f"rank {rank}: no manifest (clock and drop counts unknown)")
        else:
            try:
                manifest = read_manifest(mpath)
            except (OSError, ValueError) as exc:
                run.problems.append(f"rank {rank}: unreadable manifest: {exc}")
        trace = load_trace(traces[rank])
        run.ranks[rank] = RankTrace(rank, trace, manifest, traces[rank], mpath)
        if not trace.complete:
            run.problems.append(
                f"rank {rank}: {os.path.basename(traces[rank])} has no closing ']'"
                " (recording interrupted or file cut); read up to its last complete event"
            )
        if manifest is not None:
            known.append(manifest)
            if manifest.events_dropped:
                run.problems.append(
                    f"rank {rank}: {manifest.events_dropped} events were dropped while recording"
                )
            if not manifest.closed:
                run.problems.append(
                    f"rank {rank}: the recording was not closed cleanly (crash or kill?)"
                )
    for rank in sorted(set(manifests) - set(traces)):
        run.problems.append(f"rank {rank}: manifest without a trace file")
    run_ids = {m.run_id for m in known}
    if len(run_ids) > 1:
        run.problems.append(
            f"files from different runs are mixed (run ids {sorted(map(str, run_ids))})"
        )
    sizes = {m.size for m in known if m.size is not None}
    if len(sizes) > 1:
        run.problems.append(f"manifests disagree on the job size: {sorted(sizes)}")
    elif sizes and (size := sizes.pop()) != len(run.ranks):
        run.problems.append(f"the job had {size} ranks but {len(run.ranks)} timelines were found")
    return run
