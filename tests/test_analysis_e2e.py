"""``hvdprof analyze`` on real runs: a 3-rank job with a sleeping rank, and a 2-rank job
with the timeline and autotune on."""

from __future__ import annotations

import json
import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, child_env, run_job

from hvdprof.analysis import (
    analyze,
    autotune_report,
    find_stragglers,
    load_run,
    overlap_report,
)
from hvdprof.autotune.log import PHASE_DECISION, read_autotune_log
from hvdprof.timeline.merge import kineto_shift_us
from hvdprof.trace.chrome_json import load_trace


def hvdprof_cli(*args: str, timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(),
        cwd=REPO,
    )


@pytest.fixture(scope="module")
def straggler_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tl = tmp_path_factory.mktemp("straggler") / "tl"
    job = run_job(
        "analysis_worker.py",
        3,
        "--steps",
        "25",
        "--sleep-rank",
        "2",
        "--sleep-ms",
        "40",
        launcher_args=("--timeline", str(tl)),
    )
    job.assert_section("run", 3)
    job.assert_done(3)
    return tl


def test_sleeping_rank_is_named_by_analyze(straggler_run: Path) -> None:
    proc = hvdprof_cli("analyze", str(straggler_run))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    verdicts = proc.stdout.split("Verdicts", 1)[1]
    first = verdicts.strip().splitlines()[0]
    assert "rank 2 is the straggler" in first, proc.stdout


def test_sleeping_rank_cost_is_about_its_sleep(straggler_run: Path) -> None:
    proc = hvdprof_cli("analyze", "--json", str(straggler_run))
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    s = report["stragglers"]
    assert s["straggler"] == 2
    top = s["ranks"][0]
    assert top["rank"] == 2 and top["last_share"] > 0.8
    # rank 2 sleeps 40 ms before each step; the others wait for it (minus their own
    # submission work, plus cycle latency): well above 20 ms and not above 2 x 40 ms
    assert 20.0 < top["cost_per_step_ms"] < 80.0, top
    assert report["verdicts"][0].startswith("rank 2 is the straggler")


@pytest.fixture(scope="module")
def autotune_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("autotune")
    tl, log = base / "tl", base / "autotune.csv"
    job = run_job(
        "analysis_worker.py",
        2,
        "--steps",
        "80",
        env={
            "HVDPROF_AUTOTUNE_WARMUP_SAMPLES": "1",
            "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE": "3",
        },
        launcher_args=("--timeline", str(tl), "--autotune", "--autotune-log", str(log)),
    )
    job.assert_section("run", 2)
    job.assert_done(2)
    return tl, log


def test_autotune_samples_and_windows_listed(autotune_run: tuple[Path, Path]) -> None:
    tl, log = autotune_run
    every_row = read_autotune_log(log)
    # a decision row ends a round (what --autotune-from reads back); it is no window
    rows = [r for r in every_row if r.phase != PHASE_DECISION]
    assert len(rows) >= 2, "the job scored too few samples to test with"
    run = load_run(tl, cache=False)
    report = autotune_report(run)
    # the timeline recorded the whole job, and the runtime closes the tuner (which hands
    # its last samples over) before the timeline: the same windows as the log, in order
    assert len(report.samples) == len(rows), [r.phase for r in every_row]
    for sample, row in zip(report.samples, rows, strict=True):
        assert sample.fusion_threshold_bytes == row.params.fusion_threshold_bytes
        assert sample.cycle_time_ms == pytest.approx(row.params.cycle_time_ms)
        assert sample.cache_enabled == row.params.cache_enabled
        assert (sample.first_step, sample.last_step) == (row.first_step, row.last_step)
        assert (sample.phase, sample.role, sample.is_best) == (row.phase, row.role, row.is_best)
        assert sample.score_mb_per_s == pytest.approx(row.score_bytes_per_s / 1e6, rel=1e-5)
        assert run.t0_us <= sample.t0_us < sample.t1_us <= run.t1_us + 1.0
    # a round ended in the log exactly when it did on the timeline
    assert bool(report.decision) == any(r.phase == PHASE_DECISION for r in every_row)
    # windows follow each other
    for a, b in zip(report.samples, report.samples[1:], strict=False):
        assert a.t1_us <= b.t0_us
    best = max(rows, key=lambda r: r.score_bytes_per_s)
    assert report.samples[report.best].score_mb_per_s == pytest.approx(
        best.score_bytes_per_s / 1e6, rel=1e-5
    )
    marked = [i for i, r in enumerate(rows) if r.is_best]
    assert marked, "the tuner marks its starting configuration as best at least"
    if report.recommendation:
        # the tuner's own recommendation as the timeline recorded it at the last sample
        # (it may have changed after its configuration's last window, so that no log row
        # of it is marked best yet): a window that ran exactly those parameters
        rec = rows[report.recommended].params
        want = report.recommendation
        assert rec.fusion_threshold_bytes == want["fusion_threshold_bytes"]
        assert rec.cycle_time_ms == pytest.approx(want["cycle_time_ms"])
        assert rec.cache_enabled == want["cache_enabled"]
    else:  # no decisions recorded: the log's last row marked is_best (a warm start's)
        assert report.recommended == marked[-1]
        rec = rows[marked[-1]].params
    if report.decision:  # the tuner ended a round within the recording: its own line
        line = report.decision.removeprefix("hvdprof autotune: ").rstrip(".")
        assert report.verdict == f"Autotune ({len(report.samples)} samples): {line}."
    else:  # still tuning: the configuration it runs now
        assert f"fusion threshold {rec.fusion_threshold_bytes / 1048576:.3g} MiB" in report.verdict
        assert f"cycle time {rec.cycle_time_ms:.3g} ms" in report.verdict


def test_autotune_table_in_cli(autotune_run: tuple[Path, Path]) -> None:
    tl, _ = autotune_run
    proc = hvdprof_cli("analyze", str(tl))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Autotune samples" in proc.stdout
    report = autotune_report(load_run(tl, cache=False))
    samples = report.samples
    # the verdict, with the sample count: "Autotune scored N samples ..." while tuning,
    # "Autotune (N samples): <the tuner's line>" once a round ended in the recording
    # (rich wraps the verdicts to the terminal; a wrapped line ends in a space)
    assert report.verdict and f"{len(samples)} samples" in report.verdict
    assert " ".join(report.verdict.split()) in " ".join(proc.stdout.split())
    # one table row per sample: its index, then its threshold
    for sample in samples:
        assert re.search(rf"│\s+\*?{sample.index}\s+│", proc.stdout), sample
    # the tuner's recommendation is starred, once, with the legend under the table
    starred = re.findall(r"│\s+\*(\d+)\s+│", proc.stdout)
    assert starred == [str(report.recommended)], starred
    assert "*: the tuner's recommendation" in proc.stdout


def test_real_run_report_is_json_safe(autotune_run: tuple[Path, Path]) -> None:
    tl, _ = autotune_run
    report = analyze(load_run(tl, cache=False))
    text = json.dumps(report.to_dict(), allow_nan=False)
    assert json.loads(text)["run"]["ranks"] == [0, 1]
    assert find_stragglers(load_run(tl)).ops_with_marks > 0


def test_refresh_follows_a_file_as_it_is_written(straggler_run: Path, tmp_path: Path) -> None:
    """Replay a real run's files as a writer would grow them (cut anywhere, mid-line
    included), refreshing after each piece: the result is a fresh read of the whole.

    (A live job is not used: its renderer runs at idle priority, so on a busy machine it
    writes most of the file after the ranks are done, and the test would prove nothing.)
    """
    live = tmp_path / "live"
    live.mkdir()
    for manifest in straggler_run.glob("manifest.rank.*.json"):
        (live / manifest.name).write_bytes(manifest.read_bytes())
    data = {f.name: f.read_bytes() for f in straggler_run.glob("rank.*.json")}
    for name in data:
        (live / name).write_bytes(b"")
    run = load_run(live, cache=False)
    rng = random.Random(7)
    written = dict.fromkeys(data, 0)
    changes = 0
    while any(written[n] < len(d) for n, d in data.items()):
        for name, whole in data.items():
            step = rng.randrange(1, 60_000)
            new = min(len(whole), written[name] + step)
            with open(live / name, "ab") as f:
                f.write(whole[written[name] : new])
            written[name] = new
        changes += run.refresh()
        assert not run.clean or all(written[n] == len(d) for n, d in data.items())
    final = load_run(straggler_run, cache=False)
    assert changes > 5
    assert run.clean and run.complete == {0: True, 1: True, 2: True}
    assert len(run.slices) == len(final.slices) and len(run.marks) == len(final.marks)
    for col in ("start_us", "dur_us", "bytes", "group", "occurrence", "rank"):
        assert np.array_equal(
            np.sort(getattr(run.slices, col)), np.sort(getattr(final.slices, col))
        )
    assert find_stragglers(run).straggler == find_stragglers(final).straggler == 2


def test_overlap_with_a_real_profiler_trace(tmp_path: Path) -> None:
    """torch.profiler traces of a real 2-rank run line up with its timeline: both ranks get
    an overlap share, and nothing is reported as unreadable or unaligned."""
    tl, prof = tmp_path / "tl", tmp_path / "prof"
    job = run_job(
        "analysis_profiler_worker.py", 2, str(prof), "--steps", "8",
        launcher_args=("--timeline", str(tl)),
    )  # fmt: skip
    job.assert_section("train", 2)
    job.assert_done(2)
    traces = sorted(str(p) for p in prof.glob("kineto.rank*.json"))
    assert len(traces) == 2
    run = load_run(tl, cache=False)
    report = overlap_report(run, traces)
    assert not report.problems, report.problems
    assert [r.rank for r in report.ranks] == [0, 1]
    for r in report.ranks:
        assert r.comm_ms > 0 and r.compute_ms > 0
        assert 0.0 <= r.overlap_ms <= min(r.comm_ms, r.compute_ms) + 1e-6
    for rank, path in enumerate(traces):  # aligned, the profiled backward ops lie in the run
        trace = load_trace(path)
        shift = kineto_shift_us(trace, run.manifests[rank])
        ts = [e["ts"] + shift for e in trace.events if "Backward" in str(e.get("name"))]
        assert ts and run.t0_us <= min(ts) and max(ts) <= run.t1_us
    proc = hvdprof_cli("analyze", str(tl), "--kineto", *traces, "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert [r["rank"] for r in data["overlap"]["ranks"]] == [0, 1]
    assert "overlaps backward compute" in data["overlap"]["verdict"]
