"""The workload behind tests/test_analysis_e2e.py: named gradients allreduced every step.

Usage: ``analysis_worker.py --steps N [--sleep-rank R --sleep-ms MS]``

Each step, rank ``R`` (if given) sleeps ``MS`` before submitting, so it is a straggler
by a known amount; then every rank allreduces the same eight named tensors
asynchronously and checks the sums. The test sets the timeline (and autotune) through
``hvdprof run``. Output: ``SECTION run OK <n>`` and ``DONE``.
"""

from __future__ import annotations

import argparse
import time

import _common

_common.start_watchdog()

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--sleep-rank", type=int, default=-1)
parser.add_argument("--sleep-ms", type=float, default=0.0)
ARGS = parser.parse_args()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R = hvd.rank()
ck = _common.Checks(R)
SHAPES = [(256,)] * 6 + [(64, 64), (32 * 1024,)]
GRADS = [torch.zeros(s) for s in SHAPES]
NAMES = [f"grad.{i}" for i in range(len(SHAPES))]

with ck.section("run"):
    for k in range(ARGS.steps):
        if ARGS.sleep_rank == R:
            time.sleep(ARGS.sleep_ms / 1000.0)
        _common.allreduce_named_gradients(hvd, GRADS, NAMES, ck, k)
hvd.shutdown()
print("DONE", flush=True)
