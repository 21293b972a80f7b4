"""The timeline as a cycle observer: every rank records its own trace.

Horovod wrote one timeline, on rank 0, so a straggler's own view was never seen. Here the
runtime builds one :class:`TimelineSink` per rank; it writes ``DIR/rank.<r>.json`` (or
``.json.gz``) and ``DIR/manifest.rank.<r>.json``. Timestamps are on rank 0's clock through
the shared :class:`~hvdprof.timeline.clock.ClockCorrection`, so ``hvdprof timeline merge``
only has to concatenate.

:meth:`TimelineSink.on_cycle` runs on the cycle thread: it filters the record and appends
it, as compact column frames, to a spool file that a renderer child process reads once a
second (:mod:`hvdprof.timeline.render_process`, started when the sink opens; see
:mod:`hvdprof.timeline.transport`). Rendering (several µs of JSON per op) happens outside
the rank, the rank wakes nobody, and what is in the spool outlives the rank: a rank
killed with SIGKILL keeps every event it recorded. The child
writes the trace file and keeps the manifest current; the rank keeps what only it knows
(the clock correction, sent with every cycle and in the manifest, start and end instants,
its own drops). :meth:`TimelineSink.close` sends the end mark and waits (bounded) for the
child, so when it returns the file is strict JSON and the manifest final.

If the child cannot be started, the sink says so in a warning and renders on an
in-process writer thread instead (:class:`~hvdprof.timeline.writer.TimelineWriter`), with
the same file format.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping
from typing import Any

from hvdprof.common import activities as act
from hvdprof.common.records import CycleRecord, TunableParams
from hvdprof.config import Config
from hvdprof.errors import HvdprofError
from hvdprof.timeline import transport
from hvdprof.timeline.clock import ClockCorrection, skewed_clock
from hvdprof.timeline.manifest import (
    MANIFEST_FORMAT,
    MANIFEST_VERSION,
    manifest_filename,
    trace_filename,
    write_manifest,
)
from hvdprof.timeline.render import (
    EVENTS_PER_OP,
    ITEM_COUNTER,
    ITEM_CYCLE,
    ITEM_INSTANT,
    ITEM_LINES,
    CycleRenderer,
)
from hvdprof.timeline.transport import RenderProcess
from hvdprof.timeline.writer import TimelineWriter, open_trace_file

log = logging.getLogger("hvdprof.timeline")

_OPEN_SINKS: weakref.WeakSet[TimelineSink] = weakref.WeakSet()


def _clock_pair(clock: ClockCorrection) -> tuple[int, int]:
    """``(time.time_ns(), clock.now_ns())`` read as close together as we can manage.

    The pair anchors the rank's clock to wall time for merging torch.profiler traces; of a
    few attempts, the one with the shortest gap between two wall readings is kept.
    """
    best: tuple[int, int, int] | None = None
    for _ in range(5):
        u0 = time.time_ns()
        local = clock.now_ns()
        u1 = time.time_ns()
        if best is None or u1 - u0 < best[0]:
            best = (u1 - u0, (u0 + u1) // 2, local)
    assert best is not None
    return best[1], best[2]


def _config_dict(config: Config) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if isinstance(value, (set, frozenset)):
            value = sorted(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[f.name] = value
    return out


class TimelineSink:
    """Per-rank timeline recorder; a ``CycleObserver`` with ``detailed = True``.

    Parameters: the runtime's ``config`` (``timeline_dir`` must be set unless ``directory``
    is given), this ``rank``, the job ``size``, this ``hostname`` and the ``clock``
    correction the runtime keeps up to date (a fresh one, skewed by
    ``config.clock_skew_us``, when omitted). ``run_id`` (optional, identical on all ranks)
    lets the reader detect files left over from another run.

    With the renderer process a record is encoded at once, in :meth:`on_cycle`. In the
    in-process fallback the sink keeps a reference until the writer thread has rendered
    it, so the runtime must not mutate a ``CycleRecord`` after passing it on.

    ``use_process`` (default True) renders in a child process; False renders on an
    in-process writer thread, as does a failure to start the child.
    """

    detailed = True
    per_cycle = True

    def __init__(
        self,
        config: Config,
        rank: int,
        size: int,
        hostname: str | None = None,
        clock: ClockCorrection | None = None,
        *,
        run_id: str | None = None,
        directory: str | None = None,
        use_process: bool = True,
        job: Mapping[str, Any] | None = None,
    ) -> None:
        directory = directory if directory is not None else config.timeline_dir
        if not directory:
            raise HvdprofError("the timeline sink needs a directory (HVDPROF_TIMELINE is empty)")
        try:
            os.makedirs(directory, exist_ok=True)
        except OSError as exc:
            raise HvdprofError(
                f"cannot create the timeline directory {directory!r}: {exc.strerror or exc}"
            ) from exc
        self.config = config
        #: what the manifest records about the job (launcher, backend), from the runtime
        self.job = dict(job or {})
        self.rank = int(rank)
        self.size = int(size)
        self.hostname = hostname if hostname is not None else socket.gethostname()
        self.clock = (
            clock
            if clock is not None
            else ClockCorrection(now_ns=skewed_clock(config.clock_skew_us))
        )
        self.run_id = run_id
        self.directory = directory
        self.path = os.path.join(directory, trace_filename(self.rank, config.timeline_gzip))
        self.manifest_path = os.path.join(directory, manifest_filename(self.rank))

        window = config.timeline_steps
        self._lo, self._hi = window if window is not None else (0, 1 << 62)
        self._every = max(1, int(config.timeline_sample_every))
        self._mark_cycles = bool(config.timeline_mark_cycles)
        self._per_op = EVENTS_PER_OP
        self._last_bytes: int | None = None
        self._last_params: TunableParams | None = None
        #: (t_ns, blocked_ns, shift_ns) the training thread noted; the cycle thread
        #: turns them into counter samples (see :meth:`add_waited`)
        self._waited: list[tuple[int, int, int]] = []
        self._table_sent = -1  # the version of the cache table the renderer has
        self._manifest_lock = threading.Lock()
        self._drops_said = False
        self._manifest_failed = False
        self._manifest_state: tuple[int, int, int] | None = None
        self._closed = False
        self._owner_pid = os.getpid()
        self._end_pair: tuple[int, int] | None = None

        self._start_unix_ns, self._start_local_ns = _clock_pair(self.clock)
        self._renderer = CycleRenderer(self.rank, self.hostname, mark_cycles=self._mark_cycles)
        fd = open_trace_file(self.path)
        self._process: RenderProcess | None = None
        if use_process:
            self._process = self._start_process(fd)
        self._writer: TimelineWriter | RenderProcess
        if self._process is not None:
            self._writer = self._process
        else:
            self._writer = TimelineWriter(
                self.path,
                fd=fd,
                queue_size=config.timeline_queue_size,
                wait_when_full=config.timeline_when_full == "wait",
                stuck_s=config.timeline_stuck_s,
                compress=config.timeline_gzip,
                render=self._renderer.render,
                periodic=self._refresh_manifest,
                final_event=self._final_event,
            )
        try:
            header = self._renderer.header()
            self._writer.put((ITEM_LINES, header), len(header))
            self._refresh_manifest(force=True)
        except BaseException:
            self._writer.close()  # no child or thread left behind
            raise
        if self._process is not None:
            self._process.start()  # only now may the child write the manifest
        _OPEN_SINKS.add(self)

    def _start_process(self, fd: int) -> RenderProcess | None:
        init = {
            "protocol": transport.PROTOCOL,
            "parent_pid": os.getpid(),
            "rank": self.rank,
            "size": self.size,
            "hostname": self.hostname,
            "mark_cycles": self._mark_cycles,
            "compress": bool(self.config.timeline_gzip),
            "manifest_path": self.manifest_path,
        }
        try:
            return RenderProcess(
                self.path,
                fd,
                init,
                manifest=self.manifest,
                manifest_version=lambda: self.clock.version,
            )
        except (OSError, ValueError, TypeError, subprocess.SubprocessError) as exc:
            log.warning(
                "hvdprof rank %d: cannot start the timeline renderer process (%s); rendering"
                " on a thread of this process instead, which costs training time",
                self.rank,
                exc,
            )
            return None

    # --- the cycle thread ----------------------------------------------------------------

    def on_cycle(self, record: CycleRecord) -> None:
        """Hand ``record`` to the renderer if its step is recorded: encoded and appended to
        the spool at once (the in-process fallback queues it); never waits for the renderer."""
        if self._waited:
            self._put_waited()
        step = record.step
        if step < self._lo or step > self._hi or step % self._every:
            return
        ops = record.ops
        if (
            not ops
            and not self._mark_cycles
            and record.bytes_reduced == self._last_bytes
            and (record.params is self._last_params or record.params == self._last_params)
        ):
            return  # an idle cycle adds nothing to the trace
        self._last_bytes = record.bytes_reduced
        self._last_params = record.params
        table = getattr(ops, "table", None)
        if table is not None:  # ops named by cache bit
            if self._process is None:  # the writer thread renders later: names now
                record = dataclasses.replace(record, ops=ops.resolved())
            elif table.version != self._table_sent:
                self._process.put_table(table)
                self._table_sent = table.version
        self._put((ITEM_CYCLE, record, self.clock.shift_ns), len(ops) * self._per_op + 6)

    # --- other producers -----------------------------------------------------------------

    def add_instant(
        self,
        name: str,
        args: Mapping[str, Any] | None = None,
        *,
        t_ns: int | None = None,
        lane: int = act.LANE_RUNTIME,
        scope: str = "t",
    ) -> bool:
        """Put an instant event on this rank's timeline (any thread).

        ``t_ns`` is on the rank's clock (``clock.now_ns()``, the default: now); ``lane`` is
        a fixed lane id from :mod:`hvdprof.common.activities`; ``scope`` is ``"t"``
        (lane), ``"p"`` (whole rank) or ``"g"`` (whole trace).
        """
        if scope not in ("t", "p", "g"):
            raise ValueError(f"instant scope must be 't', 'p' or 'g', not {scope!r}")
        t = self.clock.now_ns() if t_ns is None else t_ns
        item = (
            ITEM_INSTANT,
            name,
            t,
            self.clock.shift_ns,
            dict(args) if args else None,
            lane,
            scope,
        )
        return self._put(item, 1)

    def add_waited(self, t_ns: int, blocked_ns: int) -> None:
        """Note that the training thread got control back at ``t_ns`` after waiting
        ``blocked_ns`` on its ops: a sample of the waited counter.

        Called on the training thread once per step, so it only appends to a list; the
        cycle thread encodes the samples with its next record (:meth:`on_cycle`), and
        :meth:`close` takes any left. Encoding one there cost the training thread 20-35
        µs per step on 2-ms steps."""
        self._waited.append((t_ns, blocked_ns, self.clock.shift_ns))

    def _put_waited(self) -> None:
        waited, self._waited = self._waited, []  # appends after the swap go to the new list
        items = [
            (ITEM_COUNTER, act.COUNTER_WAITED, t_ns, shift, {"value": blocked_ns / 1e6})
            for t_ns, blocked_ns, shift in waited
        ]
        if self._process is not None:  # plain already: one lock, no copy
            self._process.put_plain(items)
            return
        for item in items:
            self._put(item, 1)

    def add_counter(
        self, name: str, values: Mapping[str, float], *, t_ns: int | None = None
    ) -> bool:
        """Add a sample to the counter track ``name`` (one series per key of ``values``)."""
        t = self.clock.now_ns() if t_ns is None else t_ns
        return self._put((ITEM_COUNTER, name, t, self.clock.shift_ns, dict(values)), 1)

    def add_autotune_sample(
        self,
        params: TunableParams,
        score: float,
        *,
        t_ns: int | None = None,
        **info: Any,
    ) -> bool:
        """Record one scored autotune sample: an instant on the ``autotune`` lane and the score counter."""
        t = self.clock.now_ns() if t_ns is None else t_ns
        args = {
            "fusion_threshold_bytes": params.fusion_threshold_bytes,
            "cycle_time_ms": params.cycle_time_ms,
            "cache_enabled": params.cache_enabled,
            "score": score,
            **info,
        }
        ok = self.add_instant(act.AUTOTUNE_SAMPLE, args, t_ns=t, lane=act.LANE_AUTOTUNE)
        return self.add_counter(act.COUNTER_AUTOTUNE_SCORE, {"value": score}, t_ns=t) and ok

    # --- state -----------------------------------------------------------------------------

    @property
    def events_written(self) -> int:
        """Events in the file (excluding the final event). With the renderer process, the
        count is known once :meth:`close` returned (the child refreshes the manifest's
        count every few seconds while recording)."""
        return self._writer.events_written

    @property
    def events_dropped(self) -> int:
        return self._writer.events_dropped

    @property
    def writer(self) -> TimelineWriter | RenderProcess:
        """Where the sink puts records: the renderer process's spool, or the fallback writer."""
        return self._writer

    @property
    def renders_in_process(self) -> bool:
        """True when rendering fell back to a thread of this process."""
        return self._process is None

    def manifest(self) -> dict[str, Any]:
        """The manifest as it would be written now."""
        current = self.clock.current
        return {
            "format": MANIFEST_FORMAT,
            "version": MANIFEST_VERSION,
            "run_id": self.run_id,
            "rank": self.rank,
            "size": self.size,
            "hostname": self.hostname,
            # how the job was started and which engine moved its tensors (mpi, gloo)
            "launcher": self.job.get("launcher"),
            "backend": self.job.get("backend"),
            # a rank's wait on an op starts a cycle at once (not at the cycle's pace): the
            # straggler bar then needs no cycle of slack
            "negotiates_on_wait": bool(self.job.get("negotiates_on_wait", False)),
            "os_pid": os.getpid(),
            # the process writing the trace file: until it exits, the file may still grow
            # (after a SIGKILL of the rank it drains what the rank handed over, then exits)
            "renderer_pid": self._process.pid if self._process is not None else None,
            "trace_file": os.path.basename(self.path),
            "start_unix_ns": self._start_unix_ns,
            "start_local_ns": self._start_local_ns,
            "end_unix_ns": self._end_pair[0] if self._end_pair else None,
            "end_local_ns": self._end_pair[1] if self._end_pair else None,
            "clock": {
                "origin_ns": self.clock.origin_ns,
                "offset_ns": current.offset_ns,
                "error_ns": current.error_ns,
                "rtt_ns": current.rtt_ns,
                "samples": current.samples,
                "skew_us": self.config.clock_skew_us,
                "history": [
                    {"local_ns": t, "offset_ns": o.offset_ns, "error_ns": o.error_ns}
                    for t, o in self.clock.history()
                ],
            },
            "config": _config_dict(self.config),
            "events_written": self._writer.events_written,
            "events_dropped": self._writer.events_dropped,
            # seconds the rank waited for the in-process writer's queue (the renderer
            # process never makes it wait)
            "waited_for_renderer_s": round(float(getattr(self._writer, "waited_s", 0.0)), 3),
            "items_dropped": self._writer.items_dropped,
            "lanes_clamped": (
                self._process.lanes_clamped
                if self._process is not None
                else self._renderer.lanes_clamped
            ),
            "closed": self._closed and self._writer.closed,
        }

    def _refresh_manifest(self, force: bool = False) -> None:
        state = (self._writer.events_written, self._writer.events_dropped, self.clock.version)
        with self._manifest_lock:
            if not force and state == self._manifest_state:
                return
            self._manifest_state = state
            try:
                write_manifest(self.manifest_path, self.manifest())
            except OSError as exc:
                # A full disk: training goes on, the trace keeps what was written. Said
                # once, and not when the trace's write already said it
                # (with a renderer process, that process writes the manifest too, and says it)
                quiet = self._process is not None or getattr(self._writer, "write_failed", False)
                if not self._manifest_failed and not quiet:
                    log.error(
                        "hvdprof: timeline: cannot write %s (%s); the trace keeps what was written",
                        self.manifest_path,
                        exc,
                    )
                self._manifest_failed = True

    def _final_event(self) -> dict[str, Any]:
        current = self.clock.current
        return {
            "name": act.TRACE_END,
            "ph": "M",
            "pid": self.rank,
            "tid": 0,
            "args": {
                "events_written": self._writer.events_written,
                "events_dropped": self._writer.events_dropped,
                "clock_offset_ns": current.offset_ns,
                "clock_error_ns": current.error_ns,
            },
        }

    def _put(self, item: Any, weight: int) -> bool:
        if self._writer.put(item, weight):
            return True
        if self._process is not None:
            return False  # a failed write to the spool: said once where it happened
        if not self._drops_said and not self._closed:
            self._drops_said = True
            log.warning(
                "hvdprof rank %d: the timeline is dropping events: its renderer fell %d "
                "events behind%s. The count is in the manifest and `hvdprof analyze` "
                "reports it; HVDPROF_TIMELINE_QUEUE_SIZE holds more back.",
                self.rank,
                self.config.timeline_queue_size,
                ""
                if self.config.timeline_when_full == "drop"
                else f" and took nothing for {self.config.timeline_stuck_s:g} s (stopped or hung?)",
            )
        return False

    def _say_total_drops(self) -> None:
        dropped = self._writer.events_dropped
        if dropped:
            written = self._writer.events_written
            share = 100.0 * dropped / max(1, dropped + written)
            log.warning(
                "hvdprof rank %d: the timeline dropped %d events in all (%.1f%% of what "
                "was recorded); %s is missing them",
                self.rank,
                dropped,
                share,
                self.path,
            )

    def close(self) -> None:
        """Flush and terminate the trace, then write the final manifest. Idempotent."""
        if self._closed or os.getpid() != self._owner_pid:
            return  # a forked child must not touch the parent's files
        if self._waited:
            self._put_waited()
        self._closed = True
        _OPEN_SINKS.discard(self)
        if self._process is not None:
            self._end_pair = _clock_pair(self.clock)
            # The child writes the last events, the final event and ']' and the manifest
            # built from this one; then the rank rewrites it with the child's final counts.
            self._process.close(self.manifest())
        else:
            self._writer.close()
            self._end_pair = _clock_pair(self.clock)
        self._refresh_manifest(force=True)
        self._say_total_drops()


@atexit.register
def _close_open_sinks() -> None:
    # Registered after the writer's handler, so it runs first: manifests get final counts.
    for sink in list(_OPEN_SINKS):
        with contextlib.suppress(Exception):
            sink.close()
