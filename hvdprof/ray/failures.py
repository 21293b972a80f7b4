"""How a Ray job of hvdprof ends when one of its workers dies or raises.

``hvdprof run`` stops every rank when one fails, so none waits forever in a collective
for a peer that is gone. Ray gives the driver the same knowledge: the future of a dead
actor fails with ``RayActorError``. The driver then names the rank and the node in one
line, gives the other ranks a bounded grace to end on their own (their collectives fail
once the peer is gone) and kills the actors still running after it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hvdprof.errors import HvdprofError, HvdprofInternalError
from hvdprof.ray.layout import WorkerPlace

#: every line the driver prints starts with this
LOG_PREFIX = "hvdprof ray: "


class WorkerFailedError(HvdprofError):
    """A rank of a Ray job died or raised; the job is over (``start()`` begins a new one)."""

    def __init__(self, message: str, rank: int, place: WorkerPlace | None, died: bool) -> None:
        super().__init__(message)
        self.rank = rank
        self.place = place
        self.died = died


@dataclass(frozen=True)
class RankFailure:
    """How one rank's call ended badly."""

    rank: int
    died: bool  # its actor died (else its function raised)
    reason: str
    exc: BaseException
    #: its collective failed because a peer went away: an echo of another failure
    echo: bool = False

    def blame_order(self) -> tuple[int, int]:
        """Which failure the job's end is put down to: a dead rank first, then the user's
        own exception, then an echo; the lowest rank among equals."""
        return (0 if self.died else 2 if self.echo else 1, self.rank)


def is_echo(exc: BaseException) -> bool:
    """Whether a ``RayTaskError`` wraps hvdprof's "a peer has gone" error."""
    return isinstance(getattr(exc, "cause", None), HvdprofInternalError)


def failure_line(rank: int, place: WorkerPlace | None, died: bool, reason: str, others: int) -> str:
    """``hvdprof ray: rank 1 (actor 1a2b3c4d on node 10.0.0.5 (host-a)) died: ...``."""
    where = f" ({place.describe()})" if place is not None else ""
    what = "died" if died else "failed"
    line = f"{LOG_PREFIX}rank {rank}{where} {what}: {reason}"
    if others:
        line += f"; the job is over, its other {others} rank{'s' if others != 1 else ''} stopped"
    return line


def first_line(exc: BaseException) -> str:
    """The first line of an error worth showing (Ray's messages run to many lines)."""
    for line in str(exc).strip().splitlines():
        line = line.strip()
        if line:
            return line
    return type(exc).__name__


def actor_death_reason(exc: BaseException) -> str:
    """Why Ray says an actor died, in one clause: ``its process (pid 4011) ended
    (SYSTEM_ERROR: Worker unexpectedly exits with a connection error code 2)``."""
    text = str(exc)
    pid = re.search(r"\bpid: (\d+)", text)
    kind = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: ([^.]*)", text)
    if kind is None:
        return first_line(exc)
    said = f"{kind[1]}: {detail[1].strip()}" if detail is not None else kind[1]
    return f"its process{f' (pid {pid[1]})' if pid else ''} ended ({said})"


def task_error_reason(exc: BaseException) -> str:
    """``ValueError: bad input`` from a ``RayTaskError`` wrapping the user's exception."""
    cause = getattr(exc, "cause", None)
    if isinstance(cause, BaseException):
        return f"{type(cause).__name__}: {first_line(cause)}"
    return first_line(exc)
