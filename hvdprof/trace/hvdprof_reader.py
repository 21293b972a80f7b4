"""Reading hvdprof's own timelines as they grow: the file reader and the format.

hvdprof's writer emits one event per line, so a plain ``rank.<r>.json`` is read in blocks
of whole lines and the byte offset of the last whole line is kept: a later read (a
:meth:`hvdprof.trace.model.Run.refresh`, or a cache written while the file was still
growing) parses only what was appended. A ``.json.gz`` is inflated from its start on each
change (a gzip stream cannot be continued from an offset in the file). The parsing of
lines into columns is :class:`hvdprof.trace.hvdprof_format.HvdprofFileParser`.
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hvdprof.common import limits
from hvdprof.trace.columns import Tables
from hvdprof.trace.files import (
    Detection,
    FileRead,
    FoundFile,
    brief,
    max_ranks_name,
    not_a_file,
    rank_of_name,
)
from hvdprof.trace.hvdprof_format import HvdprofFileParser
from hvdprof.trace.manifest import MANIFEST_RE, RANK_IN_NAME, TRACE_RE
from hvdprof.trace.model import PARTIAL_TAIL, Problem, Run

#: bytes read per block (whole lines are cut from it)
BLOCK_BYTES = 8 << 20
#: one line of an hvdprof file longer than this is not an event (a file of spaces)
MAX_LINE_BYTES = 64 << 20


class HvdprofFileReader:
    """One ``rank.<r>.json[.gz]``, read from where the last read stopped while it is only
    appended to (see :class:`hvdprof.trace.files.FileReader`)."""

    def __init__(self, path: str, rank: int, tables: Tables) -> None:
        self.path = path
        self.tables = tables
        self.gzip = path.endswith(".gz")
        self.offset = 0  # bytes consumed (plain files)
        self.lines = 1  # 1-based number of the next line to read
        self.parser: HvdprofFileParser | None = None
        self.got = FileRead(HvdprofFileParser(path, rank, tables).cols, [], False, 0, rank, {rank})

    # --- the FileReader protocol -----------------------------------------------------------

    def read(self, size: int, progress: Callable[[int], None] | None) -> None:
        if self.parser is None:
            self.restart()
        if self.gzip:
            self._read_gzip(progress)
        else:
            self._read_plain(progress)

    def restart(self) -> None:
        self.offset = 0
        self.lines = 1
        self.parser = HvdprofFileParser(self.path, self.got.rank, self.tables)
        self.got.columns = self.parser.cols
        self.got.problems = self.parser.problems
        self.got.complete = False
        self.got.events = 0

    def continues(self, size: int) -> bool:
        return (
            not self.gzip
            and self.parser is not None
            and size >= self.offset
            and not self.parser.closed
        )

    def where(self) -> str:
        return f"line {self.lines}"

    def state(self) -> tuple[dict[str, Any], int, int] | None:
        if self.gzip or self.parser is None:
            return None
        return self.parser.export_state(), self.offset, self.lines

    def adopt(self, got: FileRead, state: tuple[dict[str, Any], int, int] | None) -> None:
        self.got = got
        self.parser = None  # without its state: read again from the start if the file changes
        if state is not None and not self.gzip:
            parser = HvdprofFileParser(self.path, got.rank, self.tables)
            parser.cols = got.columns
            parser.problems = got.problems
            parser.import_state(state[0])
            self.parser = parser
            self.offset, self.lines = state[1], state[2]

    # --- reading ----------------------------------------------------------------------------

    def _feed(self, data: bytes) -> None:
        parser = self.parser
        assert parser is not None
        parser.feed(data, self.lines)
        self.lines += data.count(b"\n")
        self.got.events = parser.events
        self.got.host = parser.host or self.got.host

    def _read_plain(self, progress: Callable[[int], None] | None) -> None:
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            tail = b""
            while True:
                block = f.read(BLOCK_BYTES)
                if not block:
                    break
                block = tail + block
                cut = block.rfind(b"\n") + 1
                tail = block[cut:]
                if cut:
                    self._feed(block[:cut])
                    self.offset += cut
                if progress:
                    progress(len(block) - len(tail))
                if len(tail) > MAX_LINE_BYTES:
                    self._long_line()
                    return
        if tail.strip() == b"]":  # a closing bracket without its newline
            self._feed(tail)
            self.offset += len(tail)
            tail = b""
        self._finish(tail)

    def _long_line(self) -> None:
        problem = Problem(
            self.path,
            f"line {self.lines}",
            f"a line longer than {MAX_LINE_BYTES} bytes is not an event: not read past it",
        )
        if problem not in self.got.problems:  # (said once, however often a refresh meets it)
            self.got.problems.append(problem)
        if self.parser is not None:
            self.got.complete = self.parser.closed

    def _read_gzip(self, progress: Callable[[int], None] | None) -> None:
        tail = b""
        with open(self.path, "rb") as f:
            raw_pos = 0
            d = limits.Inflater()
            while True:
                raw = f.read(BLOCK_BYTES // 4)
                if not raw:
                    if not d.eof:
                        self.got.problems.append(
                            Problem(
                                self.path,
                                f"byte {raw_pos}",
                                "gzip stream is cut (no end marker): read up to the last whole line",
                            )
                        )
                    break
                try:
                    out = d.feed(raw)
                except zlib.error as exc:
                    self.got.problems.append(
                        Problem(
                            self.path,
                            f"byte {raw_pos}",
                            f"gzip data is corrupt ({exc}); only the data before it was read",
                        )
                    )
                    break
                raw_pos += len(raw)
                block = tail + out
                cut = block.rfind(b"\n") + 1
                tail = block[cut:]
                if cut:
                    self._feed(block[:cut])
                if progress:
                    progress(len(raw))
                if len(tail) > MAX_LINE_BYTES:
                    self._long_line()
                    return
        if tail.strip() == b"]":
            self._feed(tail)
            tail = b""
        self._finish(tail)

    def _finish(self, tail: bytes) -> None:
        parser = self.parser
        assert parser is not None
        self.got.complete = parser.closed
        # problems that describe the end of the file are recomputed on each read
        self.got.problems[:] = [p for p in self.got.problems if not p.where.startswith("end")]
        if tail.strip():
            self.got.problems.append(
                Problem(
                    self.path,
                    f"end (line {self.lines})",
                    f"{PARTIAL_TAIL} ({len(tail)} bytes cut off): still being written, or cut",
                )
            )
        elif not parser.closed and parser.started:
            self.got.problems.append(
                Problem(
                    self.path,
                    "end",
                    "no closing ']' (recording interrupted or still running); read up to its "
                    "last complete event",
                )
            )
        elif not parser.started:
            self.got.problems.append(Problem(self.path, "end", "empty file: no events"))


class HvdprofFormat:
    """hvdprof's own ``rank.<r>.json[.gz]`` with ``manifest.rank.<r>.json``, read as they
    grow (:class:`HvdprofFileReader`)."""

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
        m = TRACE_RE.match(name) or RANK_IN_NAME.search(name)
        rank = (rank_of_name(m.group(1)) if m else 0) or 0
        found = Detection(self.name, [FoundFile(path, rank)])
        manifest = os.path.join(os.path.dirname(path) or ".", f"manifest.rank.{rank}.json")
        if os.path.exists(manifest):
            found.manifests[rank] = manifest
        return found

    def open(self, path: str, rank: int, tables: Tables, files_in_run: int) -> HvdprofFileReader:
        return HvdprofFileReader(path, rank, tables)

    def read(self, path: str, rank: int, tables: Tables, files_in_run: int) -> FileRead:
        reader = HvdprofFileReader(path, rank, tables)
        reader.read(os.path.getsize(path), None)
        return reader.got

    def finish_run(self, run: Run, reads: list[FileRead], tables: Tables) -> None:
        return None
