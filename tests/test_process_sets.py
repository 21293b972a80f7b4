"""Process sets (issue 37): real ranks on Gloo and MPI, the timeline's set per op, and
each set's straggler judged among its members alone."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, JobResult, run_job
from launch_support import run_mpi

from hvdprof.runtime.negotiation import Coordinator, RequestMeta, ResponseCache
from hvdprof.runtime.process_sets import ProcessSetError, ProcessSetTable, normalize_ranks
from hvdprof.runtime.requests import OpType, ReduceOp, Signature


def _ok(result: JobResult, ranks: int) -> None:
    assert result.returncode == 0, result.describe()
    for r in range(ranks):
        assert any(line.startswith("OK") for line in result.lines(r)), result.describe()


# ------------------------------------------------------------------ no processes
def test_table_ids_are_never_reused_and_duplicates_are_refused() -> None:
    table = ProcessSetTable(4)
    a = table.add((0, 2))
    b = table.add((1, 3))
    assert (a, b) == (1, 2) and table.members(0) == (0, 1, 2, 3)
    with pytest.raises(ProcessSetError, match="already exists"):
        table.add((0, 2))
    assert table.remove(a) and not table.remove(a) and not table.remove(0)
    assert table.add((0, 2)) == 3  # a new id: an op for the removed set cannot run here
    with pytest.raises(ProcessSetError, match="outside this job"):
        normalize_ranks([0, 5], 4)
    with pytest.raises(ProcessSetError, match="empty"):
        normalize_ranks([], 4)


def _sig(set_id: int) -> Signature:
    return Signature(
        OpType.ALLREDUCE, "torch.float32", (4,), ReduceOp.SUM, -1, 1.0, 1.0, "cpu", set_id
    )


def test_coordinator_waits_for_the_members_only_and_keys_names_per_set() -> None:
    table = ProcessSetTable(4)
    s1, s2 = table.add((0, 1)), table.add((2, 3))
    coord = Coordinator(4, table)
    cache = ResponseCache(16)
    # the same name in two sets: two ops, each ready when its own members submitted it
    reply = coord.handle(
        0,
        [(0, [RequestMeta("g", _sig(s1))]), (2, [RequestMeta("g", _sig(s2))])],
        frozenset(),
        cache,
        True,
        0.0,
    )
    assert reply.responses == []
    reply = coord.handle(1, [(1, [RequestMeta("g", _sig(s1))])], frozenset(), cache, True, 0.0)
    assert [(r.name, r.signature.process_set, r.error) for r in reply.responses] == [
        ("g", s1, None)
    ]
    assert not reply.responses[0].cacheable  # a set's op never takes the cache's fast path
    # the stall inspector's view: rank 2 submitted set 2's "g" and rank 3 has not; ranks
    # 0 and 1 are outside set 2 and never named as late for it
    ready, _ = coord.pending()["g (process set 2)"]
    assert ready == frozenset({0, 1, 2})
    # a set removed while one member waited: the op fails with a word on the set
    table.remove(s2)
    reply = coord.handle(2, [], frozenset(), cache, True, 0.0)
    assert "has been removed" in (reply.responses[0].error or "")


# ------------------------------------------------------------------ real ranks
@pytest.mark.parametrize("ranks", [2, 4])
def test_every_collective_within_sets_on_gloo(ranks: int) -> None:
    _ok(run_job("process_sets_worker.py", ranks, "ops", timeout=240), ranks)


def test_sets_from_init_and_the_dynamic_rule() -> None:
    _ok(run_job("process_sets_worker.py", 4, "static", timeout=180), 4)


def test_sets_map_to_mpi_communicators() -> None:
    result = run_mpi(
        "process_sets_worker.py", 4, "ops", env={"HVDPROF_BACKEND": "mpi"}, timeout=240
    )
    _ok(result, 4)


def record_two_set_job(timeline) -> JobResult:  # type: ignore[no-untyped-def]
    """Sets {0, 1} and {2, 3} training apart, rank 3 40 ms late per step from step 5,
    recorded into ``timeline`` (also the browser test's run)."""
    return run_job(
        "process_sets_worker.py",
        4,
        "train",
        "3",
        "40",
        timeout=240,
        launcher_args=("--timeline", str(timeline)),
    )


def test_timeline_and_each_sets_straggler(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Sets {0, 1} and {2, 3}; rank 3 sleeps 40 ms per step from step 5. Each op's events
    carry its set; set 2 names rank 3, set 1 names nobody, and no rank outside set 2 is
    ever its straggler."""
    timeline = tmp_path / "tl"
    _ok(record_two_set_job(timeline), 4)
    for rank, set_id in ((0, 1), (1, 1), (2, 2), (3, 2)):
        text = (timeline / f"rank.{rank}.json").read_text()
        assert f'"process_set":{set_id}' in text
        assert f'"process_set":{3 - set_id}' not in text
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(timeline), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    sets = {s["process_set"]: s for s in report["process_sets"]}
    assert sets[1]["members"] == [0, 1] and sets[2]["members"] == [2, 3]
    assert sets[2]["stragglers"]["straggler"] == 3, sets[2]["stragglers"]["verdict"]
    assert sets[1]["stragglers"]["straggler"] is None, sets[1]["stragglers"]["verdict"]
    assert {x["rank"] for x in sets[2]["stragglers"]["ranks"]} == {2, 3}
    assert any(
        v.startswith("Process set 2 (ranks 2, 3): rank 3 is the straggler")
        for v in report["verdicts"]
    )


def test_a_stall_in_one_set_names_only_its_late_member() -> None:
    result = run_job(
        "process_sets_worker.py",
        4,
        "stall",
        env={"HVDPROF_STALL_CHECK_TIME_SECONDS": "1"},
        timeout=180,
    )
    _ok(result, 4)
    lines = [
        line
        for r in range(4)
        for line in result.lines(r, "stderr")
        if "hvdprof stall:" in line and "(process set 1)" in line
    ]
    assert lines, result.describe()
    for line in lines:
        assert "rank 1 has not submitted 'x (process set 1)'" in line, line
        for outsider in (2, 3):
            assert f"rank {outsider} has not submitted 'x" not in line, line
            assert f"{outsider}] submitted" not in line and f"rank {outsider} submitted" not in line
