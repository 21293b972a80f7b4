"""The vector every rank contributes to each cycle's exchange, and rank 0's reply.

Layout, one row per rank: the length of this rank's slow-path message (4 bytes, little
endian), six flag bytes, then one byte per response-cache entry (1: this rank has
submitted that name and waits for it). Rank 0 gathers every row (the matrix) and replies
with what the cycle's decisions need, reduced: the cache bits set on every active rank
(AND), the flags (OR; AND for commands), and bitmasks of which ranks joined, shut down or
have news, so every rank draws the same conclusions from 2 + K + 3N/8 bytes instead of
N (10 + K). The whole matrix follows the reply only while some rank asks for it (its
timeline records when each rank's bit first showed: the readiness marks) and the matrix
says more than the reply: some bit set on one active rank and not on another, or a rank
inside join(). Otherwise every bit set anywhere is set everywhere and runs now, so each
rank first showed it in this cycle, which the reply already says.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HEADER = 10
#: flag columns
SHUTDOWN, JOINED, COMMAND, DIRECTIVE, BLOCKED, DETAILED = 4, 5, 6, 7, 8, 9

#: the reply's first byte: what kind of cycle this is (see ``CycleLoop._quiet_kind``);
#: QUIET_SLEEP is QUIET_IDLE where ranks can sleep: every rank sleeps until one has work;
#: QUIET_WAIT is QUIET_BUSY where ranks can sleep: every rank sleeps until one has news
#: (the submission the others wait for), or the stall watch's interval passes
WORK, QUIET_IDLE, QUIET_BUSY, QUIET_SLEEP, QUIET_WAIT = 0, 1, 2, 3, 4
#: on the wire only (``Said.kind`` reads it as WORK, with ``sleep_after``): a WORK cycle that
#: leaves nothing anywhere (every bit set is set on every rank, no news, flag or order), so
#: every rank sleeps once it has run the ops, as after a QUIET_SLEEP, instead of ticking
#: one more cycle only to learn that. That cycle came a cycle time after the step's
#: reductions, in the next step's compute: on a 2-core VM it cost a 12 ms step 1 ms, and
#: the ops submitted before it were not held for the rank's wait
WORK_THEN_SLEEP = 5
#: the reply's second byte, bit by bit
_ANY_SHUTDOWN, _ALL_COMMAND, _DIRECTIVE, _ANY_NEWS = 1, 2, 4, 8
_ANY_BIT, FULL, _ANY_JOINED, _ANY_ACTIVE = 16, 32, 64, 128
#: what may leave work for a later cycle: then no rank sleeps after this one
_LEAVES_WORK = _ANY_SHUTDOWN | _DIRECTIVE | _ANY_NEWS | _ANY_JOINED


@dataclass(slots=True)
class OwnHeader:
    """What this rank says in this cycle's header."""

    payload_len: int = 0  # bytes of this rank's new names for the coordinator
    shutdown: bool = False  # shutdown() was called here
    joined: bool = False  # this rank is inside join()
    command: bool = False  # a collective command (such as a clock sync) waits here
    directive: bool = False  # rank 0 only: orders wait for the next reply
    blocked: bool = False  # this rank's user thread waits on an unfinished op
    detailed: bool = False  # this rank records readiness per rank: send the matrix back

    def write(self, header: np.ndarray) -> None:
        header[:] = 0
        if self.payload_len:
            header[:4] = np.frombuffer(self.payload_len.to_bytes(4, "little"), dtype=np.uint8)
        for column, flag in (
            (SHUTDOWN, self.shutdown),
            (JOINED, self.joined),
            (COMMAND, self.command),
            (DIRECTIVE, self.directive),
            (BLOCKED, self.blocked),
            (DETAILED, self.detailed),
        ):
            if flag:
                header[column] = 1


def nothing_said(matrix: np.ndarray) -> bool:
    """No rank has a message or a flag other than "blocked" and "detailed" (which change
    nothing by themselves: only rank 0's stall inspector reads "blocked", from the last
    matrix, and nothing is ready for the readiness marks to record)."""
    return not matrix[:, :BLOCKED].any()


def reply_size(size: int, width: int) -> int:
    """Bytes of rank 0's reduced reply for ``size`` ranks and rows ``width`` bytes wide."""
    return 2 + max(width - HEADER, 0) + 3 * ((size + 7) // 8)


def reduce(matrix: np.ndarray, kind: int, can_sleep: bool = False) -> np.ndarray:
    """Rank 0's reply to the gathered ``matrix`` in a cycle of this ``kind``; a WORK
    cycle that leaves nothing pending anywhere is WORK_THEN_SLEEP where ranks can sleep.

    "Nothing pending" is as of the gather: a rank that submitted while the work ran
    finds its wake flag set and ends its sleep at once, waking the others.
    """
    size, width = matrix.shape
    k, m = width - HEADER, (size + 7) // 8
    out = np.zeros(reply_size(size, width), dtype=np.uint8)
    out[0] = kind
    if kind != WORK:  # a quiet cycle: nothing more is read
        return out
    flags = 0
    bits = matrix[:, HEADER:]
    joined = matrix[:, JOINED].astype(bool)
    masks = 2 + k
    partial = False  # some bit set on one active rank and not on another
    if joined.any():
        flags |= _ANY_JOINED
        out[masks : masks + m] = np.packbits(joined)
        active = ~joined
        partial = True  # (rare: the matrix goes along)
        if active.any():
            flags |= _ANY_ACTIVE
            if k:
                out[2 : 2 + k] = bits[active].min(axis=0)
    else:
        flags |= _ANY_ACTIVE
        if k:
            ready = out[2 : 2 + k]
            ready[:] = bits.min(axis=0)
            partial = size > 1 and bool((bits != ready).any())
    shutdown = matrix[:, SHUTDOWN]
    if shutdown.any():
        flags |= _ANY_SHUTDOWN
        out[masks + m : masks + 2 * m] = np.packbits(shutdown.astype(bool))
    news = matrix[:, :4].any(axis=1)
    if news.any():
        flags |= _ANY_NEWS
        out[masks + 2 * m : masks + 3 * m] = np.packbits(news)
    if matrix[:, COMMAND].all():
        flags |= _ALL_COMMAND
    if matrix[0, DIRECTIVE]:
        flags |= _DIRECTIVE
    if k and bits.any():
        flags |= _ANY_BIT
    if partial and matrix[:, DETAILED].any():
        flags |= FULL
    out[1] = flags
    if can_sleep and not partial and not flags & _LEAVES_WORK and not matrix[:, COMMAND].any():
        out[0] = WORK_THEN_SLEEP
    return out


def _ranks(mask: np.ndarray, size: int) -> np.ndarray:
    return np.flatnonzero(np.unpackbits(mask, count=size))


_NOBODY = np.zeros(0, dtype=np.int64)


@dataclass(slots=True)
class Said:
    """What this cycle's reply says, as the cycle's decisions need it (identical on every
    rank); ``matrix``: every rank's row, on rank 0 and where the reply carried it."""

    kind: int
    shutdown_ranks: np.ndarray  # ranks that called shutdown()
    joined: frozenset[int]  # ranks inside join()
    any_active: bool  # some rank has not joined
    news: np.ndarray  # ranks with new names for the coordinator
    every_rank_commands: bool  # a command waits on every rank: run it now
    directive: bool  # rank 0 has orders: the slow path carries them
    ready: np.ndarray  # cache bits set on every active rank (uint8 per bit)
    any_bit: bool  # some rank waits on some cached name
    matrix: np.ndarray | None
    #: a rank records readiness and the matrix says more than ``ready`` (see ``reduce``)
    full: bool = False
    #: a WORK cycle after which every rank sleeps (``WORK_THEN_SLEEP``)
    sleep_after: bool = False

    @classmethod
    def read(cls, reply: np.ndarray, size: int, matrix: np.ndarray | None) -> Said:
        kind, flags = int(reply[0]), int(reply[1])
        sleep_after = kind == WORK_THEN_SLEEP
        if sleep_after:
            kind = WORK
        m = (size + 7) // 8
        masks = reply.shape[0] - 3 * m
        joined: frozenset[int] = frozenset()
        if flags & _ANY_JOINED:
            joined = frozenset(_ranks(reply[masks : masks + m], size).tolist())
        return cls(
            kind=kind,
            shutdown_ranks=(
                _ranks(reply[masks + m : masks + 2 * m], size) if flags & _ANY_SHUTDOWN else _NOBODY
            ),
            joined=joined,
            any_active=bool(flags & _ANY_ACTIVE),
            news=(
                _ranks(reply[masks + 2 * m : masks + 3 * m], size) if flags & _ANY_NEWS else _NOBODY
            ),
            every_rank_commands=bool(flags & _ALL_COMMAND),
            directive=bool(flags & _DIRECTIVE),
            ready=reply[2:masks],
            any_bit=bool(flags & _ANY_BIT),
            matrix=matrix,
            full=bool(flags & FULL),
            sleep_after=sleep_after,
        )

    def lengths(self, size: int) -> list[int]:
        """Per rank: 1 when it sends the coordinator new names (``gather_bytes``)."""
        out = [0] * size
        for r in self.news.tolist():
            out[r] = 1
        return out
