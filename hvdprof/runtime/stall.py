"""The stall inspector: names the ranks that stopped submitting, and which tensors.

A stall is the most common way a Horovod job hangs silently (a rank takes a different
code path and never submits a tensor, or is stuck loading data). Rank 0 sees every
rank's readiness, on the coordinator path and, through the shared bit vectors, on the
cached path. Once a name has waited HVDPROF_STALL_CHECK_TIME_SECONDS, rank 0 asks the
late ranks for their main thread's stack (over the control channel: see
``CycleLoop._exchange_stacks``) and warns with one line that says where each late rank
is, and whether it waits in another collective (a mismatch) or is outside any (slow).
A deadlock, where every rank is blocked on something another blocked rank will never
submit, is an error on every rank.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.runtime import stacks

log = logging.getLogger("hvdprof")


@dataclass
class Stall:
    """A stall that is due a report: what rank 0 knows before asking for stacks."""

    #: name -> (ranks that submitted it, since when)
    names: dict[str, tuple[frozenset[int], float]]
    kinds: dict[str, str]
    now: float
    #: the longest any stalled name has waited so far
    waited_s: float
    #: HVDPROF_STALL_SHUTDOWN_TIME_SECONDS has elapsed: the job ends
    shutdown: bool
    #: name -> ranks outside its process set (counted in ``names``' ready ranks: never
    #: late for it, and never said to have submitted it)
    outside: dict[str, frozenset[int]] = field(default_factory=dict)

    def missing(self, size: int) -> list[int]:
        """Every rank that has not submitted some stalled name."""
        ready_all = [ready for ready, _ in self.names.values()]
        return [r for r in range(size) if any(r not in ready for ready in ready_all)]


class StallInspector:
    def __init__(self, size: int, check_s: float, shutdown_s: float) -> None:
        self.size = size
        self.check_s = check_s
        self.shutdown_s = shutdown_s
        self._last_warning = 0.0
        self.warnings: list[str] = []

    def inspect(
        self,
        now: float,
        waiting: Mapping[str, tuple[frozenset[int], float]],
        kinds: Mapping[str, str] | None = None,
        outside: Mapping[str, frozenset[int]] | None = None,
    ) -> Stall | None:
        """``waiting``: name -> (ranks ready, since when). A stall due a report (one per
        check interval, or the shutdown), else None."""
        if not waiting or self.check_s <= 0:
            return None
        stalled = {n: v for n, v in waiting.items() if now - v[1] >= self.check_s}
        if not stalled:
            return None
        oldest = now - min(since for _, since in stalled.values())
        shutdown = self.shutdown_s > 0 and oldest >= self.shutdown_s
        if not shutdown and now - self._last_warning < self.check_s:
            return None
        self._last_warning = now
        kinds = kinds or {}
        outside = outside or {}
        return Stall(
            stalled,
            {n: kinds.get(n, "op") for n in stalled},
            now,
            oldest,
            shutdown,
            {n: outside[n] for n in stalled if n in outside},
        )

    def report(self, stall: Stall, states: Mapping[int, Mapping[str, Any]]) -> str:
        """The stall line (logged here as a warning unless it ends the job)."""
        message = describe_stall(self.size, stall, states)
        if stall.shutdown:
            message = (
                f"hvdprof stall: aborting after {stall.waited_s:.1f} s "
                f"(HVDPROF_STALL_SHUTDOWN_TIME_SECONDS={self.shutdown_s:g}). {message}"
            )
        else:
            self.warnings.append(message)
            log.warning("%s", message)
        return message


def _collective(state: Mapping[str, Any] | None) -> str | None:
    """``allreduce 'grad.0' (sequence 2)`` when the rank's main thread waits on an op."""
    coll = state.get("collective") if state else None
    if not coll:
        return None
    return f"{str(coll['kind']).lower()} {coll['name']!r} (sequence {coll['sequence']})"


def describe_stall(size: int, stall: Stall, states: Mapping[int, Mapping[str, Any]]) -> str:
    """One clause per late rank (where it is, in a collective or not), then where the
    ranks that did submit wait.

    ``states``: rank -> ``{"frames": [(function, file, line), ...] innermost first,
    "collective": {"kind", "name", "sequence"} or None}`` as the rank answered.
    """
    parts: list[str] = []
    waiting_on: list[str] = []  # the stalled names the clauses lead with
    mismatch = False
    for rank in stall.missing(size):
        mine = [(n, stall.now - since) for n, (ready, since) in stall.names.items()]
        mine = sorted(
            ((n, w) for n, w in mine if rank not in stall.names[n][0]), key=lambda x: -x[1]
        )
        names = ", ".join(repr(n) for n, _ in mine[:5])
        if len(mine) > 5:
            names += f" and {len(mine) - 5} more"
        clause = f"rank {rank} has not submitted {names} for {mine[0][1]:.1f} s; "
        if mine[0][0] not in waiting_on:
            waiting_on.append(mine[0][0])
        state = states.get(rank)
        inside = _collective(state)
        if state is None:
            clause += "its stack did not arrive"
        elif inside is not None:
            mismatch = True
            first = mine[0][0]
            theirs = f"{stall.kinds.get(first, 'op').lower()} {first!r}"
            clause += (
                f"it waits in {inside}, called from {stacks.where(state['frames'])}: "
                f"a mismatch, it is in a different collective from {theirs}"
            )
        elif state.get("pending"):
            mismatch = True
            first = mine[0][0]
            theirs = f"{stall.kinds.get(first, 'op').lower()} {first!r}"
            ops = ", ".join(f"{str(k).lower()} {n!r}" for k, n in state["pending"])
            clause += (
                f"it is in {stacks.where(state['frames'])}, not waiting, with {ops} "
                f"submitted: a mismatch, a different collective from {theirs}"
            )
        else:
            clause += (
                f"it is in {stacks.where(state['frames'])}: not in a collective "
                "(slow: data loading, compute or I/O)"
            )
        parts.append(clause)
    for name in waiting_on:
        ready = sorted(stall.names[name][0] - stall.outside.get(name, frozenset()))
        kind = stall.kinds.get(name, "op").lower()
        others = [r for r in ready if r != 0]
        if 0 in ready:
            inside = _collective(states.get(0))
            if inside is not None:
                parts.append(f"rank 0 waits in {inside}")
            elif states.get(0):
                where = stacks.where(states[0]["frames"])
                parts.append(f"rank 0 submitted {kind} {name!r} and is in {where}")
            else:
                parts.append(f"rank 0 waits on {kind} {name!r}")
        if others:
            who = f"rank {others[0]}" if len(others) == 1 else f"ranks {others}"
            parts.append(f"{who} submitted {kind} {name!r}")
    text = "hvdprof stall: " + "; ".join(parts) + "."
    if mismatch:
        text += (
            " Ranks must submit the same collectives in the same order "
            "(check for rank-dependent code paths)."
        )
    return text


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
