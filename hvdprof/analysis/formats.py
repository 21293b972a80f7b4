"""The registry of trace formats: which files make a run, and how each file is read.

Every format is one :class:`TraceFormat` registered here once. The loader
(:mod:`hvdprof.analysis.loader`) and the dashboard's catalog
(:mod:`hvdprof.dashboard.catalog`) both ask this registry what a directory or a file
holds, so a new format is a new entry (:func:`register`), not edits in the loader, the
catalog and the CLI. The order of :data:`FORMATS` is the order of the questions:
hvdprof's own timelines first (a directory that has them is an hvdprof run whatever
else it holds), then torch.profiler (Kineto) traces, then Horovod's single timeline.

A format answers three things:

- ``detect_dir``: its files in a directory, with their ranks, and what it found but
  could not use (a :class:`Detection`);
- ``detect_file``: whether one file given by itself is of this format;
- ``read``: one whole file into a :class:`FileRead`, the same for every format.

hvdprof's own format is read incrementally (appended lines only, a resumable cache,
worker processes for large inputs): the loader keeps that reader, and this registry
says so with ``incremental = True``.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from hvdprof.analysis import byte_order, kineto_format
from hvdprof.analysis.model import Problem
from hvdprof.common import limits
from hvdprof.config import name_of
from hvdprof.timeline.manifest import MANIFEST_RE, TRACE_RE

if TYPE_CHECKING:
    from hvdprof.analysis.hvdprof_format import Columns, Tables
    from hvdprof.analysis.model import Run

#: Suffixes of a file that can be a run by itself (a Horovod timeline, a merged trace).
TRACE_SUFFIXES = (".json", ".json.gz")
#: Files that are never runs by themselves (beside a run's traces).
_NOT_RUNS = ("autotune", "manifest.", "report")
#: Files beside a run's traces that belong to it (the autotuner's log): a change to one
#: is a change to the run.
COMPANION_SUFFIXES = (".csv",)
_RANK_IN_NAME = re.compile(r"rank[._-]?(\d+)")


@dataclass(frozen=True)
class FoundFile:
    """One trace file of a run and the rank it is read as (before the file says better)."""

    path: str
    rank: int


@dataclass
class Detection:
    """What a format found in a directory (or one file): its files, the hvdprof
    manifests beside them, and what it found but will not read (with why)."""

    format: str
    files: list[FoundFile] = field(default_factory=list)
    manifests: dict[int, str] = field(default_factory=dict)
    problems: list[Problem] = field(default_factory=list)


@dataclass
class FileRead:
    """What reading one whole trace file gave, for every format alike: the run's columns,
    what could not be used, and what the run-level pass (:meth:`TraceFormat.finish_run`)
    needs from the file (``detail``, the format's own record)."""

    columns: Columns
    problems: list[Problem]
    complete: bool
    events: int
    rank: int
    ranks_seen: set[int]
    host: str | None = None
    detail: Any = None


class TraceFormat(Protocol):
    """One trace format: how to find its files and read them."""

    #: the run's ``format`` (``Run.format``)
    name: str
    #: read by the loader's incremental reader (appended lines, resumable cache, worker
    #: processes) rather than by :meth:`read` (read whole on each change, never cached)
    incremental: bool
    #: tried for a single file after every other format (it claims any file)
    last_resort: bool

    def detect_dir(self, directory: str, names: list[str]) -> Detection:
        """Its files among ``names`` (sorted) of ``directory``; problems even when none."""
        ...

    def holds_run(self, directory: Path, entries: list[Path]) -> bool:
        """Cheap: is ``directory`` a run of this format (the catalog's question)? A
        format whose files are each a run of their own (Horovod) answers False."""
        ...

    def part_of_run(self, path: Path) -> bool:
        """Is ``path``, in a run directory, one of the run's files (its signature)?"""
        ...

    def detect_file(self, path: str) -> Detection | None:
        """``path`` given by itself, when it is of this format."""
        ...

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        """One whole file (``files_in_run``: how many trace files the run has)."""
        ...

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        """The pass over every file of the run once they are assembled (or nothing)."""
        ...


# --- shared helpers -------------------------------------------------------------------------


def brief(exc: BaseException | str) -> str:
    """An exception's message in one line of at most 200 characters."""
    text = " ".join(str(exc).split()) or "no message"
    return text if len(text) <= 200 else text[:197] + "..."


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, for a problem's reason."""
    for test, what in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    ):
        if test(mode):
            return f"{what}, not a regular file"
    return "not a regular file"


def not_a_file(path: str) -> str | None:
    """Why a path named like a trace is not one to read (a directory, a FIFO, a link to
    a directory, a link loop), or None for a regular file."""
    try:
        st = os.stat(path)
    except OSError as exc:
        if os.path.islink(path):
            return f"a symbolic link that leads nowhere readable ({exc.strerror})"
        return f"cannot read ({exc.strerror})"
    if stat.S_ISREG(st.st_mode):
        return None
    what = file_kind(st.st_mode)
    return f"a link to {what}" if os.path.islink(path) else what


def rank_of_name(digits: str) -> int | None:
    """A rank number from a file name, None past the largest world size (``Config.read_max_ranks``)."""
    if len(digits) > 9 or int(digits) >= limits.max_ranks():
        return None
    return int(digits)


def max_ranks_name() -> str:
    return name_of("read_max_ranks")


def _whole_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# --- the built-in formats -------------------------------------------------------------------


class HvdprofFormat:
    """hvdprof's own ``rank.<r>.json[.gz]`` with ``manifest.rank.<r>.json`` (read by the
    loader's incremental reader)."""

    name = "hvdprof"
    incremental = True
    last_resort = True

    def detect_dir(self, directory: str, names: list[str]) -> Detection:
        found = Detection(self.name)
        traces: dict[int, str] = {}
        for name in names:
            full = os.path.join(directory, name)
            if (TRACE_RE.match(name) or MANIFEST_RE.match(name)) and (why := not_a_file(full)):
                found.problems.append(Problem(full, "", f"not read: {why}"))
                continue
            if m := TRACE_RE.match(name):
                rank = rank_of_name(m.group(1))
                if rank is None:
                    found.problems.append(
                        Problem(
                            full,
                            "file name",
                            f"rank {brief(m.group(1))[:20]} is past the largest world size "
                            f"({limits.max_ranks()}, {max_ranks_name()}): not read",
                        )
                    )
                    continue
                if rank in traces:
                    older, newer = sorted((traces[rank], full), key=os.path.getmtime)
                    found.problems.append(
                        Problem(
                            older,
                            "",
                            f"rank {rank} also has {os.path.basename(newer)}; using the newer",
                        )
                    )
                    full = newer
                traces[rank] = full
            elif (m := MANIFEST_RE.match(name)) and (r := rank_of_name(m.group(1))) is not None:
                found.manifests[r] = full
        found.files = [FoundFile(full, rank) for rank, full in sorted(traces.items())]
        return found

    def holds_run(self, directory: Path, entries: list[Path]) -> bool:
        return any(TRACE_RE.match(p.name) or MANIFEST_RE.match(p.name) for p in entries)

    def part_of_run(self, path: Path) -> bool:
        return bool(TRACE_RE.match(path.name) or MANIFEST_RE.match(path.name))

    def detect_file(self, path: str) -> Detection:
        name = os.path.basename(path)
        m = TRACE_RE.match(name) or _RANK_IN_NAME.search(name)
        rank = (rank_of_name(m.group(1)) if m else 0) or 0
        found = Detection(self.name, [FoundFile(path, rank)])
        manifest = os.path.join(os.path.dirname(path) or ".", f"manifest.rank.{rank}.json")
        if os.path.exists(manifest):
            found.manifests[rank] = manifest
        return found

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        raise NotImplementedError("hvdprof timelines are read incrementally by the loader")

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        return None


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
                if kineto_format.is_kineto_file(full):
                    files.append(full)
            elif kineto_format.KINETO_NAME_RE.match(n):
                found.problems.append(Problem(full, "", f"not read: {why}"))
        taken: dict[int, str] = {}
        unranked = []
        for full in files:
            rank = kineto_format.sniff_rank(full, len(files))
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
        return bool(kineto_format.KINETO_NAME_RE.match(path.name)) or self._is_trace(path)

    @staticmethod
    def _is_trace(path: Path) -> bool:
        return (
            path.name.endswith(TRACE_SUFFIXES)
            and path.is_file()
            and kineto_format.is_kineto_file(str(path))
        )

    def detect_file(self, path: str) -> Detection | None:
        if not kineto_format.is_kineto_file(path):
            return None
        rank = kineto_format.sniff_rank(path, 1)
        return Detection(self.name, [FoundFile(path, 0 if rank is None else rank)])

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        from hvdprof.analysis.hvdprof_format import Columns

        k = kineto_format.parse_kineto(path, _whole_bytes(path), rank, tables, files_in_run)
        cols = Columns()
        cols.slice_chunks.append(k.slices)
        cols.rows = len(k.slices["rank"])
        return FileRead(cols, k.problems, k.complete, k.events, k.rank, {k.rank}, k.host, k)

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        kineto_format.finish_run(run, [r.detail for r in reads], tables)


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
        from hvdprof.analysis.horovod_format import parse_horovod, read_horovod_bytes

        data, opened, whole = read_horovod_bytes(path)
        cols, problems, complete, events, ranks = parse_horovod(path, data, tables)
        if not whole:  # a cut .gz: said once (not again as a cut last event, a missing ']')
            said = ("no closing ']'", "incomplete event at the end")
            problems = [p for p in problems if not p.reason.startswith(said)]
        return FileRead(cols, opened + problems, complete and whole, events, rank, ranks)

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        return None


def _is_horovod(path: str) -> bool:
    from hvdprof.analysis.horovod_format import looks_like_horovod

    return looks_like_horovod(kineto_format.read_head(path, 4096))  # (gzip, byte-order mark)


def _cut_too_soon(path: str) -> str | None:
    """Why a ``.gz`` file says nothing of what it holds: its stream ends (cut) before its
    first bytes could be told apart, so no format claims it (None: not so)."""
    import zlib

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


# --- the registry ---------------------------------------------------------------------------

#: every format, in the order detection asks them
FORMATS: list[TraceFormat] = [HvdprofFormat(), KinetoFormat(), HorovodFormat()]


def register(fmt: TraceFormat, *, before: str | None = None) -> None:
    """Add a format (last, or before the one named ``before``); a format of the same
    name is replaced."""
    unregister(fmt.name)
    names = [f.name for f in FORMATS]
    FORMATS.insert(names.index(before) if before in names else len(FORMATS), fmt)


def unregister(name: str) -> None:
    FORMATS[:] = [f for f in FORMATS if f.name != name]


def format_named(name: str) -> TraceFormat:
    for fmt in FORMATS:
        if fmt.name == name:
            return fmt
    raise KeyError(f"no trace format named {name!r}")


def detect_directory(directory: str, names: list[str]) -> Detection:
    """The first format (in :data:`FORMATS` order) with files in ``directory``; its
    detection carries what every format asked before it found but would not read (and
    their manifests). No files at all: the detection of none, with those problems."""
    problems: list[Problem] = []
    manifests: dict[int, str] = {}
    for fmt in FORMATS:
        found = fmt.detect_dir(directory, names)
        problems += found.problems
        manifests.update(found.manifests)
        if found.files:
            found.problems, found.manifests = problems, manifests
            return found
    return Detection("", [], manifests, problems)


def detect_file(path: str) -> Detection:
    """The format of one file given by itself; the last-resort format (hvdprof's) when no
    other claims it."""
    ordered = sorted(FORMATS, key=lambda f: f.last_resort)
    for fmt in ordered:
        found = fmt.detect_file(path)
        if found is not None:
            return found
    raise LookupError(f"{path}: no trace format claims it")


def run_format_of(directory: Path, entries: list[Path]) -> str | None:
    """The format of the run ``directory`` is (its sorted ``entries``), or None when it is
    no run of per-rank files (the dashboard's catalog asks)."""
    for fmt in FORMATS:
        if fmt.holds_run(directory, entries):
            return fmt.name
    return None


def part_of_run(path: Path) -> bool:
    """Is ``path`` one of the files of the run directory it is in?"""
    return path.suffix in COMPANION_SUFFIXES or any(fmt.part_of_run(path) for fmt in FORMATS)


def single_file_run(path: Path) -> bool:
    """Can ``path`` be a run by itself (a Horovod timeline, a merged trace)? Cheap: its
    name and its first 4 KiB."""
    if not path.name.endswith(TRACE_SUFFIXES):
        return False
    if any(path.name.startswith(prefix) for prefix in _NOT_RUNS):
        return False
    if path.name.endswith(".gz"):
        return True
    try:
        with path.open("rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    head = byte_order.head_as_utf8(head).lstrip()
    return (head[:1] in (b"[", b"{") and b'"ph"' in head) or b"traceEvents" in head


__all__ = [
    "FORMATS",
    "Detection",
    "FileRead",
    "FoundFile",
    "TraceFormat",
    "detect_directory",
    "detect_file",
    "format_named",
    "part_of_run",
    "register",
    "run_format_of",
    "single_file_run",
    "unregister",
]
