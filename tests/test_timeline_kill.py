"""A rank killed with SIGKILL keeps its timeline: every op it completed at least 50 ms
before the kill is in its file, which loads in our reader and, as a JSON array prefix,
in Perfetto and chrome://tracing.

Real ranks through ``hvdprof run`` (``workers/timeline_kill_worker.py``): rank 1 runs
blocking allreduces, each under a name of its own, writes when each one returned to a side
file (unbuffered), and SIGKILLs itself after a few dozen ops, right after the first op,
or right after ``init()``. The renderer process of the killed rank outlives it to write
what the rank handed over; the test waits (bounded) for it to exit, then counts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import JobResult, run_job

from hvdprof.common import activities as act
from hvdprof.timeline import load_trace, load_traces

pytestmark = pytest.mark.timeout(200)

WORKER = "timeline_kill_worker.py"
#: the goal: every op that completed at least this long before the kill is in the file
MARGIN_NS = 50_000_000
KILLED = 1


def wait_gone(pid: int, timeout_s: float = 60.0) -> None:
    """Wait for a process we are not the parent of (an orphan, reaped by init)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    return
        except FileNotFoundError:
            return
        time.sleep(0.02)
    pytest.fail(f"the renderer process {pid} outlived its killed rank by {timeout_s:g} s")


def kill_job(tmp_path: Path, ops: int, *extra: str) -> tuple[JobResult, Path]:
    directory = tmp_path / "tl"
    result = run_job(
        WORKER, 2, str(ops), *extra, env={"HVDPROF_TIMELINE": str(directory)}, timeout=90
    )
    assert result.returncode == 128 + 9, result.describe()  # the killed rank's code
    assert "SIGKILL" in "\n".join(result.launcher), result.describe()
    manifest = json.loads((directory / f"manifest.rank.{KILLED}.json").read_text())
    assert manifest["renderer_pid"], manifest
    wait_gone(manifest["renderer_pid"])
    return result, directory


def side_file(directory: Path) -> tuple[dict[int, int], int]:
    """Rank 1's ops: ``{k: t_done_ns}``, and the time of the kill."""
    done: dict[int, int] = {}
    kill = None
    for line in (directory / f"done.rank.{KILLED}.txt").read_text().splitlines():
        key, t = line.split()
        if key == "kill":
            kill = int(t)
        else:
            done[int(key)] = int(t)
    assert kill is not None, "the worker notes the kill before sending it"
    return done, kill


def load_killed(directory: Path) -> list[dict[str, Any]]:
    """The killed rank's file: a JSON array prefix, read by Perfetto's rules and ours."""
    path = directory / f"rank.{KILLED}.json"
    raw = path.read_text(encoding="utf-8")
    assert raw.startswith("[\n") and raw.endswith(",\n"), raw[-200:]
    # what Perfetto and chrome://tracing accept: the array without its closing bracket
    events = json.loads(raw[: -len(",\n")] + "]")
    trace = load_trace(str(path))
    assert not trace.complete and trace.skipped == [], trace.skipped
    assert trace.events == events
    manifest = json.loads((directory / f"manifest.rank.{KILLED}.json").read_text())
    assert manifest["closed"] is False
    assert manifest["events_written"] == len(events), "the renderer's own count"
    names = {e["name"] for e in events if e["ph"] == "M"}
    assert {"process_name", "thread_name"} <= names, names
    problems = " | ".join(load_traces(str(directory)).problems)
    assert f"rank {KILLED}" in problems and "closing ']'" in problems, problems
    return events


def ops_in(events: list[dict[str, Any]]) -> set[int]:
    """The ``k`` of every ``kill.op.<k>`` drawn with its negotiation and its op slice."""
    seen: dict[str, set[str]] = {}
    for e in events:
        if e["ph"] == "X" and "tensor" in e.get("args", {}):
            seen.setdefault(e["args"]["tensor"], set()).add(e["name"])
    whole = {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"}
    return {int(n.rsplit(".", 1)[1]) for n, kinds in seen.items() if whole <= kinds}


def assert_old_ops_kept(directory: Path, at_least: int) -> set[int]:
    events = load_killed(directory)
    done, kill = side_file(directory)
    old = {k for k, t in done.items() if kill - t >= MARGIN_NS}
    assert len(old) >= at_least, (len(old), done, kill)
    kept = ops_in(events)
    missing = sorted(old - kept)
    assert not missing, (
        f"ops completed >= 50 ms before the kill but not in the file: {missing}"
        f" (kept {len(kept)} of {len(done)} completed)"
    )
    assert kept <= set(done) | {max(done, default=-1) + 1}, "no op the rank never ran"
    return kept


def test_killed_after_a_few_dozen_ops_keeps_them(tmp_path: Path) -> None:
    # 50 ops, with a 60 ms pause after the 20th so that at least 21 are surely old enough
    _, directory = kill_job(tmp_path, 50, "--pause-after", "20", "--pause-ms", "60")
    kept = assert_old_ops_kept(directory, at_least=21)
    assert len(kept) >= 21
    # the survivor, stopped by the launcher, is readable too
    survivor = load_trace(str(directory / "rank.0.json"))
    assert len(ops_in(survivor.events)) >= 21 and len(survivor.skipped) <= 1


def test_killed_right_after_init_leaves_a_loadable_file(tmp_path: Path) -> None:
    _, directory = kill_job(tmp_path, 0)
    events = load_killed(directory)
    assert ops_in(events) == set()
    label = act.process_name(KILLED, "")[: -len("()")]
    assert any(
        e["name"] == "process_name" and e["args"]["name"].startswith(label) for e in events
    ), events[:4]


@pytest.mark.parametrize("pause_ms", [0, 60])
def test_killed_right_after_the_first_op(tmp_path: Path, pause_ms: int) -> None:
    _, directory = kill_job(tmp_path, 1, "--pause-after", "0", "--pause-ms", str(pause_ms))
    kept = assert_old_ops_kept(directory, at_least=1 if pause_ms else 0)
    if pause_ms:
        assert kept == {0}
