"""hvdprof on Spark (``hvdprof.spark.run``), against a real local Spark.

The Spark is ``local-cluster[2,1,1024]`` (a master and two workers of one core each, so
the two ranks of a job run on two executors), started once per test session by
``spark_support.spark_context`` and always stopped. Every test's timeout covers Spark's
start (``spark_support.START_S``), which the first test to need it pays. Every test has a
hard timeout and every wait of the driver is bounded (``start_timeout``, ``failure_grace_s``).

The job is the one tests/test_ray.py runs on Ray (``workers/ray_train.py``): the same
``DistributedOptimizer`` training under ``hvdprof run -np 2`` must end with the same
parameters, and its timeline must name the rank slowed on purpose.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, WORKERS, child_env, run_job
from spark_support import MASTER

from hvdprof.cluster.layout import order_by_host
from hvdprof.spark.failures import death_reason, spark_cause, spark_summary
from hvdprof.spark.place import TaskPlace, executor_id_from_environment

sys.path.insert(0, str(WORKERS))
import ray_train

STEPS = 20
SLOW_RANK, SLOW_MS = 1, 40.0


# --- the driver's decisions, without Spark ---------------------------------------------


def test_the_executor_is_read_where_spark_leaves_it() -> None:
    url = "http://10.0.0.5:8081/logPage/?appId=app-1&executorId=3&logType=stderr"
    assert executor_id_from_environment({"SPARK_LOG_URL_STDERR": url}) == "3"
    assert (
        executor_id_from_environment({"SPARK_EXECUTOR_ID": "7", "SPARK_LOG_URL_STDERR": url}) == "7"
    )
    assert executor_id_from_environment({"SPARK_LOCAL_DIRS": "/tmp"}) == ""
    place = TaskPlace("host-a", "10.0.0.5", 4011, 1, 0, 3, 9, "", "10.0.0.5:4000")
    assert place.describe() == "task 1 on executor 10.0.0.5:4000 (host host-a, pid 4011)"
    assert place.with_executor("2").describe() == "task 1 on executor 2 (host host-a, pid 4011)"


def test_tasks_are_ranked_host_by_host() -> None:
    # Horovod's Spark driver groups a host's tasks, so local ranks are contiguous
    assert order_by_host(["b", "a", "b", "a"]) == [0, 2, 1, 3]


def test_sparks_words_for_a_death_become_the_cause() -> None:
    text = (
        "An error occurred while calling o61.collectAndServe.\n"
        ": org.apache.spark.SparkException: Job aborted due to stage failure: Could not "
        "recover from a failed barrier ResultStage. Most recent failure reason: Stage failed "
        "because barrier task ResultTask(0, 1) finished unsuccessfully.\n"
        "org.apache.spark.SparkException: Python worker exited unexpectedly (crashed). "
        "Consider setting 'spark.sql.execution.pyspark.udf.faulthandler.enabled'\n"
    )
    assert spark_cause(text) == "Python worker exited unexpectedly (crashed)"
    lost = "ExecutorLostFailure (executor 1 exited caused by one of the running tasks) Reason: gone"
    assert spark_cause(f"x\n{lost}. More.\n") == lost
    assert death_reason(4011, "x") == "its process (pid 4011) ended (x)"
    assert spark_summary("Job aborted due to stage failure: boom\nmore").startswith("Job aborted")


# --- jobs on a local Spark ---------------------------------------------------------------


def _rank_and_size() -> tuple[int, int]:
    import hvdprof.torch as hvd

    hvd.init()
    return hvd.rank(), hvd.size()


def _settings_seen() -> dict[str, Any]:
    import hvdprof.torch as hvd
    from hvdprof.runtime import runtime

    hvd.init()
    cfg = runtime.get().config
    return {
        "rank": hvd.rank(),
        "cycle_ms": cfg.cycle_time_ms,
        "fusion": cfg.fusion_threshold_bytes,
        "start_timeout": cfg.start_timeout_s,
        "extra": os.environ.get("SPARK_TEST_EXTRA"),
        "pid": os.getpid(),
    }


def _fails_on_rank_zero() -> int:
    import hvdprof.torch as hvd

    hvd.init()
    if hvd.rank() == 0:
        raise ValueError("bad batch 3")
    return hvd.rank()


@pytest.mark.timeout(420)
def test_variables_and_results_reach_every_rank(
    spark_context: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import hvdprof.spark

    monkeypatch.setenv("HVDPROF_CYCLE_TIME", "3.5")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1234567")
    seen = hvdprof.spark.run(
        _settings_seen, num_proc=2, start_timeout=90, env={"SPARK_TEST_EXTRA": "x"}, verbose=0
    )
    assert [s["rank"] for s in seen] == [0, 1]  # results in rank order
    for s in seen:
        assert (s["cycle_ms"], s["fusion"], s["start_timeout"], s["extra"]) == (
            3.5,
            1234567,
            90.0,
            "x",
        )
    assert seen[0]["pid"] != seen[1]["pid"] != os.getpid()  # one task process per rank
    # the Python workers are Spark's to reuse: the job's variables did not stay behind
    assert hvdprof.spark.run(lambda: os.environ.get("SPARK_TEST_EXTRA"), num_proc=2) == [
        None,
        None,
    ]


@pytest.fixture(scope="module")
def spark_training(
    spark_context: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], Path]:
    import hvdprof.spark

    timeline = tmp_path_factory.mktemp("spark") / "tl"
    results = hvdprof.spark.run(
        ray_train.train,
        kwargs={"steps": STEPS, "sleep_rank": SLOW_RANK, "sleep_ms": SLOW_MS},
        num_proc=2,
        start_timeout=90,
        timeline=str(timeline),
    )
    return results, timeline


@pytest.mark.timeout(420)
def test_training_matches_hvdprof_run(
    spark_training: tuple[list[dict[str, Any]], Path], tmp_path: Path
) -> None:
    import torch

    results, _ = spark_training
    assert [(r["rank"], r["size"]) for r in results] == [(0, 2), (1, 2)]
    out = tmp_path / "params.pt"
    job = run_job("ray_train.py", 2, "--out", str(out), "--steps", str(STEPS), timeout=120)
    assert job.returncode == 0, job.describe()
    reference = torch.load(out)
    for spark_rank in results:
        assert len(spark_rank["params"]) == len(reference)
        for got, want in zip(spark_rank["params"], reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    untrained, _ = ray_train._model_and_data(7, 0, 0)  # and training moved them
    assert not torch.allclose(next(untrained.parameters()), reference[0])


@pytest.mark.timeout(420)
def test_the_gathered_timeline_names_the_slowed_rank(
    spark_training: tuple[list[dict[str, Any]], Path],
) -> None:
    from hvdprof.analysis import find_stragglers, load_run

    _, timeline = spark_training
    layout = json.loads((timeline / "spark.json").read_text())
    assert layout["format"] == "hvdprof-spark" and layout["missing"] == {}
    assert [r["rank"] for r in layout["ranks"]] == [0, 1]
    assert {r["hostname"] for r in layout["ranks"]} == {socket.gethostname()}
    # each rank's executor named by Spark's id: local mode's one executor is the driver,
    # a local-cluster's are 0 and 1
    executors = sorted(r["executor_id"] for r in layout["ranks"])
    assert executors == (["0", "1"] if MASTER.startswith("local-cluster") else ["driver"] * 2)
    assert len({r["pid"] for r in layout["ranks"]}) == 2
    run = load_run(str(timeline), cache=False)
    found = find_stragglers(run)
    assert found.straggler == SLOW_RANK, found.verdict
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(timeline)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rank {SLOW_RANK} is the straggler" in proc.stdout


@pytest.mark.timeout(420)
def test_a_killed_task_ends_the_job_in_one_line(
    spark_context: Any, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    import hvdprof.spark
    from hvdprof.analysis import load_run

    capfd.readouterr()
    timeline = tmp_path / "tl"
    with pytest.raises(hvdprof.spark.TaskFailedError) as raised:
        hvdprof.spark.run(
            ray_train.train_until_killed,
            kwargs={"die_rank": 1, "die_at": 3},
            num_proc=2,
            start_timeout=90,
            timeline=str(timeline),
            failure_grace_s=20,
        )
    err = raised.value
    assert err.rank == 1 and err.died and err.place is not None
    place = err.place
    assert str(err).startswith(
        f"rank 1 (task {place.partition} on executor {place.executor_id} "
        f"(host {place.hostname}, pid {place.pid})) died: its process (pid {place.pid}) ended ("
    )
    assert "ended (Python worker exited unexpectedly (crashed)); the job" in str(err)
    assert str(err).endswith("; the job is over, its other 1 rank stopped")
    lines = [
        ln for ln in capfd.readouterr().err.splitlines() if ln.startswith("hvdprof spark: rank 1 (")
    ]
    assert lines == [f"hvdprof spark: {err}"]
    # the survivor's timeline came back (or was read here): the job can still be analysed
    assert load_run(str(timeline), cache=False).ranks == [0, 1]
    # and Spark runs the next job
    assert hvdprof.spark.run(_rank_and_size, num_proc=2, verbose=0) == [(0, 2), (1, 2)]


@pytest.mark.timeout(420)
def test_a_raising_rank_ends_the_job_naming_it(
    spark_context: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    import hvdprof.spark

    with pytest.raises(hvdprof.spark.TaskFailedError) as raised:
        hvdprof.spark.run(_fails_on_rank_zero, num_proc=2, start_timeout=90, verbose=0)
    err = raised.value
    assert err.rank == 0 and not err.died
    assert "failed: ValueError: bad batch 3; the job is over" in str(err)
    assert str(err) in capfd.readouterr().err


def test_bad_arguments_are_one_clear_error(spark_context: Any) -> None:
    import hvdprof.spark

    with pytest.raises(ValueError, match=r"^num_proc=0: the number of ranks must be an int >= 1$"):
        hvdprof.spark.run(_rank_and_size, num_proc=0)
    with pytest.raises(TypeError, match=r"^env must be a dict of variables, not list$"):
        hvdprof.spark.run(_rank_and_size, num_proc=1, env=["A=1"])  # type: ignore[arg-type]


def test_a_task_that_raised_before_its_rank_is_summed_up() -> None:
    text = (
        "org.apache.spark.api.python.PythonException: [PYTHON_EXCEPTION] An exception was "
        "thrown from the Python worker: Traceback (most recent call last):\n"
        '  File "worker.py", line 1, in main\n'
        "    run()\n"
        "AttributeError: 'BarrierTaskContext' object has no attribute 'x'\n"
        " SQLSTATE: 38000\n"
        "\tat org.apache.spark.api.python.BasePythonRunner\n"
    )
    assert spark_summary(text) == "AttributeError: 'BarrierTaskContext' object has no attribute 'x'"


def test_a_reused_worker_s_incarnations_are_renumbered_for_the_job() -> None:
    from hvdprof.runtime.runtime import INCARNATION_DIR
    from hvdprof.spark.timeline_files import as_fresh_process

    assert INCARNATION_DIR == "incarnation.{}"  # the folders as_fresh_process reads
    # this job's first init() was the process's third, its second the fourth
    files = {"incarnation.3/rank.1.json": b"a", "incarnation.4/rank.1.json": b"b"}
    assert as_fresh_process(files) == {"rank.1.json": b"a", "incarnation.2/rank.1.json": b"b"}
    assert as_fresh_process({"rank.0.json": b"x"}) == {"rank.0.json": b"x"}
