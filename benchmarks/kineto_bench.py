"""hvdprof against HTA on the same torch.profiler (Kineto) traces: cold wall time and peak RSS.

Writes a synthetic 8-rank NCCL training run as Kineto traces (``worker<r>.<id>.pt.trace.json``,
``distributedInfo``, ``baseTimeNanoseconds``), at least 2 million events in all by default:
per step a ``ProfilerStep#N``, hundreds of ``aten::`` ops each launching a compute kernel
through ``cudaLaunchKernel`` (correlation ids), memcpys, and DDP's bucketed allreduces
(``c10d::allreduce_`` > ``record_param_comms`` > ``nccl:all_reduce`` launching an
``ncclDevKernel_AllReduce`` on its own stream); one rank runs late.

Then, each in a fresh process (cold: no cache, nothing imported before):

* hvdprof: ``load_run`` + ``analyze`` (every question, HTA's GPU numbers included); then,
  timed apart, the dashboard's GPU stream lanes of the rank with most GPU events (first
  view and a zoom, ``stream_lanes`` in the result);
* HTA (HolisticTraceAnalysis): ``TraceAnalysis(trace_dir)`` + ``get_temporal_breakdown`` +
  ``get_comm_comp_overlap``, with its defaults (it parses ranks in worker processes).

Wall time is the child's whole life; peak RSS is the largest sum over the child and all
its descendants, sampled from /proc every 20 ms (HTA's parse workers count). The two answers are
compared too: the GPU shares must agree.

HTA is not a dependency of hvdprof: ``--hta-python`` names an interpreter that has it,
else the benchmark uses this one when ``import hta`` works, else it creates a virtual
environment under ``~/.cache/hvdprof-bench/hta-venv`` and pip-installs
``HolisticTraceAnalysis==0.5.0`` there (the registry must be reachable).

    flock /tmp/hvdprof-timing.lock .venv/bin/python benchmarks/kineto_bench.py
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "kineto_bench.json"
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


def _tree_rss(root: int) -> int:
    """Resident bytes of ``root`` and all its descendants, from /proc (Linux)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    page = os.sysconf("SC_PAGE_SIZE")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        pid = int(name)
        children.setdefault(int(fields[1]), []).append(pid)  # ppid
        rss[pid] = int(fields[21]) * page
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += rss.get(pid, 0)
        todo += children.get(pid, [])
    return total


def measure(python: str, code: str, directory: Path, timeout: float) -> dict[str, Any]:
    """Run ``code`` in a fresh ``python``; wall time, peak RSS of its process tree."""
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
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            done.wait(0.02)

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
    result.update(wall_s=wall, peak_rss_mib=peak / (1 << 20))
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
        [str(venv_python), "-m", "pip", "install", "-q", f"HolisticTraceAnalysis=={HTA_VERSION}"],
        check=True,
    )
    return str(venv_python)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--events", type=int, default=2_100_000, help="events in all (at least)")
    ap.add_argument("--quick", action="store_true", help="40,000 events, no HTA unless present")
    ap.add_argument("--hta-python", help="an interpreter with HolisticTraceAnalysis installed")
    ap.add_argument("--no-hta", action="store_true", help="time hvdprof alone")
    ap.add_argument("--keep", help="write the traces here and keep them")
    ap.add_argument("--output", default=str(RESULTS))
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    events = 40_000 if args.quick else args.events
    steps = max(1, -(-events // (args.ranks * EVENTS_PER_STEP)))
    python = None if args.no_hta else hta_python(args.hta_python, install=not args.quick)
    tmp = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="kineto-bench-"))
    try:
        t0 = time.perf_counter()
        written = write_run(tmp, args.ranks, steps, late_rank=args.ranks - 1)
        size = sum(p.stat().st_size for p in tmp.iterdir())
        print(
            f"{args.ranks} ranks, {written:,} events, {size / (1 << 20):.0f} MiB "
            f"(written in {time.perf_counter() - t0:.1f} s)",
            flush=True,
        )
        ours = measure(sys.executable, OURS, tmp, args.timeout)
        print(
            f"hvdprof: {ours['wall_s']:.1f} s, peak RSS {ours['peak_rss_mib']:.0f} MiB", flush=True
        )
        lanes = ours.get("stream_lanes")
        if lanes:
            print(
                f"GPU stream lanes of rank {lanes['rank']} ({lanes['gpu_events']:,} GPU events): "
                f"first view {lanes['first_view_ms']:.0f} ms, zoomed to 1% "
                f"{lanes['zoom_1pct_ms']:.1f} ms",
                flush=True,
            )
        result: dict[str, Any] = {
            "benchmark": "kineto_bench",
            "when": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": platform.node(),
            "cpus": os.cpu_count(),
            "ranks": args.ranks,
            "events": written,
            "bytes": size,
            "variants": {"hvdprof": ours},
        }
        if python:
            theirs = measure(python, THEIRS, tmp, args.timeout)
            print(f"HTA:     {theirs['wall_s']:.1f} s, peak RSS {theirs['peak_rss_mib']:.0f} MiB")
            result["variants"]["hta"] = theirs
            speed = theirs["wall_s"] / ours["wall_s"]
            rss = ours["peak_rss_mib"] / theirs["peak_rss_mib"]
            diffs = [
                abs(a - b)
                for rank, mine in ours["gpu"].items()
                for a, b in zip(mine, theirs["gpu"].get(rank, []), strict=False)
            ]
            result["ratios"] = {
                "speedup": speed,
                "rss_fraction": rss,
                "max_share_difference_points": max(diffs) if diffs else None,
            }
            print(
                f"hvdprof is {speed:.1f}x faster (goal >= 5x) with {rss:.2f} of HTA's peak RSS "
                f"(goal <= 0.33); GPU shares differ by at most "
                f"{max(diffs) if diffs else float('nan'):.3f} points"
            )
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
