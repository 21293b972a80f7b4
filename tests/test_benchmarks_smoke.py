"""Every benchmark runs end to end from the command line (quick mode) and writes its JSON.

No timing is asserted: the numbers come from the full runs, reported in the issue notes.
"""

from __future__ import annotations

import pathlib

import pytest
from benchmark_support import run_quick

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
    result = run_quick(script, tmp_path)
    assert result.get("variants") or result.get("ratios"), sorted(result)


@pytest.mark.timeout(120)
def test_machine_steadiness_reports_the_spread_it_measured(tmp_path: pathlib.Path) -> None:
    """The windows' medians bracket the run's median, and the sequential pairs a gate
    would need follow from the pair sd it reports."""
    result = run_quick("machine_steadiness.py", tmp_path, timeout=100)
    assert result["pieces"] > 100, result["pieces"]
    for key in ("wall_0.5s", "cpu_0.5s"):
        f = result["figures"][key]
        assert f["windows"] >= 10, f
        assert f["p5"] <= 1.0 <= f["p95"], f
        assert f["pair_sd"] >= 0.0, f
    assert [row[0] for row in result["table"]][-1].startswith("sequential pairs of 2 s runs")
