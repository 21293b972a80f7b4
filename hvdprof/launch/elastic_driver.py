"""One elastic driver: the membership of an elastic job, whatever starts its workers.

As Horovod's ``runner/elastic/driver.py`` serves both ``horovodrun --min-np`` and
``horovod.ray.ElasticRayExecutor``, :class:`ElasticDriver` serves both
``hvdprof run --min-np`` (local processes, :mod:`hvdprof.launch.elastic_local`) and
``hvdprof.ray.ElasticRayExecutor`` (Ray actors). It speaks the protocol of
:mod:`hvdprof.runtime.elastic`: it hosts a ``torch.distributed.TCPStore`` that outlives
every worker and publishes the job's membership there one *generation* at a time,
whenever the set of workers changes:

* a worker ends in failure: the others re-form without it, as long as at least
  ``min_np`` remain; below that the job fails (:class:`BelowMinimum`), naming every
  worker gone;
* a worker reports that a collective failed without anyone dying: the same workers
  re-form;
* discovery reports more slots than workers (up to ``max_np``): new workers start, and
  once they are ready a generation including them is published; the running workers
  pick it up at their next ``commit()``. Fewer slots than workers retires the newest.

What differs between launchers (how a worker starts, ends, is named and stopped, and
where slots come from) is a :class:`WorkerPool`; the front end owns the loop that waits
between :meth:`ElasticDriver.step` calls, so each keeps its own way of waiting (signals
and ``--timeout`` locally, ``ray.wait`` on Ray).
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from hvdprof.runtime import elastic as keys

#: A reset request with no dead worker behind it is answered after this long (a death
#: noticed meanwhile is answered at once, with a generation that leaves the dead out).
RESET_GRACE_S = 0.3
#: ``DIR/elastic.json``: every generation of the job
HISTORY_FILE = "elastic.json"

H = TypeVar("H")


@dataclass(eq=False)
class ElasticWorker(Generic[H]):
    """One worker of the job, from start to end; ``handle`` is the pool's own record
    (a local process, a Ray actor)."""

    wid: str
    handle: H
    #: announced itself (``elastic/ready/<wid>``) and waits to join a generation
    ready: bool = False
    #: its end was noticed
    ended: bool = False
    #: ...and it succeeded
    ok: bool = False
    #: how it ended when it failed: ``exited with code 3``, ``died: ...``
    how: str = ""


@dataclass(frozen=True)
class Ending:
    """How a worker ended, as its pool tells (``how`` only for a failure)."""

    ok: bool
    how: str = ""


class SlotsUnknown(Exception):
    """Discovery failed this time; the message is the line to say (the job goes on)."""


class BelowMinimum(Exception):
    """Fewer than ``min_np`` workers are left: the job has failed. ``rank`` is the
    failed ``worker``'s rank in the generation it belonged to."""

    def __init__(self, line: str, worker: ElasticWorker[Any], rank: int) -> None:
        super().__init__(line)
        self.line = line
        self.worker = worker
        self.rank = rank


class WorkerPool(Protocol[H]):
    """What starts, watches and stops the workers of one kind of launcher."""

    def start(self, wid: str) -> H:
        """Start worker ``wid``; its handle."""
        ...

    def ending(self, worker: ElasticWorker[H]) -> Ending | None:
        """How the worker ended, or None while it runs."""
        ...

    def running(self, worker: ElasticWorker[H]) -> bool:
        """Whether it still runs even if its end was not noticed yet."""
        ...

    def where(self, worker: ElasticWorker[H]) -> str:
        """Where it runs, as a clause after its id (``, actor ...``), or ``""``."""
        ...

    def slots(self) -> int | None:
        """Slots available now (None: this job has no discovery); raises SlotsUnknown."""
        ...

    def retire(self, worker: ElasticWorker[H], slots: int) -> None:
        """Stop a worker discovery has no slot for (there are ``slots`` now)."""
        ...

    def say(self, text: str) -> None:
        """One line to the user."""
        ...


@dataclass(frozen=True)
class ElasticPolicy:
    """The bounds of a job and how its launcher words them."""

    min_np: int
    max_np: int | None = None
    #: how a message names ``min_np`` (``--min-np`` on the command line)
    min_np_name: str = "--min-np"
    discovery_interval_s: float = 1.0
    #: say each failure as it is noticed, not only in the final message
    announce_failures: bool = False
    #: once a member finished the training, a failure changes nothing (Ray: a worker
    #: admitted just as the others ended); locally a late failure still fails the job
    settled_once_finishing: bool = False
    #: write ``elastic.json`` here at every generation
    history_dir: str | None = None


def capped(slots: int, max_np: int | None) -> int:
    return slots if max_np is None else min(max_np, slots)


def open_store(host: str) -> tuple[Any, str]:
    """The job's store, hosted here, and the ``HOST:PORT`` its workers reach it at."""
    import torch.distributed as dist

    store = dist.TCPStore(
        host, 0, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=30)
    )
    return store, f"{host}:{store.port}"


def write_history(directory: str, generations: Sequence[dict[str, Any]]) -> None:
    """``DIR/elastic.json`` (replaced whole: a reader never sees half a file)."""
    os.makedirs(directory, exist_ok=True)
    tmp = os.path.join(directory, f".{HISTORY_FILE}.tmp")
    with open(tmp, "w") as f:
        json.dump({"format": "hvdprof-elastic", "generations": list(generations)}, f, indent=1)
    os.replace(tmp, os.path.join(directory, HISTORY_FILE))


class ElasticDriver(Generic[H]):
    """The generations of one elastic job: :meth:`start`, then :meth:`step` until it
    returns the last generation's workers (or raises :class:`BelowMinimum`)."""

    def __init__(self, pool: WorkerPool[H], store: Any, policy: ElasticPolicy) -> None:
        self.pool = pool
        self.store = store
        self.policy = policy
        self.workers: list[ElasticWorker[H]] = []
        self.generation = 0
        #: worker ids of the newest generation, in rank order
        self.plan: list[str] = []
        #: "rank R (worker W...) how it ended", every failure
        self.gone: list[str] = []
        #: every generation: workers, sizes, reason, time (``elastic.json``)
        self.history: list[dict[str, Any]] = []
        #: a member finished the training: add no more workers
        self.finishing = False
        self._next_id = 0
        self._reset_seen: float | None = None
        self._last_discovery = 0.0

    # -- membership -------------------------------------------------------------------
    def start(self, count: int) -> None:
        """Start ``count`` workers as the first generation."""
        for _ in range(count):
            self.spawn()
        self.publish([w.wid for w in self.workers], "start")

    def spawn(self) -> ElasticWorker[H]:
        wid = str(self._next_id)
        self._next_id += 1
        worker = ElasticWorker(wid, self.pool.start(wid))
        self.workers.append(worker)
        return worker

    def alive(self) -> list[ElasticWorker[H]]:
        return [w for w in self.workers if not w.ended and self.pool.running(w)]

    def members(self) -> list[ElasticWorker[H]]:
        """The workers of the newest generation, in rank order."""
        by_id = {w.wid: w for w in self.workers}
        return [by_id[wid] for wid in self.plan]

    def publish(self, members: list[str], reason: str) -> None:
        old = len(self.plan)
        self.generation += 1
        self.plan = list(members)
        body = {"workers": self.plan, "reason": reason, "old_size": old}
        self.store.set(keys.plan_key(self.generation), json.dumps(body))
        self.store.set(keys.GEN_KEY, str(self.generation))
        self._reset_seen = None
        self.history.append(
            {
                "generation": self.generation,
                "workers": list(members),
                "old_size": old,
                "new_size": len(members),
                "reason": reason,
                "unix_time": time.time(),
                "timeline_dir": f"generation.{self.generation}",
            }
        )
        directory = self.policy.history_dir
        if directory:
            try:
                write_history(directory, self.history)
            except OSError as exc:
                self.pool.say(f"cannot write {directory}/{HISTORY_FILE}: {exc.strerror or exc}")
        if self.generation > 1:
            self.pool.say(
                f"elastic generation {self.generation}: {old} -> {len(members)} ranks ({reason})"
            )

    # -- one look at the job ------------------------------------------------------------
    def step(self) -> list[ElasticWorker[H]] | None:
        """Notice what changed and answer it; the newest generation's workers once every
        one has ended, else None. Raises BelowMinimum."""
        self._reap()
        members = self.members()
        if all(w.ended for w in members):
            return members
        if not self.finishing:
            self._answer_reset_requests()
            self._admit_ready_workers()
            self._rediscover()
        return None

    def _reap(self) -> None:
        """Notice workers that ended; re-form without the failed ones, or give up."""
        failed = self._newly_failed()
        if not failed:
            return
        for w in failed:
            where = self.pool.where(w)
            who = (
                f"rank {self.plan.index(w.wid)} (worker {w.wid}{where})"
                if w.wid in self.plan
                else f"worker {w.wid} (not yet admitted{where})"
            )
            self.gone.append(f"{who} {w.how}")
            if self.policy.announce_failures:
                self.pool.say(self.gone[-1])
        in_plan = [w for w in failed if w.wid in self.plan]
        if not in_plan or (self.finishing and self.policy.settled_once_finishing):
            return
        alive = {w.wid for w in self.alive()}
        survivors = [wid for wid in self.plan if wid in alive]
        if len(survivors) < self.policy.min_np:
            line = (
                f"elastic job failed: {len(survivors)} rank(s) left, fewer than "
                f"{self.policy.min_np_name} {self.policy.min_np}; gone: {'; '.join(self.gone)}"
            )
            raise BelowMinimum(line, in_plan[0], self.plan.index(in_plan[0].wid))
        if survivors:
            self.publish(survivors, "; ".join(self.gone[-len(failed) :]))

    def _newly_failed(self) -> list[ElasticWorker[H]]:
        failed = []
        for w in self.workers:
            if w.ended:
                continue
            ending = self.pool.ending(w)
            if ending is None:
                continue
            w.ended, w.ok, w.how = True, ending.ok, ending.how
            if not ending.ok:
                failed.append(w)
            elif w.wid in self.plan:
                self.finishing = True  # the training is over: add no more workers
        return failed

    def _answer_reset_requests(self) -> None:
        if not self.store.check([keys.reset_key(self.generation)]):
            return
        now = time.monotonic()
        if self._reset_seen is None:
            self._reset_seen = now
        elif now - self._reset_seen >= RESET_GRACE_S:
            alive = {w.wid for w in self.alive()}
            self.publish([wid for wid in self.plan if wid in alive], "a collective failed")

    def _admit_ready_workers(self) -> None:
        """New workers that announced themselves join in the next generation."""
        waiting = [w for w in self.alive() if w.wid not in self.plan and not w.ready]
        for w in waiting:
            if self.store.check([keys.ready_key(w.wid)]):
                w.ready = True
        joining = [w.wid for w in self.alive() if w.ready and w.wid not in self.plan]
        if joining and all(w.ready for w in waiting):
            alive = {w.wid for w in self.alive()}
            members = [wid for wid in self.plan if wid in alive] + joining
            self.publish(members, f"worker(s) {', '.join(joining)} added")

    def _rediscover(self) -> None:
        now = time.monotonic()
        if now - self._last_discovery < self.policy.discovery_interval_s:
            return
        self._last_discovery = now
        try:
            found = self.pool.slots()
        except SlotsUnknown as exc:
            self.pool.say(str(exc))
            return
        if found is None:
            return
        slots = capped(found, self.policy.max_np)
        alive = self.alive()
        if slots > len(alive):
            for _ in range(slots - len(alive)):
                self.spawn()
        elif len(alive) > slots >= self.policy.min_np:
            # fewer slots: stop the newest workers; the others re-form without them
            for w in sorted(alive, key=lambda w: int(w.wid))[slots:]:
                self.pool.retire(w, slots)
