"""What every trace format shares: the description of the files it found, what reading
one gave, the format's and the file reader's protocols, and small helpers for file names.

A format is one module with one class following :class:`TraceFormat`, registered once in
:mod:`hvdprof.trace.formats`; the loader (:mod:`hvdprof.trace.loader`) reads every file of
every format through a :class:`FileReader` (:func:`open_reader`), so nothing outside the
format's module knows how its files look.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from hvdprof.common import limits
from hvdprof.config import name_of
from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.model import Problem

if TYPE_CHECKING:
    from hvdprof.trace.model import Run

#: Suffixes of a file that can be a run by itself (a Horovod timeline, a merged trace).
TRACE_SUFFIXES = (".json", ".json.gz")


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
    #: written while it is read: :meth:`open` gives a reader that reads only what was
    #: appended, whose columns are cached beside the trace (and continued from there)
    #: and parsed in worker processes for large runs, and the run's directory is watched
    #: for files of new ranks. False: :meth:`read` on each change, never cached.
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
        """The pass over every file of the run once they are assembled (or nothing): the
        run-level work of the format, and what the run can answer
        (:class:`~hvdprof.trace.model.Capabilities`)."""
        ...


class IncrementalFormat(TraceFormat, Protocol):
    """A format whose files grow while they are read (``incremental = True``)."""

    def open(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileReader:
        """A reader of ``path`` that keeps its place between reads."""
        ...


class FileReader(Protocol):
    """One file of a run, read again as it changes. :attr:`got` is what the reads so far
    gave, the same :class:`FileRead` for every format; the loader keeps the file's size
    and time, its cache and its worker processes, and asks the reader only to read."""

    got: FileRead

    def read(self, size: int, progress: Callable[[int], None] | None) -> None:
        """Read the file (now ``size`` bytes): from where the last read stopped when
        :meth:`continues` said so, else from the start (after :meth:`restart`)."""
        ...

    def restart(self) -> None:
        """Forget what was read: the next read starts from the first byte."""
        ...

    def continues(self, size: int) -> bool:
        """Can a file now of ``size`` bytes be read from where the last read stopped (it
        was only appended to)?"""
        ...

    def where(self) -> str:
        """Where the reader is (``"line 12"``), for a problem that stops it there."""
        ...

    def state(self) -> tuple[dict[str, Any], int, int] | None:
        """What continuing needs (parser state, byte offset, line), for the cache; None
        when the file cannot be continued (a gzip stream, a format read whole)."""
        ...

    def adopt(self, got: FileRead, state: tuple[dict[str, Any], int, int] | None) -> None:
        """Take columns read before (a cache, a worker process); with ``state``, later
        reads continue from there."""
        ...


class WholeFileReader:
    """A format read whole on each change (:meth:`TraceFormat.read`), never continued."""

    def __init__(self, fmt: TraceFormat, path: str, rank: int, tables: Tables, files_in_run: int):
        self.fmt, self.path, self.tables, self.files_in_run = fmt, path, tables, files_in_run
        self.got = empty_read(rank)

    def read(self, size: int, progress: Callable[[int], None] | None) -> None:
        self.got = self.fmt.read(self.path, self.got.rank, self.tables, self.files_in_run)
        if progress:
            progress(size)

    def restart(self) -> None:
        self.got = empty_read(self.got.rank)

    def continues(self, size: int) -> bool:
        return False

    def where(self) -> str:
        return ""

    def state(self) -> tuple[dict[str, Any], int, int] | None:
        return None

    def adopt(self, got: FileRead, state: tuple[dict[str, Any], int, int] | None) -> None:
        self.got = got


def open_reader(
    fmt: TraceFormat, path: str, rank: int, tables: Tables, files_in_run: int
) -> FileReader:
    """The reader of one file of ``fmt``: its own for an incremental format, else one
    that reads the whole file on each change."""
    if fmt.incremental:
        return cast("IncrementalFormat", fmt).open(path, rank, tables, files_in_run)
    return WholeFileReader(fmt, path, rank, tables, files_in_run)


def empty_read(rank: int) -> FileRead:
    """Nothing read yet (or nothing kept) of rank ``rank``'s file."""
    return FileRead(Columns(), [], False, 0, rank, {rank})


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


def whole_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()
