"""Where a rank of a Spark job runs, as its task reports it, in Spark's terms.

The driver names a rank by its task, its executor and its host in every line it prints
and in the gathered timeline's ``spark.json``, so a failure can be found in Spark's UI
and logs. The executor's id is read where Spark leaves it for the task's process (the
executor's log URL in standalone mode, ``SPARK_EXECUTOR_ID`` on Kubernetes); the driver
fills it in from Spark's own task list when the task could not tell (local mode runs
every task in the driver's executor, ``driver``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, replace

_LOG_URL_EXECUTOR = re.compile(r"[?&]executorId=([^&\s]+)")


@dataclass(frozen=True)
class TaskPlace:
    """What a Spark task reports about where it runs."""

    hostname: str
    #: the address the task reached the driver from (rank 0's store listens there)
    address: str
    pid: int
    #: the task's partition: Horovod's task index
    partition: int
    #: which attempt of the task this is (0 unless Spark retried it)
    attempt: int
    stage_id: int
    #: Spark's id of this task attempt (its task list, its UI)
    task_attempt_id: int
    executor_id: str = ""
    #: the executor's host:port as Spark's barrier context lists it
    executor_address: str = ""

    def describe(self) -> str:
        """``task 1 on executor 1 (host vm, pid 4011)``: how failures name the rank."""
        executor = self.executor_id or self.executor_address or "?"
        return (
            f"task {self.partition} on executor {executor} (host {self.hostname}, pid {self.pid})"
        )

    def with_executor(self, executor_id: str) -> TaskPlace:
        return replace(self, executor_id=executor_id)


def executor_id_from_environment(environ: Mapping[str, str]) -> str:
    """The executor's id as the task's process sees it, or "" when it cannot tell."""
    explicit = environ.get("SPARK_EXECUTOR_ID", "").strip()
    if explicit:
        return explicit
    for name in ("SPARK_LOG_URL_STDERR", "SPARK_LOG_URL_STDOUT"):
        found = _LOG_URL_EXECUTOR.search(environ.get(name, ""))
        if found:
            return found[1]
    return ""
