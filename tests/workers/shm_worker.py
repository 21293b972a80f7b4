"""Allreduce groups big enough for the shared-memory backend's in-place path.

Usage: shm_worker.py SHARED_DIR. With HVDPROF_BACKEND=gloo the same sums must come out
of Gloo, and nothing may go through shared memory. Prints ``SECTION shm OK <n>``.
"""

from __future__ import annotations

import os

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
GLOO = os.environ.get("HVDPROF_BACKEND") == "gloo"
FUSION_OFF = os.environ.get("HVDPROF_FUSION_THRESHOLD") == "0"
#: float32 tensors of 280-520 KB: their groups average well over the in-place minimum
SIZES = (70_000, 130_001, 50_000)
OPS = {"Sum": hvd.Sum, "Average": hvd.Average, "Min": hvd.Min, "Max": hvd.Max,
       "Product": hvd.Product}  # fmt: skip


def contribution(rank: int, numel: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    base = torch.arange(numel, dtype=torch.int64) * 7 + salt * 3 + rank * 5
    return (base % 3 + 1).to(dtype)


def expected(numel: int, dtype: torch.dtype, salt: int, op: str) -> torch.Tensor:
    values = torch.stack([contribution(r, numel, torch.float64, salt) for r in range(N)])
    return _common.expected_allreduce(values, op, dtype).to(dtype)


def same(actual: torch.Tensor, want: torch.Tensor, what: str) -> None:
    ck.count += 1
    close = torch.allclose(actual.double(), want.double(), rtol=1e-3, atol=1e-3)
    if actual.dtype != want.dtype or actual.shape != want.shape or not close:
        bad = (actual.double() - want.double()).abs().argmax().item() if close is False else -1
        ck.fail(what, f"{actual.dtype}{tuple(actual.shape)} differs (first look: index {bad})")


with ck.section("shm"):
    before = hvd.runtime_stats()
    for dtype in (torch.float32, torch.float64, torch.float16, torch.int32):
        for op_name, op in OPS.items():
            ins = [contribution(R, n, dtype, s) for s, n in enumerate(SIZES)]
            kept = [t.clone() for t in ins]
            handles = [
                hvd.allreduce_async_(t, op=op, name=f"inplace.{dtype}.{op_name}.{s}")
                for s, t in enumerate(ins)
            ]
            outs = [
                hvd.allreduce_async(t, op=op, name=f"outofplace.{dtype}.{op_name}.{s}")
                for s, t in enumerate(kept)
            ]
            for s, n in enumerate(SIZES):
                want = expected(n, dtype, s, op_name)
                same(hvd.synchronize(handles[s]), want, f"in place {dtype} {op_name} #{s}")
                same(hvd.synchronize(outs[s]), want, f"out of place {dtype} {op_name} #{s}")
                same(kept[s], contribution(R, n, dtype, s), f"input kept {dtype} {op_name}")
    # scale factors (through the fusion buffer) and a grouped allreduce
    ts = [contribution(R, n, torch.float32, s) for s, n in enumerate(SIZES)]
    got = hvd.grouped_allreduce(ts, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    for s, n in enumerate(SIZES):
        same(got[s], expected(n, torch.float32, s, "Sum") * 2.0, f"scaled #{s}")
    # one tensor larger than a shared segment: reduced in chunks
    big = torch.full((5_000_000,), float(R + 1))
    hvd.allreduce_(big, op=hvd.Sum, name="big")
    same(big, torch.full((5_000_000,), float(N * (N + 1) // 2)), "chunked big tensor")
    after = hvd.runtime_stats()
    shm_calls = after["shm_allreduces"] - before["shm_allreduces"]
    if GLOO:
        ck.eq(shm_calls, 0, "HVDPROF_BACKEND=gloo: nothing through shared memory")
    else:
        ck.true(shm_calls >= 20, f"allreduces through shared memory: {shm_calls}")
    fused = after["fused_groups"] - before["fused_groups"]
    if FUSION_OFF:
        ck.eq(fused, 0, "HVDPROF_FUSION_THRESHOLD=0: no fusion, shared memory or not")
    else:
        ck.true(fused >= 20, f"groups fused: {after}")

hvd.shutdown()
ck.done()
