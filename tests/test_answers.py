"""Answers checked against ground truth: real jobs with a known fault, and the verdicts.

Each scenario trains a small MLP (``workers/answers_worker.py``) at 2 to 8 ranks with the
timeline on; one rank (or several: a slow host) spends a known delay more per step in data
loading, in forward or in backward (a hook on a gradient), in every step or in a seeded
share of them, from the start or from a known step on. Rank 0 writes its measured step
times and the steps it slowed, every rank its own data + forward + backward + optimizer
step times. The ground truth of a fault's cost is ``d``, the injected delay per step as
slept (averaged over the steps judged, for an intermittent fault), ``delta``, the
step-time change it caused (against the balanced twin at the same size, model and
backend, or before the onset in the same run), and, for a fault from the start, the slow
ranks' own-work excess by the worker's clocks (:func:`own_excess_ms`); the verdict's cost
must lie within a quarter of the lowest and the highest of them (two fifths below the
lowest beside the spin loops: :data:`LOW_SHARE`). A small fault that a
busy machine hid (its excess below half as much again as the verdict's materiality
rule) may be answered "No straggler", pointing at the slow rank.

Every scenario runs twice: on a quiet machine and beside busy processes (one Python spin
loop per core at normal priority, as a test suite or another job on a shared box), and the
verdicts must hold in both. Balanced twins must name no one, unless the worker's own
measurements show that the named rank's code really was slower than the others', by a
material part of the cost named (a starved rank is then a true answer, not a false alarm). The tests never assert how long
anything took.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from conftest import JobResult, run_job
from launch_support import run_mpi

from hvdprof.analysis import diff_runs, find_stragglers, load_run
from hvdprof.analysis.stragglers import MIN_COST_MS, MIN_STEP_SHARE, Stragglers
from hvdprof.common import activities as act

pytestmark = pytest.mark.timeout(900)

DELAY_MS = 100.0
STEPS = 20
MID_RUN_STEPS, ONSET = 24, 8
TINY = ("--width", "64", "--layers", "4", "--batch", "16")


@dataclass(frozen=True)
class Scenario:
    ranks: int
    slow: tuple[int, ...] = ()
    where: str = "data"
    onset: int = 0
    steps: int = STEPS
    backend: str = ""  # HVDPROF_BACKEND ("" = auto: shared memory on one host)
    mpi: bool = False  # under mpirun (negotiation over MPI) instead of hvdprof run
    delay_ms: float = DELAY_MS
    fraction: float = 1.0  # share of the steps slowed (seeded: the same on every run)
    tiny: bool = False  # a tiny model: a short step
    hosts: str = ""  # HVDPROF_HOSTNAME, one name per rank


SCENARIOS: dict[str, Scenario] = {
    "balanced-2": Scenario(2),
    "balanced-2-again": Scenario(2),
    # the intermittent fault's twin: as many steps, so a loaded machine's slow minutes
    # average out in both (a 20-step twin measured 13.7 ms against the faulty run's
    # 13.2 ms on one loaded CI run, and diff rightly said B was not slower)
    "balanced-2-long": Scenario(2, steps=200),
    "balanced-2-tiny": Scenario(2, steps=500, tiny=True),
    "balanced-3-gloo": Scenario(3, backend="gloo"),
    "balanced-4-hosts": Scenario(4, hosts="a,a,b,b"),
    "balanced-8-tiny": Scenario(8, tiny=True),
    # under mpirun at Open MPI's defaults: the cycle's wait for its peers once spun on a
    # core the training needed, and the rank that lost more of it was named (issue 47)
    "balanced-2-mpi": Scenario(2, mpi=True),
    "balanced-2-mpi-tiny": Scenario(2, steps=500, tiny=True, mpi=True),
    # negotiation over the TCP star, allreduce through shared memory
    "data-2": Scenario(2, slow=(1,), where="data"),
    # negotiation over the TCP star, collectives through Gloo
    "forward-3-gloo": Scenario(3, slow=(2,), where="forward", backend="gloo"),
    # a small fault on a short step
    "data-2-tiny-3ms": Scenario(2, slow=(1,), steps=500, tiny=True, delay_ms=3.0),
    # a rank slow in a quarter of the steps, 40 ms each time
    "intermittent-2": Scenario(2, slow=(1,), steps=200, delay_ms=40.0, fraction=0.25),
    # two slow ranks: the two ranks of host b
    "two-slow-4-hosts": Scenario(4, slow=(2, 3), delay_ms=30.0, hosts="a,a,b,b"),
    # one slow rank of 8 (a tiny model: 8 processes share 2 cores)
    "data-8-tiny": Scenario(8, slow=(5,), delay_ms=40.0, tiny=True),
    # faults from step ONSET on: their ground truth is the run's own steps before it
    "backward-4-mid-run": Scenario(
        4, slow=(1,), where="backward", onset=ONSET, steps=MID_RUN_STEPS
    ),
    # negotiation and collectives over MPI (no MPI baseline: the rank and phase are checked)
    "backward-2-mpi": Scenario(2, slow=(1,), where="backward", mpi=True),
}
BALANCED = [name for name, sc in SCENARIOS.items() if not sc.slow]
PHASE = {
    "data": "before_first_gradient",
    "forward": "before_first_gradient",
    "backward": "backward",
}


@dataclass
class Outcome:
    timeline: Path
    step_ms: list[float]  # rank 0's measured step times (ground truth)
    slow_steps: list[int]  # the steps the fault slowed
    own_ms: list[float]  # per rank, mean of its data + forward + backward + optimizer step
    own_steps_ms: np.ndarray  # the same per rank and step (ranks x steps, the warm-up left out)
    slept_ms: list[float]  # per step, the most any slow rank slept (the delay injected)


@pytest.fixture(scope="module", params=["quiet", "loaded"])
def load(request: pytest.FixtureRequest) -> Iterator[str]:
    """ "loaded": one Python spin loop per core, at normal priority, beside every job."""
    spinners: list[subprocess.Popen[bytes]] = []
    if request.param == "loaded":
        for _ in range(os.cpu_count() or 1):
            spinners.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
    try:
        yield request.param
    finally:
        for p in spinners:
            p.kill()
        for p in spinners:
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def scenario(tmp_path_factory: pytest.TempPathFactory, load: str):
    """``scenario(name)``: run it once per module and load, return its ground truth."""
    done: dict[str, Outcome] = {}

    def get(name: str) -> Outcome:
        if name in done:
            return done[name]
        sc = SCENARIOS[name]
        base = tmp_path_factory.mktemp(f"{name}-{load}")
        tl, out = base / "tl", base / "steps.json"
        args = ["--steps", str(sc.steps), "--out", str(out), *(TINY if sc.tiny else ())]
        if sc.slow:
            args += ["--slow-rank", ",".join(map(str, sc.slow)), "--delay-ms", str(sc.delay_ms)]
            args += ["--where", sc.where, "--onset", str(sc.onset)]
            args += ["--fraction", str(sc.fraction), "--seed", "3"]
        env = {"HVDPROF_BACKEND": sc.backend} if sc.backend else {}
        if sc.hosts:
            env["HVDPROF_HOSTNAME"] = sc.hosts
        job: JobResult
        if sc.mpi:
            # Open MPI's defaults, as a user runs (no mpi_yield_when_idle)
            env = {"HVDPROF_BACKEND": "mpi", "HVDPROF_TIMELINE": str(tl)}
            job = run_mpi("answers_worker.py", sc.ranks, *args, env=env, timeout=300)
        else:
            job = run_job(
                "answers_worker.py",
                sc.ranks,
                *args,
                env=env,
                timeout=300,
                launcher_args=("--timeline", str(tl)),
            )
        job.assert_section("train", sc.ranks)
        job.assert_done(sc.ranks)
        truth = json.loads(out.read_text())
        own, slept = [], np.zeros(sc.steps)
        for r in range(sc.ranks):
            mine = json.loads(Path(f"{out}.rank{r}").read_text())
            own.append([sum(x[:4]) for x in mine["phases_ms"][1:]])
            slept = np.maximum(slept, mine["slept_ms"])
        steps = np.array(own, dtype=float)
        done[name] = Outcome(
            tl,
            truth["step_ms"],
            truth["slow_steps"],
            steps.mean(axis=1).tolist(),
            steps,
            slept.tolist(),
        )
        return done[name]

    return get


def baseline_of(sc: Scenario) -> str:
    """The balanced run at the same size, model, hosts, backend and length."""
    return next(
        name
        for name, b in SCENARIOS.items()
        if not b.slow
        and (b.ranks, b.backend, b.mpi, b.tiny, b.hosts, b.steps)
        == (sc.ranks, sc.backend, sc.mpi, sc.tiny, sc.hosts, sc.steps)
    )


def mean_step(
    steps: list[float], lo: int = 1, hi: int | None = None, *, every: bool = True
) -> float:
    """Typical step time, leaving out the warm-up step (and one step each side of a cut):
    the median when a fault slows every step (a loaded machine's few long steps would
    swamp a small fault's change), the mean when it slows only some."""
    return float(np.median(steps[lo:hi]) if every else np.mean(steps[lo:hi]))


def injected_ms(sc: Scenario, run: Outcome, s: Stragglers) -> float:
    """The delay injected per step (as slept: a 3 ms sleep takes 3.5 on a busy machine),
    averaged over the steps the verdict judged."""
    first = s.onset_step if s.onset_step is not None else s.first_step
    return float(np.mean(run.slept_ms[first : sc.steps]))


def own_excess_ms(sc: Scenario, run: Outcome, *, per_step: bool = True) -> float:
    """How much later the slow ranks' own work ended than the others', by their loops'
    clocks: the delay as the job felt it, and what a fix could save.

    ``per_step``: in each step, the slowest slow rank's own work against the slowest of
    the others' (a fix leaves the job waiting for that one: beside spin loops rank 0's
    coordinator thread makes it the slowest of the rest, by 9 ms a step at 4 ranks on one
    loaded CI run), none where it was not slower; else the mean against the others'
    median, as the verdict's "own work ... more than the others' on average" counts. On
    a busy machine the others' own work grows too (the cores the slow rank left idle
    while it slept went to the spin loops), so either can be less than the delay slept
    (2.7 ms of a 3.3 ms sleep, one loaded run)."""
    slow = [r for r in range(sc.ranks) if r in sc.slow]
    rest = [r for r in range(sc.ranks) if r not in sc.slow]
    own = run.own_steps_ms
    if not per_step:
        return max(run.own_ms[r] for r in slow) - float(np.median([run.own_ms[r] for r in rest]))
    return float(np.clip(own[slow].max(axis=0) - own[rest].max(axis=0), 0.0, None).mean())


#: How far below its lowest truth a verdict's cost may fall: a quarter, and two fifths
#: beside the spin loops. The cost takes off what the job would still wait for with the
#: culprits at pace, the rest's spread in each step, and at 8 ranks on 2 busy cores that
#: spread is partly the fault's own doing (seven ranks idle while one sleeps, then woken
#: together onto two cores): one CI run's 40 ms fault, a 32.2 ms step change and 35.3 ms
#: of own-work excess, was costed at 23.1 ms (0.72 of the lowest truth; here 0.85-0.95)
LOW_SHARE = {"quiet": 0.75, "loaded": 0.6}


def assert_cost_within(
    cost: float,
    delta: float,
    s: Stragglers,
    d: float,
    excess: float | None = None,
    *,
    load: str,
) -> None:
    """Within the truths, a quarter beyond them (:data:`LOW_SHARE` below): the step-time
    change and the delay slept, and (when given) the slow ranks' own-work excess, which
    the verdict's cost is capped by (on a busy machine a rank that slept also waits for a
    core when it wakes: 5.3 ms of own-work excess for a 3.5 ms sleep, one loaded run)."""
    truths = [delta, d] if excess is None else [delta, d, excess]
    lo, hi = LOW_SHARE[load] * min(truths), 1.25 * max(truths)
    assert lo <= cost <= hi, (
        f"cost {cost:.1f} ms outside [{lo:.1f}, {hi:.1f}] (delta {delta:.1f}, d {d:.1f}, "
        f"own-work excess {excess}): {s.verdict}; per step: {s.per_step}"
    )


@pytest.mark.parametrize(
    "name",
    ["data-2", "forward-3-gloo", "data-2-tiny-3ms", "intermittent-2", "two-slow-4-hosts",
     "data-8-tiny"],
)  # fmt: skip
def test_slow_ranks_named_with_their_phase_and_cost(scenario, load: str, name: str) -> None:
    sc = SCENARIOS[name]
    slow = scenario(name)
    balanced = scenario(baseline_of(sc))
    s = find_stragglers(load_run(slow.timeline, cache=False))
    assert s.source == "source", s.verdict  # each rank's own submission stamps
    felt = own_excess_ms(sc, slow, per_step=False)
    material = max(MIN_COST_MS, MIN_STEP_SHARE * mean_step(slow.step_ms))
    if not s.culprits and felt < 1.5 * material:
        # A busy machine can hide a small fault: the cores a sleeping rank leaves go to
        # the others, whose own work then ends later too (a 3 ms sleep in a 4 ms step,
        # 1.2 ms by the timeline beside a 13.9 ms loaded step, one CI run). Below half as
        # much again as the verdict's own materiality rule, by the worker's own clocks,
        # "no straggler" is a true answer, if it still points at the slow rank.
        assert s.verdict.startswith("No straggler"), s.verdict
        # and its "the most, rank N" is a slow rank (an intermittent fault's rank is not
        # the one most often last: 40 ms in a quarter of 29.5 ms loaded steps, one run)
        most = max(s.ranks, key=lambda r: r.own_excess_ms)
        assert most.rank in sc.slow and f"(the most, rank {most.rank}," in s.verdict, s.verdict
        return
    # every culprit named, no bystander
    assert sorted(s.culprits) == list(sc.slow), s.verdict
    assert s.straggler in sc.slow, s.verdict
    if len(sc.slow) == 1:
        assert s.verdict.startswith(f"rank {sc.slow[0]} is the straggler"), s.verdict
    else:
        assert s.verdict.startswith("ranks 2 and 3, both on host b, are the stragglers"), s.verdict
    assert s.phase == PHASE[sc.where], s.verdict
    assert s.onset_step == 1, s.verdict  # from the start (the warm-up step is not counted)
    every = sc.fraction >= 1
    delta = mean_step(slow.step_ms, every=every) - mean_step(balanced.step_ms, every=every)
    d = injected_ms(sc, slow, s)
    assert_cost_within(s.cost_ms, delta, s, d, own_excess_ms(sc, slow), load=load)
    if sc.fraction < 1:
        # held the job in about the share of the steps slowed, by about the delay each time
        top = next(r for r in s.ranks if r.rank == sc.slow[0])
        share = float(np.mean([k in slow.slow_steps for k in range(s.first_step, sc.steps)]))
        assert abs(top.held_share - share) <= 0.15, s.verdict
        assert 0.5 * sc.delay_ms <= top.held_ms <= 1.5 * sc.delay_ms, s.verdict
    # diff names a slow rank's own compute as the cause, the others' waiting as effects
    diff = diff_runs(load_run(balanced.timeline, cache=False), load_run(slow.timeline, cache=False))
    if diff.cause is None and delta < 0.5 * d:
        # a busy machine ran the balanced twin as slowly (its median step went 3.8-7.8 ms
        # over four loaded runs): B is not slower, and diff still points at the slow rank
        slowest = "|".join(f"rank {r}: compute" for r in sc.slow)
        assert diff.verdict is not None and re.search(
            rf"B is not slower, so no cause is named \(own work grew most in ({slowest}):",
            diff.verdict,
        ), diff.verdict
        return
    assert diff.cause is not None, diff.verdict
    assert diff.cause.key in {f"rank {r}: compute" for r in sc.slow}, diff.verdict
    assert all(r.key.removeprefix("rank ") not in map(str, sc.slow) for r in diff.effects), (
        diff.verdict
    )
    assert f"Cause: {diff.cause.key} +" in diff.verdict, diff.verdict


def test_fault_from_mid_run_reports_its_onset(scenario, load: str) -> None:
    sc = SCENARIOS["backward-4-mid-run"]
    run = scenario("backward-4-mid-run")
    s = find_stragglers(load_run(run.timeline, cache=False))
    assert s.source == "source", s.verdict
    assert s.culprits == [1], s.verdict
    assert s.onset_step is not None and abs(s.onset_step - ONSET) <= 1, s.verdict
    assert f"from step {s.onset_step} on" in s.verdict
    assert s.phase == "backward", s.verdict
    delta = mean_step(run.step_ms, ONSET + 1) - mean_step(run.step_ms, 1, ONSET - 1)
    assert_cost_within(s.cost_ms, delta, s, injected_ms(sc, run, s), load=load)


def test_backward_fault_under_mpi(scenario) -> None:
    """Negotiation and collectives over MPI: the same stamps give the same answer."""
    run = scenario("backward-2-mpi")
    s = find_stragglers(load_run(run.timeline, cache=False))
    assert s.source == "source", s.verdict
    assert s.culprits == [1] and s.onset_step == 1, s.verdict
    assert s.phase == "backward", s.verdict


@pytest.mark.parametrize("name", BALANCED)
def test_balanced_run_names_no_straggler(scenario, name: str) -> None:
    run = scenario(name)
    loaded = load_run(run.timeline, cache=False)
    s = find_stragglers(loaded)
    shares = {r.rank: r.last_share for r in s.ranks}
    assert shares[s.most_often_last] == max(shares.values())
    # the ranks noted when their training thread got control back, in the steps where its
    # wait blocked (not always: rank 0's cycle thread can finish a collective before its
    # training thread waits; 498 and 499 of 500 steps in one run): own work starts there,
    # so a slow wake-up is not blamed on the code. In a step, the ranks ready first wait
    # for the last one, so most steps have at least one such note.
    sc = SCENARIOS[name]
    woke = loaded.counters[act.COUNTER_WAITED][0]
    noted = [int((woke == r).sum()) for r in range(sc.ranks)]
    assert min(noted) >= 1 and max(noted) <= sc.steps, noted
    assert sum(noted) >= 0.5 * (sc.steps - 1), noted
    for named in s.culprits:
        # No fault was injected, but on a shared machine one rank can really be slower:
        # its own data + forward + backward + optimizer step, measured by the worker, is the
        # ground truth
        # (rank 0's is, when the cores are oversubscribed: its coordinator thread takes
        # CPU from its training thread; at 8 ranks on 2 cores, two ranks can be starved at
        # once). A verdict is a false alarm unless that rank measured slower than the
        # others' mean by a material part of the cost (a quarter: the loop's bookkeeping
        # between steps, which the worker does not time, and a busy machine's preemptions
        # there, are the rest)
        others = [x for r, x in enumerate(run.own_ms) if r != named]
        slower = run.own_ms[named] - float(np.mean(others))
        assert slower >= max(MIN_COST_MS, 0.25 * s.cost_ms), (
            f"false alarm: {s.verdict}; measured own time per step {run.own_ms}"
        )
    if sc.mpi:  # hvdprof's own waits spin on no core: nothing makes one rank slower
        assert s.culprits == [], f"false alarm under mpirun: {s.verdict}; own {run.own_ms}"
    if s.culprits:
        return
    assert s.verdict.startswith("No straggler"), s.verdict
    assert "finish each step within" in s.verdict  # the spread is given
    assert f"rank most often last, rank {s.most_often_last}," in s.verdict


def test_scenarios_are_known() -> None:
    # every fault from the start has a balanced twin (the cost and diff checks need it)
    for sc in SCENARIOS.values():
        if sc.slow and sc.onset == 0 and not sc.mpi:
            assert baseline_of(sc)
