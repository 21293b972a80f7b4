"""``HOROVOD_TIMELINE`` as Horovod has it, with real jobs (``hvdprof run``, 2 ranks):

* empty: no timeline, nothing written (it used to record into a hidden ``./.ranks/``);
* ``DYNAMIC``: nothing written until every rank calls ``hvd.start_timeline(path)``, then
  a timeline there (it used to record from the start into ``./DYNAMIC``);
* a path where nothing can be written (``/proc/x.json``, a 4,444-character path): one
  warning line for the whole job, and the job trains on and exits 0 (it used to stop the
  job, then name a directory that was never created); the same for a rank started
  without ``hvdprof run`` (as mpirun or torchrun start one).

Our own ``--timeline``/``HVDPROF_TIMELINE`` keep their meaning: a path that cannot be
written is an error before any rank starts (tests/test_first_hour.py,
tests/test_timeline_e2e.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import WORKERS, JobResult, child_env, parse_output, run_in_group

from hvdprof.config import Config, horovod_settings

pytestmark = pytest.mark.timeout(300)

WORKER = WORKERS / "horovod_timeline_worker.py"
JOB_S = 150.0


def run(value: str, cwd: Path, *args: str) -> JobResult:
    """``HOROVOD_TIMELINE=value hvdprof run -np 2 worker args`` in ``cwd``."""
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", str(JOB_S), "--",
        sys.executable, str(WORKER), *args,
    ]  # fmt: skip
    env = child_env({"HOROVOD_TIMELINE": value}, JOB_S)
    done = run_in_group(command, env=env, cwd=cwd, timeout=JOB_S + 30)
    result = JobResult(done.returncode, done.stdout + done.stderr, 0.0)
    parse_output(done.stdout, result)
    parse_output(done.stderr, result)
    return result


def assert_trained(result: JobResult, steps: int = 5) -> None:
    result.assert_done(2)
    for rank in (0, 1):
        assert result.values(rank, "TRAINED") == [str(steps)], result.describe()
    assert "Traceback" not in result.output, result.describe()


def listing(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def test_empty_and_dynamic_set_no_timeline_directory() -> None:
    for value in ("", "DYNAMIC"):
        assert horovod_settings({"HOROVOD_TIMELINE": value}) == {}
        config = Config.from_env({"HOROVOD_TIMELINE": value})
        assert config.timeline_dir == "" and config.horovod_timeline_file == ""


def test_empty_records_nothing(tmp_path: Path) -> None:
    result = run("", tmp_path, "plain")
    assert_trained(result)
    assert listing(tmp_path) == [], "an empty HOROVOD_TIMELINE wrote files"
    assert not any("HOROVOD_TIMELINE" in line for line in result.launcher), result.describe()


def test_dynamic_records_only_after_start_timeline(tmp_path: Path) -> None:
    where = tmp_path / "later"
    where.mkdir()
    result = run("DYNAMIC", tmp_path, "dynamic", str(where))
    assert_trained(result, steps=10)
    for rank in (0, 1):
        before, after = result.values(rank, "FILES")
        assert before == "-", f"rank {rank} found files before start_timeline: {before}"
        assert {"timeline/rank.0.json", "timeline/rank.1.json"} <= set(after.split(",")), after
    assert listing(tmp_path) == sorted(["later", *(f"later/{p}" for p in listing(where))]), (
        "HOROVOD_TIMELINE=DYNAMIC wrote outside start_timeline's path"
    )
    trace = (where / "timeline" / "rank.0.json").read_text()
    assert '"g"' in trace or "allreduce" in trace.lower(), trace[:500]


def long_path(root: Path, length: int = 4444) -> str:
    """A path of exactly ``length`` characters under ``root``: every component fits, the
    whole is past the system's limit (PATH_MAX, 4096 on Linux)."""
    path = str(root)
    while length - len(path) > 220:
        path += "/" + "d" * 200
    return path + "/" + "e" * (length - len(path) - len("/.json")) + ".json"


@pytest.mark.parametrize("where", ["/proc/x.json", "a 4,444-character path"])
def test_an_unwritable_path_is_one_warning_and_the_job_trains(where: str, tmp_path: Path) -> None:
    value = where if where.startswith("/") else long_path(tmp_path / "deep")
    if not where.startswith("/"):
        assert len(value) == 4444
    result = run(value, tmp_path, "plain")
    assert_trained(result)
    said = [line for line in result.output.splitlines() if "HOROVOD_TIMELINE" in line]
    assert len(said) == 1, result.describe()
    assert said[0].startswith("hvdprof run: HOROVOD_TIMELINE=") and (
        "will not write a timeline" in said[0] and "trains on" in said[0]
    ), said[0]
    assert len(said[0]) < 600, said[0]  # the 4,444 characters are shortened
    assert listing(tmp_path) == [], "the failed attempt left folders behind"
    assert not os.path.exists("/proc/x.ranks")


def test_a_rank_started_without_hvdprof_run_warns_and_trains(tmp_path: Path) -> None:
    """One rank started directly (as mpirun, torchrun or srun would): the rank itself
    finds the path unwritable, says so once and trains on."""
    env = child_env({"HOROVOD_TIMELINE": "/proc/x.json"}, JOB_S)
    done = subprocess.run(
        [sys.executable, str(WORKER), "plain"],
        capture_output=True,
        text=True,
        timeout=JOB_S,
        env=env,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "TRAINED 5" in done.stdout.splitlines(), done.stdout
    said = [line for line in done.stderr.splitlines() if "HOROVOD_TIMELINE" in line]
    assert len(said) == 1 and said[0].startswith("hvdprof rank 0: HOROVOD_TIMELINE="), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
