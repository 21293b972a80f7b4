"""One ``hvdprof.spark.run`` job, from its tasks' registration to its results.

The driver starts the Spark job (one barrier task per rank) in a thread and then only
consumes events: the tasks' registrations, their output, timelines and outcomes, a
connection that closed (a dead task), and the Spark job's own end. Once every task has
registered it numbers the ranks host by host and tells each its rank and environment;
rank 0's store, on rank 0's host, is where they meet. A failure ends the job: the others
get ``failure_grace_s`` to end on their own, then the Spark job group is cancelled (Spark
kills their Python workers), and one line names the rank, its executor and the cause.
"""

from __future__ import annotations

import itertools
import os
import queue
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from hvdprof.cluster.failures import RankFailure, failure_line
from hvdprof.cluster.layout import forwarded_environment, order_by_host, rank_environment
from hvdprof.cluster.timeline_gather import recover_local, write_gathered
from hvdprof.config import name_of
from hvdprof.launch.output import OutputSink
from hvdprof.spark.driver_service import DriverService, TaskEvent
from hvdprof.spark.failures import (
    LOG_PREFIX,
    TaskFailedError,
    death_reason,
    spark_cause,
    spark_summary,
)
from hvdprof.spark.messages import Assignment, Outcome, Output, Register, TimelineFiles
from hvdprof.spark.place import TaskPlace
from hvdprof.spark.task import run_rank
from hvdprof.spark.timeline_files import as_fresh_process

#: the file of the gathered timeline that maps ranks to tasks, executors and hosts
SPARK_LAYOUT_FILE = "spark.json"
#: bound on the driver's own waits that are not the user's function (Spark's end, a
#: last message in flight)
_SETTLE_S = 30.0
_POLL_S = 0.2
_job_ids = itertools.count()


@dataclass(frozen=True)
class _SparkEnded:
    results: list[Any] | None
    error: BaseException | None


@dataclass(frozen=True)
class JobSpec:
    """What ``run`` decided: the function, how many ranks, the limits and the outputs."""

    fn: Callable[..., Any]
    args: Sequence[Any]
    kwargs: Mapping[str, Any]
    num_proc: int
    start_timeout_s: float
    env: Mapping[str, str]
    timeline_dir: str | None
    failure_grace_s: float
    verbose: int


class SparkJob:
    """The driver of one job; :meth:`run` returns the results in rank order."""

    def __init__(self, sc: Any, spec: JobSpec, sink: OutputSink) -> None:
        self.sc = sc
        self.spec = spec
        self.sink = sink
        self.group = f"hvdprof.spark.run.{os.getpid()}.{next(_job_ids)}"
        self.service = DriverService(str(sc.getConf().get("spark.driver.host", "127.0.0.1")))
        self.places: dict[int, TaskPlace] = {}  # by partition
        self.ports: dict[int, int] = {}
        self.staging: dict[int, str] = {}
        self.rank_of: dict[int, int] = {}  # partition -> rank
        self.timelines: dict[int, dict[str, bytes]] = {}  # by rank
        self.outcomes: dict[int, Outcome] = {}  # by rank
        self.failures: list[RankFailure] = []  # in arrival order
        self.ended: _SparkEnded | None = None
        self._thread = threading.Thread(
            target=self._spark_job, name="hvdprof-spark-job", daemon=True
        )

    # -- the Spark side ------------------------------------------------------------
    def _spark_job(self) -> None:
        spec, address, authkey = self.spec, self.service.address, self.service.authkey
        want_timeline = spec.timeline_dir is not None

        def mapper(partition: int, _rows: Any) -> Any:
            yield run_rank(
                partition,
                address,
                authkey,
                spec.fn,
                spec.args,
                spec.kwargs,
                want_timeline,
                spec.start_timeout_s,
            )

        try:
            self.sc.setJobGroup(self.group, "hvdprof.spark.run", interruptOnCancel=True)
            rdd = self.sc.parallelize(range(spec.num_proc), spec.num_proc)
            results = rdd.barrier().mapPartitionsWithIndex(mapper).collect()
            self.service.events.put(TaskEvent(-1, _SparkEnded(results, None)))
        except BaseException as exc:
            self.service.events.put(TaskEvent(-1, _SparkEnded(None, exc)))

    # -- running -------------------------------------------------------------------
    def run(self) -> list[Any]:
        self._thread.start()
        try:
            self._await_registration()
            self._assign_ranks()
            self._watch()
        except BaseException:
            self.sc.cancelJobGroup(self.group)
            raise
        finally:
            self._finish()
        if self.failures or (self.ended is not None and self.ended.error is not None):
            raise self._failed()
        assert self.ended is not None and self.ended.results is not None
        return [result for _, result in sorted(self.ended.results, key=lambda r: r[0])]

    def _next(self, timeout: float) -> TaskEvent | None:
        try:
            event = self.service.events.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        self._handle(event)
        return event

    def _handle(self, event: TaskEvent) -> None:
        message, partition = event.message, event.partition
        if isinstance(message, _SparkEnded):
            self.ended = message
        elif isinstance(message, Register):
            self.places[partition] = message.place
            self.ports[partition] = message.free_port
            self.staging[partition] = message.staging
        elif partition not in self.rank_of:
            return  # a task that never got a rank (the job did not start)
        elif isinstance(message, Output):
            self.sink.emit(self.rank_of[partition], message.stream, message.text)
        elif isinstance(message, TimelineFiles):
            self.timelines[self.rank_of[partition]] = message.files
        elif isinstance(message, Outcome):
            rank = self.rank_of[partition]
            self.outcomes[rank] = message
            if not message.ok:
                self.failures.append(RankFailure(rank, False, message.reason, None, message.echo))
        elif message is None:
            rank = self.rank_of[partition]
            self.failures.append(RankFailure(rank, True, "", None))

    def _await_registration(self) -> None:
        spec = self.spec
        deadline = time.monotonic() + spec.start_timeout_s
        while len(self.places) < spec.num_proc:
            if self.ended is not None:
                raise self._failed()
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"Timed out waiting for Spark tasks to start: {len(self.places)} of "
                    f"{spec.num_proc} tasks registered with the driver within "
                    f"{spec.start_timeout_s:g}s (start_timeout). Each rank runs in a Spark task; "
                    "check that the cluster has a free task slot per rank, or raise "
                    "start_timeout if executors are allocated on demand"
                )
            self._next(min(_POLL_S, deadline - time.monotonic()))

    def _assign_ranks(self) -> None:
        spec = self.spec
        partitions = sorted(self.places)
        fill_executor_ids(self.sc, self.places)
        order = [
            partitions[i] for i in order_by_host([self.places[p].hostname for p in partitions])
        ]
        self.rank_of = {p: r for r, p in enumerate(order)}
        hosts = [self.places[p].hostname for p in order]
        root = self.places[order[0]]
        shared = forwarded_environment(os.environ)
        shared[name_of("start_timeout_s")] = f"{spec.start_timeout_s:g}"
        shared.update(spec.env)
        for rank, partition in enumerate(order):
            env = dict(shared)
            env.update(rank_environment(hosts, rank, root.address, self.ports[order[0]]))
            self.service.assign(partition, Assignment(rank, env))
        if spec.verbose >= 2:
            for rank, partition in enumerate(order):
                self._say(f"rank {rank}: {self.places[partition].describe()}")

    def _watch(self) -> None:
        """Consume events until every rank reported and Spark's job ended, or a failure."""
        while not self.failures and not self._all_done():
            if self.ended is not None and self.ended.error is not None:
                break
            self._next(_POLL_S)
        if self.failures or (self.ended is not None and self.ended.error is not None):
            self._grace()

    def _all_done(self) -> bool:
        return self.ended is not None and len(self.outcomes) == self.spec.num_proc

    def _grace(self) -> None:
        """Let the other ranks end on their own (and Spark say why a task died), then
        cancel what still runs."""
        deadline = time.monotonic() + self.spec.failure_grace_s
        while time.monotonic() < deadline and not (
            self.ended is not None and len(self.outcomes) + self._deaths() >= self.spec.num_proc
        ):
            self._next(min(_POLL_S, deadline - time.monotonic()))

    def _deaths(self) -> int:
        return len({f.rank for f in self.failures if f.died} - set(self.outcomes))

    def _finish(self) -> None:
        """Cancel what runs, wait (bounded) for Spark's end, gather the timeline."""
        if self.ended is None:
            self.sc.cancelJobGroup(self.group)
        deadline = time.monotonic() + _SETTLE_S
        while time.monotonic() < deadline and (
            self.ended is None or len(self.outcomes) + self._deaths() < len(self.rank_of)
        ):
            self._next(min(_POLL_S, deadline - time.monotonic()))
        self.service.close()
        if self.spec.timeline_dir and self.rank_of:
            self._gather_timeline(self.spec.timeline_dir)

    # -- failure ---------------------------------------------------------------------
    def _failed(self) -> TaskFailedError:
        """The error that ends the job; its one line is printed first."""
        error_text = str(self.ended.error) if self.ended and self.ended.error else ""
        blamed = [f for f in self.failures if not f.echo] or self.failures
        if not blamed:
            line = f"{LOG_PREFIX}the Spark job failed: {spark_summary(error_text)}"
            print(line, file=sys.stderr, flush=True)
            error = TaskFailedError(line.removeprefix(LOG_PREFIX), None, None, True)
            error.__cause__ = self.ended.error if self.ended else None
            return error
        first = blamed[0]
        place = self.places[self._partition_of(first.rank)]
        reason = death_reason(place.pid, spark_cause(error_text)) if first.died else first.reason
        others = max(self.spec.num_proc - 1, 0)
        line = failure_line(LOG_PREFIX, first.rank, place.describe(), first.died, reason, others)
        print(line, file=sys.stderr, flush=True)
        error = TaskFailedError(line.removeprefix(LOG_PREFIX), first.rank, place, first.died)
        if self.ended is not None and self.ended.error is not None:
            error.__cause__ = self.ended.error
        return error

    def _partition_of(self, rank: int) -> int:
        return next(p for p, r in self.rank_of.items() if r == rank)

    # -- timeline --------------------------------------------------------------------
    def _gather_timeline(self, directory: str) -> None:
        here = socket.gethostname()
        missing: dict[int, str] = {}
        files = dict(self.timelines)
        for partition, rank in sorted(self.rank_of.items(), key=lambda item: item[1]):
            if rank in files:
                continue
            path, place = self.staging.get(partition, ""), self.places[partition]
            if path and place.hostname == here and os.path.isdir(path):
                files[rank] = as_fresh_process(recover_local(path))
                self._say(f"rank {rank}'s timeline recovered from {path}")
            else:
                missing[rank] = f"its task on host {place.hostname} did not send it"
        order = sorted(self.rank_of, key=self.rank_of.__getitem__)
        write_gathered(
            directory,
            files,
            SPARK_LAYOUT_FILE,
            "hvdprof-spark",
            [asdict(self.places[p]) for p in order],
            missing,
            application=self.sc.applicationId,
            master=self.sc.master,
        )
        if self.spec.verbose >= 1:
            self._say(f"the timeline of {len(order)} ranks is in {directory}")
        for rank, why in sorted(missing.items()):
            self._say(f"rank {rank}'s timeline is missing from {directory}: {why}")

    def _say(self, text: str) -> None:
        print(LOG_PREFIX + text, file=sys.stderr, flush=True)


def fill_executor_ids(sc: Any, places: dict[int, TaskPlace]) -> None:
    """Name the executor of each task that could not tell: Spark's task list knows it;
    in local mode every task runs in the driver's executor."""
    unknown = [p for p, place in places.items() if not place.executor_id]
    if not unknown:
        return
    known = _executors_of_tasks(
        sc, {places[p].task_attempt_id for p in unknown}, places[unknown[0]]
    )
    local = str(sc.master).startswith("local") and not str(sc.master).startswith("local-cluster")
    for p in unknown:
        found = known.get(places[p].task_attempt_id) or ("driver" if local else "")
        if found:
            places[p] = places[p].with_executor(found)


def _executors_of_tasks(sc: Any, task_ids: set[int], sample: TaskPlace) -> dict[int, str]:
    """``{task attempt id: executor id}`` from Spark's status store (best effort: it is
    Spark's internal API, reached through py4j)."""
    try:
        store = sc._jsc.sc().statusStore()
        tasks = store.taskList(sample.stage_id, 0, 1 << 20)  # a barrier stage is not retried
        found: dict[int, str] = {}
        it = tasks.iterator()
        while it.hasNext():
            task = it.next()
            if int(task.taskId()) in task_ids:
                found[int(task.taskId())] = str(task.executorId())
        return found
    except Exception:
        return {}
