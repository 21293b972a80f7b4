"""The stall inspector: names the ranks that stopped submitting, and which tensors.

A stall is the most common way a Horovod job hangs silently (a rank takes a different
code path and never submits a tensor). Rank 0 sees every rank's readiness, on the
coordinator path and, through the shared bit vectors, on the cached path. A slow rank
gets a warning (and the job waits for it); a deadlock, where every rank is blocked on
something another blocked rank will never submit, is an error on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

log = logging.getLogger("hvdprof")


class StallInspector:
    def __init__(self, size: int, check_s: float, shutdown_s: float) -> None:
        self.size = size
        self.check_s = check_s
        self.shutdown_s = shutdown_s
        self._last_warning = 0.0
        self.warnings: list[str] = []

    def inspect(
        self, now: float, waiting: Mapping[str, tuple[frozenset[int], float]]
    ) -> str | None:
        """``waiting``: name -> (ranks ready, since when). Returns an abort message or None."""
        if not waiting or self.check_s <= 0:
            return None
        stalled = {n: v for n, v in waiting.items() if now - v[1] >= self.check_s}
        if not stalled:
            return None
        oldest = now - min(since for _, since in stalled.values())
        message = self._describe(stalled, now)
        if self.shutdown_s > 0 and oldest >= self.shutdown_s:
            return (
                f"hvdprof stall: aborting after {oldest:.1f} s "
                f"(HVDPROF_STALL_SHUTDOWN_TIME_SECONDS={self.shutdown_s:g}). {message}"
            )
        if now - self._last_warning >= self.check_s:
            self._last_warning = now
            self.warnings.append(message)
            log.warning("%s", message)
        return None

    def _describe(self, stalled: Mapping[str, tuple[frozenset[int], float]], now: float) -> str:
        by_missing: dict[tuple[int, ...], list[tuple[str, float]]] = {}
        for name, (ready, since) in stalled.items():
            missing = tuple(r for r in range(self.size) if r not in ready)
            by_missing.setdefault(missing, []).append((name, now - since))
        parts = []
        for missing, items in sorted(by_missing.items()):
            items.sort(key=lambda x: -x[1])
            names = ", ".join(repr(n) for n, _ in items[:10])
            more = f" and {len(items) - 10} more" if len(items) > 10 else ""
            parts.append(
                f"rank(s) {list(missing)} have not submitted {names}{more} "
                f"(waiting up to {items[0][1]:.1f} s)"
            )
        return (
            "hvdprof stall: some ranks submitted tensors that others have not: "
            + "; ".join(parts)
            + ". Ranks must submit the same collectives (check for rank-dependent code paths)."
        )


class DeadlockDetector:
    """Rank 0: tells a deadlock, which no waiting can end, from a slow rank.

    Every cycle each rank says whether its user thread is blocked waiting on an op that
    has not completed (``handles.user_thread_blocked``). A slow rank is computing, so it
    is not blocked: the others wait for it, and the stall inspector warns as before. But
    when every rank that has not joined is blocked, and the ops they wait on are pending
    (submitted by some ranks, not all), nobody can submit what the others wait for: the
    job will never move again. The state must stay exactly the same, with no op
    completing, for ``confirm_s`` before it counts, so a transient view (a flag seen a
    cycle before the name it waits on) can never end a healthy job.
    """

    def __init__(self, size: int, confirm_s: float) -> None:
        self.size = size
        self.confirm_s = confirm_s
        self._state: tuple[object, ...] | None = None
        self._since = 0.0

    def observe(
        self,
        now: float,
        blocked: Sequence[bool],
        joined: frozenset[int],
        waiting: Mapping[str, tuple[frozenset[int], float]],
        completed: int,
    ) -> bool:
        """True once the ranks have been deadlocked, unchanged, for ``confirm_s``.

        ``blocked[r]``: rank r's user thread is blocked; ``joined``: ranks in ``join()``;
        ``waiting``: pending name -> (ranks that submitted it, since when);
        ``completed``: ops completed so far (any progress resets the clock).
        """
        active = [r for r in range(self.size) if r not in joined]
        if not waiting or not active or not all(blocked[r] for r in active):
            self._state = None
            return False
        state = (
            tuple(bool(b) for b in blocked),
            joined,
            frozenset((name, ready) for name, (ready, _) in waiting.items()),
            completed,
        )
        if state != self._state:
            self._state, self._since = state, now
            return False
        return now - self._since >= self.confirm_s


def describe_deadlock(
    size: int,
    joined: frozenset[int],
    waiting: Mapping[str, tuple[frozenset[int], float]],
    kinds: Mapping[str, str],
    check_s: float,
) -> str:
    """The error every rank raises: each rank, and the names it waits on that others lack."""
    parts = []
    for rank in range(size):
        if rank in joined:
            parts.append(f"rank {rank} has called join() and waits for the others")
            continue
        mine = sorted(name for name, (ready, _) in waiting.items() if rank in ready)
        if not mine:
            parts.append(f"rank {rank} is blocked waiting")
            continue
        shown = []
        for name in mine[:5]:
            ready = waiting[name][0]
            missing = [r for r in range(size) if r not in ready and r not in joined]
            kind = kinds.get(name, "op").lower()
            shown.append(f"{kind} {name!r} (not submitted by rank(s) {missing})")
        more = f" and {len(mine) - 5} more" if len(mine) > 5 else ""
        parts.append(f"rank {rank} waits on " + ", ".join(shown) + more)
    return (
        "hvdprof deadlock: every rank is blocked waiting on collectives that another "
        "blocked rank has not submitted, so none can ever proceed: "
        + "; ".join(parts)
        + ". Ranks must submit the same collectives (check for rank-dependent code paths); "
        f"detected by the stall inspector (HVDPROF_STALL_CHECK_TIME_SECONDS={check_s:g})."
    )
