"""``hvdprof ab``: the interleaved speed gate.

The statistics as pure functions (the signed-rank distribution against brute force, A/A
series pass at no more than the stated rate over every look, a 20% slowdown fails with
an interval that covers it, one wild block cannot flip the answer); pooling runs; then
``hvdprof ab`` on real 2-rank jobs of the demo (a candidate with rank 1's backward slowed
fails and names rank 1's compute; an identical candidate that starts 3 s later passes
and the start is said, not counted) and its bad input (a command that fails, one that
records nothing, a candidate that crashes in block 3: one line, exit 5, runs kept); a
block whose two runs saw the machine's other load change (a neighbour's spin loop in one
of them) is set aside and replaced.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from schema_support import assert_valid_output

from hvdprof.analysis.ab import (
    SequentialGate,
    block_orders,
    blocks_to_decide,
    hodges_lehmann,
    judge_pairs,
    look_schedule,
    signed_rank_cdf,
)
from hvdprof.analysis.pooling import pool_summaries
from hvdprof.analysis.summary import RunSummary, Series

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "benchmarks" / "gate_worker.py"
PY = sys.executable


def test_signed_rank_distribution_is_the_counted_one() -> None:
    for n in (1, 4, 7):
        sums = [sum(r for r, on in zip(range(1, n + 1), bits, strict=True) if on)
                for bits in itertools.product((0, 1), repeat=n)]  # fmt: skip
        counted = np.array([sum(s <= t for s in sums) for t in range(n * (n + 1) // 2 + 1)])
        assert np.allclose(signed_rank_cdf(n), counted / 2**n)


def test_hodges_lehmann_bounds_are_order_statistics_of_walsh_averages() -> None:
    x = [0.1, -0.2, 0.05, 0.3, 0.0, 0.12, -0.04, 0.2]
    low, mid, high = hodges_lehmann(x, 0.05)
    assert low < mid < high
    assert mid == pytest.approx(np.median([(a + b) / 2 for a, b in
                                           itertools.combinations_with_replacement(x, 2)]))  # fmt: skip
    # too few values to bound at this level: unbounded, never a made-up bound
    low2, _, high2 = hodges_lehmann([0.1, 0.2, 0.3], 0.05)
    assert low2 == -math.inf and high2 == math.inf


def test_a_a_series_fail_no_more_than_the_error_rate_over_all_looks() -> None:
    """1000 A/A gates of up to 20 blocks (noise 4% per block, some heavy tails): at 95%
    confidence and a 5% margin no more than 5% fail, looks included; at a 0% margin (the
    hardest case: the null's edge) still no more than 5%."""
    rng = np.random.default_rng(1)
    for margin in (0.05, 0.0):
        gate = SequentialGate(margin, 0.95)
        failed = 0
        for _ in range(1000):
            x = 0.04 * rng.standard_t(4, size=gate.max_blocks)
            for n in gate.looks:
                look = gate.judge(x[:n])
                if look.clear:
                    failed += look.failed
                    break
        assert failed <= 50, (margin, failed)


def test_a_twenty_percent_slowdown_fails_and_its_interval_covers_it() -> None:
    rng = np.random.default_rng(2)
    caught = covered = 0
    for _ in range(200):
        x = math.log(1.2) + 0.05 * rng.standard_normal(12)
        j = judge_pairs(x, 0.05, 0.01)
        caught += j.failed
        covered += j.low <= 0.2 <= j.high
        assert not j.passed
    assert caught >= 195 and covered >= 190  # 98% intervals


def test_one_wild_block_does_not_flip_the_answer() -> None:
    """A block 20x slower (a run descheduled for seconds) may leave the answer unclear;
    it never makes it the wrong one, and moves the estimate by one rank, not its size."""
    x = [0.01, -0.02, 0.0, 0.015, -0.01, 0.005, -0.005, 0.02, 0.0, 0.01]
    calm = judge_pairs(x, 0.05, 0.01)
    assert calm.passed
    wild = judge_pairs([*x[:-1], 3.0], 0.05, 0.01)
    assert not wild.failed and abs(wild.estimate - calm.estimate) < 0.01
    slow = [v + math.log(1.25) for v in x]
    assert judge_pairs(slow, 0.05, 0.01).failed
    assert not judge_pairs([*slow[:-1], -3.0], 0.05, 0.01).passed


def test_an_undecided_gate_says_about_how_many_blocks_would_decide_it() -> None:
    """The spread of 16 blocks as a noisy runner gives them (sd 0.13) around a 12%
    slowdown leaves a 5% margin undecided; the same blocks repeated to the number it
    names decide it, and to a third of that do not."""
    rng = np.random.default_rng(5)
    x = list(math.log(1.12) + 0.13 * rng.standard_normal(16))
    j = judge_pairs(x, 0.05, 0.01)
    assert not j.clear
    needed = blocks_to_decide(j)
    assert needed is not None and needed > 16
    repeat = math.ceil(1.2 * needed / len(x))
    assert judge_pairs(x * repeat, 0.05, 0.01).failed, (needed, repeat)
    fewer = max(1, needed // (3 * len(x)))
    assert not judge_pairs(x * fewer, 0.05, 0.01).clear, (needed, fewer)
    # the other side: a small change whose interval still reaches past the margin
    z = 0.13 * rng.standard_normal(16)
    y = list(z - z.mean() + math.log(1.01))
    jy = judge_pairs(y, 0.05, 0.01)
    assert not jy.clear and (m := blocks_to_decide(jy)) is not None
    assert judge_pairs(y * math.ceil(1.2 * m / 16), 0.05, 0.01).passed
    # nothing to say when it is clear, or when the estimate sits on the margin
    assert blocks_to_decide(judge_pairs([v + 0.5 for v in x], 0.05, 0.01)) is None
    spread = [0.02, 0.05, 0.08, 0.13, 0.2, 0.3]  # symmetric: its centre is the margin
    on = [math.log(1.05) + sign * v for v in spread for sign in (1, -1)]
    j_on = judge_pairs(on, 0.05, 0.01)
    assert abs(j_on.estimate - 0.05) < 1e-9 and blocks_to_decide(j_on) is None


def test_orders_are_balanced_and_looks_few() -> None:
    orders = block_orders(20, seed=3)
    for a, b in zip(orders[::2], orders[1::2], strict=True):
        assert a == (b[1], b[0])  # ABBA or BAAB in each pair of blocks
    assert {o[0] for o in orders} == {"baseline", "candidate"}
    assert block_orders(20, seed=3) == orders  # seeded: a CI rerun runs the same order
    looks = look_schedule(8, 20)
    assert looks[0] == 8 and looks[-1] == 20 and looks == sorted(set(looks))
    assert len(looks) <= 6
    # each look can bound the slowdown at its share of the error rate
    gate = SequentialGate(0.05)
    assert 2.0**-gate.min_blocks < gate.alpha_per_look


def _summary(step: float, compute: dict[int, float], steps: int = 10) -> RunSummary:
    rows = [[step] * len(compute) for _ in range(steps)]
    return RunSummary(
        format="hvdprof-summary",
        version=1,
        source="made-up",
        trace_format="hvdprof",
        ranks=sorted(compute),
        steps_in_run=steps + 1,
        step_ms=step,
        phase_ms={"idle": step},
        rank_ms={r: {"compute": c, "wait": step - c} for r, c in compute.items()},
        own_work_known=True,
        tensor_ms={"t": 1.0},
        one_time=[],
        series=Series(
            step=rows,
            phase={"idle": [step] * steps},
            work={r: [c] * steps for r, c in compute.items()},
        ),
    )


def test_pooled_runs_weigh_by_steps_and_join_the_series() -> None:
    a = _summary(10.0, {0: 8.0, 1: 8.0}, steps=10)
    b = _summary(12.0, {0: 8.0, 1: 10.0}, steps=30)
    pooled = pool_summaries([a, b], "both")
    assert len(pooled.series.step) == 40 and len(pooled.series.work[1]) == 40
    assert pooled.rank_ms[1]["compute"] == pytest.approx((8.0 * 10 + 10.0 * 30) / 40)
    assert pooled.step_ms == 12.0  # the median of the joined steps


# ------------------------------------------------------------------- real processes


def demo(slow_ms: float = 0.0, slow_rank: int = -1, steps: int = 30, before: str = "") -> str:
    """A shell command line: the demo job at 2 ranks, rank ``slow_rank``'s backward
    slower by ``slow_ms`` per step (-1: every rank)."""
    return (
        f"{before}{PY} -m hvdprof run -np 2 --timeout 60 -- {PY} {WORKER} "
        f"--slow-ms {slow_ms} --slow-rank {slow_rank} -- --steps {steps}"
    )


def ab(
    tmp_path: Path, *args: str, timeout: float = 240
) -> tuple[subprocess.CompletedProcess[str], dict]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    out = tmp_path / "result.json"
    command = [PY, "-m", "hvdprof", "ab", "--out", str(tmp_path / "runs"), "--json", str(out)]
    with subprocess.Popen(
        [*command, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        cwd=tmp_path, env=env, stdin=subprocess.DEVNULL,
    ) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.terminate()  # hvdprof ab stops the run under way, with its ranks
            stdout, stderr = proc.communicate(timeout=30)
            pytest.fail(f"hvdprof ab ran past {timeout} s:\n{stdout}\n{stderr}")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    data = json.loads(out.read_text()) if out.exists() else {}
    if data:  # every file it writes is valid under the published schema (docs/)
        assert_valid_output("ab", data)
    return done, data


def test_a_slower_rank_fails_the_gate_and_is_named(tmp_path: Path) -> None:
    done, data = ab(
        tmp_path,
        "--baseline", demo(),
        "--candidate", demo(slow_ms=15.0, slow_rank=1),
        "--min-blocks", "4", "--max-blocks", "4", "--warmup", "0", "--confidence", "0.9",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith("FAIL: ") and len(line.splitlines()) == 1
    assert "Cause: rank 1: compute" in line
    assert data["failed"] and data["cause"]["key"] == "rank 1: compute"
    j = data["judgement"]
    assert j["blocks"] == 4 and j["low"] > 0.05
    # a block whose two runs saw the machine's other load differ is set aside and run
    # again (a CI machine's load moves): its runs are kept, flagged, and not judged
    aside = data["set_aside_blocks"]
    judged = [r for r in data["runs"] if not r["set_aside"]]
    assert len(judged) == 8 and all(r["problem"] is None for r in data["runs"])
    assert len(data["runs"]) == 8 + 2 * len(aside)
    assert all(r["set_aside"] == (r["block"] in aside) for r in data["runs"])
    kept = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert kept[0] == "block-01-baseline" and len(kept) == len(data["runs"])
    last = f"block-{4 + len(aside):02d}-candidate"
    assert (tmp_path / "runs" / last / "summary.json").is_file()
    assert list((tmp_path / "runs" / last / "timeline").glob("rank.1.json*"))


def test_a_concurrent_gate_runs_both_sides_at_once_and_names_the_slower_rank(
    tmp_path: Path,
) -> None:
    """``--concurrent``: each block's two runs share the machine at the same time (the
    gate takes about as long as one side's runs, not both), and the slower rank is still
    caught and named."""
    done, data = ab(
        tmp_path,
        # steps long enough to overlap, about as long on both sides (the baseline's steps
        # are a third of the candidate's): the runs' start-up differs by a second or more
        "--baseline", demo(steps=900),
        "--candidate", demo(slow_ms=15.0, slow_rank=1, steps=300),
        "--concurrent",
        "--min-blocks", "4", "--max-blocks", "4", "--warmup", "0", "--confidence", "0.9",
    )  # fmt: skip
    assert done.returncode == 3, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith("FAIL: ") and "Cause: rank 1: compute" in line, line
    assert data["concurrent"] is True and data["judgement"]["blocks"] == 4
    runs, aside = data["runs"], data["set_aside_blocks"]
    # a block whose runs' steps hardly overlapped (one slower to start) is replaced
    assert len(runs) == 2 * (4 + len(aside)) and all(r["problem"] is None for r in runs)
    assert all(r["set_aside"] == (r["block"] in aside) for r in runs)
    assert not aside or "hardly overlapped" in done.stderr or "one started much later" in line
    # run one after the other, the gate would take at least the sum of its runs
    assert data["wall_s"] < 0.75 * sum(r["wall_s"] for r in runs), data["wall_s"]


def test_concurrent_runs_count_when_their_steps_overlap() -> None:
    from hvdprof.analysis.ab_runner import RunRecord, steps_overlap

    def run(side: str, span: tuple[float, float] | None) -> RunRecord:
        return RunRecord(side, 1, "", 0, 10.0, steps_unix_s=span)

    def pair(a: tuple[float, float] | None, b: tuple[float, float] | None) -> bool:
        return steps_overlap({"baseline": run("baseline", a), "candidate": run("candidate", b)})

    assert pair((100.0, 104.0), (100.5, 104.5))
    assert pair((100.0, 104.0), (101.0, 103.0))  # inside the other's
    assert pair((100.0, 104.0), (102.0, 106.0))  # half of the shorter
    assert not pair((100.0, 104.0), (103.0, 107.0))  # a quarter
    assert not pair((100.0, 104.0), (105.0, 109.0))  # one after the other
    assert pair((100.0, 104.0), None)  # not placed: nothing says they did not


def test_an_identical_candidate_that_starts_later_passes(tmp_path: Path) -> None:
    """The same job, the candidate 6 s slower to start: the step time is compared, so
    it passes, and the verdict says the start-up differed."""
    done, data = ab(
        tmp_path,
        "--baseline", demo(),
        "--candidate", demo(before="sleep 6 && "),
        "--min-blocks", "4", "--max-blocks", "4", "--warmup", "0", "--confidence", "0.9",
        # what is checked is that start-up is left out, not the gate's power: four blocks of
        # an identical job on a shared 2-core machine can differ by 10% (CI, quiet: failed)
        "--fail-on", "50%",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert line.startswith("pass: ") and len(line.splitlines()) == 1
    assert "only the step time is compared" in line
    starts = data["median_startup_s"]
    assert starts["candidate"] > starts["baseline"] + 4.0
    assert not data["failed"] and data["exit_code"] == 0


def test_a_candidate_that_crashes_in_block_3(tmp_path: Path) -> None:
    counter = tmp_path / "count"
    crash_third = (
        f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}; "
        f'if [ "$n" -ge 3 ]; then echo boom >&2; exit 7; fi; '
    )
    done, data = ab(
        tmp_path,
        "--baseline", demo(steps=20),
        "--candidate", crash_third + demo(steps=20),
        "--warmup", "0",
    )  # fmt: skip
    assert done.returncode == 5, done.stdout + done.stderr
    line = done.stdout.strip()
    assert len(line.splitlines()) == 1 and "Traceback" not in done.stderr
    assert "the candidate failed (exit code 7) in block 3" in line
    log = tmp_path / "runs" / "block-03-candidate" / "output.log"
    assert str(log) in line and "boom" in log.read_text()
    assert data["failed_run"]["block"] == 3 and data["stopped"] == "run_failed"
    # the runs before it are kept, with their summaries
    for side in ("baseline", "candidate"):
        for block in (1, 2):
            assert (tmp_path / "runs" / f"block-{block:02d}-{side}" / "summary.json").is_file()


SPIN = f"{PY} -c 'while True: pass'"


@pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="the machine's load is read from /proc/stat (Linux)"
)
def test_other_load_counts_a_neighbour_not_the_run() -> None:
    from hvdprof.analysis.machine_load import _tree_cpu_s, other_load_cores, snapshot

    neighbour_cores = 0.0

    def load_over(seconds: float, during: str) -> float:
        """Other load over ``seconds``: nothing started, a child spinning that is reaped
        before the second snapshot (the run's own), or one still spinning (a neighbour)."""
        nonlocal neighbour_cores
        before = snapshot()
        if during == "own":
            subprocess.run(
                [
                    PY,
                    "-c",
                    f"import time\nt = time.time()\nwhile time.time() - t < {seconds}: pass",
                ],
                check=True,
            )
        spin = [PY, "-c", "while True: pass"]
        neighbour = subprocess.Popen(spin) if during == "neighbour" else None
        if during != "own":
            time.sleep(seconds)
        after = snapshot()
        if neighbour is not None:
            neighbour_cores = _tree_cpu_s(neighbour.pid) / (after.wall_s - before.wall_s)
            neighbour.kill()
            neighbour.wait()
        load = other_load_cores(before, after)
        assert load is not None
        return load

    idle = load_over(1.0, "nothing")
    assert load_over(1.0, "own") - idle < 0.3  # the run's own CPU is not counted
    with_neighbour = load_over(1.0, "neighbour")
    # a neighbour's is: all the CPU it got (what it took from other processes, on a busy
    # machine, no longer counts for them) ...
    assert with_neighbour > neighbour_cores - 0.15, (with_neighbour, neighbour_cores)
    # ... which adds about a core to the reading where the machine had one spare (on a
    # saturated one, a CI neighbour or a loaded run of this suite, it takes a share of
    # the same cores and the reading stays: nothing to add)
    if os.cpu_count() - idle > 1.2:
        assert with_neighbour - idle > 0.6, (with_neighbour, idle)


@pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="the machine's load is read from /proc/stat (Linux)"
)
def test_load_over_a_window_leaves_out_the_runs_tree_and_other_times() -> None:
    """A run (its own session) spins in a child for its first second and sleeps for the
    next; a neighbour spins only in the second. Over the first second the other load is
    about nothing (the run's child is its own, reaped or not), over the second about a
    core; a window the samples do not enclose has no figure."""
    from hvdprof.analysis.machine_load import LoadSampler, _tree_cpu_s

    run = subprocess.Popen(
        f"{PY} -c 'import time\nt = time.time()\nwhile time.time() - t < 1.0: pass' & "
        "sleep 2.2; wait",
        shell=True,
        start_new_session=True,
    )
    sampler = LoadSampler(interval_s=0.1)
    t0 = time.time()
    sampler.start(run.pid)
    time.sleep(1.1)
    neighbour = subprocess.Popen([PY, "-c", "while True: pass"], start_new_session=True)
    started = time.time()
    time.sleep(1.0)
    neighbour_cores = _tree_cpu_s(neighbour.pid) / (time.time() - started)
    neighbour.kill()
    neighbour.wait()
    reaped = os.times()
    run.wait()  # the run's tree (its spinning child, reaped by the shell) comes to us
    after = os.times()
    run_cores = (after.children_user + after.children_system) - (
        reaped.children_user + reaped.children_system
    )  # over the child's 1 s of spinning
    sampler.stop()
    first = sampler.other_load_cores(t0 + 0.15, t0 + 0.85, min_span_s=0.0)
    second = sampler.other_load_cores(t0 + 1.3, t0 + 1.9, min_span_s=0.0)
    assert first is not None and second is not None
    # a core spun in each: the neighbour's counts, the run's own (counted, the two would
    # read alike) does not. On a machine already busy (a CI neighbour, this suite's loaded
    # runs) each takes only a share of the same cores, so each is checked against what
    # it got: the neighbour's all in the second window, the run's left out of the first.
    cores = os.cpu_count() or 1
    assert second.cores > neighbour_cores - 0.15, (second, neighbour_cores)
    assert first.cores < cores - run_cores + 0.15, (first, run_cores)
    if run_cores > 0.8:  # the run had a core to itself: the machine had one spare
        assert second.cores - first.cores > 0.6, (first, second)
    # the span is the samples' around the window, at least the window and within a sample
    # interval (and scheduling slack) of it each side
    assert 0.6 <= second.span_s <= 0.6 + 2 * 0.1 + 0.2, second
    assert sampler.other_load_cores(t0 - 5.0, t0 + 0.5) is None  # before the first sample
    assert sampler.other_load_cores(t0 + 1.0, time.time() + 5.0) is None  # after the last
    # a short window is widened to min_span_s within the samples: here, all of them
    whole = sampler.other_load_cores(t0 + 1.3, t0 + 1.4, min_span_s=60.0)
    spanned = sampler.other_load_cores(sampler.samples[0].unix_s, sampler.samples[-1].unix_s)
    assert whole is not None and whole == spanned
    # the span says what the figure covers: all the samples, not the 0.1 s asked for
    assert whole.span_s == pytest.approx(sampler.samples[-1].unix_s - sampler.samples[0].unix_s)


@pytest.mark.skipif(
    not os.path.exists("/proc/stat"), reason="the machine's load is read from /proc/stat (Linux)"
)
def test_a_block_whose_load_changed_is_set_aside(tmp_path: Path) -> None:
    """In its second run the candidate starts a neighbour: a spin loop orphaned at once
    (as another job's process: not of the run's tree), running while the steps do. That
    block is set aside, kept and said, and another runs in its place."""
    from hvdprof.analysis.machine_load import other_load_cores, snapshot

    before = snapshot()
    time.sleep(1.0)
    busy = other_load_cores(before, snapshot())
    if busy is not None and (os.cpu_count() or 1) - busy < 1.0:
        # the neighbour could only take a share of cores already busy, mostly from the
        # others: the run's other load would barely move, and rightly nothing is set aside
        pytest.skip(f"needs a spare core for the neighbour: {busy:.1f} cores already busy")
    counter, spinner = tmp_path / "count", tmp_path / "spinner.pid"
    candidate = (
        f"n=$(( $(cat {counter} 2>/dev/null || echo 0) + 1 )); echo $n > {counter}; "
        f'if [ "$n" -eq 2 ]; then ( {SPIN} & echo $! > {spinner} ); fi; '
        f'{demo(steps=20)}; rc=$?; if [ "$n" -eq 2 ]; then kill $(cat {spinner}); fi; exit $rc'
    )
    done, data = ab(
        tmp_path,
        "--baseline", demo(steps=20),
        "--candidate", candidate,
        "--min-blocks", "3", "--max-blocks", "3", "--warmup", "0", "--fail-on", "50%",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    line = done.stdout.strip()
    assert len(line.splitlines()) == 1 and line.startswith("pass: "), line
    # block 2 at least (a VM's steal time can move another block's load too)
    aside = data["set_aside_blocks"]
    assert 2 in aside and data["load_tolerance_cores"] == 0.25, line
    blocks = f"{len(aside)} block{'s' if len(aside) > 1 else ''} set aside"
    assert f"{blocks} ({', '.join(map(str, aside))}): the machine's other load changed" in line
    assert "block 2 set aside: the machine's other load (cores, while the steps ran)" in (
        done.stderr
    )
    assert len(data["log_ratios"]) == 3 and data["judgement"]["blocks"] == 3
    runs = {(r["block"], r["side"]): r for r in data["runs"]}
    physical = range(1, 4 + len(aside))
    assert sorted(runs) == [(b, s) for b in physical for s in ("baseline", "candidate")]
    assert all(r["set_aside"] == (r["block"] in aside) for r in runs.values())
    assert runs[2, "candidate"]["other_load_cores"] > runs[2, "baseline"]["other_load_cores"] + 0.25
    # measured over the steps (placed on the wall clock by the manifests), not the run
    assert all(0 < r["load_window_s"] < r["wall_s"] for r in runs.values()), runs
    assert (tmp_path / "runs" / "block-02-candidate" / "summary.json").is_file()  # kept


@pytest.mark.parametrize(
    ("baseline", "expected"),
    [
        ("exit 5", "the baseline failed (exit code 5) in the warm-up block"),
        ("true", "the baseline wrote no timeline"),
        (
            f"{PY} -c 'import os, signal; os.kill(os.getpid(), signal.SIGKILL)'",
            "the baseline failed (exit code 137: killed by SIGKILL)",
        ),
        ("sleep 30", "the baseline ran past the run timeout (2 s) and was killed"),
    ],
)
@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "concurrent"])
def test_a_baseline_that_cannot_be_measured_is_one_line_and_exit_5(
    tmp_path: Path, baseline: str, expected: str, together: bool
) -> None:
    """Run one after the other, the candidate never starts; run together (it fails too:
    it writes no timeline), the baseline, launched first, is the one reported."""
    done, data = ab(tmp_path, "--baseline", baseline, "--candidate", "true", "--seed", "1",
                    "--run-timeout", "2", *(["--concurrent"] if together else []),
                    timeout=60)  # fmt: skip
    assert done.returncode == 5, done.stdout + done.stderr
    assert expected in done.stdout and len(done.stdout.strip().splitlines()) == 1
    assert data["exit_code"] == 5 and data["failed_run"]["side"] == "baseline"
    assert (tmp_path / "runs" / "block-00-baseline" / "output.log").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--candidate", "true"], "no command for the baseline"),
        (["--command", "true", "--fail-on", "2ms"], "expected a share of the step time"),
        (["--command", "true", "--fail-on", "negotiate:5%"], "expected a share"),
        (["--command", "true", "--baseline-env", "NOPE"], "expected NAME=VALUE"),
        (["--command", "true", "--budget", "-3"], "expected seconds"),
        (["--command", "true", "--min-blocks", "9", "--max-blocks", "4"], "more than --max-blocks"),
        (["--command", "true", "--baseline-dir", "/nonexistent"], "not a directory"),
        (["--command", "true", "--load-tolerance", "-1"], "expected cores (e.g. 0.25) or 'off'"),
    ],
)
def test_usage_errors_are_one_line_and_exit_2(
    tmp_path: Path, args: list[str], expected: str
) -> None:
    done, _ = ab(tmp_path, *args, timeout=60)
    assert done.returncode == 2 and expected in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_a_used_output_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "keep").write_text("earlier gate")
    done, _ = ab(tmp_path, "--command", "true", timeout=60)
    assert done.returncode == 2 and "already exists and is not empty" in done.stderr


def test_a_cancel_while_the_load_sampler_starts_still_ends_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The SIGTERM can land in the sampler's first /proc scan, right after the run
    starts (a loaded CI runner did): the run is still killed, not left behind."""
    from hvdprof.analysis import ab_runner
    from hvdprof.analysis.machine_load import LoadSampler

    pid_file = tmp_path / "pid"
    started = LoadSampler.start

    def start_then_cancel(self: LoadSampler, root: int) -> None:
        started(self, root)
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        raise KeyboardInterrupt  # what the SIGTERM handler raises

    monkeypatch.setattr(LoadSampler, "start", start_then_cancel)
    side = ab_runner.Side("baseline", f"echo $$ > {pid_file}; exec sleep 300")
    with pytest.raises(KeyboardInterrupt):
        ab_runner.record_run(side, 1, str(tmp_path / "runs"), timeout_s=60)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_cancelled_gate_stops_the_run_under_way(tmp_path: Path) -> None:
    """A CI runner cancels with SIGTERM: ``ab`` ends (130) and leaves no run behind."""
    pid_file = tmp_path / "pid"
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    with subprocess.Popen(
        [PY, "-m", "hvdprof", "ab", "--out", str(tmp_path / "runs"),
         "--baseline", f"echo $$ > {pid_file}; exec sleep 300", "--candidate", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    ) as proc:  # fmt: skip
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize("together", [False, True], ids=["one-by-one", "concurrent"])
def test_a_stop_that_lands_while_a_run_starts_still_stops_that_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, together: bool
) -> None:
    """The SIGTERM lands just after the run's process is forked, before the gate has it on
    its list of runs to stop: it is held until the run is listed, then ends the gate and
    that run with it (raised at once, it left the run behind)."""
    from hvdprof.analysis import ab_runner

    forked: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def popen_then_cancel(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        forked.append(proc)
        if len(forked) == (2 if together else 1):
            os.kill(os.getpid(), signal.SIGTERM)  # its handler runs before this returns
        return proc

    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        ab_runner.stop_on_signals()
        monkeypatch.setattr(ab_runner.subprocess, "Popen", popen_then_cancel)
        sides = [ab_runner.Side(name, "exec sleep 300") for name in ab_runner.SIDES]
        with pytest.raises(KeyboardInterrupt):
            if together:
                ab_runner.record_together(sides, 1, str(tmp_path), 60.0)
            else:
                ab_runner.record_run(sides[0], 1, str(tmp_path), 60.0)
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    assert len(forked) == (2 if together else 1)
    for proc in forked:
        assert proc.returncode == -signal.SIGKILL or proc.returncode == -signal.SIGTERM
        with pytest.raises(ProcessLookupError):
            os.killpg(proc.pid, 0)


def test_a_cancelled_concurrent_gate_stops_both_runs(tmp_path: Path) -> None:
    """Both sides are under way when the SIGTERM comes: neither is left behind."""
    pids = [tmp_path / "pid-a", tmp_path / "pid-b"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    with subprocess.Popen(
        [PY, "-m", "hvdprof", "ab", "--out", str(tmp_path / "runs"), "--concurrent",
         "--baseline", f"echo $$ > {pids[0]}; exec sleep 300",
         "--candidate", f"echo $$ > {pids[1]}; exec sleep 300"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path,
    ) as proc:  # fmt: skip
        deadline = time.monotonic() + 60
        while not all(p.exists() and p.read_text().strip() for p in pids):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.terminate()
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr
    for p in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(p.read_text()), 0)
