"""Horovod's process sets in the front end: ``ProcessSet``, registration, and the check
every collective makes of its ``process_set=`` argument.

The runtime keeps the table of sets (:mod:`hvdprof.runtime.process_sets`); this module
keeps the user's ``ProcessSet`` objects in step with it, as Horovod's
``horovod/common/process_sets.py`` does.
"""

from __future__ import annotations

from typing import Any

from hvdprof.runtime import runtime as _rt
from hvdprof.runtime.requests import Signature


class ProcessSet:
    """Horovod's process set: a group of ranks whose collectives run among themselves.

    Made from a list of ranks (or an mpi4py communicator, under MPI) and registered with
    ``init(process_sets=[...])`` or ``add_process_set``; pass it as ``process_set=`` to any
    collective or to ``DistributedOptimizer``. Only the members may submit its ops.
    """

    process_set_id: int | None = None
    ranks: list[int] | None = None
    mpi_comm: Any = None

    def __init__(self, ranks_or_comm: Any) -> None:
        if _is_mpi_comm(ranks_or_comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError(
                "ProcessSet should be initialized with a list of process ranks or an mpi4py "
                f"Comm object, got {ranks_or_comm!r}"
            ) from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError(
                "ProcessSet should be initialized with a list of process ranks or an mpi4py "
                f"Comm object, got {ranks_or_comm!r}"
            )
        self.ranks = [int(r) for r in ranks]

    def _members(self) -> tuple[int, ...] | None:
        """The registered members; None before registration or after removal."""
        runtime = _rt.current()
        if runtime is None or self.process_set_id is None:
            return None
        return runtime.process_sets.members(self.process_set_id)

    def size(self) -> int | None:
        """Number of ranks in the set; None while it is not registered."""
        members = self._members()
        return None if members is None else len(members)

    def rank(self) -> int | None:
        """This process's rank within the set, -1 outside it; None while unregistered."""
        members = self._members()
        if members is None:
            return None
        me = _rt.get().rank
        return members.index(me) if me in members else -1

    def included(self) -> bool | None:
        """Whether this process is in the set; None while it is not registered."""
        members = self._members()
        return None if members is None else _rt.get().rank in members

    def invalidate(self) -> None:
        self.process_set_id = None
        self.ranks = None
        self.mpi_comm = None

    def __str__(self) -> str:
        return (
            f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
            f"mpi_comm={self.mpi_comm})"
        )

    __repr__ = __str__


def _is_mpi_comm(value: Any) -> bool:
    return type(value).__module__.startswith("mpi4py") and hasattr(value, "Get_group")


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0
#: set id -> the ProcessSet objects that name it (Horovod keeps the same table)
_sets_by_id: dict[int, list[ProcessSet]] = {0: [global_process_set]}


def set_of(
    process_set: Any, what: str, outside_ok: bool = False
) -> tuple[int, tuple[int, ...] | None]:
    """``(set id, members)`` of a collective's ``process_set=``; (0, None) for the global
    set. A set that is unknown, removed, or does not include this rank is an error here,
    before anything is submitted, as in Horovod (``outside_ok``: not the last, for the
    optimizer, which a rank outside its set may build and step locally)."""
    if process_set is global_process_set:
        return 0, None
    runtime = _rt.get()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(
            f"hvdprof rank {runtime.rank}: {what} takes process_set= a ProcessSet, got "
            f"{type(process_set).__name__}"
        )
    set_id = process_set.process_set_id
    if set_id == 0:
        return 0, None
    members = None if set_id is None else runtime.process_sets.members(set_id)
    if members is None:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what} got {process_set}, which is not registered "
            "(pass it to init(process_sets=...) or add_process_set first) or was removed"
        )
    if runtime.rank not in members and not outside_ok:
        raise ValueError(
            f"hvdprof rank {runtime.rank}: {what}: rank {runtime.rank} is not part of "
            f"process set {set_id} (ranks {list(members)})"
        )
    return set_id, members


def check_process_set(process_set: Any, what: str) -> None:
    """Raise unless this rank may run ``what`` on ``process_set``."""
    set_of(process_set, what)


def set_size(set_id: int, members: tuple[int, ...] | None, runtime: _rt.Runtime) -> int:
    return runtime.size if members is None else len(members)


def size_of(process_set: Any) -> int:
    """Ranks in ``process_set`` (the job's size for the global set)."""
    set_id, members = set_of(process_set, "size")
    return set_size(set_id, members, _rt.get())


def rank_in(process_set: Any) -> int:
    """This rank's index in ``process_set`` (its rank for the global set)."""
    _, members = set_of(process_set, "rank")
    me = _rt.get().rank
    return me if members is None else members.index(me)


def in_set(sig: Signature, set_id: int) -> Signature:
    return sig._replace(process_set=set_id) if set_id else sig


def _dynamic_allowed() -> bool:
    return _dynamic_sets or _rt.get().config.dynamic_process_sets


_dynamic_sets = False  # init(process_sets="dynamic")


def _ranks_of(process_set: ProcessSet) -> list[int]:
    if process_set.ranks is not None:
        return process_set.ranks
    comm = process_set.mpi_comm
    from mpi4py import MPI  # a communicator was passed: mpi4py is there

    world = MPI.COMM_WORLD.Get_group()
    mine = comm.Get_group()
    ranks = MPI.Group.Translate_ranks(mine, list(range(mine.Get_size())), world)
    return sorted(int(r) for r in ranks)


def _register(process_set: ProcessSet, existing_ok: bool = False) -> ProcessSet:
    from hvdprof.runtime.process_sets import ProcessSetError, normalize_ranks

    runtime = _rt.get()
    ranks = process_set.ranks
    if ranks is None:
        raise ValueError(
            "a process set made from an MPI communicator can only be passed to "
            "init(process_sets=...)"
        )
    try:
        members = normalize_ranks(ranks, runtime.size)
        if members == tuple(range(runtime.size)):
            set_id = 0  # the global set under another name (Horovod does the same)
        else:
            existing = runtime.process_sets.find(members)
            if existing is not None and existing_ok:  # init(): a repeated set is ignored
                set_id = existing
            elif existing is not None:
                raise ProcessSetError(
                    f"a process set with ranks {list(members)} already exists (id {existing})"
                )
            else:
                set_id = runtime.add_process_set(members)
    except ProcessSetError as exc:
        raise ValueError(f"hvdprof rank {runtime.rank}: {exc}") from None
    process_set.process_set_id = set_id
    process_set.ranks = list(members)
    _sets_by_id.setdefault(set_id, []).append(process_set)
    return process_set


def add_process_set(process_set: Any) -> ProcessSet:
    """Register a new process set after ``init`` (every rank calls it, in one order).

    As in Horovod, this needs ``HOROVOD_DYNAMIC_PROCESS_SETS=1`` (or
    ``HVDPROF_DYNAMIC_PROCESS_SETS=1``, or ``init(process_sets="dynamic")``).
    """
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError(
            "Dynamically adding process sets defined by an MPI communicator is not "
            "implemented; build the process set from a list of ranks"
        )
    runtime = _rt.get()
    if not _dynamic_allowed():
        raise ValueError(
            f"hvdprof rank {runtime.rank}: add_process_set needs dynamic process sets: set "
            "HOROVOD_DYNAMIC_PROCESS_SETS=1 (or HVDPROF_DYNAMIC_PROCESS_SETS=1), or call "
            "init(process_sets='dynamic')"
        )
    return _register(process_set)


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a set on every rank (collective); False for the global set.

    Every ``ProcessSet`` object naming it is invalidated, as in Horovod.
    """
    set_id = getattr(process_set, "process_set_id", None)
    if set_id is None:
        raise ValueError(f"remove_process_set: {process_set} is not registered")
    if set_id == 0:
        return False
    runtime = _rt.get()
    if not _dynamic_allowed():
        raise ValueError(
            f"hvdprof rank {runtime.rank}: remove_process_set needs dynamic process sets: "
            "set HOROVOD_DYNAMIC_PROCESS_SETS=1 (or HVDPROF_DYNAMIC_PROCESS_SETS=1)"
        )
    for same in _sets_by_id.pop(set_id, [process_set]):
        same.invalidate()
    process_set.invalidate()
    return runtime.remove_process_set(set_id)


def process_set_by_id(process_set_id: int) -> ProcessSet:
    """The registered set with this id."""
    sets = _sets_by_id.get(process_set_id)
    if not sets:
        raise ValueError(f"No known process set with id {process_set_id}")
    return sets[0]


def process_sets() -> list[ProcessSet]:
    """One registered ``ProcessSet`` per id, by id (the global set first)."""
    return [_sets_by_id[i][0] for i in sorted(_sets_by_id) if _sets_by_id[i]]


def set_up(process_sets: Any, fresh: bool) -> None:
    """``init(process_sets=...)``: forget a previous runtime's sets, then register these."""
    global _dynamic_sets
    if fresh:  # a new runtime knows only the global set
        for set_id in [i for i in _sets_by_id if i]:
            for stale in _sets_by_id.pop(set_id):
                stale.process_set_id = None
        global_process_set.ranks = list(range(_rt.get().size))
        _dynamic_sets = False
    if isinstance(process_sets, str):
        if process_sets != "dynamic":
            raise ValueError(
                f"init(process_sets={process_sets!r}): pass a list of ProcessSet or 'dynamic'"
            )
        _dynamic_sets = True
        return
    # ProcessSet objects, or (as Horovod also takes) lists of ranks or communicators
    sets = [ps if isinstance(ps, ProcessSet) else ProcessSet(ps) for ps in process_sets or ()]
    by_comm = [ps for ps in sets if ps.ranks is None and ps.mpi_comm is not None]
    if by_comm:
        _register_comm_sets(by_comm)
    for process_set in sets:
        if process_set.process_set_id is None:
            _register(process_set, existing_ok=True)


def _register_comm_sets(sets: list[ProcessSet]) -> None:
    """Sets given as communicators: each rank knows only the ones it is in, so every rank
    shares the world ranks of its communicators, and all register the union, in order."""
    from mpi4py import MPI  # a communicator was passed: mpi4py is there

    mine = [tuple(_ranks_of(ps)) for ps in sets]
    everyone = MPI.COMM_WORLD.allgather(mine)
    for members in sorted({m for lists in everyone for m in lists}):
        if _rt.get().process_sets.find(members) is None:
            _register(ProcessSet(list(members)))
    for ps, members in zip(sets, mine, strict=True):
        ps.ranks = list(members)
        ps.process_set_id = (
            0 if len(members) == _rt.get().size else (_rt.get().process_sets.find(members))
        )
        _sets_by_id.setdefault(ps.process_set_id, []).append(ps)
