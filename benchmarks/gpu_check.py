"""The GPU check (issue 54): one command that proves or breaks the CUDA path on one GPU.

Run from the repository root on a machine with one NVIDIA GPU (sized for one H200: the
steps' limits add up to 8 minutes, so with the set-up the whole fits one 10-minute
command)::

    python3 benchmarks/gpu_check.py [--out DIR]          # set up, then every step
    python3 benchmarks/gpu_check.py --dry-run            # list the steps; exits 0 on CPU

Set-up (``--setup``): ``venv`` runs ``.ci/setup`` with ``HVDPROF_SETUP_CORE_ONLY=1``
(.venv with torch 2.13.0, hvdprof and its dev, nvtx and dashboard extras; no browser, MPI
or Ray): on Linux with PyPI as the index, ``torch==2.13.0`` is the CUDA build, so the same
script that gives CI the CPU build gives a GPU machine the CUDA one. ``image`` uses this
interpreter's torch (a CUDA image's), with hvdprof from this checkout on ``PYTHONPATH``
and, from ``--wheels DIR``, the packages that image lacks (made here by
``--fetch-wheels DIR`` on a machine that reaches PyPI, for a GPU machine that reaches
nothing). ``auto`` (the default) picks ``image`` when ``--wheels`` is given or this
interpreter's torch sees a GPU, else ``venv``.

Each step runs in its own process group with its own limit, and one failing never stops
the next (see ``STEPS``, or ``--dry-run``): the ``gpu`` tests that fit one GPU (one rank
on NCCL; two ranks sharing the GPU through Gloo on CUDA tensors; the two-GPU ones, which
skip and say why), Horovod's synthetic benchmark at one rank, and a real torch.profiler
trace of a 2-rank job on the GPU with a known slow rank, read back by ``hvdprof
analyze``. It writes ``benchmarks/results/gpu_check.json`` (and ``DIR/gpu_check.json``,
the log, the traces and the analysis with ``--out DIR``) and prints one summary line.

``--analyze-trace DIR`` runs the trace step's analysis alone on any torch.profiler traces
of a GPU job (CI runs it on ``tests/data/kineto-hta``: tests/test_gpu_check.py).
This module imports only the standard library at the top: it runs before the set-up.
"""

from __future__ import annotations

import argparse
import datetime
import gzip
import importlib.metadata
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results" / "gpu_check.json"
DEVICE_TESTS = "tests/test_device_path.py"
#: the steps' wall-clock budget (seconds): each step's limit is cut to what is left
BUDGET_S = 480
#: the trace step's slow rank and its sleep before each backward (ms)
SLOW_RANK = 1
SLOW_MS = 150.0
#: the straggler's cost must lie within these multiples of the sleep to pass
COST_BAND = (0.5, 1.5)
#: what a CUDA image (this workplace's, KINDS.md) lacks of hvdprof's core and nvtx
#: dependencies: fetched as wheels at the versions this checkout's tests run on
WHEELS_FOR_IMAGE = ("msgspec", "orjson", "scikit-optimize", "pyaml", "nvtx")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


# ------------------------------------------------------------------------------ steps
@dataclass
class Context:
    python: str
    env: dict[str, str]
    work: Path  # traces, junit files
    out: Path | None  # --out: what comes back to the caller


@dataclass
class Step:
    name: str
    what: str  # what it checks, in a line (the dry run and docs/cuda.md)
    limit_s: int
    kind: str  # "probe" | "pytest" | "record" | "analyze"
    argv: Callable[[Context], list[str]]


def _pytest(selection: str) -> Callable[[Context], list[str]]:
    def argv(ctx: Context) -> list[str]:
        return [
            ctx.python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rA", "-m", "gpu",
            DEVICE_TESTS, "-k", selection,
        ]  # fmt: skip

    return argv


def _probe(ctx: Context) -> list[str]:
    return [ctx.python, str(Path(__file__)), "--probe-machine"]


def _record(ctx: Context) -> list[str]:
    return [
        ctx.python, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "--max_restarts", "0", "tests/workers/kineto_gpu_worker.py",
        str(ctx.work / "trace"), str(SLOW_RANK), str(SLOW_MS),
    ]  # fmt: skip


def _analyze(ctx: Context) -> list[str]:
    report = (ctx.out or ctx.work) / "analyze.txt"
    return [
        ctx.python, str(Path(__file__)), "--analyze-trace", str(ctx.work / "trace"),
        "--slow-rank", str(SLOW_RANK), "--slow-ms", str(SLOW_MS), "--report-out", str(report),
    ]  # fmt: skip


STEPS: tuple[Step, ...] = (
    Step(
        "machine",
        "the GPU, driver, torch, CUDA, NCCL and nvtx as this interpreter sees them",
        40, "probe", _probe,
    ),
    Step(
        "device-path-nccl-1gpu",
        "1 rank on NCCL: 5 collectives x fp16/bf16/fp32 on CUDA tensors, 100 tensors fused "
        "in buffers on the GPU, the timeline's NCCL phases, NCCL_ALLREDUCE durations "
        "against torch.cuda.Event timings, no host synchronize on the user's thread, "
        "NVTX ranges through the nvtx package",
        110, "pytest", _pytest("nccl-1gpu and not synthetic"),
    ),
    Step(
        "profiler-trace-record",
        f"a 2-rank DDP job on the one GPU (Gloo, CUDA tensors) recorded by torch.profiler, "
        f"rank {SLOW_RANK} sleeping {SLOW_MS:g} ms per step",
        90, "record", _record,
    ),
    Step(
        "profiler-trace-analyze",
        "hvdprof analyze on that trace: every GPU event in a stream lane, the GPU card per "
        f"rank, rank {SLOW_RANK} named the straggler at {COST_BAND[0]:g}-{COST_BAND[1]:g}x "
        f"its {SLOW_MS:g} ms",
        50, "analyze", _analyze,
    ),
    Step(
        "gloo-2ranks-1gpu",
        "2 ranks sharing the GPU through Gloo on CUDA tensors: the same checks as the "
        "NCCL step (each op and dtype torch's Gloo refuses skips with torch's message)",
        90, "pytest", _pytest("gloo-2ranks-1gpu"),
    ),
    Step(
        "synthetic-benchmark-1gpu",
        "Horovod's pytorch_synthetic_benchmark.py (import changed) at 1 rank on NCCL",
        60, "pytest", _pytest("synthetic and nccl-1gpu"),
    ),
    Step(
        "two-gpu-tests",
        "the 2-GPU layouts (NCCL at 2 ranks): they skip with the reason on one GPU",
        40, "pytest", _pytest("nccl-2gpus or nccl-2ranks-1gpu"),
    ),
)  # fmt: skip


# ------------------------------------------------------------------------------ results
@dataclass
class StepResult:
    name: str
    what: str
    status: str = "not run"  # passed | failed | skipped | timed out | not run
    seconds: float = 0.0
    limit_s: float = 0.0
    reason: str = ""
    tests: list[dict[str, Any]] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    output_tail: str = ""


def _run(argv: list[str], env: dict[str, str], limit_s: float) -> tuple[int | None, str, float]:
    """(exit code or None when killed at ``limit_s``, stdout+stderr, seconds)."""
    started = time.monotonic()
    proc = subprocess.Popen(
        argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=max(limit_s, 1.0))
        code: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate(timeout=30)
        code = None
    return code, out or "", time.monotonic() - started


def junit_tests(path: Path) -> list[dict[str, Any]]:
    """Each test case of a pytest JUnit file: id, outcome, reason, recorded properties."""
    if not path.exists():
        return []
    tests = []
    for case in ET.parse(path).getroot().iter("testcase"):
        outcome, reason = "passed", ""
        for tag in ("failure", "error", "skipped"):
            node = case.find(tag)
            if node is not None:
                outcome = {"failure": "failed", "error": "failed", "skipped": "skipped"}[tag]
                reason = " ".join((node.get("message") or "").split())[:400]
                break
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        tests.append(
            {"id": case.get("name"), "outcome": outcome, "reason": reason, "figures": props}
        )
    return tests


def _status_of_tests(result: StepResult, code: int | None) -> None:
    outcomes = Counter(t["outcome"] for t in result.tests)
    if code not in (0, 5) or outcomes["failed"]:
        result.status = "failed"
        result.reason = f"pytest exit {code}: {outcomes['failed']} failed"
    elif outcomes["passed"]:
        result.status = "passed"
    else:
        result.status = "skipped"
        reasons = sorted({t["reason"] for t in result.tests if t["reason"]})
        result.reason = "; ".join(reasons)[:400] or "no test selected"


def run_step(step: Step, ctx: Context, limit_s: float, log: Any) -> StepResult:
    result = StepResult(step.name, step.what, limit_s=round(limit_s))
    if step.kind == "analyze" and not list((ctx.work / "trace").glob("*.pt.trace.json*")):
        result.status, result.reason = "skipped", "the record step wrote no trace to analyze"
        return result
    argv = step.argv(ctx)
    figures_file = ctx.work / f"{step.name}.json"
    junit = ctx.work / f"{step.name}.junit.xml"
    if step.kind == "pytest":
        argv += [f"--junitxml={junit}", "-o", f"timeout={int(limit_s)}"]
    elif step.kind in ("probe", "analyze"):
        argv += ["--json-out", str(figures_file)]
    code, out, seconds = _run(argv, ctx.env, limit_s)
    result.seconds = round(seconds, 1)
    log.write(f"\n===== {step.name} (exit {code}, {seconds:.1f} s)\n$ {shlex.join(argv)}\n{out}")
    log.flush()
    if figures_file.exists():
        data = json.loads(figures_file.read_text())
        result.figures = data.get("figures", {})
        failed = [c for c in data.get("checks", []) if not c["ok"]]
        result.tests = [
            {"id": c["name"], "outcome": "passed" if c["ok"] else "failed",
             "reason": c["detail"], "figures": {}}
            for c in data.get("checks", [])
        ]  # fmt: skip
        if failed:
            result.reason = "; ".join(f"{c['name']}: {c['detail']}" for c in failed)[:600]
    if step.kind == "pytest":
        result.tests = junit_tests(junit)
    if code is None:
        result.status, result.reason = "timed out", f"killed at its limit of {limit_s:.0f} s"
    elif step.kind == "pytest":
        _status_of_tests(result, code)
    else:
        result.status = "passed" if code == 0 else "failed"
        if code and not result.reason:
            result.reason = f"exit {code}: " + " ".join(out.strip().splitlines()[-1:])[:300]
    if step.kind == "record":
        traces = sorted((ctx.work / "trace").glob("*.pt.trace.json*"))
        result.figures = {
            "files": [p.name for p in traces],
            "bytes": sum(p.stat().st_size for p in traces),
        }
        if code == 0 and len(traces) != 2:
            result.status, result.reason = "failed", f"{len(traces)} trace files, not 2"
    if result.status in ("failed", "timed out"):
        result.output_tail = out[-3000:]
    return result


# ------------------------------------------------------------------------------ set-up
def _has_cuda_torch(python: str) -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:
        return (
            subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode == 0
        )
    except (OSError, subprocess.TimeoutExpired):
        return False


def set_up(args: argparse.Namespace, work: Path, log: Any) -> tuple[Context, dict[str, Any]]:
    """The interpreter and environment every step runs with, and what set-up did."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("HVDPROF_")}
    env["PYTHONUNBUFFERED"] = "1"
    mode = args.setup
    if mode == "auto":
        mode = "image" if args.wheels or _has_cuda_torch(sys.executable) else "venv"
    info: dict[str, Any] = {"mode": mode, "ok": True}
    python, paths = sys.executable, [str(REPO)]
    started = time.monotonic()
    if mode == "venv":
        code, out, _ = _run(
            ["bash", ".ci/setup"], {**env, "HVDPROF_SETUP_CORE_ONLY": "1"}, args.setup_limit_s
        )
        log.write(f"\n===== setup: bash .ci/setup (exit {code})\n{out}")
        python = str(REPO / ".venv" / "bin" / "python")
        if code != 0:
            info.update(ok=False, reason=f".ci/setup exit {code}: {out.strip()[-300:]}")
    elif mode == "image" and args.wheels:
        site = work / "site"
        wheels = sorted(str(p) for p in Path(args.wheels).glob("*.whl"))
        argv = [python, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
                "--no-compile", "--target", str(site), *wheels]  # fmt: skip
        code, out, _ = _run(argv, env, args.setup_limit_s)
        log.write(f"\n===== setup: pip install {len(wheels)} wheels (exit {code})\n{out}")
        info["wheels"] = [Path(w).name for w in wheels]
        if code != 0 or not wheels:
            info.update(
                ok=False, reason=f"no wheels in {args.wheels}" if not wheels else out[-300:]
            )
        paths.insert(0, str(site))
    info["seconds"] = round(time.monotonic() - started, 1)
    info["python"] = python
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return Context(python, env, work, args.out), info


# ------------------------------------------------------------------------------ the run
def plan_lines() -> list[str]:
    lines = [
        "gpu_check: set-up (--setup, limit --setup-limit-s): 'auto' picks 'image' when "
        "--wheels is given or this interpreter's torch sees a GPU, else 'venv'",
        "  venv:  $ HVDPROF_SETUP_CORE_ONLY=1 bash .ci/setup   (torch==2.13.0: PyPI's CUDA "
        "build on Linux), then PYTHON=.venv/bin/python",
        "  image: PYTHON=this interpreter; --wheels DIR: $ pip install --no-index --no-deps "
        "--target WORK/site DIR/*.whl",
        "  none:  PYTHON=this interpreter, as it is",
        f"then {len(STEPS)} steps, each in its own process group with its own limit (cut to "
        f"what is left of {BUDGET_S} s), PYTHONPATH=[WORK/site:]{REPO}:",
    ]
    ctx = Context("PYTHON", {}, Path("WORK"), None)
    for i, step in enumerate(STEPS, 1):
        lines.append(f"  {i}. {step.name} (limit {step.limit_s} s): {step.what}")
        lines.append(f"       $ {shlex.join(step.argv(ctx))}")
    lines.append(f"then writes {RESULTS.relative_to(REPO)} (and DIR/ with --out DIR)")
    return lines


def verdict_of(bad: list[str], passed: int) -> str:
    """FAIL: a step failed, timed out or was not run; SKIPPED: none passed (nothing was
    proved: never a pass); PASS: at least one step passed and none went wrong."""
    return "FAIL" if bad else ("PASS" if passed else "SKIPPED")


def summary_line(report: dict[str, Any]) -> str:
    steps = report["steps"]
    by = Counter(s["status"] for s in steps)
    tests = Counter(t["outcome"] for s in steps for t in s["tests"])
    bad = [s["name"] for s in steps if s["status"] in ("failed", "timed out", "not run")]
    if not report["setup"]["ok"]:
        bad.insert(0, f"set-up ({report['setup']['mode']})")
    machine = next((s["figures"] for s in steps if s["name"] == "machine"), {})
    gpu = machine.get("device_name") or "no GPU"
    return (
        f"gpu_check: {verdict_of(bad, by['passed'])}: {len(steps)} steps: "
        + ", ".join(f"{n} {k}" for k, n in sorted(by.items()))
        + (f" ({', '.join(bad)})" if bad else "")
        + f"; tests and checks {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} "
        f"skipped; {gpu}, torch {machine.get('torch', '?')}; {report['wall_s']:.0f} s"
    )


def run_all(args: argparse.Namespace) -> int:
    started = time.monotonic()
    out: Path | None = args.out.resolve() if args.out else None
    args.out = out
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="hvdprof-gpu-check-"))
    if out is not None:
        (out / "trace").mkdir(exist_ok=True)
        (work / "trace").symlink_to(out / "trace")
    log_path = (out or work) / "gpu_check.log"
    report: dict[str, Any] = {
        "schema": 1,
        "script": "benchmarks/gpu_check.py",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "budget_s": args.budget_s,
    }
    with log_path.open("w") as log:
        ctx, report["setup"] = set_up(args, work, log)
        deadline = time.monotonic() + args.budget_s
        results = []
        for step in STEPS:
            if args.only and step.name not in args.only:
                continue
            left = deadline - time.monotonic()
            if left < 5:
                results.append(StepResult(step.name, step.what, reason="the budget was spent"))
                continue
            results.append(run_step(step, ctx, min(step.limit_s, left), log))
            r = results[-1]
            line = f"  {r.name}: {r.status} ({r.seconds:.0f} s) {r.reason[:160]}"
            print(line.rstrip(), file=sys.stderr, flush=True)  # progress; stdout: the summary
    report["steps"] = [vars(r) for r in results]
    report["wall_s"] = round(time.monotonic() - started, 1)
    report["summary"] = summary_line(report)
    text = json.dumps(report, indent=2) + "\n"
    targets = [args.results] + ([out / "gpu_check.json"] if out is not None else [])
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    print(report["summary"] + f"; {', '.join(str(t) for t in targets)}", flush=True)
    return 0 if report["summary"].startswith("gpu_check: PASS") else 1


# ------------------------------------------------------------------------------ sub-steps
def probe_machine() -> dict[str, Any]:
    """What the steps will run on; fails (``checks``) without a CUDA GPU."""
    figures: dict[str, Any] = {"python": sys.version.split()[0]}
    try:
        smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        figures["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        figures["nvidia_smi"] = f"unavailable: {exc}"
    import torch

    figures.update(torch=torch.__version__, cuda=torch.version.cuda)
    figures["gpus"] = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if figures["gpus"]:
        props = torch.cuda.get_device_properties(0)
        figures.update(device_name=props.name, memory_gib=round(props.total_memory / 2**30, 1))
        figures["capability"] = f"{props.major}.{props.minor}"
    dist = torch.distributed
    figures["nccl"] = None
    if figures["gpus"] and dist.is_nccl_available():
        v = torch.cuda.nccl.version()
        figures["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    for name in ("hvdprof", *WHEELS_FOR_IMAGE, "numpy", "rich", "pytest", "pytest-timeout"):
        try:
            figures[f"version.{name}"] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            figures[f"version.{name}"] = None
    try:
        import nvtx

        figures["nvtx_enabled"] = bool(nvtx.enabled())
    except ImportError:
        figures["nvtx_enabled"] = None
    checks = [
        _check("a CUDA GPU", figures["gpus"] >= 1, f"{figures['gpus']} GPU(s), torch {torch.__version__}"),
        _check("NCCL", figures["nccl"] is not None, f"NCCL {figures['nccl']}"),
        _check("nvtx", figures["nvtx_enabled"] is not None, "the nvtx package imports"),
    ]  # fmt: skip
    return {"checks": checks, "figures": figures}


def _check(name: str, ok: bool, detail: str) -> dict[str, Any]:
    return {"name": name, "ok": bool(ok), "detail": detail}


def file_gpu_events(directory: Path) -> dict[int, Counter[int]]:
    """GPU events per rank and stream, read straight from the trace files (gzip + json,
    not hvdprof's reader): what the stream lanes must hold."""
    files = [directory] if directory.is_file() else sorted(directory.glob("*.json*"))
    per_rank: dict[int, Counter[int]] = {}
    for path in files:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt") as f:
            trace = json.load(f)
        rank = int((trace.get("distributedInfo") or {}).get("rank", -1))
        per_rank[rank] = Counter(
            int(e["args"]["stream"])
            for e in trace.get("traceEvents", [])
            if e.get("ph") == "X"
            and e.get("cat") in GPU_CATEGORIES
            and "stream" in (e.get("args") or {})
        )
    return per_rank


def stream_lanes(directory: Path) -> dict[int, dict[str, Any]]:
    """Per rank: the stream lanes the dashboard draws (``timeline_window(lanes="stream")``)
    over the rank's whole GPU span: each stream's role and events drawn."""
    from hvdprof.analysis import load_run, timeline_window
    from hvdprof.analysis.gpu_lanes import stream_extent

    run = load_run(directory, cache=False)
    lanes = {}
    for rank in sorted(run.gpu):
        t0, t1 = stream_extent(run, rank)
        w = timeline_window(
            run, t0, t1, expand_rank=rank, lanes="stream", max_items=10**7
        ).to_dict()
        rows = {r["row"]: r for r in w["rows"]}
        drawn = Counter(
            rows[r]["stream"] for r in w["slices"]["row"] if rows[r]["stream"] is not None
        )
        lanes[rank] = {
            "streams": {str(r["stream"]): r["role"] for r in w["rows"] if r["stream"] is not None},
            "drawn": {str(s): n for s, n in sorted(drawn.items())},
            "aggregated": w["aggregated"],
        }
    return lanes


def analyze_trace(
    directory: Path, slow_rank: int | None, slow_ms: float | None, report_out: Path | None
) -> dict[str, Any]:
    """The trace step: ``hvdprof analyze`` (the CLI, JSON) and the stream lanes on the
    traces in ``directory``, checked against the files and the planted slow rank."""
    env = {**os.environ, "COLUMNS": "120"}
    cli = [sys.executable, "-m", "hvdprof", "analyze", "--no-cache"]
    proc = subprocess.run(
        [*cli, "--json", str(directory)], capture_output=True, text=True, cwd=REPO, env=env,
        timeout=300,
    )  # fmt: skip
    if report_out is not None:
        text = subprocess.run(
            [*cli, str(directory)], capture_output=True, text=True, cwd=REPO, env=env, timeout=300
        )
        report_out.write_text(text.stdout + text.stderr)
    checks = [
        _check("hvdprof analyze reads the traces whole", proc.returncode == 0,
               f"exit {proc.returncode}" + (f": {proc.stderr.strip()[-300:]}" if proc.returncode else "")),
    ]  # fmt: skip
    if proc.returncode not in (0, 1):
        return {"checks": checks, "figures": {}}
    data = json.loads(proc.stdout)
    ranks = data["run"]["ranks"]
    figures: dict[str, Any] = {"ranks": ranks, "events": data["run"]["events"]}
    # the stream lanes: every GPU event of each file, on its stream's lane
    in_files = file_gpu_events(directory)
    lanes = stream_lanes(directory)
    figures["stream_lanes"] = {str(r): v["streams"] for r, v in lanes.items()}
    for rank in ranks:
        want = {str(s): n for s, n in sorted(in_files.get(rank, Counter()).items())}
        got = lanes.get(rank, {}).get("drawn", {})
        checks.append(_check(
            f"rank {rank}: every GPU event in its stream lane",
            bool(want) and got == want,
            f"{sum(got.values())} events on {len(got)} stream lanes; the file: "
            f"{sum(want.values())} on {len(want)} streams",
        ))  # fmt: skip
    # the GPU card: HTA's shares per rank
    card = {r["rank"]: r for r in data["gpu"]["ranks"]}
    figures["gpu_card"] = {
        str(r): {k: round(v[k], 4) for k in ("span_ms", "idle_share", "compute_share",
                                             "non_compute_share", "comm_comp_overlap_share")}
        for r, v in card.items()
    }  # fmt: skip
    for rank in ranks:
        c = card.get(rank)
        total = None if c is None else c["idle_share"] + c["compute_share"] + c["non_compute_share"]
        checks.append(_check(
            f"rank {rank}: GPU card",
            c is not None and c["span_ms"] > 0 and abs(total - 1.0) < 0.01,
            "no GPU numbers" if c is None else
            f"span {c['span_ms']:.1f} ms, idle {c['idle_share']:.1%}, compute {c['compute_share']:.1%}",
        ))  # fmt: skip
    # the straggler: the planted one, with about its sleep as cost; or none
    s = data["stragglers"]
    figures["straggler"] = {
        k: s.get(k) for k in ("straggler", "culprits", "cost_ms", "source", "steps")
    }
    figures["verdicts"] = data["verdicts"][:4]
    if slow_rank is None:
        checks.append(
            _check("no straggler named", s["straggler"] is None, f"named {s['straggler']}")
        )
    else:
        lo, hi = COST_BAND[0] * (slow_ms or 0.0), COST_BAND[1] * (slow_ms or 0.0)
        checks.append(_check(
            f"rank {slow_rank} named the straggler",
            s["straggler"] == slow_rank,
            f"named {s['straggler']} (culprits {s['culprits']}); verdict: "
            + next((v for v in data["verdicts"] if "straggler" in v), "none")[:300],
        ))  # fmt: skip
        checks.append(_check(
            f"its cost is {lo:g}-{hi:g} ms per step",
            s["straggler"] == slow_rank and lo <= s["cost_ms"] <= hi,
            f"cost {s['cost_ms']:.2f} ms per step for a {slow_ms:g} ms sleep",
        ))  # fmt: skip
    return {"checks": checks, "figures": figures}


def fetch_wheels(directory: Path) -> int:
    """Wheels of ``WHEELS_FOR_IMAGE`` for a CUDA image's CPython 3.12 on x86-64 Linux, at
    this interpreter's installed versions (the ones the tests run on here)."""
    pins = [f"{n}=={importlib.metadata.version(n)}" for n in WHEELS_FOR_IMAGE]
    argv = [
        sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
        "--python-version", "3.12", "--implementation", "cp", "-d", str(directory),
        *[f"--platform=manylinux_2_{n}_x86_64" for n in (17, 27, 28, 34)],
        "--platform=manylinux2014_x86_64", *pins,
    ]  # fmt: skip
    return subprocess.run(argv).returncode


# ------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dry-run", action="store_true", help="list the steps and exit 0")
    p.add_argument("--out", type=Path, help="also write the JSON, log, traces and analysis here")
    p.add_argument("--results", type=Path, default=RESULTS, help="the JSON's path")
    p.add_argument("--setup", choices=("auto", "venv", "image", "none"), default="auto")
    p.add_argument("--wheels", help="wheels to install for --setup image (--fetch-wheels)")
    p.add_argument("--setup-limit-s", type=float, default=300.0)
    p.add_argument("--budget-s", type=float, default=BUDGET_S, help="the steps' wall time")
    p.add_argument("--only", nargs="+", metavar="STEP", help="run these steps alone")
    p.add_argument("--analyze-trace", type=Path, metavar="DIR", help="the trace step alone")
    p.add_argument("--slow-rank", type=int, help="--analyze-trace: the planted straggler")
    p.add_argument("--slow-ms", type=float, help="--analyze-trace: its sleep per step (ms)")
    p.add_argument("--report-out", type=Path, help="--analyze-trace: the text report's file")
    p.add_argument("--json-out", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--probe-machine", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--fetch-wheels", type=Path, metavar="DIR", help="wheels for --wheels")
    args = p.parse_args(argv)
    if args.only:
        unknown = sorted(set(args.only) - {s.name for s in STEPS})
        if unknown:
            p.error(f"no such step: {', '.join(unknown)}")
    if args.analyze_trace is not None and not args.analyze_trace.exists():
        p.error(f"--analyze-trace: {args.analyze_trace} does not exist")
    if (args.slow_rank is None) != (args.slow_ms is None):
        p.error("--slow-rank and --slow-ms go together")
    return args


def _sub_step(result: dict[str, Any], json_out: Path | None) -> int:
    """Write a sub-step's checks and figures; print its checks; exit 0 when all passed."""
    if json_out is not None:
        json_out.write_text(json.dumps(result, indent=2) + "\n")
    for c in result["checks"]:
        print(f"{'ok  ' if c['ok'] else 'FAIL'} {c['name']}: {c['detail']}")
    return 0 if all(c["ok"] for c in result["checks"]) else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.dry_run:
        print("\n".join(plan_lines()))
        return 0
    if args.fetch_wheels is not None:
        return fetch_wheels(args.fetch_wheels)
    if args.probe_machine:
        return _sub_step(probe_machine(), args.json_out)
    if args.analyze_trace is not None:
        result = analyze_trace(args.analyze_trace, args.slow_rank, args.slow_ms, args.report_out)
        return _sub_step(result, args.json_out)
    return run_all(args)


if __name__ == "__main__":
    sys.exit(main())
