"""The JSON of ``diff``, ``ab`` and ``history`` is in the published schema, and every
number in it is finite: an end of an interval that nothing bounds is null, typed so
(``float | None``), and a command's typed result reads its own JSON back.

The outputs of the real commands are validated where the tests run them (test_ab,
test_gate, test_history); here are the cases those jobs rarely reach: an interval that
too few blocks bound (``ab``), and a rule on a phase run A does not have (``diff``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
from schema_support import PUBLISHED, assert_valid_output

from hvdprof.analysis.ab import SequentialGate
from hvdprof.analysis.ab_cli import _write_json
from hvdprof.analysis.ab_runner import (
    AbResult,
    GateOutcome,
    GatePlan,
    RunRecord,
    outcome_result,
    outcome_to_dict,
    verdict_line,
)
from hvdprof.analysis.gate import GatedDiff
from hvdprof.analysis.summary import RunSummary, Series, write_summary

REPO = Path(__file__).resolve().parent.parent


def test_the_published_schema_has_each_commands_output() -> None:
    published = json.loads(PUBLISHED.read_text())
    outputs = published["x-commands"]
    assert set(outputs) == {"diff", "ab", "history"}
    for command, ref in outputs.items():
        name = ref["$ref"].rpartition("/")[2]
        assert published["$defs"][name]["additionalProperties"] is False, command
    judgement = published["$defs"]["PairedJudgement"]["properties"]
    assert judgement["high"] == {"anyOf": [{"type": "number"}, {"type": "null"}]}
    assert judgement["low"] == {"type": "number"}  # -1 when open: B/A - 1 is never less
    check = published["$defs"]["GateCheck"]["properties"]
    assert all(check[k]["anyOf"][1] == {"type": "null"} for k in ("change", "low", "high"))


def _outcome(tmp_path: Path, ratios: list[float]) -> GateOutcome:
    """A gate that judged ``ratios`` (log B/A per block) and stopped at its budget."""
    plan = GatePlan(SequentialGate(0.05), budget_s=60.0)
    outcome = GateOutcome(plan, str(tmp_path), stopped="budget", wall_s=12.0)
    for block, ratio in enumerate(ratios, start=1):
        for side, ms in (("baseline", 4.0), ("candidate", 4.0 * float(np.exp(ratio)))):
            run = RunRecord(side, block, str(tmp_path / f"{block}-{side}"), 0, 1.5, 0.0, 0.4)
            run.step_ms, run.steps = ms, 20
            outcome.runs.append(run)
    outcome.log_ratios = list(ratios)
    outcome.judgement = plan.gate.judge(outcome.log_ratios)
    return outcome


def test_an_open_interval_is_null_in_the_ab_json_and_reads_back(tmp_path: Path) -> None:
    for ratios, bounded in (([0.10, 0.12], False), ([0.01, -0.02, 0.0, 0.03] * 3, True)):
        outcome = _outcome(tmp_path, ratios)
        j = outcome.judgement
        assert j is not None and (j.high is not None) is bounded
        assert ("too few blocks for an interval" in verdict_line(outcome)) is not bounded
        if not bounded:
            assert j.low == -1.0 and not j.clear
        path = tmp_path / f"ab-{len(ratios)}.json"
        _write_json(str(path), outcome_to_dict(outcome, 0))  # as `hvdprof ab --json` writes
        data = json.loads(path.read_text())
        assert_valid_output("ab", data)
        assert (data["judgement"]["high"] is None) is not bounded
        back = msgspec.json.decode(path.read_bytes(), type=AbResult)
        assert back == outcome_result(outcome, 0)


def _summary(queue_ms: float, seed: int) -> RunSummary:
    """Two ranks' 40 steps of about 10 ms, with ``queue_ms`` of queueing per step."""
    rng = np.random.default_rng(seed)
    step = 10.0 * (1.0 + 0.02 * rng.standard_normal((40, 2)))
    queue = queue_ms * (1.0 + 0.05 * rng.standard_normal(40)) if queue_ms else np.zeros(40)
    return RunSummary(
        format="hvdprof-summary", version=1, source=f"made-up-{seed}", trace_format="hvdprof",
        ranks=[0, 1], steps_in_run=41, step_ms=float(np.median(step)),
        phase_ms={"queue": float(queue.mean())}, rank_ms={}, own_work_known=False,
        tensor_ms={}, one_time=[],
        series=Series(step=step.tolist(), phase={"queue": queue.tolist()}),
    )  # fmt: skip


def test_a_phase_new_in_b_is_null_in_the_diff_json(tmp_path: Path) -> None:
    # run A never queued, B queues 0.5 ms per step: the relative change has no finite
    # value, so its change and bounds are null and the message says so
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    write_summary(_summary(0.0, 1), str(a))
    write_summary(_summary(0.5, 2), str(b))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    done = subprocess.run(
        [sys.executable, "-m", "hvdprof", "diff", str(a), str(b), "--fail-on", "queue:10%",
         "--fail-on", "5%", "--json"],
        capture_output=True, text=True, timeout=120, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    data = json.loads(done.stdout)
    assert_valid_output("diff", data)
    queue, step = data["gate"]
    check = queue["checks"][0]
    assert queue["failed"] and check["change"] is None and check["low"] is None
    assert "(new in B; absent in A)" in queue["message"]
    assert not step["failed"] and step["checks"][0]["change"] is not None
    back = msgspec.json.decode(done.stdout.encode(), type=GatedDiff)
    assert back.gate[0].checks[0].change is None and back.gate[1].rule.what == "step"
