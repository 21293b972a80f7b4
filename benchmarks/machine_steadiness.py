"""How steady this machine's speed is: the noise floor under any A/B speed gate that runs
its two sides one after the other.

A gate that runs the baseline, then the candidate, compares two stretches of time. If
the machine itself runs the same code faster in one stretch than in the next (a virtual
CPU whose host is busy elsewhere, turbo and thermal limits, a neighbour on a sibling
hyper-thread), that difference lands in the pair's ratio, and no interleaving or load
matching inside the gate can take it out: only more pairs can. This measures that floor
directly, with nothing of hvdprof in the way.

One process runs a fixed piece of work (20 products of two 128 x 128 float32 matrices
in torch, one thread) again and again for ``--seconds``, noting each piece's wall time
and its thread's CPU time. Cut into windows of 1 s and of 10 s (a gate's run of the demo
job is about 10 s), it reports:

* the spread of the windows' median piece time (5th to 95th percentile, over the run's
  median): how far the machine's speed wanders;
* the standard deviation of the log ratio of each window to the next (``pair sd``): what
  one sequential A/B pair of identical runs of that length sees from the machine alone;
* from the 10 s figure, how many such pairs a gate needs before a 98% interval on their
  median log ratio is +-2.5% wide (the median's error is 1.25 times a mean's);
* the same spreads on the thread's CPU time per piece: when they match the wall time's,
  the machine ran the same instructions slower (not a scheduler that gave the core away).

``--load`` runs one spin loop per core beside it (the wall figures then include waiting
for a core; the CPU figures still read the machine's speed).

    python benchmarks/machine_steadiness.py [--seconds 120] [--load] [--quick]
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import _harness as h
import numpy as np

NAME = "machine_steadiness"
#: a 98% two-sided normal quantile and the median's error over a mean's (normal data)
Z98, MEDIAN_EFFICIENCY = 2.326, 1.2533
#: the half-width (log ratio) a gate's interval should reach to tell 5% from 0
TARGET_HALF_WIDTH = 0.025


def pieces(seconds: float) -> np.ndarray:
    """(start unix s, wall ms, cpu ms) of each piece of fixed work over ``seconds``."""
    import torch

    torch.set_num_threads(1)
    a, b = torch.randn(128, 128), torch.randn(128, 128)
    for _ in range(50):  # warm caches and the allocator before timing
        torch.mm(a, b)
    rows = []
    end = time.time() + seconds
    while (start := time.time()) < end:
        w0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(20):
            torch.mm(a, b)
        rows.append((start, (time.perf_counter() - w0) * 1e3, (time.thread_time() - c0) * 1e3))
    return np.array(rows)


def windows(rows: np.ndarray, column: int, length_s: float) -> np.ndarray:
    """The median of ``column`` in each whole window of ``length_s`` (windows with fewer
    than 5 pieces left out)."""
    index = np.floor((rows[:, 0] - rows[0, 0]) / length_s).astype(int)
    count = int(index.max())  # the last window is partial: left out
    out = [np.median(rows[index == k, column]) for k in range(count) if (index == k).sum() >= 5]
    return np.array(out)


def steadiness(rows: np.ndarray, column: int, length_s: float) -> dict[str, float | None]:
    """The spread of window medians, and the sd of consecutive windows' log ratios."""
    m = windows(rows, column, length_s)
    if len(m) < 3:
        return {"windows": len(m), "p5": None, "p95": None, "sd_log": None, "pair_sd": None}
    overall = float(np.median(rows[:, column]))
    logs = np.log(m)
    return {
        "windows": len(m),
        "p5": float(np.percentile(m, 5)) / overall,
        "p95": float(np.percentile(m, 95)) / overall,
        "sd_log": float(np.std(logs, ddof=1)),
        "pair_sd": float(np.std(np.diff(logs), ddof=1)),
    }


def pairs_needed(pair_sd: float | None) -> int | None:
    """Sequential pairs for a 98% interval of +-TARGET_HALF_WIDTH on their median."""
    if pair_sd is None:
        return None
    return math.ceil((Z98 * MEDIAN_EFFICIENCY * pair_sd / TARGET_HALF_WIDTH) ** 2)


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * (x - 1):+.1f}%"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=120.0, help="how long to measure (120)")
    p.add_argument("--load", action="store_true", help="one spin loop per core beside it")
    p.add_argument("--quick", action="store_true", help="6 s, for the smoke test")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    seconds = 6.0 if args.quick else args.seconds
    with h.spin_loops(args.load):
        rows = pieces(seconds)
    windows_s = (0.5, 2.0) if args.quick else (1.0, 10.0)
    figures: dict[str, dict[str, float | None]] = {}
    table = []
    for clock, column in (("wall", 1), ("cpu", 2)):
        for length in windows_s:
            key = f"{clock}_{length:g}s"
            f = figures[key] = steadiness(rows, column, length)
            sd = f["pair_sd"]
            table.append([
                f"{clock} time per piece, {length:g} s windows ({f['windows']})",
                f"p5 {_pct(f['p5'])}, p95 {_pct(f['p95'])} of the median; "
                f"pair sd {'-' if sd is None else f'{sd:.3f}'}",
            ])  # fmt: skip
    long_key = f"wall_{windows_s[1]:g}s"
    needed = pairs_needed(figures[long_key]["pair_sd"])
    table.append([
        f"sequential pairs of {windows_s[1]:g} s runs for a +-2.5% 98% interval",
        "-" if needed is None else str(needed),
    ])  # fmt: skip
    piece_ms = float(np.median(rows[:, 1]))
    table.insert(0, ["pieces of work timed (median wall)", f"{len(rows)} ({piece_ms:.2f} ms)"])
    print(h.table(table, ["measure", "value"]))
    path = h.write_results(
        NAME + (".loaded" if args.load and not args.quick else ""),
        {
            "settings": {"seconds": seconds, "load": "spin" if args.load else "none"},
            "pieces": len(rows),
            "piece_ms": piece_ms,
            "figures": figures,
            "pairs_needed_10s": needed,
            "header": ["measure", "value"],
            "table": table,
        },
        args.output,
        args.quick,
    )
    h.log(f"wrote {path}")


if __name__ == "__main__":
    main()
