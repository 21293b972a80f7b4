"""``hvdprof.spark.run``: Horovod's ``horovod.spark.run`` for hvdprof jobs.

::

    import hvdprof.spark
    results = hvdprof.spark.run(train, args=(epochs,), num_proc=4)   # one per rank

Inside a PySpark application, ``run`` starts ``num_proc`` Spark tasks in barrier mode
(all at once or none), one rank each; the function runs in the task's Python worker,
calls ``hvd.init()`` and meets the other ranks through rank 0's store, as in any job.
Horovod's arguments keep their meaning; those that choose how Horovod launches its
processes (``use_mpi``, ``use_gloo``, ``extra_mpi_args``, ``executable``) and ``nics``
are accepted and unused: the tasks are the ranks, and they meet over the address they
reach the driver from.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from typing import IO, Any

from hvdprof.cluster.timeline_gather import timeline_directory
from hvdprof.launch.output import OutputSink
from hvdprof.spark.job import JobSpec, SparkJob

#: Horovod's variable for the default ``start_timeout`` (seconds), and that default
START_TIMEOUT_VAR = "HOROVOD_SPARK_START_TIMEOUT"
DEFAULT_START_TIMEOUT_S = 600.0


def run(
    fn: Callable[..., Any],
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    num_proc: int | None = None,
    start_timeout: float | None = None,
    use_mpi: bool | None = None,
    use_gloo: bool | None = None,
    extra_mpi_args: str | None = None,
    env: Mapping[str, object] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
    verbose: int = 1,
    nics: object = None,
    prefix_output_with_timestamp: bool = False,
    executable: str | None = None,
    *,
    timeline: str | None = None,
    failure_grace_s: float = 10.0,
) -> list[Any]:
    """Run ``fn(*args, **kwargs)`` as ``num_proc`` ranks in Spark tasks; the results in
    rank order.

    ``num_proc`` defaults to Spark's default parallelism; ``start_timeout`` (seconds the
    tasks get to start and register) to ``HOROVOD_SPARK_START_TIMEOUT``, else 600. ``env``
    is added to every rank's environment, after the driver's ``HVDPROF_*`` and
    ``HOROVOD_*`` variables. The ranks' ``stdout``/``stderr`` lines arrive on the
    driver's (or the given) streams as ``[rank]<stdout>:line``. ``timeline``: a
    directory on the driver where every rank's timeline is gathered (else the driver's
    ``HVDPROF_TIMELINE`` or ``HOROVOD_TIMELINE``). A rank that dies or raises ends the
    job: the others get ``failure_grace_s`` to end, then Spark stops them, and
    :class:`~hvdprof.spark.TaskFailedError` names the rank, its executor and the cause.
    """
    del use_mpi, use_gloo, extra_mpi_args, nics, prefix_output_with_timestamp, executable
    sc = active_spark_context()
    spec = JobSpec(
        fn=fn,
        args=tuple(args),
        kwargs=dict(kwargs or {}),
        num_proc=_num_proc(sc, num_proc),
        start_timeout_s=_start_timeout(start_timeout),
        env=_environment(env),
        timeline_dir=timeline_directory(timeline, {**os.environ, **_environment(env)}),
        failure_grace_s=float(failure_grace_s),
        verbose=int(verbose),
    )
    wait_for_task_slots(sc, spec.num_proc, spec.start_timeout_s)
    sink = OutputSink(stdout or sys.stdout, stderr or sys.stderr, prefix=True)
    return SparkJob(sc, spec, sink).run()


def active_spark_context() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        raise ImportError(
            f"hvdprof.spark needs pyspark (pip install 'hvdprof[spark]'): {exc}"
        ) from exc
    sc = pyspark.SparkContext._active_spark_context
    if sc is None:
        raise RuntimeError(
            "Could not find an active SparkContext, are you running in a PySpark session?"
        )
    return sc


def _num_proc(sc: Any, num_proc: int | None) -> int:
    if num_proc is None:
        return int(sc.defaultParallelism)
    if isinstance(num_proc, bool) or not isinstance(num_proc, int) or num_proc < 1:
        raise ValueError(f"num_proc={num_proc!r}: the number of ranks must be an int >= 1")
    return num_proc


def _start_timeout(start_timeout: float | None) -> float:
    if start_timeout is None:
        text = os.environ.get(START_TIMEOUT_VAR, "").strip()
        try:
            start_timeout = float(text) if text else DEFAULT_START_TIMEOUT_S
        except ValueError:
            raise ValueError(f"{START_TIMEOUT_VAR}={text!r}: expected seconds > 0") from None
    if not start_timeout > 0:
        raise ValueError(f"start_timeout={start_timeout!r}: expected seconds > 0")
    return float(start_timeout)


def _environment(env: Mapping[str, object] | None) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a dict of variables, not {type(env).__name__}")
    return {str(k): str(v) for k, v in env.items()}


def task_slots(sc: Any) -> int | None:
    """How many tasks the cluster can run at once now (None: Spark does not say).

    A barrier stage needs a slot per task at once; Spark refuses one that asks for more
    and retries the refusal for minutes, so the driver waits here instead, within
    ``start_timeout``, and says so when the slots never come."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:
        return None


def wait_for_task_slots(sc: Any, num_proc: int, start_timeout_s: float) -> None:
    deadline = time.monotonic() + start_timeout_s
    slots = task_slots(sc)
    while slots is not None and slots < num_proc:
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"Timed out waiting for Spark tasks to start: {num_proc} ranks need "
                f"{num_proc} task slots at once (one barrier task each), the cluster has "
                f"{slots} after {start_timeout_s:g}s (start_timeout). Add executors or "
                "cores, run fewer ranks, or raise start_timeout if executors are "
                "allocated on demand"
            )
        time.sleep(0.25)
        slots = task_slots(sc)
