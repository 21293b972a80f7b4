"""A rank that dies or leaves: the others must fail fast and loudly, never hang.

- Ranks started directly (no launcher, which would stop the survivors itself): one is
  SIGKILLed (or SIGSTOPped) mid-run; each survivor must raise HvdprofInternalError
  within the bound set by HVDPROF_COLLECTIVE_TIMEOUT_SECONDS, stay failed, and exit on
  its own.
- Through ``hvdprof run`` at 3 ranks: a SIGKILLed rank stops the job promptly with a
  non-zero exit code.
- ``shutdown()`` on one rank while another has an op pending: HvdprofInternalError there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import conftest
import pytest
from conftest import WORKERS, JobResult, run_job

pytestmark = pytest.mark.timeout(240)

WORKER = str(WORKERS / "failure_worker.py")
SURVIVOR_EXIT = 17  # failure_worker.SURVIVOR_EXIT
COLLECTIVE_TIMEOUT_S = 5.0
#: scheduling slack on top of the configured bound, for a loaded 2-core machine
SLACK_S = 10.0
PROCESS_LIMIT_S = 90.0


def start_ranks(num_proc: int, args: list[str], env: dict[str, str]) -> list[subprocess.Popen]:
    return conftest.start_ranks(WORKER, num_proc, args, env, PROCESS_LIMIT_S)


def collect(
    procs: list[subprocess.Popen], limit: float, frozen: int | None = None
) -> list[tuple[int, str, str]]:
    """(returncode, stdout, stderr) of every rank. The ``frozen`` rank is SIGKILLed once
    the others have exited; whatever still runs at ``limit`` is killed and fails the test."""
    deadline = time.monotonic() + limit
    results: dict[int, tuple[int, str, str]] = {}
    order = [r for r in range(len(procs)) if r != frozen] + ([frozen] if frozen is not None else [])
    try:
        for rank in order:
            proc = procs[rank]
            if rank == frozen:
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            results[rank] = (proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        text = "\n".join(
            f"rank {i}: pid {p.pid} running={p.poll() is None}" for i, p in enumerate(procs)
        )
        pytest.fail(f"ranks still running after {limit:g} s (a hang):\n{text}")
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    return [results[r] for r in range(len(procs))]


@pytest.mark.parametrize(
    ("mode", "victim"),
    [("kill", 2), ("kill", 0), ("freeze", 1)],
    ids=["sigkill-rank2", "sigkill-rank0-coordinator", "sigstop-rank1"],
)
def test_survivors_raise_internal_error_within_the_collective_timeout(
    tmp_path: Path, mode: str, victim: int
) -> None:
    """SIGKILL: the connections drop at once. SIGSTOP: the rank is alive but silent, so
    only the collective timeout can end the wait."""
    num_proc = 3
    stamp = tmp_path / "stopped_at"
    procs = start_ranks(
        num_proc,
        [mode, str(victim), str(stamp)],
        {"HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": str(COLLECTIVE_TIMEOUT_S)},
    )
    results = collect(procs, PROCESS_LIMIT_S, frozen=victim if mode == "freeze" else None)
    report = "\n".join(
        f"--- rank {r}: exit {code}\nstdout:\n{out}\nstderr:\n{err[-3000:]}"
        for r, (code, out, err) in enumerate(results)
    )
    assert results[victim][0] == -signal.SIGKILL, report
    assert stamp.exists(), report
    stopped_at = float(stamp.read_text())
    for rank, (code, out, _err) in enumerate(results):
        if rank == victim:
            continue
        assert code == SURVIVOR_EXIT, f"rank {rank} did not raise HvdprofInternalError\n{report}"
        raised = [line for line in out.splitlines() if line.startswith("RAISED ")]
        assert len(raised) == 1, report
        _, when, kind, *_message = raised[0].split(" ")
        took = float(when) - stopped_at
        assert kind == "HvdprofInternalError:", report
        print(f"rank {rank} raised HvdprofInternalError {took:.2f} s after the {mode}")
        assert took <= COLLECTIVE_TIMEOUT_S + SLACK_S, (
            f"rank {rank} raised {took:.1f} s after the {mode}, beyond the bound "
            f"HVDPROF_COLLECTIVE_TIMEOUT_SECONDS={COLLECTIVE_TIMEOUT_S:g} (+{SLACK_S:g} s)\n{report}"
        )
        assert "STILL_FAILED" in out, report  # later ops raise at once
        assert "SHUTDOWN_RETURNED" in out, report


def test_launcher_stops_the_job_promptly_when_a_rank_is_sigkilled(tmp_path: Path) -> None:
    num_proc = 3
    stamp = tmp_path / "killed_at"
    timeout = 120.0
    result = run_job("failure_worker.py", num_proc, "kill", "1", str(stamp), timeout=timeout)
    finished = time.time()
    assert result.returncode not in (0, 124), result.describe()
    # the killed rank (128 + SIGKILL), or a survivor that noticed first
    assert result.returncode in (128 + signal.SIGKILL, SURVIVOR_EXIT), result.describe()
    assert stamp.exists(), result.describe()
    took = finished - float(stamp.read_text())
    # default HVDPROF_COLLECTIVE_TIMEOUT_SECONDS (60 s) is not what ends the job: the launcher is
    assert took < 30.0, f"the job ended {took:.1f} s after the kill\n{result.describe()}"
    assert any("rank" in line and "exited with" in line for line in result.launcher), (
        result.describe()
    )


@pytest.fixture(scope="module")
def shutdown_job() -> JobResult:
    return run_job("failure_worker.py", 2, "shutdown", timeout=120)


def test_shutdown_on_one_rank_fails_the_pending_op_on_the_others(shutdown_job: JobResult) -> None:
    """Rank 0 shuts down; rank 1's pending op raises HvdprofInternalError naming rank 0,
    its next op raises at once, and its own shutdown() returns."""
    shutdown_job.assert_section("shutdown_while_pending", 2)


def test_every_rank_exits_cleanly_after_a_shutdown_with_ops_pending(
    shutdown_job: JobResult,
) -> None:
    """No crash at interpreter exit (e.g. a C++ thread still running: SIGABRT)."""
    assert "terminate called" not in shutdown_job.output, shutdown_job.describe()
    shutdown_job.assert_done(2)
