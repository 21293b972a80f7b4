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


def exit_reason(pid: int, how: str) -> str:
    """``its process (pid 4011) exited with os._exit(3)``: the worker's own note of how
    the user's code ended it (:mod:`hvdprof.ray.exit_notes`)."""
    return f"its process (pid {pid}) exited with {how}"


#: what a rank's failed ``hvd.init()`` says when the others did not all come to meet it
_START_FAILURE = re.compile(r"rendezvous at \S+ failed within|connecting to the other ranks failed")
#: a rank whose own rendezvous failed this soon after the first one's was waiting with it
#: (its timer ran out a moment later), not late
CO_WAITER_S = 2.0


def late_failure(
    first: RankFailure,
    failures: list[RankFailure],
    waiting: set[int],
    settled_at: dict[int, float],
    timeout_s: float,
) -> RankFailure | None:
    """The rank a failed start is put down to, when it is not the one whose timer ran out.

    A rank that reaches ``hvd.init()`` after ``timeout_s`` makes the ranks waiting for it
    fail first: rank 0's "rendezvous ... failed" arrives while rank 1 is still in its own
    code. Such a failure names the lowest rank that was still running then and did not
    itself fail to meet the others within :data:`CO_WAITER_S` (those were waiting too).
    None: ``first`` stands (a death, an exception, or every rank was waiting)."""
    if first.died or first.echo or not _START_FAILURE.search(first.reason):
        return None
    co_waiters = {
        f.rank
        for f in failures
        if _START_FAILURE.search(f.reason) and settled_at.get(f.rank, 0.0) <= CO_WAITER_S
    }
    late = sorted(waiting - co_waiters)
    if not late:
        return None
    reason = (
        f"late to hvd.init(): it had not come to the rendezvous when rank {first.rank} "
        f"gave up waiting (timeout_s={timeout_s:g} s bounds the ranks' meeting; rank "
        f"{first.rank}: {first.reason})"
    )
    return RankFailure(late[0], False, reason, first.exc)
