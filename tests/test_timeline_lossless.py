"""The timeline keeps every event by default, and says so loudly when it cannot.

The renderer processes are stopped (SIGSTOP) while the ranks record far more than the
pipe and the backlog hold (``HVDPROF_TIMELINE_QUEUE_SIZE=50``). With the default
``HVDPROF_TIMELINE_WHEN_FULL=wait`` the ranks wait for room instead of dropping: the job
stalls until the renderers continue, and the manifests count 0 dropped events. With
``drop`` the job never waits; the drops are said on stderr once when they begin and in
total at the end, and lead ``hvdprof analyze``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, JobResult, child_env, parse_output

from hvdprof.analysis import analyze, load_run

pytestmark = pytest.mark.timeout(300)

OPS = 20_000


def _manifests(timeline: Path, ranks: int, deadline_s: float = 60) -> list[dict]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        try:
            found = [
                json.loads((timeline / f"manifest.rank.{r}.json").read_text()) for r in range(ranks)
            ]
            if all(m.get("renderer_pid") for m in found):
                return found
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    raise AssertionError("the ranks wrote no manifests naming their renderers")


def _progress(timeline: Path, rank: int) -> int:
    try:
        return int((timeline / f"progress.rank.{rank}").read_text() or 0)
    except (OSError, ValueError):
        return 0


def _start(
    timeline: Path,
    go: Path,
    env: dict[str, str],
    *,
    ops: int = OPS,
    ranks: int = 2,
    worker_args: tuple[str, ...] = (),
    queue_size: str | None = "50",
) -> subprocess.Popen:
    """``hvdprof run`` of lossless_worker.py (a 50-event timeline queue unless told)."""
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", str(ranks), "--timeout", "240",
        "--timeline", str(timeline), "--",
        sys.executable, str(REPO / "tests" / "workers" / "lossless_worker.py"), str(ops),
        str(go), *worker_args,
    ]  # fmt: skip
    queue = {} if queue_size is None else {"HVDPROF_TIMELINE_QUEUE_SIZE": queue_size}
    return subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=child_env({**queue, **env}), cwd=REPO, start_new_session=True,
    )  # fmt: skip


def _assert_nothing_lost(result: JobResult, timeline: Path, ops: int) -> Any:
    """No drop said, none counted in either manifest, every op in the trace; the run."""
    out = result.describe()
    assert "dropping" not in out and "dropped" not in out, out
    for m in (json.loads((timeline / f"manifest.rank.{r}.json").read_text()) for r in (0, 1)):
        assert m["events_dropped"] == 0, m
        assert m["closed"], m
    run = load_run(str(timeline))
    names = {run.tensors[t] for t in set(run.slices.tensor.tolist())}
    assert all(f"small.{k}" in names for k in range(ops)), "ops missing from the trace"
    return run


def _finish(proc: subprocess.Popen) -> JobResult:
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
    result = JobResult(proc.returncode, out, 0.0)
    parse_output(out, result)
    return result


def _stop(pids: list[int], sig: int) -> None:
    for pid in pids:
        os.kill(pid, sig)


def test_by_default_a_stopped_renderer_makes_the_job_wait_and_nothing_is_lost(tmp_path):
    timeline, go = tmp_path / "tl", tmp_path / "go"
    # no drop however long the renderers stay stopped here
    proc = _start(timeline, go, {"HVDPROF_TIMELINE_STUCK_SECONDS": "120"})
    renderers: list[int] = []
    try:
        renderers = [m["renderer_pid"] for m in _manifests(timeline, 2)]
        _stop(renderers, signal.SIGSTOP)
        go.touch()
        # wait until the ranks stop making progress: their renderers' pipes are full
        deadline, last, still_since = time.monotonic() + 120, -1, time.monotonic()
        while time.monotonic() < deadline:
            now = _progress(timeline, 0)
            if now != last:
                last, still_since = now, time.monotonic()
            elif now > 0 and time.monotonic() - still_since > 1.5:
                break
            time.sleep(0.05)
        assert 0 < last < OPS, f"rank 0 never waited for its renderer (progress {last})"
    finally:
        _stop(renderers, signal.SIGCONT)
    result = _finish(proc)
    result.assert_done(2)
    _assert_nothing_lost(result, timeline, OPS)


def test_drop_mode_never_waits_and_says_so_during_the_run_and_at_the_end(tmp_path):
    timeline, go = tmp_path / "tl", tmp_path / "go"
    proc = _start(timeline, go, {"HVDPROF_TIMELINE_WHEN_FULL": "drop"})
    renderers: list[int] = []
    try:
        renderers = [m["renderer_pid"] for m in _manifests(timeline, 2)]
        _stop(renderers, signal.SIGSTOP)
        go.touch()
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and _progress(timeline, 0) < OPS:
            time.sleep(0.05)
        assert _progress(timeline, 0) == OPS, "the job waited although told to drop"
    finally:
        _stop(renderers, signal.SIGCONT)
    result = _finish(proc)
    result.assert_done(2)
    manifests = [json.loads((timeline / f"manifest.rank.{r}.json").read_text()) for r in (0, 1)]
    for rank, m in enumerate(manifests):
        err = result.text(rank, "stderr")
        assert m["events_dropped"] > 0, m
        assert err.count("the timeline is dropping events") == 1, err
        total = [line for line in err.splitlines() if "dropped" in line and "in all" in line]
        assert len(total) == 1 and f"dropped {m['events_dropped']} events" in total[0], err
    report = analyze(load_run(str(timeline)))
    first = report.verdicts[0]
    assert first.startswith("The timeline is incomplete:"), report.verdicts
    assert f"{sum(m['events_dropped'] for m in manifests):,} events were dropped" in first
    # said once, by its one owner: the files themselves were read whole
    assert sum("dropped" in v for v in report.verdicts) == 1, report.verdicts
    assert report.problems == [], report.problems
    assert report.run["events_dropped"] == {
        str(r): m["events_dropped"] for r, m in enumerate(manifests)
    }


def test_a_script_that_never_calls_shutdown_loses_nothing_at_exit(tmp_path):
    # The runtime's at-exit shutdown must run before the timeline's at-exit closes: the
    # other way round, the cycles after the close were counted as dropped, each rank said
    # "the timeline dropped N events in all" and analyze led with "The timeline is
    # incomplete" about a run that had lost nothing.
    timeline, go = tmp_path / "tl", tmp_path / "go"
    go.touch()
    ops = 400
    proc = _start(timeline, go, {}, ops=ops, worker_args=("exit",), queue_size=None)
    result = _finish(proc)
    result.assert_done(2)
    run = _assert_nothing_lost(result, timeline, ops)
    assert run.problems == [], run.problems
    assert not analyze(run).verdicts[0].startswith("The timeline is incomplete")


def test_events_per_op_per_rank_do_not_grow_with_the_ranks(tmp_path):
    # A rank writes only its own READY mark (issue 27: at 64 ranks, other ranks' marks
    # were 91% of a file's events). The same job at 2 and 4 ranks, real processes.
    ops = 300
    per_op = {}
    for ranks in (2, 4):
        timeline, go = tmp_path / f"tl{ranks}", tmp_path / f"go{ranks}"
        go.touch()
        proc = _start(timeline, go, {}, ops=ops, ranks=ranks, queue_size=None)
        _finish(proc).assert_done(ranks)
        for rank in range(ranks):
            events = json.loads((timeline / f"rank.{rank}.json").read_text())
            negotiates = [e for e in events if e["name"] == "NEGOTIATE_ALLREDUCE"]
            marks = [e for e in events if e["name"].startswith("READY rank ")]
            assert len(negotiates) >= ops, (ranks, rank, len(negotiates))
            assert {e["name"] for e in marks} == {f"READY rank {rank}"}, (ranks, rank)
            assert len(marks) == len(negotiates), (ranks, rank)
            per_op[ranks, rank] = len(marks) + len(negotiates)
    # a READY mark and a NEGOTIATE slice per op, at 2 ranks as at 4, on every rank
    assert len(set(per_op.values())) == 1, per_op
