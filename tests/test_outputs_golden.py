"""``hvdprof analyze`` on every real fixture run in ``tests/data`` prints what it printed
before a refactor: the ``--json`` report equal (parsed, so key order aside) and the table
output byte-identical.

Why: issue 51 moves reading, the analyses and their printers around (a trace layer,
analyses as plug-ins, functions split into stages). None of that may change an answer; a
golden file recorded from the code before the move is the one check that sees every
number and every line of every table at once.

One golden file per case in ``tests/data/golden/<case>.json``: the command's arguments,
its exit code, the parsed JSON report and the table's lines (``"\\n".join`` of them is the
stdout, byte for byte). Cases: hvdprof's own timelines (``hvdprof-demo``,
``intermittent-2-loaded``), Horovod 0.28.1 timelines (``horovod/*.json``), torch.profiler
traces (``kineto-ddp-gloo``, ``kineto-hta``), and one run given ``--kineto`` traces (of a
different job, so its overlap answer means nothing: the case pins the ``--kineto`` path's
output, not a finding). ``tests/data/horovod-timeline.json`` is left out: it is a
byte-identical copy of ``horovod/horovod-timeline.json``.

Determinism: each case runs in a copy of its files at the same relative path
(``tmp/tests/data/...``, with that ``tmp`` as the working directory), so the paths the
report quotes (``run.path``, ``run.files``, the table's title) are the ones recorded, and
the ``.hvdprof-cache/`` that analyze writes lands in the copy, never in the repository.
The table is drawn 80 columns wide (``COLUMNS=80``) with no ``HVDPROF_*`` variable set.
Nothing in the output is a wall-clock time, so no field is normalised. Each case runs
three times: ``--json --no-cache``, the table (writing the cache), ``--json`` again
(reading it), so the cache's round trip is held to the same answers.

Regenerate (only when an answer is meant to change, and say why in the commit)::

    GOLDEN_REGEN=1 .venv/bin/pytest -q tests/test_outputs_golden.py
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, child_env

DATA = REPO / "tests" / "data"
GOLDEN = DATA / "golden"
REGEN = os.environ.get("GOLDEN_REGEN") == "1"

#: case name -> (the files it copies, relative to tests/data; analyze's arguments)
CASES: dict[str, tuple[list[str], list[str]]] = {
    "hvdprof-demo": (["hvdprof-demo"], ["tests/data/hvdprof-demo"]),
    "intermittent-2-loaded": (["intermittent-2-loaded"], ["tests/data/intermittent-2-loaded"]),
    "horovod-timeline": (
        ["horovod/horovod-timeline.json"],
        ["tests/data/horovod/horovod-timeline.json"],
    ),
    "horovod-timeline-nocache": (
        ["horovod/horovod-timeline-nocache.json"],
        ["tests/data/horovod/horovod-timeline-nocache.json"],
    ),
    "kineto-ddp-gloo": (["kineto-ddp-gloo"], ["tests/data/kineto-ddp-gloo"]),
    "kineto-hta": (["kineto-hta"], ["tests/data/kineto-hta"]),
    "hvdprof-demo-with-kineto": (
        ["hvdprof-demo", "kineto-ddp-gloo"],
        [
            "tests/data/hvdprof-demo",
            "--kineto",
            "tests/data/kineto-ddp-gloo/worker0.1.pt.trace.json.gz",
            "tests/data/kineto-ddp-gloo/worker1.2.pt.trace.json.gz",
        ],
    ),
}


def _analyze(root: Path, args: list[str]) -> tuple[int, str]:
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", *args],
        capture_output=True, encoding="utf-8", cwd=root, timeout=120,
        env=child_env({"COLUMNS": "80", "LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8"}),
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-4000:]
    return proc.returncode, proc.stdout


def _copy(root: Path, files: list[str]) -> None:
    for name in files:
        source, target = DATA / name, root / "tests" / "data" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if source.is_dir():
            # (without a cache something else left there: this run writes its own)
            shutil.copytree(source, target, ignore=shutil.ignore_patterns(".hvdprof-cache"))
        else:
            shutil.copyfile(source, target)


def _first_difference(a: Any, b: Any, where: str = "") -> str | None:
    """Where two parsed JSON values first differ, for a failure message one can act on."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            if key not in a or key not in b:
                return f"{where}/{key}: only in {'golden' if key in a else 'now'}"
            found = _first_difference(a[key], b[key], f"{where}/{key}")
            if found:
                return found
        return None
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return f"{where}: {len(a)} items in golden, {len(b)} now"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            found = _first_difference(x, y, f"{where}[{i}]")
            if found:
                return found
        return None
    if isinstance(a, float) and isinstance(b, float) and math.isclose(a, b, rel_tol=1e-9):
        # the last bit of a float sum depends on the CPU's vector width (numpy's pairwise
        # sums): 27.272392500000002 here is 27.2723925 on an AMD EPYC
        return None
    return None if a == b and type(a) is type(b) else f"{where}: golden {a!r}, now {b!r}"


@pytest.mark.parametrize("case", sorted(CASES))
def test_analyze_output_matches_golden(case: str, tmp_path: Path) -> None:
    files, args = CASES[case]
    _copy(tmp_path, files)
    code, text = _analyze(tmp_path, ["--json", "--no-cache", *args])
    report = json.loads(text)
    table_code, table = _analyze(tmp_path, args)  # writes .hvdprof-cache/ in the copy
    cached_code, cached = _analyze(tmp_path, ["--json", *args])  # reads it
    golden_path = GOLDEN / f"{case}.json"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        recorded = {
            "args": args,
            "exit_code": code,
            "json": report,
            "table_lines": table.split("\n"),
        }
        golden_path.write_text(json.dumps(recorded, indent=1, ensure_ascii=False) + "\n")
    golden = json.loads(golden_path.read_text())
    assert golden["args"] == args, "the case's arguments changed: regenerate (GOLDEN_REGEN=1)"
    assert (code, table_code, cached_code) == (golden["exit_code"],) * 3
    found = _first_difference(golden["json"], report)
    assert found is None, found
    found = _first_difference(golden["json"], json.loads(cached))
    assert found is None, found
    expected = "\n".join(golden["table_lines"])
    if table != expected:
        diff = [
            f"line {i + 1}:\n  golden {g!r}\n  now    {n!r}"
            for i, (g, n) in enumerate(zip(expected.split("\n"), table.split("\n"), strict=False))
            if g != n
        ]
        pytest.fail("table differs from golden at " + ("\n".join(diff[:5]) or "the end"))


def test_every_golden_file_is_a_case() -> None:
    """A golden file whose case was removed is not silently kept (nor one never made)."""
    assert sorted(p.stem for p in GOLDEN.glob("*.json")) == sorted(CASES)
