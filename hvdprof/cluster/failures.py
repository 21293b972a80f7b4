"""How a job placed by a cluster engine ends when one of its ranks dies or raises.

``hvdprof run`` stops every rank when one fails, so none waits forever in a collective
for a peer that is gone. A cluster driver does the same: it names the rank and where it
ran in one line, gives the other ranks a bounded grace to end on their own (their
collectives fail once the peer is gone), then has the engine stop the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RankFailure:
    """How one rank's call ended badly."""

    rank: int
    died: bool  # its process died (else its function raised)
    reason: str
    exc: BaseException | None
    #: its collective failed because a peer went away: an echo of another failure
    echo: bool = False

    def blame_order(self) -> tuple[int, int]:
        """Which failure the job's end is put down to: a dead rank first, then the user's
        own exception, then an echo; the lowest rank among equals."""
        return (0 if self.died else 2 if self.echo else 1, self.rank)


def failure_line(prefix: str, rank: int, where: str, died: bool, reason: str, others: int) -> str:
    """``<prefix>rank 1 (<where>) died: <reason>; the job is over, its other 1 rank stopped``."""
    place = f" ({where})" if where else ""
    what = "died" if died else "failed"
    line = f"{prefix}rank {rank}{place} {what}: {reason}"
    if others:
        line += f"; the job is over, its other {others} rank{'s' if others != 1 else ''} stopped"
    return line


def first_line(exc: BaseException | str) -> str:
    """The first non-empty line of an error (engines' messages run to many lines)."""
    for line in str(exc).strip().splitlines():
        line = line.strip()
        if line:
            return line
    return type(exc).__name__ if isinstance(exc, BaseException) else "no message"
