"""The runtime's correctness, error and training tests on the other engines and launchers.

The same workers as ``test_torch_ops``, ``test_errors`` and ``test_training`` (which run
them under ``hvdprof run`` on shared memory and on Gloo), here under ``mpirun -np 2`` and
``-np 3`` with ``HVDPROF_BACKEND=mpi`` (every collective and the control traffic over
MPI), and under ``torchrun --nproc_per_node 2``. Then the MPI backend's clear errors:
an MPI without the thread support the runtime needs, a world size that differs between
the launcher and MPI, ``HVDPROF_BACKEND=mpi`` without mpi4py.

Without mpi4py and an mpirun these skip with the reason, except under ``CI=true``, where
``.ci/setup`` installs them and they fail instead.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, JobResult, child_env
from launch_support import (
    ROOT_OK,
    child_env_mpi,
    mpi_or_skip,
    mpirun_prefix,
    run_command,
    run_mpi,
    run_torchrun,
)
from test_errors import SECTIONS as ERROR_SECTIONS
from test_torch_ops import SECTIONS as OPS_SECTIONS
from test_training import SECTIONS as TRAINING_SECTIONS

pytestmark = pytest.mark.timeout(600)

MPI = {"HVDPROF_BACKEND": "mpi"}
#: engine id -> (runner, ranks, environment)
ENGINES: dict[str, tuple[Callable[..., JobResult], int, dict[str, str]]] = {
    "mpirun2-mpi": (run_mpi, 2, MPI),
    "mpirun3-mpi": (run_mpi, 3, MPI),
    "torchrun2": (run_torchrun, 2, {}),
}


def _needs(engine: str) -> None:
    if ENGINES[engine][0] is run_mpi:
        mpi_or_skip()


# ------------------------------------------------------------------ every op, every dtype
@pytest.fixture(scope="module", params=list(ENGINES))
def ops_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    _needs(request.param)
    runner, num_proc, env = ENGINES[request.param]
    shared: Path = tmp_path_factory.mktemp(f"ops-{request.param}")
    return num_proc, runner("ops_worker.py", num_proc, str(shared), env=env, timeout=300)


@pytest.mark.parametrize("section", list(OPS_SECTIONS))
def test_ops(ops_job: tuple[int, JobResult], section: str) -> None:
    num_proc, result = ops_job
    result.assert_section(section, num_proc)


def test_ops_job_completes(ops_job: tuple[int, JobResult]) -> None:
    num_proc, result = ops_job
    result.assert_done(num_proc)


# ------------------------------------------------------------------ errors across ranks
@pytest.fixture(scope="module", params=list(ENGINES))
def errors_job(request: pytest.FixtureRequest):
    _needs(request.param)
    runner, num_proc, env = ENGINES[request.param]
    env = {**env, "HVDPROF_START_TIMEOUT_SECONDS": "30", "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "30"}
    return num_proc, runner("errors_worker.py", num_proc, env=env, timeout=300)


@pytest.mark.parametrize("section", list(ERROR_SECTIONS))
def test_errors(errors_job: tuple[int, JobResult], section: str) -> None:
    num_proc, result = errors_job
    result.assert_section(section, num_proc)


def test_errors_job_completes(errors_job: tuple[int, JobResult]) -> None:
    num_proc, result = errors_job
    result.assert_done(num_proc)


# ------------------------------------------------------------------ training equivalence
@pytest.fixture(scope="module")
def train_job() -> JobResult:
    mpi_or_skip()
    return run_mpi("train_worker.py", 2, env=MPI, timeout=300)


@pytest.mark.parametrize("section", list(TRAINING_SECTIONS))
def test_training_under_mpirun(train_job: JobResult, section: str) -> None:
    """Each optimizer's steps match a single process training on the whole batch."""
    train_job.assert_section(section, 2)


# ------------------------------------------------------------------ clear errors
def _init_once(env: dict[str, str], pythonpath: str | None = None) -> subprocess.CompletedProcess:
    full = child_env(env)
    full.update(ROOT_OK)
    if pythonpath:
        full["PYTHONPATH"] = pythonpath
    code = "import hvdprof.torch as hvd; hvd.init(); print('initialized', hvd.size())"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=90, env=full,
        cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def test_world_size_that_differs_from_mpis_is_named() -> None:
    """The launcher's variables say 2 ranks; MPI (a singleton here) says 1."""
    mpi_or_skip()
    proc = _init_once({"PMI_RANK": "0", "PMI_SIZE": "2", **MPI})
    assert proc.returncode != 0, proc.stdout
    assert "says rank 0 of 2, but MPI_COMM_WORLD says rank 0 of 1" in proc.stderr, proc.stderr


def test_mpi_without_thread_support_is_named() -> None:
    """mpi4py asked for MPI_THREAD_FUNNELED (MPI4PY_RC_THREAD_LEVEL): the runtime's
    background thread may not call MPI then."""
    mpi_or_skip()
    proc = _init_once({"MPI4PY_RC_THREAD_LEVEL": "funneled", **MPI})
    assert proc.returncode != 0, proc.stdout
    assert "MPI provides MPI_THREAD_FUNNELED" in proc.stderr, proc.stderr
    assert "MPI_THREAD_SERIALIZED" in proc.stderr


def test_mpi_backend_without_mpi4py_says_how_to_install(tmp_path: Path) -> None:
    """An mpi4py that cannot be imported (as when it is absent, or built for another MPI)."""
    fake = tmp_path / "mpi4py"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('libmpi.so.40: cannot open')\n")
    proc = _init_once(MPI, pythonpath=str(tmp_path))
    assert proc.returncode != 0, proc.stdout
    assert "HVDPROF_BACKEND=mpi, or auto under mpirun) needs mpi4py and an MPI library" in (
        proc.stderr
    ), proc.stderr
    assert "pip install 'hvdprof[mpi]'" in proc.stderr


def test_single_process_mpi_backend_runs_as_an_mpi_singleton() -> None:
    mpi_or_skip()
    proc = _init_once(MPI)
    assert proc.returncode == 0, proc.stderr
    assert "initialized 1" in proc.stdout


def test_dead_rank_under_mpirun_ends_the_job() -> None:
    """MPI calls block; when a rank dies, mpirun ends every rank (no hang)."""
    mpirun = mpi_or_skip()
    code = (
        "import os, torch, hvdprof.torch as hvd; hvd.init()\n"
        "if hvd.rank() == 1: os._exit(3)\n"
        "hvd.allreduce(torch.ones(10), name='x'); print('unreachable', flush=True)\n"
    )
    result = run_command(
        [*mpirun_prefix(2, mpirun), sys.executable, "-c", code], child_env_mpi(MPI, 120), 120
    )
    assert result.returncode != 0, result.describe()
    assert "unreachable" not in result.output


@pytest.mark.parametrize("failing", [0, 2])
def test_a_rank_failing_alone_in_a_collective_ends_the_job(failing: int) -> None:
    """One rank's backend raises inside an allgatherv while the others wait in MPI (no
    timeout there): that rank says why and aborts the job, rather than leaving it hung.
    Rank 0 (the coordinator) and another rank."""
    started = time.monotonic()
    result = run_mpi("mpi_local_failure_worker.py", 3, str(failing), env=MPI, timeout=120)
    assert result.returncode != 0, result.describe()
    assert time.monotonic() - started < 100, result.describe()
    assert "injected: this rank's allgatherv failed before joining" in result.output
    assert "MPI_Abort" in result.output, result.describe()
    assert not any(line == "OK" for r in range(3) for line in result.lines(r))


def test_benchmark_quick_run_writes_results(tmp_path: Path) -> None:
    """benchmarks/allreduce_mpi.py end to end (quick): every variant verified and timed."""
    mpi_or_skip()
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "allreduce_mpi.py"), "--quick", "--mpi",
         "openmpi", "--output", str(out), "--timeout", "240"],
        capture_output=True, text=True, timeout=280, cwd=REPO, env=child_env(),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    variants = result["results"]["openmpi"]["variants"]
    assert set(variants) == set(result["variants"]), variants
    assert variants["raw_mpi"]["ratio_of_medians"] == 1.0


def test_autotune_under_mpirun_applies_identical_params(tmp_path: Path) -> None:
    """Rank 0's tuner proposes over the MPI control channel; every rank applies the same
    parameters at the same cycles and the sums stay right (autotune_worker's checks)."""
    mpi_or_skip()
    from test_autotune_e2e import FAST_TUNING, assert_same_history

    env = {
        **FAST_TUNING,
        **MPI,
        "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "40",
        "HVDPROF_AUTOTUNE_LOG": str(tmp_path / "autotune.csv"),
    }
    result = run_mpi(
        "autotune_worker.py", 2, str(tmp_path), "--stop", "samples", "--samples", "4",
        "--max-seconds", "120", env=env, timeout=240,
    )  # fmt: skip
    result.assert_section("run", 2)
    result.assert_done(2)
    assert_same_history(result, 2)


def test_small_allreduces_are_named_after_the_mpi_control_channel(tmp_path: Path) -> None:
    """Under mpirun the control channel is MPI: a small allreduce that went over it is
    ``MPI_CONTROL_ALLREDUCE`` on the timeline (it said ``TCP_ALLREDUCE``), and the analysis
    counts it as the collective it is."""
    from hvdprof.analysis import load_run
    from hvdprof.trace.model import PHASE_COLLECTIVE

    mpi_or_skip()
    timeline = tmp_path / "tl"
    result = run_mpi("divergence_worker.py", 2, "0", env={"HVDPROF_TIMELINE": str(timeline)})
    result.assert_done(2)
    run = load_run(str(timeline))
    names = set(run.names)
    assert "MPI_CONTROL_ALLREDUCE" in names, sorted(names)
    assert "TCP_ALLREDUCE" not in names, sorted(names)
    code = run.names.index("MPI_CONTROL_ALLREDUCE")
    phases = set(run.slices.phase[run.slices.name == code].tolist())
    assert phases == {PHASE_COLLECTIVE}, phases
