"""``ElasticRayExecutor``: an elastic hvdprof job whose workers are Ray actors.

The protocol is the one ``hvdprof run --min-np/--max-np`` speaks
(:mod:`hvdprof.runtime.elastic`): the driver hosts a ``torch.distributed.TCPStore`` that
outlives every worker and publishes the job's membership there one generation at a time;
the workers' ``@hvd.elastic.run`` re-forms on each. Only the workers differ: actors
instead of local processes, so they may run on any node, and their number comes from
Ray's view of the cluster (``ray.nodes()``: each alive node's CPUs, and GPUs with
``use_gpu``, over what one worker needs), polled while the job runs:

* a worker dies or its function raises: the others re-form without it while at least
  ``min_np`` remain, else the job fails naming every rank gone and its node;
* Ray reports more slots than workers (a node joined, a dead worker's CPU came free):
  new workers start, up to ``max_np``, and join at the running workers' next ``commit()``.

``run(fn)`` returns the results of the last generation's workers, in rank order.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvdprof.config import name_of
from hvdprof.ray import exit_notes
from hvdprof.ray.failures import (
    LOG_PREFIX,
    WorkerFailedError,
    actor_death_reason,
    exit_reason,
    first_line,
    task_error_reason,
)
from hvdprof.ray.layout import WorkerPlace, cluster_slots, forwarded_environment
from hvdprof.ray.timeline_gather import recover_local, timeline_directory, write_gathered
from hvdprof.ray.worker import RayWorker
from hvdprof.runtime import elastic as keys

_CONTROL_TIMEOUT_S = 120.0
#: a reset request with no dead worker behind it is answered after this long
_RESET_GRACE_S = 0.3


@dataclass(frozen=True)
class ElasticRaySettings:
    """Bounds and timeouts of an elastic Ray job (``ElasticRayExecutor.create_settings``)."""

    min_np: int = 1
    max_np: int | None = None
    #: longest a worker waits for a generation that includes it
    elastic_timeout: float = 600.0
    #: how long the ranks of one generation may take to meet
    timeout_s: float = 30.0
    timeline: str | None = None
    #: how often Ray's view of the cluster is read for slots
    discovery_interval_s: float = 1.0
    poll_s: float = 0.1
    verbose: bool = False


def create_elastic_settings(
    min_num_proc: int = 1,
    max_num_proc: int | None = None,
    reset_limit: int | None = None,
    elastic_timeout: float = 600.0,
    timeout_s: float = 30.0,
    ssh_identity_file: str | None = None,
    nics: object = None,
    *,
    min_np: int | None = None,
    max_np: int | None = None,
    timeline: str | None = None,
    discovery_interval_s: float = 1.0,
    verbose: bool = False,
    **_ignored: object,
) -> ElasticRaySettings:
    """Horovod's ``ElasticRayExecutor.create_settings``, its arguments in its order
    (``min_np``/``max_np``, its older names, too); ``reset_limit``, SSH and NICs are
    accepted, unused."""
    del reset_limit, ssh_identity_file, nics
    min_np = min_num_proc if min_np is None else min_np
    max_np = max_num_proc if max_np is None else max_np
    if min_np < 1 or (max_np is not None and max_np < min_np):
        raise ValueError(f"min_np={min_np}, max_np={max_np}: need 1 <= min_np <= max_np")
    return ElasticRaySettings(
        min_np=min_np,
        max_np=max_np,
        elastic_timeout=float(elastic_timeout),
        timeout_s=float(timeout_s),
        timeline=timeline,
        discovery_interval_s=float(discovery_interval_s),
        verbose=verbose,
    )


@dataclass(eq=False)
class _Worker:
    wid: str
    actor: Any
    ref: Any = None  # the user's function, running
    place: WorkerPlace | None = None
    ready: bool = False
    ended: bool = False
    ok: bool = False
    result: Any = None
    how: str = ""  # how it ended, when it failed
    staging_ref: Any = None  # its timeline directory, on its node
    place_ref: Any = None  # where it runs


@dataclass
class _Job:
    generation: int = 0
    plan: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    reset_seen: float | None = None
    finishing: bool = False


class ElasticRayExecutor:
    """An elastic job on a Ray cluster: ``start()``, then ``run(fn)``."""

    create_settings = staticmethod(create_elastic_settings)

    def __init__(
        self,
        settings: ElasticRaySettings | None = None,
        use_gpu: bool = False,
        cpus_per_slot: float = 1,
        gpus_per_slot: float | None = None,
        env_vars: Mapping[str, object] | None = None,
        override_discovery: bool = True,
        discovery: Callable[[], Mapping[str, int]] | None = None,
    ) -> None:
        del override_discovery  # (Horovod's: discovery always comes from Ray here)
        self.settings = settings or create_elastic_settings()
        self.use_gpu = use_gpu
        self.cpus_per_slot = float(cpus_per_slot)
        self.gpus_per_slot = float(gpus_per_slot or 1) if use_gpu else 0.0
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self._discovery = discovery
        self.workers: list[_Worker] = []
        #: every generation: workers in rank order, sizes, reason, time (``elastic.json``)
        self.history: list[dict[str, Any]] = []
        self.timeline_dir: str | None = None
        self._store: Any = None
        self._store_addr = ""
        self._job = _Job()
        self._last_discovery = 0.0
        self._next_id = 0
        self._fn: Callable[[], Any] | None = None

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        """Open the job's store on the driver (the workers reach it at this node's address)."""
        import ray
        import torch.distributed as dist

        address = ray.util.get_node_ip_address()
        self._store = dist.TCPStore(
            address,
            0,
            is_master=True,
            wait_for_workers=False,
            timeout=datetime.timedelta(seconds=30),
        )
        self._store_addr = f"{address}:{self._store.port}"
        self.timeline_dir = timeline_directory(self.settings.timeline, os.environ)

    def run(self, worker_fn: Callable[[], Any], callbacks: Any = None) -> list[Any]:
        """Run ``worker_fn()`` on every worker until the job ends; the results of the last
        generation's workers, in rank order. ``WorkerFailedError`` when fewer than
        ``min_np`` remain."""
        import ray

        del callbacks
        if self._store is None:
            raise RuntimeError("ElasticRayExecutor.run() before start()")
        self._job = _Job()
        self.workers = []
        self._fn = worker_fn
        try:
            slots = self._max_np(self._slots())
            if slots < self.settings.min_np:
                raise WorkerFailedError(
                    f"only {slots} slot(s) on the Ray cluster, fewer than min_np "
                    f"{self.settings.min_np}",
                    -1,
                    None,
                    False,
                )
            for _ in range(slots):
                self._spawn(ray)
            self._publish([w.wid for w in self.workers], "start")
            return self._watch(ray)
        finally:
            self._gather_timeline(ray)
            self._stop_all(ray)

    def shutdown(self) -> None:
        import ray

        self._stop_all(ray)
        self._store = None

    def _max_np(self, slots: int) -> int:
        cap = self.settings.max_np
        return slots if cap is None else min(cap, slots)

    def _slots(self) -> int:
        if self._discovery is not None:
            return sum(self._discovery().values())
        import ray

        return sum(cluster_slots(ray.nodes(), self.cpus_per_slot, self.gpus_per_slot).values())

    # -- workers ----------------------------------------------------------------------
    def _spawn(self, ray: Any) -> _Worker:
        wid = str(self._next_id)
        self._next_id += 1
        actor = (
            ray.remote(RayWorker)
            .options(num_cpus=self.cpus_per_slot, num_gpus=self.gpus_per_slot)
            .remote()
        )
        env = forwarded_environment(os.environ)
        env[name_of("start_timeout_s")] = f"{self.settings.timeout_s:g}"
        env[name_of("elastic_timeout_s")] = f"{self.settings.elastic_timeout:g}"
        env.update(self.env_vars)
        env[name_of("elastic_store")] = self._store_addr
        env[name_of("elastic_worker")] = wid
        for var in (name_of("rank"), name_of("size"), name_of("controller_port")):
            env.pop(var, None)
        actor.update_env_vars.remote(env)
        worker = _Worker(wid, actor)
        if self.timeline_dir:
            worker.staging_ref = actor.stage_timeline.remote()
        worker.place_ref = actor.place.remote()
        worker.ref = actor.run.remote(self._fn)  # (an actor runs its calls in order)
        self.workers.append(worker)
        if self.settings.verbose:
            self._say(f"worker {wid} started")
        return worker

    def _death_reason(self, ray: Any, w: _Worker, exc: BaseException) -> str:
        """The worker's own ``os._exit(n)`` / ``sys.exit(n)`` when it noted one (Ray says
        only "connection error code 2"), else Ray's words."""
        place = self._place(ray, w)
        if place is not None and (note := exit_notes.read_on_node(place.node_id, place.pid)):
            return exit_reason(place.pid, note)
        return actor_death_reason(exc)

    def _place(self, ray: Any, w: _Worker) -> WorkerPlace | None:
        if w.place is None:
            try:
                w.place = ray.get(w.place_ref, timeout=0.5)
            except Exception:
                return None
        return w.place

    def _alive(self) -> list[_Worker]:
        return [w for w in self.workers if not w.ended]

    def _publish(self, members: list[str], reason: str) -> None:
        job = self._job
        old = len(job.plan)
        job.generation += 1
        job.plan = list(members)
        body = {"workers": job.plan, "reason": reason, "old_size": old}
        self._store.set(keys.plan_key(job.generation), json.dumps(body))
        self._store.set(keys.GEN_KEY, str(job.generation))
        job.reset_seen = None
        self.history.append(
            {
                "generation": job.generation,
                "workers": list(members),
                "old_size": old,
                "new_size": len(members),
                "reason": reason,
                "unix_time": time.time(),
                "timeline_dir": f"generation.{job.generation}",
            }
        )
        if job.generation > 1:
            self._say(
                f"elastic generation {job.generation}: {old} -> {len(members)} ranks ({reason})"
            )

    # -- watching -----------------------------------------------------------------------
    def _watch(self, ray: Any) -> list[Any]:
        job = self._job
        while True:
            running = [w.ref for w in self._alive()]
            if running:
                ray.wait(running, num_returns=1, timeout=self.settings.poll_s)
            self._reap(ray)
            members = [w for w in self.workers if w.wid in job.plan]
            if all(w.ended for w in members):
                ok = [w for w in members if w.ok]
                if not ok:
                    raise WorkerFailedError(
                        "every worker of the last generation failed: " + "; ".join(job.gone),
                        -1,
                        None,
                        False,
                    )
                return [w.result for w in sorted(ok, key=lambda w: job.plan.index(w.wid))]
            if not job.finishing:
                self._answer_reset_requests()
                self._admit_ready_workers()
                self._rediscover(ray)

    def _reap(self, ray: Any) -> None:
        """Notice workers whose function ended; re-form without the failed ones, or fail."""
        job = self._job
        failed: list[_Worker] = []
        for w in self._alive():
            done, _ = ray.wait([w.ref], timeout=0)
            if not done:
                continue
            w.ended = True
            try:
                w.result = ray.get(w.ref)
                w.ok = True
                if w.wid in job.plan:
                    job.finishing = True  # the training is over: add no more workers
            except ray.exceptions.RayActorError as exc:
                w.how = f"died: {self._death_reason(ray, w, exc)}"
                failed.append(w)
            except ray.exceptions.RayTaskError as exc:
                w.how = f"failed: {task_error_reason(exc)}"
                failed.append(w)
        if not failed:
            return
        for w in failed:
            place = self._place(ray, w)
            where = f", {place.describe()}" if place is not None else ""
            who = (
                f"rank {job.plan.index(w.wid)} (worker {w.wid}{where})"
                if w.wid in job.plan
                else f"worker {w.wid} (not yet admitted{where})"
            )
            job.gone.append(f"{who} {w.how}")
            self._say(job.gone[-1])
        in_plan = [w for w in failed if w.wid in job.plan]
        if not in_plan or job.finishing:
            # (once a member has finished the training, a failure after it, such as a
            # worker admitted as the others ended, changes nothing: the job is ending)
            return
        survivors = [
            wid for wid in job.plan if not next(x for x in self.workers if x.wid == wid).ended
        ]
        if len(survivors) < self.settings.min_np:
            line = (
                f"elastic job failed: {len(survivors)} rank(s) left, fewer than min_np "
                f"{self.settings.min_np}; gone: {'; '.join(job.gone)}"
            )
            self._say(line)
            first = in_plan[0]
            raise WorkerFailedError(
                line, job.plan.index(first.wid), first.place, first.how.startswith("died")
            )
        if survivors:
            self._publish(survivors, "; ".join(job.gone[-len(failed) :]))

    def _answer_reset_requests(self) -> None:
        job = self._job
        if not self._store.check([keys.reset_key(job.generation)]):
            return
        now = time.monotonic()
        if job.reset_seen is None:
            job.reset_seen = now
        elif now - job.reset_seen >= _RESET_GRACE_S:
            alive = {w.wid for w in self._alive()}
            self._publish([wid for wid in job.plan if wid in alive], "a collective failed")

    def _admit_ready_workers(self) -> None:
        job = self._job
        waiting = [w for w in self._alive() if w.wid not in job.plan and not w.ready]
        for w in waiting:
            if self._store.check([keys.ready_key(w.wid)]):
                w.ready = True
        joining = [w.wid for w in self._alive() if w.ready and w.wid not in job.plan]
        if joining and all(w.ready for w in waiting):
            alive = {w.wid for w in self._alive()}
            members = [wid for wid in job.plan if wid in alive] + joining
            self._publish(members, f"worker(s) {', '.join(joining)} added")

    def _rediscover(self, ray: Any) -> None:
        now = time.monotonic()
        if now - self._last_discovery < self.settings.discovery_interval_s:
            return
        self._last_discovery = now
        try:
            slots = self._max_np(self._slots())
        except Exception as exc:
            self._say(f"cluster discovery failed: {first_line(exc)}")
            return
        alive = self._alive()
        if slots > len(alive):
            for _ in range(slots - len(alive)):
                self._spawn(ray)
        elif len(alive) > slots >= self.settings.min_np:
            for w in sorted(alive, key=lambda w: int(w.wid))[slots:]:
                self._say(f"Ray reports {slots} slot(s); stopping worker {w.wid}")
                ray.kill(w.actor, no_restart=True)

    # -- ending -------------------------------------------------------------------------
    def _gather_timeline(self, ray: Any) -> None:
        if not self.timeline_dir or not self.workers:
            return
        # only workers whose function returned: one still running (say, started too late
        # to be admitted) would answer after its function, which may wait a long time
        live = [w for w in self.workers if w.ok]
        for w in self.workers:
            if not w.ended:  # never admitted: nothing of the job's on its timeline
                with contextlib.suppress(Exception):
                    ray.kill(w.actor, no_restart=True)
        refs = {w.actor.collect_timeline.remote(): w for w in live}
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=self.settings.timeout_s + 30)
        files: dict[int, Any] = {}
        missing: dict[int, str] = {}
        for ref, w in refs.items():
            try:
                if ref not in done:
                    raise TimeoutError("its actor did not answer in time")
                files[int(w.wid)] = ray.get(ref, timeout=0)
            except Exception as exc:
                missing[int(w.wid)] = first_line(exc)
        here = ray.get_runtime_context().get_node_id()
        for w in self.workers:
            if w in live:
                continue
            place, path = self._place(ray, w), None
            with contextlib.suppress(Exception):
                path = ray.get(w.staging_ref, timeout=0)
            if place is not None and place.node_id == here and path and os.path.isdir(path):
                recovered = recover_local(path)
                if recovered:
                    files[int(w.wid)] = recovered
                    continue
            missing[int(w.wid)] = w.how or "still running at the end (never admitted)"
        places = [self._place(ray, w) for w in self.workers]
        known = [p for p in places if p is not None]
        write_gathered(self.timeline_dir, files, known, missing)
        with open(os.path.join(self.timeline_dir, "elastic.json"), "w") as f:
            json.dump({"format": "hvdprof-elastic", "generations": self.history}, f, indent=1)

    def _stop_all(self, ray: Any) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w.actor, no_restart=True)
            w.ended = True

    def _say(self, text: str) -> None:
        print(LOG_PREFIX + text, file=sys.stderr, flush=True)
