"""The workload behind tests/test_autotune_e2e.py: real ranks tuned live by rank 0.

Usage: ``autotune_worker.py OUT_DIR --stop {converged,samples,never} [--samples K]
[--watch K] [--max-steps N] [--max-seconds S]``

The test sets the environment (HVDPROF_AUTOTUNE=1, the sample sizes, the log, a pinned
knob, a warm start, the timeline). Every step allreduces the same named gradients (many
small ones and one larger one, checked for the right sum), then a one-element control
allreduce ``ctl`` through which rank 0 tells every rank to stop, so all ranks run the same
number of steps and reach ``shutdown`` together. Rank 0 decides from its controller:

* ``converged``: once tuning has finished (phase ``watch`` or ``done``) and ``--watch``
  more samples were scored (watch samples in continuous mode);
* ``samples``: once ``--samples`` samples were scored (tuning still running);
* ``never``: only ``--max-steps`` / ``--max-seconds`` end it (the kill test).

Output (stdout, parsed by the test):

* ``INFO pid <pid>`` at start, and the same in ``OUT_DIR/pid.<rank>``;
* after ``hvd.shutdown()`` (the cycle thread has stopped, so nothing can change any more):
  ``INFO history <json>``: the rank's ``cycle.param_history`` as
  ``[[cycle, fusion_threshold_bytes, cycle_time_ms, cache_enabled], ...]``; on rank 0 also
  ``INFO tuner <json>`` (phase, samples, best, best line) and ``INFO stop <reason>``;
* ``SECTION run OK <n>`` (the sums were right at every step) and ``DONE``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("out", type=Path)
parser.add_argument("--stop", choices=("converged", "samples", "never"), required=True)
parser.add_argument("--samples", type=int, default=4)
parser.add_argument("--watch", type=int, default=1)
parser.add_argument("--max-steps", type=int, default=4000)
parser.add_argument("--max-seconds", type=float, default=60.0)
ARGS = parser.parse_args()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime import runtime as rt_module  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
ARGS.out.mkdir(parents=True, exist_ok=True)
(ARGS.out / f"pid.{R}").write_text(str(os.getpid()))
print(f"INFO pid {os.getpid()}", flush=True)

RT = rt_module.get()
TUNER = RT.autotuner  # rank 0 only (None elsewhere)
ck = _common.Checks(R)

#: many small gradients (below any threshold the tuner may pick) and one larger one
SHAPES = [(512,)] * 24 + [(64, 64)] * 4 + [(128 * 1024,)]
GRADS = [torch.zeros(s) for s in SHAPES]
NAMES = [f"grad.{i}" for i in range(len(SHAPES))]
TOTAL = N * (N + 1) / 2


def step(k: int) -> None:
    for i, g in enumerate(GRADS):
        g.fill_(float((R + 1) * (i % 3 + 1)))
    handles = [
        hvd.allreduce_async_(g, name=n, op=hvd.Sum) for g, n in zip(GRADS, NAMES, strict=True)
    ]
    for h in handles:
        hvd.synchronize(h)
    bad = [i for i, g in enumerate(GRADS) if not bool(torch.all(g == TOTAL * (i % 3 + 1)))]
    ck.true(not bad, f"step {k}: sums of {bad[:5]} are wrong")


def want_stop(k: int, started: float) -> str | None:
    if k + 1 >= ARGS.max_steps:
        return "max_steps"
    if time.monotonic() - started > ARGS.max_seconds:
        return "max_seconds"
    if TUNER is None:
        return None
    scored = TUNER.samples_scored
    max_samples = RT.config.autotune_max_samples
    if ARGS.stop == "converged":
        if TUNER.phase in ("watch", "done") and scored >= max_samples + ARGS.watch:
            return "converged"
    elif ARGS.stop == "samples" and scored >= ARGS.samples:
        return "samples"
    return None


def params_json(p: object) -> list[object]:
    return [p.fusion_threshold_bytes, p.cycle_time_ms, p.cache_enabled]  # type: ignore[attr-defined]


started = time.monotonic()
reason = None
with ck.section("run"):
    k = 0
    while True:
        step(k)
        reason = want_stop(k, started) if R == 0 else None
        flag = hvd.allreduce(torch.tensor([1.0 if reason else 0.0]), name="ctl", op=hvd.Sum)
        k += 1
        if float(flag[0]) > 0:
            break
    ck.true(k > 0, "ran at least one step")

elapsed = time.monotonic() - started
hvd.shutdown()  # joins the cycle thread: the history below is final on every rank
history = [[c, *params_json(p)] for c, p in RT.cycle.param_history]
print(f"INFO history {json.dumps(history)}", flush=True)
print(f"INFO steps {json.dumps({'user_steps': k, 'runtime_steps': RT.cycle.steps.step})}")
if TUNER is not None:
    best = TUNER.best
    info = {
        "phase": TUNER.phase,
        "samples_scored": TUNER.samples_scored,
        "converged": TUNER.converged,
        "reopened": TUNER.reopened,
        "best": None if best is None else params_json(best.params),
        "best_line": TUNER.best_line(),
        "elapsed_s": round(elapsed, 2),
    }
    print(f"INFO tuner {json.dumps(info)}", flush=True)
    print(f"INFO stop {reason}", flush=True)
ck.done()
