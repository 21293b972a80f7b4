"""``init()`` after ``shutdown()``: a loop of 50 init/op/shutdown cycles, real processes.

Horovod's own tests call ``hvd.barrier(); hvd.shutdown()`` after every test and
``hvd.init()`` before the next. A rank must never connect to a previous incarnation's
address (the bug: rank 1's tenth ``init()`` failed with "Connection refused"), so each
``init()`` meets the others under its own key prefix in a store that outlives
``shutdown()`` (``hvdprof/runtime/runtime.py``). The worker makes rank 0 linger before
every other shutdown so that the other ranks always race ahead into their next ``init()``.
"""

from __future__ import annotations

import pytest
from conftest import run_job

CYCLES = 50


@pytest.mark.parametrize("num_proc", [2, 3])
def test_fifty_init_op_shutdown_cycles(num_proc: int) -> None:
    result = run_job("reinit_worker.py", num_proc, str(CYCLES), timeout=240)
    result.assert_section("reinit_loop", num_proc)
    result.assert_done(num_proc)
    for rank in range(num_proc):
        assert result.values(rank, "CYCLES_COMPLETED") == [str(CYCLES)], result.describe()


def test_each_incarnation_keeps_its_own_timeline(tmp_path) -> None:
    """Three init()/shutdown() rounds with the timeline on: the first records into DIR,
    the second and third into DIR/incarnation.2 and .3, each with its own allreduce, and
    ``analyze DIR`` names the later ones."""
    from hvdprof.analysis import analyze, load_run

    timeline = tmp_path / "tl"
    result = run_job(
        "reinit_worker.py", 2, "3", timeout=180, launcher_args=("--timeline", str(timeline))
    )
    result.assert_section("reinit_loop", 2)
    for directory in (timeline, timeline / "incarnation.2", timeline / "incarnation.3"):
        run = load_run(str(directory))
        assert sorted(run.ranks) == [0, 1], directory
        sums = [i for i, t in enumerate(run.tensors) if t == "reinit.sum"]
        ops = int(sum((run.slices.tensor == i).sum() for i in sums))
        assert ops > 0, (directory, run.tensors)
    assert not (timeline / "incarnation.1").exists()
    verdicts = analyze(load_run(str(timeline))).verdicts
    assert any("first of 3 runtimes" in v and "incarnation.2, incarnation.3" in v for v in verdicts)


def test_init_after_a_peer_exited_is_a_no_op(tmp_path) -> None:
    """Rank 1 finishes and exits; rank 0's next init() returns the runtime that ended
    (its ops raise the clear error) instead of starting a rendezvous that waits for rank 1
    until the start timeout (here 600 s: longer than this test may take)."""
    result = run_job(
        "peer_exit_worker.py", 2, str(tmp_path / "marker"), timeout=120,
        env={"HVDPROF_START_TIMEOUT_SECONDS": "600"},
    )  # fmt: skip
    result.assert_section("peer_exit", 2)
    result.assert_done(2)
