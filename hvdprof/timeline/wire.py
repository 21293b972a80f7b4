"""The stream from a rank to its timeline renderer process: frames, messages, decoding.

What both ends need, and only that: the renderer process imports this module, never the
runtime or numpy (its start-up is paid per ``start_timeline``). The rank's side (encoding,
the spool, the doorbell) is :mod:`hvdprof.timeline.transport`.

Frames are ``<u32 little-endian length><pickle>``; each pickle is a tuple tagged by a
``MSG_*`` constant:

* ``(MSG_STATE, manifest | None, rank_dropped_events, rank_dropped_items)``: the rank's
  manifest (clock offset and error bound, start instant, config) when it changed, and its
  drop counts; the child merges its own counts in and writes the manifest file;
* ``(MSG_OPS, cycle, columns)``: op columns of a cycle, all but its last frame;
* ``(MSG_CYCLE, head, groups, columns, n_ops, shift_ns, weight)``: the rest of the cycle;
  ``shift_ns`` is the clock correction when the cycle was recorded (it changes during a
  run, so it travels with each cycle);
* ``(MSG_ITEM, item, weight)``: any other renderer item (instant, counter, lines);
* ``(MSG_END, manifest, rank_dropped_events, rank_dropped_items)``: the rank closed the
  sink; the child writes the final event and ``]``, and the final manifest;
* ``(MSG_BATCH, [message, ...])``: ``MSG_CYCLE``, ``MSG_ITEM`` and ``MSG_TABLE``
  messages pickled together (the rank batches the small ones: one pickle call per batch,
  not per cycle);
* ``(MSG_TABLE, version, names, kinds)``: the response cache's names and signatures by
  bit. Op columns whose ``names`` is bytes (native int64 cache bits) and ``kinds`` None
  are named by the last table sent: a cycle of cached ops carries no string per op.

``head`` and ``groups`` are as in :func:`hvdprof.timeline.render.cycle_columns`. Op
columns on the wire: ``(names, kinds, t_submit, t_negotiated, ready, ranks, cached,
group_ids, t_done, errors)`` where ``t_negotiated``, ``group_ids`` and ``t_done`` are
one int when every op shares it (``t_negotiated`` always, the others in most cycles: a
list of 2,000 large ints costs the rank 60 µs to pickle), ``ready`` the native int64 bytes
of the ``(ops, ranks)`` readiness matrix, or ``(time, rank)`` when every rank showed every
op at ``time`` and this rank (``rank``) at its ``t_submit`` (the common cycle: the rank
builds no matrix), and ``cached`` one byte per op.
"""

from __future__ import annotations

import os
import select
import struct
from array import array
from collections.abc import Callable
from typing import Any

from hvdprof.timeline.render import ITEM_COLUMNS, OpColumns, as_groups, as_head

#: Bumped when the wire format changes; the child refuses a stream of another version.
PROTOCOL = 6

MSG_STATE = 0
MSG_OPS = 1
MSG_CYCLE = 2
MSG_ITEM = 3
MSG_END = 4
MSG_BATCH = 5
MSG_TABLE = 6

FRAME_HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 30
#: what the renderer reads from the spool at a time
READ_BYTES = 1 << 20
#: the renderer frees the spool's consumed bytes in steps of this many
PUNCH_BYTES = 4 << 20
#: unread spool bytes past which the renderer renders while the rank records, live view
#: or not (64 MiB, about 1.2 million ops: the most it then has left to render at close)
BACKLOG_BYTES = 64 << 20


def frames(payloads: list[bytes]) -> bytes:
    """``payloads`` as consecutive frames, ready to write in one call."""
    if len(payloads) == 1:
        payload = payloads[0]
        return FRAME_HEADER.pack(len(payload)) + payload
    return b"".join(part for p in payloads for part in (FRAME_HEADER.pack(len(p)), p))


class FrameReader:
    """Splits the bytes the rank appended to its spool back into frame payloads.

    The rank appends frames to a spool file (see :mod:`hvdprof.timeline.transport`) and
    holds the write end of a *doorbell* pipe that it never writes: the pipe's end of file
    says the rank closed the sink or died. Between reads the renderer sleeps on the
    doorbell for ``interval_s``, so the rank's writes wake nobody: one wake-up per
    interval instead of one per cycle (a cross-process wake-up per cycle, on cores the
    ranks share, is what the timeline cost training).

    ``spool_fd`` alone (no doorbell) reads a stream to its end: a pipe, or a spool left by
    a renderer that died. ``wanted()``, when given, says whether to read while the rank
    still records (a reader watches the run live, or the spool holds more than
    :data:`BACKLOG_BYTES` unread); until the doorbell rings out, nothing is read
    otherwise, so nothing is rendered beside the training.
    """

    def __init__(
        self,
        spool_fd: int,
        doorbell_fd: int = -1,
        *,
        interval_s: float = 1.0,
        chunk: int = READ_BYTES,
        wanted: Callable[[], bool] | None = None,
    ) -> None:
        self.fd = spool_fd
        self.wanted = wanted
        self.doorbell = doorbell_fd
        self.interval_s = interval_s
        self._chunk = chunk
        self._buf = bytearray()
        self._pos = 0
        #: bytes of the spool read so far
        self.read_bytes = 0
        self._punched = 0
        self.eof = False
        self._rang_out = doorbell_fd < 0

    def next_frame(self) -> bytes | None:
        """The next complete payload already received, or None (call :meth:`fill`)."""
        buf, pos = self._buf, self._pos
        if len(buf) - pos < FRAME_HEADER.size:
            return None
        (n,) = FRAME_HEADER.unpack_from(buf, pos)
        if n > MAX_FRAME_BYTES:
            raise ValueError(f"timeline stream corrupt: a frame of {n} bytes")
        end = pos + FRAME_HEADER.size + n
        if len(buf) < end:
            return None
        payload = bytes(buf[pos + FRAME_HEADER.size : end])
        if end == len(buf):
            buf.clear()
            self._pos = 0
        elif end > (1 << 20) and end * 2 > len(buf):
            del buf[:end]
            self._pos = 0
        else:
            self._pos = end
        return payload

    def fill(self) -> bool:
        """Wait until more bytes arrive; False at the end of the stream (the doorbell's end
        of file, then nothing left in the spool)."""
        while True:
            if not self._rang_out and not self._read_now():
                self._wait()
                continue
            data = os.read(self.fd, self._chunk)
            if data:
                self._buf += data
                self.read_bytes += len(data)
                self._release_read()
                return True
            if self._rang_out:  # the rank is gone and the spool is read to its end
                self.eof = True
                return False
            self._wait()

    def _read_now(self) -> bool:
        if self.wanted is None or self.wanted():
            return True
        try:
            return os.fstat(self.fd).st_size - self.read_bytes >= BACKLOG_BYTES
        except OSError:
            return True

    def _wait(self) -> None:
        """Sleep on the doorbell for up to one interval; note its end of file."""
        ready, _, _ = select.select([self.doorbell], [], [], self.interval_s)
        if ready:
            try:
                rung = os.read(self.doorbell, 64)
            except OSError:
                rung = b""
            if not rung:
                self._rang_out = True

    def _release_read(self) -> None:
        """Give the spool's consumed pages back to the file system (a hole keeps the
        offsets), so a long recording's spool takes no more disk than the renderer's lag."""
        done = self.read_bytes - self.read_bytes % PUNCH_BYTES
        if done - self._punched >= PUNCH_BYTES and punch_hole(
            self.fd, self._punched, done - self._punched
        ):
            self._punched = done

    @property
    def leftover(self) -> int:
        """Bytes of an incomplete frame (at end of stream: the rank died mid-write)."""
        return len(self._buf) - self._pos


def _libc_fallocate() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fallocate = libc.fallocate
    except (ImportError, OSError, AttributeError):
        return None
    fallocate.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long)
    fallocate.restype = ctypes.c_int
    return fallocate


_FALLOCATE: Any = None
_FALLOCATE_LOOKED = False
#: fallocate(2)'s FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE
_PUNCH_HOLE = 0x01 | 0x02


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``length`` bytes of a file from ``offset`` without changing its size (Linux;
    False where the file system or platform cannot)."""
    global _FALLOCATE, _FALLOCATE_LOOKED
    if not _FALLOCATE_LOOKED:
        _FALLOCATE, _FALLOCATE_LOOKED = _libc_fallocate(), True
    if _FALLOCATE is None:
        return False
    return _FALLOCATE(fd, _PUNCH_HOLE, offset, length) == 0


def name_by_table(
    chunk: tuple[Any, ...], table: tuple[list[Any], list[Any]] | None
) -> tuple[Any, ...]:
    """A wire chunk whose ops are named by cache bit, with names and kinds filled in
    (``ValueError`` without a table, or for a bit the table does not name)."""
    bits = chunk[0]
    if type(bits) is not bytes:
        return chunk
    if table is None:
        raise ValueError("ops named by cache bit before any table")
    names, kinds = table
    flat = array("q")
    flat.frombytes(bits)
    try:
        op_names = [names[b] for b in flat]
        op_kinds = [kinds[b] for b in flat]
    except IndexError:
        raise ValueError("a cache bit outside the table") from None
    if None in op_names:
        raise ValueError("a cache bit the table leaves free")
    return (op_names, op_kinds, *chunk[2:])


def _per_op(column: Any, n: int) -> list[Any]:
    """A column that may travel as one int shared by its ``n`` ops, as a list."""
    return [column] * n if type(column) is int else column


def _ready_flat(c: OpColumns) -> list[int]:
    """The readiness matrix of one chunk, flat (ops by ranks), from either wire form."""
    ready = c.ready
    if type(ready) is bytes:
        flat = array("q")
        flat.frombytes(ready)
        return flat.tolist()
    t, rank = ready  # every rank showed every op at t, this rank at its t_submit
    out = [t] * (len(c.t_submit) * c.ranks)
    out[rank :: c.ranks] = c.t_submit
    return out


def join_columns(chunks: list[tuple[Any, ...]]) -> OpColumns:
    """Wire op columns (one or more consecutive chunks, plain :class:`OpColumns` tuples)
    as the renderer's columns."""
    if len(chunks) == 1:
        c = OpColumns._make(chunks[0])
        n = len(c.names)
        return c._replace(
            t_negotiated=_per_op(c.t_negotiated, n),
            ready=_ready_flat(c),
            cached=list(c.cached),
            group_ids=_per_op(c.group_ids, n),
            t_done=_per_op(c.t_done, n),
        )
    names, kinds, t_submit, t_negs, group_ids, t_done = [], [], [], [], [], []
    flat: list[int] = []
    cached_bytes = bytearray()
    errors: dict[int, str] = {}
    ranks = 0
    for c in map(OpColumns._make, chunks):
        base, n = len(names), len(c.names)
        names += c.names
        kinds += c.kinds
        t_submit += c.t_submit
        t_negs += _per_op(c.t_negotiated, n)
        flat += _ready_flat(c)
        cached_bytes += c.cached
        group_ids += _per_op(c.group_ids, n)
        t_done += _per_op(c.t_done, n)
        errors.update({base + i: e for i, e in c.errors.items()})
        ranks = c.ranks
    return OpColumns(names, kinds, t_submit, t_negs, flat, ranks, list(cached_bytes),
                     group_ids, t_done, errors)  # fmt: skip


def message_weight(msg: Any) -> int:
    """The events a damaged message of a batch stood for, where it still says (1 else)."""
    try:
        if msg[0] == MSG_TABLE:
            return 0
        weight = msg[6] if msg[0] == MSG_CYCLE else msg[2]
        return weight if type(weight) is int and weight > 0 else 1
    except Exception:
        return 1


class Decoder:
    """Turns messages back into renderer items: ``(item, weight)`` or None."""

    def __init__(self) -> None:
        self._chunks: list[tuple[Any, ...]] = []
        self._chunks_cycle: int | None = None
        self.lost_items = 0
        self.lost_events = 0
        self.table: tuple[list[Any], list[Any]] | None = None

    def decode_all(self, msg: tuple[Any, ...]) -> list[tuple[tuple[Any, ...], int]]:
        """Every ``(item, weight)`` in ``msg`` (a batch holds several). A message of a
        batch that cannot be decoded is lost alone, counted in ``lost_items``."""
        if msg[0] != MSG_BATCH:
            got = self.decode(msg)
            return [] if got is None else [got]
        out = []
        for inner in msg[1]:
            try:
                got = self.decode(inner)
            except Exception:
                self.lost_items += 1
                self.lost_events += message_weight(inner)
                continue
            if got is not None:
                out.append(got)
        return out

    def decode(self, msg: tuple[Any, ...]) -> tuple[tuple[Any, ...], int] | None:
        tag = msg[0]
        if tag == MSG_OPS:
            _, cycle, columns = msg
            if cycle != self._chunks_cycle:
                self._chunks, self._chunks_cycle = [], cycle  # a cycle cut short: drop it
            self._chunks.append(columns)
            return None
        if tag == MSG_TABLE:
            _, _version, names, kinds = msg
            self.table = (names, kinds)
            return None
        if tag == MSG_CYCLE:
            _, plain_head, plain_groups, columns, n, shift, weight = msg
            head, groups = as_head(plain_head), as_groups(plain_groups)
            chunks = self._chunks if self._chunks_cycle == head.cycle else []
            self._chunks, self._chunks_cycle = [], None
            try:
                named = [name_by_table(c, self.table) for c in (*chunks, columns)]
            except ValueError:
                self.lost_items += 1
                self.lost_events += weight
                return None
            joined = join_columns(named)
            if len(joined.names) != n:
                self.lost_items += 1
                self.lost_events += weight
                return None
            return (ITEM_COLUMNS, head, groups, joined, shift), weight
        if tag == MSG_ITEM:
            return msg[1], msg[2]
        raise ValueError(f"unexpected timeline message tag {tag!r}")
