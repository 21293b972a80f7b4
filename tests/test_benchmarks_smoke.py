"""Every benchmark runs end to end from the command line (quick mode) and writes its JSON.

No timing is asserted: the numbers come from the full runs, reported in the issue notes.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHMARKS = [
    "allreduce_resnet50.py",
    "small_tensors.py",
    "synthetic_training.py",
    "timeline_overhead.py",
    "autotune_bench.py",
    "synthetic_autotune.py",
    "divergence_check.py",
    "dashboard_load.py",
    "answers_bench.py",
    "gate_calibration.py",
    "kineto_bench.py",
    "idle_cost.py",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("script", BENCHMARKS)
def test_benchmark_quick_run_writes_results(script: str, tmp_path: pathlib.Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--output", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result.get("variants") or result.get("ratios"), sorted(result)


@pytest.mark.timeout(120)
def test_machine_steadiness_reports_the_spread_it_measured(tmp_path: pathlib.Path) -> None:
    """The windows' medians bracket the run's median, and the sequential pairs a gate
    would need follow from the pair sd it reports."""
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "machine_steadiness.py"), "--quick",
         "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=100,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["pieces"] > 100, result["pieces"]
    for key in ("wall_0.5s", "cpu_0.5s"):
        f = result["figures"][key]
        assert f["windows"] >= 10, f
        assert f["p5"] <= 1.0 <= f["p95"], f
        assert f["pair_sd"] >= 0.0, f
    assert [row[0] for row in result["table"]][-1].startswith("sequential pairs of 2 s runs")
