"""The GPU check (issue 54, ``benchmarks/gpu_check.py``): what of it runs without a GPU.

Its dry run lists every step and exits 0 on CPU; its trace step's analysis, given real GPU
torch.profiler traces (``tests/data/kineto-hta``: ranks 0 and 1 of a 128-rank NCCL job,
HTA's numbers in the README beside them), finds every GPU event in a stream lane, HTA's
shares on the GPU card, no straggler in the real pair, and a rank made late by a known
amount (``test_gpu_stragglers.make_late``: the way a real delay looks on NCCL) named
with its cost, and fails when the straggler it was told of is not there. A run of the
script's own steps on this CPU machine records each step's outcome in the JSON.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO
from test_gpu_stragglers import DELAY_MS, make_late, real_pair, write

SCRIPT = REPO / "benchmarks" / "gpu_check.py"
HTA_DATA = REPO / "tests" / "data" / "kineto-hta"
#: tests/data/kineto-hta/README.md: HTA's idle, compute, non-compute shares (percent)
HTA_SHARES = {"0": (53.56, 17.71, 28.74), "1": (54.72, 22.57, 22.72)}

sys.path.insert(0, str(REPO / "benchmarks"))
import gpu_check  # noqa: E402


def script(*args: str, timeout: float = 240.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        capture_output=True, text=True, cwd=REPO, timeout=timeout,
    )  # fmt: skip


def analyze(directory: Path, tmp_path: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "analysis.json"
    proc = script("--analyze-trace", str(directory), "--json-out", str(out), *args)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(out.read_text())


def failed(result: dict[str, Any]) -> list[str]:
    return [c["name"] for c in result["checks"] if not c["ok"]]


def test_dry_run_lists_every_step_and_exits_0() -> None:
    proc = script("--dry-run", timeout=60)
    assert proc.returncode == 0, proc.stderr
    for step in gpu_check.STEPS:
        assert f"{step.name} (limit {step.limit_s} s)" in proc.stdout, step.name
    assert "HVDPROF_SETUP_CORE_ONLY=1 bash .ci/setup" in proc.stdout
    # sized for one 10-minute command: the steps' limits fit the 8-minute budget
    assert sum(s.limit_s for s in gpu_check.STEPS) <= gpu_check.BUDGET_S <= 480
    # every pytest step selects tests that exist (a -k matching nothing would skip silently)
    ids = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q",
         "-m", "gpu", gpu_check.DEVICE_TESTS],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    ).stdout  # fmt: skip
    for step in gpu_check.STEPS:
        if step.kind == "pytest":
            argv = step.argv(gpu_check.Context("python", {}, Path("w"), None))
            selection = argv[argv.index("-k") + 1]
            chosen = subprocess.run(
                [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only",
                 "-q", "-m", "gpu", gpu_check.DEVICE_TESTS, "-k", selection],
                capture_output=True, text=True, cwd=REPO, timeout=120,
            ).stdout  # fmt: skip
            picked = [line for line in chosen.splitlines() if "::" in line]
            assert picked and all(line in ids for line in picked), (step.name, chosen)


def test_trace_step_on_real_gpu_traces(tmp_path: Path) -> None:
    code, result = analyze(HTA_DATA, tmp_path)
    assert code == 0 and not failed(result), result["checks"]
    f = result["figures"]
    assert f["ranks"] == [0, 1]
    # every GPU event of each file on its stream's lane (counted from the gz files)
    lanes = [c for c in result["checks"] if "stream lane" in c["name"]]
    assert [c["detail"].split(" events")[0] for c in lanes] == ["1204", "1154"]
    assert f["stream_lanes"]["0"] == {
        "7": "compute", "23": "compute", "84": "NCCL", "203": "NCCL", "25": "memcpy",
    }  # fmt: skip
    for rank, shares in HTA_SHARES.items():
        card = f["gpu_card"][rank]
        got = (card["idle_share"], card["compute_share"], card["non_compute_share"])
        assert [round(100 * x, 2) for x in got] == pytest.approx(shares, abs=0.01)
    assert f["straggler"]["straggler"] is None and f["straggler"]["source"] == "nccl_kernels"


def test_trace_step_names_a_planted_straggler_with_its_cost(tmp_path: Path) -> None:
    traces = real_pair()
    make_late(traces, {1: DELAY_MS})
    late = write(tmp_path / "late", traces)
    code, result = analyze(late, tmp_path, "--slow-rank", "1", "--slow-ms", str(DELAY_MS))
    assert code == 0 and not failed(result), result["checks"]
    s = result["figures"]["straggler"]
    # rank 1 was already last by 15.93 ms a step in the real pair: that and the delay
    assert s["straggler"] == 1 and s["cost_ms"] == pytest.approx(DELAY_MS + 15.93, abs=0.5)


def test_trace_step_fails_when_the_told_straggler_is_not_there(tmp_path: Path) -> None:
    report = tmp_path / "analyze.txt"
    code, result = analyze(
        HTA_DATA, tmp_path, "--slow-rank", "1", "--slow-ms", "150", "--report-out", str(report)
    )
    assert code == 1
    assert failed(result) == ["rank 1 named the straggler", "its cost is 75-225 ms per step"]
    assert "7. GPU per rank" in report.read_text()  # the human report, for the run's files


def test_trace_step_refuses_a_missing_directory(tmp_path: Path) -> None:
    proc = script("--analyze-trace", str(tmp_path / "nothing"), timeout=60)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_run_without_a_gpu_records_each_step(tmp_path: Path) -> None:
    """The runner itself, on this CPU machine: the machine step fails (no GPU), the trace
    analysis skips (no trace recorded), the two-GPU tests skip with their reasons; the
    JSON and one summary line say so, and the exit code is 1."""
    out, results = tmp_path / "out", tmp_path / "gpu_check.json"
    proc = script(
        "--setup", "none", "--out", str(out), "--results", str(results),
        "--only", "machine", "profiler-trace-analyze", "two-gpu-tests",
    )  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    last = proc.stdout.strip().splitlines()[-1]
    assert last.startswith("gpu_check: FAIL: 3 steps: 1 failed, 2 skipped (machine)"), last
    report = json.loads(results.read_text())
    assert json.loads((out / "gpu_check.json").read_text()) == report
    assert (out / "gpu_check.log").stat().st_size > 0
    steps = {s["name"]: s for s in report["steps"]}
    assert steps["machine"]["status"] == "failed"
    assert "a CUDA GPU: 0 GPU(s)" in steps["machine"]["reason"]
    assert steps["machine"]["figures"]["gpus"] == 0
    assert steps["profiler-trace-analyze"]["status"] == "skipped"
    two = steps["two-gpu-tests"]
    assert two["status"] == "skipped" and len(two["tests"]) >= 20
    assert all(t["outcome"] == "skipped" and t["reason"] for t in two["tests"])
    assert last == f"{report['summary']}; {results}, {out / 'gpu_check.json'}"


def test_a_spent_budget_leaves_steps_not_run(tmp_path: Path) -> None:
    results = tmp_path / "gpu_check.json"
    proc = script(
        "--setup", "none", "--budget-s", "2", "--results", str(results), "--only", "machine"
    )
    assert proc.returncode == 1
    step = json.loads(results.read_text())["steps"][0]
    assert step["status"] == "not run" and step["reason"] == "the budget was spent"


def test_docs_say_what_ran_on_a_gpu() -> None:
    """Until a GPU check's results are committed, the docs say nothing ran on a GPU; once
    they are, docs/cuda.md carries their summary line (numbers from the JSON, not typed)."""
    cuda = (REPO / "docs" / "cuda.md").read_text()
    readme = (REPO / "README.md").read_text()
    results = REPO / "benchmarks" / "results" / "gpu_check.json"
    if not results.exists():
        assert "No GPU test has run on hardware" in cuda
        assert "None has run on hardware yet" in cuda
        assert "## What has run on a GPU\n\nNothing yet" in readme
    else:
        summary = json.loads(results.read_text())["summary"]
        assert summary in " ".join(cuda.split()), "paste the GPU check's summary into docs/cuda.md"


def test_a_run_that_proved_nothing_is_not_a_pass() -> None:
    def report(*statuses: str) -> dict[str, Any]:
        steps = [
            {"name": f"s{i}", "status": s, "tests": [], "figures": {}}
            for i, s in enumerate(statuses)
        ]
        return {"steps": steps, "setup": {"ok": True, "mode": "none"}, "wall_s": 1.0}

    assert gpu_check.summary_line(report("skipped", "skipped")).startswith("gpu_check: SKIPPED: ")
    assert gpu_check.summary_line(report("passed", "skipped")).startswith("gpu_check: PASS: ")
    assert gpu_check.summary_line(report("passed", "timed out")).startswith("gpu_check: FAIL: ")
    assert gpu_check.summary_line(report("passed", "not run")).startswith("gpu_check: FAIL: ")
    bad_setup = {**report("passed"), "setup": {"ok": False, "mode": "image"}}
    assert gpu_check.summary_line(bad_setup).startswith(
        "gpu_check: FAIL: 1 steps: 1 passed (set-up (image))"
    )
