"""The pipe between a rank and its timeline renderer process.

Rendering a cycle into Chrome JSON costs about 6-11 µs per op (8 events, ~1 KB), and done
on a thread of the rank it competed with training for the GIL and the cores. So the rank
only *ships* its records; :mod:`hvdprof.timeline.render_process`, a child process started
per sink, rebuilds them, renders them with the same
:class:`~hvdprof.timeline.render.CycleRenderer` and writes them with the same
:class:`~hvdprof.timeline.writer.TimelineWriter`.

Scheduling. Linux groups processes by session into *autogroups* and shares CPU fairly
between groups first; the launcher starts every rank in its own session. A child in the
rank's session, even at ``nice 19`` or ``SCHED_IDLE``, is charged to the rank's group:
on a busy machine every millisecond it renders is one the rank's threads wait for
(measured: steps 2-2.5x slower with 2,000 ops per step on 2 loaded cores). So the child
gets a session of its own (``start_new_session``), whose autogroup the rank sets to
niceness 19 right after starting it (:data:`BACKGROUND_NICE`): it then only takes CPU
that no one else wants, and lags under load. When the rank closes the sink it waits for
the child anyway, so it sets the child's autogroup back to 0 first; a child that finds
its input cut (the rank died) does the same. Where autogroups do not apply (disabled, or
non-root cgroups), the child's own ``os.nice(19)`` is what is left. Its own session also
keeps terminal signals away from it; it ends on end of input, never by a group signal.

Rank side (:class:`RenderProcess`):

* :meth:`RenderProcess.put` (the cycle thread, or any producer) encodes the item and
  writes its frames into the pipe at once, on the calling thread, with a non-blocking
  write. What is in the pipe belongs to the kernel and outlives the rank, so a rank killed
  with SIGKILL loses none of the events it recorded: the child reads them after the
  rank's death, renders them and then ends the file (the goal: every op that completed at
  least 50 ms before the kill is in the file; here it is every op whose cycle ended).
* Only when the child lags by more than the pipe holds (enlarged to 1 MiB, ~13,000 ops;
  under load it does lag, by design) do frames wait in the rank, in a backlog bounded in
  events (``HVDPROF_TIMELINE_QUEUE_SIZE``): beyond it, items are dropped and counted. A
  feeder thread writes the backlog as the child makes room, and sends the rank's state
  (clock estimate, drop counts) when it changed. Events in the backlog are the only ones
  a SIGKILL can take with it.
* Encoding: ops travel by column (a few lists and byte strings per frame, pickled at C
  speed), :data:`OPS_PER_FRAME` at a time. Rare items (instants, counters, header lines)
  are pickled after their arguments are reduced to plain JSON-able values, so unpickling
  them can never import torch or user code in the child.

The wire format, and the child's decoding of it, live in :mod:`hvdprof.timeline.wire`.
A stream that ends without ``MSG_END`` means the rank died (SIGKILL, crash): the child
renders and writes everything it received, then (by default) leaves the file without its
closing bracket, which is how readers tell a crashed rank (see
:data:`TERMINATE_ON_PRODUCER_LOSS`), rewrites the manifest (``closed: false``) and exits.
The manifest's ``renderer_pid`` says which process to wait for before reading the file.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import errno
import json
import logging
import os
import pickle
import select
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hvdprof.common.records import NO_TIME as RECORDS_NO_TIME
from hvdprof.common.records import CycleRecord, GroupRecord, OpBatch, TunableParams
from hvdprof.shadowing import PACKAGE_DIR
from hvdprof.timeline.render import (
    GROUP_FIELDS,
    ITEM_COUNTER,
    ITEM_CYCLE,
    ITEM_EVENT,
    ITEM_INSTANT,
    ITEM_LINES,
    NO_TIME,
    PARAM_FIELDS,
    group_tuples,
    head_tuple,
)
from hvdprof.timeline.render_process import set_autogroup_nice
from hvdprof.timeline.wire import (  # noqa: F401  (the stream's names, for this side's users)
    FRAME_HEADER,
    MSG_CYCLE,
    MSG_END,
    MSG_ITEM,
    MSG_OPS,
    MSG_STATE,
    PIPE_BYTES,
    PROTOCOL,
    Decoder,
    FrameReader,
    frames,
)

log = logging.getLogger("hvdprof.timeline")

#: ops per frame: well under 0.2 ms of encoding under the GIL, then a write that releases it
OPS_PER_FRAME = 1024
#: seconds :meth:`RenderProcess.close` waits for the child to finish the file
CLOSE_TIMEOUT_S = 60.0
#: When the rank vanishes without closing the sink (SIGKILL), the child writes every event
#: it received. False: it leaves the file without its closing ``]`` (loadable, and the
#: missing bracket is how readers and ``load_traces`` report the crashed rank). True: it
#: writes a final event with ``"producer_lost": true`` and ``]``, so the file is strict JSON.
TERMINATE_ON_PRODUCER_LOSS = False
#: the module the child runs (``python -m``)
CHILD_MODULE = "hvdprof.timeline.render_process"
#: autogroup niceness of the child while the rank records (0 once the rank closes)
BACKGROUND_NICE = 19

# The renderer's plain forms must match the runtime's records field for field.
if tuple(f.name for f in dataclasses.fields(GroupRecord)) != GROUP_FIELDS:
    raise ImportError("hvdprof.timeline.render.GROUP_FIELDS differs from GroupRecord's fields")
if tuple(f.name for f in dataclasses.fields(TunableParams)) != PARAM_FIELDS:
    raise ImportError("hvdprof.timeline.render.PARAM_FIELDS differs from TunableParams' fields")
if NO_TIME != RECORDS_NO_TIME:
    raise ImportError("hvdprof.timeline.render.NO_TIME differs from the runtime's")
_PICKLE = pickle.HIGHEST_PROTOCOL


def _dumps(msg: Any) -> bytes:
    return pickle.dumps(msg, protocol=_PICKLE)


# --- encoding (rank) ----------------------------------------------------------------------


def portable(value: Any) -> Any:
    """``value`` reduced to what JSON can hold (other objects become their ``str``).

    Applied to the arguments of rare items before they are pickled: unpickling in the
    child must not import torch or user modules. The rendered JSON is the same as
    :func:`~hvdprof.timeline.writer.dumps_event` gives for the original value.
    """
    t = type(value)
    if t is str or t is int or t is float or t is bool or value is None:
        return value
    if isinstance(value, Mapping):
        return {_portable_key(k): portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    for base in (bool, int, float, str):  # subclasses (IntEnum, ...) as their base type
        if isinstance(value, base):
            return base(value)
    return str(value)


def _portable_key(key: Any) -> Any:
    if key is None or type(key) in (str, int, float, bool):
        return key
    for base in (bool, int, float, str):
        if isinstance(key, base):
            return base(key)
    return str(key)


def portable_item(item: tuple[Any, ...]) -> tuple[Any, ...]:
    """A non-cycle renderer item with every user-supplied value made :func:`portable`."""
    tag = item[0]
    if tag == ITEM_INSTANT:
        _, name, t_ns, shift, args, lane, scope = item
        return (tag, str(name), int(t_ns), int(shift), portable(args) if args else None,
                int(lane), str(scope))  # fmt: skip
    if tag == ITEM_COUNTER:
        _, name, t_ns, shift, values = item
        return (tag, str(name), int(t_ns), int(shift), portable(values))
    if tag == ITEM_LINES:
        return (tag, [str(line) for line in item[1]])
    if tag == ITEM_EVENT:
        return (tag, portable(item[1]))
    raise ValueError(f"unknown timeline item tag {tag!r}")


def _columns(batch: OpBatch, start: int, stop: int) -> tuple[Any, ...]:
    """Op rows ``start:stop`` in wire form (see :mod:`hvdprof.timeline.wire`)."""
    whole = start == 0 and stop == len(batch.names)
    names = batch.names if whole else batch.names[start:stop]
    t_neg: Any = batch.t_negotiated if whole else batch.t_negotiated[start:stop]
    if t_neg and t_neg.count(t_neg[0]) == len(t_neg):
        t_neg = t_neg[0]  # one int for the whole frame
    errors = batch.errors
    if errors and not whole:
        errors = {i - start: e for i, e in errors.items() if start <= i < stop}
    return (  # an OpColumns, plain on the wire (see render.head_tuple)
        names,
        batch.kinds if whole else batch.kinds[start:stop],
        batch.t_submit if whole else batch.t_submit[start:stop],
        t_neg,
        batch.ready[start:stop].tobytes(),
        batch.ready.shape[1],
        batch.cached[start:stop].tobytes(),
        batch.group_ids if whole else batch.group_ids[start:stop],
        batch.t_done if whole else batch.t_done[start:stop],
        errors,
    )


def encode_cycle(record: CycleRecord, shift: int, weight: int) -> Iterator[bytes]:
    """The frames' payloads for one cycle, produced lazily (one per :data:`OPS_PER_FRAME`).

    Ops travel by column: a few lists and byte strings per frame, pickled at C speed, with
    no copy of a column when the cycle fits in one frame (the common case).
    """
    ops = record.ops
    batch = ops if isinstance(ops, OpBatch) else OpBatch.from_records(list(ops))
    n = len(batch.names)
    start = 0
    while n - start > OPS_PER_FRAME:
        yield _dumps((MSG_OPS, record.cycle, _columns(batch, start, start + OPS_PER_FRAME)))
        start += OPS_PER_FRAME
    head, groups = head_tuple(record), group_tuples(record)
    yield _dumps((MSG_CYCLE, head, groups, _columns(batch, start, n), n, shift, weight))


def encode_item(item: tuple[Any, ...], weight: int) -> Iterator[bytes]:
    """The frames' payloads for one queued sink item."""
    if item[0] == ITEM_CYCLE:
        return encode_cycle(item[1], item[2], weight)
    return iter((_dumps((MSG_ITEM, portable_item(item), weight)),))


# --- the rank's side of the process --------------------------------------------------------


def _libc_write() -> tuple[Callable[[int, bytes, int], int], Callable[[], int]] | None:
    """libc's ``write`` called through ``ctypes.PyDLL`` (which keeps the GIL), and
    ``get_errno``; None where that is not available."""
    try:
        import ctypes

        write = ctypes.PyDLL(None, use_errno=True).write
    except (ImportError, OSError, AttributeError):
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return write, ctypes.get_errno


_LIBC_WRITE = _libc_write()


def write_keeping_gil(fd: int, data: bytes) -> int:
    """``os.write(fd, data)`` on a non-blocking fd, without releasing the GIL.

    ``os.write`` releases the GIL, and on the cycle thread that invites a hand-off: a
    training thread busy in Python takes it, and the cycle waits up to the 5 ms switch
    interval to get it back (measured here: 2 ms per write on average against a thread
    spinning in Python, 0.09 ms holding the GIL). A write to a non-blocking pipe never
    waits, so the cycle keeps the GIL through it. Raises like ``os.write``
    (``BlockingIOError`` when the pipe is full, ``BrokenPipeError`` when the child is gone).
    """
    if _LIBC_WRITE is None:
        return os.write(fd, data)
    write, get_errno = _LIBC_WRITE
    while True:
        done = write(fd, data, len(data))
        if done >= 0:
            return done
        err = get_errno()
        if err != errno.EINTR:
            raise OSError(err, os.strerror(err))  # EAGAIN: BlockingIOError, EPIPE: ...


def _child_env() -> dict[str, str]:
    """The rank's environment, with this hvdprof first on the path (wherever it came from).

    The folder comes from the package's own spec, not ``hvdprof.__file__``: that is None
    when a folder named ``hvdprof`` beside the script shadowed the package.
    """
    env = dict(os.environ)
    root = os.path.dirname(PACKAGE_DIR)
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = root if not old else root + os.pathsep + old
    return env


class RenderProcess:
    """A started renderer child for one trace file, and the pipe that feeds it.

    ``fd`` is the trace file, open for writing; on success the child owns it (the rank's
    copy is closed). ``init`` (JSON-able) tells the child who it renders for: ``rank``,
    ``hostname``, ``size``, ``mark_cycles``, ``compress``, ``manifest_path``.
    ``manifest()`` and ``manifest_version()`` give the rank's manifest and a number that
    changes when it should be sent again (the clock estimate's version).

    :meth:`put` encodes an item and writes its frames into the pipe at once, from the
    calling thread (the cycle thread, for cycles), without blocking: the pipe is
    non-blocking on this side. Bytes in the pipe belong to the kernel, so they outlive
    the rank: a rank killed with SIGKILL loses nothing it handed over, as long as the
    pipe had room. Only when the child lags by more than the pipe holds (1 MiB, about
    13,000 ops) do frames wait in this process (the *backlog*, bounded by ``queue_size``
    events, beyond which items are dropped and counted) for a feeder thread that writes
    them as the child catches up. The feeder also sends the rank's state (clock
    estimate, drop counts) every ``flush_interval_s`` when it changed.

    Raises ``OSError`` (or ``ValueError``/``SubprocessError``) when the child cannot be
    started; ``fd`` is then still the caller's. Call :meth:`start` once the caller is
    ready for the child to write the manifest: it sends the first state at once.

    Counters mirror :class:`TimelineWriter`'s; those the child keeps (events written,
    lanes clamped) are known once :meth:`close` returns.
    """

    def __init__(
        self,
        path: str,
        fd: int,
        init: Mapping[str, Any],
        *,
        queue_size: int = 200_000,
        flush_interval_s: float = 0.2,
        manifest: Callable[[], dict[str, Any]] | None = None,
        manifest_version: Callable[[], int] | None = None,
        terminate_on_eof: bool | None = None,
        python: str | None = None,
        wait_when_full: bool = True,
        stuck_s: float = 2.0,
    ) -> None:
        self.path = path
        self.manifest_path = str(init.get("manifest_path") or "")
        self._compressed = bool(init.get("compress"))
        self._flush_interval_s = flush_interval_s
        self._manifest = manifest
        self._manifest_version = manifest_version
        self._capacity = max(1, int(queue_size))
        self._lock = threading.Lock()  # the pipe, the backlog, the counters, ``_closed``
        #: signalled (under ``_lock``) whenever the feeder moved backlog into the pipe
        self._room = threading.Condition(self._lock)
        self._wait_when_full = wait_when_full
        self._stuck_s = stuck_s
        #: seconds producers spent waiting for room (``wait_when_full``)
        self.waited_s = 0.0
        self._wake = threading.Event()
        #: encoded bytes waiting for room in the pipe, oldest first, with the events each
        #: completes (an item's weight sits on its last chunk)
        self._backlog: deque[tuple[memoryview, int]] = deque()
        self._backlog_events = 0
        self._dropped_events = 0
        self._dropped_items = 0
        self._encode_failures = 0
        self._sent_events = 0
        self._closed = False
        self._broken = False
        self._stopping = False
        self._final: dict[str, Any] | None = None
        self._sent_state: tuple[Any, int, int] | None = None
        self._status: dict[str, Any] = {}
        self._owner_pid = os.getpid()
        terminate = TERMINATE_ON_PRODUCER_LOSS if terminate_on_eof is None else terminate_on_eof
        exe = python if python is not None else sys.executable
        if not exe:
            raise OSError("no Python interpreter to start (sys.executable is empty)")
        argv = [exe, "-m", CHILD_MODULE, "--fd", str(fd), "--init", json.dumps(dict(init))]
        if terminate:
            argv.append("--terminate-on-eof")
        argv.append(path)
        read_end, write_end = os.pipe()
        try:
            with contextlib.suppress(AttributeError, OSError):  # Linux only; best effort
                import fcntl

                fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            self._proc = subprocess.Popen(
                argv,
                stdin=read_end,
                stdout=subprocess.PIPE,
                pass_fds=(fd,),
                env=_child_env(),
                start_new_session=True,  # its own autogroup: see the module docstring
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        os.close(fd)  # the child has its own copy
        os.set_blocking(write_end, False)  # this end only: the child's reads still block
        self.pid = self._proc.pid
        # Set here rather than in the child, so that close() cannot race it.
        self.background = set_autogroup_nice(self.pid, BACKGROUND_NICE)
        self._pipe = write_end
        self._thread = threading.Thread(
            target=self._run,
            name=f"hvdprof-timeline-feeder({os.path.basename(path)})",
            daemon=True,
        )
        _CLIENTS.add(self)

    def start(self) -> None:
        """Send the rank's first state (the child can write the manifest from now on) and
        start the feeder thread."""
        self._send_state()
        self._thread.start()

    # --- producers ------------------------------------------------------------------

    def put(self, item: Any, weight: int = 1) -> bool:
        """Encode ``item`` (``weight`` events) and write it to the child now; False when it
        was dropped. Never blocks (see the class docstring)."""
        if self._closed:
            self._count_dropped(weight)
            return False
        try:
            payloads = list(encode_item(item, weight))
        except Exception:
            self._count_dropped(weight)
            self._encode_failures += 1
            if self._encode_failures <= 3:
                log.exception("timeline: could not encode an item; it is dropped")
            return False
        data = frames(payloads)
        with self._lock:
            if self._closed or self._broken:
                self._dropped_events += weight
                self._dropped_items += 1
                return False
            full = self._backlog and self._backlog_events + weight > self._capacity
            if full and not (self._wait_when_full and self._wait_for_room_locked(weight)):
                self._dropped_events += weight
                self._dropped_items += 1
                return False
            return self._write_locked(data, weight)

    def _wait_for_room_locked(self, weight: int) -> bool:
        """Backpressure: wait (``_lock`` held, released while waiting) until the backlog
        has room for ``weight`` events. False when the child stopped taking anything for
        ``stuck_s`` (stopped, hung) or the stream closed: then the item drops.

        A lagging renderer under CPU contention still makes progress, so waiting keeps
        every event at the price of slowing the producer; a renderer that makes none must
        not hang the training.
        """
        started = time.monotonic()
        progress_at, sent = started, self._sent_events
        self._wake.set()
        if self.background and self.waited_s == 0.0:
            # the rank now waits for the renderer: it may have the rank's share of the CPU
            set_autogroup_nice(self.pid, 0)
        try:
            while self._backlog and self._backlog_events + weight > self._capacity:
                if self._closed or self._broken or self._stopping:
                    return False
                self._room.wait(0.05)
                now = time.monotonic()
                if self._sent_events != sent:
                    progress_at, sent = now, self._sent_events
                elif now - progress_at > self._stuck_s:
                    return False
            return True
        finally:
            self.waited_s += time.monotonic() - started

    def _write_locked(self, data: bytes, weight: int) -> bool:
        """Write ``data`` now, or queue it (whole, or its unwritten rest) in the backlog."""
        if not self._backlog:
            try:
                done = write_keeping_gil(self._pipe, data)
            except BlockingIOError:
                done = 0
            except OSError as exc:
                self._lost_pipe(exc)
                self._dropped_events += weight
                self._dropped_items += 1
                return False
            if done == len(data):
                self._sent_events += weight
                return True
            self._backlog.append((memoryview(data)[done:], weight))
        else:
            self._backlog.append((memoryview(data), weight))
        self._backlog_events += weight
        self._wake.set()
        return True

    def _count_dropped(self, events: int, items: int = 1) -> None:
        with self._lock:
            self._dropped_events += events
            self._dropped_items += items

    def _drops(self) -> tuple[int, int]:
        with self._lock:
            return self._dropped_events, self._dropped_items

    # --- counters --------------------------------------------------------------------

    @property
    def events_written(self) -> int:
        """Events in the file, as the child last reported (final once closed)."""
        return int(self._status.get("events_written", 0))

    @property
    def events_dropped(self) -> int:
        """Dropped in this rank (backlog full, after close, lost pipe) plus in the child."""
        return self._dropped_events + int(self._status.get("child_events_dropped", 0))

    @property
    def items_dropped(self) -> int:
        return self._dropped_items + int(self._status.get("child_items_dropped", 0))

    @property
    def lanes_clamped(self) -> int:
        return int(self._status.get("lanes_clamped", 0))

    @property
    def bytes_written(self) -> int:
        return int(self._status.get("bytes_written", 0))

    @property
    def pending(self) -> int:
        """Events held in this rank, waiting for room in the pipe (what a SIGKILL loses)."""
        return self._backlog_events

    @property
    def sent_events(self) -> int:
        """Events written into the pipe: from here on, only the child can lose them."""
        return self._sent_events

    @property
    def closed(self) -> bool:
        """Whether the child finished the file with its closing bracket."""
        return self._closed and bool(self._status.get("closed"))

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    # --- feeder thread ---------------------------------------------------------------

    def _run(self) -> None:
        try:
            while True:
                self._wake.wait(self._flush_interval_s)
                self._wake.clear()
                stopping = self._stopping
                self._flush_backlog()
                self._send_state()
                if stopping:
                    break
            self._flush_backlog()
            if self._final is not None:
                self._send_frames([_dumps((MSG_END, self._final, *self._drops()))])
                self._flush_backlog()
        except Exception:
            log.exception("timeline: the feeder of %s failed", self.path)
        finally:
            self._close_pipe()

    def _flush_backlog(self) -> None:
        """Write the backlog, waiting for the child to make room (the feeder's job)."""
        poller = None
        while True:
            with self._lock:
                while self._backlog and not self._broken:
                    view, weight = self._backlog[0]
                    try:
                        done = os.write(self._pipe, view)
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        self._lost_pipe(exc)
                        break
                    if done < len(view):
                        self._backlog[0] = (view[done:], weight)
                        break
                    self._backlog.popleft()
                    self._backlog_events -= weight
                    self._sent_events += weight
                    self._room.notify_all()
                if self._broken:  # nothing will ever take the rest
                    lost = self._backlog_events
                    self._dropped_events += lost
                    self._dropped_items += sum(1 for _, w in self._backlog if w)
                    self._backlog.clear()
                    self._backlog_events = 0
                if not self._backlog:
                    return
            if poller is None:
                poller = select.poll()
                poller.register(self._pipe, select.POLLOUT)
            poller.poll(100)  # ms; the child reads, or is gone (POLLERR)

    def _send_frames(self, payloads: list[bytes]) -> None:
        with self._lock:
            if not self._broken and self._pipe >= 0:
                self._write_locked(frames(payloads), 0)

    def _send_state(self) -> None:
        version = self._manifest_version() if self._manifest_version else 0
        drops = self._drops()
        sent = self._sent_state
        if sent is not None and sent == (version, *drops):
            return
        manifest = None
        if self._manifest is not None and (sent is None or sent[0] != version):
            manifest = self._manifest()
        self._sent_state = (version, *drops)
        self._send_frames([_dumps((MSG_STATE, manifest, *drops))])

    def _lost_pipe(self, exc: OSError) -> None:
        """The child is gone (called with the lock held)."""
        if self._broken:
            return
        self._broken = True
        code = self._proc.poll()
        log.error(
            "timeline: the renderer process of %s is gone (%s%s); further events are dropped",
            self.path,
            exc.strerror or exc,
            "" if code is None else f", exit code {code}",
        )

    def _close_pipe(self) -> None:
        with self._lock:
            fd, self._pipe = self._pipe, -1
        if fd >= 0:
            with contextlib.suppress(OSError):
                os.close(fd)

    # --- shutdown ----------------------------------------------------------------------

    def close(
        self, final_manifest: Mapping[str, Any] | None = None, timeout_s: float = CLOSE_TIMEOUT_S
    ) -> None:
        """Send the backlog and the end mark, then wait (bounded) for the child to finish.

        ``final_manifest`` is the rank's manifest at close (end instant, last clock
        estimate). After ``timeout_s`` the child is killed: the file then keeps what it had
        written, without the closing bracket. Idempotent; a no-op in a forked child.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if os.getpid() != self._owner_pid:
            return
        deadline = time.monotonic() + timeout_s
        if self.background and self._proc.poll() is None:
            # The rank now waits for the child: let it catch up at a normal priority.
            # (Not reaped yet, so the pid is still the child's, even if it has exited.)
            set_autogroup_nice(self.pid, 0)
        self._final = dict(final_manifest) if final_manifest is not None else {}
        self._stopping = True
        self._wake.set()
        if self._thread.ident is None:  # never started: send from here
            self._run()
        else:
            self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.error(
                "timeline: the renderer of %s took no input for %.0f s; stopping it",
                self.path,
                timeout_s,
            )
            self._kill()
            self._thread.join(5.0)
        try:
            self._proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            log.error(
                "timeline: the renderer of %s did not finish within %.0f s; stopping it"
                " (the file keeps what it wrote, without its closing bracket)",
                self.path,
                timeout_s,
            )
            self._kill()
        self._read_status()
        _CLIENTS.discard(self)

    def _kill(self) -> None:
        with contextlib.suppress(OSError):
            self._proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._proc.wait(5.0)

    def _read_status(self) -> None:
        out = self._proc.stdout
        if out is None:
            return
        text = b""
        if self._proc.returncode is not None:  # exited: its end of the pipe is closed
            with contextlib.suppress(OSError, ValueError):
                text = out.read()
        with contextlib.suppress(OSError):
            out.close()
        for line in reversed(text.decode("utf-8", "replace").splitlines()):
            with contextlib.suppress(ValueError):
                status = json.loads(line)
                if isinstance(status, dict):
                    self._status = status
                    return
        # No word from the child (killed, crashed): its last manifest has its counts.
        if self._proc.returncode not in (0, None):
            log.error(
                "timeline: the renderer of %s exited with code %s; the file may lack its"
                " last events",
                self.path,
                self._proc.returncode,
            )
        self._status = {"events_written": 0, "closed": False}
        with contextlib.suppress(OSError, ValueError, TypeError, AttributeError):
            with open(self.manifest_path, encoding="utf-8") as f:
                last = json.load(f)
            self._status["events_written"] = int(last.get("events_written", 0))
            self._status["lanes_clamped"] = int(last.get("lanes_clamped", 0))
        if not self._compressed:
            with contextlib.suppress(OSError):
                self._status["events_written"] = count_events(self.path)

    def _after_fork_in_child(self) -> None:
        """A forked copy of the rank must not hold the pipe open (the child waits for EOF)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._closed = True
        self._broken = True
        self._backlog.clear()
        if self._pipe >= 0:
            with contextlib.suppress(OSError):
                os.close(self._pipe)
            self._pipe = -1


def count_events(path: str) -> int:
    """Events in an uncompressed trace file: one per line, each line starting with ``{``.

    (A raw newline never occurs inside an event: JSON escapes it in strings.) For the
    manifest of a file whose renderer died before reporting its counts.
    """
    count = 0
    with open(path, "rb") as f:
        previous = b"\n"
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n{") + (previous == b"\n" and chunk[:1] == b"{")
            previous = chunk[-1:]
    return count


_CLIENTS: weakref.WeakSet[RenderProcess] = weakref.WeakSet()


def _close_pipes_after_fork() -> None:
    for client in list(_CLIENTS):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_close_pipes_after_fork)


@atexit.register
def _close_open_clients() -> None:
    """Finish files whose sink was dropped without being closed (sinks close theirs first)."""
    for client in list(_CLIENTS):
        try:
            client.close(timeout_s=10.0)
        except Exception:
            log.exception("timeline: closing %s at exit failed", client.path)
