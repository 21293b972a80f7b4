"""The straggler verdict of a real job whose every collective ran in a process set.

Sets {0, 1} and {2, 3} train apart on four real ranks (``process_sets_worker.py train``),
rank 3 sleeping 40 ms before each step from step 5: slow only inside set 2. The job is
recorded by ``hvdprof run --timeline`` and read by ``hvdprof analyze``, as text and as
JSON: no collective is job-wide, so the job-wide straggler verdict defers to the sets'
(``JUDGED_IN_SETS``, declared by the analysis, not patched by the report), and set 2's
answer names rank 3 while set 1's names nobody. Each runs on a quiet machine and beside
one Python spin loop per core, as the verdict tests in test_answers do.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO
from schema_support import PUBLISHED
from test_process_sets import record_two_set_job

from hvdprof.analysis.stragglers import JUDGED_IN_SETS

SLOW_SET = "Process set 2 (ranks 2, 3): rank 3 is the straggler"


@contextlib.contextmanager
def spin_loops(count: int) -> Iterator[None]:
    """``count`` Python spin loops at normal priority while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait(timeout=30)


@pytest.fixture(scope="module", params=["quiet", "loaded"])
def timeline(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two sets' job, recorded once per module and load."""
    out = tmp_path_factory.mktemp(f"sets-{request.param}") / "tl"
    spinners = (os.cpu_count() or 1) if request.param == "loaded" else 0
    with spin_loops(spinners):
        result = record_two_set_job(out)
    assert result.returncode == 0, result.describe()
    return out


def analyze(timeline: Path, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    done = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(timeline), "--no-cache", *args],
        capture_output=True, text=True, timeout=180, cwd=REPO, env={**env, "COLUMNS": "100"},
        stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def test_the_json_defers_the_straggler_to_each_set(timeline: Path) -> None:
    report = json.loads(analyze(timeline, "--json"))
    stragglers = report["stragglers"]
    assert stragglers["verdict"] == JUDGED_IN_SETS, stragglers["verdict"]
    assert stragglers["ops_with_marks"] == 0 and stragglers["straggler"] is None
    sets = {s["process_set"]: s for s in report["process_sets"]}
    assert sorted(sets) == [1, 2]
    assert sets[1]["members"] == [0, 1] and sets[2]["members"] == [2, 3]
    slow, calm = sets[2]["stragglers"], sets[1]["stragglers"]
    assert slow["straggler"] == 3 and slow["culprits"] == [3], slow["verdict"]
    assert slow["ranks"][0]["rank"] == 3 and slow["ranks"][0]["cost_per_step_ms"] > 20.0
    assert calm["straggler"] is None, calm["verdict"]
    # the deferral comes first, then each set's answer, in the job's rank numbers
    first = report["verdicts"].index(JUDGED_IN_SETS)
    told = report["verdicts"][first + 1 : first + 3]
    assert told[0].startswith("Process set 1 (ranks 0, 1): "), told
    assert told[1].startswith(SLOW_SET), told
    # and the report is what the published schema says it is
    import jsonschema  # a dev dependency (pyproject.toml)

    validator = jsonschema.Draft202012Validator(json.loads(PUBLISHED.read_text()))
    assert not [e.message for e in validator.iter_errors(report)][:3]


def test_the_terminal_tells_the_same(timeline: Path) -> None:
    text = analyze(timeline)
    verdicts = text[: text.index("1. Where the time goes")]
    said = " ".join(verdicts.split())
    assert f"1. {JUDGED_IN_SETS}" in said, verdicts
    assert "2. Process set 1 (ranks 0, 1): " in said and f"3. {SLOW_SET}" in said, verdicts
