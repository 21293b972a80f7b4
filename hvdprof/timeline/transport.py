"""The channel between a rank and its timeline renderer process: a spool file.

Rendering a cycle into Chrome JSON costs about 6 µs per op (7 events, ~1 KB); done on a
thread of the rank it competed with training for the GIL and the cores. So the rank only
*ships* its records; :mod:`hvdprof.timeline.render_process`, a child process started per
sink, rebuilds them, renders them with the same
:class:`~hvdprof.timeline.render.CycleRenderer` and writes them with the same
:class:`~hvdprof.timeline.writer.TimelineWriter`.

Why a spool and not a pipe. Measured on a 2-core machine with 2-ms steps (the demo job),
where the timeline cost 41% of the step time although encoding takes 0.2 µs per op: each
rank spent about 0.5 ms more CPU per step with the timeline on, most of it writing every
cycle's frames and every step's counter into the pipe one by one (a few syscalls per
step, on threads the training needs), and the renderer, woken by each write, rendered
beside the training. Now the rank appends its frames to a spool file next to the trace
(``.rank.<r>.spool``) in batches, one ``write`` into the page cache every
:data:`FLUSH_INTERVAL_S` (or :data:`FLUSH_BYTES`), and wakes nobody. The
renderer sleeps, and renders only when it must: when the rank closes the sink (or dies),
while a reader watches the run live (the dashboard touches the run's live mark,
:func:`~hvdprof.timeline.manifest.request_live`; the trace on disk is then at most
:data:`RENDER_INTERVAL_S` behind), or when the spool holds more than
:data:`~hvdprof.timeline.wire.BACKLOG_BYTES` unread. Rendering beside the training, even
at the lowest priority, still cost it (on 2 cores, 2-ms steps: 1.28 x with the renderer
reading every second against 0.97 with it waiting for the end): its caches, its memory
bandwidth, a sibling hardware thread. The renderer gives the read part of the spool back
to the file system (a hole: the spool takes no more disk than the renderer's lag).
Nothing waits for the renderer and nothing is dropped for it: a renderer that lags (it
takes only idle CPU) or is stopped costs disk, not training time.

Crash safety. What the rank wrote is in the page cache, which belongs to the kernel: a
rank killed with SIGKILL loses only the batch it had not written yet (its last
:data:`FLUSH_INTERVAL_S` of records). The rank also holds the write end of a
*doorbell* pipe that it never writes; its end of file (the rank closed the sink, or
died) tells the renderer to read the spool to its end and finish. A stream that ends
without ``MSG_END`` means the rank died: the renderer writes everything, then (by
default) leaves the file without its closing bracket, which is how readers tell a crashed
rank (see :data:`TERMINATE_ON_PRODUCER_LOSS`), rewrites the manifest (``closed: false``)
and exits. The manifest's ``renderer_pid`` says which process to wait for before reading
the file. A spool left behind (the renderer itself was killed) holds the records the
trace lacks.

Scheduling. Linux groups processes by session into *autogroups* and shares CPU fairly
between groups first; the launcher starts every rank in its own session. A child in the
rank's session, even at ``nice 19`` or ``SCHED_IDLE``, is charged to the rank's group.
So the child gets a session of its own (``start_new_session``), whose autogroup the rank
sets to niceness 19 right after starting it (:data:`BACKGROUND_NICE`), and runs
``SCHED_IDLE``: it only takes CPU that no one else wants. When the rank closes the sink it
waits for the child, so it sets the child's autogroup back to 0 first; a child that finds
the rank gone does the same. Its own session also keeps terminal signals away from it; it
ends at the doorbell's end of file, never by a group signal.

Encoding: ops travel by column (a few lists and byte strings per frame, pickled at C
speed), :data:`OPS_PER_FRAME` at a time. Rare items (instants, counters, header lines)
are pickled after their arguments are reduced to plain JSON-able values, so unpickling
them can never import torch or user code in the child. The frames and the child's
decoding of them live in :mod:`hvdprof.timeline.wire`.
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
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from hvdprof.common.records import NO_TIME as RECORDS_NO_TIME
from hvdprof.common.records import CacheTable, CycleRecord, GroupRecord, OpBatch, TunableParams
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
    MSG_BATCH,
    MSG_CYCLE,
    MSG_END,
    MSG_ITEM,
    MSG_OPS,
    MSG_STATE,
    MSG_TABLE,
    PROTOCOL,
    Decoder,
    FrameReader,
    frames,
    message_weight,
)
from hvdprof.trace.manifest import read_manifest

log = logging.getLogger("hvdprof.timeline")

#: ops per frame: well under 0.2 ms of encoding under the GIL, then a write that releases it
OPS_PER_FRAME = 1024
#: small messages (cycles of at most :data:`OPS_PER_FRAME` ops, instants, counters) wait
#: as plain tuples and are pickled together, this many at most per pickle: one pickle
#: call per batch instead of one per cycle, and names and signatures repeated from cycle
#: to cycle are written once per batch (pickle's memo)
BATCH_MESSAGES = 256
#: a cycle of at least this many ops is encoded as it is handed over, on the cycle thread,
#: while its columns are still in that core's caches (with whatever waits before it, in
#: order). 2,000 small tensors a step, back to back, 6 interleaved runs of 400 steps:
#: median step 9.26 ms when the flusher encoded them later, 9.01 encoded at once (7.82
#: without a timeline; faster in 5 of the 6 pairs); the flusher's own CPU fell from ~200
#: to ~30 us a step. Small cycles still wait for the flusher's batch (see
#: :meth:`RenderProcess.put`).
ENCODE_NOW_OPS = 256
#: seconds the renderer sleeps between reads of the spool while the rank records
RENDER_INTERVAL_S = 1.0
#: the rank writes what it recorded to the spool at least this often (seconds; a SIGKILL
#: loses at most the records of the last interval) ...
FLUSH_INTERVAL_S = 0.05
#: ... or as soon as this many bytes wait (one ``write`` per batch, not per item: a small
#: append to a file costs 5-20 µs in the kernel, several per step on small steps)
FLUSH_BYTES = 256 * 1024
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
    whole = start == 0 and stop == len(batch)
    if batch.names is None:  # by response-cache bit: the stream has the table (MSG_TABLE)
        bits = batch.bits
        assert bits is not None
        names: Any = bits if whole else bits[start * 8 : stop * 8]
        kinds = None
    else:
        names = batch.names if whole else batch.names[start:stop]
        kinds = batch.kinds if whole else batch.kinds[start:stop]  # type: ignore[index]
    errors = batch.errors
    if errors and not whole:
        errors = {i - start: e for i, e in errors.items() if start <= i < stop}
    fill = batch.ready_fill if batch.ready is None else None
    if fill is not None:
        ready: Any = fill[:2]  # (time, this rank): the renderer builds the matrix
        ranks = fill[2]
    else:
        matrix = batch.ready_rows()
        ready, ranks = matrix[start:stop].tobytes(), matrix.shape[1]
    return (  # an OpColumns, plain on the wire (see render.head_tuple)
        names,
        kinds,
        batch.t_submit if whole else batch.t_submit[start:stop],
        _shared(batch.t_negotiated if whole else batch.t_negotiated[start:stop]),
        ready,
        ranks,
        batch.cached if whole else batch.cached[start:stop],
        _shared(batch.group_ids if whole else batch.group_ids[start:stop]),
        _shared(batch.t_done if whole else batch.t_done[start:stop]),
        errors,
    )


def _shared(column: list[int]) -> int | list[int]:
    """One int for a column whose ops all share it (see :mod:`hvdprof.timeline.wire`)."""
    if column and column.count(column[0]) == len(column):
        return column[0]
    return column


def encode_cycle(record: CycleRecord, shift: int, weight: int) -> Iterator[bytes]:
    """The frames' payloads for one cycle, produced lazily (one per :data:`OPS_PER_FRAME`).

    Ops travel by column: a few lists and byte strings per frame, pickled at C speed, with
    no copy of a column when the cycle fits in one frame (the common case).
    """
    ops = record.ops
    batch = ops if isinstance(ops, OpBatch) else OpBatch.from_records(list(ops))
    n = len(batch)
    start = 0
    while n - start > OPS_PER_FRAME:
        yield _dumps((MSG_OPS, record.cycle, _columns(batch, start, start + OPS_PER_FRAME)))
        start += OPS_PER_FRAME
    head, groups = head_tuple(record), group_tuples(record)
    yield _dumps((MSG_CYCLE, head, groups, _columns(batch, start, n), n, shift, weight))


#: marks a batch entry that is a cycle not encoded yet (see :meth:`RenderProcess.put`)
_DEFERRED = "cycle"


def small_message(item: tuple[Any, ...], weight: int) -> tuple[Any, ...] | None:
    """``item`` as one plain message that can wait in a batch, or None for a cycle too
    large for one frame (:func:`encode_cycle` then cuts it).

    Everything in it is a snapshot taken now (plain tuples, lists the cycle made for this
    record, bytes), so pickling it later gives what pickling it now would.
    """
    if item[0] != ITEM_CYCLE:
        return (MSG_ITEM, portable_item(item), weight)
    record, shift = item[1], item[2]
    ops = record.ops
    batch = ops if isinstance(ops, OpBatch) else OpBatch.from_records(list(ops))
    n = len(batch)
    if n > OPS_PER_FRAME:
        return None
    return (MSG_CYCLE, head_tuple(record), group_tuples(record), _columns(batch, 0, n), n,
            shift, weight)  # fmt: skip


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
    """``os.write(fd, data)`` on a non-blocking fd or a regular file, keeping the GIL.

    ``os.write`` releases the GIL, and on the cycle thread that invites a hand-off: a
    training thread busy in Python takes it, and the cycle waits up to the 5 ms switch
    interval to get it back (measured here: 2 ms per write on average against a thread
    spinning in Python, 0.09 ms holding the GIL). A write to a non-blocking pipe, or of a
    batch into a file's page cache (the spool), does not wait, so the caller keeps the GIL
    through it. Raises like ``os.write`` (``BlockingIOError`` for a full pipe, ``OSError``
    with ENOSPC for a full disk).
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


def spool_path(trace_path: str) -> str:
    """The spool beside ``DIR/rank.<r>.json[.gz]``: ``DIR/.rank.<r>.spool`` (hidden: no
    reader takes it for a trace)."""
    directory, name = os.path.split(trace_path)
    stem = name.split(".json", 1)[0]
    return os.path.join(directory, f".{stem}.spool")


class RenderProcess:
    """A started renderer child for one trace file, and the spool that feeds it.

    ``fd`` is the trace file, open for writing; on success the child owns it (the rank's
    copy is closed). ``init`` (JSON-able) tells the child who it renders for: ``rank``,
    ``hostname``, ``size``, ``mark_cycles``, ``compress``, ``manifest_path``.
    ``manifest()`` and ``manifest_version()`` give the rank's manifest and a number that
    changes when it should be sent again (the clock estimate's version).

    :meth:`put` encodes an item on the calling thread (the cycle thread, for cycles) and
    adds its frames to a batch in memory; the batch goes to the spool in one ``write``
    into the page cache, which keeps the GIL and wakes no one (see the module docstring),
    when it reaches :data:`FLUSH_BYTES` or, from a thread that wakes every
    :data:`FLUSH_INTERVAL_S` while records come in (and sleeps untimed while none do),
    when it is that old. It never waits for the child. Only a
    failing write (a full disk) drops items; the drop is counted, said once, and the
    spool is cut back to its last whole frame.

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
        manifest: Callable[[], dict[str, Any]] | None = None,
        manifest_version: Callable[[], int] | None = None,
        terminate_on_eof: bool | None = None,
        python: str | None = None,
        interval_s: float = RENDER_INTERVAL_S,
    ) -> None:
        self.path = path
        self.spool = spool_path(path)
        self.manifest_path = str(init.get("manifest_path") or "")
        self._compressed = bool(init.get("compress"))
        self._manifest = manifest
        self._manifest_version = manifest_version
        self._lock = threading.Lock()  # the spool's end, the counters, ``_closed``
        self._dropped_events = 0
        self._dropped_items = 0
        self._encode_failures = 0
        self._sent_events = 0
        self._spool_size = 0
        #: frames recorded but not yet written to the spool, and the events and items
        #: they complete (what a failed write drops)
        self._pending = bytearray()
        #: small messages not pickled yet (see :data:`BATCH_MESSAGES`)
        self._batch: list[tuple[Any, ...]] = []
        self._pending_events = 0
        self._pending_items = 0
        self._write_error: str | None = None
        self._closed = False
        self._sent_state: tuple[Any, int, int] | None = None
        self._status: dict[str, Any] = {}
        self._owner_pid = os.getpid()
        terminate = TERMINATE_ON_PRODUCER_LOSS if terminate_on_eof is None else terminate_on_eof
        exe = python if python is not None else sys.executable
        if not exe:
            raise OSError("no Python interpreter to start (sys.executable is empty)")
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND | os.O_CLOEXEC
        self._spool = os.open(self.spool, flags, 0o600)
        argv = [
            exe, "-m", CHILD_MODULE, "--fd", str(fd), "--init", json.dumps(dict(init)),
            "--spool", self.spool, "--interval", repr(float(interval_s)),
        ]  # fmt: skip
        if terminate:
            argv.append("--terminate-on-eof")
        argv.append(path)
        read_end, write_end = os.pipe()  # the doorbell: its end of file ends the child
        try:
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
            os.close(self._spool)
            with contextlib.suppress(OSError):
                os.unlink(self.spool)
            raise
        finally:
            os.close(read_end)
        os.close(fd)  # the child has its own copy
        self.pid = self._proc.pid
        # Set here rather than in the child, so that close() cannot race it.
        self.background = set_autogroup_nice(self.pid, BACKGROUND_NICE)
        self._doorbell = write_end
        self._tick = threading.Event()  # set: the flusher ends
        #: the flusher waits, without a timeout, for the next put (see _flush_periodically)
        self._parked = False
        self._unpark = threading.Event()
        self._flusher = threading.Thread(
            target=self._flush_periodically,
            name=f"hvdprof-timeline-flush({os.path.basename(path)})",
            daemon=True,
        )
        _CLIENTS.add(self)

    def start(self) -> None:
        """Send the rank's first state (the child can write the manifest from now on) and
        start the thread that writes what waits every :data:`FLUSH_INTERVAL_S`."""
        with self._lock:
            self._send_state_locked()
            self._flush_locked()
        self._flusher.start()

    def _flush_periodically(self) -> None:
        """Write what waits every :data:`FLUSH_INTERVAL_S` while records come in; after an
        interval in which none came, wait without a timeout until one does. A timed
        wake-up costs the rank ~56 µs of CPU on a 2-core VM (measured: a bare
        ``Event.wait(0.05)`` loop used 3.4 ms of CPU a second), which an idle rank (an
        evaluation, a data stall) spent twenty times a second for nothing."""
        while True:
            if self._parked:
                self._unpark.wait()
            if self._tick.wait(FLUSH_INTERVAL_S):
                return
            with self._lock:
                if self._pending or self._batch:
                    self._flush_locked()
                elif not self._closed:
                    self._parked = True
                    self._unpark.clear()

    def _wake_flusher_locked(self) -> None:
        """Something waits to be written: a parked flusher counts its interval from now."""
        if self._parked:
            self._parked = False
            self._unpark.set()

    # --- producers ------------------------------------------------------------------

    def put(self, item: Any, weight: int = 1) -> bool:
        """Add ``item`` (``weight`` events) to the batch the spool gets next (within
        :data:`FLUSH_INTERVAL_S`); False when it was dropped. Never waits for the child.

        A cycle is kept as it is and encoded with the whole batch, mostly on the
        flusher's thread: encoding one cycle at a time on the cycle thread, between the
        training's kernels, cost it 30-70 µs per cycle of code fetched again each time
        (the sink's contract already says a record is not changed once handed over).
        A cycle of :data:`ENCODE_NOW_OPS` ops or more is the exception: its encoding is
        mostly per op, and done now it reads columns the cycle has just written.
        Other items are reduced to plain values now (their arguments may be the caller's).
        """
        if self._closed:
            self._count_dropped(weight)
            return False
        encode_now = False
        if item[0] == ITEM_CYCLE:
            entry: tuple[Any, ...] = (_DEFERRED, item, weight)
            encode_now = len(item[1].ops) >= ENCODE_NOW_OPS
        else:
            try:
                entry = (MSG_ITEM, portable_item(item), weight)
            except Exception:
                self._count_dropped(weight)
                self._said_encode_failure()
                return False
        with self._lock:
            if self._closed:
                self._dropped_events += weight
                self._dropped_items += 1
                return False
            if self._manifest_version is not None and (
                self._sent_state is None or self._sent_state[0] != self._manifest_version()
            ):
                self._send_state_locked()
            self._batch.append(entry)
            self._pending_events += weight
            self._pending_items += 1
            self._wake_flusher_locked()
            if encode_now or len(self._batch) >= BATCH_MESSAGES:
                self._seal_batch_locked()
            if len(self._pending) >= FLUSH_BYTES:
                self._flush_locked()
            return True

    def put_plain(self, items: list[tuple[Any, ...]]) -> int:
        """Add items that are plain data already (the runtime's own counter samples, one
        event each), under one lock and without :func:`portable_item`'s copy; the number
        added (0 when closed: they are counted as dropped)."""
        if self._closed:
            self._count_dropped(len(items), len(items))
            return 0
        with self._lock:
            if self._closed:
                self._dropped_events += len(items)
                self._dropped_items += len(items)
                return 0
            self._batch.extend([(MSG_ITEM, item, 1) for item in items])
            self._pending_events += len(items)
            self._pending_items += len(items)
            self._wake_flusher_locked()
            if len(self._batch) >= BATCH_MESSAGES:
                self._seal_batch_locked()
            return len(items)

    def put_table(self, table: CacheTable) -> None:
        """Send the response cache's names by bit, for the cycles that follow (which name
        their ops by bit). Plain data; stays in order with the puts."""
        msg = (MSG_TABLE, table.version, list(table.names), list(table.kinds))
        with self._lock:
            if not self._closed:
                self._batch.append(msg)
                self._wake_flusher_locked()

    def _said_encode_failure(self) -> None:
        self._encode_failures += 1
        if self._encode_failures <= 3:
            log.exception("timeline: could not encode an item; it is dropped")

    def _drop_pending_locked(self, weight: int) -> None:
        self._pending_events -= weight
        self._pending_items -= 1
        self._dropped_events += weight
        self._dropped_items += 1
        self._said_encode_failure()

    def _seal_batch_locked(self) -> None:
        """What waits in the batch, encoded, in order: the small messages pickled together
        as one frame, a cycle too large for one frame as its own frames. An item that
        cannot be encoded (never expected: plain data) is dropped alone, counted."""
        batch = self._batch
        if not batch:
            return
        self._batch = []
        msgs: list[tuple[Any, ...]] = []
        for entry in batch:
            if entry[0] is not _DEFERRED:
                msgs.append(entry)
                continue
            _, item, weight = entry
            try:
                msg = small_message(item, weight)
                payloads = list(encode_item(item, weight)) if msg is None else None
            except Exception:
                self._drop_pending_locked(weight)
                continue
            if payloads is None:
                msgs.append(msg)  # type: ignore[arg-type]
            else:
                self._append_batch_locked(msgs)
                msgs = []
                self._pending += frames(payloads)
        self._append_batch_locked(msgs)

    def _append_batch_locked(self, msgs: list[tuple[Any, ...]]) -> None:
        if not msgs:
            return
        try:
            self._pending += frames([_dumps((MSG_BATCH, msgs))])
            return
        except Exception:
            pass
        keep = []
        for msg in msgs:
            try:
                _dumps(msg)
            except Exception:
                self._drop_pending_locked(message_weight(msg))
            else:
                keep.append(msg)
        if keep:
            self._pending += frames([_dumps((MSG_BATCH, keep))])

    def _flush_locked(self) -> None:
        """Write what waits to the spool in one call; a failed write drops it, counted."""
        self._seal_batch_locked()
        if not self._pending:
            return
        if self._append_locked(bytes(self._pending)):
            self._sent_events += self._pending_events
        else:
            self._dropped_events += self._pending_events
            self._dropped_items += self._pending_items
        self._pending.clear()
        self._pending_events = self._pending_items = 0

    def _append_locked(self, data: bytes) -> bool:
        """Append whole frames to the spool; on a failed write, cut back to the last whole
        frame (the child must never read half of one)."""
        if self._spool < 0:
            return False
        try:
            done = write_keeping_gil(self._spool, data)
        except OSError as exc:
            done, error = 0, exc.strerror or str(exc)
        else:
            error = None if done == len(data) else os.strerror(errno.ENOSPC)
        if error is None:
            self._spool_size += done
            return True
        if done:
            with contextlib.suppress(OSError):
                os.ftruncate(self._spool, self._spool_size)
        if self._write_error is None:
            log.error(
                "hvdprof: timeline: cannot write %s (%s); events are dropped and counted",
                self.spool,
                error,
            )
        self._write_error = error
        return False

    def _count_dropped(self, events: int, items: int = 1) -> None:
        with self._lock:
            self._dropped_events += events
            self._dropped_items += items

    def _send_state_locked(self) -> None:
        """The rank's manifest (when its version changed) and drop counts, to the child."""
        self._seal_batch_locked()  # what was put before the state goes before it
        version = self._manifest_version() if self._manifest_version else 0
        drops = (self._dropped_events, self._dropped_items)
        sent = self._sent_state
        manifest = None
        if self._manifest is not None and (sent is None or sent[0] != version):
            manifest = self._manifest()
        self._sent_state = (version, *drops)
        self._pending += frames([_dumps((MSG_STATE, manifest, *drops))])

    # --- counters --------------------------------------------------------------------

    @property
    def events_written(self) -> int:
        """Events in the file, as the child last reported (final once closed)."""
        return int(self._status.get("events_written", 0))

    @property
    def events_dropped(self) -> int:
        """Dropped in this rank (a failed spool write, after close) plus in the child."""
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
    def sent_events(self) -> int:
        """Events appended to the spool: from here on, only the child can lose them."""
        return self._sent_events

    @property
    def spool_bytes(self) -> int:
        """Bytes written to the spool so far (not counting the batch in memory)."""
        return self._spool_size

    @property
    def closed(self) -> bool:
        """Whether the child finished the file with its closing bracket."""
        return self._closed and bool(self._status.get("closed"))

    @property
    def returncode(self) -> int | None:
        return self._proc.returncode

    # --- shutdown ----------------------------------------------------------------------

    def close(
        self, final_manifest: Mapping[str, Any] | None = None, timeout_s: float = CLOSE_TIMEOUT_S
    ) -> None:
        """Append the end mark, ring the doorbell out, then wait (bounded) for the child.

        ``final_manifest`` is the rank's manifest at close (end instant, last clock
        estimate). After ``timeout_s`` the child is killed: the file then keeps what it had
        written, without the closing bracket, and the spool the rest. Idempotent; a no-op
        in a forked child.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if os.getpid() != self._owner_pid:
                return
            self._flush_locked()
            final = dict(final_manifest) if final_manifest is not None else {}
            drops = (self._dropped_events, self._dropped_items)
            self._append_locked(frames([_dumps((MSG_END, final, *drops))]))
            spool, self._spool = self._spool, -1
            doorbell, self._doorbell = self._doorbell, -1
        self._tick.set()  # the flusher ends
        self._unpark.set()  # (a parked one too)
        with contextlib.suppress(OSError):
            os.close(spool)
        if self.background and self._proc.poll() is None:
            # The rank now waits for the child: let it catch up at a normal priority.
            # (Not reaped yet, so the pid is still the child's, even if it has exited.)
            set_autogroup_nice(self.pid, 0)
        with contextlib.suppress(OSError):
            os.close(doorbell)  # end of file: the child reads the spool to its end
        try:
            self._proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.error(
                "timeline: the renderer of %s did not finish within %.0f s; stopping it"
                " (the file keeps what it wrote, without its closing bracket; %s the rest)",
                self.path,
                timeout_s,
                self.spool,
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
                " last events, which %s keeps",
                self.path,
                self._proc.returncode,
                self.spool,
            )
        self._status = {"events_written": 0, "closed": False}
        with contextlib.suppress(OSError, ValueError):  # none written, or not a manifest
            last = read_manifest(self.manifest_path)
            self._status["events_written"] = last.events_written
            self._status["lanes_clamped"] = last.lanes_clamped
        if not self._compressed:
            with contextlib.suppress(OSError):
                self._status["events_written"] = count_events(self.path)

    def _after_fork_in_child(self) -> None:
        """A forked copy of the rank must not append to the spool nor hold the doorbell
        open (the child waits for its end of file)."""
        self._lock = threading.Lock()  # another thread may have held it at the fork
        self._closed = True
        self._pending.clear()
        self._batch = []
        for fd in (self._spool, self._doorbell):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._spool = self._doorbell = -1


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


def _close_spools_after_fork() -> None:
    for client in list(_CLIENTS):
        client._after_fork_in_child()


os.register_at_fork(after_in_child=_close_spools_after_fork)


@atexit.register
def _close_open_clients() -> None:
    """Finish files whose sink was dropped without being closed (sinks close theirs first)."""
    for client in list(_CLIENTS):
        try:
            client.close(timeout_s=10.0)
        except Exception:
            log.exception("timeline: closing %s at exit failed", client.path)
