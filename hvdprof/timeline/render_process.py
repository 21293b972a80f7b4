"""The timeline renderer process: turns one rank's records into its Chrome-trace file.

Started by :class:`hvdprof.timeline.transport.RenderProcess` when a rank opens its
timeline sink::

    python -m hvdprof.timeline.render_process --fd N --init JSON --spool SPOOL \
        [--interval S] [--terminate-on-eof] PATH

It reads frames (see :mod:`hvdprof.timeline.wire`) from the spool the rank appends to,
once per interval (stdin is the doorbell: its end of file says the rank closed the sink or
died; see :mod:`hvdprof.timeline.transport`), decodes the cycles into plain columns, renders them with :class:`~hvdprof.timeline.render.CycleRenderer` and writes them
with a synchronous :class:`~hvdprof.timeline.writer.TimelineWriter` on the inherited file
descriptor ``N`` (crash-safe JSON array, one ``os.write`` per batch, gzip if asked). It
also keeps ``manifest.rank.<r>.json`` up to date (every few seconds and at the end),
merging its own counts into the manifest the rank sends.

Behaviour:

* it runs at the lowest priority, so it uses idle CPU and lags behind under load instead
  of slowing training; the spool absorbs the lag. That takes a
  session of its own whose autogroup the rank renices (see
  :mod:`hvdprof.timeline.transport` for why ``nice`` alone is not enough), plus
  ``os.nice(19)`` where autogroups do not apply;
* it ignores SIGINT and SIGTERM: it must outlive the rank long enough to write what the
  rank sent, and it stops by itself when its input ends, so it never outlives the rank by
  more than the time to render that (its autogroup back at niceness 0 once the rank is
  gone, and out of ``SCHED_IDLE`` where it may);
* the stream ends with the rank's end mark (clean close): the file gets its final event
  and ``]`` (strict JSON), and the manifest ``closed: true``;
* the stream ends without it (the rank exited without closing, or was SIGKILLed):
  everything received is rendered and written; the file is left without the closing
  bracket unless ``--terminate-on-eof``; the manifest says ``closed: false``;
* if the child itself is killed, the file stays loadable up to its last batch.

On exit it prints one JSON line of counts on stdout for the rank (``events_written``,
``child_events_dropped``, ``child_items_dropped``, ``lanes_clamped``, ``closed``,
``bytes_written``). It never imports torch (``sys.modules["torch"]`` is blocked), nor
numpy or the runtime: its start-up is paid at every ``start_timeline``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import pickle
import signal
import sys
import time
from typing import Any

#: niceness of the renderer (the lowest priority)
NICE = 19
#: events rendered before the queued batch is written, even with more input waiting
BATCH_EVENTS = 16384
#: frames handled between checks that the rank is still alive (a cheap getppid())
CHECK_RANK_EVERY = 16

log = logging.getLogger("hvdprof.timeline")


class RenderChild:
    """The state of one renderer process: renderer, writer, manifest and counts."""

    def __init__(
        self, path: str, fd: int, init: dict[str, Any], *, terminate_on_eof: bool = False
    ) -> None:
        from hvdprof.timeline import wire
        from hvdprof.timeline.render import CycleRenderer
        from hvdprof.timeline.writer import TimelineWriter

        if init.get("protocol") != wire.PROTOCOL:
            raise ValueError(
                f"timeline stream protocol {init.get('protocol')!r}, expected {wire.PROTOCOL}"
            )
        self.rank = int(init["rank"])
        self.manifest_path = init.get("manifest_path") or None
        self.terminate_on_eof = terminate_on_eof
        #: the rank (our parent); when getppid() changes, it died
        self.parent = int(init.get("parent_pid") or os.getppid())
        self.rank_gone = False
        self.renderer = CycleRenderer(
            self.rank, str(init.get("hostname", "")), mark_cycles=bool(init.get("mark_cycles")),
            yield_gil=False,
        )  # fmt: skip
        self._manifest_failed = False
        self.writer = TimelineWriter(
            path,
            fd=fd,
            compress=bool(init.get("compress")),
            queue_size=1 << 62,  # flushed synchronously: the spool holds the rest
            render=self.renderer.render,
            final_event=self._final_event,
            periodic=self._periodic,
            periodic_interval_s=float(init.get("manifest_interval_s", 5.0)),
            background=False,
        )
        self.decoder = wire.Decoder()
        self.manifest: dict[str, Any] | None = None
        self.rank_dropped = (0, 0)
        self.ended = False
        self.undecodable = 0
        self._manifest_state: tuple[Any, ...] | None = None
        self._msg = wire

    # --- counts -----------------------------------------------------------------------

    @property
    def child_events_dropped(self) -> int:
        return self.writer.events_dropped + self.decoder.lost_events + self.undecodable

    @property
    def child_items_dropped(self) -> int:
        return self.writer.items_dropped + self.decoder.lost_items + self.undecodable

    def status(self) -> dict[str, Any]:
        return {
            "events_written": self.writer.events_written,
            "child_events_dropped": self.child_events_dropped,
            "child_items_dropped": self.child_items_dropped,
            "lanes_clamped": self.renderer.lanes_clamped,
            "closed": self.ended and self.writer.closed,
            "bytes_written": self.writer.bytes_written,
        }

    # --- input ------------------------------------------------------------------------

    def handle(self, payload: bytes) -> None:
        t = self._msg
        try:
            msg = pickle.loads(payload)
            tag = msg[0]
            if tag == t.MSG_STATE or tag == t.MSG_END:
                _, manifest, dropped_events, dropped_items = msg
                if manifest:
                    self.manifest = manifest
                self.rank_dropped = (int(dropped_events), int(dropped_items))
                if tag == t.MSG_END:
                    self.ended = True
                return
            got = self.decoder.decode_all(msg)
        except Exception:
            self.undecodable += 1
            if self.undecodable <= 3:
                log.exception("could not decode a message from the rank; it is dropped")
            return
        for item in got:
            self.writer.put(*item)

    def run(self, reader: Any) -> None:
        """Consume the stream until the end mark or end of input."""
        writer = self.writer
        frames = 0
        while not self.ended:
            payload = reader.next_frame()
            if payload is None:
                if writer.pending:
                    writer.flush()  # before waiting: the file is never far behind
                self.check_rank()
                if not reader.fill():
                    break
                continue
            self.handle(payload)
            frames += 1
            if frames % CHECK_RANK_EVERY == 0:
                self.check_rank()
            if writer.pending >= BATCH_EVENTS:
                writer.flush()
        if reader.leftover and not self.ended:
            log.warning(
                "the rank's stream ended inside a message (%d bytes); that message is lost",
                reader.leftover,
            )

    # --- output -----------------------------------------------------------------------

    def _final_event(self) -> dict[str, Any]:
        clock = (self.manifest or {}).get("clock") or {}
        args: dict[str, Any] = {
            "events_written": self.writer.events_written,
            "events_dropped": self.rank_dropped[0] + self.child_events_dropped,
            "clock_offset_ns": clock.get("offset_ns", 0),
            "clock_error_ns": clock.get("error_ns", 0),
        }
        if not self.ended:
            args["producer_lost"] = True
        return {"name": _trace_end(), "ph": "M", "pid": self.rank, "tid": 0, "args": args}

    def write_manifest(self, force: bool = False) -> None:
        if self.manifest is None or not self.manifest_path:
            return
        state = (
            id(self.manifest),
            self.writer.events_written,
            self.rank_dropped,
            self.child_events_dropped,
            self.writer.closed,
        )
        if not force and state == self._manifest_state:
            return
        self._manifest_state = state
        from hvdprof.timeline.manifest import write_manifest

        manifest = dict(self.manifest)
        manifest.update(
            events_written=self.writer.events_written,
            events_dropped=self.rank_dropped[0] + self.child_events_dropped,
            items_dropped=self.rank_dropped[1] + self.child_items_dropped,
            lanes_clamped=self.renderer.lanes_clamped,
            closed=self.ended and self.writer.closed,
        )
        try:
            write_manifest(self.manifest_path, manifest)
        except OSError as exc:
            # said once, and not at all when the trace's own write already said the disk
            # is full: one line per rank, naming the file and the error
            if not self._manifest_failed and not self.writer.write_failed:
                log.error("cannot write %s: %s", self.manifest_path, exc)
            self._manifest_failed = True

    def _periodic(self) -> None:
        self.write_manifest()

    def check_rank(self) -> None:
        """Notice the rank's death (we were reparented) before the stream runs dry."""
        if not self.rank_gone and os.getppid() != self.parent:
            self.on_rank_gone()

    def on_rank_gone(self) -> None:
        """The rank is gone and nobody waits on training any more: finish quickly.

        Leaving SCHED_IDLE needs privilege (CAP_SYS_NICE or RLIMIT_NICE); where it is refused
        the file is finished on idle CPU, and the manifest's ``renderer_pid`` says when.
        """
        self.rank_gone = True
        set_autogroup_nice(os.getpid(), 0)
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))

    def finish(self) -> None:
        """Write the rest; terminate the file if the rank closed it (or when asked to)."""
        if not self.ended and not self.rank_gone:
            self.on_rank_gone()
        if self.ended or self.terminate_on_eof:
            self.writer.close()
        else:
            self.writer.abandon()
        self.write_manifest(force=True)


def _remove_spool(path: str, child: RenderChild, reader: Any) -> None:
    """The spool goes once everything in it is in the trace; kept (and said) otherwise."""
    if (child.ended or reader.eof) and not child.writer.write_failed:
        with contextlib.suppress(OSError):
            os.unlink(path)
    else:
        log.warning("%s keeps the records the trace lacks", path)


def set_autogroup_nice(pid: int, nice: int) -> bool:
    """Set the niceness of the autogroup (session) of process ``pid``; False if not possible.

    Only for a process that leads its own session: the value applies to every process of
    the session. Raising it (lower priority) needs no privilege; neither does going back
    down to 0. No effect where autogroups are off or the process is in a non-root cgroup.
    """
    try:
        with open(f"/proc/{pid}/autogroup", "w") as f:
            f.write(str(int(nice)))
    except (OSError, ValueError):
        return False
    return True


def _trace_end() -> str:
    from hvdprof.common.activities import TRACE_END

    return TRACE_END


def _lower_priority() -> None:
    """``nice 19`` and ``SCHED_IDLE``: any waking thread of the rank preempts us at once.

    (Under EEVDF a running task otherwise keeps the CPU for its slice, ~3 ms, when a rank
    thread wakes.) The policy stays for good; our autogroup's niceness, which the rank
    lowers when it waits for us, is what sets our share then.
    """
    with contextlib.suppress(OSError):
        os.nice(NICE)
    with contextlib.suppress(AttributeError, OSError):
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))


def _ignore_group_signals() -> None:
    for signum in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN)


def main(argv: list[str] | None = None) -> int:
    _ignore_group_signals()
    sys.modules["torch"] = None  # type: ignore[assignment]  # nothing here may need it
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name if __spec__ else __name__}")
    parser.add_argument("--fd", type=int, required=True, help="the trace file, open for writing")
    parser.add_argument("--init", required=True, help="JSON: rank, hostname, size, ...")
    parser.add_argument("--spool", help="the file the rank appends frames to (default: stdin)")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between reads")
    parser.add_argument("--terminate-on-eof", action="store_true")
    parser.add_argument("path")
    args = parser.parse_args(argv)
    init = json.loads(args.init)
    logging.basicConfig(
        level=logging.WARNING,
        format=f"hvdprof timeline renderer (rank {init.get('rank')}): %(message)s",
    )
    _lower_priority()

    from hvdprof.timeline.wire import FrameReader

    started = time.monotonic()
    child = RenderChild(args.path, args.fd, init, terminate_on_eof=args.terminate_on_eof)
    stdin = sys.stdin.fileno()
    # read-write: giving read bytes back to the file system (a hole) needs a writable fd
    spool = os.open(args.spool, os.O_RDWR | os.O_CLOEXEC) if args.spool else -1
    if spool >= 0:
        from hvdprof.timeline.manifest import live_requested

        directory = os.path.dirname(os.path.abspath(args.path))
        reader = FrameReader(
            spool, stdin, interval_s=args.interval, wanted=lambda: live_requested(directory)
        )
    else:
        reader = FrameReader(stdin)
    try:
        child.run(reader)
    finally:
        child.finish()
        if spool >= 0:
            _remove_spool(args.spool, child, reader)
        status = child.status()
        status["seconds"] = round(time.monotonic() - started, 3)
        with contextlib.suppress(OSError):
            os.write(sys.stdout.fileno(), (json.dumps(status) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
