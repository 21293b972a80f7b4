"""Intra-op threads per rank: the launcher's default, and the cycle thread's own cap.

Real processes through ``python -m hvdprof run``. Without a thread variable, every rank's
torch would start one OpenMP thread per core, N ranks oversubscribing the host N times
(ResNet-50's gradient allreduce 5-7x slower on 2 cores). ``hvdprof run`` then gives each
rank ``OMP_NUM_THREADS = max(1, cores // ranks)`` and says so once; a user's setting, or
``HVDPROF_THREADS_DEFAULT=0``, is left alone. Whatever started the rank, the cycle thread
caps its own OpenMP team at that share without touching the user's threads.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import REPO, WORKERS, JobResult, child_env, parse_output

from hvdprof.runtime.threads import per_rank_threads, usable_cores

NOTICE = "OMP_NUM_THREADS is not set"


def run_threads_job(num_proc: int, *args: str, **env: str | None) -> JobResult:
    """``threads_worker.py ARGS`` at ``num_proc`` ranks; ``env``: NAME=value, or None to
    remove NAME (the thread variables are removed unless given)."""
    environ = child_env(deadline=120)
    environ.pop("OMP_NUM_THREADS", None)
    environ.pop("MKL_NUM_THREADS", None)
    for name, value in env.items():
        if value is None:
            environ.pop(name, None)
        else:
            environ[name] = value
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", str(num_proc), "--timeout", "120",
        "--", sys.executable, str(WORKERS / "threads_worker.py"), *args,
    ]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=150, env=environ, cwd=REPO
    )
    result = JobResult(proc.returncode, proc.stdout + proc.stderr, 0.0)
    parse_output(proc.stdout, result)
    parse_output(proc.stderr, result)
    return result


def notices(result: JobResult) -> list[str]:
    return [line for line in result.launcher if NOTICE in line]


@pytest.mark.parametrize("num_proc", [2, 3])
def test_launcher_sets_a_per_rank_default_and_says_so_once(num_proc: int) -> None:
    result = run_threads_job(num_proc, "env")
    assert result.returncode == 0, result.describe()
    share = per_rank_threads(num_proc)
    for rank in range(num_proc):
        assert result.values(rank, "OMP") == [str(share)], result.describe()
        assert result.values(rank, "MKL") == ["UNSET"], result.describe()
    shown = notices(result)
    assert len(shown) == 1, result.describe()
    assert f"OMP_NUM_THREADS={share}" in shown[0] and "HVDPROF_THREADS_DEFAULT=0" in shown[0]


@pytest.mark.parametrize(
    ("env", "omp", "mkl"),
    [
        ({"OMP_NUM_THREADS": "3"}, "3", "UNSET"),
        ({"MKL_NUM_THREADS": "2"}, "UNSET", "2"),
        ({"HVDPROF_THREADS_DEFAULT": "0"}, "UNSET", "UNSET"),
    ],
    ids=["user-omp", "user-mkl", "default-off"],
)
def test_launcher_leaves_a_users_choice_alone(env: dict[str, str], omp: str, mkl: str) -> None:
    result = run_threads_job(2, "env", **env)
    assert result.returncode == 0, result.describe()
    for rank in range(2):
        assert result.values(rank, "OMP") == [omp], result.describe()
        assert result.values(rank, "MKL") == [mkl], result.describe()
    assert notices(result) == [], result.describe()


def test_malformed_threads_default_is_one_clear_error() -> None:
    result = run_threads_job(2, "env", HVDPROF_THREADS_DEFAULT="sometimes")
    assert result.returncode != 0
    errors = [line for line in result.launcher if "HVDPROF_THREADS_DEFAULT" in line]
    assert len(errors) == 1 and "malformed" in errors[0], result.describe()
    assert "Traceback" not in result.output
    assert result.stdout == {}, "no rank may start"


def test_cycle_thread_takes_its_share_without_the_launchers_default() -> None:
    """mpirun-style: no thread variable and no launcher default. The user's thread keeps
    torch's default (one per core) and so does a thread started later; only the cycle
    thread, which runs the reductions, caps itself at its share."""
    result = run_threads_job(2, "torch", HVDPROF_THREADS_DEFAULT="0")
    result.assert_section("threads", 2)
    result.assert_done(2)
    cores, share = usable_cores(), per_rank_threads(2)
    for rank in range(2):
        assert result.values(rank, "MAIN_THREADS") == [str(cores)], result.describe()
        assert result.values(rank, "CYCLE_THREADS") == [str(min(cores, share))], result.describe()
        assert result.values(rank, "NEW_THREAD_THREADS") == [str(cores)], result.describe()


def test_torch_in_the_ranks_follows_the_launchers_default() -> None:
    result = run_threads_job(2, "torch")
    result.assert_section("threads", 2)
    share = per_rank_threads(2)
    for rank in range(2):
        assert result.values(rank, "MAIN_THREADS") == [str(share)], result.describe()
        assert result.values(rank, "CYCLE_THREADS") == [str(share)], result.describe()


# ------------------------------------------------------------- the rule, no processes
def test_default_threads_rule() -> None:
    from hvdprof.errors import ConfigError
    from hvdprof.launch.local_job import default_threads

    cores = usable_cores()
    assert per_rank_threads(4, cores=16) == 4
    assert per_rank_threads(3, cores=2) == 1  # never 0
    assert default_threads({}, 2) == max(1, cores // 2)
    assert default_threads({}, 1) is None  # a single rank oversubscribes nothing
    assert default_threads({"OMP_NUM_THREADS": "4"}, 2) is None
    assert default_threads({"MKL_NUM_THREADS": "4"}, 2) is None
    assert default_threads({"OMP_NUM_THREADS": " "}, 2) == max(1, cores // 2)  # empty: unset
    assert default_threads({"HVDPROF_THREADS_DEFAULT": "0"}, 2) is None
    assert default_threads({"HVDPROF_THREADS_DEFAULT": "yes"}, 2) == max(1, cores // 2)
    with pytest.raises(ConfigError, match="HVDPROF_THREADS_DEFAULT='often' is malformed"):
        default_threads({"HVDPROF_THREADS_DEFAULT": "often"}, 2)
