"""The device path (issue 28): CUDA tensors through NCCL, proven on CPU where it can be.

No GPU has run these tests on hardware yet. What runs here:

- units of the device-independent pieces (phase names, the event-ordered phase record,
  the host events' interface against ``torch.cuda.Event``'s, the device buffer pool);
- real 2-rank jobs with ``HVDPROF_DEVICE_PATH_ON_CPU=1``: every op goes down the same
  ``DevicePath`` code a GPU job runs, with a Gloo group and host events in place of NCCL
  and CUDA events; the timeline carries WAIT_FOR_DATA, MEMCPY_IN_FUSION_BUFFER,
  GLOO_<OP> and MEMCPY_OUT_FUSION_BUFFER; NVTX ranges are checked through nvtx's API.

The ``gpu`` tests run the same worker on CUDA tensors in three layouts: one rank on NCCL
(one GPU), two ranks on two GPUs on NCCL, and two ranks sharing one GPU through Gloo (NCCL
refuses two ranks on one device; an op or dtype torch's Gloo refuses on CUDA tensors skips
with torch's message). Each skips, saying why, where its GPUs are not there.
``benchmarks/gpu_check.py`` runs them on a GPU machine (docs/cuda.md).
"""

from __future__ import annotations

import importlib.util
import inspect
import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import REPO, WORKERS, JobResult, child_env, parse_output, run_job

from hvdprof.analysis import load_run
from hvdprof.common import activities as act
from hvdprof.common.records import GroupRecord
from hvdprof.runtime.collective_core import FusionBufferPool
from hvdprof.runtime.device_path import (
    HostEvent,
    HostStream,
    HostStreams,
    PhaseEvents,
    fill_record,
    phase_names,
)
from hvdprof.trace.model import PHASE_COLLECTIVE, PHASE_QUEUE, PHASES, classify

CPU_ENV = {"HVDPROF_DEVICE_PATH_ON_CPU": "1"}


def _gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _needs_gpus(n: int) -> pytest.MarkDecorator:
    reason = (
        f"needs {n} CUDA GPU{'s' if n > 1 else ''} with NCCL; this machine has {_gpus()} "
        f"(torch {torch.__version__}, CUDA built: {torch.backends.cuda.is_built()})"
    )
    return pytest.mark.skipif(
        _gpus() < n or not torch.distributed.is_nccl_available(), reason=reason
    )


#: how a GPU job's ranks get their GPUs: worker mode, ranks, the timeline's backend name
LAYOUTS = {
    "nccl-1gpu": ("cuda", 1, "NCCL"),
    "nccl-2gpus": ("cuda", 2, "NCCL"),
    "gloo-2ranks-1gpu": ("cuda-gloo", 2, "GLOO"),
}
LAYOUT_PARAMS = [
    pytest.param("nccl-1gpu", marks=_needs_gpus(1)),
    pytest.param("nccl-2gpus", marks=_needs_gpus(2)),
    pytest.param("gloo-2ranks-1gpu", marks=_needs_gpus(1)),
]
OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
DTYPE_NAMES = ("float16", "bfloat16", "float32")
OP_SECTIONS = tuple(f"ops.{op}.{d}" for op in OPS for d in DTYPE_NAMES)


# ----------------------------------------------------------------------------- units
def test_phase_names_are_horovods() -> None:
    assert phase_names("NCCL", "ALLREDUCE", fused=True) == [
        "WAIT_FOR_DATA",
        "MEMCPY_IN_FUSION_BUFFER",
        "NCCL_ALLREDUCE",
        "MEMCPY_OUT_FUSION_BUFFER",
    ]
    for op in ("ALLGATHER", "BROADCAST", "ALLTOALL", "REDUCESCATTER"):
        assert phase_names("NCCL", op, fused=False) == ["WAIT_FOR_DATA", f"NCCL_{op}"]
    # the analysis reads them as it reads the CPU phases
    assert PHASES[classify("WAIT_FOR_DATA")[0]] == PHASES[PHASE_QUEUE]
    assert classify("NCCL_ALLREDUCE") == (PHASE_COLLECTIVE, act.OPS.index("ALLREDUCE"))
    assert classify("NCCL_REDUCESCATTER")[0] == PHASE_COLLECTIVE


def test_host_event_has_the_interface_of_torch_cuda_event() -> None:
    """Every method the device path calls on an event exists on torch.cuda.Event too
    (checked on the class: no GPU needed), with the same meaning in milliseconds."""
    for cuda_class, host_class, methods in (
        (torch.cuda.Event, HostEvent, ("record", "query", "synchronize", "wait", "elapsed_time")),
        (torch.cuda.Stream, HostStream, ("wait_event",)),
    ):
        for method in methods:
            want = list(inspect.signature(getattr(cuda_class, method)).parameters)
            have = list(inspect.signature(getattr(host_class, method)).parameters)
            assert have == want, (cuda_class.__name__, method, have, want)
    a, b = HostEvent(enable_timing=True), HostEvent()
    assert not a.query()
    with pytest.raises(RuntimeError, match="never recorded"):
        a.elapsed_time(b)
    a.record()
    b.record(None)
    assert a.query() and b.query()
    assert a.elapsed_time(b) >= 0.0
    b.synchronize()


def test_waiting_on_an_unrecorded_event_is_a_race_and_raises() -> None:
    stream = HostStream("executor")
    with pytest.raises(RuntimeError, match="never recorded"):
        stream.wait_event(HostEvent())
    ev = HostEvent()
    ev.record(stream)
    stream.wait_event(ev)
    assert stream.waits == 1


def test_phase_record_resolves_in_order_onto_a_group_record() -> None:
    clock = HostStreams()
    stream = clock.executor_stream(torch.device("cpu"))
    phases = PhaseEvents(clock, stream)
    marks = [phases.first]
    for name in phase_names("NCCL", "ALLREDUCE", fused=True):
        end = clock.event()
        end.record(stream)
        phases.add(name, marks[-1], end)
        marks.append(end)
    spans = phases.resolve()
    assert [s[0] for s in spans] == phase_names("NCCL", "ALLREDUCE", fused=True)
    for (_, t0, t1), (_, n0, _) in itertools.pairwise(spans):
        assert t0 <= t1 <= n0
    record = GroupRecord(0, "ALLREDUCE", "NCCL", 2, 8, 8, "torch.float32")
    last = fill_record(record, spans)
    assert record.t_wait_start <= record.t_wait_end <= record.t_pack_start
    assert record.t_pack_end <= record.t_collective_start <= record.t_collective_end
    assert record.t_collective_end <= record.t_unpack_start <= record.t_unpack_end == last


def test_fusion_buffers_are_reused_per_device_slot_and_dtype() -> None:
    # (one pool for both paths: hvdprof/runtime/collective_core.py)
    pool = FusionBufferPool()
    cpu = torch.device("cpu")
    a = pool.get(cpu, torch.float32, 0, 10, 1024)
    b = pool.get(cpu, torch.float32, 0, 20, 1024)
    assert a.data_ptr() == b.data_ptr() and b.numel() == 20
    assert pool.get(cpu, torch.float32, 1, 10, 1024).data_ptr() != a.data_ptr()
    assert pool.get(cpu, torch.float16, 0, 10, 1024).data_ptr() != a.data_ptr()


# ----------------------------------------------------------------------------- jobs
def _check_device_timeline(tl: Path, backend: str, ops: tuple[str, ...] = OPS) -> None:
    run = load_run(tl, cache=False)
    names = run.names
    s = run.slices
    seen = {names[i] for i in set(s.name.tolist())}
    for op in ops:
        assert f"{backend}_{op.upper()}" in seen, (op, sorted(seen))
    for name in ("WAIT_FOR_DATA", "MEMCPY_IN_FUSION_BUFFER", "MEMCPY_OUT_FUSION_BUFFER"):
        assert name in seen, (name, sorted(seen))
    assert backend in run.backends
    # every fused allreduce has its four phases in order, inside its op slice
    raw = json.loads((tl / "rank.0.json").read_text())
    events = raw if isinstance(raw, list) else raw["traceEvents"]
    by_lane: dict[int, list[dict]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("tid", 0) >= act.FIRST_TENSOR_LANE:
            by_lane.setdefault(e["tid"], []).append(e)
    checked = 0
    for lane in by_lane.values():
        lane.sort(key=lambda e: (e["ts"], -e["dur"]))
        for i, e in enumerate(lane):
            if e["name"] != "ALLREDUCE":
                continue
            end = e["ts"] + e["dur"]
            kids = [k for k in lane[i + 1 :] if k["ts"] < end and k["name"] != "QUEUE"]
            kids = [k for k in kids if not k["name"].startswith(act.NEGOTIATE_PREFIX)]
            names_in = [k["name"] for k in kids]
            if "MEMCPY_IN_FUSION_BUFFER" not in names_in:
                continue
            assert names_in[:4] == phase_names(backend, "ALLREDUCE", fused=True), names_in
            for k in kids[:4]:
                assert e["ts"] <= k["ts"] and k["ts"] + k["dur"] <= end + 0.001, (e, k)
            checked += 1
    assert checked > 0


def _watched_groups(tl: Path, backend: str) -> dict[tuple[float, float], float]:
    """The ``<backend>_ALLREDUCE`` slices of the worker's ``timing`` section on rank 0,
    one per fusion group (a group is drawn on each of its tensors' lanes): ms by slice."""
    raw = json.loads((tl / "rank.0.json").read_text())
    events = raw if isinstance(raw, list) else raw["traceEvents"]
    lanes = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    groups: dict[tuple[float, float], float] = {}
    for e in events:
        lane = str(lanes.get(e.get("tid"), ""))
        if e.get("ph") == "X" and e["name"] == f"{backend}_ALLREDUCE" and lane.startswith("t."):
            groups[(e["ts"], e["dur"])] = e["dur"] / 1000.0
    return groups


def test_device_path_on_cpu_every_op_fusion_and_timeline(tmp_path: Path) -> None:
    """Two real ranks, the device path with a Gloo group and host events: fp16, bf16,
    fp32 collectives, 100 fused tensors, ordering by events, and the timeline."""
    tl = tmp_path / "tl"
    result = run_job(
        "device_worker.py", 2, "cpu", env=CPU_ENV, launcher_args=("--timeline", str(tl))
    )
    for name in ("fusion", "routing", "timing", *OP_SECTIONS):
        result.assert_section(name, 2)
    result.assert_done(2)
    _check_device_timeline(tl, "GLOO")
    # the timing section: one timeline group per allreduce the test watched (the GPU test
    # compares their durations; on CPU no timing is asserted)
    watched = int(result.values(0, "EVENT_MS")[0].split()[1])
    assert len(_watched_groups(tl, "GLOO")) == watched > 0


def test_device_path_at_one_rank_calls_its_group(tmp_path: Path) -> None:
    """At one rank the device path still calls its process group (a 1-GPU job's timeline
    then holds NCCL's real phases): every op, fused, with the group's calls watched."""
    tl = tmp_path / "tl"
    result = run_job(
        "device_worker.py", 1, "cpu", env=CPU_ENV, launcher_args=("--timeline", str(tl))
    )
    for name in ("fusion", "timing", *OP_SECTIONS):
        result.assert_section(name, 1)
    result.assert_done(1)
    _check_device_timeline(tl, "GLOO")
    watched = int(result.values(0, "EVENT_MS")[0].split()[1])
    assert len(_watched_groups(tl, "GLOO")) == watched > 0


def _nest(log: list[str]) -> list[tuple[str, list]]:
    """push/pop lines as a forest of (name, children); fails on an unbalanced log."""
    root: list[tuple[str, list]] = []
    stack = [root]
    for line in log:
        if line.startswith("push "):
            node: tuple[str, list] = (line[5:], [])
            stack[-1].append(node)
            stack.append(node[1])
        else:
            assert line == "pop" and len(stack) > 1, log
            stack.pop()
    assert len(stack) == 1, f"unbalanced NVTX ranges: {log}"
    return root


def _check_nvtx_log(log: list[str], backend: str) -> None:
    forest = _nest(log)
    shapes = {(name, tuple(k for k, _ in kids)) for name, kids in forest}
    start = ("ALLREDUCE", ("WAIT_FOR_DATA", "MEMCPY_IN_FUSION_BUFFER", f"{backend}_ALLREDUCE"))
    finish = ("ALLREDUCE", (f"{backend}_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"))
    assert start in shapes and finish in shapes, shapes
    assert ("ALLGATHER", ("WAIT_FOR_DATA", f"{backend}_ALLGATHER")) in shapes, shapes
    for _, kids in forest:  # phases hold no further ranges
        assert all(not grandkids for _, grandkids in kids), forest


def test_nvtx_ranges_names_and_nesting_on_the_device_path() -> None:
    pytest.importorskip("nvtx", reason="the nvtx extra is not installed (.ci/setup installs it)")
    result = run_job("device_worker.py", 2, "cpu", "nvtx", env=CPU_ENV)
    result.assert_section("nvtx", 2)
    _check_nvtx_log(json.loads(result.values(0, "NVTX")[0]), "GLOO")


def test_cuda_tensor_is_refused_clearly_without_nccl() -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here: CUDA tensors are accepted")
    import hvdprof.torch as hvd

    assert hvd.nccl_built() is False
    assert hvd.cuda_built() == torch.backends.cuda.is_built()


def _synthetic_benchmark(
    extra_env: dict[str, str], timeout: int, tl: Path, ranks: int = 2
) -> JobResult:
    path = [str(WORKERS / "torchvision_standin"), os.environ.get("PYTHONPATH", "")]
    env = child_env({"PYTHONPATH": os.pathsep.join(p for p in path if p), **extra_env}, timeout)
    command = [
        sys.executable, "-m", "hvdprof", "run", "-np", str(ranks), "--timeout", str(timeout),
        "--timeline", str(tl), "--",
        sys.executable, str(WORKERS / "horovod_pytorch_synthetic_benchmark.py"),
        "--model", "tiny_resnet", "--batch-size", "4", "--num-warmup-batches", "1",
        "--num-batches-per-iter", "2", "--num-iters", "2",
    ]  # fmt: skip
    proc = subprocess.run(
        command, capture_output=True, text=True, timeout=timeout + 30, env=env, cwd=REPO
    )
    result = JobResult(proc.returncode, proc.stdout + proc.stderr, 0.0)
    parse_output(proc.stdout, result)
    assert proc.returncode == 0, result.describe()
    return result


def _device_phases(tl: Path) -> set[str]:
    run = load_run(tl, cache=False)
    return {run.names[i] for i in set(run.slices.name.tolist())}


def test_horovod_synthetic_benchmark_down_the_device_path_on_cpu(tmp_path: Path) -> None:
    """Horovod's pytorch_synthetic_benchmark.py (import changed; SyncBatchNorm, the
    DistributedOptimizer's gradients, broadcasts) with every op on the device path."""
    result = _synthetic_benchmark(CPU_ENV, 150, tmp_path / "tl")
    lines = result.lines(0)
    assert "Number of CPUs: 2" in lines, result.describe()
    assert any(line.startswith("Total img/sec on 2 CPU(s)") for line in lines), result.describe()
    seen = _device_phases(tmp_path / "tl")
    assert {"WAIT_FOR_DATA", "GLOO_ALLREDUCE", "GLOO_BROADCAST"} <= seen, sorted(seen)


# ----------------------------------------------------------------------------- GPU
@dataclass
class GpuJob:
    layout: str
    ranks: int
    backend: str
    result: JobResult
    timeline: Path
    refused: dict[tuple[str, str], str]  # (op, dtype) -> torch's message


def _refusals(result: JobResult) -> dict[tuple[str, str], str]:
    out = {}
    for line in result.values(0, "REFUSED"):
        op, dtype, reason = line.split(" ", 2)
        out[(op, dtype)] = reason
    return out


@pytest.fixture(scope="module", params=LAYOUT_PARAMS)
def gpu_job(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> GpuJob:
    """One job per layout, every section, its timeline kept: the tests below read it."""
    layout = request.param
    mode, ranks, backend = LAYOUTS[layout]
    tl = tmp_path_factory.mktemp(layout) / "tl"
    sections = ["ops", "fusion", "routing", "timing"]
    if backend == "NCCL":
        sections.append("nosync")
    if importlib.util.find_spec("nvtx") is not None:
        sections.append("nvtx")
    result = run_job(
        "device_worker.py", ranks, mode, *sections, launcher_args=("--timeline", str(tl))
    )
    return GpuJob(layout, ranks, backend, result, tl, _refusals(result))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPE_NAMES)
@pytest.mark.parametrize("op", OPS)
def test_gpu_collective(gpu_job: GpuJob, op: str, dtype: str) -> None:
    """One collective on CUDA tensors of one dtype: right values on every rank, on the
    device, down the device path (checked against every rank's inputs in the worker)."""
    reason = gpu_job.refused.get((op, dtype))
    if reason is not None:
        pytest.skip(f"torch's Gloo refuses {op} of {dtype} CUDA tensors: {reason}")
    gpu_job.result.assert_section(f"ops.{op}.{dtype}", gpu_job.ranks)


@pytest.mark.gpu
def test_gpu_job_ran_to_the_end_with_its_phases_on_the_timeline(gpu_job: GpuJob) -> None:
    gpu_job.result.assert_done(gpu_job.ranks)
    ran = tuple(op for op in OPS if any((op, d) not in gpu_job.refused for d in DTYPE_NAMES))
    _check_device_timeline(gpu_job.timeline, gpu_job.backend, ran)


@pytest.mark.gpu
def test_gpu_fusion_buffers_on_the_device_and_cpu_tensors_beside(gpu_job: GpuJob) -> None:
    """100 tensors fused in buffers on the GPU; a CPU tensor keeps the runtime's Gloo."""
    gpu_job.result.assert_section("fusion", gpu_job.ranks)
    gpu_job.result.assert_section("routing", gpu_job.ranks)


@pytest.mark.gpu
def test_gpu_timeline_durations_match_cuda_events(
    gpu_job: GpuJob, record_property: Callable[[str, object], None]
) -> None:
    """The timeline's ``<backend>_ALLREDUCE`` durations sum within 10% (and 1 us per
    group: the timeline's resolution) of the test's own ``torch.cuda.Event`` timings of
    the same calls."""
    gpu_job.result.assert_section("timing", gpu_job.ranks)
    event_ms, count = gpu_job.result.values(0, "EVENT_MS")[0].split()
    groups = _watched_groups(gpu_job.timeline, gpu_job.backend)
    timeline_ms = sum(groups.values())
    record_property("event_ms", float(event_ms))
    record_property("timeline_ms", round(timeline_ms, 6))
    record_property("groups", len(groups))
    assert len(groups) == int(count) > 0, (len(groups), count)
    slack = 0.1 * float(event_ms) + 0.001 * len(groups)
    assert abs(timeline_ms - float(event_ms)) <= slack, (timeline_ms, event_ms)


@pytest.mark.gpu
def test_gpu_no_host_synchronize_on_the_users_thread(
    gpu_job: GpuJob, record_property: Callable[[str, object], None]
) -> None:
    """``allreduce_async_`` + ``synchronize(handle)`` return while the GPU is still busy
    with the kernels queued before the op (about a second of ``torch.cuda._sleep``): the
    op is ordered after them by events, and the user's thread never waited for them."""
    if gpu_job.backend != "NCCL":
        pytest.skip(
            "torch's Gloo runs CUDA collectives through host memory, waiting for the "
            "tensor's kernels on the host: the check is NCCL's"
        )
    gpu_job.result.assert_section("nosync", gpu_job.ranks)
    gpu_ms, took_ms, first = gpu_job.result.values(0, "NOSYNC")[0].split()
    record_property("gpu_work_before_op_ms", float(gpu_ms))
    record_property("synchronize_returned_after_ms", float(took_ms))
    assert first == "1" and float(took_ms) < float(gpu_ms), (gpu_ms, took_ms)


@pytest.mark.gpu
def test_gpu_nvtx_ranges(gpu_job: GpuJob) -> None:
    """The device path's NVTX ranges, pushed and popped through the nvtx package's domain
    on the cycle thread, named and nested as on the CPU stand-in (no Nsight needed)."""
    pytest.importorskip("nvtx", reason="the nvtx extra is not installed (.ci/setup installs it)")
    gpu_job.result.assert_section("nvtx", gpu_job.ranks)
    _check_nvtx_log(json.loads(gpu_job.result.values(0, "NVTX")[0]), gpu_job.backend)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "layout",
    [
        pytest.param("nccl-1gpu", marks=_needs_gpus(1)),
        pytest.param("nccl-2gpus", marks=_needs_gpus(2)),
        pytest.param(
            "nccl-2ranks-1gpu",
            marks=pytest.mark.skip(
                reason="Horovod's benchmark sends CUDA tensors to NCCL, which refuses two "
                "ranks on one GPU: its 2-rank run needs 2 GPUs"
            ),
        ),
    ],
)
def test_gpu_horovod_pytorch_synthetic_benchmark(layout: str, tmp_path: Path) -> None:
    """Horovod's examples/pytorch/pytorch_synthetic_benchmark.py, only its import changed."""
    ranks = 2 if layout == "nccl-2gpus" else 1
    result = _synthetic_benchmark({}, 300, tmp_path / "tl", ranks)
    lines = result.lines(0)
    assert f"Number of GPUs: {ranks}" in lines, result.describe()
    total = f"Total img/sec on {ranks} GPU(s)"
    assert any(line.startswith(total) for line in lines), result.describe()
    seen = _device_phases(tmp_path / "tl")
    assert {"WAIT_FOR_DATA", "NCCL_ALLREDUCE", "NCCL_BROADCAST"} <= seen, sorted(seen)
