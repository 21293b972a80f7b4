"""``ElasticRayExecutor``: an elastic hvdprof job whose workers are Ray actors.

As Horovod's ``ray/elastic.py`` builds the runner's ``ElasticDriver``, this executor
builds the one :class:`~hvdprof.launch.elastic_driver.ElasticDriver` that
``hvdprof run --min-np/--max-np`` uses: the driver hosts a ``torch.distributed.TCPStore``
that outlives every worker and publishes the job's membership there one generation at a
time; the workers' ``@hvd.elastic.run`` re-forms on each. Only the workers differ
(:class:`_ActorPool`): actors instead of local processes, so they may run on any node,
and their number comes from Ray's view of the cluster (``ray.nodes()``: each alive
node's CPUs, and GPUs with ``use_gpu``, over what one worker needs), polled while the
job runs:

* a worker dies or its function raises: the others re-form without it while at least
  ``min_np`` remain, else the job fails naming every rank gone and its node;
* Ray reports more slots than workers (a node joined, a dead worker's CPU came free):
  new workers start, up to ``max_np``, and join at the running workers' next ``commit()``.

``run(fn, callbacks)`` returns the results of the last generation's workers, in rank
order; each callback is called with every value rank 0 sends with
:func:`hvdprof.ray.ray_logger.log`, as Horovod's are.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from hvdprof.config import name_of
from hvdprof.launch import elastic_driver
from hvdprof.ray import exit_notes, ray_logger
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
class _Actor:
    """A worker's actor and what the driver learnt of it."""

    actor: Any
    ref: Any = None  # the user's function, running
    place: WorkerPlace | None = None
    result: Any = None
    staging_ref: Any = None  # its timeline directory, on its node
    place_ref: Any = None  # where it runs


Worker = elastic_driver.ElasticWorker[_Actor]


def _say(text: str) -> None:
    print(LOG_PREFIX + text, file=sys.stderr, flush=True)


class _ActorPool:
    """The driver's workers as Ray actors, each running the user's function once."""

    def __init__(
        self, executor: ElasticRayExecutor, fn: Callable[[], Any], queue: Any = None
    ) -> None:
        import ray

        self.ray = ray
        self.executor = executor
        self.fn = fn
        self.queue = queue

    def start(self, wid: str) -> _Actor:
        ex, ray = self.executor, self.ray
        actor = (
            ray.remote(RayWorker)
            .options(num_cpus=ex.cpus_per_slot, num_gpus=ex.gpus_per_slot)
            .remote()
        )
        env = forwarded_environment(os.environ)
        env[name_of("start_timeout_s")] = f"{ex.settings.timeout_s:g}"
        env[name_of("elastic_timeout_s")] = f"{ex.settings.elastic_timeout:g}"
        env.update(ex.env_vars)
        env[name_of("elastic_store")] = ex.store_address
        env[name_of("elastic_worker")] = wid
        for var in (name_of("rank"), name_of("size"), name_of("controller_port")):
            env.pop(var, None)
        actor.update_env_vars.remote(env)
        handle = _Actor(actor)
        if ex.timeline_dir:
            handle.staging_ref = actor.stage_timeline.remote()
        if self.queue is not None:
            actor.set_queue.remote(self.queue)
        handle.place_ref = actor.place.remote()
        handle.ref = actor.run.remote(self.fn)  # (an actor runs its calls in order)
        if ex.settings.verbose:
            _say(f"worker {wid} started")
        return handle

    def ending(self, worker: Worker) -> elastic_driver.Ending | None:
        ray, handle = self.ray, worker.handle
        done, _ = ray.wait([handle.ref], timeout=0)
        if not done:
            return None
        try:
            handle.result = ray.get(handle.ref)
        except ray.exceptions.RayActorError as exc:
            return elastic_driver.Ending(False, f"died: {self._death_reason(worker, exc)}")
        except ray.exceptions.RayTaskError as exc:
            return elastic_driver.Ending(False, f"failed: {task_error_reason(exc)}")
        return elastic_driver.Ending(True)

    def running(self, worker: Worker) -> bool:
        return True  # (an actor's end is known only from its function's reference)

    def where(self, worker: Worker) -> str:
        place = self.place(worker)
        return f", {place.describe()}" if place is not None else ""

    def slots(self) -> int:
        try:
            return self.executor.cluster_slots()
        except Exception as exc:
            raise elastic_driver.SlotsUnknown(
                f"cluster discovery failed: {first_line(exc)}"
            ) from None

    def retire(self, worker: Worker, slots: int) -> None:
        _say(f"Ray reports {slots} slot(s); stopping worker {worker.wid}")
        self.ray.kill(worker.handle.actor, no_restart=True)

    def say(self, text: str) -> None:
        _say(text)

    def place(self, worker: Worker) -> WorkerPlace | None:
        handle = worker.handle
        if handle.place is None:
            try:
                handle.place = self.ray.get(handle.place_ref, timeout=0.5)
            except Exception:
                return None
        return handle.place

    def _death_reason(self, worker: Worker, exc: BaseException) -> str:
        """The worker's own ``os._exit(n)`` / ``sys.exit(n)`` when it noted one (Ray says
        only "connection error code 2"), else Ray's words."""
        place = self.place(worker)
        if place is not None and (note := exit_notes.read_on_node(place.node_id, place.pid)):
            return exit_reason(place.pid, note)
        return actor_death_reason(exc)


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
        #: every generation of the last run: workers in rank order, sizes, reason, time
        #: (``elastic.json``)
        self.history: list[dict[str, Any]] = []
        self.timeline_dir: str | None = None
        self.store_address = ""
        self._store: Any = None
        self._driver: elastic_driver.ElasticDriver[_Actor] | None = None

    @property
    def workers(self) -> list[Worker]:
        """Every worker of the last run, in the order they started."""
        return self._driver.workers if self._driver is not None else []

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> None:
        """Open the job's store on the driver (the workers reach it at this node's address)."""
        import ray

        self._store, self.store_address = elastic_driver.open_store(ray.util.get_node_ip_address())
        self.timeline_dir = timeline_directory(self.settings.timeline, os.environ)

    def run(
        self,
        worker_fn: Callable[[], Any],
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """Run ``worker_fn()`` on every worker until the job ends; the results of the last
        generation's workers, in rank order. ``WorkerFailedError`` when fewer than
        ``min_np`` remain.

        Each of ``callbacks`` is called, on this thread, with every value rank 0 sends
        with :func:`hvdprof.ray.ray_logger.log`, in the order sent; one that raises ends
        the job, its exception raised from here."""
        import ray

        if self._store is None:
            raise RuntimeError("ElasticRayExecutor.run() before start()")
        callbacks = list(callbacks or ())
        queue = ray_logger.open_queue() if callbacks else None
        pool = _ActorPool(self, worker_fn, queue)
        policy = elastic_driver.ElasticPolicy(
            self.settings.min_np,
            self.settings.max_np,
            min_np_name="min_np",
            discovery_interval_s=self.settings.discovery_interval_s,
            announce_failures=True,
            settled_once_finishing=True,
        )
        driver = self._driver = elastic_driver.ElasticDriver(pool, self._store, policy)
        self.history = driver.history
        try:
            slots = elastic_driver.capped(self.cluster_slots(), self.settings.max_np)
            if slots < self.settings.min_np:
                raise WorkerFailedError(
                    f"only {slots} slot(s) on the Ray cluster, fewer than min_np "
                    f"{self.settings.min_np}",
                    -1,
                    None,
                    False,
                )
            driver.start(slots)
            results = self._watch(ray, driver, queue, callbacks)
            ray_logger.deliver(queue, callbacks)
            return results
        finally:
            self._gather_timeline(ray, pool)
            self._stop_all(ray)
            ray_logger.close_queue(queue)

    def shutdown(self) -> None:
        import ray

        self._stop_all(ray)
        self._store = None

    def cluster_slots(self) -> int:
        """Workers the cluster has room for now (``discovery``'s, else Ray's view)."""
        if self._discovery is not None:
            return sum(self._discovery().values())
        import ray

        return sum(cluster_slots(ray.nodes(), self.cpus_per_slot, self.gpus_per_slot).values())

    # -- watching -----------------------------------------------------------------------
    def _watch(
        self,
        ray: Any,
        driver: elastic_driver.ElasticDriver[_Actor],
        queue: Any,
        callbacks: list[Callable[[Any], Any]],
    ) -> list[Any]:
        while True:
            running = [w.handle.ref for w in driver.alive()]
            if running:
                ray.wait(running, num_returns=1, timeout=self.settings.poll_s)
            ray_logger.deliver(queue, callbacks)
            try:
                members = driver.step()
            except elastic_driver.BelowMinimum as failed:
                _say(failed.line)
                place = failed.worker.handle.place
                died = failed.worker.how.startswith("died")
                raise WorkerFailedError(failed.line, failed.rank, place, died) from None
            if members is None:
                continue
            ok = [w for w in members if w.ok]
            if not ok:
                raise WorkerFailedError(
                    "every worker of the last generation failed: " + "; ".join(driver.gone),
                    -1,
                    None,
                    False,
                )
            return [w.handle.result for w in ok]

    # -- ending -------------------------------------------------------------------------
    def _gather_timeline(self, ray: Any, pool: _ActorPool) -> None:
        workers = self.workers
        if not self.timeline_dir or not workers:
            return
        # only workers whose function returned: one still running (say, started too late
        # to be admitted) would answer after its function, which may wait a long time
        live = [w for w in workers if w.ok]
        for w in workers:
            if not w.ended:  # never admitted: nothing of the job's on its timeline
                with contextlib.suppress(Exception):
                    ray.kill(w.handle.actor, no_restart=True)
        refs = {w.handle.actor.collect_timeline.remote(): w for w in live}
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
        for w in workers:
            if w in live:
                continue
            place, path = pool.place(w), None
            with contextlib.suppress(Exception):
                path = ray.get(w.handle.staging_ref, timeout=0)
            if place is not None and place.node_id == here and path and os.path.isdir(path):
                recovered = recover_local(path)
                if recovered:
                    files[int(w.wid)] = recovered
                    continue
            missing[int(w.wid)] = w.how or "still running at the end (never admitted)"
        places = [pool.place(w) for w in workers]
        known = [p for p in places if p is not None]
        write_gathered(self.timeline_dir, files, known, missing)
        elastic_driver.write_history(self.timeline_dir, self.history)

    def _stop_all(self, ray: Any) -> None:
        for w in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(w.handle.actor, no_restart=True)
            w.ended = True
