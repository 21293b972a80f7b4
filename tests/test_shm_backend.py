"""The shared-memory allreduce: real segments in /dev/shm, real sockets, three ranks.

The thread tests run three ranks as threads of one process (as ``test_control_channel``
does) with a small segment, so that groups span several chunks and slices cut tensors
in the middle. The job tests run the runtime at 2 and 3 ranks through the launcher and
check that the in-place path (no fusion buffer) is taken and numerically right.
"""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_job
from test_control_channel import SIZE, on_every_rank

from hvdprof.runtime.backends import shm
from hvdprof.runtime.backends.shm import SharedMemoryAllreduce, SharedMemoryUnavailable
from hvdprof.runtime.control import ControlChannel, ControlError
from hvdprof.runtime.dtypes import ITEMSIZE
from hvdprof.runtime.executor import torch_dtype
from hvdprof.runtime.requests import ReduceOp

pytestmark = pytest.mark.skipif(not os.path.isdir(shm.SHM_DIR), reason="no /dev/shm here")

MiB = 1024 * 1024
#: odd sizes: an empty tensor, ones that straddle slice and chunk boundaries (a 1 MiB
#: segment holds 262,144 float32: three partitions of 87,381)
SIZES = (5, 0, 87_390, 1, 262_150, 40_000, 300_001)
#: every dtype the runtime supports
DTYPES = tuple(torch_dtype(name) for name in ITEMSIZE)
OPS = (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.PRODUCT)


def contribution(rank: int, numel: int, dtype: torch.dtype, salt: int) -> torch.Tensor:
    """Small values (1..3) so that products of three ranks fit even int8."""
    base = torch.arange(numel, dtype=torch.int64) * 7 + salt * 3 + rank * 5
    return (base % 3 + 1).to(dtype)


def expected(numel: int, dtype: torch.dtype, salt: int, op: ReduceOp) -> torch.Tensor:
    values = torch.stack([contribution(r, numel, torch.float64, salt) for r in range(SIZE)])
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        out = values.sum(0)
    elif op == ReduceOp.MIN:
        out = values.min(0).values
    elif op == ReduceOp.MAX:
        out = values.max(0).values
    else:
        out = values.prod(0)
    return out.to(dtype)


def test_every_op_and_dtype_across_chunks_in_place_and_not() -> None:
    def job(ch: ControlChannel) -> list[str]:
        backend = SharedMemoryAllreduce(ch, 1 * MiB)
        problems = []
        try:
            for dtype in DTYPES:
                for op in OPS:
                    for in_place in (True, False):
                        inputs = [
                            contribution(ch.rank, n, dtype, salt) for salt, n in enumerate(SIZES)
                        ]
                        kept = [t.clone() for t in inputs]
                        outputs = inputs if in_place else [torch.empty_like(t) for t in inputs]
                        finish = None
                        if op == ReduceOp.AVERAGE:  # the executor's job: exact for these

                            def finish(t: torch.Tensor) -> None:
                                t.copy_(torch.div(t, 1, rounding_mode="floor"))

                        backend.allreduce(inputs, outputs, op, finish, None)
                        for salt, (n, out) in enumerate(zip(SIZES, outputs, strict=True)):
                            want = expected(n, dtype, salt, op)
                            if not torch.equal(out, want):
                                problems.append(f"{dtype} {op.name} in_place={in_place} #{salt}")
                        if not in_place and not all(
                            torch.equal(a, b) for a, b in zip(inputs, kept, strict=True)
                        ):
                            problems.append(f"{dtype} {op.name}: out of place changed the input")
        finally:
            backend.close()
        return problems

    results = on_every_rank(job)
    for rank, problems in enumerate(results):
        assert not isinstance(problems, BaseException), f"rank {rank}: {problems!r}"
        assert problems == [], f"rank {rank}: {problems}"


def test_finish_runs_once_per_element_and_results_agree_bitwise() -> None:
    """Postscale runs on the reduced piece before it is shared: every rank sees its result."""

    def job(ch: ControlChannel) -> Any:
        backend = SharedMemoryAllreduce(ch, 1 * MiB)
        try:
            gen = torch.Generator().manual_seed(ch.rank)  # (the global one is shared)
            tensors = [torch.randn(n, generator=gen) for n in SIZES]
            backend.allreduce(tensors, tensors, ReduceOp.SUM, lambda t: t.mul_(0.5), None)
            return [t.clone() for t in tensors]
        finally:
            backend.close()

    results = on_every_rank(job)
    generated = []
    for rank in range(SIZE):
        gen = torch.Generator().manual_seed(rank)
        generated.append([torch.randn(n, generator=gen) for n in SIZES])
    for i in range(len(SIZES)):
        want = sum(g[i].double() for g in generated) * 0.5
        assert torch.allclose(results[0][i].double(), want, atol=1e-5), i
        for rank in range(1, SIZE):  # one rank reduced each element: identical everywhere
            assert torch.equal(results[rank][i], results[0][i]), (rank, i)


def test_segments_grow_together_and_leave_no_files() -> None:
    def job(ch: ControlChannel) -> dict[str, Any]:
        backend = SharedMemoryAllreduce(ch, 1 * MiB)
        out: dict[str, Any] = {"before": backend.capacity}
        try:
            ch.barrier()  # every rank has unlinked its file by now (peers may grow next)
            out["files"] = glob.glob(os.path.join(shm.SHM_DIR, f"hvdprof-{backend._name()}-*"))
            backend.reserve(3 * MiB + 5)
            out["after"] = backend.capacity
            marks: list[int] = []
            t = torch.full((3 * MiB // 4,), float(ch.rank + 1))
            backend.allreduce([t], [t], ReduceOp.SUM, None, marks)
            out["ok"] = bool(torch.all(t == sum(range(1, SIZE + 1))))
            out["marks"] = len(marks)  # one chunk: staged, then reduced
            ch.barrier()
            out["files_after"] = glob.glob(os.path.join(shm.SHM_DIR, f"hvdprof-{backend._token}-*"))
        finally:
            backend.close()
        return out

    for rank, out in enumerate(on_every_rank(job)):
        assert not isinstance(out, BaseException), f"rank {rank}: {out!r}"
        assert out["before"] == 1 * MiB and out["after"] == 4 * MiB, out
        assert out["ok"] and out["marks"] == 2, out
        assert out["files"] == [] and out["files_after"] == [], out


def test_no_shared_memory_is_agreed_and_names_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm, "SHM_DIR", "/nonexistent/hvdprof-test")

    def job(ch: ControlChannel) -> Any:
        return SharedMemoryAllreduce.open(ch, 1 * MiB)

    results = on_every_rank(job)
    for rank, result in enumerate(results):
        assert isinstance(result, SharedMemoryUnavailable), f"rank {rank}: {result!r}"
        for r in range(SIZE):
            assert f"rank {r}: cannot create /nonexistent/hvdprof-test/" in str(result)


def test_a_peer_that_leaves_mid_reduction_fails_the_others() -> None:
    def job(ch: ControlChannel) -> Any:
        backend = SharedMemoryAllreduce(ch, 1 * MiB)
        try:
            if ch.rank == 2:
                return "left"  # its channel closes: the others must not wait for it
            t = torch.ones(1000)
            backend.allreduce([t], [t], ReduceOp.SUM, None, None)
            return "finished"
        finally:
            backend.close()

    results = on_every_rank(job, op_timeout_s=20)
    assert results[2] == "left"
    for rank in (0, 1):
        assert isinstance(results[rank], ControlError), f"rank {rank}: {results[rank]!r}"


def assert_shm_section_ok(result: Any, num_proc: int) -> None:
    result.assert_done(num_proc)
    for rank in range(num_proc):
        status = result.section(rank, "shm")
        assert status is not None and status.startswith("OK"), result.describe()


@pytest.mark.parametrize("num_proc", [2, 3])
def test_runtime_reduces_groups_in_place_through_shared_memory(
    num_proc: int, tmp_path: Path
) -> None:
    assert_shm_section_ok(run_job("shm_worker.py", num_proc, str(tmp_path)), num_proc)


def test_fusion_threshold_zero_still_disables_fusion(tmp_path: Path) -> None:
    """Groups fill the shared segment, but a threshold of 0 must still mean no fusion."""
    env = {"HVDPROF_FUSION_THRESHOLD": "0"}
    assert_shm_section_ok(run_job("shm_worker.py", 2, str(tmp_path), env=env), 2)


def test_backend_gloo_keeps_allreduce_off_shared_memory(tmp_path: Path) -> None:
    env = {"HVDPROF_BACKEND": "gloo"}
    assert_shm_section_ok(run_job("shm_worker.py", 2, str(tmp_path), env=env), 2)
