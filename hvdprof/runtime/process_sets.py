"""Process sets: groups of ranks that negotiate, fuse and reduce among themselves.

Horovod users split a job this way for model-parallel and pipeline stages, or to reduce
within a node before across nodes. Every rank keeps an identical table of the sets; the
table changes only inside a command every rank runs at the same cycle
(``Runtime.run_collectively``), so set ids agree everywhere without being exchanged.

Negotiation stays global (one control exchange per cycle, as before): an op of a set is
ready once every member has submitted it, and the responses reach every rank in one
order. Each rank runs only the responses of sets it belongs to, in that order, on the
set's own process group (a Gloo group of its members, or an MPI communicator split from
the job's), so two sets never wait on each other and no set can deadlock another.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

#: id of the set of every rank; always present, never removed
GLOBAL_ID = 0


class ProcessSetError(ValueError):
    """A process set call Horovod refuses too: an empty, duplicate or unknown set."""


def normalize_ranks(ranks: Iterable[int], size: int) -> tuple[int, ...]:
    """Sorted, distinct, in range: the one spelling of a set's members."""
    try:
        members = tuple(sorted({int(r) for r in ranks}))
    except (TypeError, ValueError):
        raise ProcessSetError(f"a process set is a list of integer ranks, got {ranks!r}") from None
    if not members:
        raise ProcessSetError("cannot make an empty process set")
    bad = [r for r in members if not 0 <= r < size]
    if bad:
        raise ProcessSetError(
            f"process set {list(members)} names rank(s) {bad} outside this job of {size} ranks"
        )
    return members


class ProcessSetTable:
    """id -> member ranks (sorted). The same on every rank.

    Ids are never reused within one runtime: an op submitted to a set just removed can
    only fail, never run on a newer set that took its number.
    """

    def __init__(self, size: int) -> None:
        self.size = size
        self._lock = threading.Lock()
        self._members: dict[int, tuple[int, ...]] = {GLOBAL_ID: tuple(range(size))}
        self._next_id = 1
        #: bumped by every add: names each set's rendezvous keys uniquely
        self.serial = 0

    def members(self, set_id: int) -> tuple[int, ...] | None:
        return self._members.get(set_id)

    def includes(self, set_id: int, rank: int) -> bool:
        members = self._members.get(set_id)
        return members is not None and rank in members

    def find(self, members: tuple[int, ...]) -> int | None:
        with self._lock:
            for set_id, ranks in self._members.items():
                if ranks == members:
                    return set_id
        return None

    def ids(self) -> list[int]:
        with self._lock:
            return sorted(self._members)

    def snapshot(self) -> dict[int, tuple[int, ...]]:
        with self._lock:
            return dict(self._members)

    def add(self, members: tuple[int, ...]) -> int:
        """Register ``members`` (normalized) and return the new set's id."""
        with self._lock:
            if members in self._members.values():
                raise ProcessSetError(f"a process set with ranks {list(members)} already exists")
            set_id = self._next_id
            self._next_id += 1
            self.serial += 1
            self._members[set_id] = members
            return set_id

    def remove(self, set_id: int) -> bool:
        """False for the global set and for an id not (or no longer) registered."""
        if set_id == GLOBAL_ID:
            return False
        with self._lock:
            return self._members.pop(set_id, None) is not None
