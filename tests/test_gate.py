"""``hvdprof diff --fail-on`` and ``analyze --summary``: the CI gate.

The statistics on series with known noise (identical runs pass, a shift beyond the margin
fails, correlated noise is not mistaken for a shift); the summary against the trace it
was written from (the same diff, to the last digit, at a fraction of the size); the CLI's
exit codes and its answers to bad rules and damaged summaries; and real runs of the demo
job, one of them slowed in rank 1's backward pass.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import numpy as np
import pytest
from schema_support import assert_valid_output
from synthetic_runs import SyntheticSpec, write_synthetic_run

from hvdprof.analysis import diff_runs, load_run
from hvdprof.analysis.gate import RuleError, check_gate, parse_rule
from hvdprof.analysis.summary import (
    RunSummary,
    Series,
    SummaryError,
    read_summary,
    summarize,
    write_summary,
)

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "benchmarks" / "gate_worker.py"


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    return subprocess.run(
        [sys.executable, "-m", "hvdprof", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def made_up(step: np.ndarray, work: dict[int, np.ndarray] | None = None) -> RunSummary:
    """A summary holding only the series the gate reads (steps x ranks)."""
    work = work or {}
    return RunSummary(
        format="hvdprof-summary",
        version=1,
        source="made-up",
        trace_format="hvdprof",
        ranks=list(range(step.shape[1])),
        steps_in_run=len(step) + 1,
        step_ms=float(np.median(step)),
        phase_ms={},
        rank_ms={},
        own_work_known=bool(work),
        tensor_ms={},
        one_time=[],
        series=Series(
            step=step.tolist(),
            phase={"negotiate": step.mean(axis=1).tolist()},
            work={r: w.tolist() for r, w in work.items()},
        ),
    )


def noisy_steps(rng: np.random.Generator, n: int, ms: float, ranks: int = 2) -> np.ndarray:
    """Steps of ``ms`` with a busy machine's noise: 3% jitter, a slow spell of correlated
    steps, and rare descheduled steps 3x as long."""
    base = ms * (1.0 + 0.03 * rng.standard_normal(n))
    k = min(8, n)
    spell = np.convolve(rng.standard_normal(n), np.ones(k) / k, mode="same") * 0.04 * ms
    spikes = np.where(rng.random(n) < 0.03, 2.0 * ms, 0.0)
    step = base + spell + spikes
    return np.column_stack([step * (1.0 + 0.01 * rng.standard_normal(n)) for _ in range(ranks)])


# --- rules ----------------------------------------------------------------------------------


def test_rules_read_and_bad_ones_named() -> None:
    r = parse_rule("5%")
    assert (r.what, r.margin, r.relative, r.rank) == ("step", 0.05, True, None)
    r = parse_rule(" negotiate : 10% ")
    assert (r.what, r.margin, r.relative) == ("negotiate", 0.10, True)
    r = parse_rule("rank1:2.5ms")
    assert (r.what, r.rank, r.margin, r.relative) == ("rank", 1, 2.5, False)
    assert parse_rule("rank:5%").rank is None
    for bad, words in {
        "5": "expected a margin",
        "five%": "expected a margin",
        "backward:5%": "not a phase",
        "negotiate3:5%": "only 'rank' takes a number",
        "": "expected a margin",
    }.items():
        with pytest.raises(RuleError, match=words):
            parse_rule(bad)


# --- statistics -----------------------------------------------------------------------------


def test_identical_runs_pass_and_a_shift_beyond_the_margin_fails() -> None:
    false_fails, caught, small = 0, 0, 0
    rule = parse_rule("5%")
    for seed in range(20):
        rng = np.random.default_rng(seed)
        a = made_up(noisy_steps(rng, 150, 10.0))
        same = made_up(noisy_steps(rng, 150, 10.0))
        slower = made_up(noisy_steps(rng, 150, 11.0))  # +10%
        slightly = made_up(noisy_steps(rng, 150, 10.3))  # +3%: within the margin
        false_fails += check_gate(a, same, rule).failed
        caught += check_gate(a, slower, rule).failed
        small += check_gate(a, slightly, rule).failed
    assert false_fails <= 1, false_fails
    assert caught >= 19, caught
    assert small <= 1, small


def test_the_block_bootstrap_sees_correlated_noise() -> None:
    """A slow spell of 30 steps in B alone is what a busy runner does; independent
    resampling would call it a shift far more often than block resampling does."""
    rule = parse_rule("5%")
    fails = 0
    for seed in range(30):
        rng = np.random.default_rng(100 + seed)
        a = noisy_steps(rng, 150, 10.0)
        b = noisy_steps(rng, 150, 10.0)
        start = int(rng.integers(0, 120))
        b[start : start + 30] *= 1.12  # a spell: 20% of the steps, 12% slower
        fails += check_gate(made_up(a), made_up(b), rule).failed
    assert fails <= 3, fails


def test_blocks_grow_with_the_reach_of_the_dependence() -> None:
    from hvdprof.analysis.gate import block_length

    rng = np.random.default_rng(2)
    iid = rng.standard_normal(150)
    ar = np.zeros(150)
    for i in range(1, 150):  # each step carries 90% of the last one's excess
        ar[i] = 0.9 * ar[i - 1] + rng.standard_normal()
    drift = np.repeat(rng.standard_normal(5), 30) + 0.3 * rng.standard_normal(150)
    floor = round(150 ** (1 / 3))
    assert block_length(iid) == floor
    assert block_length(ar) > 2 * floor and block_length(drift) > 2 * floor
    assert block_length(np.full(150, 3.0)) == floor  # no variance: nothing to size
    assert block_length(np.arange(6.0)) == 2  # too short to estimate: n^(1/3)


def test_absolute_margins_and_the_interval_reported() -> None:
    rng = np.random.default_rng(5)
    a, b = noisy_steps(rng, 200, 10.0), noisy_steps(rng, 200, 12.0)
    g = check_gate(made_up(a), made_up(b), parse_rule("1ms"))
    c = g.checks[0]
    assert g.failed and c.low > 1.0 and c.low <= c.change <= c.high
    assert c.change == pytest.approx(np.median(b) - np.median(a))
    assert "FAIL 1ms: median step time" in g.message and "ms per step" in g.message
    g = check_gate(made_up(a), made_up(b), parse_rule("3ms"))
    assert not g.failed and g.message.startswith("pass 3ms")


def test_a_rank_rule_names_the_rank_and_splits_the_confidence() -> None:
    rng = np.random.default_rng(9)
    steps = noisy_steps(rng, 150, 10.0, ranks=4)
    work_a = {r: steps[:, r] * 0.8 for r in range(4)}
    work_b = {r: noisy_steps(rng, 150, 10.0, ranks=1)[:, 0] * 0.8 for r in range(4)}
    work_b[2] = work_b[2] * 1.25
    a, b = made_up(steps, work_a), made_up(steps, work_b)
    g = check_gate(a, b, parse_rule("rank:5%"))
    assert g.failed and [c.name for c in g.checks if c.failed] == ["rank 2 own work"]
    assert "split over the ranks" in g.message and "rank 2 own work" in g.message
    assert not check_gate(a, b, parse_rule("rank1:5%")).failed
    # no own-work series (a Horovod file): the rule cannot look, and says so
    g = check_gate(made_up(steps), made_up(steps), parse_rule("rank:5%"))  # no work series
    assert g.failed and "cannot be judged" in g.message and "submission stamps" in g.message


def test_too_few_steps_fail_with_a_reason() -> None:
    rng = np.random.default_rng(1)
    a, b = made_up(noisy_steps(rng, 6, 10.0)), made_up(noisy_steps(rng, 6, 10.0))
    g = check_gate(a, b, parse_rule("5%"))
    assert g.failed and "too few steps" in g.message


# --- summaries ------------------------------------------------------------------------------


def synth(tmp_path: Path, name: str, **kw: object) -> Path:
    directory = tmp_path / name
    write_synthetic_run(str(directory), SyntheticSpec(**kw))  # type: ignore[arg-type]
    return directory


def test_a_summary_gives_the_traces_diff_to_the_digit(tmp_path: Path) -> None:
    a = synth(tmp_path, "a", steps=40)
    b = synth(tmp_path, "b", steps=40, step_us=24_000.0, late_rank=1, late_us=4000.0)
    run_a, run_b = load_run(str(a), cache=False), load_run(str(b), cache=False)
    path = tmp_path / "a.json"
    size = write_summary(summarize(run_a), str(path))
    trace = sum(f.stat().st_size for f in a.glob("rank.*.json"))
    assert size == path.stat().st_size and size < 0.01 * trace, (size, trace)
    back = read_summary(str(path))
    assert back is not None and back.path == str(path)
    from_trace, from_file = diff_runs(run_a, run_b), diff_runs(back, run_b)
    assert from_file.verdict == from_trace.verdict and "rank 1" in from_trace.verdict
    assert [r.to_dict() for r in from_file.rows] == [r.to_dict() for r in from_trace.rows]
    for rule in ("5%", "negotiate:10%", "rank:5%", "rank1:1ms"):
        ga = check_gate(summarize(run_a), summarize(run_b), parse_rule(rule))
        gb = check_gate(back, summarize(run_b), parse_rule(rule))
        assert ga.to_dict() == gb.to_dict()
        assert ga.failed, ga.message  # rank 1 works 4 ms longer: 20 -> 24 ms steps
    assert read_summary(str(a)) is None  # a directory is a run, not a summary
    assert read_summary(str(a / "rank.0.json")) is None  # a trace is a run too


def test_damaged_summaries_are_refused_by_name(tmp_path: Path) -> None:
    run = load_run(str(synth(tmp_path, "a", steps=20)), cache=False)
    good = tmp_path / "good.json"
    write_summary(summarize(run), str(good))
    data = good.read_bytes()
    cut = tmp_path / "cut.json"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(SummaryError, match=r"cut\.json: not a whole summary"):
        read_summary(str(cut))
    doc = json.loads(data)
    doc["version"] = 99
    (tmp_path / "v99.json").write_text(json.dumps(doc))
    with pytest.raises(SummaryError, match=r"v99\.json: summary version 99"):
        read_summary(str(tmp_path / "v99.json"))
    doc["version"] = 1
    doc["series"]["step"] = "fast"
    (tmp_path / "typed.json").write_text(json.dumps(doc))
    with pytest.raises(SummaryError, match=r"typed\.json: not a valid summary.*series\.step"):
        read_summary(str(tmp_path / "typed.json"))
    doc["series"]["step"] = [[1.0, 2.0], [1.0]]  # a rank missing from one step
    (tmp_path / "ragged.json").write_text(json.dumps(doc))
    with pytest.raises(SummaryError, match=r"ragged\.json: .*one per rank in every step"):
        read_summary(str(tmp_path / "ragged.json"))
    doc["series"]["step"] = [[1.0, -2.0]]
    (tmp_path / "negative.json").write_text(json.dumps(doc))
    with pytest.raises(SummaryError, match=r"negative\.json: .*negative or non-finite"):
        read_summary(str(tmp_path / "negative.json"))


def test_cli_gate_exit_codes_and_messages(tmp_path: Path) -> None:
    a = synth(tmp_path, "a", steps=40)
    b = synth(tmp_path, "b", steps=40, step_us=24_000.0, late_rank=1, late_us=4000.0)
    base = tmp_path / "base.json"
    done = cli("analyze", str(a), "--summary", str(base), "--no-cache")
    assert done.returncode == 0, done.stderr
    assert "summary written to" in done.stdout and base.exists()
    same = cli("diff", str(base), str(a), "--fail-on", "5%", "--no-cache")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "pass 5%: median step time" in same.stdout
    worse = cli("diff", str(base), str(b), "--fail-on", "5%", "--fail-on", "rank:5%")
    assert worse.returncode == 3, worse.stdout + worse.stderr
    text = " ".join(worse.stdout.split())
    assert "FAIL 5%: median step time" in text and "FAIL rank:5%: rank 1 own work" in text
    assert "Where it came from: rank 1: compute" in text
    js = cli("diff", str(base), str(b), "--fail-on", "negotiate:10%", "--json")
    data = json.loads(js.stdout)
    assert_valid_output("diff", data)
    assert js.returncode == (3 if data["gate"][0]["failed"] else 0)
    assert data["gate"][0]["rule"] == "negotiate:10%" and data["gate"][0]["checks"]
    # usage errors: exit 2 with one line saying what is wrong, before any file is read
    bad = cli("diff", str(base), str(b), "--fail-on", "backward:5%")
    assert bad.returncode == 2 and "not a phase" in bad.stderr and "Traceback" not in bad.stderr
    bad = cli("diff", str(base), str(b), "--fail-on", "5%", "--confidence", "3")
    assert bad.returncode == 2 and "--confidence" in bad.stderr
    (tmp_path / "cut.json").write_bytes(base.read_bytes()[:300])
    bad = cli("diff", str(tmp_path / "cut.json"), str(b), "--fail-on", "5%")
    assert bad.returncode == 2 and "cut.json: not a whole summary" in bad.stderr
    assert "Traceback" not in bad.stderr


# --- real runs ------------------------------------------------------------------------------


def record(out: Path, slow_ms: float = 0.0, steps: int = 60) -> None:
    done = subprocess.run(
        [
            sys.executable, "-m", "hvdprof", "run", "-np", "2", "--timeout", "120",
            "--timeline", str(out), "--", sys.executable, str(WORKER),
            "--slow-ms", str(slow_ms), "--slow-rank", "1", "--", "--steps", str(steps),
        ],
        capture_output=True, text=True, timeout=180, cwd=REPO, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


@pytest.mark.timeout(400)
def test_real_runs_a_slowed_backward_fails_the_gate_and_is_named(tmp_path: Path) -> None:
    """The demo job twice, the second with rank 1's backward 20 ms slower per step (a few
    times its step): the gate fails and names rank 1's compute; a run against its own
    summary passes, and the summary is a small part of the traces (2% of a 60-step demo
    trace: per-step series, where the trace holds every op; under 1% before gradients went
    out in buckets, 2 ops a step)."""
    a, slow = tmp_path / "a", tmp_path / "slow"
    record(a)
    record(slow, slow_ms=20.0)
    base = tmp_path / "a.json"
    done = cli("analyze", str(a), "--summary", str(base), "--json")
    assert done.returncode == 0, done.stderr
    trace = sum(f.stat().st_size for f in a.glob("rank.*.json"))
    assert base.stat().st_size < 0.05 * trace, (base.stat().st_size, trace)
    itself = cli("diff", str(base), str(a), "--fail-on", "5%", "--fail-on", "rank:5%", "--json")
    data = json.loads(itself.stdout)
    assert itself.returncode == 0 and not any(g["failed"] for g in data["gate"]), data["gate"]
    rules = ("--fail-on", "5%", "--fail-on", "rank:5%")
    worse = cli("diff", str(base), str(slow), *rules, "--json")
    data = json.loads(worse.stdout)
    assert_valid_output("diff", data)
    assert worse.returncode == 3, data["gate"]
    assert data["cause"]["key"] == "rank 1: compute", data["verdict"]
    # rank 1's own work grew most (rank 0's may grow too: on 2 cores rank 1's busy wait
    # takes CPU from it, and a loaded full suite saw it pass +5% as well)
    checks = {c["name"]: c for c in data["gate"][1]["checks"]}
    assert checks["rank 1 own work"]["failed"], checks
    assert checks["rank 1 own work"]["change"] > checks["rank 0 own work"]["change"], checks
    trace_diff = json.loads(cli("diff", str(a), str(slow), *rules, "--json").stdout)
    assert trace_diff["verdict"] == data["verdict"] and trace_diff["gate"] == data["gate"]
    assert msgspec.json.decode(base.read_bytes())["format"] == "hvdprof-summary"


def test_diff_two_slow_ranks_are_both_causes_never_effects() -> None:
    """Ranks 2 and 3 both compute 10 ms more per step; rank 3 also waits 2 ms more for
    rank 2 (noise between two slow ranks). Rank 3 is a cause as well, not an effect of
    rank 2; ranks 0 and 1, whose own work did not grow, are the effects."""
    from hvdprof.analysis.diff import diff_summaries
    from hvdprof.analysis.summary import RunSummary, Series

    def run(name: str, slow: float, extra_wait: float) -> RunSummary:
        ranks = {
            r: {
                "compute": 20.0 + (slow if r in (2, 3) else 0.0),
                "wait": (slow if r in (0, 1) else 0.0) + (extra_wait if r == 3 else 0.0),
            }
            for r in range(4)
        }
        return RunSummary(
            format="hvdprof-summary", version=1, source=name, trace_format="hvdprof",
            ranks=[0, 1, 2, 3], steps_in_run=50, step_ms=25.0 + slow,
            phase_ms={"idle": 20.0 + slow}, rank_ms=ranks, own_work_known=True,
            tensor_ms={}, one_time=[], series=Series(),
        )  # fmt: skip

    d = diff_summaries(run("a", 0.0, 0.0), run("b", 10.0, 2.0))
    assert d.cause is not None and d.cause.key in ("rank 2: compute", "rank 3: compute")
    assert sorted(r.key for r in d.effects) == ["rank 0", "rank 1"], d.verdict
    assert "(also rank " in d.verdict, d.verdict


def test_runs_recorded_far_apart_are_said_to_be_weak_evidence(tmp_path: Path) -> None:
    """issue 50: the same job's median step moved 2.5x between two hours on this machine,
    so diff says when A and B started far apart; a damaged start time is refused."""
    from synthetic_runs import START_UNIX_NS

    from hvdprof.analysis.diff import diff_summaries

    a = synth(tmp_path, "a", steps=30)
    b = synth(tmp_path, "b", steps=30, step_us=24_000.0)
    sa, sb = summarize(load_run(str(a), cache=False)), summarize(load_run(str(b), cache=False))
    assert sa.recorded_unix_s == START_UNIX_NS // 10**9  # from the manifests
    assert "recorded" not in (diff_summaries(sa, sb).verdict or "")  # the same moment
    soon = msgspec.structs.replace(sb, recorded_unix_s=sa.recorded_unix_s + 300)
    assert "recorded" not in (diff_summaries(sa, soon).verdict or "")  # 5 minutes apart
    unknown = msgspec.structs.replace(sb, recorded_unix_s=None)  # (a Horovod trace)
    assert "recorded" not in (diff_summaries(sa, unknown).verdict or "")
    later = msgspec.structs.replace(sb, recorded_unix_s=sa.recorded_unix_s + 3 * 3600)
    verdict = diff_summaries(sa, later).verdict or ""
    assert "B was recorded 3 hours after A" in verdict and "weak evidence" in verdict
    # the same through files and the CLI, with the gate
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    write_summary(sa, str(pa))
    write_summary(
        msgspec.structs.replace(sb, recorded_unix_s=sa.recorded_unix_s - 2 * 86400), str(pb)
    )
    out = cli("diff", str(pa), str(pb), "--fail-on", "5%")
    assert out.returncode == 3, out.stdout + out.stderr  # 20 -> 24 ms: the gate fails
    assert "B was recorded 2 days before A" in " ".join(out.stdout.split()), out.stdout
    doc = json.loads(pb.read_text())
    doc["recorded_unix_s"] = -5
    pb.write_text(json.dumps(doc))
    out = cli("diff", str(pa), str(pb))
    assert out.returncode == 2 and "`$.recorded_unix_s` is -5" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_cost_in_a_quarter_of_the_steps_is_slower_though_the_median_is_not() -> None:
    """A rank 40 ms late in a quarter of the steps leaves the median step where it was
    (a loaded CI run: 9.92 -> 9.17 ms, "B is not slower"); the mean shows the cost, and
    the cause is named."""
    from hvdprof.analysis.diff import diff_summaries

    rng = np.random.default_rng(7)
    a_steps = noisy_steps(rng, 200, 10.0)
    b_steps = noisy_steps(rng, 200, 9.0)  # the machine a little faster for B...
    slow = rng.permutation(200)[:50]
    b_steps[slow] += 40.0  # ...and rank 1 40 ms late in a quarter of B's steps
    a = msgspec.structs.replace(
        made_up(a_steps), rank_ms={0: {"compute": 5.0}, 1: {"compute": 5.0}}
    )
    b = msgspec.structs.replace(
        made_up(b_steps), rank_ms={0: {"compute": 4.5}, 1: {"compute": 14.5}}
    )
    assert b.step_ms < a.step_ms  # the median does not see it
    d = diff_summaries(a, b)
    assert d.cause is not None and d.cause.key == "rank 1: compute", d.verdict
    assert "The mean step grew, though:" in (d.verdict or ""), d.verdict
    # identical runs: neither the median nor the mean grew, no cause
    same = diff_summaries(a, msgspec.structs.replace(b, series=a.series, step_ms=a.step_ms))
    assert same.cause is None and "mean step grew" not in (same.verdict or ""), same.verdict
