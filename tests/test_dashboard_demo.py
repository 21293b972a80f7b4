"""The README's demo, scripted: ``bash .ci/demo --report-only`` trains, tunes, reports.

It reuses this test session's virtual environment (``--no-setup`` with HVDPROF_VENV), so
it needs no network, and writes into a temporary directory instead of the checkout.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
from dashboard_support import REPO, child_env

DEMO_TIMEOUT_S = 280


def test_demo_report_only(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = child_env({"HVDPROF_VENV": sys.prefix})
    proc = subprocess.run(
        ["bash", str(REPO / ".ci" / "demo"), "--report-only", "--no-setup", "--dir", str(out),
         "--epochs", "2"],
        capture_output=True, text=True, timeout=DEMO_TIMEOUT_S, env=env, cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "accuracy" in proc.stdout  # the training ran (rank 0's summary line)
    assert "hvdprof autotune" in proc.stdout + proc.stderr  # autotune was on
    report = out / "report.html"
    assert f"wrote {report}" in proc.stdout
    html = report.read_text(encoding="utf-8")
    # self-contained: Plotly and the page's script inlined, the run's results embedded
    assert 'src="static/' not in html and 'href="static/' not in html
    assert "window.hvdprofEmbedded" in html and "plotly.js" in html.lower()
    for name in ("rank.0.json", "rank.1.json", "merged.json", "autotune.csv"):
        assert (out / name).is_file(), name
    assert os.path.getsize(report) > 1_000_000
