"""``load_run``: a directory (or one file) of traces into a columnar :class:`Run`.

What it accepts: whatever a format in the registry (:mod:`hvdprof.trace.formats`) finds:
hvdprof's ``rank.<r>.json`` / ``.json.gz`` with their manifests (complete, cut by a crash,
or still being written), torch.profiler traces and Horovod's ``HOROVOD_TIMELINE`` files.
Every block it could not use becomes a :class:`Problem` (file, line or byte, reason).

Each file is read by its format's reader (:class:`hvdprof.trace.files.FileReader`); this
module keeps what every format shares. A file of a format written while it is read
(``incremental``) is read again only for what was appended (:meth:`Run.refresh`), and its
parsed columns can be kept in a cache beside the trace (``.hvdprof-cache/<file>.npz``,
keyed by the file's size and modification time; a directory we cannot write to just goes
uncached); a large run of such files is parsed by worker processes, one file each.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import sys
import zipfile
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from hvdprof.common import limits
from hvdprof.errors import HvdprofError
from hvdprof.trace import formats
from hvdprof.trace.columns import Columns, Tables
from hvdprof.trace.files import FileRead, FileReader, TraceFormat, empty_read
from hvdprof.trace.files import brief as _brief
from hvdprof.trace.files import file_kind as _file_kind
from hvdprof.trace.files import max_ranks_name as _max_ranks_name
from hvdprof.trace.files import not_a_file as _not_a_file
from hvdprof.trace.manifest import read_manifest
from hvdprof.trace.model import (
    MARK_COLUMNS,
    SLICE_COLUMNS,
    AutotuneSample,
    MarkTable,
    Notice,
    ParamsChange,
    Problem,
    Run,
    SliceTable,
    StallRecord,
)

_log = logging.getLogger("hvdprof.analysis")

CACHE_DIR = ".hvdprof-cache"
#: inputs larger than this (bytes, all files) are parsed by a pool of processes
PARALLEL_MIN_BYTES = 32 << 20
#: bumped when the cached columns change meaning
CACHE_VERSION = 4
#: bytes before the parsed offset whose checksum tells an appended file from a rewritten one
FINGERPRINT_BYTES = 4096
#: what a missing, cut or foreign cache file raises on reading (it is then ignored)
_BAD_CACHE = (OSError, KeyError, ValueError, TypeError, EOFError, zipfile.BadZipFile)


class LoadError(HvdprofError):
    """Nothing readable at the path given (the CLI's exit code 2)."""


class _Source:
    """One trace file of the run, how far it has been read, and its cache. What the file
    holds is its format's business (:class:`hvdprof.trace.files.FileReader`): this keeps
    only what every format shares (the file's size and time, the cache, a failure)."""

    def __init__(
        self, path: str, rank: int, fmt: TraceFormat, tables: Tables, files_in_run: int = 1
    ) -> None:
        self.path = path
        self.format = fmt
        self.reader: FileReader = formats.open_reader(fmt, path, rank, tables, files_in_run)
        #: what the last read gave, for the format's run-level pass (None: nothing kept)
        self.whole: FileRead | None = None
        self.size = -1
        self.mtime_ns = -1
        self.tables = tables

    # what the reads so far gave (the reader's, the same for every format)
    @property
    def rank(self) -> int:
        return self.reader.got.rank

    @property
    def columns(self) -> Columns:
        return self.reader.got.columns

    @property
    def problems(self) -> list[Problem]:
        return self.reader.got.problems

    @property
    def complete(self) -> bool:
        return self.reader.got.complete

    @property
    def events(self) -> int:
        return self.reader.got.events

    @property
    def ranks_seen(self) -> set[int]:
        return self.reader.got.ranks_seen

    @property
    def host(self) -> str | None:
        return self.reader.got.host

    # --- reading ----------------------------------------------------------------------------

    def read(self, progress: Callable[[int], None] | None = None) -> bool:
        """Read what is new; True when anything changed. Whatever a file holds, reading it
        ends in columns or problems naming it, never an exception."""
        try:
            return self._read(progress)
        except Exception as exc:  # anything a hostile file provokes: the file, not the run
            where = self.reader.where()
            problems = self.problems
            self.reader.restart()
            self.whole = None
            got = self.reader.got
            got.columns, got.complete, got.events = Columns(), False, 0
            got.problems = [
                *problems,
                Problem(
                    self.path,
                    where,
                    "not read: it needed more memory than this process may have (MemoryError)"
                    if isinstance(exc, MemoryError)
                    else f"not read: {type(exc).__name__}: {_brief(exc)}",
                ),
            ]
            self.reader.adopt(got, None)  # (without a place to continue from)
            return True

    def _read(self, progress: Callable[[int], None] | None = None) -> bool:
        try:
            st = os.stat(self.path)
        except OSError as exc:
            if self.size == -1:
                self._unreadable(f"cannot read ({exc.strerror})")
                return True
            return False
        if not stat.S_ISREG(st.st_mode):  # a directory, a FIFO (never opened: it blocks)
            if self.size == -1:
                self._unreadable(f"not read: {_file_kind(st.st_mode)}")
                return True
            return False
        if st.st_size == self.size and st.st_mtime_ns == self.mtime_ns:
            return False
        if not (self.size >= 0 and self.reader.continues(st.st_size)):
            self.reader.restart()
        self.size, self.mtime_ns = st.st_size, st.st_mtime_ns
        try:
            self.reader.read(st.st_size, progress)
            self.whole = self.reader.got
        except OSError as exc:
            self.problems.append(Problem(self.path, "", f"cannot read ({exc.strerror or exc})"))
        except limits.InflateLimitError as exc:
            self.problems.append(Problem(self.path, "gzip", f"read up to there: it {exc}"))
            self.reader.got.complete = False
        return True

    def _unreadable(self, reason: str) -> None:
        self.reader.got.problems = [Problem(self.path, "", reason)]
        self.size = -2

    @property
    def whole_file(self) -> bool:
        """Read whole on each change, never cached nor parsed in worker processes."""
        return not self.format.incremental

    # --- cache ------------------------------------------------------------------------------

    def cache_path(self) -> str:
        directory, name = os.path.split(self.path)
        return os.path.join(directory, CACHE_DIR, name + ".npz")

    def load_cache(self) -> str | None:
        """Take the columns from the cache when it still describes the file.

        ``"current"``: the file is unchanged; ``"resume"``: the file grew by appending (the
        bytes before the cached offset are the same) and the parser continues from there
        (:meth:`read`); None: no usable cache.
        """
        try:
            with np.load(self.cache_path(), allow_pickle=False) as z:
                meta = orjson.loads(bytes(z["meta"]))
                verdict = self.cache_verdict(meta)
                if verdict is None:
                    return None
                arrays = {k: z[k] for k in z.files if k != "meta"}
            self.import_columns(meta, arrays)
        except _BAD_CACHE:
            self._reset_unread()
            return None
        return verdict

    def cache_verdict(self, meta: dict[str, Any] | None = None) -> str | None:
        """What the cache (its ``meta``, read here when not given) can do for the file as
        it is now: ``"current"``, ``"resume"`` or None (see :meth:`load_cache`). Cheap:
        only the cache's small ``meta`` member is read, not its columns."""
        if self.whole_file:
            return None
        try:
            if meta is None:
                with np.load(self.cache_path(), allow_pickle=False) as z:
                    meta = orjson.loads(bytes(z["meta"]))
            st = os.stat(self.path)
            if meta.get("version") != CACHE_VERSION:
                return None
            if meta["size"] == st.st_size and meta["mtime_ns"] == st.st_mtime_ns:
                return "current"
            if (  # (a state is saved only by a reader that can continue from it)
                meta.get("state") is not None
                and not meta["complete"]
                and st.st_size > meta["size"]
                and _fingerprint(self.path, meta["offset"]) == meta["fingerprint"]
            ):
                return "resume"
        except _BAD_CACHE:
            return None
        return None

    def _reset_unread(self) -> None:
        self.size = self.mtime_ns = -1
        self.reader.restart()
        self.reader.adopt(empty_read(self.rank), None)

    def import_columns(self, meta: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Adopt columns exported by :meth:`export_columns` (cache file or worker process),
        re-coding their strings into this run's tables; with the parser's state, later
        reads continue from where that parse stopped."""
        slices = {k: arrays["s_" + k] for k in SLICE_COLUMNS}
        marks = {k: arrays["m_" + k] for k in MARK_COLUMNS}
        t = self.tables
        for col, table, strings in (
            ("tensor", t.tensors, meta["tensors"]),
            ("name", t.names, meta["names"]),
            ("backend", t.backends, meta["backends"]),
            ("dtype", t.dtypes, meta["dtypes"]),
        ):
            remap = np.array([table.code(x) for x in strings] + [-1], dtype=np.int64)
            slices[col] = remap[slices[col].astype(np.int64)].astype(SLICE_COLUMNS[col])
        remap = np.array([t.tensors.code(x) for x in meta["tensors"]] + [-1], dtype=np.int64)
        marks["tensor"] = remap[marks["tensor"].astype(np.int64)].astype(np.int32)
        cols = Columns()
        cols.slice_chunks = [slices]
        cols.mark_chunks = [marks]
        cols.rows = len(slices["rank"])
        cols.samples = [AutotuneSample(**x) for x in meta["samples"]]
        cols.params = [ParamsChange(**x) for x in meta["params"]]
        cols.notices = [Notice(**x) for x in meta.get("notices", [])]
        cols.stalls = [_stall_from_dict(x) for x in meta.get("stalls", [])]
        cols.counters = {k: [tuple(r) for r in v] for k, v in meta["counters"].items()}
        got = FileRead(
            cols,
            [Problem(**p) for p in meta["problems"]],
            bool(meta["complete"]),
            int(meta["events"]),
            self.rank,
            {self.rank},
            meta.get("host"),
        )
        self.size, self.mtime_ns = int(meta["size"]), int(meta["mtime_ns"])
        state = meta.get("state")
        # without its state: read again from the start if the file changes
        self.reader.adopt(
            got, None if state is None else (state, int(meta["offset"]), int(meta["lines"]))
        )

    def export_columns(self) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
        """Everything read from this file, as plain data (see :meth:`import_columns`)."""
        t = self.tables
        state = self.reader.state()
        meta = {
            "version": CACHE_VERSION,
            "size": self.size,
            "mtime_ns": self.mtime_ns,
            "complete": self.complete,
            "events": self.events,
            "host": self.host,
            "tensors": t.tensors.items,
            "names": t.names.items,
            "backends": t.backends.items,
            "dtypes": t.dtypes.items,
            "samples": [asdict(x) for x in self.columns.samples],
            "params": [asdict(x) for x in self.columns.params],
            "notices": [asdict(x) for x in self.columns.notices],
            "stalls": [_stall_to_dict(x) for x in self.columns.stalls],
            "counters": self.columns.counters,
            "problems": [p.to_dict() for p in self.problems],
            "state": state[0] if state else None,
            "offset": state[1] if state else 0,
            "lines": state[2] if state else 1,
            "fingerprint": _fingerprint(self.path, state[1]) if state else None,
        }
        arrays = {"s_" + k: v for k, v in self.columns.slices().items()}
        arrays.update({"m_" + k: v for k, v in self.columns.marks().items()})
        return meta, arrays

    def save_cache(
        self, exported: tuple[dict[str, Any], dict[str, np.ndarray]] | None = None
    ) -> None:
        """Write the columns (and, for a file still being written, where its parse stopped)
        beside the trace; silently skipped where that is not possible."""
        if self.whole_file or self.size < 0:
            return
        meta, arrays = exported or self.export_columns()
        path = self.cache_path()
        tmp = f"{path}.tmp.{os.getpid()}.npz"
        try:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            np.savez(tmp, meta=np.frombuffer(orjson.dumps(meta), dtype=np.uint8), **arrays)
            os.replace(tmp, path)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _fingerprint(path: str, offset: int) -> int | None:
    """CRC of the bytes just before ``offset``: equal when the file was only appended to."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, offset - FINGERPRINT_BYTES))
            data = f.read(min(offset, FINGERPRINT_BYTES))
    except OSError:
        return None
    return zlib.crc32(data) if len(data) == min(offset, FINGERPRINT_BYTES) else None


def _worker_start(parent: int) -> None:
    """First thing in each parse worker: die with the parent, whatever kills it.

    The workers are forked, so they hold copies of every descriptor the parent had,
    the dashboard's listening socket included. A parent stopped by SIGTERM while they
    parsed left them orphaned, blocked on their pipe, keeping the port (requests hung;
    a restart said "Address already in use"). Linux's parent-death signal ends them
    with the parent; Ctrl+C is the parent's to handle (the workers ignore SIGINT, so a
    terminal's interrupt prints one message, not one traceback per worker).
    """
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(0)


def _read_in_worker(
    path: str, rank: int, name: str, cache: bool
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Parse one file in a worker process (and write its cache there, off the parent's
    path); the result crosses back as plain data."""
    source = _Source(path, rank, formats.format_named(name), Tables())
    source.read()
    exported = source.export_columns()
    if cache:
        source.save_cache(exported)
    return exported


class RunLoader:
    """Finds the files of a run, reads them, and (re)assembles the :class:`Run`."""

    def __init__(
        self, path: str, *, cache: bool = True, progress: bool = False, workers: int | None = None
    ) -> None:
        self.path = path
        self.cache = cache
        self.progress = progress
        self.workers = workers
        self.tables = Tables()
        self.sources: list[_Source] = []
        self.manifest_paths: dict[int, str] = {}
        #: the format the registry found (set by :meth:`_discover`, which raises without)
        self.format: TraceFormat
        self.find_problems: list[Problem] = []
        self._pending: tuple[Any, list[tuple[_Source, Any]]] | None = None
        self._discover()

    def _discover(self) -> None:
        """The run's files, as the format registry finds them (:mod:`hvdprof.trace.formats`)."""
        path = self.path
        if os.path.isdir(path):
            names = sorted(os.listdir(path))
            found = formats.detect_directory(path, names)
            self.find_problems += found.problems
            self.manifest_paths.update(found.manifests)
            if found.files:
                self._take(found)
                return
            if self.find_problems:
                raise LoadError(
                    f"nothing readable in {path}: "
                    + "; ".join(f"{p.file}: {p.reason}" for p in self.find_problems[:3])
                )
            raise LoadError(_no_timeline_message(path, names))
        why = _not_a_file(path)
        if why is not None:
            if not os.path.lexists(path):
                raise LoadError(f"{path}: no such file or directory")
            raise LoadError(f"{path}: {why}")
        found = formats.detect_file(path)
        self.manifest_paths.update(found.manifests)
        self._take(found)

    def _take(self, found: formats.Detection) -> None:
        """One source per file the registry found, read by its format."""
        self.format = formats.format_named(found.format)
        for file in found.files:
            self.sources.append(
                _Source(file.path, file.rank, self.format, self.tables, len(found.files))
            )

    def load(self) -> Run:
        """Read every file (cache, worker processes or here) and assemble the run."""
        self.start()
        return self.finish()

    def start(self) -> None:
        """Begin reading: the files without a current cache start parsing in worker
        processes now (forked from the calling thread), so a caller can do other work
        (the dashboard imports its web stack) while they run; :meth:`finish` collects."""
        if self._pending is not None:
            return
        # files whose cache is current, or continues (the file grew), are read in finish()
        todo = [s for s in self.sources if not (self.cache and s.cache_verdict())]
        workers = min(len(todo), self.workers or os.cpu_count() or 1)
        big = sum(_size(s.path) for s in todo) >= PARALLEL_MIN_BYTES
        futures: list[tuple[_Source, Any]] = []
        pool = None
        if workers > 1 and big and not any(s.whole_file for s in todo):
            import multiprocessing

            try:
                context = multiprocessing.get_context("fork")
                pool = ProcessPoolExecutor(
                    workers,
                    mp_context=context,
                    initializer=_worker_start,
                    initargs=(os.getpid(),),
                )
                futures = [
                    (s, pool.submit(_read_in_worker, s.path, s.rank, s.format.name, self.cache))
                    for s in todo
                ]
            except (OSError, ValueError, RuntimeError) as exc:  # no fork
                _log.debug("worker processes unavailable (%s); reading in this process", exc)
                if pool is not None:
                    pool.shutdown(wait=False, cancel_futures=True)
                pool, futures = None, []
        self._pending = (pool, futures)

    def finish(self) -> Run:
        """Wait for :meth:`start`'s workers, read the rest here, and assemble the run."""
        if self._pending is None:
            self.start()
        assert self._pending is not None
        pool, futures = self._pending
        self._pending = None
        total = sum(_size(s.path) for s in self.sources)
        advance, stop = _progress_bar(total if self.progress else 0)
        in_workers = {id(s) for s, _ in futures}
        try:
            resumed = []
            for source in self.sources:
                if id(source) in in_workers:
                    continue
                verdict = source.load_cache() if self.cache else None
                if verdict == "current":
                    advance(max(source.size, 0))
                    continue
                source.read(advance)  # the whole file, or (resumed) what was appended
                resumed.append(source)
            for source, future in futures:
                try:
                    meta, arrays = future.result()
                    source.import_columns(meta, arrays)
                except Exception as exc:  # a broken pool: read it here
                    _log.debug("worker failed on %s (%s); reading here", source.path, exc)
                    source._reset_unread()
                    source.read()
                    resumed.append(source)
                advance(max(source.size, 0))
            if self.cache:
                for source in resumed:
                    source.save_cache()
        finally:
            if pool is not None:
                pool.shutdown(wait=False)
            stop()
        run = Run(path=self.path, source_format=self.format.name, _loader=self)
        self.assemble(run)
        return run

    def _new_files(self) -> bool:
        """Files of ranks (and manifests) that appeared since the last look (a job
        starting), for a format written while it is read, as the format finds them."""
        if not self.format.incremental or not os.path.isdir(self.path):
            return False
        try:
            names = sorted(os.listdir(self.path))
        except OSError:
            return False
        # (what it cannot read was said when the run was first read; said again on a reload)
        found = self.format.detect_dir(self.path, names)
        known = {s.rank for s in self.sources}
        added = False
        for file in found.files:
            if file.rank not in known:
                self.sources.append(_Source(file.path, file.rank, self.format, self.tables))
                known.add(file.rank)
                added = True
        for rank, mpath in found.manifests.items():
            if rank not in self.manifest_paths:
                self.manifest_paths[rank] = mpath
                added = True
        self.sources.sort(key=lambda s: s.rank)
        return added

    def refresh(self, run: Run) -> bool:
        changed = self._new_files()
        for source in self.sources:
            if (
                not source.whole_file
                and not source.reader.continues(source.size)
                and source.columns.rows
            ):
                # came from the cache: it can only change by being rewritten
                try:
                    st = os.stat(source.path)
                except OSError:
                    continue
                if (st.st_size, st.st_mtime_ns) == (source.size, source.mtime_ns):
                    continue
                source.size = -1
            was_complete = source.complete
            changed |= source.read()
            if self.cache and source.complete and not was_complete:
                source.save_cache()  # finished while watched: the next look starts warm
        if changed:
            self.assemble(run)
        return changed

    def assemble(self, run: Run) -> None:
        """(Re)build the run's columns and descriptions from every source."""
        run.problems = list(self.find_problems)
        run.manifests = {}
        for rank, mpath in sorted(self.manifest_paths.items()):
            try:
                run.manifests[rank] = read_manifest(mpath)
            except (OSError, ValueError) as exc:
                run.problems.append(Problem(mpath, "", f"rank {rank}: unreadable manifest: {exc}"))
        run.complete = {}
        run.files = {}
        run.events = 0
        run.autotune_samples, run.params_changes, run.notices, run.stalls = [], [], [], []
        sizes = self._world_sizes(run)
        # a readiness mark names a rank: one of the files read or of the declared world
        # (without a manifest, rank 0's file alone still names every rank's readiness)
        mark_bound = max(
            [*(sizes or {limits.max_ranks()}), *(s.rank + 1 for s in self.sources)], default=0
        )
        slice_tables, mark_tables, ranks, counters = self._gather_sources(run, mark_bound)
        for rank, manifest in run.manifests.items():
            if manifest.hostname is not None:
                run.hosts.setdefault(rank, manifest.hostname)
        for rank in sorted(set(self.manifest_paths) - {s.rank for s in self.sources}):
            run.problems.append(
                Problem(
                    self.manifest_paths[rank], "", f"rank {rank}: manifest without a trace file"
                )
            )
        run.slices = _times_in_range(SliceTable.concat(slice_tables), run)  # type: ignore[arg-type]
        run.marks = MarkTable.concat(mark_tables)  # type: ignore[assignment]
        run.tensors = self.tables.tensors.items
        run.names = self.tables.names.items
        run.backends = self.tables.backends.items
        run.dtypes = self.tables.dtypes.items
        run.ranks = sorted(ranks)
        run.size = max(max(sizes, default=0), max(ranks) + 1 if ranks else 0)
        run.counters = {
            k: (
                np.array([r for r, _, _ in v], dtype=np.int32),
                np.array([t for _, t, _ in v], dtype=np.float64),
                np.array([x for _, _, x in v], dtype=np.float64),
            )
            for k, v in counters.items()
        }
        self.format.finish_run(
            run, [s.whole for s in self.sources if s.whole is not None], self.tables
        )
        run.autotune_samples.sort(key=lambda x: x.ts_us)
        run.params_changes.sort(key=lambda x: x.ts_us)
        run.notices.sort(key=lambda x: (x.ts_us, x.rank))
        run.stalls.sort(key=lambda x: x.ts_us)
        _set_span(run)

    def _world_sizes(self, run: Run) -> set[int]:
        """The world sizes the manifests declare; one that is not a size is a problem."""
        sizes = set()
        for rank, manifest in sorted(run.manifests.items()):
            size = manifest.size
            if size is None:
                continue
            if 0 < size <= limits.max_ranks():
                sizes.add(size)
            else:
                run.problems.append(
                    Problem(
                        self.manifest_paths[rank],
                        "size",
                        f"{_brief(repr(size))[:40]} is not a world size (1 to "
                        f"{limits.max_ranks()}, {_max_ranks_name()}): ignored",
                    )
                )
        return sizes

    def _gather_sources(
        self, run: Run, mark_bound: int
    ) -> tuple[
        list[SliceTable], list[MarkTable], set[int], dict[str, list[tuple[int, float, float]]]
    ]:
        """Every source's tables (marks naming no rank of the run left out, said once per
        file) and records, into ``run``: ``(slice tables, mark tables, ranks seen,
        counters)``."""
        slice_tables, mark_tables = [], []
        offset = 0
        ranks: set[int] = set()
        counters: dict[str, list[tuple[int, float, float]]] = {}
        for source in self.sources:
            cols = source.columns
            slices = cols.slices()
            marks = cols.marks()
            marks = dict(marks)
            ready = marks["ready_rank"]
            odd = (ready < 0) | (ready >= max(mark_bound, max(source.ranks_seen, default=0) + 1))
            if odd.any():
                marks = {k: v[~odd] for k, v in marks.items()}
                run.problems.append(
                    Problem(
                        source.path,
                        "readiness",
                        f"{int(odd.sum())} readiness time(s) name a rank that is not one of "
                        f"the run's (e.g. {int(ready[odd][0])}): left out",
                    )
                )
            marks["slice"] = np.where(marks["slice"] >= 0, marks["slice"] + offset, -1)
            offset += len(slices["rank"])
            slice_tables.append(SliceTable(**slices))
            mark_tables.append(MarkTable(**marks))
            run.problems += source.problems
            run.complete[source.rank] = run.complete.get(source.rank, True) and source.complete
            run.files[source.rank] = source.path
            run.events += source.events
            ranks |= source.ranks_seen
            if source.host:
                run.hosts[source.rank] = source.host
            run.autotune_samples += cols.samples
            run.params_changes += cols.params
            run.notices += cols.notices
            run.stalls += cols.stalls
            for k, v in cols.counters.items():
                counters.setdefault(k, []).extend(v)
        return slice_tables, mark_tables, ranks, counters


def _set_span(run: Run) -> None:
    """``run.t0_us`` and ``t1_us``: the span covers the slices and the autotune instants
    (a sample is scored after the ops of its window, possibly after the last op of the
    run), and a torch.profiler trace's GPU work and marked steps (kernels run after the
    last collective, a step begins before its first)."""
    s = run.slices
    instants = [x.ts_us for x in run.autotune_samples] + [x.ts_us for x in run.params_changes]
    starts = [float(s.start_us.min())] if len(s) else []
    ends = [float((s.start_us + s.dur_us).max())] if len(s) else []
    for g in run.gpu.values():
        if len(g.start_us):
            starts.append(float(g.start_us.min()))
            ends.append(float((g.start_us + g.dur_us).max()))
    for marked in run.trace_steps.values():
        known = np.isfinite(marked.start_us)
        if known.any():
            starts.append(float(marked.start_us[known].min()))
            ends.append(float(marked.end_us[known].max()))
    if starts or instants:
        run.t0_us = min(starts + instants)
        run.t1_us = max(ends + instants)
    else:
        run.t0_us = run.t1_us = 0.0


def _stall_to_dict(stall: StallRecord) -> dict[str, Any]:
    x = asdict(stall)
    x["where"] = {str(k): v for k, v in stall.where.items()}
    x["collective"] = {str(k): v for k, v in stall.collective.items()}
    return x


def _stall_from_dict(x: dict[str, Any]) -> StallRecord:
    """A cached StallRecord (JSON made its int keys strings)."""
    x = dict(x)
    x["where"] = {int(k): v for k, v in (x.get("where") or {}).items()}
    x["collective"] = {int(k): v for k, v in (x.get("collective") or {}).items()}
    return StallRecord(**x)


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def _progress_bar(total: int) -> tuple[Callable[[int], None], Callable[[], None]]:
    """A rich progress bar on stderr for large inputs when stderr is a terminal."""
    if total < (64 << 20) or not sys.stderr.isatty():
        return (lambda n: None), (lambda: None)
    from rich.console import Console
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn

    progress = Progress(
        "reading timelines",
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    task = progress.add_task("read", total=total)
    progress.start()
    return (lambda n: progress.advance(task, n)), progress.stop


def load_run(
    path: str | os.PathLike[str],
    *,
    cache: bool = True,
    progress: bool = False,
    workers: int | None = None,
) -> Run:
    """Read a run directory (or one timeline file) into a columnar :class:`Run`.

    ``cache``: reuse/write ``.hvdprof-cache/`` beside the trace. ``progress``: show a
    progress bar on stderr for large inputs (only when stderr is a terminal).
    ``workers``: processes that parse large inputs, one file each (default: one per CPU;
    1: all in this process). Raises :class:`LoadError` when there is nothing to read at
    ``path``.
    """
    return RunLoader(os.fspath(path), cache=cache, progress=progress, workers=workers).load()


__all__ = ["LoadError", "RunLoader", "load_run"]


def _no_timeline_message(path: str, names: list[str]) -> str:
    """Why ``path`` holds no run, naming the runs in its subfolders when it has some: an
    elastic job writes one timeline per generation (``DIR/generation.<g>/``)."""
    message = f"no timeline files (rank.<r>.json or a Horovod timeline) in {path}"
    inner = sorted(
        (n for n in names if os.path.isdir(os.path.join(path, n))),
        key=lambda n: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", n)],
    )
    runs = [n for n in inner if _holds_run(os.path.join(path, n))]
    if runs:
        shown = ", ".join(runs[:6]) + (f" and {len(runs) - 6} more" if len(runs) > 6 else "")
        message += (
            f"; its subfolders hold runs ({shown}): name one, e.g. "
            f"{os.path.join(path, runs[-1])}, or open {path} in `hvdprof dashboard`, which lists them"
        )
    return message


def _holds_run(directory: str) -> bool:
    """Is ``directory`` a run of per-rank files, of any format (the registry's answer)?"""
    try:
        entries = sorted(Path(directory).iterdir())
        return formats.run_format_of(Path(directory), entries) is not None
    except OSError:
        return False


#: a start or duration beyond this (about 3,000 years in microseconds) is damage, as the
#: Horovod and Kineto readers also judge: such a slice is left out, and said
MAX_TIME_US = 1e17


def _times_in_range(slices: SliceTable, run: Run) -> SliceTable:
    """The slices whose start and duration are finite and within :data:`MAX_TIME_US`: a
    1.7e308-us slice would overflow every sum over the run (numpy warnings on stderr, an
    infinite step)."""
    ok = (
        (np.abs(slices.start_us) < MAX_TIME_US)
        & (slices.dur_us >= 0)
        & (slices.dur_us < MAX_TIME_US)
    )
    if ok.all():
        return slices
    bad = int(len(ok) - ok.sum())
    run.problems.append(
        Problem(
            run.path,
            "",
            f"{bad} slice(s) with a start or duration that is not a time (negative, not "
            f"finite, or beyond {MAX_TIME_US:.0e} us): left out",
        )
    )
    return slices.take(np.flatnonzero(ok))  # type: ignore[return-value]
