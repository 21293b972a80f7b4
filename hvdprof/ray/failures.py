"""How a Ray job of hvdprof ends when one of its workers dies or raises.

``hvdprof run`` stops every rank when one fails, so none waits forever in a collective
for a peer that is gone. Ray gives the driver the same knowledge: the future of a dead
actor fails with ``RayActorError``. The driver then names the rank and the node in one
line, gives the other ranks a bounded grace to end on their own (their collectives fail
once the peer is gone) and kills the actors still running after it.
"""

from __future__ import annotations

import re

# shared with hvdprof.spark: hvdprof/cluster/failures.py
from hvdprof.cluster import failures as _shared
from hvdprof.cluster.failures import RankFailure as RankFailure
from hvdprof.cluster.failures import first_line as first_line
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


def is_echo(exc: BaseException) -> bool:
    """Whether a ``RayTaskError`` wraps hvdprof's "a peer has gone" error."""
    return isinstance(getattr(exc, "cause", None), HvdprofInternalError)


def failure_line(rank: int, place: WorkerPlace | None, died: bool, reason: str, others: int) -> str:
    """``hvdprof ray: rank 1 (actor 1a2b3c4d on node 10.0.0.5 (host-a)) died: ...``."""
    where = place.describe() if place is not None else ""
    return _shared.failure_line(LOG_PREFIX, rank, where, died, reason, others)


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
