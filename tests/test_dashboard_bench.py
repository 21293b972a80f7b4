"""``benchmarks/dashboard_bench.py --quick`` runs end to end and writes every figure.

No timing is asserted (the machine is shared); the full run's numbers are in the notes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.timeout(300)
def test_dashboard_bench_quick(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "dashboard_bench.py"), "--quick",
         "--output", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for key in ("startup_cold_s", "startup_warm_s", "startup_open_s", "zoom_ms_median",
                "live_to_window_s_median", "server_peak_rss_mb"):  # fmt: skip
        assert result[key] > 0, key
    # (a synthetic run written as the renderer writes: one READY mark per op per rank)
    assert result["events"] > 30_000 and result["ranks"] == 4
    assert set(result["met"]) == {"startup_s", "zoom_ms", "live_s", "rss_mb"}
