"""``RayExecutor``: an hvdprof job whose ranks are Ray actors, as Horovod's users run one.

::

    settings = RayExecutor.create_settings(timeout_s=30)
    executor = RayExecutor(settings, num_workers=2, cpus_per_worker=1)
    executor.start()
    results = executor.run(train, args=[epochs])   # one result per rank
    executor.shutdown()

``start()`` reserves the workers in a placement group, starts one actor per rank, numbers
the ranks node by node, and gives each the variables ``hvdprof run`` would
(``HVDPROF_RANK``, the rendezvous address on rank 0's node and a port free there, ...)
plus every ``HVDPROF_*`` and ``HOROVOD_*`` variable of the driver. The user's function
calls ``hvd.init()`` and meets the other ranks through rank 0's store, as in any job.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hvdprof.config import name_of
from hvdprof.ray import exit_notes, placement, ray_logger
from hvdprof.ray.failures import (
    LOG_PREFIX,
    RankFailure,
    WorkerFailedError,
    actor_death_reason,
    exit_reason,
    failure_line,
    first_line,
    is_echo,
    late_failure,
    task_error_reason,
)
from hvdprof.ray.layout import (
    WorkerPlace,
    forwarded_environment,
    rank_environment,
    rank_order,
    shared_visible_devices,
)
from hvdprof.ray.settings import RaySettings, create_settings
from hvdprof.ray.timeline_gather import recover_local, timeline_directory, write_gathered
from hvdprof.ray.worker import RayWorker

#: bound on every driver-side wait that is not the user's own function
_CONTROL_TIMEOUT_S = 120.0


class RayExecutor:
    """A job of ``num_workers`` ranks on a Ray cluster (``ray.init()`` first)."""

    create_settings = staticmethod(create_settings)

    def __init__(
        self,
        settings: RaySettings | None = None,
        num_workers: int | None = None,
        cpus_per_worker: float = 1,
        use_gpu: bool = False,
        gpus_per_worker: float | None = None,
        *,
        num_hosts: int | None = None,
        num_workers_per_host: int | None = None,
        num_slots: int | None = None,
        cpus_per_slot: float | None = None,
        gpus_per_slot: float | None = None,
        env_vars: Mapping[str, object] | None = None,
    ) -> None:
        # Horovod's older names: num_hosts x num_slots, cpus_per_slot, gpus_per_slot
        if num_slots is not None:
            num_workers_per_host = num_slots
            num_hosts = 1 if num_hosts is None else num_hosts
        cpus = cpus_per_slot if cpus_per_slot is not None else cpus_per_worker
        gpus = gpus_per_slot if gpus_per_slot is not None else gpus_per_worker
        self.settings = settings or create_settings()
        self.use_gpu = use_gpu
        self.plan = placement.plan_placement(
            num_workers,
            num_hosts,
            num_workers_per_host,
            cpus,
            (gpus if gpus is not None else 1.0) if use_gpu else 0.0,
        )
        self.env_vars = {str(k): str(v) for k, v in (env_vars or {}).items()}
        self.workers: list[Any] = []  # actor handles, in rank order
        self.places: list[WorkerPlace] = []  # where each rank runs, in rank order
        self.timeline_dir: str | None = None
        self._group: Any = None
        self._staging: dict[int, str] = {}  # each rank's timeline directory, on its node
        self._failed: WorkerFailedError | None = None

    @property
    def num_workers(self) -> int:
        return self.plan.num_workers

    # -- start ----------------------------------------------------------------------
    def start(
        self,
        executable_cls: type | None = None,
        executable_args: Sequence[Any] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
        extra_env_vars: Mapping[str, object] | None = None,
    ) -> None:
        """Place and start the workers and tell each its rank; with ``executable_cls``,
        each worker also builds ``executable_cls(*executable_args, **executable_kwargs)``,
        which ``execute(fn)`` then passes to ``fn``."""
        import ray

        if self.workers:
            raise RuntimeError("RayExecutor.start() was called twice; call shutdown() first")
        self._failed = None
        self._group = placement.reserve(self.plan, self.settings.placement_group_timeout_s)
        try:
            self._start_workers(ray, extra_env_vars)
            if executable_cls is not None:
                self._gather(
                    [
                        w.start_executable.remote(
                            executable_cls,
                            list(executable_args or ()),
                            dict(executable_kwargs or {}),
                        )
                        for w in self.workers
                    ]
                )
        except BaseException:
            self._release(ray)
            raise

    def _start_workers(self, ray: Any, extra_env_vars: Mapping[str, object] | None) -> None:
        actor_cls = ray.remote(RayWorker)
        actors = [
            actor_cls.options(
                num_cpus=self.plan.cpus_per_worker,
                num_gpus=self.plan.gpus_per_worker,
                scheduling_strategy=placement.scheduling(self._group, bundle),
            ).remote()
            for bundle in self.plan.bundle_of_worker
        ]
        self.workers = actors  # (so a failure below still kills them)
        places = ray.get([a.place.remote() for a in actors], timeout=_CONTROL_TIMEOUT_S)
        order = rank_order(places)
        self.workers = [actors[i] for i in order]
        self.places = [places[i] for i in order]
        port = ray.get(self.workers[0].free_port.remote(), timeout=_CONTROL_TIMEOUT_S)
        hosts = [p.hostname for p in self.places]
        shared = forwarded_environment(os.environ)
        shared[name_of("start_timeout_s")] = f"{self.settings.timeout_s:g}"
        shared.update(self.env_vars)
        shared.update({str(k): str(v) for k, v in (extra_env_vars or {}).items()})
        devices = shared_visible_devices(self.places) if self.use_gpu else None
        self.timeline_dir = timeline_directory(self.settings.timeline, os.environ)
        calls, staging = [], {}
        for rank, worker in enumerate(self.workers):
            env = dict(shared)
            env.update(rank_environment(hosts, rank, self.places[0].node_ip, port))
            if devices is not None:
                env["CUDA_VISIBLE_DEVICES"] = devices[rank]
            calls.append(worker.update_env_vars.remote(env))
            if self.timeline_dir:
                staging[rank] = worker.stage_timeline.remote()
        ray.get(calls, timeout=_CONTROL_TIMEOUT_S)
        paths = ray.get(list(staging.values()), timeout=_CONTROL_TIMEOUT_S)
        self._staging = dict(zip(staging, paths, strict=True))
        if self.settings.verbose:
            for rank, p in enumerate(self.places):
                self._say(f"rank {rank}: {p.describe()}, pid {p.pid}")

    # -- running --------------------------------------------------------------------
    def execute(
        self, fn: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], Any]] | None = None
    ) -> list[Any]:
        """``fn(worker)`` on every rank (``fn(executable)`` after ``start(executable_cls)``);
        the results in rank order. ``callbacks`` as in :meth:`run`."""
        return self._call_all(lambda w: w.execute.remote(fn), callbacks)

    def execute_single(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(worker)`` on rank 0 only."""
        return self._gather([self._running()[0].execute.remote(fn)])[0]

    def run(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        callbacks: Sequence[Callable[[Any], Any]] | None = None,
    ) -> list[Any]:
        """``fn(*args, **kwargs)`` on every rank; the results in rank order.

        Each of ``callbacks`` is called, on this thread, with every value rank 0 sends
        with :func:`hvdprof.ray.ray_logger.log` while ``fn`` runs, in the order sent."""
        call = (fn, list(args or ()), dict(kwargs or {}))
        return self._call_all(lambda w: w.run.remote(*call), callbacks)

    def run_remote(
        self,
        fn: Callable[..., Any],
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> list[Any]:
        """Like ``run``, but returns Ray object references at once (``ray.get`` them).
        Unlike ``run``, nothing watches these for a dead worker."""
        return [w.run.remote(fn, list(args or ()), dict(kwargs or {})) for w in self._running()]

    def _running(self) -> list[Any]:
        if self._failed is not None:
            raise RuntimeError(
                f"this job has failed ({self._failed}); call shutdown() and start() again"
            )
        if not self.workers:
            raise RuntimeError("RayExecutor has no workers: call start() first")
        return self.workers

    def _call_all(
        self, call: Callable[[Any], Any], callbacks: Sequence[Callable[[Any], Any]] | None
    ) -> list[Any]:
        """``call(worker)`` (a remote call) on every rank, with ``callbacks`` fed meanwhile."""
        workers = self._running()
        if not callbacks:
            return self._gather([call(w) for w in workers])
        queue = ray_logger.open_queue()
        try:
            for w in workers:  # (an actor runs its calls in order: set before the call)
                w.set_queue.remote(queue)
            return self._gather([call(w) for w in workers], queue, list(callbacks))
        finally:
            for w in workers:  # a later call without callbacks sends nowhere
                with contextlib.suppress(Exception):
                    w.set_queue.remote(None)
            ray_logger.close_queue(queue)

    def _gather(
        self, refs: list[Any], queue: Any = None, callbacks: Sequence[Callable[[Any], Any]] = ()
    ) -> list[Any]:
        """Wait for one result per rank; a dead or failing rank ends the job at once."""
        import ray

        pending = {ref: rank for rank, ref in enumerate(refs)}
        results: dict[int, Any] = {}
        failures: list[RankFailure] = []
        while pending and not failures:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=self.settings.poll_s)
            ray_logger.deliver(queue, callbacks)
            for ref in done:
                self._settle(ray, ref, pending.pop(ref), results, failures)
        if failures:
            self._fail(ray, failures, pending, results)
        ray_logger.deliver(queue, callbacks)
        return [results[r] for r in range(len(refs))]

    def _settle(
        self, ray: Any, ref: Any, rank: int, results: dict[int, Any], failures: list[RankFailure]
    ) -> None:
        try:
            results[rank] = ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            failures.append(RankFailure(rank, True, self._death_reason(rank, exc), exc))
        except ray.exceptions.RayTaskError as exc:
            failures.append(RankFailure(rank, False, task_error_reason(exc), exc, is_echo(exc)))

    def _death_reason(self, rank: int, exc: BaseException) -> str:
        """How the rank's process ended: its own ``os._exit(n)`` / ``sys.exit(n)`` when it
        noted one (Ray says only "connection error code 2"), else Ray's words."""
        place = self.places[rank] if rank < len(self.places) else None
        if place is not None and (note := exit_notes.read_on_node(place.node_id, place.pid)):
            return exit_reason(place.pid, note)
        return actor_death_reason(exc)

    def _fail(
        self,
        ray: Any,
        failures: list[RankFailure],
        pending: dict[Any, int],
        results: dict[int, Any],
    ) -> None:
        """Let the other ranks end (their collectives fail once a peer is gone), kill those
        still running after the grace, and raise naming the rank that ended the job: a
        dead one before one that raised, and a peer's failure last (it is an echo)."""
        failed_at = time.monotonic()
        waiting = set(pending.values())  # ranks still in their function when one failed
        settled_at: dict[int, float] = {}
        deadline = failed_at + self.settings.failure_grace_s
        while pending and time.monotonic() < deadline:
            done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0.2)
            for ref in done:
                rank = pending.pop(ref)
                self._settle(ray, ref, rank, results, failures)
                settled_at[rank] = time.monotonic() - failed_at
        first = min(failures, key=RankFailure.blame_order)
        first = late_failure(first, failures, waiting, settled_at, self.settings.timeout_s) or first
        place = self.places[first.rank] if first.rank < len(self.places) else None
        others = len(pending) + len(results) + len(failures) - 1
        line = failure_line(first.rank, place, first.died, first.reason, others)
        print(line, file=sys.stderr, flush=True)
        for other in pending.values():
            self._kill(ray, other)
        self._failed = WorkerFailedError(
            line.removeprefix(LOG_PREFIX), first.rank, place, first.died
        )
        raise self._failed from first.exc

    def _kill(self, ray: Any, rank: int) -> None:
        with contextlib.suppress(Exception):
            ray.kill(self.workers[rank], no_restart=True)

    # -- shutdown -------------------------------------------------------------------
    def shutdown(self) -> None:
        """Gather the timeline (when one was asked for), stop the workers, free their
        resources. Safe to call more than once, and after a failure."""
        import ray

        if not self.workers and self._group is None:
            return
        try:
            if self.timeline_dir and self.workers:
                self._gather_timeline(ray)
        finally:
            self._release(ray)

    def _gather_timeline(self, ray: Any) -> None:
        assert self.timeline_dir is not None
        refs = {w.collect_timeline.remote(): rank for rank, w in enumerate(self.workers)}
        done, _ = ray.wait(
            list(refs), num_returns=len(refs), timeout=self.settings.timeout_s + 30.0
        )
        files: dict[int, Any] = {}
        missing: dict[int, str] = {}
        for ref, rank in refs.items():
            if ref not in done:
                missing[rank] = "its actor did not answer in time"
                continue
            try:
                files[rank] = ray.get(ref)
            except Exception as exc:
                missing[rank] = first_line(exc)
        here = ray.get_runtime_context().get_node_id()
        for rank in sorted(missing):
            path = self._staging.get(rank)
            if path and self.places[rank].node_id == here and os.path.isdir(path):
                files[rank] = recover_local(path)
                self._say(f"rank {rank}'s timeline recovered from {path} ({missing.pop(rank)})")
        write_gathered(self.timeline_dir, files, self.places, missing)
        for rank, why in sorted(missing.items()):
            self._say(f"rank {rank}'s timeline is missing from {self.timeline_dir}: {why}")

    def _release(self, ray: Any) -> None:
        for rank in range(len(self.workers)):
            self._kill(ray, rank)
        self.workers = []
        if self._group is not None:
            from ray.util.placement_group import remove_placement_group

            with contextlib.suppress(Exception):
                remove_placement_group(self._group)
            self._group = None

    def _say(self, text: str) -> None:
        print(LOG_PREFIX + text, file=sys.stderr, flush=True)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()
