"""Switching the timeline on and off inside a running job, on every rank at once.

The runtime owns one ``TimelineSession``. The sink is attached and detached only on the
cycle thread, at a cycle every rank agreed on, so a switch can never tear a negotiation
(the start/stop race that corrupts Horovod's negotiation cannot happen here).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
from typing import Any

from hvdprof.common import timebase
from hvdprof.config import timeline_path_problem
from hvdprof.errors import HvdprofError
from hvdprof.timeline.clock import ClockCorrection, estimate_offset
from hvdprof.timeline.sink import TimelineSink


class TimelineSession:
    def __init__(self, runtime: Any) -> None:
        self.runtime = runtime
        self.clock = ClockCorrection(now_ns=lambda: timebase.now_ns())
        self.sink: TimelineSink | None = None

    def update_clock(self, samples: list[tuple[int, int, int]]) -> None:
        """Called with this rank's ping-pong samples (none on rank 0, the reference)."""
        if samples:
            self.clock.update(estimate_offset(samples))

    def open(
        self, directory: str, mark_cycles: bool, gzip: bool | None = None
    ) -> TimelineSink | None:
        """Create this rank's sink; runs on the cycle thread (or in init, before it starts).

        None when the directory came from ``HOROVOD_TIMELINE`` at init and cannot be
        written: as in Horovod, a warning and no timeline, and the job trains on.
        """
        runtime = self.runtime
        config = runtime.config.replace(timeline_dir=directory, timeline_mark_cycles=mark_cycles)
        if gzip is not None:
            config = config.replace(timeline_gzip=gzip)
        horovod = runtime.config.horovod_timeline
        if horovod and directory == runtime.config.timeline_dir:
            problem = write_problem(directory)
            if problem is not None:
                _warn_once_per_host(runtime, horovod_warning(horovod, problem))
                return None
        _check_writable(directory, runtime.rank)
        self.sink = TimelineSink(
            config,
            runtime.rank,
            runtime.size,
            getattr(runtime, "host_name", None) or socket.gethostname(),
            self.clock,
            run_id=f"{config.controller_addr}:{config.controller_port}:{runtime.size}",
            job=getattr(runtime, "job", None),
        )
        runtime.cycle.observers.append(self.sink)
        runtime.timeline_switched(True)
        if runtime.rank == 0 and config.horovod_timeline_file:
            _link_horovod_file(config.horovod_timeline_file, self.sink.path)
        return self.sink

    def add_instant(self, name: str, args: dict[str, Any]) -> None:
        """Put an instant on this rank's timeline (a stall, a stack dump), when one is
        recording; whole-rank scope, on the runtime lane."""
        sink = self.sink
        if sink is not None:
            sink.add_instant(name, args, scope="p")

    def add_autotune_sample(
        self,
        params: Any,
        score: float,
        first_step: int,
        last_step: int,
        is_best: bool,
        phase: str,
        **decisions: Any,
    ) -> None:
        """Put a scored autotune sample on rank 0's timeline, when one is recording, with
        what the tuner decided by then (``decisions``: role, paired estimates, incumbent,
        recommendation; see ``AutotuneController._decisions``)."""
        sink = self.sink
        if sink is not None:
            sink.add_autotune_sample(
                params,
                score,
                first_step=first_step,
                last_step=last_step,
                is_best=is_best,
                phase=phase,
                **decisions,
            )

    def add_waited(self, t_ns: int, blocked_ns: int) -> None:
        """Note when this rank's training thread got control back from waiting on ops,
        and how long it was blocked since it last submitted (any thread)."""
        sink = self.sink
        if sink is not None:
            sink.add_waited(t_ns, blocked_ns)

    def close(self) -> None:
        sink, self.sink = self.sink, None
        if sink is None:
            return
        self.runtime.timeline_switched(False)
        observers = self.runtime.cycle.observers
        if sink in observers:
            observers.remove(sink)
        sink.close()


def _link_horovod_file(path: str, trace: str) -> None:
    """Make ``HOROVOD_TIMELINE``'s file rank 0's trace (a symlink) while the job runs;
    ``hvdprof run`` replaces it with the merged trace at the end."""
    import logging

    try:
        if os.path.islink(path) or os.path.isfile(path):
            os.unlink(path)
        os.symlink(trace, path)
    except OSError as exc:
        with contextlib.suppress(Exception):
            logging.getLogger("hvdprof.timeline").warning(
                "hvdprof: HOROVOD_TIMELINE=%s: cannot link it to rank 0's trace (%s); the "
                "timelines are in %s",
                path,
                exc,
                os.path.dirname(trace),
            )


def _check_writable(directory: str, rank: int) -> None:
    problem = timeline_path_problem(directory)
    if problem is not None:
        raise HvdprofError(
            f"hvdprof rank {rank}: {problem}; set HVDPROF_TIMELINE (or start_timeline's "
            "path) to a directory"
        )
    try:
        _probe(directory, f".write-test.rank.{rank}")
    except (OSError, ValueError) as exc:
        raise HvdprofError(
            f"hvdprof rank {rank}: the timeline path {directory!r} cannot be written "
            f"({_reason(exc)}); set HVDPROF_TIMELINE to a writable directory"
        ) from None


def _probe(directory: str, name: str) -> None:
    """Create ``directory`` (and its parents) and write, then remove, a file in it; on
    failure, remove the folders this created (a path too long for the system fails
    only some levels down, after creating the levels above)."""
    missing = []
    parent = os.path.abspath(directory)
    while not os.path.isdir(parent) and parent != os.path.dirname(parent):
        missing.append(parent)
        parent = os.path.dirname(parent)
    try:
        os.makedirs(directory, exist_ok=True)
        probe = os.path.join(directory, name)
        with open(probe, "w") as f:
            f.write("ok")
        os.remove(probe)
    except BaseException:
        for folder in missing:  # deepest first
            with contextlib.suppress(OSError):
                os.rmdir(folder)
        raise


def _reason(exc: BaseException) -> str:
    return (exc.strerror if isinstance(exc, OSError) else None) or str(exc)


def write_problem(directory: str) -> str | None:
    """Why no timeline can be written into ``directory`` (one phrase), or None when it
    can; creates it as the ranks would."""
    problem = timeline_path_problem(directory)
    if problem is not None:
        return problem
    try:
        _probe(directory, f".write-test.{os.getpid()}")
    except (OSError, ValueError) as exc:  # (ValueError: a NUL byte in the path)
        return f"{_reason(exc)} for {shorten(directory)}"
    return None


def shorten(path: str, limit: int = 120) -> str:
    """``path`` quoted, its middle cut when longer than ``limit`` characters."""
    if len(path) <= limit:
        return repr(path)
    return f"{path[: limit // 2]!r}...{path[-limit // 4 :]!r} ({len(path)} characters)"


def horovod_warning(value: str, problem: str) -> str:
    """The one line said when ``HOROVOD_TIMELINE=value`` cannot be written."""
    return (
        f"HOROVOD_TIMELINE={shorten(value)}: will not write a timeline ({problem}); "
        "the job trains on without one"
    )


def _warn_once_per_host(runtime: Any, message: str) -> None:
    """Rank 0 and each host's local rank 0 say it (``hvdprof run`` says it once, before
    the ranks start, and then starts them with the timeline off)."""
    topology = getattr(runtime, "topology", None)
    if runtime.rank == 0 or getattr(topology, "local_rank", 0) == 0:
        sys.stderr.write(f"hvdprof rank {runtime.rank}: {message}\n")
        sys.stderr.flush()


def _directory_of(file_path: str) -> tuple[str, bool | None]:
    """Horovod takes a file name; we write one file per rank into a directory."""
    path = os.fspath(file_path)
    for suffix, gz in ((".json.gz", True), (".json", False)):
        if path.endswith(suffix):
            return path[: -len(suffix)] or ".", gz
    return path, None


def start_timeline(runtime: Any, file_path: str, mark_cycles: bool = False) -> None:
    """Every rank calls this; recording starts at the same cycle on all ranks.

    ``file_path`` names a directory for the per-rank files (``x.json`` means directory
    ``x``, ``x.json.gz`` the same, gzipped).
    """
    directory, gz = _directory_of(file_path)
    _check_writable(directory, runtime.rank)
    session: TimelineSession = runtime.timeline

    def command() -> None:
        session.close()
        runtime.sync_clock()
        session.open(directory, mark_cycles, gz)

    runtime.run_collectively(command)


def stop_timeline(runtime: Any) -> None:
    """Every rank calls this; recording stops at the same cycle, and files are closed."""
    runtime.run_collectively(runtime.timeline.close)
