"""The calibration of ``hvdprof ab`` is collected over many sessions: its ledger resumes
to run only the missing gates, keeps the cells balanced, survives a line cut short, and
its summary is regenerated from the ledger alone.

The planning and summary are checked on ledgers written here; one test drives the real
calibration (one real short ``hvdprof ab`` gate of the demo job) from a ledger that
already holds part of its protocol, and checks that it runs only the rest.
"""

from __future__ import annotations

import argparse
import dataclasses
import fcntl
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gate_ab_calibration as cal  # noqa: E402
import gate_ab_ledger as ledger  # noqa: E402
from gate_ab_ledger import GateRecord, ProbeRecord  # noqa: E402

SETTINGS = {"steps": 100, "margin": "5%", "small_margin": "1%", "ab_args": []}


def gate(
    variant: str,
    *,
    job: str = "demo",
    failed: bool = False,
    rnd: int = 0,
    load: str = "none",
    low: float | None = 0.0,
    high: float | None = 0.1,
    cause: str | None = None,
    wall_s: float = 100.0,
    exit: int | None = None,
    settings: dict | None = None,
    commit: str | None = None,
) -> GateRecord:
    return GateRecord(
        job=job, variant=variant, load=load, round=rnd, seed=rnd,
        settings=dict(settings or SETTINGS), exit=(3 if failed else 0) if exit is None else exit,
        failed=failed, verdict="FAIL: ..." if failed else "pass: ...", estimate=0.05, low=low,
        high=high, alpha=0.01, blocks=8, stopped="clear", cause=cause, wall_s=wall_s,
        probe_step_ms=5.0, slow_ms=5.0 * ledger.INJECTED[variant], baseline_step_ms=5.0,
        load_changes=0, started="2026-01-01T08:00:00+00:00", date="2026-01-01T08:02:00+00:00",
        provenance={"git_commit": commit, "gate_code_sha256": ledger.gate_code_digest()},
    )  # fmt: skip


def write(path: Path, records: list) -> None:
    for r in records:
        ledger.append_record(path, r)


def everything(_commit: str | None) -> bool:
    return True


def test_a_ledger_resumes_with_only_the_missing_gates_balanced(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    jobs, variants, rounds = ["demo", "large"], list(ledger.VARIANTS), 3
    held = [gate("same", rnd=i) for i in range(3)]  # one cell already complete
    held += [gate("all10"), gate("one10", job="large"), gate("one10", job="large", rnd=1)]
    held += [gate("all5", load="changing"), gate("all5", settings={**SETTINGS, "steps": 20})]
    # a wait of 0.5 ms over a baseline step of 3 ms is 17%, not 10%: it runs again
    held += [dataclasses.replace(gate("all10"), baseline_step_ms=3.0)]
    write(path, held)
    book = ledger.read_ledger(path)
    assert [r.id for r in book.records] == [r.id for r in held]
    sel = ledger.select(book.gates, "none", SETTINGS, everything)
    assert (sel.other_load, sel.other_settings, len(sel.gates)) == (1, 1, 6)
    assert [g.baseline_step_ms for g in sel.mis_sized] == [3.0]
    assert not ledger.select(book.gates, "none", SETTINGS, everything, 0.7).mis_sized
    counts = ledger.cell_counts(sel.gates, jobs, variants)
    assert ledger.missing(counts, rounds) == 8 * 3 - 6
    ran: list[tuple[str, str]] = []
    while (cell := ledger.next_cell(counts, rounds, 50 + len(ran))) is not None:
        # a cell with the fewest records runs next, so the cells stay balanced
        assert counts[cell] == min(n for n in counts.values() if n < rounds)
        ran.append(cell)
        counts[cell] += 1
    assert len(ran) == 18 and ("demo", "same") not in ran
    assert ran.count(("large", "one10")) == 1 and ran.count(("demo", "all10")) == 2
    assert all(n == rounds for n in counts.values())
    # the choice among equals is not always the same variant first
    firsts = {ledger.next_cell({("demo", v): 0 for v in variants}, 1, s) for s in range(40)}
    assert len(firsts) == 4


def test_the_summary_is_regenerated_from_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    records = [gate("same", rnd=i, failed=i == 0) for i in range(20)]
    records += [gate("all10", rnd=i, failed=i != 3) for i in range(20)]  # 19 caught
    records += [gate("all5", rnd=i, failed=i < 10, low=0.06 if i < 5 else 0.01) for i in range(15)]
    records += [gate("one10", rnd=i, failed=True, cause="rank 1: compute") for i in range(2)]
    records += [gate("one10", rnd=2, exit=5, wall_s=7.0)]  # a run failed: no verdict
    records += [gate("same", rnd=i, failed=i < 2, job="large", wall_s=400.0) for i in range(4)]
    write(path, records)
    book = ledger.read_ledger(path)
    sel = ledger.select(book.gates, "none", SETTINGS, everything)
    assert len(sel.errors) == 1 and len(sel.gates) == len(records) - 1
    s = ledger.summary(book, sel, ["demo", "large"], list(ledger.VARIANTS), 20)
    rows = {(r["job"], r["measure"]): r for r in s["rows"]}

    def row(job: str, start: str) -> dict:
        return next(v for k, v in rows.items() if k[0] == job and k[1].startswith(start))

    assert row("demo", "identical")["result"] == "1 of 20" and row("demo", "identical")["met"]
    assert row("demo", "identical")["goal"] == "<= 1 of 20"
    assert row("demo", "every rank 10%")["met"] is True  # 19 of 20
    assert row("demo", "every rank 5%")["result"] == "10 of 15 (5 to run)"
    assert row("demo", "every rank 5%")["met"] is None  # 10 + 5 could still reach 15
    covered = row("demo", "... interval covers")
    assert covered["result"] == "10 of 15 (5 to run)" and covered["met"] is False  # < 18
    assert row("demo", "rank 1 10%")["result"] == "2 of 2 (18 to run)"
    assert row("demo", "... cause")["met"] is None
    assert row("demo", "gate wall time")["met"] is None  # rounds missing, none over 300 s
    assert row("large", "identical")["met"] is False  # 2 false failures: decided already
    assert s["cells"]["large/same"] == {"done": 4, "missing": 16, "failed": 2, "failure_rate": 0.5}
    assert s["cells"]["demo/one10"]["done"] == 2
    assert s["gates_missing"] == 5 + 18 + 16 + 3 * 20
    assert [e["exit"] for e in s["gates_ended_in_error"]] == [5]
    assert s["gates_from_other_gate_code"] == 0
    # the same ledger, read again, gives the same summary (nothing but the ledger in it)
    again = ledger.read_ledger(path)
    sel2 = ledger.select(again.gates, "none", SETTINGS, everything)
    assert ledger.summary(again, sel2, ["demo", "large"], list(ledger.VARIANTS), 20) == s


def test_a_damaged_line_is_one_warning_and_the_rest_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    write(path, [gate("same", rnd=0), gate("same", rnd=1)])
    text = path.read_text().splitlines()
    # a merge gone wrong in the middle, and a line cut short by a kill at the end
    path.write_text(text[0] + "\nnot json\n" + text[1] + "\n" + text[1][: len(text[1]) // 2])
    err = io.StringIO()
    book = ledger.read_ledger(path, warn=err)
    assert [g.round for g in book.gates] == [0, 1] and book.bad_lines == [2, 4]
    lines = err.getvalue().splitlines()
    assert len(lines) == 1 and "skipped 2 damaged line(s) (2, 4); kept 2 record(s)" in lines[0]
    # the next record starts on a line of its own: the cut one cannot swallow it
    ledger.append_record(path, gate("same", rnd=2))
    book = ledger.read_ledger(path, warn=io.StringIO())
    assert [g.round for g in book.gates] == [0, 1, 2] and book.bad_lines == [2, 4]


def test_merging_adds_only_the_records_not_held_and_since_drops_older_commits(
    tmp_path: Path,
) -> None:
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip
    parent = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=ROOT, capture_output=True,
                            text=True, check=True).stdout.strip()  # fmt: skip
    mine, theirs = tmp_path / "mine.jsonl", tmp_path / "theirs.jsonl"
    shared = gate("same", commit=parent)
    write(mine, [shared, gate("all10", commit=head)])
    write(theirs, [shared, gate("one10", commit=head), gate("all5", commit="f" * 40)])
    assert ledger.merge_into(mine, [theirs]) == 2
    assert ledger.merge_into(mine, [theirs]) == 0
    book = ledger.read_ledger(mine)
    assert sorted(g.variant for g in book.gates) == ["all10", "all5", "one10", "same"]
    since_head = ledger.Descends(head)
    sel = ledger.select(book.gates, "none", SETTINGS, since_head)
    assert sorted(g.variant for g in sel.gates) == ["all10", "one10"]
    assert sel.before_since == 2  # the parent's, and a commit this checkout does not know
    assert len(ledger.select(book.gates, "none", SETTINGS, ledger.Descends(parent)).gates) == 3
    with pytest.raises(ValueError, match="not a commit"):
        ledger.Descends("no-such-revision")


def test_a_recent_probe_in_the_ledger_is_reused() -> None:
    now = time.time()
    old = ProbeRecord("demo", "none", 100, 4.0, [4.0, 4.0], now - 7200, "", {})
    new = ProbeRecord("demo", "none", 100, 5.0, [5.0, 5.0], now - 600, "", {})
    loaded = ProbeRecord("demo", "changing", 100, 9.0, [9.0, 9.0], now - 60, "", {})
    probes = [old, new, loaded]
    assert ledger.fresh_probe(probes, "demo", "none", 100, 3600, now) is new
    assert ledger.fresh_probe(probes, "demo", "none", 100, 300, now) is None
    assert ledger.fresh_probe(probes, "demo", "none", 20, 3600, now) is None


def _calibration(tmp_path: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    command = [sys.executable, str(ROOT / "benchmarks" / "gate_calibration.py"), "--ab", *args]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL)  # fmt: skip


@pytest.mark.timeout(300)
def test_the_real_calibration_runs_only_what_its_ledger_lacks(tmp_path: Path) -> None:
    path, out = tmp_path / "ledger.jsonl", tmp_path / "summary.json"
    quick = argparse.Namespace(ab_args=[], steps=100, margin="5%", small_margin="1%",
                               size_tolerance=0.3)  # fmt: skip
    cal.quick_settings(quick)
    held = gate("same", settings=cal.settings_of(quick))  # the smoke run's first cell
    probe = ProbeRecord("demo", "none", 20, 5.0, [5.0] * cal.PROBE_RUNS, time.time(), "", {})
    write(path, [held, probe])
    with path.open("a") as f:
        f.write('{"kind": "gate", "job": "demo"\n')  # cut short
    done = _calibration(tmp_path, "--quick", "--ledger", str(path), "--output", str(out))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "damaged" in line]
    assert len(warnings) == 1 and "kept 2 record(s)" in warnings[0]
    assert "step 5.000 ms (probe of" in done.stdout  # the ledger's probe, no probe runs
    book = ledger.read_ledger(path, warn=io.StringIO())
    new = book.gates[1:]
    assert [(g.job, g.variant, g.round) for g in new] == [("demo", "one10", 0)]
    g = new[0]
    assert g.exit in (0, 3) and g.slow_ms == 0.5 and g.probe_step_ms == 5.0
    assert g.blocks == 2 and g.wall_s > 0 and g.verdict.startswith(("pass: ", "FAIL: "))
    assert g.provenance["git_commit"] and len(g.provenance["gate_code_sha256"]) == 16
    summary = json.loads(out.read_text())
    assert summary["gates_counted"] == 2 and summary["gates_missing"] == 0
    assert summary["cells"]["demo/same"]["done"] == summary["cells"]["demo/one10"]["done"] == 1
    assert [v for v in summary["variants"] if summary["variants"][v]] == ["same", "one10"]
    # run again: nothing is missing, so no gate runs and the summary is the same
    again = _calibration(tmp_path, "--quick", "--ledger", str(path), "--output", str(out))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stopped: every cell has its rounds" in again.stdout
    assert len(ledger.read_ledger(path, warn=io.StringIO()).gates) == 2
    # (what comes from the ledger: the checkout's commit and hashes may move meanwhile)
    from_ledger = ("cells", "rows", "variants", "gates_counted", "first_record", "last_record")
    rewritten = json.loads(out.read_text())
    assert {k: rewritten[k] for k in from_ledger} == {k: summary[k] for k in from_ledger}


def test_max_minutes_starts_no_gate_that_could_pass_it(tmp_path: Path) -> None:
    path, out = tmp_path / "ledger.jsonl", tmp_path / "summary.json"
    done = _calibration(tmp_path, "--jobs", "demo", "--max-minutes", "1", "--ledger", str(path),
                        "--output", str(out), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    # with no gate seen, one may take its budget (270 s) and 30 s more; a probe, 30 s more
    assert re.search(r"stopped: --max-minutes 1: the next gate could take (300|330) s and "
                     r"60 s are left", done.stdout), done.stdout  # fmt: skip
    assert not path.exists() or not path.read_text().strip()
    assert not out.exists()  # nothing to summarise
    # --summarize runs nothing and rewrites the summary; --rounds reaches the calibration
    write(path, [gate("same")])
    done = _calibration(tmp_path, "--summarize", "--rounds", "3", "--ledger", str(path),
                        "--output", str(out), timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["rounds"] == 3 and summary["gates_counted"] == 1
    assert summary["gates_missing"] == 2 * 4 * 3 - 1  # the whole protocol: demo and large
    # another ledger's summary goes beside it, never over benchmarks/results/'s
    beside = _calibration(tmp_path, "--summarize", "--ledger", str(path), timeout=120)
    assert beside.returncode == 0, beside.stderr[-3000:]
    assert json.loads((tmp_path / "ledger.summary.json").read_text())["gates_counted"] == 1
    # a second collector on the same ledger is refused, in one line
    with path.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        busy = _calibration(tmp_path, "--summarize", "--ledger", str(path), timeout=120)
    assert busy.returncode == 1
    assert busy.stderr.strip().splitlines() == [f"error: another calibration is writing {path}"]
    bad = _calibration(tmp_path, "--since", "no-such-revision", "--ledger", str(path),
                       "--summarize", timeout=120)  # fmt: skip
    assert bad.returncode == 1 and bad.stderr.strip().splitlines() == [
        "error: --since no-such-revision: not a commit of this checkout"
    ]


def test_max_minutes_expects_a_gate_from_the_slowest_block_seen(tmp_path: Path) -> None:
    path = tmp_path / "ledger.jsonl"
    args = argparse.Namespace(ab_args=[], steps=100, margin="5%", small_margin="1%",
                              since=None, probe_max_age=60.0, max_minutes=7.0, rounds=20,
                              size_tolerance=0.3,
                              variants=list(ledger.VARIANTS))  # fmt: skip

    def expected(records: list[GateRecord]) -> float:
        write(path, records)
        book = ledger.read_ledger(path)
        spin = cal.ChangingLoad(False, 0)
        c = cal.Collection(args, ["demo"], False, book, tmp_path, spin, ledger.Descends(None))
        return c.expected_gate_s("demo")

    assert expected([]) == 270 + 30  # no gate seen: the default budget bounds it
    # 20 blocks and the warm-up in 105 s: 5 s a block, 1.5x that for 21 blocks, and 15 s
    slow = dataclasses.replace(gate("same", wall_s=105.0), blocks=20, run_wall_s=2.4,
                               startup_s=1.1)  # fmt: skip
    assert expected([slow]) == pytest.approx(1.5 * 5.0 * 21 + 15)
    assert (
        expected([dataclasses.replace(slow, wall_s=250.0, blocks=8, id="longer")]) == 300
    )  # capped
    # a slowdown is sized from the last gate's baseline while it is recent
    recent = dataclasses.replace(slow, date=ledger.now_iso(), baseline_step_ms=2.5, id="now")
    write(path, [recent])
    book = ledger.read_ledger(path)
    c = cal.Collection(args, ["demo"], False, book, tmp_path, cal.ChangingLoad(False, 0),
                       ledger.Descends(None))  # fmt: skip
    assert c.step_ms("demo") == 2.5
    rows = ledger.job_rows(ledger.read_ledger(path).gates, "demo", 20)
    assert [r.result for r in rows if r.measure.startswith("one run")] == ["2.4 s, start-up 1.1 s"]
    assert c.expected_gate_s("demo") == 300


def test_a_concurrent_gate_sizes_its_slowdown_against_the_step_run_alone() -> None:
    """A --concurrent gate's baselines ran beside their candidates, at about twice their
    own step: its share is of the probe's step (run alone), not of that baseline's."""
    alone = dataclasses.replace(gate("all10"), baseline_step_ms=10.0)
    assert not alone.concurrent and alone.off_size()  # 0.5 ms of a 10 ms step: 5%
    together = dataclasses.replace(alone, settings={**SETTINGS, "ab_args": ["--concurrent"]})
    assert together.concurrent and not together.off_size()
    assert together.injected_measured == pytest.approx(0.10)
