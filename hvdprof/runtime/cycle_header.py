"""The vector every rank contributes to each cycle's allgather, written and read.

Layout, one row per rank: the length of this rank's slow-path message (4 bytes, little
endian), five flag bytes, then one byte per response-cache entry (1: this rank has
submitted that name and waits for it). Every rank reads the same matrix, so every rank
draws the same conclusions from it without another message.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

HEADER = 9
#: flag columns
SHUTDOWN, JOINED, COMMAND, DIRECTIVE, BLOCKED = 4, 5, 6, 7, 8


@dataclass(slots=True)
class OwnHeader:
    """What this rank says in this cycle's header."""

    payload_len: int = 0  # bytes of this rank's new names for the coordinator
    shutdown: bool = False  # shutdown() was called here
    joined: bool = False  # this rank is inside join()
    command: bool = False  # a collective command (such as a clock sync) waits here
    directive: bool = False  # rank 0 only: orders wait for the next reply
    blocked: bool = False  # this rank's user thread waits on an unfinished op

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
        ):
            if flag:
                header[column] = 1


def nothing_said(matrix: np.ndarray) -> bool:
    """No rank has a message or a flag other than "blocked" (which changes nothing by
    itself: only rank 0's stall inspector reads it, from the last matrix)."""
    return not matrix[:, :BLOCKED].any()


@dataclass(slots=True)
class Gathered:
    """Every rank's header and bits, as this cycle's decisions need them."""

    lengths: np.ndarray  # per rank: bytes of its slow-path message (uint32)
    joined_mask: np.ndarray  # per rank: inside join()
    joined: frozenset[int]
    shutdown_ranks: np.ndarray  # ranks that called shutdown()
    every_rank_commands: bool  # a command waits on every rank: run it now
    directive: bool  # rank 0 has orders: the slow path carries them
    bits: np.ndarray  # (ranks, cache entries): who waits for which cached name

    @classmethod
    def read(cls, matrix: np.ndarray) -> Gathered:
        joined_mask = matrix[:, JOINED].astype(bool)
        return cls(
            lengths=matrix[:, :4].copy().view("<u4").reshape(-1),
            joined_mask=joined_mask,
            joined=frozenset(int(r) for r in np.flatnonzero(joined_mask)),
            shutdown_ranks=np.flatnonzero(matrix[:, SHUTDOWN]),
            every_rank_commands=bool(matrix[:, COMMAND].all()),
            directive=bool(matrix[0, DIRECTIVE]),
            bits=matrix[:, HEADER:],
        )
