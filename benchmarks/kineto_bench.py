"""hvdprof against HTA on the same torch.profiler (Kineto) traces: cold wall time and peak
memory (PSS of the whole process tree), on a synthetic run and on HTA's own real traces.

Writes a synthetic 8-rank NCCL training run as Kineto traces (``worker<r>.<id>.pt.trace.json``,
``distributedInfo``, ``baseTimeNanoseconds``), at least 2 million events in all by default:
per step a ``ProfilerStep#N``, hundreds of ``aten::`` ops each launching a compute kernel
through ``cudaLaunchKernel`` (correlation ids), memcpys, and DDP's bucketed allreduces
(``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce`` launching an
``ncclDevKernel_AllReduce`` on its own stream); one rank runs late. The second data set is
real: the two ranks of a 128-rank NCCL job in ``tests/data/kineto-hta`` (HTA's test data),
which our generator did not write.

Then, on each data set, each tool in a fresh process (cold: no cache, nothing imported
before), ``--repeats`` times (default 5) interleaved, the order alternating per repeat:

* hvdprof: ``load_run`` + ``analyze`` (every question, HTA's GPU numbers included); then,
  timed apart inside it but within its wall time, the dashboard's GPU stream lanes of the
  rank with most GPU events (first view and a zoom, ``stream_lanes`` in the result);
* HTA (HolisticTraceAnalysis): ``TraceAnalysis(trace_dir)`` + ``get_temporal_breakdown`` +
  ``get_comm_comp_overlap``, with its defaults (it parses ranks in worker processes).

Wall time is the child's whole life (imports included). Memory is the peak over the run
of the child's whole process tree counted once: every process's private pages plus the
largest set of shared ones (HTA's forked parse workers share their parent's pages, which
summed RSS counted once per worker), read from /proc every 10-100 ms; the tree's summed
PSS is kept beside it (see :func:`tree_memory` for why it is not the one compared).
Reported: the median and range of each, and of the ratios of each repeat's back-to-back
pair. The two answers are compared too: the GPU shares must agree.

HTA is not a dependency of hvdprof: ``--hta-python`` names an interpreter that has it,
else the benchmark uses this one when ``import hta`` works, else it creates a virtual
environment under ``~/.cache/hvdprof-bench/hta-venv`` and pip-installs
``HolisticTraceAnalysis==0.5.0`` there with ``pandas<3`` (HTA 0.5.0 fails on pandas 3; the
registry must be reachable).

    flock -x /tmp/hvdprof-timing.lock .venv/bin/python benchmarks/kineto_bench.py [--events N]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _harness as h
import orjson

ROOT = Path(__file__).resolve().parents[1]
#: HTA's own test traces (two ranks of a real 128-rank NCCL job; see its README.md)
REAL = ROOT / "tests" / "data" / "kineto-hta"
#: the children's memory is sampled every 10 ms, less often where a sample takes longer
#: (reading smaps_rollup walks the page tables: see ``measure``)
SAMPLE_MIN_S, SAMPLE_MAX_S = 0.01, 0.1
HTA_VERSION = "0.5.0"
HTA_VENV = Path.home() / ".cache" / "hvdprof-bench" / "hta-venv"
#: events per step of one rank in the generator (see ``rank_events``)
COMPUTE_OPS, BUCKETS, MEMCPYS = 600, 10, 20
EVENTS_PER_STEP = 2 + COMPUTE_OPS * 4 + BUCKETS * 5 + MEMCPYS * 2


# --- the synthetic run ---------------------------------------------------------------------


def rank_events(rank: int, steps: int, late_rank: int, seed: int) -> Any:
    """Yield one rank's events, in time order per thread, as Kineto writes them."""
    rng = random.Random(seed * 1000 + rank)
    pid, tid = 1000 + rank, 1000 + rank
    corr = 1
    t = 1_000.0
    yield {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": "python"}}
    yield {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": "GPU 0"}}
    for step in range(steps):
        step_start = t
        events: list[dict[str, Any]] = []
        gpu_t = t + 20.0
        nccl_end = 0.0
        late = 4000.0 if rank == late_rank else 0.0
        bucket_every = COMPUTE_OPS // BUCKETS
        for i in range(COMPUTE_OPS):
            if i == COMPUTE_OPS // 2:
                t += late  # the late rank's backward starts later
            d = 8.0 + rng.random() * 4.0
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "pid": pid, "tid": tid,
                 "ts": t, "dur": d, "args": {"External id": corr, "Ev Idx": corr}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "pid": pid, "tid": tid,
                 "ts": t + 1.0, "dur": d - 2.0, "args": {"External id": corr}}
            )  # fmt: skip
            events.append(
                {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                 "tid": tid, "ts": t + 2.0, "dur": 3.0,
                 "args": {"External id": corr, "cbid": 211, "correlation": corr}}
            )  # fmt: skip
            gpu_t = max(gpu_t, t + 6.0)
            k = 6.0 + rng.random() * 10.0
            events.append(
                {"ph": "X", "cat": "kernel",
                 "name": "void at::native::vectorized_elementwise_kernel<4, float>(int, float*)",
                 "pid": 0, "tid": 7, "ts": gpu_t, "dur": k,
                 "args": {"External id": corr, "device": 0, "stream": 7,
                          "correlation": corr, "grid": [80, 1, 1], "block": [128, 1, 1]}}
            )  # fmt: skip
            gpu_t += k + rng.random() * 3.0
            corr += 1
            t += d + 1.0
            if i % (COMPUTE_OPS // MEMCPYS) == 0:
                events.append(
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "pid": pid,
                     "tid": tid, "ts": t, "dur": 4.0, "args": {"correlation": corr}}
                )  # fmt: skip
                events.append(
                    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD (Pinned -> Device)",
                     "pid": 0, "tid": 7, "ts": gpu_t, "dur": 5.0,
                     "args": {"device": 0, "stream": 7, "correlation": corr, "bytes": 65536}}
                )  # fmt: skip
                gpu_t += 5.0
                corr += 1
                t += 5.0
            if i >= COMPUTE_OPS // 2 and (i + 1) % bucket_every == 0:
                nbytes = 25 << 20
                events.append(
                    {"ph": "X", "cat": "cpu_op", "name": "c10d::allreduce_", "pid": pid,
                     "tid": tid, "ts": t, "dur": 40.0, "args": {"External id": corr}}
                )  # fmt: skip
                events.append(
                    {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": pid,
                     "tid": tid, "ts": t + 2.0, "dur": 34.0,
                     "args": {"In msg nelems": nbytes // 4, "Out msg nelems": nbytes // 4,
                              "dtype": "Float", "Group size": 8}}
                )  # fmt: skip
                events.append(
                    {"ph": "X", "cat": "user_annotation", "name": "nccl:all_reduce", "pid": pid,
                     "tid": tid, "ts": t + 4.0, "dur": 28.0, "args": {"External id": corr}}
                )  # fmt: skip
                events.append(
                    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": pid,
                     "tid": tid, "ts": t + 10.0, "dur": 6.0, "args": {"correlation": corr}}
                )  # fmt: skip
                events.append(
                    {"ph": "X", "cat": "kernel",
                     "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned "
                             "long, ncclWork*)",
                     "pid": 0, "tid": 20, "ts": t + 20.0,
                     # the others' kernels spin until the late rank's starts: all end together
                     "dur": 900.0 + rng.random() * 100.0 + (4000.0 - late),
                     "args": {"device": 0, "stream": 20, "correlation": corr}}
                )  # fmt: skip
                nccl_end = max(nccl_end, events[-1]["ts"] + events[-1]["dur"])
                corr += 1
                t += 41.0
        t = max(t, gpu_t, nccl_end) + 200.0  # the step ends when its collectives do
        yield {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid,
               "tid": tid, "ts": step_start, "dur": t - step_start, "args": {}}  # fmt: skip
        yield from events


def write_run(directory: Path, ranks: int, steps: int, late_rank: int) -> int:
    """The synthetic run's files; returns the number of events written."""
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    base_ns = 1_790_000_000_000_000_000
    for rank in range(ranks):
        head = {
            "schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "Synthetic GPU", "totalGlobalMem": 85 << 30}],
            "distributedInfo": {"backend": "nccl", "rank": rank, "world_size": ranks},
            "baseTimeNanoseconds": base_ns,
        }
        path = directory / f"worker{rank}.{1000 + rank}.pt.trace.json"
        with path.open("wb") as f:
            # json's ": " separators, as Kineto writes them (HTA finds the rank by regex)
            f.write(json.dumps(head).encode()[:-1] + b',\n  "traceEvents": [\n')
            first = True
            batch: list[bytes] = []
            for e in rank_events(rank, steps, late_rank, seed=7):
                batch.append((b"" if first else b",\n") + orjson.dumps(e))
                first = False
                total += 1
                if len(batch) >= 10_000:
                    f.write(b"".join(batch))
                    batch.clear()
            f.write(b"".join(batch))
            f.write(b'\n  ],\n  "traceName": "' + path.name.encode() + b'"\n}\n')
    return total


# --- measuring a child process -------------------------------------------------------------

OURS = """
import json, sys, time
t0 = time.perf_counter()
from hvdprof.analysis import analyze, load_run
run = load_run(sys.argv[1], cache=False)
report = analyze(run).to_dict()
out = {"gpu": {str(r["rank"]): [100 * r[k] for k in ("idle_share", "compute_share",
       "non_compute_share", "comm_comp_overlap_share")] for r in report["gpu"]["ranks"]},
       "straggler": report["stragglers"]["straggler"], "events": run.events,
       "inner_s": time.perf_counter() - t0}
# the dashboard's GPU stream lanes of the rank with the most GPU events: the first view
# (whole run, binned), cold (its kernels sorted and merged on the way), then zoomed to 1%
# (after inner_s: not part of the comparison with HTA)
from hvdprof.analysis import timeline_window
from hvdprof.analysis.gpu_lanes import stream_extent
if run.gpu:
    big = max(run.gpu, key=lambda r: len(run.gpu[r].start_us))
    a, b = stream_extent(run, big)
    t1 = time.perf_counter()
    timeline_window(run, a, b, expand_rank=big, lanes="stream", max_items=5600)
    t2 = time.perf_counter()
    mid = a + 0.5 * (b - a)
    timeline_window(run, mid, mid + 0.01 * (b - a), expand_rank=big, lanes="stream", max_items=5600)
    out["stream_lanes"] = {"rank": big, "gpu_events": int(len(run.gpu[big].start_us)),
                           "first_view_ms": 1000 * (t2 - t1),
                           "zoom_1pct_ms": 1000 * (time.perf_counter() - t2)}
print("RESULT " + json.dumps(out))
"""

THEIRS = """
import json, sys, time, logging
logging.disable(logging.INFO)
t0 = time.perf_counter()
from hta.trace_analysis import TraceAnalysis
ta = TraceAnalysis(trace_dir=sys.argv[1])
tb = ta.get_temporal_breakdown(visualize=False)
ov = ta.get_comm_comp_overlap(visualize=False)
over = {int(r): float(v) for r, v in zip(ov["rank"], ov["comp_comm_overlap_pctg"])}
out = {"gpu": {str(int(r["rank"])): [float(r["idle_time_pctg"]), float(r["compute_time_pctg"]),
       float(r["non_compute_time_pctg"]), over[int(r["rank"])]] for _, r in tb.iterrows()},
       "inner_s": time.perf_counter() - t0}
print("RESULT " + json.dumps(out))
"""


def _tree(root: int) -> list[int]:
    """``root`` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))  # ppid
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo += children.get(pid, [])
    return found


def _rollup(pid: int) -> dict[bytes, int]:
    """The memory counters of one process in bytes (none once it is gone)."""
    out: dict[bytes, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                key, _, rest = line.partition(b":")
                if rest.endswith(b"kB\n"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def tree_memory(root: int) -> tuple[int, int]:
    """The tree's memory two ways, in bytes: its processes' summed PSS, and the tree
    counted once (each process's private pages, plus the largest set of shared ones).

    PSS splits a page between the processes that map it, so a forked worker's inherited
    pages count once over the tree (summed RSS counted them once per worker); but it also
    splits the pages the tree shares with processes outside it (numpy's libraries with
    another Python running beside the benchmark), which flatters whichever tool shares
    more with them. Counted once, a shared page counts in full: the workers' shared pages
    are (at most) their parent's, so the largest process's shared set stands for them all.
    """
    counters = [_rollup(pid) for pid in _tree(root)]
    pss = sum(c.get(b"Pss", 0) for c in counters)
    private = sum(c.get(b"Private_Clean", 0) + c.get(b"Private_Dirty", 0) for c in counters)
    shared = max(
        (c.get(b"Shared_Clean", 0) + c.get(b"Shared_Dirty", 0) for c in counters), default=0
    )
    return pss, private + shared


def measure(python: str, code: str, directory: Path, timeout: float) -> dict[str, Any]:
    """Run ``code`` in a fresh ``python``: its wall time and the peak of its process
    tree (:func:`tree_memory`, sampled every 10 to 100 ms)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONWARNINGS="ignore")
    started = time.perf_counter()
    proc = subprocess.Popen(
        [python, "-c", code, str(directory)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=str(ROOT),
    )
    peak = [0, 0]  # PSS, counted once
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            t = time.perf_counter()
            peak[:] = map(max, peak, tree_memory(proc.pid))
            # as often as costs a fifth of the sampler's core: a short run gets samples
            # every 10 ms, a tree of gigabytes (whose page tables take long to walk) fewer
            done.wait(min(SAMPLE_MAX_S, max(SAMPLE_MIN_S, 4 * (time.perf_counter() - t))))

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise SystemExit(f"timed out after {timeout:.0f} s:\n{err[-3000:]}") from None
    finally:
        done.set()
        sampler.join()
    wall = time.perf_counter() - started
    lines = [x for x in out.splitlines() if x.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise SystemExit(f"{python} failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}")
    result = json.loads(lines[-1][len("RESULT ") :])
    result.update(wall_s=wall, peak_pss_mib=peak[0] / (1 << 20), peak_mib=peak[1] / (1 << 20))
    return result


def hta_python(explicit: str | None, install: bool) -> str | None:
    """An interpreter that can ``import hta``, installing HTA into a venv if needed."""
    if explicit:
        return explicit
    if importlib.util.find_spec("hta") is not None:
        return sys.executable
    venv_python = HTA_VENV / "bin" / "python"
    if venv_python.exists():
        ok = subprocess.run([str(venv_python), "-c", "import hta"], capture_output=True)
        if ok.returncode == 0:
            return str(venv_python)
    if not install:
        return None
    print(f"installing HolisticTraceAnalysis=={HTA_VERSION} into {HTA_VENV} ...", flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(HTA_VENV)], check=True)
    subprocess.run(
        [
            str(venv_python),
            "-m",
            "pip",
            "install",
            "-q",
            f"HolisticTraceAnalysis=={HTA_VERSION}",
            # HTA 0.5.0's parser stores ints wider than its int16 columns, which pandas 3
            # refuses ("Invalid value ... for dtype 'int16'") where pandas 2 widened them
            "pandas<3",
        ],
        check=True,
    )
    return str(venv_python)


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def compare(
    name: str, directory: Path, python: str | None, repeats: int, timeout: float
) -> dict[str, Any]:
    """Both tools on ``directory``, ``repeats`` times interleaved (the order alternating
    per repeat, so neither always runs on a machine the other just warmed or cooled):
    per tool, every run and the median and range of wall time and peak PSS; per repeat,
    the ratios of the pair that ran back to back."""
    tools = {"hvdprof": (sys.executable, OURS)}
    if python:
        tools["hta"] = (python, THEIRS)
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in tools}
    for rep in range(repeats):
        order = list(tools) if rep % 2 == 0 else list(tools)[::-1]
        for tool in order:
            r = measure(*tools[tool], directory, timeout)
            runs[tool].append(r)
            print(
                f"  [{name} {rep + 1}/{repeats}] {tool}: {r['wall_s']:.2f} s, "
                f"peak {r['peak_mib']:.0f} MiB (PSS {r['peak_pss_mib']:.0f})",
                flush=True,
            )
    out: dict[str, Any] = {"variants": {}}
    for tool, rs in runs.items():
        out["variants"][tool] = {
            "wall_s": _spread([r["wall_s"] for r in rs]),
            "peak_mib": _spread([r["peak_mib"] for r in rs]),
            "peak_pss_mib": _spread([r["peak_pss_mib"] for r in rs]),
            "runs": [{k: v for k, v in r.items() if k != "gpu"} for r in rs],
            "gpu": rs[-1].get("gpu"),
        }
    if "hta" in runs:
        ours, theirs = runs["hvdprof"], runs["hta"]
        out["speedup"] = _spread(
            [t["wall_s"] / o["wall_s"] for o, t in zip(ours, theirs, strict=True)]
        )
        out["memory_fraction"] = _spread(
            [o["peak_mib"] / t["peak_mib"] for o, t in zip(ours, theirs, strict=True)]
        )
        diffs = [
            abs(a - b)
            for rank, mine in ours[-1]["gpu"].items()
            for a, b in zip(mine, theirs[-1]["gpu"].get(rank, []), strict=False)
        ]
        out["max_share_difference_points"] = max(diffs) if diffs else None
    return out


def _ratio(spread: dict[str, float], goal: str, met: bool | None) -> dict[str, Any]:
    """A harness-style ratio (``of_medians``, goal, met) with the per-repeat range."""
    return {"of_medians": spread["median"], "min": spread["min"], "max": spread["max"],
            "goal": goal, "met": met}  # fmt: skip


def ratios_of(datasets: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The comparisons docs quote, goals on the synthetic run (what the goals were set
    on); the real traces are context."""
    ratios: dict[str, Any] = {}
    for name, d in datasets.items():
        if "speedup" not in d:
            continue
        synthetic = name == "synthetic"
        s, m = d["speedup"], d["memory_fraction"]
        ratios[f"{name}: HTA wall / hvdprof wall"] = _ratio(
            s, ">= 5" if synthetic else "", s["median"] >= 5 if synthetic else None
        )
        ratios[f"{name}: hvdprof peak memory / HTA's"] = _ratio(
            m, "<= 0.33" if synthetic else "", m["median"] <= 0.33 if synthetic else None
        )
        ratios[f"{name}: largest GPU share difference (points)"] = {
            "value": d["max_share_difference_points"]
        }
    return ratios


def _real_traces(into: Path) -> Path:
    """HTA's own test traces (tests/data/kineto-hta), the trace files alone in a folder."""
    into.mkdir(parents=True, exist_ok=True)
    for path in sorted(REAL.glob("*.json.gz")):
        shutil.copy(path, into / path.name)
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=2_100_000, help="events in all (at least)")
    ap.add_argument("--repeats", type=int, default=5, help="interleaved runs of each tool")
    ap.add_argument(
        "--quick", action="store_true", help="40,000 events, 2 repeats, no HTA unless present"
    )
    ap.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--no-hta", action="store_true", help="time hvdprof alone")
    ap.add_argument("--keep", help="write the traces here and keep them")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    events = 40_000 if args.quick else args.events
    repeats = 2 if args.quick else args.repeats
    steps = max(1, -(-events // (args.ranks * EVENTS_PER_STEP)))
    python = None if args.no_hta else hta_python(args.hta_python, install=not args.quick)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kineto-bench-"))
    try:
        t0 = time.perf_counter()
        synthetic = tmp / "synthetic"
        written = write_run(synthetic, args.ranks, steps, late_rank=args.ranks - 1)
        size = sum(p.stat().st_size for p in synthetic.iterdir())
        print(
            f"{args.ranks} ranks, {written:,} events, {size / (1 << 20):.0f} MiB "
            f"(written in {time.perf_counter() - t0:.1f} s); {repeats} interleaved repeats",
            flush=True,
        )
        datasets = {
            "synthetic": {"ranks": args.ranks, "events": written, "bytes": size,
                          **compare("synthetic", synthetic, python, repeats, args.timeout)},
            "hta_tests": {"files": sorted(p.name for p in REAL.glob("*.json.gz")),
                          **compare("hta_tests", _real_traces(tmp / "real"), python, repeats,
                                    args.timeout)},
        }  # fmt: skip
        ratios = ratios_of(datasets)
        lanes = datasets["synthetic"]["variants"]["hvdprof"]["runs"][-1].get("stream_lanes")
        for what, r in ratios.items():
            shown = r.get("of_medians", r.get("value"))
            spread = f" (range {r['min']:.2f}-{r['max']:.2f})" if "min" in r else ""
            print(f"{what}: {shown:.3f}{spread} {r.get('goal', '')}")
        path = h.write_results(
            "kineto_bench",
            {
                "settings": {
                    "quick": args.quick,
                    "repeats": repeats,
                    "interleaved": "per repeat both tools, order alternating by repeat",
                    "memory": "peak_mib: the child's process tree counted once (private "
                    "pages of each process + the largest shared set), the ratios' measure; "
                    "peak_pss_mib: the tree's summed PSS; both from /proc/<pid>/smaps_rollup "
                    f"sampled every {SAMPLE_MIN_S}-{SAMPLE_MAX_S} s",
                    "hta_version": HTA_VERSION if python else None,
                },
                "datasets": datasets,
                # each tool's medians per data set (the runs are in datasets)
                "variants": {
                    f"{name}: {tool}": {k: v[k]["median"] for k in ("wall_s", "peak_mib")}
                    for name, d in datasets.items()
                    for tool, v in d["variants"].items()
                },
                "ratios": ratios,
                "stream_lanes": lanes,
            },
            args.output,
            args.quick,
        )
        print(f"wrote {path}")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
