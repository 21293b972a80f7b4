"""Shared plumbing for the benchmarks: spawn ranks, interleave variants, summarise, save.

Every benchmark script is both the launcher and the worker. Run plainly, it parses its
options, starts ``--np`` ranks of itself through :func:`hvdprof.launch.local_job.launch` (with a
hidden ``--worker`` flag), reads the raw per-step timings that rank 0 leaves in a temporary
file, prints a short table of medians and ratios, and writes
``benchmarks/results/<name>.json``.

Measurement rules, the same for every script:

* all variants live in the same processes and run **interleaved**: round ``r`` runs every
  variant once, in an order shuffled per round (seeded, the same on every rank) so that
  no variant always follows the same one; an expensive variant may run in fewer rounds,
  spread evenly over the run;
* every timed step starts after a barrier on the baseline ``torch.distributed`` group,
  so all ranks start together, and a step's time is the slowest rank's time;
* we report medians, the ratio of medians, and the median of the per-round ratios
  (each round's pair ran back to back, so that one is robust to slow drift of the
  machine's load). Trust ratios, not milliseconds: the machine is shared.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
#: Port of the baseline torch.distributed group; the launching process picks a free one.
BASELINE_PORT_VAR = "BENCH_BASELINE_PORT"
#: Where rank 0 leaves its raw results for the launching process.
RAW_VAR = "BENCH_RAW_PATH"

Samples = dict[str, list[tuple[int, float]]]  # variant -> [(round, seconds), ...]

_LOAD_AT_START = list(os.getloadavg()) if hasattr(os, "getloadavg") else None


# ----------------------------------------------------------------------- options


def parser(description: str, *, steps: int, warmup: int) -> argparse.ArgumentParser:
    """The options every benchmark shares; scripts add their own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--np", type=int, default=2, help="number of ranks (default 2)")
    p.add_argument("--steps", type=int, default=steps, help=f"timed rounds (default {steps})")
    p.add_argument("--warmup", type=int, default=warmup, help=f"untimed rounds (default {warmup})")
    p.add_argument("--quick", action="store_true", help="a short smoke run (< 60 s)")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads per rank; 0 (default): what a user gets from hvdprof "
        "run (OMP_NUM_THREADS = cores // ranks); N pins N",
    )
    p.add_argument("--timeout", type=float, default=None, help="kill the job after S seconds")
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        help="results JSON (default benchmarks/results/NAME.json, NAME.quick.json with --quick)",
    )
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


# ------------------------------------------------------------------ launcher side


def free_port() -> int:
    from hvdprof.launch.processes import find_free_port

    return find_free_port()


def run_job(
    script: str,
    argv: Sequence[str],
    num_proc: int,
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """Run ``script argv --worker`` as ``num_proc`` ranks; return what rank 0 saved."""
    from hvdprof.launch.local_job import launch

    with tempfile.TemporaryDirectory(prefix="hvdprof-bench-") as tmp:
        raw = Path(tmp) / "raw.json"
        job_env = {BASELINE_PORT_VAR: str(free_port()), RAW_VAR: str(raw)}
        job_env.update(env or {})
        command = [sys.executable, script, *argv, "--worker"]
        started = time.monotonic()
        code = launch(command, num_proc, env=job_env, timeout=timeout)
        finished = all(Path(f"{raw}.rank{r}.done").exists() for r in range(num_proc))
        if code != 0 and not (finished and raw.exists()):
            raise SystemExit(f"benchmark job failed with exit code {code}: {' '.join(command)}")
        if code != 0:
            # Every rank had finished measuring and rank 0 had saved the results: the
            # failure happened while tearing the process groups down. Keep the results,
            # but say so loudly.
            print(
                f"WARNING: the job exited with code {code} during teardown, after every rank "
                "had finished and the results were saved; results kept",
                file=sys.stderr,
            )
        if not raw.exists():
            raise SystemExit("benchmark job exited 0 but rank 0 left no results")
        data = json.loads(raw.read_text())
        data["wall_s"] = round(time.monotonic() - started, 1)
        return data


# -------------------------------------------------------------------- worker side


def rank_and_size() -> tuple[int, int]:
    return int(os.environ.get("HVDPROF_RANK", "0")), int(os.environ.get("HVDPROF_SIZE", "1"))


def init_baseline_group() -> None:
    """The default torch.distributed group (Gloo), for the baselines and for barriers.

    It has its own store on its own port; hvdprof's process groups are separate.
    """
    import datetime as _dt

    import torch.distributed as dist

    rank, size = rank_and_size()
    port = os.environ.get(BASELINE_PORT_VAR)
    if port is None:  # started by hand with `hvdprof run`: next to the controller's port
        port = str(int(os.environ["HVDPROF_CONTROLLER_PORT"]) + 1)
    addr = os.environ.get("HVDPROF_CONTROLLER_ADDR", "127.0.0.1")
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://{addr}:{port}",
        rank=rank,
        world_size=size,
        timeout=_dt.timedelta(seconds=120),
    )


def barrier() -> None:
    import torch.distributed as dist

    dist.barrier()


def runs_in_round(rnd: int, count: int, rounds: int) -> bool:
    """Whether a variant with ``count`` steps over ``rounds`` rounds runs in round ``rnd``.

    The ``count`` runs are spread evenly; ``count >= rounds`` runs every round.
    """
    if count >= rounds:
        return True
    return (rnd + 1) * count // rounds > rnd * count // rounds


def interleave(
    variants: Mapping[str, Callable[[], Any]],
    rounds: int,
    warmup: int,
    *,
    counts: Mapping[str, int] | None = None,
    warmup_counts: Mapping[str, int] | None = None,
    sync: Callable[[], None] = barrier,
    progress: Callable[[str], None] | None = None,
    after_warmup: Callable[[], None] | None = None,
) -> Samples:
    """Round-robin the variants; returns this rank's timed samples.

    ``counts[name]`` (default ``rounds``) and ``warmup_counts[name]`` (default ``warmup``)
    thin out expensive variants. Every rank must call this with the same arguments.
    """
    names = list(variants)
    counts = counts or {}
    warmup_counts = warmup_counts or {}
    samples: Samples = {n: [] for n in names}
    for phase, total in (("warmup", warmup), ("timed", rounds)):
        if phase == "timed" and after_warmup is not None:
            after_warmup()
        for rnd in range(total):
            # Shuffled per round (seeded by the round, so the same on every rank): a
            # rotation keeps each variant's predecessor fixed, and what ran just before
            # (a Gloo variant's threads winding down, hvdprof's cycle idle or not) biased
            # ResNet-50's hvdprof / hvdprof_flat from about 1.00 to 1.10.
            order = list(names)
            random.Random(f"{phase}-{rnd}").shuffle(order)
            for name in order:
                if phase == "warmup":
                    if not runs_in_round(rnd, warmup_counts.get(name, warmup), total):
                        continue
                elif not runs_in_round(rnd, counts.get(name, rounds), total):
                    continue
                sync()
                t0 = time.perf_counter()
                variants[name]()
                dt = time.perf_counter() - t0
                if phase == "timed":
                    samples[name].append((rnd, dt))
            if progress is not None and (rnd + 1) % max(1, total // 4) == 0:
                progress(f"{phase} round {rnd + 1}/{total}")
    return samples


class StatsMeter:
    """hvdprof's counters summed over the calls of one variant only (not idle cycles).

    Pass ``after_warmup=meter.reset`` to :func:`interleave` to count timed steps only.
    """

    def __init__(self) -> None:
        self.totals: dict[str, float] = {}
        self.calls = 0

    def reset(self) -> None:
        self.totals.clear()
        self.calls = 0

    def wrap(self, fn: Callable[[], Any]) -> Callable[[], Any]:
        import hvdprof.torch as hvd

        def measured() -> Any:
            before = hvd.runtime_stats()
            cpu0 = time.thread_time_ns()
            out = fn()
            user_us = (time.thread_time_ns() - cpu0) / 1000
            after = hvd.runtime_stats()
            self.totals["user_thread_cpu_us"] = self.totals.get("user_thread_cpu_us", 0) + user_us
            for k, v in after.items():
                if isinstance(v, int | float) and not isinstance(v, bool):
                    self.totals[k] = self.totals.get(k, 0) + v - before.get(k, 0)
            self.calls += 1
            return out

        return measured

    def cpu_per_op(self, ops_per_call: int) -> dict[str, float]:
        """hvdprof's own CPU per op, in microseconds: the training thread's (submitting
        and waiting, the work the user's code does not do with a flat call) and the cycle
        thread's by stage. On a core per rank, their sum is what the job pays."""
        if not self.calls or not ops_per_call:
            return {}
        keys = {
            "user_thread": "user_thread_cpu_us",
            "cycle_negotiate": "cycle_cpu_negotiate_us",
            "cycle_perform": "cycle_cpu_perform_us",
            "cycle_account": "cycle_cpu_account_us",
        }
        per = {
            label: self.totals.get(key, 0.0) / self.calls / ops_per_call
            for label, key in keys.items()
        }
        per["total"] = sum(per.values())
        return {k: round(v, 3) for k, v in per.items()}

    def per_call(self, keys: Sequence[str] = ()) -> dict[str, float]:
        keys = keys or (
            "cycles",
            "fused_groups",
            "fused_tensors",
            "backend_calls",
            "cache_hits",
            "slow_path_cycles",
        )
        if not self.calls:
            return {}
        return {k: round(self.totals[k] / self.calls, 2) for k in keys if k in self.totals}


def gather_slowest(samples: Samples) -> Samples:
    """Every rank's samples combined: per (variant, round), the slowest rank's time."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, samples)
    out: Samples = {}
    for name in samples:
        by_round: dict[int, float] = {}
        for per_rank in everyone:
            for rnd, dt in per_rank[name]:
                by_round[rnd] = max(by_round.get(rnd, 0.0), dt)
        out[name] = sorted(by_round.items())
    return out


def save_raw(payload: Mapping[str, Any]) -> None:
    """Rank 0: hand ``payload`` to the launching process."""
    path = os.environ.get(RAW_VAR)
    if path:
        Path(path).write_text(json.dumps(payload))
    else:  # started by hand: just show it
        print(json.dumps(payload, indent=1))


def finish_worker() -> None:
    """Mark this rank done (results collected), then tear down both runtimes explicitly."""
    import torch.distributed as dist

    import hvdprof.torch as hvd

    path = os.environ.get(RAW_VAR)
    if path:
        rank, _ = rank_and_size()
        Path(f"{path}.rank{rank}.done").touch()
    dist.barrier()  # nobody tears down while a peer is still in a collective
    dist.destroy_process_group()
    hvd.shutdown()


def log(message: str) -> None:
    rank, _ = rank_and_size()
    if rank == 0:
        print(message, flush=True)


# --------------------------------------------------------------------- summaries


def _ms(values: Iterable[float]) -> list[float]:
    return [v * 1e3 for v in values]


def summarise(samples: Mapping[str, Sequence[Sequence[float]]]) -> dict[str, dict[str, float]]:
    """Per variant: median, quartiles, min and count, in milliseconds."""
    out = {}
    for name, pairs in samples.items():
        ms = sorted(_ms(dt for _, dt in pairs))
        if not ms:
            continue
        q = statistics.quantiles(ms, n=4) if len(ms) >= 2 else [ms[0], ms[0], ms[0]]
        out[name] = {
            "median_ms": round(statistics.median(ms), 3),
            "p25_ms": round(q[0], 3),
            "p75_ms": round(q[2], 3),
            "min_ms": round(ms[0], 3),
            "n": len(ms),
        }
    return out


def ratio(
    samples: Mapping[str, Sequence[Sequence[float]]], num: str, den: str
) -> dict[str, float | int | None]:
    """``num ÷ den``: ratio of medians, and median of per-round ratios (same round only)."""
    a = [dt for _, dt in samples[num]]
    b = [dt for _, dt in samples[den]]
    den_by_round = {int(r): dt for r, dt in samples[den]}
    paired = [dt / den_by_round[int(r)] for r, dt in samples[num] if int(r) in den_by_round]
    return {
        "of_medians": round(statistics.median(a) / statistics.median(b), 4),
        "paired_median": round(statistics.median(paired), 4) if paired else None,
        "pairs": len(paired),
    }


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for i, r in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if j == 0 else c.rjust(w)
                for j, (c, w) in enumerate(zip(r, widths, strict=True))
            )
        )
        if i == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def variant_table(summary: Mapping[str, Mapping[str, float]]) -> str:
    rows = [
        (name, f"{s['median_ms']:.2f}", f"{s['p25_ms']:.2f}", f"{s['p75_ms']:.2f}", s["n"])
        for name, s in summary.items()
    ]
    return table(rows, ("variant", "median ms", "p25 ms", "p75 ms", "steps"))


def ratio_table(ratios: Mapping[str, Mapping[str, Any]]) -> str:
    rows = []
    for label, r in ratios.items():
        paired = r.get("paired_median")
        rows.append(
            (
                label,
                f"{r['of_medians']:.3f}",
                "-" if paired is None else f"{paired:.3f}",
                r.get("goal", ""),
                {True: "yes", False: "NO", None: ""}[r.get("met")],
            )
        )
    return table(rows, ("ratio", "of medians", "per-round median", "goal", "met"))


def environment_info() -> dict[str, Any]:
    import torch

    try:
        from importlib.metadata import version

        hv = version("hvdprof")
    except Exception:
        hv = "unknown"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "torch_version": torch.__version__,
        "hvdprof_version": hv,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_at_start": _LOAD_AT_START,
        "load_average_at_end": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        **source_identity(),
        "hvdprof_sources_sha256_at_start": _SOURCES_AT_START,
    }


def sources_digest() -> str:
    """A hash of hvdprof's Python sources: tells apart uncommitted edits."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted((root / "hvdprof").rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


_SOURCES_AT_START = sources_digest()


def source_identity() -> dict[str, str | None]:
    """Which hvdprof was measured: the commit, and the sources' hash at the end (compare
    with ``hvdprof_sources_sha256_at_start``: they differ when hvdprof was edited while the
    benchmark ran, and then the run measured a mix)."""
    import subprocess

    root = Path(__file__).resolve().parent.parent
    try:
        commit = (
            subprocess.run(
                ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
            ).stdout.strip()
            or None
        )
    except (OSError, subprocess.SubprocessError):
        commit = None
    return {"git_commit": commit, "hvdprof_sources_sha256": sources_digest()}


def write_results(
    name: str, payload: Mapping[str, Any], output: Path | None = None, quick: bool = False
) -> Path:
    """``benchmarks/results/NAME.json`` (``NAME.quick.json`` for ``--quick``) or ``output``."""
    path = output or RESULTS_DIR / (f"{name}.quick.json" if quick else f"{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": name, **environment_info(), **payload}
    if doc["hvdprof_sources_sha256"] != doc["hvdprof_sources_sha256_at_start"]:
        print(
            "WARNING: hvdprof's sources changed while this benchmark ran; the results "
            "may mix two versions (see hvdprof_sources_sha256*)",
            file=sys.stderr,
        )
    path.write_text(compact_number_lists(json.dumps(doc, indent=2)) + "\n")
    return path


# A JSON array holding only numbers (no strings, objects or arrays inside it).
_NUMBER_ARRAY = re.compile(r"\[\s*(-?[0-9][-+.eE0-9]*(?:,\s*-?[0-9][-+.eE0-9]*)*)\s*\]")


def compact_number_lists(text: str) -> str:
    """Puts each array of plain numbers on one line: indented results stay readable where
    they nest, while raw step times (thousands of floats) stop costing a line each, which
    made autotune_bench.json 4.6 MB of mostly indentation."""
    return _NUMBER_ARRAY.sub(lambda m: "[" + ", ".join(re.split(r",\s*", m.group(1))) + "]", text)


@contextlib.contextmanager
def spin_loops(on: bool) -> Iterator[None]:
    """One Python spin loop per core at normal priority while on (``--load``): the busy
    machine every verdict and gate must also hold on."""
    procs = (
        [
            subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(os.cpu_count() or 1)
        ]
        if on
        else []
    )
    try:
        yield
    finally:
        for p in procs:
            p.kill()
        for p in procs:
            p.wait()


def hvdprof_backend() -> str:
    """What reduces hvdprof's allreduces in this rank: SHM (shared memory) or GLOO."""
    from hvdprof.runtime import runtime

    return "SHM" if runtime.get().shm is not None else "GLOO"


def knob_env(prefix: str = "HVDPROF_") -> dict[str, str]:
    """The runtime knobs set in this environment, for the record."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(prefix)}


def threads_setting(args: Any) -> int | str:
    """The ``--threads`` choice as the results record it."""
    return args.threads if args.threads > 0 else "launcher default (cores // ranks)"
