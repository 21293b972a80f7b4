"""A real local Spark for the Spark tests, started once per test session and always stopped.

``local-cluster[2,1,1024]``: a standalone master and two worker JVMs of one core each, so
the two ranks of a job run on two executors, each task in a Python worker of its own, as
on a cluster. Its executors start after the context: 10-40 s on this 2-core machine, more
when other work loads it, hence ``START_S``; ``local[2]`` (one JVM, executor ``driver``)
starts in about half the time and is what ``MASTER`` falls back to if local-cluster
ever cannot run here. The executors' Python workers find the tests' functions through
``spark.executorEnv.PYTHONPATH``. At the end the context is stopped, the py4j gateway JVM
is closed (it exits when its stdin does) and any process left below this one since Spark
started is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
MASTER = "local-cluster[2,1,1024]"
#: task slots of MASTER
SLOTS = 2
#: the most Spark may take to start its executors (JVMs on a loaded 2-core machine)
START_S = 240.0


def pyspark_or_skip() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"pyspark is missing but CI=true: .ci/setup installs it ({exc})")
        pytest.skip(f"pyspark is not installed (pip install 'hvdprof[spark]'): {exc}")
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        if os.environ.get("CI") == "true":
            pytest.fail("java is missing but CI=true: .ci/setup installs default-jre-headless")
        pytest.skip("Spark needs a Java runtime (apt-get install default-jre-headless)")
    return pyspark


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


@pytest.fixture(scope="session")
def spark_context() -> Iterator[Any]:
    """The session's SparkContext, its executors registered (``hvdprof.spark.run`` needs
    only the context; a user's SparkSession holds one the same way)."""
    pyspark_or_skip()
    from pyspark import SparkConf, SparkContext

    from hvdprof.spark.runner import task_slots

    before = _descendants(os.getpid())
    saved = {k: os.environ.get(k) for k in ("PYSPARK_PYTHON", "SPARK_LOCAL_IP")}
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    python_path = os.pathsep.join(
        [str(TESTS), str(TESTS / "workers"), str(TESTS.parent), os.environ.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    conf = (
        SparkConf()
        .setMaster(MASTER)
        .setAppName("hvdprof-tests")
        .set("spark.ui.enabled", "false")
        .set("spark.ui.showConsoleProgress", "false")
        .set("spark.driver.host", "127.0.0.1")
        .set("spark.executor.memory", "512m")
        .set("spark.executorEnv.PYTHONPATH", python_path)
        .set("spark.executorEnv.HVDTEST_DEADLINE_S", "300")
    )
    sc = None
    try:  # (a timeout while Spark starts still stops what started)
        deadline = time.monotonic() + START_S
        sc = SparkContext(conf=conf)
        sc.setLogLevel("ERROR")
        while (task_slots(sc) or 0) < SLOTS:  # the executors start after the context
            assert time.monotonic() < deadline, f"Spark's {SLOTS} executors did not start"
            time.sleep(0.25)
        yield sc
    finally:
        gateway = SparkContext._gateway
        if sc is not None:
            with contextlib.suppress(Exception):
                sc.stop()
        proc = getattr(gateway, "proc", None)
        if gateway is not None:
            with contextlib.suppress(Exception):
                gateway.shutdown()
        if proc is not None:
            with contextlib.suppress(Exception):
                proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except Exception:
                proc.kill()
        SparkContext._gateway = None
        SparkContext._jvm = None
        for pid in _descendants(os.getpid()) - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
