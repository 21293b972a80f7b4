"""docs/benchmarks.md's results section is what benchmarks/results/ holds, to the digit.

Numbers typed into docs by hand drifted from the runs they came from; the section is
generated (benchmarks/doc_results.py), and this fails when a results file changed and the
doc was not regenerated, or the doc was edited by hand.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "benchmarks" / "doc_results.py"


def _module():
    spec = importlib.util.spec_from_file_location("doc_results", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_docs_results_match_the_results_files() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert out.returncode == 0, out.stderr


def test_every_results_file_publishes_rows_and_a_changed_number_is_caught() -> None:
    mod = _module()
    for path in sorted(mod.RESULTS.glob("*.json")):
        if ".quick." not in path.name:
            assert mod.rows_of(path), f"{path.name}: no rows for docs/benchmarks.md"
    doc = mod.DOC.read_text()
    section = doc.split(mod.BEGIN, 1)[1].split(mod.END, 1)[0]
    # each ratio the harness wrote is in the doc as printed from its file
    timeline = json.loads((mod.RESULTS / "timeline_overhead.json").read_text())
    demo = timeline["ratios"]["demo: on / off (per step)"]["of_medians"]
    assert f"| demo: on / off (per step) | {demo:.3f} |" in section
    # a number edited by hand in the doc no longer matches
    tampered = doc.replace(f"{demo:.3f}", f"{demo + 0.5:.3f}", 1)
    assert tampered != doc and mod.render(tampered) != tampered


def test_no_doc_quotes_a_comparison_by_hand() -> None:
    # docs/torch-profiler.md once quoted kineto_bench's one run ("6.2x faster, 0.25 of
    # HTA's peak RSS") after the benchmark had changed: a speedup or a share of another
    # tool's cost belongs in the generated section, read from its results file
    mod = _module()
    pattern = re.compile(
        # (a goal, "\u2265 5x faster", is no result)
        r"(?<!\u2265 )(?<!>= )\b\d+(?:\.\d+)?\s*(?:x|\u00d7)\s+(?:faster|slower)\b"
        r"|\b\d?\.\d+\s+of\s+(?:\w+\s+){0,2}(?:HTA|DDP|Horovod|Gloo)\b",
        re.IGNORECASE,
    )
    quoted = []
    docs = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
    for path in docs:
        text = path.read_text()
        if mod.BEGIN in text and mod.END in text:  # the generated section is the place
            head, rest = text.split(mod.BEGIN, 1)
            text = head + rest.split(mod.END, 1)[1]
        quoted += [f"{path.relative_to(REPO)}: {m.group(0)!r}" for m in pattern.finditer(text)]
    assert len(docs) > 5
    assert not quoted, "generate these from benchmarks/results/ instead:\n" + "\n".join(quoted)
