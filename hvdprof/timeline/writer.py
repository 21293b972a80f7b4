"""A crash-safe, never-blocking writer of Chrome JSON-array trace files.

Horovod's timeline writer could leave a file that no tool opens (sometimes only ``[``)
after a crash or Ctrl+C, and recording slowed training. This writer:

* never blocks the producer: items go into a bounded in-memory queue; when it is full they
  are dropped and counted, and the count lands in the file and the manifest;
* formats and writes on its own daemon thread, in batches, each batch one ``os.write`` of
  complete lines on a raw file descriptor, so even SIGKILL leaves only whole events;
* writes ``[`` then one JSON object per line followed by ``,`` (the form Chrome and Perfetto
  accept without the closing bracket), and on a clean close a last metadata event without
  the comma and ``]``, which makes the file strictly valid JSON;
* optionally gzips, flushing the deflate stream with ``Z_SYNC_FLUSH`` after every batch so a
  truncated ``.json.gz`` still decompresses up to its last batch.

In a rank the timeline normally renders in a separate process
(:mod:`hvdprof.timeline.render_process`), which drives this writer *synchronously*
(``background=False``: no thread; it calls :meth:`TimelineWriter.flush` itself, so a slow
disk only makes it lag behind its spool instead of dropping events). The background thread is
the in-process fallback, and what standalone users of the class get.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import math
import os
import threading
import time
import weakref
import zlib
from collections.abc import Callable, Iterable
from typing import Any

from hvdprof.common.activities import TRACE_END
from hvdprof.errors import HvdprofError
from hvdprof.timeline.event_queue import EventQueue

log = logging.getLogger("hvdprof.timeline")

#: Renders one queued item into JSON texts, one per event (no trailing comma or newline),
#: or a :class:`Lines`, whose texts may each hold several events.
Renderer = Callable[[Any], Iterable[str]]


class Lines(list):  # type: ignore[type-arg]
    """Rendered texts, some holding several events joined by ``",\n"``; ``events`` counts
    them all. (Building one text per op instead of one per event is a good part of what
    the renderer saves.)"""

    __slots__ = ("events",)

    def __init__(self) -> None:
        super().__init__()
        self.events = 0


_HEADER = b"[\n"
_GZIP_LEVEL = 3  # trace JSON compresses ~10x even at low levels; keep the writer cheap
_MAX_BATCH_BYTES = 4 << 20
#: events formatted between voluntary GIL releases
_EVENTS_PER_GIL_SLICE = 256


def dumps_event(event: dict[str, Any]) -> str:
    """One event as compact JSON, robust to anything a caller may put in ``args``.

    ``json.dumps`` escapes quotes, backslashes, control characters and non-ASCII in names,
    which Horovod did not. Values JSON cannot hold (NaN, infinities, tensors, dtypes) become
    strings instead of producing an invalid file or an exception on the writer thread.
    """
    try:
        return json.dumps(event, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError):
        return json.dumps(_jsonable(event), separators=(",", ":"), allow_nan=False)


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _render_default(item: Any) -> Iterable[str]:
    if isinstance(item, str):
        return (item,)
    return (dumps_event(item),)


class TimelineWriter:
    """Background writer of one Chrome-trace file.

    ``put(item, weight)`` enqueues anything ``render`` understands (by default an event
    dict or an already serialised event string); ``weight`` is the number of events the
    item will become, which is what ``queue_size`` bounds. Rendering happens on the writer
    thread, so producers pay only for an append.
    """

    def __init__(
        self,
        path: str,
        *,
        queue_size: int = 200_000,
        compress: bool | None = None,
        render: Renderer | None = None,
        flush_interval_s: float = 0.2,
        batch_events: int = 8192,
        periodic: Callable[[], None] | None = None,
        periodic_interval_s: float = 5.0,
        final_event: Callable[[], dict[str, Any]] | None = None,
        fd: int | None = None,
        background: bool = True,
        wait_when_full: bool = False,
        stuck_s: float = 2.0,
    ) -> None:
        self.path = os.fspath(path)
        self.compressed = self.path.endswith(".gz") if compress is None else bool(compress)
        self._render = render or _render_default
        self._flush_interval_s = flush_interval_s
        self._periodic = periodic
        self._periodic_interval_s = periodic_interval_s
        self._final_event = final_event
        self._fd = open_trace_file(self.path) if fd is None else fd
        self._owner_pid = os.getpid()
        self._compressor = (
            zlib.compressobj(_GZIP_LEVEL, zlib.DEFLATED, 31) if self.compressed else None
        )
        # waiting for room needs a consumer on another thread: only with ``background``
        self._queue = EventQueue(queue_size, batch_events, wait_when_full and background, stuck_s)
        self._render_failures = 0
        self._written_events = 0
        self._written_bytes = 0
        self._write_failed = False
        self._stopping = False
        self._next_periodic = time.monotonic() + periodic_interval_s
        self._write_raw(self._encode(_HEADER))
        self._thread: threading.Thread | None = None
        if background:
            self._thread = threading.Thread(
                target=self._run,
                name=f"hvdprof-timeline-writer({os.path.basename(self.path)})",
                daemon=True,
            )
            self._thread.start()
            _OPEN_WRITERS.add(self)

    # --- producer side -------------------------------------------------------------

    def put(self, item: Any, weight: int = 1) -> bool:
        """Queue ``item`` (``weight`` events); False when it was dropped. Never blocks."""
        return self._queue.put(item, weight)

    def put_event(self, event: dict[str, Any] | str) -> bool:
        """Queue one event (a dict, or a JSON object already serialised)."""
        return self.put(event, 1)

    # --- counters --------------------------------------------------------------------

    @property
    def events_written(self) -> int:
        """Events on disk so far (excluding the closing metadata event)."""
        return self._written_events

    @property
    def events_dropped(self) -> int:
        """Events dropped: queue full, written after close, or lost to a write error."""
        return self._queue.dropped_events

    @property
    def items_dropped(self) -> int:
        return self._queue.dropped_items

    @property
    def bytes_written(self) -> int:
        """Bytes on disk so far (compressed size for ``.gz``)."""
        return self._written_bytes

    @property
    def pending(self) -> int:
        """Events queued and not yet written."""
        return self._queue.pending

    @property
    def closed(self) -> bool:
        return self._queue.closed

    # --- writer thread ---------------------------------------------------------------

    def _run(self) -> None:
        while True:
            self._queue.wake.wait(self._flush_interval_s)
            self._queue.wake.clear()
            stopping = self._stopping
            self._drain()
            self._maybe_periodic()
            if stopping:
                return

    def _maybe_periodic(self) -> None:
        if self._periodic is not None and time.monotonic() >= self._next_periodic:
            self._next_periodic = time.monotonic() + self._periodic_interval_s
            try:
                self._periodic()
            except Exception:  # a manifest refresh must never kill the writer
                log.exception("timeline periodic task failed")

    def flush(self) -> None:
        """Render and write what is queued now, in the calling thread (``background=False``).

        Also runs the ``periodic`` task when it is due. With a background thread this must
        not be called: the thread is the only renderer.
        """
        if self._thread is not None:
            raise RuntimeError("flush() is for writers created with background=False")
        self._drain()
        self._maybe_periodic()

    def _drain(self) -> None:
        parts: list[str] = []
        size = 0
        events = 0
        queue = self._queue
        since_yield = 0
        for _ in range(len(queue)):
            item, weight = queue.take()
            try:
                lines = self._render(item)
                if type(lines) is Lines:
                    count = lines.events
                else:
                    lines = list(lines)
                    count = len(lines)
            except Exception:
                self._render_failures += 1
                queue.count_dropped(weight)
                if self._render_failures <= 3:
                    log.exception("timeline: could not render an item; it is dropped")
                continue
            if not lines:
                continue
            text = ",\n".join(lines)  # every event is followed by ",\n"
            parts.append(text)
            parts.append(",\n")
            size += len(text) + 2
            events += count
            since_yield += count
            if since_yield >= _EVENTS_PER_GIL_SLICE and self._thread is not None:
                since_yield = 0
                time.sleep(0)  # let the cycle and training threads have the GIL
            if size >= _MAX_BATCH_BYTES:
                self._write_batch(parts, events)
                parts, size, events = [], 0, 0
        if parts:
            self._write_batch(parts, events)

    def _write_batch(self, parts: list[str], events: int) -> None:
        data = self._encode("".join(parts).encode("utf-8", "backslashreplace"))
        if self._write_raw(data):
            self._written_events += events
        else:
            self._queue.count_dropped(events, 0)

    def _encode(self, data: bytes, final: bool = False) -> bytes:
        """Compress ``data`` when gzipping, ending on a flush point (or the stream's end)."""
        if self._compressor is None:
            return data
        mode = zlib.Z_FINISH if final else zlib.Z_SYNC_FLUSH
        return self._compressor.compress(data) + self._compressor.flush(mode)

    @property
    def waited_s(self) -> float:
        """Seconds producers waited for room (lossless mode)."""
        return self._queue.waited_s

    @property
    def write_failed(self) -> bool:
        """True once a write failed (a full disk): said then, and nothing is written after."""
        return self._write_failed

    def _write_raw(self, data: bytes) -> bool:
        """One ``os.write`` (looping only on a short write); False after an I/O error."""
        if self._write_failed:
            return False
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                self._written_bytes += n
                view = view[n:]
        except OSError as exc:
            self._write_failed = True
            log.error(
                "timeline: writing %s failed (%s); further events are dropped", self.path, exc
            )
            return False
        return True

    # --- shutdown ----------------------------------------------------------------------

    def close(self, final_event: dict[str, Any] | None = None, timeout_s: float = 30.0) -> None:
        """Write what is queued, then a last event and ``]``: the file becomes strict JSON.

        The last event is ``final_event``, else the constructor's ``final_event()``, else a
        ``hvdprof_trace_end`` metadata event with the counts.

        Idempotent and safe against concurrent ``put``: items queued before the close are
        written, later ones are counted as dropped. In a forked child it does nothing, so
        the child cannot corrupt the parent's file.
        """
        if not self._queue.close():
            return
        _OPEN_WRITERS.discard(self)
        if os.getpid() != self._owner_pid:
            return
        self._stopping = True
        self._queue.wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout_s)
            if thread.is_alive():
                log.error(
                    "timeline: writer of %s did not stop; the file stays unterminated", self.path
                )
                return
        self._drain()
        if final_event is None:
            final_event = self._final_event() if self._final_event else self._default_final_event()
        # The last element carries no comma: with it the file is strict JSON.
        tail = dumps_event(final_event) + "\n]\n"
        self._write_raw(self._encode(tail.encode("utf-8", "backslashreplace"), final=True))
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def abandon(self) -> None:
        """Write what is queued, then close the file *without* terminating it.

        For a producer that vanished (its rank was killed): the file keeps every event
        received, in the form readers accept without the closing bracket, and says by its
        missing ``]`` that the recording did not end cleanly. Only for ``background=False``.
        """
        if self._thread is not None:
            raise RuntimeError("abandon() is for writers created with background=False")
        if not self._queue.close():
            return
        self._drain()
        if self._compressor is not None:
            # Z_SYNC_FLUSH after every batch already made the stream readable up to here.
            self._compressor = None
        with contextlib.suppress(OSError):
            os.close(self._fd)

    def _default_final_event(self) -> dict[str, Any]:
        return {
            "ph": "M",
            "name": TRACE_END,
            "pid": 0,
            "tid": 0,
            "args": {
                "events_written": self._written_events,
                "events_dropped": self._queue.dropped_events,
            },
        }

    def __enter__(self) -> TimelineWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_trace_file(path: str) -> int:
    """Create (or truncate) a trace file for writing; ``HvdprofError`` naming it on failure."""
    try:
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise HvdprofError(
            f"cannot write the timeline file {path!r}: {exc.strerror or exc}"
            " (check HVDPROF_TIMELINE points to a writable directory)"
        ) from exc


_OPEN_WRITERS: weakref.WeakSet[TimelineWriter] = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:
    """Terminate files still open at interpreter exit (e.g. after Ctrl+C in the main thread).

    atexit runs before daemon threads are frozen, so the writer thread can still drain.
    """
    for writer in list(_OPEN_WRITERS):
        try:
            writer.close(timeout_s=5.0)
        except Exception:
            log.exception("timeline: closing %s at exit failed", writer.path)
