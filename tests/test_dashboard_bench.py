"""``benchmarks/dashboard_bench.py --quick`` runs end to end and writes every figure.

No timing is asserted (the machine is shared); the full run's numbers are in the notes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from benchmark_support import run_quick

pytest.importorskip("fastapi")


@pytest.mark.timeout(300)
def test_dashboard_bench_quick(tmp_path: Path) -> None:
    result = run_quick("dashboard_bench.py", tmp_path)
    for key in ("startup_cold_s", "startup_warm_s", "startup_open_s", "zoom_ms_median",
                "live_to_window_s_median", "server_peak_rss_mb"):  # fmt: skip
        assert result[key] > 0, key
    # (a synthetic run written as the renderer writes: one READY mark per op per rank)
    assert result["events"] > 30_000 and result["ranks"] == 4
    assert set(result["met"]) == {"startup_s", "zoom_ms", "live_s", "rss_mb"}
