"""Elastic recovery: how long a rank's death costs the survivors, and what commit() costs.

1. Recovery, at 2 and 3 ranks: an elastic job (``hvdprof run --min-np N-1 --max-np N``)
   trains an MLP (~1.1 M parameters), committing after every step; at step 20 one worker
   SIGKILLs itself, printing the wall-clock time just before. Each survivor reports when
   it saw the failure, when the job had re-formed (new generation, sync from the new
   rank 0 done) and when its first step after that completed. All processes are on this
   host, so their wall clocks agree. Reported: death -> first completed step (the goal is
   under 5 s), split into detection, re-formation and first step; median and max over
   repetitions, the killed worker rotating (rank 0 included).
2. ``commit()`` of a ResNet-50-sized state (25.6 M parameters and SGD momentum buffers,
   ~205 MB), in one process: the copy to host memory that commit() makes. In a job,
   commit() also checks for new hosts (an 8-byte allreduce): its median cost is measured
   in the recovery jobs above.

Run: ``python benchmarks/elastic_recovery.py`` (``--quick`` for a smoke run). Writes
``benchmarks/results/elastic_recovery.json``. The machine's load is recorded: trust the
structure more than the milliseconds on a shared machine.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

KILL_STEP = 20


# ------------------------------------------------------------------------- the worker
def worker(args: argparse.Namespace) -> None:
    import torch

    import hvdprof.torch as hvd

    hvd.init()
    me = os.environ.get("HVDPROF_ELASTIC_WORKER", "?")
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(512, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 512)
    )
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    state = hvd.elastic.TorchState(model, optimizer, step=0)
    data = torch.randn(32, 512)
    commit_s: list[float] = []
    reported = [0]

    @hvd.elastic.run
    def train(state: hvd.elastic.TorchState) -> None:
        while state.step < args.steps:
            if me == args.kill and state.step == KILL_STEP:
                print(f"DEATH {time.time_ns()}", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            optimizer.zero_grad()
            model(data).square().mean().backward()
            optimizer.step()
            if len(hvd.elastic.resets) > reported[0]:
                reported[0] = len(hvd.elastic.resets)
                r = hvd.elastic.resets[-1]
                print(
                    "RECOVERED "
                    + json.dumps(
                        {
                            "first_step_ns": time.time_ns(),
                            "seen_ns": r["seen_unix_ns"],
                            "reformed_ns": r["reformed_unix_ns"],
                            "old_size": r["old_size"],
                            "new_size": r["new_size"],
                        }
                    ),
                    flush=True,
                )
            state.step += 1
            t0 = time.perf_counter()
            state.commit()
            commit_s.append(time.perf_counter() - t0)

    train(state)
    if hvd.rank() == 0:
        print(f"COMMIT_S {json.dumps(commit_s[5:])}", flush=True)
    hvd.shutdown()


# ---------------------------------------------------------------------- the launcher
def recovery_run(num_proc: int, kill: int, steps: int) -> dict[str, float]:
    from hvdprof.launch.elastic_local import launch_elastic

    out = io.StringIO()
    code = launch_elastic(
        [sys.executable, __file__, "--worker", "--kill", str(kill), "--steps", str(steps)],
        num_proc,
        num_proc - 1,
        num_proc,
        env={"HVDPROF_ELASTIC_TIMEOUT_SECONDS": "60"},
        timeout=240,
        stdout=out,
    )
    text = out.getvalue()
    if code != 0:
        raise SystemExit(f"recovery job at {num_proc} ranks failed ({code}):\n{text[-4000:]}")
    death = [int(m[1]) for m in re.finditer(r"DEATH (\d+)", text)]
    recovered = [json.loads(m[1]) for m in re.finditer(r"RECOVERED (\{.*\})", text)]
    commits = [json.loads(m[1]) for m in re.finditer(r"COMMIT_S (\[.*\])", text)]
    assert len(death) == 1 and len(recovered) == num_proc - 1, text[-4000:]
    t_death = death[0]
    last = max(recovered, key=lambda r: r["first_step_ns"])
    first_seen = min(r["seen_ns"] for r in recovered)
    reformed = max(r["reformed_ns"] for r in recovered)
    return {
        "killed_worker": kill,
        "death_to_first_step_s": (last["first_step_ns"] - t_death) / 1e9,
        "detection_s": (first_seen - t_death) / 1e9,
        "reformation_s": (reformed - first_seen) / 1e9,
        "first_step_s": (last["first_step_ns"] - reformed) / 1e9,
        "commit_median_ms": statistics.median(commits[0]) * 1e3 if commits and commits[0] else 0,
    }


def resnet50_state_commit(reps: int) -> dict[str, float]:
    """Time commit()'s copy of a ResNet-50-sized model + SGD momentum state."""
    import torch

    import hvdprof.torch as hvd

    model = _resnet50()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 3, 64, 64)).sum().backward()
    optimizer.step()  # creates the momentum buffers
    state = hvd.elastic.TorchState(model, optimizer, epoch=0, batch=0)
    params = sum(p.numel() for p in model.parameters())
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(
        v.numel() * v.element_size()
        for s in optimizer.state.values()
        for v in s.values()
        if isinstance(v, torch.Tensor)
    )
    times, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        state.commit()  # a single process: the copy only (no hosts to check)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {
        "parameters": params,
        "state_mb": nbytes / 1e6,
        "commit_median_ms": statistics.median(times) * 1e3,
        "commit_min_ms": min(times) * 1e3,
        "commit_cpu_median_ms": statistics.median(cpu) * 1e3,
        "gb_per_s": nbytes / statistics.median(times) / 1e9,
        "reps": reps,
    }


def _resnet50():
    """ResNet-50's layers and parameter count (25,557,032), built here (no torchvision)."""
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            cout = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(cin, width, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False),
                nn.BatchNorm2d(width),
                nn.ReLU(),
                nn.Conv2d(width, cout, 1, bias=False),
                nn.BatchNorm2d(cout),
            )
            self.down = (
                nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))
                if stride != 1 or cin != cout
                else nn.Identity()
            )

        def forward(self, x):
            return (self.body(x) + self.down(x)).relu()

    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.MaxPool2d(3, 2, 1),
    ]
    cin = 64
    for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
        for b in range(blocks):
            layers.append(Bottleneck(cin, width, stride if b == 0 else 1))
            cin = width * 4
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2048, 1000)]
    return nn.Sequential(*layers)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--kill", default="", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=60, help=argparse.SUPPRESS)
    p.add_argument("--reps", type=int, default=3, help="recoveries per size (default 3)")
    p.add_argument("--quick", action="store_true", help="one recovery per size, 3 commits")
    p.add_argument("-o", "--output", type=Path, help="results file (default benchmarks/results/)")
    args = p.parse_args()
    if args.worker:
        worker(args)
        return
    from _harness import write_results

    reps = 1 if args.quick else args.reps
    recovery: dict[str, object] = {}
    for num_proc in (2, 3):
        runs = [recovery_run(num_proc, rep % num_proc, 40) for rep in range(reps)]
        totals = [r["death_to_first_step_s"] for r in runs]
        recovery[f"{num_proc}_ranks"] = {
            "death_to_first_step_median_s": statistics.median(totals),
            "death_to_first_step_max_s": max(totals),
            "runs": runs,
        }
        print(
            f"{num_proc} ranks: death -> first step after re-formation: median "
            f"{statistics.median(totals):.2f} s, max {max(totals):.2f} s over {reps} run(s)"
        )
        for r in runs:
            print(
                f"  killed worker {r['killed_worker']}: detect {r['detection_s'] * 1e3:.0f} ms, "
                f"re-form {r['reformation_s'] * 1e3:.0f} ms, first step "
                f"{r['first_step_s'] * 1e3:.0f} ms; commit() in the job "
                f"{r['commit_median_ms']:.2f} ms"
            )
    commit = resnet50_state_commit(3 if args.quick else 10)
    print(
        f"commit() of a ResNet-50-sized state ({commit['parameters'] / 1e6:.1f} M parameters, "
        f"{commit['state_mb']:.0f} MB with momentum): median {commit['commit_median_ms']:.0f} ms "
        f"({commit['gb_per_s']:.1f} GB/s), CPU {commit['commit_cpu_median_ms']:.0f} ms"
    )
    path = write_results(
        "elastic_recovery",
        {"goal_s": 5.0, "recovery": recovery, "resnet50_commit": commit},
        args.output,
        args.quick,
    )
    print(f"results: {path}")


if __name__ == "__main__":
    main()
