"""Every error path of the runtime and of ``hvdprof.torch``, each followed by proof that
the runtime still works.

- In this process (no ranks started): an op before ``init`` and a malformed HVDPROF_*
  variable at ``init``; ``hvdprof run`` with a malformed variable (a clean error).
- ``workers/errors_worker.py`` at 2 and 3 ranks: cross-rank mismatches, duplicate names,
  bad dtypes, non-contiguous in-place tensors, bad alltoall splits, bad roots, ops while
  a rank has joined, ops after shutdown, init again after shutdown. One section each.
- ``workers/stall_worker.py``: the stall inspector's warning, and its abort.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from conftest import REPO, JobResult, child_env, run_job

import hvdprof.torch as hvd
from hvdprof.errors import ConfigError, NotInitializedError

pytestmark = pytest.mark.timeout(300)


# ------------------------------------------------------------------ in this process
@pytest.fixture
def uninitialized(monkeypatch: pytest.MonkeyPatch) -> None:
    """No HVDPROF_* variable from the outside, and no runtime in this process."""
    for key in [k for k in os.environ if k.startswith("HVDPROF_")]:
        monkeypatch.delenv(key)
    assert not hvd.is_initialized(), "a test left a runtime running in the pytest process"


OPS_BEFORE_INIT = {
    "allreduce": lambda: hvd.allreduce(torch.ones(2)),
    "allreduce_": lambda: hvd.allreduce_(torch.ones(2)),
    "allreduce_async": lambda: hvd.allreduce_async(torch.ones(2)),
    "allreduce_async_": lambda: hvd.allreduce_async_(torch.ones(2), op=hvd.Sum),
    "grouped_allreduce": lambda: hvd.grouped_allreduce([torch.ones(2)]),
    "allgather": lambda: hvd.allgather(torch.ones(2)),
    "broadcast": lambda: hvd.broadcast(torch.ones(2), 0),
    "broadcast_async_": lambda: hvd.broadcast_async_(torch.ones(2), 0),
    "alltoall": lambda: hvd.alltoall(torch.ones(2)),
    "reducescatter": lambda: hvd.reducescatter(torch.ones(2)),
    "barrier": hvd.barrier,
    "join": hvd.join,
    "size": hvd.size,
    "rank": hvd.rank,
    "local_rank": hvd.local_rank,
    "cross_size": hvd.cross_size,
    "runtime_stats": hvd.runtime_stats,
    "broadcast_object": lambda: hvd.broadcast_object({"a": 1}),
}


def test_an_unknown_reduction_op_is_named_before_anything_is_submitted(
    uninitialized: None,
) -> None:
    for call in (hvd.allreduce_async_, hvd.allreduce_async):
        with pytest.raises(ValueError, match=r"unknown reduction op 99"):
            call(torch.ones(2), op=99)


@pytest.mark.parametrize("op", list(OPS_BEFORE_INIT))
def test_op_before_init_raises_not_initialized(uninitialized: None, op: str) -> None:
    with pytest.raises(NotInitializedError, match=r"init\(\)") as info:
        OPS_BEFORE_INIT[op]()
    assert isinstance(info.value, ValueError)  # what Horovod raises
    assert "not been initialized" in str(info.value)
    assert not hvd.is_initialized()


BAD_CONFIG = {
    "HVDPROF_FUSION_THRESHOLD": "abc",
    "HVDPROF_CYCLE_TIME": "-1",
    "HVDPROF_CACHE_CAPACITY": "-5",
    "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "0",
    "HVDPROF_STALL_CHECK_TIME_SECONDS": "soon",
    "HVDPROF_MAX_INFLIGHT": "0",
    "HVDPROF_LOG_LEVEL": "loud",
    "HVDPROF_BACKEND": "carrier-pigeon",
}


@pytest.mark.parametrize(("name", "value"), list(BAD_CONFIG.items()))
def test_malformed_variable_is_a_config_error_at_init(
    uninitialized: None, monkeypatch: pytest.MonkeyPatch, name: str, value: str
) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError) as info:
        hvd.init()
    text = str(info.value)
    assert name in text and repr(value) in text, text
    assert "accepts" in text, text  # says what would be valid
    assert isinstance(info.value, ValueError)
    assert not hvd.is_initialized()


@pytest.mark.parametrize(
    ("name", "value"), [("HVDPROF_FUSION_THRESHOLD", "abc"), ("HVDPROF_CYCLE_TIME", "-1")]
)
def test_hvdprof_run_reports_a_malformed_variable_cleanly(name: str, value: str) -> None:
    """One line naming the variable, exit code 2, no traceback, no rank started."""
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "run", "-np", "2", "--", sys.executable, "-c", "1/0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env({name: value}),
        cwd=REPO,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "ZeroDivisionError" not in proc.stderr  # no rank ran
    assert proc.stderr.startswith("hvdprof: error: "), proc.stderr
    assert name in proc.stderr and repr(value) in proc.stderr, proc.stderr


# ------------------------------------------------------------------ across ranks
SECTIONS = {
    "mismatch_shape": "allreduce with different shapes: TensorMismatchError on every rank, "
    "naming the tensor and each rank's shape",
    "mismatch_dtype": "different dtypes, each rank's dtype named",
    "mismatch_op": "different reduce ops (Sum/Max/Min), each rank's op named",
    "mismatch_root_rank": "broadcast / broadcast_ with different root ranks",
    "mismatch_misc": "allreduce vs broadcast, prescale, allgather / alltoall trailing dims, "
    "reducescatter shape",
    "mismatch_cached_name": "a name in the response cache submitted with a new shape: "
    "the stale entry is dropped, the op fails, the name works again afterwards",
    "mismatch_fails_only_that_op": "ops in flight next to the mismatched one complete; "
    "in a grouped op only the mismatched member fails",
    "duplicate_name_in_flight": "a name already in flight: ValueError (every op kind); the "
    "first op completes and the name is reusable",
    "unsupported_dtype": "complex64 and bool on every op: ValueError listing the supported "
    "dtypes; a non-tensor: TypeError",
    "non_contiguous_in_place": "in-place ops on a non-contiguous tensor: ValueError; "
    "out of place it works",
    "bad_alltoall_splits": "wrong length, negative, wrong sum, tensor splits, "
    "no splits with an indivisible first dimension: ValueError",
    "broadcast_root_out_of_range": "root N, -1, N+5 for every broadcast form and "
    "broadcast_parameters: ValueError naming root_rank",
    "bad_arguments": "unknown op, Adasum on integers, empty name, empty group, 0-d reducescatter, "
    "init(comm=...)",
    "join_with_other_ops": "broadcast / allgather while a rank has joined fail (naming join) "
    "but allreduce works; every rank gets the same join() result",
    "grouped_validation_is_atomic": "a grouped op with one invalid member submits nothing "
    "(the valid members are not reduced later behind the user's back)",
    "after_shutdown": "every op after shutdown(): NotInitializedError",
    "init_after_shutdown": "init() again after shutdown() works, as in Horovod",
}


@pytest.fixture(scope="module", params=[2, 3], ids=["2ranks", "3ranks"])
def errors_job(request: pytest.FixtureRequest) -> tuple[int, JobResult]:
    num_proc = request.param
    env = {"HVDPROF_START_TIMEOUT_SECONDS": "30", "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "30"}
    return num_proc, run_job("errors_worker.py", num_proc, env=env, timeout=180)


@pytest.mark.parametrize("section", list(SECTIONS))
def test_errors(errors_job: tuple[int, JobResult], section: str) -> None:
    num_proc, result = errors_job
    result.assert_section(section, num_proc)


def test_errors_job_completes(errors_job: tuple[int, JobResult]) -> None:
    num_proc, result = errors_job
    result.assert_done(num_proc)


# ------------------------------------------------------------------ the stall inspector
@pytest.mark.parametrize(
    ("num_proc", "late"), [(2, 1), (3, 0)], ids=["2ranks-rank1-late", "3ranks-rank0-late"]
)
def test_stall_warning_names_the_late_rank_and_tensor_then_the_job_goes_on(
    num_proc: int, late: int
) -> None:
    """Rank 0 warns on stderr, also when it is the late rank itself."""
    result = run_job(
        "stall_worker.py",
        num_proc,
        "warn",
        str(late),
        env={"HVDPROF_STALL_CHECK_TIME_SECONDS": "2"},
    )
    for section in ("stall_new_name", "stall_cached_name", "after_stall"):
        result.assert_section(section, num_proc)
    result.assert_done(num_proc)
    log = result.text(0, "stderr")
    warnings = [line for line in result.lines(0, "stderr") if "stall" in line]
    for name in ("stall.fresh", "stall.cached"):  # the coordinator's path and the cache's
        late_rank = f"rank {late} has not submitted {name!r}"
        assert any(late_rank in w for w in warnings), (
            f"no stall warning saying {late_rank!r} on rank 0's stderr:\n{log}"
        )
    assert "Traceback" not in result.output, result.describe()


def test_stall_shutdown_aborts_every_rank_instead_of_hanging() -> None:
    """Under ``hvdprof run`` every rank exits with the stall line (a rank that never
    calls into hvdprof again would otherwise hang), and the launcher exits non-zero."""
    num_proc = 2
    env = {"HVDPROF_STALL_CHECK_TIME_SECONDS": "1", "HVDPROF_STALL_SHUTDOWN_TIME_SECONDS": "3"}
    result = run_job("stall_worker.py", num_proc, "abort", env=env, timeout=120)
    assert result.returncode == 1, result.describe()
    for rank in range(num_proc):
        lines = [x for x in result.lines(rank, "stderr") if "hvdprof stall: aborting" in x]
        assert lines, f"rank {rank}: no stall line\n{result.describe()}"
        assert "HVDPROF_STALL_SHUTDOWN_TIME_SECONDS=3" in lines[0], lines[0]
        assert f"rank {num_proc - 1} has not submitted 'stall.never'" in lines[0], lines[0]
    assert "DONE" not in result.output, result.describe()
