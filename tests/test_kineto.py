"""torch.profiler (Kineto) traces as runs (issue 22).

Real CPU DDP (Gloo) jobs recorded here with torchrun and torch.profiler, balanced and
with one slow rank, and two real GPU (NCCL) traces from HTA's test data
(``tests/data/kineto-hta``, MIT) whose GPU numbers HTA gives in the README beside them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO
from launch_support import run_torchrun

from hvdprof.analysis import analyze, diff_runs, find_stragglers, load_run

HTA_DATA = Path(__file__).resolve().parent / "data" / "kineto-hta"
#: HTA 0.5.0's numbers on the two files (tests/data/kineto-hta/README.md), in percent:
#: idle, compute, non-compute (get_temporal_breakdown), overlap (get_comm_comp_overlap)
HTA_STORED = {0: (53.56, 17.71, 28.74, 11.81), 1: (54.72, 22.57, 22.72, 20.05)}
SLOW_RANK = 1


def hta_numbers() -> dict[int, tuple[float, float, float, float]]:
    """HTA's own answer when it is installed, else the stored one."""
    if importlib.util.find_spec("hta") is None:
        return HTA_STORED
    from hta.trace_analysis import TraceAnalysis

    ta = TraceAnalysis(trace_dir=str(HTA_DATA))
    tb = ta.get_temporal_breakdown(visualize=False)
    ov = ta.get_comm_comp_overlap(visualize=False)
    over = dict(zip(ov["rank"], ov["comp_comm_overlap_pctg"], strict=True))
    return {
        int(r["rank"]): (
            r["idle_time_pctg"],
            r["compute_time_pctg"],
            r["non_compute_time_pctg"],
            over[r["rank"]],
        )
        for _, r in tb.iterrows()
    }


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )


# --- real GPU traces: HTA's numbers -----------------------------------------------------------


def test_gpu_traces_give_htas_numbers() -> None:
    run = load_run(HTA_DATA, cache=False)
    assert run.format == "kineto" and run.ranks == [0, 1] and run.size == 128
    assert run.problems == []
    # no baseTimeNanoseconds in these files: aligned on collectives, and said
    assert any("aligned on the ends of matching collectives" in n for n in run.notes)
    report = analyze(run).to_dict()
    got = {r["rank"]: r for r in report["gpu"]["ranks"]}
    assert sorted(got) == [0, 1]
    for rank, expected in hta_numbers().items():
        mine = [
            100 * got[rank][k]
            for k in ("idle_share", "compute_share", "non_compute_share", "comm_comp_overlap_share")
        ]
        for ours, theirs in zip(mine, expected, strict=True):
            assert abs(ours - theirs) <= 1.0, (rank, mine, expected)
    # the NCCL kernels are the collectives' backend calls, with their message sizes
    s = run.slices
    assert (s.phase == 4).sum() > 0 and (s.bytes > 0).any()
    assert "NCCL" in run.backends


def test_gpu_trace_cli_json_and_single_gz_file() -> None:
    proc = cli("analyze", "--json", "--no-cache", str(HTA_DATA / "sampled_rank-1.json.gz"))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["run"]["format"] == "kineto"
    assert "incomplete last event" not in proc.stdout  # the old .gz misreport
    assert [r["rank"] for r in data["gpu"]["ranks"]] == [1]
    assert data["problems"] == []


# --- real CPU DDP (Gloo) jobs ------------------------------------------------------------------


def record(directory: Path, *args: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    result = run_torchrun("kineto_ddp_worker.py", 2, str(directory), *args, timeout=400.0)
    assert result.returncode == 0, result.describe()
    files = sorted(directory.glob("*.pt.trace.json"))
    assert len(files) == 2, (files, result.describe())
    return directory


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kineto-ddp")
    return {
        "balanced": record(root / "balanced"),
        "slow": record(root / "slow", str(SLOW_RANK), "60"),
    }


def test_ddp_slow_rank_is_named(ddp_runs: dict[str, Path]) -> None:
    run = load_run(ddp_runs["slow"], cache=False)
    assert run.format == "kineto" and run.ranks == [0, 1] and run.clean
    assert run.notes == []  # baseTimeNanoseconds: one clock without guessing
    assert "GLOO" in run.backends
    s = find_stragglers(run)
    assert s.straggler == SLOW_RANK, s.verdict
    assert s.steps >= 10
    proc = cli("analyze", "--json", str(ddp_runs["slow"]))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["stragglers"]["straggler"] == SLOW_RANK
    assert data["verdicts"][0].startswith(f"rank {SLOW_RANK} is the straggler")
    assert data["gpu"]["ranks"] == []  # a CPU job: no GPU numbers, no crash (HTA's)


def test_ddp_balanced_names_no_straggler(ddp_runs: dict[str, Path]) -> None:
    run = load_run(ddp_runs["balanced"], cache=False)
    assert run.format == "kineto" and run.clean
    s = find_stragglers(run)
    assert s.ops_with_marks >= 20
    assert s.straggler is None, s.verdict


def test_diff_names_the_slow_rank(ddp_runs: dict[str, Path]) -> None:
    d = diff_runs(load_run(ddp_runs["balanced"]), load_run(ddp_runs["slow"]))
    assert d.straggler_b == SLOW_RANK and d.straggler_a is None
    # the cause in the user's own words: the record_function range the slow rank ran
    assert d.cause is not None and d.cause.key == f"rank {SLOW_RANK}: compute", d.verdict
    assert "in its 'slow_rank_extra_work' range (new in B)" in (d.verdict or ""), d.verdict
    assert f"rank {SLOW_RANK} is the straggler" in (d.verdict or "")
    proc = cli("diff", str(ddp_runs["balanced"]), str(ddp_runs["slow"]))
    assert proc.returncode == 0, proc.stderr
    assert f"rank {SLOW_RANK} is the straggler" in re.sub(r"\s+", " ", proc.stdout)


def test_gz_truncated_and_corrupt_files_are_problems(
    ddp_runs: dict[str, Path], tmp_path: Path
) -> None:
    plain = load_run(ddp_runs["slow"], cache=False)
    # .json.gz, as tensorboard_trace_handler(use_gzip=True) writes: the same run
    gz = tmp_path / "gz"
    gz.mkdir()
    for f in sorted(ddp_runs["slow"].glob("*.pt.trace.json")):
        (gz / (f.name + ".gz")).write_bytes(gzip.compress(f.read_bytes()))
    run = load_run(gz, cache=False)
    assert run.clean and run.format == "kineto"
    assert len(run.slices) == len(plain.slices)
    assert find_stragglers(run).straggler == SLOW_RANK
    files = sorted(ddp_runs["slow"].glob("*.pt.trace.json"))
    # cut: rank 1's file ends mid-event; what is whole is read, the cut is a problem
    cut = tmp_path / "cut"
    shutil.copytree(ddp_runs["slow"], cut)
    data = files[1].read_bytes()
    (cut / files[1].name).write_bytes(data[: len(data) * 2 // 3])
    run = load_run(cut, cache=False)
    assert run.ranks == [0, 1] and not run.clean
    assert any("cut" in p.reason for p in run.problems), run.problems
    assert 0 < (run.slices.rank == 1).sum() < (plain.slices.rank == 1).sum()
    # a cut .gz stream, and garbage: problems, never a traceback
    bad = tmp_path / "bad"
    bad.mkdir()
    blob = gzip.compress(files[0].read_bytes())
    (bad / "worker0.1.pt.trace.json.gz").write_bytes(blob[: len(blob) // 2])
    (bad / "worker1.2.pt.trace.json").write_bytes(b'{"traceEvents": [{"ph": "X", "na\x00\xff')
    run = load_run(bad, cache=False)
    reasons = " | ".join(p.reason for p in run.problems)
    assert "gzip stream is cut" in reasons and "not a readable Kineto trace" in reasons
    for path in (bad, bad / "worker1.2.pt.trace.json"):
        proc = cli("analyze", "--no-cache", str(path))
        assert proc.returncode in (1, 2), proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr, proc.stderr


def test_dashboard_shows_a_kineto_run(ddp_runs: dict[str, Path], tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from dashboard_support import WAIT_MS, dashboard_server, launched_chromium

    root = tmp_path / "served"
    shutil.copytree(ddp_runs["slow"], root / "ddp-slow")
    shutil.copytree(HTA_DATA, root / "gpu")
    with launched_chromium() as browser, dashboard_server(root) as base:
        page = browser.new_page(viewport={"width": 1400, "height": 950})
        try:
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(base + "?run=ddp-slow")
            page.wait_for_selector("body[data-ready='1']")
            page.wait_for_function("window.HVD_STATE && window.HVD_STATE.lanes.length == 2")
            lanes = page.evaluate("window.HVD_STATE.lanes")
            assert [lane.split(" (")[0] for lane in lanes] == ["rank 0", "rank 1"], lanes
            assert page.locator("#run-meta").text_content().startswith("kineto")
            page.wait_for_function(
                "document.querySelector('#straggler-verdict') && "
                "document.querySelector('#straggler-verdict').textContent.includes('rank 1')"
            )
            page.screenshot(path=str(tmp_path / "kineto-ddp.png"), full_page=True)
            page.goto(base + "?run=gpu")
            page.wait_for_selector("body[data-ready='1']")
            page.wait_for_function("window.HVD_STATE && window.HVD_STATE.lanes.length == 2")
            page.screenshot(path=str(tmp_path / "kineto-gpu.png"), full_page=True)
            assert errors == []
        finally:
            page.close()
    assert os.path.exists(tmp_path / "kineto-ddp.png")


def test_benchmark_quick_run(tmp_path: Path) -> None:
    """benchmarks/kineto_bench.py end to end on a small run (HTA left out: not a
    dependency); no timing is asserted."""
    out = tmp_path / "kineto_bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "kineto_bench.py"), "--quick", "--no-hta",
         "--output", str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    synthetic = result["datasets"]["synthetic"]
    ours = synthetic["variants"]["hvdprof"]
    assert synthetic["events"] >= 40_000
    assert ours["runs"] and all(r["events"] == synthetic["events"] for r in ours["runs"])
    # the generator's late rank, named in every repeat
    assert {r["straggler"] for r in ours["runs"]} == {synthetic["ranks"] - 1}
    assert len(ours["gpu"]) == synthetic["ranks"]
    assert ours["peak_mib"]["min"] <= ours["peak_mib"]["median"] <= ours["peak_mib"]["max"]
    # HTA's own test traces are read too, and name their ranks
    real = result["datasets"]["hta_tests"]["variants"]["hvdprof"]
    assert real["runs"] and real["gpu"]
