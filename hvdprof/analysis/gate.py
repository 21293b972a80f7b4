"""``hvdprof diff --fail-on``: fail a CI job when training got slower, and only then.

Two runs of one job differ by several percent from noise alone, so a gate on the change in
step time would fail at random. Each rule here is a one-sided test: B is worse than A by
more than the rule's margin only when the bootstrap's lower bound on the change, at the
stated confidence, is above the margin. Steps are resampled in blocks as long as each
run's own dependence reaches (a slow spell lasts many steps: independent draws, or short
blocks, would understate the noise), A and B independently.

Rules (``--fail-on``, repeatable; each is its own test):

* ``5%`` or ``2ms``: the step time, as ``analyze`` and ``diff`` quote it (the median over
  ranks and steps: a busy runner's descheduled step moves a mean by more than a
  regression of every step's code would);
* ``PHASE:10%``: one phase's mean time per step, mean over ranks, as the diff's rows
  quote it (a breakdown category: ``collective``, ``memcpy_in``, ``memcpy_out``,
  ``queue``, ``other``, ``negotiate``, ``idle``);
* ``rank:5%``: every rank's own work per step (its step less its waiting for the others),
  the confidence split over the ranks (Bonferroni); ``rank3:5%`` for one rank.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import numpy as np

from hvdprof.analysis.bootstrap import BOOTSTRAP_SEED
from hvdprof.analysis.diff import RunDiff
from hvdprof.analysis.phases import CATEGORIES, LABELS
from hvdprof.analysis.result import Result
from hvdprof.analysis.summary import RunSummary
from hvdprof.errors import HvdprofError

#: Resamples per run: the 5% quantile of the ratio moves by well under 0.1% at this size.
GATE_SAMPLES = 4000
#: Steps a run needs before a gate can judge it.
MIN_GATE_STEPS = 10
#: Values (steps x ranks) gathered at once while resampling a median: about 32 MB.
GATE_CHUNK_VALUES = 4_000_000
#: The most values (steps x ranks) one run's series may hold: the GATE_SAMPLES medians of
#: 500,000 values took 64 s on the 2-core VM, and the time grows with the values; a
#: larger series is refused, saying so, rather than taking many minutes (a phase or rank
#: rule works from block sums and takes well under a second at this size).
MAX_GATE_VALUES = 500_000
#: The largest margin a rule takes (a relative one: 100x; an absolute one: a day).
MAX_MARGIN_PERCENT, MAX_MARGIN_MS = 10_000.0, 86_400_000.0

_RULE = re.compile(
    r"^\s*(?:(?P<what>[a-z_]+)(?P<rank>\d+)?\s*:\s*)?(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>%|ms)\s*$"
)


class RuleError(HvdprofError):
    """A ``--fail-on`` rule that cannot be read: the message says what is expected."""


class GateTooLarge(HvdprofError):
    """A series too long to resample within the gate's bounds (:data:`MAX_GATE_VALUES`)."""


@dataclass(frozen=True)
class GateRule:
    """What to test (``step``, a phase, or ``rank``), on which rank, and the margin."""

    text: str
    what: str  # "step" | a breakdown category | "rank"
    margin: float  # a fraction (0.05) when relative, else ms
    relative: bool
    rank: int | None = None  # "rank3:5%": that rank only

    def describe(self) -> str:
        margin = _margin(self)
        if self.what == "step":
            return f"median step time worse by more than {margin}"
        if self.what == "rank":
            who = f"rank {self.rank}'s" if self.rank is not None else "a rank's"
            return f"{who} own work per step worse by more than {margin}"
        return f"{LABELS[self.what]} per step worse by more than {margin}"


def parse_rule(text: str) -> GateRule:
    """``5%``, ``2ms``, ``negotiate:10%``, ``rank:5%``, ``rank1:3ms`` -> a rule."""
    m = _RULE.match(text.lower())
    if m is None:
        raise RuleError(
            f"--fail-on {text!r}: expected a margin (5% or 2ms), optionally after a phase "
            f"or rank ('negotiate:10%', 'rank:5%', 'rank1:3ms'); phases: {', '.join(CATEGORIES)}"
        )
    what = m["what"] or "step"
    rank = int(m["rank"]) if m["rank"] is not None else None
    if rank is not None and what != "rank":
        raise RuleError(f"--fail-on {text!r}: only 'rank' takes a number ('rank1:5%')")
    if what not in ("step", "rank", *CATEGORIES):
        raise RuleError(
            f"--fail-on {text!r}: {what!r} is not a phase; phases: {', '.join(CATEGORIES)}, "
            "or 'rank' / 'rankN' for own work"
        )
    relative = m["unit"] == "%"
    value = float(m["value"])
    top = MAX_MARGIN_PERCENT if relative else MAX_MARGIN_MS
    if not value <= top:
        raise RuleError(f"--fail-on {text!r}: the margin must be from 0 to {top:,.0f}{m['unit']}")
    return GateRule(text.strip(), what, value / 100.0 if relative else value, relative, rank)


class GateCheck(Result):
    """One series tested: the change of B's mean against A's, and its interval. None
    where a relative change has no finite value: the series is absent in A (0 ms per
    step) and present in B."""

    name: str  # "median step time", "rank 1 own work", ...
    a_ms: float
    b_ms: float
    change: float | None  # relative (0.08 = +8%) for a relative rule, else ms
    low: float | None  # the one-sided bound: the change is at least this, at the confidence
    high: float | None  # the interval's other end (same coverage on the other side)
    failed: bool
    note: str = ""  # why it could not be judged
    blocks: tuple[int, int] = (0, 0)  # the block length resampled in A and in B (steps)


class GateResult(Result):
    """A rule's answer: failed when any of its checks failed. The rule's parts are its
    first fields (the JSON's ``rule`` is its text; :attr:`rule` gives it back whole)."""

    text: str = msgspec.field(name="rule")
    what: str
    margin: float
    relative: bool
    rank: int | None
    confidence: float
    checks: list[GateCheck] = msgspec.field(default_factory=list)
    failed: bool = False
    message: str = ""

    @classmethod
    def of(cls, rule: GateRule, confidence: float) -> GateResult:
        return cls(rule.text, rule.what, rule.margin, rule.relative, rule.rank, confidence)

    @property
    def rule(self) -> GateRule:
        return GateRule(self.text, self.what, self.margin, self.relative, self.rank)


class GatedDiff(RunDiff):
    """What ``hvdprof diff --json`` writes: the diff, then each ``--fail-on`` rule's
    answer (one type, so the published schema has the command's output whole)."""

    gate: list[GateResult] = msgspec.field(default_factory=list)

    @classmethod
    def of(cls, diff: RunDiff, gates: list[GateResult]) -> GatedDiff:
        return cls(**msgspec.structs.asdict(diff), gate=gates)


def _series(s: RunSummary, rule: GateRule) -> dict[str, np.ndarray]:
    """The per-step series ``rule`` tests in one run, by name (rows: steps)."""
    if rule.what == "step":
        step = np.asarray(s.series.step, dtype=float)
        return {"median step time": step if step.ndim == 2 else step.reshape(-1, 1)}
    if rule.what == "rank":
        ranks = [rule.rank] if rule.rank is not None else sorted(s.series.work)
        return {
            f"rank {r} own work": np.asarray(s.series.work[r], dtype=float)[:, None]
            for r in ranks
            if r in s.series.work
        }
    return {LABELS[rule.what]: np.asarray(s.series.phase.get(rule.what, []), dtype=float)[:, None]}


def block_length(x: np.ndarray) -> int:
    """The block length for a series with this dependence (Politis and White 2004, with
    Patton, Politis and White's 2009 correction, for the moving-block bootstrap).

    A run's step time drifts: on the 2-core VM the demo job's median over 150-step windows
    of one run moved between 3.5 and 5.0 ms. Blocks of a fixed n^(1/3) steps resample that
    drift as if it were noise between neighbours, and the interval comes out too narrow
    (6 of 20 identical pairs failed at 5%). This estimates how far the dependence reaches
    from the autocorrelations and sizes the blocks to it; never below n^(1/3).
    """
    n = len(x)
    floor = max(1, round(n ** (1.0 / 3.0)))
    if n < 8 or not np.all(np.isfinite(x)):
        return floor
    y = x - x.mean()
    var = float(y @ y) / n
    if not 0 < var < float("inf"):
        return floor
    k_max = min(n - 1, max(5, int(np.ceil(np.sqrt(n)))) + 5)
    r = np.array([float(y[: n - k] @ y[k:]) / n for k in range(k_max + 1)])
    rho = r / var
    k_n = max(5, int(np.ceil(np.sqrt(np.log10(n)))))
    bound = 2.0 * np.sqrt(np.log10(n) / n)
    m = k_max - k_n
    for lag in range(1, k_max - k_n + 1):
        if np.all(np.abs(rho[lag : lag + k_n]) < bound):
            m = lag - 1
            break
    big_m = min(2 * max(m, 1), k_max)
    lags = np.arange(-big_m, big_m + 1)
    t = np.abs(lags) / big_m
    window = np.where(t <= 0.5, 1.0, np.where(t <= 1.0, 2.0 * (1.0 - t), 0.0))
    cov = r[np.abs(lags)]
    g = float(np.sum(window * np.abs(lags) * cov))
    g0 = float(np.sum(window * cov))
    if not (0 < g0 < float("inf") and np.isfinite(g)) or g == 0:
        return floor
    b = (2.0 * g * g / ((4.0 / 3.0) * g0 * g0)) ** (1.0 / 3.0) * n ** (1.0 / 3.0)
    return int(min(max(floor, round(b)), max(floor, n // 3)))


def _start_chunks(
    n: int, samples: int, seed: int, block: int, per_sample: int
) -> Iterator[np.ndarray]:
    """The first rows of the blocks of ``samples`` moving-block resamples of ``n`` steps
    (a resample is its blocks of ``block`` consecutive steps joined and cut to ``n``),
    drawn a few resamples at a time, so that a chunk's work holds no more than
    :data:`GATE_CHUNK_VALUES` values when each resample costs ``per_sample`` of them."""
    n_blocks = -(-n // block)
    rng = np.random.default_rng(seed)
    chunk = max(1, GATE_CHUNK_VALUES // max(per_sample, n_blocks, 1))
    for lo in range(0, samples, chunk):
        yield rng.integers(0, n - block + 1, size=(min(chunk, samples - lo), n_blocks))


def _resampled_means(x: np.ndarray, block: int, samples: int, seed: int) -> np.ndarray:
    """Each resample's mean per step of the row sums, from block sums (a cumulative sum
    read at the blocks' ends): no row of a resample is gathered."""
    n = len(x)
    cum = np.concatenate(([0.0], np.cumsum(x.sum(axis=1))))
    tail = n - (-(-n // block) - 1) * block  # the last block, cut to n steps
    out = []
    for starts in _start_chunks(n, samples, seed, block, 0):
        total = (cum[starts[:, :-1] + block] - cum[starts[:, :-1]]).sum(axis=1)
        total += cum[starts[:, -1] + tail] - cum[starts[:, -1]]
        out.append(total / n)
    return np.concatenate(out)


def _resampled_medians(x: np.ndarray, block: int, samples: int, seed: int) -> np.ndarray:
    """Each resample's median over every value of its rows, streamed a few resamples at a
    time (at most :data:`GATE_CHUNK_VALUES` values gathered at once)."""
    n = len(x)
    offsets = np.arange(block)
    out = []
    for starts in _start_chunks(n, samples, seed, block, x.size):
        rows = (starts[:, :, None] + offsets).reshape(len(starts), -1)[:, :n]
        out.append(np.median(x[rows].reshape(len(starts), -1), axis=1))
    return np.concatenate(out)


def _check(
    name: str, xa: np.ndarray, xb: np.ndarray, rule: GateRule, alpha: float, seeds: tuple[int, int]
) -> GateCheck:
    median = rule.what == "step"
    if median:
        ma, mb = float(np.median(xa)), float(np.median(xb))
    else:
        ma, mb = float(xa.sum(axis=1).mean()), float(xb.sum(axis=1).mean())
    la, lb = block_length(xa.mean(axis=1)), block_length(xb.mean(axis=1))
    resample = _resampled_medians if median else _resampled_means
    ba = resample(xa, la, GATE_SAMPLES, seeds[0])
    bb = resample(xb, lb, GATE_SAMPLES, seeds[1])
    if rule.relative:
        if ma <= 0:  # absent in A: any reliable amount in B is a regression of any size
            low = float("inf") if np.quantile(bb, alpha) > 0 else 0.0
            change, high = (float("inf") if mb > 0 else 0.0), low
        else:
            ratio = bb / np.maximum(ba, 1e-12)
            change = mb / ma - 1.0
            low = float(np.quantile(ratio, alpha)) - 1.0
            high = float(np.quantile(ratio, 1.0 - alpha)) - 1.0
    else:
        d = bb - ba
        change = mb - ma
        low, high = float(np.quantile(d, alpha)), float(np.quantile(d, 1.0 - alpha))
    failed = low > rule.margin
    return GateCheck(name, ma, mb, _finite(change), _finite(low), _finite(high), failed,
                     blocks=(la, lb))  # fmt: skip


def _finite(x: float) -> float | None:
    """A change or bound as the result holds it: None for an infinite one (JSON has none)."""
    return x if math.isfinite(x) else None


def _fmt(change: float | None, relative: bool) -> str:
    if change is None:
        return "new in B"
    return f"{change:+.1%}" if relative else f"{change:+.2f} ms"


def check_gate(
    a: RunSummary, b: RunSummary, rule: GateRule, confidence: float = 0.95
) -> GateResult:
    """Test ``rule`` on run B against run A (one-sided, at ``confidence``)."""
    out = GateResult.of(rule, confidence)
    _refuse_outside(a, b, rule)
    sa, sb = _series(a, rule), _series(b, rule)
    _refuse_too_large(rule, {"A": sa, "B": sb})
    names = [n for n in sa if n in sb]
    if not names:
        why = (
            "own work needs every rank's submission stamps (hvdprof timelines of every rank)"
            if rule.what == "rank"
            else "neither run has it"
        )
        if rule.what == "rank" and rule.rank is not None:
            why = f"rank {rule.rank} is not in both runs' own-work series ({why})"
        out.message = f"{rule.text}: cannot be judged: {why}."
        out.failed = True  # a gate that cannot look does not pass silently
        return out
    alpha = (1.0 - confidence) / len(names)  # Bonferroni over ranks
    for i, name in enumerate(names):
        xa, xb = sa[name], sb[name]
        if len(xa) < MIN_GATE_STEPS or len(xb) < MIN_GATE_STEPS:
            out.checks.append(GateCheck(name, 0.0, 0.0, 0.0, 0.0, 0.0, True, note="too few steps"))
            continue
        seeds = (BOOTSTRAP_SEED + 2 * i + 1, BOOTSTRAP_SEED + 2 * i + 2)
        out.checks.append(_check(name, xa, xb, rule, alpha, seeds))
    out.failed = any(c.failed for c in out.checks)
    out.message = _message(out, len(names), a, b)
    return out


def _refuse_outside(a: RunSummary, b: RunSummary, rule: GateRule) -> None:
    """``rank99:5%`` on a 2-rank run asks about a rank that never was: a usage error."""
    if rule.rank is None:
        return
    for label, s in (("A", a), ("B", b)):
        if rule.rank not in s.ranks:
            shown = f"ranks {min(s.ranks)}-{max(s.ranks)}" if s.ranks else "no ranks"
            raise RuleError(
                f"--fail-on {rule.text}: rank {rule.rank} is not in run {label} ({shown})"
            )


def _refuse_too_large(rule: GateRule, runs: dict[str, dict[str, np.ndarray]]) -> None:
    """A step-time series above :data:`MAX_GATE_VALUES` is refused before any resampling
    (its medians are what take the time; the other rules resample block sums)."""
    if rule.what != "step":
        return
    for label, series in runs.items():
        for name, x in series.items():
            if x.size > MAX_GATE_VALUES:
                raise GateTooLarge(
                    f"--fail-on {rule.text}: run {label}'s {name} series holds {x.size:,} "
                    f"values (steps x ranks), above the gate's bound of {MAX_GATE_VALUES:,}; "
                    "summarise a shorter run (or a window of it)"
                )


def _message(out: GateResult, tested: int, a: RunSummary, b: RunSummary) -> str:
    rule = out.rule
    short = [c for c in out.checks if c.note]
    if short:
        c = short[0]
        return (
            f"FAIL {rule.text}: {c.name}: too few steps to judge (at least "
            f"{MIN_GATE_STEPS} after the warm-up step in each run)."
        )
    worst = max(out.checks, key=lambda c: (c.failed, math.inf if c.low is None else c.low))
    conf = f"{out.confidence:.0%}"
    each = ""
    if tested > 1:  # Bonferroni: each check at a higher level, said with its number
        each = (
            f" (split over the ranks: {1 - (1 - out.confidence) / tested:.2%} for each of "
            f"the {tested} tested)"
        )
    bound = f"with {conf} confidence{each} at least {_fmt(worst.low, rule.relative)}"
    if worst.change is None:
        bound = "absent in A"
    body = (
        f"{worst.name} {worst.a_ms:.3f} -> {worst.b_ms:.3f} ms per step "
        f"({_fmt(worst.change, rule.relative)}; {bound})"
    )
    if out.failed:
        return f"FAIL {rule.text}: {body}: {rule.describe()} with {conf} confidence."
    return (
        f"pass {rule.text}: {body}: no evidence at {conf} confidence of worse by more "
        f"than {_margin(rule)}."
    )


def _margin(rule: GateRule) -> str:
    return f"+{rule.margin:.0%}" if rule.relative else f"+{rule.margin:g} ms"
