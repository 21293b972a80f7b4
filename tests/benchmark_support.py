"""Running a benchmark script the way its smoke tests do: ``--quick``, results to a file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_quick(script: str, out_dir: Path, *args: str, timeout: float = 280) -> dict[str, Any]:
    """``benchmarks/SCRIPT --quick --output OUT_DIR/result.json ARGS``: its results, after
    checking it exited 0 (its output's tail is the failure message)."""
    out = out_dir / "result.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / script), "--quick", "--output", str(out),
         *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())
