"""End-to-end cost of ``hvdprof analyze`` on synthetic runs of 2-3 sizes (1M events max).

The run is generated here (``tests/synthetic_runs.py``, the generator the tests use:
4 ranks, 100 tensors per step, a straggler), in a temporary directory. For each size it
runs ``python -m hvdprof analyze DIR --json`` as a subprocess, four ways, interleaved
per repeat:

* ``cold``: ``--no-cache`` (parse every file);
* ``write``: no cache yet, the run writes ``.hvdprof-cache/`` (first analysis of a run);
* ``cached``: the cache is there and current (what a second look costs);
* ``grown``: the cache was written while the files were 90% written (a job still
  running) and the rest was appended since: only the last 10% is parsed.

It reports the wall time (median), CPU time (user + system of the command and of the
parsing processes it waited for), peak RSS of the largest process (``wait4``) and the
peak of the whole process tree sampled every 10 ms, and the cost per million events, so
the growth with trace size is visible. On the largest run it also times
``timeline_window`` queries (whole run and zoomed), the dashboard's hot path.

Goal: 1M events in <= 5 s end to end with peak RSS <= 1 GB. Run on a shared machine, the
wall time follows the machine's load; CPU time is the steadier figure.

    python benchmarks/analysis_bench.py            # 250k, 500k, 1M events
    python benchmarks/analysis_bench.py --quick    # a smoke run
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(ROOT / "tests"))  # the tests' synthetic runs

import _harness  # noqa: E402
from synthetic_runs import SyntheticSpec, write_synthetic_run  # noqa: E402

from hvdprof.analysis import load_run, timeline_window  # noqa: E402

TENSORS = 100
#: cold: --no-cache; write: no cache yet, written; cached: cache current; grown: the cache
#: describes the files at 90% (cut mid-line, as a job still writing leaves them), and the
#: last 10% was appended since (the parse continues from the cached offset)
VARIANTS = ("cold", "write", "cached", "grown")


@contextlib.contextmanager
def grown_by_a_tenth(directory: Path) -> Iterator[None]:
    """Inside: every rank file cut at 90% of its length, mid-line; after: whole again."""
    full = {p: p.read_bytes() for p in directory.glob("rank.*.json")}
    for path, data in full.items():
        at = data.rfind(b"\n", 0, len(data) * 9 // 10) + 1
        path.write_bytes(data[: at + 20])
    try:
        yield
    finally:
        for path, data in full.items():
            path.write_bytes(data)


def spec_for(events: int, ranks: int) -> SyntheticSpec:
    """A spec whose run has about ``events`` events in all."""
    per_op = ranks + 6  # READY marks + NEGOTIATE + OP + QUEUE + MEMCPY x2 + backend call
    steps = max(2, round(events / (ranks * TENSORS * per_op)))
    return SyntheticSpec(
        ranks=ranks,
        steps=steps,
        tensors=TENSORS,
        group_size=8,
        tensor_bytes=256 << 10,
        step_us=60_000.0,
        submit_gap_us=5.0,
        late_rank=ranks - 1,
        late_us=3000.0,
    )


def _tree_rss_kb(pid: int) -> int:
    """Resident memory of ``pid`` and its descendants, in KiB."""
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack += [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            continue
    return total


def measure(args: list[str]) -> dict[str, float]:
    """Run ``hvdprof`` with ``args``: wall s, CPU s, peak RSS MB (largest process, tree)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "hvdprof", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    peak_tree = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak_tree
        while not done.is_set():
            peak_tree = max(peak_tree, _tree_rss_kb(proc.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode not in (0, 1):
        raise SystemExit(f"hvdprof {' '.join(args)} failed ({proc.returncode}): {stderr}")
    return {
        "wall_s": wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "peak_rss_mb": usage.ru_maxrss / 1024.0,
        "peak_tree_rss_mb": peak_tree / 1024.0,
    }


def window_latency(directory: str, queries: int) -> dict[str, float]:
    """Median ms of ``timeline_window`` over the whole run and zoomed to 1% of it."""
    run = load_run(directory)
    span = run.t1_us - run.t0_us
    out: dict[str, float] = {"slices": float(len(run.slices))}
    for label, width, expand in (
        ("whole_run_ms", span, None),
        ("zoom_1pct_ms", span / 100, None),
        ("rank_lanes_10pct_ms", span / 10, 0),
    ):
        times = []
        for i in range(queries):
            t0 = run.t0_us + (span - width) * (i / max(queries - 1, 1))
            start = time.perf_counter()
            timeline_window(run, t0, t0 + width, expand_rank=expand)
            times.append((time.perf_counter() - start) * 1000.0)
        out[label] = statistics.median(times)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=1_000_000, help="largest run (events)")
    p.add_argument(
        "--sizes",
        default="0.25,0.5,1",
        help="fractions of --events to measure (default 0.25,0.5,1)",
    )
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="a smoke run (small sizes, 1 repeat)")
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--keep", type=Path, default=None, help="generate the runs here and keep them")
    args = p.parse_args()
    if args.quick:
        args.events, args.repeats, args.sizes = 40_000, 1, "0.5,1"
    fractions = [float(x) for x in args.sizes.split(",")]
    base = Path(args.keep or tempfile.mkdtemp(prefix="hvdprof-analysis-bench-"))
    sizes: list[dict[str, Any]] = []
    try:
        for fraction in fractions:
            target = int(args.events * fraction)
            directory = base / f"run-{target}"
            if directory.exists():
                shutil.rmtree(directory)
            t = time.perf_counter()
            truth = write_synthetic_run(str(directory), spec_for(target, args.ranks))
            gen_s = time.perf_counter() - t
            nbytes = sum(f.stat().st_size for f in directory.glob("rank.*.json"))
            _harness.log(
                f"{truth.events:,} events ({nbytes / 1e6:.0f} MB) generated in {gen_s:.1f} s"
            )
            runs: dict[str, list[dict[str, float]]] = {v: [] for v in VARIANTS}
            for _ in range(args.repeats):
                runs["cold"].append(measure(["analyze", str(directory), "--json", "--no-cache"]))
                shutil.rmtree(directory / ".hvdprof-cache", ignore_errors=True)
                runs["write"].append(measure(["analyze", str(directory), "--json"]))
                runs["cached"].append(measure(["analyze", str(directory), "--json"]))
                with grown_by_a_tenth(directory):
                    measure(["analyze", str(directory), "--json"])  # caches the open files
                runs["grown"].append(measure(["analyze", str(directory), "--json"]))
            entry: dict[str, Any] = {"events": truth.events, "bytes": nbytes, "ranks": args.ranks}
            for variant, samples in runs.items():
                med = {k: statistics.median(s[k] for s in samples) for k in samples[0]}
                med["max_peak_rss_mb"] = max(s["peak_rss_mb"] for s in samples)
                med["max_peak_tree_rss_mb"] = max(s["peak_tree_rss_mb"] for s in samples)
                med["wall_s_per_million_events"] = med["wall_s"] / (truth.events / 1e6)
                med["cpu_s_per_million_events"] = med["cpu_s"] / (truth.events / 1e6)
                med["samples"] = samples
                entry[variant] = med
            sizes.append(entry)
        largest = base / f"run-{int(args.events * fractions[-1])}"
        window = window_latency(str(largest), 5 if args.quick else 20)
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)

    rows = []
    for e in sizes:
        for variant in VARIANTS:
            v = e[variant]
            rows.append(
                [
                    f"{e['events']:,}",
                    variant,
                    f"{v['wall_s']:.2f}",
                    f"{v['cpu_s']:.2f}",
                    f"{v['wall_s_per_million_events']:.2f}",
                    f"{v['cpu_s_per_million_events']:.2f}",
                    f"{v['max_peak_rss_mb']:.0f}",
                    f"{v['max_peak_tree_rss_mb']:.0f}",
                ]
            )
    print(
        _harness.table(
            rows,
            [
                "events",
                "cache",
                "wall s",
                "cpu s",
                "wall s / 1M ev",
                "cpu s / 1M ev",
                "peak RSS MB",
                "tree RSS MB",
            ],
        )
    )
    print(
        f"timeline_window on {int(window['slices']):,} slices: whole run {window['whole_run_ms']:.1f} ms, "
        f"1% zoom {window['zoom_1pct_ms']:.1f} ms, one rank's lanes (10%) {window['rank_lanes_10pct_ms']:.1f} ms"
    )
    biggest = sizes[-1]
    goal = {
        "events": biggest["events"],
        "wall_s_cold": biggest["cold"]["wall_s"],
        "wall_s_cached": biggest["cached"]["wall_s"],
        "cpu_s_cold": biggest["cold"]["cpu_s"],
        "cpu_s_cached": biggest["cached"]["cpu_s"],
        "wall_s_grown": biggest["grown"]["wall_s"],
        "cpu_s_grown": biggest["grown"]["cpu_s"],
        "peak_rss_mb": max(biggest[v]["max_peak_rss_mb"] for v in VARIANTS),
        "peak_tree_rss_mb": max(biggest[v]["max_peak_tree_rss_mb"] for v in VARIANTS),
        "goal": "1M events <= 5 s end to end, peak RSS <= 1 GB",
    }
    path = _harness.write_results(
        "analysis_bench",
        {"variants": sizes, "window_query": window, "goal_check": goal, "repeats": args.repeats},
        args.output,
        args.quick,
    )
    print(f"results: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
