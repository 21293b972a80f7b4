"""The runs found under the served directory, loaded once and refreshed as they grow.

A *run* is either a directory of per-rank traces (hvdprof's ``rank.<r>.json``,
torch.profiler's, or any format registered in :mod:`hvdprof.trace.formats`) or a single
trace file (Horovod's ``HOROVOD_TIMELINE`` output, a merged trace). What a run is, and of
which format, is the format registry's answer; loading and analysing are the analysis
library's job (:func:`hvdprof.analysis.load_run`). This module only walks the served
directory, keeps the loaded :class:`~hvdprof.analysis.Run` objects, and tells from a cheap
``stat`` of the files whether a run changed since it was last read.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hvdprof.common import limits
from hvdprof.config import name_of
from hvdprof.dashboard.paths import OutsideRootError, escaping_links, resolve_inside
from hvdprof.trace import formats

#: How deep under the root the catalog looks for runs.
MAX_DEPTH = 3

#: ``(name, size, mtime_ns)`` of every file of a run: equal signatures, nothing to re-read.
Signature = tuple[tuple[str, int, int], ...]


def shown(text: str) -> str:
    """``text`` as JSON can carry it: a file name's undecodable bytes (kept by Python as
    lone surrogates) written ``\\xff``, so a directory named in Latin-1 is listed and
    described instead of failing the whole answer."""
    try:
        text.encode("utf-8")
        return text
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


class RunNotFoundError(LookupError):
    """The run id names nothing the catalog serves."""


class RunLoadError(RuntimeError):
    """The analysis library could not read the run at all; the message says why."""


@dataclass(frozen=True)
class RunEntry:
    """One run under the root: its id (path relative to the root) and what it is."""

    id: str
    path: Path
    kind: str  # "directory" (per-rank trace files) or "file" (one trace file)

    @property
    def shown_id(self) -> str:
        """The id as the API writes it (see :func:`shown`); :meth:`RunCatalog.entry`
        accepts it back."""
        return shown(self.id)

    def files(self) -> list[Path]:
        if self.kind == "file":
            return [self.path]
        try:
            return sorted(p for p in self.path.iterdir() if formats.part_of_run(p))
        except OSError:
            return []

    def signature(self) -> Signature:
        sig = []
        for p in self.files():
            try:
                st = p.stat()
            except OSError:
                continue
            sig.append((p.name, st.st_size, st.st_mtime_ns))
        return tuple(sig)


@dataclass
class LoadedRun:
    """A run the analysis library loaded, the signature it was loaded at, and a version
    number bumped each time new events arrive (the page's cue to re-query)."""

    entry: RunEntry
    run: Any
    signature: Signature
    version: int = 1
    lock: threading.Lock = field(default_factory=threading.Lock)


def _parse_memory() -> int:
    return int(limits.setting("dashboard_parse_memory"))


class _LimitedParse:
    """One run parsed in a process of its own whose address space may grow by at most
    ``HVDPROF_DASHBOARD_PARSE_MEMORY`` bytes (``RLIMIT_AS``): a file that needs more
    fails that run (a notice on it), never the server. The process is forked now, so
    the parse overlaps what the caller does next; :meth:`finish` collects the run."""

    def __init__(self, path: str, limit: int) -> None:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        self.pool = ProcessPoolExecutor(
            1,
            mp_context=multiprocessing.get_context("fork"),
            initializer=_parse_process_start,
            initargs=(os.getpid(), limit),
        )
        try:
            self.future = self.pool.submit(_parse_run, path)
        except BaseException:
            self.pool.shutdown(wait=False, cancel_futures=True)
            raise

    def finish(self) -> Any:
        from concurrent.futures.process import BrokenProcessPool

        try:
            return self.future.result()
        except BrokenProcessPool:
            raise MemoryError("the parse process ended abruptly") from None
        finally:
            self.pool.shutdown(wait=False)


def _start_parse(path: str, loader_class: Any) -> Any:
    """A parse of ``path`` under way: in a memory-limited process (see
    :class:`_LimitedParse`), or, with no limit or no ``fork``, in this one."""
    loader = loader_class(path)  # finds the files here: nothing to read is said now
    limit = _parse_memory()
    if limit > 0 and sys.platform.startswith("linux"):
        return _LimitedParse(path, limit)
    loader.start()
    return loader


def _parse_process_start(parent: int, limit: int) -> None:
    """First thing in the parse process: die with the server (it holds a copy of the
    listening socket), leave Ctrl+C to the server, and cap its address space at what it
    inherited plus ``limit`` bytes."""
    import resource
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:
        os._exit(0)
    _close_listening_sockets()
    try:
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = size + limit if hard == resource.RLIM_INFINITY else min(size + limit, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    except (OSError, ValueError):
        pass  # no /proc, or a limit we may not raise: parse without one


def _close_listening_sockets() -> None:
    """Close the server's listening socket(s) this forked process inherited: it (and the
    processes it forks to parse large runs) must never keep the dashboard's port once
    the server is gone (a restart said "Address already in use")."""
    import socket

    try:
        fds = [int(n) for n in os.listdir("/proc/self/fd")]
    except OSError:
        return
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue  # not a socket (or already closed)
        try:
            listening = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
        except OSError:
            listening = 0
        if listening:
            sock.close()
        else:
            sock.detach()


def _parse_run(path: str) -> Any:
    from hvdprof.analysis import load_run

    return load_run(path)


def discover(root: Path) -> list[RunEntry]:
    """Every run under ``root`` (itself included), never following links out of it."""
    root = root.resolve()
    found: list[RunEntry] = []

    def visit(directory: Path, depth: int) -> None:
        try:
            entries = sorted(directory.iterdir())
        except OSError:
            return
        rel = directory.relative_to(root).as_posix()
        if formats.run_format_of(directory, entries) is not None:  # per-rank files
            found.append(RunEntry(rel, directory, "directory"))
            return
        for p in entries:
            try:
                resolve_inside(root, p.relative_to(root).as_posix())
            except OutsideRootError:
                continue
            if p.is_file() and formats.single_file_run(p):
                found.append(RunEntry(p.relative_to(root).as_posix(), p, "file"))
            elif p.is_dir() and depth < MAX_DEPTH and not p.name.startswith("."):
                visit(p, depth + 1)

    visit(root, 0)
    return found


class RunCatalog:
    """Runs under one root, loaded lazily through the analysis library and kept warm."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()
        self._loaded: dict[str, LoadedRun] = {}
        self._loading: dict[str, threading.Lock] = {}
        self._started: dict[str, tuple[Any, Signature]] = {}
        self._lock = threading.Lock()

    def entries(self) -> list[RunEntry]:
        return discover(self.root)

    def entry(self, run_id: str) -> RunEntry:
        """The run ``run_id`` names; OutsideRootError for paths that escape the root."""
        if run_id and "\\" in run_id:
            for entry in self.entries():  # an id with undecodable bytes, as the API wrote it
                if entry.shown_id == run_id and entry.id != run_id:
                    return self.entry(entry.id)
        path = resolve_inside(self.root, run_id or ".")
        links = escaping_links(self.root, path)
        if links:
            raise OutsideRootError(
                f"run {run_id!r}: {', '.join(links)} link(s) to files outside the served directory"
            )
        for entry in self.entries():
            if entry.path == path:
                return entry
        raise RunNotFoundError(f"no run named {run_id!r} under the served directory")

    def start_reading(self, run_id: str | None = None) -> str | None:
        """Start reading a run (by default the first one found, which the page opens) now:
        its files without a current cache begin parsing in worker processes forked from
        the calling thread, so the parse overlaps what the caller does next (the
        dashboard imports its web stack meanwhile). :meth:`loaded` collects it. Returns
        the run's id, or None when there is nothing to start (any error is reported when
        the run is asked for)."""
        try:
            from hvdprof.trace.loader import RunLoader

            if run_id is None:
                entries = self.entries()
                if not entries:
                    return None
                run_id = entries[0].id
            # entry() refuses a run with links out of the served directory: its cache
            # (.hvdprof-cache) would be written wherever such a link points
            entry = self.entry(run_id)
            signature = entry.signature()
            loader = _start_parse(str(entry.path), RunLoader)
        except Exception:  # the same error comes back, described, when the run is asked for
            return None
        with self._lock:
            self._started[entry.id] = (loader, signature)
        return entry.id

    def loaded(self, run_id: str) -> LoadedRun:
        """The loaded run, read on first use; RunLoadError when nothing could be read."""
        run_id = self.entry(run_id).id  # "demo/", "./demo" and "demo" are one run
        with self._lock:
            current = self._loaded.get(run_id)
            loading = self._loading.setdefault(run_id, threading.Lock())
        if current is not None:
            return current
        with loading:  # concurrent first requests read a large run once, not once each
            with self._lock:
                current = self._loaded.get(run_id)
            if current is not None:
                return current
            return self._load(run_id)

    def _load(self, run_id: str) -> LoadedRun:
        entry = self.entry(run_id)
        try:
            from hvdprof.analysis import LoadError  # the one reader of runs: load_run
        except ImportError as exc:
            raise RunLoadError(f"the analysis library is not available: {exc}") from None

        with self._lock:
            started = self._started.pop(entry.id, None)
        try:
            if started is not None:  # start_reading began it
                loader, signature = started
            else:
                from hvdprof.trace.loader import RunLoader

                signature = entry.signature()
                loader = _start_parse(str(entry.path), RunLoader)
            run = loader.finish()
        except MemoryError:
            raise RunLoadError(
                f"run {shown(run_id)!r} could not be read: its parse needed more than "
                f"{_parse_memory()} bytes ({name_of('dashboard_parse_memory')})"
            ) from None
        except (LoadError, OSError, ValueError, RuntimeError) as exc:
            raise RunLoadError(
                f"run {shown(run_id)!r} could not be read: {shown(str(exc))}"
            ) from None
        except Exception as exc:  # (MemoryError included): a notice on this run, never a 503
            raise RunLoadError(
                f"run {shown(run_id)!r} could not be read: {type(exc).__name__}: "
                f"{shown(str(exc))[:300]}"
            ) from None
        fresh = LoadedRun(entry, run, signature)
        with self._lock:
            return self._loaded.setdefault(run_id, fresh)

    def cached(self) -> list[LoadedRun]:
        with self._lock:
            return list(self._loaded.values())

    def refresh(self, loaded: LoadedRun) -> bool:
        """Re-read what was appended if the files changed on disk; True when the run grew."""
        signature = loaded.entry.signature()
        if signature == loaded.signature:
            return False
        old = {name: size for name, size, _ in loaded.signature}
        new = {name: size for name, size, _ in signature}
        # Run.refresh() reads what was appended to the files it knows; a rank whose file
        # appeared (or was rewritten shorter) since needs the run read again from scratch.
        reload = set(new) != set(old) or any(new[n] < old[n] for n in new)
        with loaded.lock:
            loaded.signature = signature
            try:
                if reload:
                    from hvdprof.trace.loader import RunLoader

                    loaded.run = _start_parse(str(loaded.entry.path), RunLoader).finish()
                    grew = True
                else:
                    grew = bool(loaded.run.refresh())
            except Exception:  # a file caught mid-write: the next change retries
                return False
            if grew:
                loaded.version += 1
            return grew
