"""The stream from a rank to its timeline renderer process: frames, messages, decoding.

What both ends need, and only that: the renderer process imports this module, never the
runtime or numpy (its start-up is paid per ``start_timeline``). The rank's side (encoding,
the pipe, the feeder) is :mod:`hvdprof.timeline.transport`.

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
  sink; the child writes the final event and ``]``, and the final manifest.

``head`` and ``groups`` are as in :func:`hvdprof.timeline.render.cycle_columns`. Op
columns on the wire: ``(names, kinds, t_submit, t_negotiated, ready, ranks, cached,
group_ids, t_done, errors)`` where ``t_negotiated`` is one int when every op shares it
(it always does, from the cycle), ``ready`` the native int64 bytes of the ``(ops,
ranks)`` readiness matrix and ``cached`` one byte per op.
"""

from __future__ import annotations

import os
import struct
from array import array
from typing import Any

from hvdprof.timeline.render import ITEM_COLUMNS, OpColumns, as_groups, as_head

#: Bumped when the wire format changes; the child refuses a stream of another version.
PROTOCOL = 3

MSG_STATE = 0
MSG_OPS = 1
MSG_CYCLE = 2
MSG_ITEM = 3
MSG_END = 4

FRAME_HEADER = struct.Struct("<I")
MAX_FRAME_BYTES = 1 << 30
#: requested capacity of the pipe to the child (Linux; the default is 64 KiB)
PIPE_BYTES = 1 << 20


def frames(payloads: list[bytes]) -> bytes:
    """``payloads`` as consecutive frames, ready to write in one call."""
    if len(payloads) == 1:
        payload = payloads[0]
        return FRAME_HEADER.pack(len(payload)) + payload
    return b"".join(part for p in payloads for part in (FRAME_HEADER.pack(len(p)), p))


class FrameReader:
    """Splits the byte stream from the rank back into frame payloads."""

    def __init__(self, fd: int, chunk: int = PIPE_BYTES) -> None:
        self.fd = fd
        self._chunk = chunk
        self._buf = bytearray()
        self._pos = 0
        self.eof = False

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
        """Block until more bytes arrive; False at end of stream."""
        data = os.read(self.fd, self._chunk)
        if not data:
            self.eof = True
            return False
        self._buf += data
        return True

    @property
    def leftover(self) -> int:
        """Bytes of an incomplete frame (at end of stream: the rank died mid-write)."""
        return len(self._buf) - self._pos


def join_columns(chunks: list[tuple[Any, ...]]) -> OpColumns:
    """Wire op columns (one or more consecutive chunks, plain :class:`OpColumns` tuples)
    as the renderer's columns."""
    if len(chunks) == 1:
        c = OpColumns._make(chunks[0])
        t_neg = [c.t_negotiated] * len(c.names) if type(c.t_negotiated) is int else c.t_negotiated
        flat = array("q")
        flat.frombytes(c.ready)
        return c._replace(t_negotiated=t_neg, ready=flat.tolist(), cached=list(c.cached))
    names, kinds, t_submit, t_negs, group_ids, t_done = [], [], [], [], [], []
    flat = array("q")
    cached_bytes = bytearray()
    errors: dict[int, str] = {}
    ranks = 0
    for c in map(OpColumns._make, chunks):
        base = len(names)
        names += c.names
        kinds += c.kinds
        t_submit += c.t_submit
        neg = c.t_negotiated
        t_negs += [neg] * len(c.names) if type(neg) is int else neg
        flat.frombytes(c.ready)
        cached_bytes += c.cached
        group_ids += c.group_ids
        t_done += c.t_done
        errors.update({base + i: e for i, e in c.errors.items()})
        ranks = c.ranks
    return OpColumns(names, kinds, t_submit, t_negs, flat.tolist(), ranks, list(cached_bytes),
                     group_ids, t_done, errors)  # fmt: skip


class Decoder:
    """Turns messages back into renderer items: ``(item, weight)`` or None."""

    def __init__(self) -> None:
        self._chunks: list[tuple[Any, ...]] = []
        self._chunks_cycle: int | None = None
        self.lost_items = 0
        self.lost_events = 0

    def decode(self, msg: tuple[Any, ...]) -> tuple[tuple[Any, ...], int] | None:
        tag = msg[0]
        if tag == MSG_OPS:
            _, cycle, columns = msg
            if cycle != self._chunks_cycle:
                self._chunks, self._chunks_cycle = [], cycle  # a cycle cut short: drop it
            self._chunks.append(columns)
            return None
        if tag == MSG_CYCLE:
            _, plain_head, plain_groups, columns, n, shift, weight = msg
            head, groups = as_head(plain_head), as_groups(plain_groups)
            chunks = self._chunks if self._chunks_cycle == head.cycle else []
            self._chunks, self._chunks_cycle = [], None
            joined = join_columns([*chunks, columns])
            if len(joined.names) != n:
                self.lost_items += 1
                self.lost_events += weight
                return None
            return (ITEM_COLUMNS, head, groups, joined, shift), weight
        if tag == MSG_ITEM:
            return msg[1], msg[2]
        raise ValueError(f"unexpected timeline message tag {tag!r}")
