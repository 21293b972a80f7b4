"""The device path (issue 28): the same checks on a GPU and on the CPU stand-in.

Usage: device_worker.py MODE [SECTION ...]. MODE:

- ``cuda``: CUDA tensors through the runtime's NCCL group and CUDA events (1 rank on one
  GPU, or N ranks on N GPUs: NCCL refuses two ranks on one device);
- ``cuda-gloo``: N ranks sharing one GPU: CUDA tensors and CUDA events, with the device
  path's NCCL group replaced by a Gloo group on the runtime's store (torch's Gloo takes
  CUDA tensors for some ops: each op and dtype is tried on the group first, and one that
  torch refuses prints ``REFUSED <op> <dtype> <torch's message>`` and is not run);
- ``cpu`` (with HVDPROF_DEVICE_PATH_ON_CPU=1): a Gloo group and host events.

Prints one ``SECTION <name> ...`` line per section and ``DONE``. Sections: ``ops`` (one
section ``ops.<op>.<dtype>`` per collective and dtype; ``ops.<op>`` selects one op),
``fusion`` (the buffers on the device), ``routing``, ``timing`` (prints ``EVENT_MS <total>
<count>``, the test's own event timings of the allreduces it watched), ``nosync`` (GPU only:
``synchronize(handle)`` returns while the GPU is still busy with the kernels before the op;
prints ``NOSYNC <ms of GPU work before the op> <ms synchronize took> <1: returned first>``)
and ``nvtx`` (prints ``NVTX <json push/pop log>``).
"""

from __future__ import annotations

import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime import runtime as rt  # noqa: E402
from hvdprof.runtime.backends.nccl import ProcessGroupCollectives  # noqa: E402

MODE = sys.argv[1]
OPS = ("allreduce", "allgather", "broadcast", "alltoall", "reducescatter")
SECTIONS = set(sys.argv[2:]) or {"ops", "fusion", "routing", "timing"}
if "ops" in SECTIONS:
    SECTIONS |= {f"ops.{op}" for op in OPS}
hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
path = rt.get().device_path
on_gpu = MODE in ("cuda", "cuda-gloo")
dev = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: groups each op's checks run per dtype (reducescatter: even rows, then uneven)
GROUPS = {"allreduce": 3, "allgather": 1, "broadcast": 1, "alltoall": 1, "reducescatter": 2}


def value(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) * 3 + salt + rank * 5) % 7 + 1
    return base.reshape(shape).to(dtype)


def on(t: torch.Tensor) -> torch.Tensor:
    return t.to(dev, copy=True)


def share_one_gpu() -> ProcessGroupCollectives:
    """``cuda-gloo``: the device path's collectives on a Gloo group of the runtime's store
    (its NCCL group, made at init and never called, is put back before shutdown)."""
    import datetime

    runtime = rt.get()  # its Gloo options (the network device it chose), on its store
    pg = runtime._gloo_group(runtime._store, "hvdtest/shared-gpu/", datetime.timedelta(seconds=60))
    nccl = path.backend
    path.backend = ProcessGroupCollectives(pg, R, N, "GLOO")
    return nccl


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def refused_by_torch(op: str, dtype: torch.dtype) -> str | None:
    """torch's message when the device path's group refuses ``op`` on ``dtype`` tensors
    on this device (every rank tries the same ops in the same order), else None."""
    pg = path.backend.pg
    t = torch.ones(2 * N, 2, dtype=dtype, device=dev)
    try:
        if op == "allreduce":
            pg.allreduce([t]).wait()
        elif op == "allgather":
            pg.allgather([[torch.empty_like(t) for _ in range(N)]], [t]).wait()
        elif op == "broadcast":
            options = dist.BroadcastOptions()
            options.rootRank = 0
            pg.broadcast([t], options).wait()
        elif op == "alltoall":
            pg.alltoall_base(torch.empty_like(t), t, [], [], dist.AllToAllOptions()).wait()
        else:
            out = torch.empty(2, 2, dtype=dtype, device=dev)
            pg.reduce_scatter([out], [list(t.split(2))], dist.ReduceScatterOptions()).wait()
        torch.cuda.synchronize()
    except Exception as exc:  # torch's own refusal (RuntimeError, ValueError, ...)
        return " ".join(str(exc).split())[:300] or type(exc).__name__
    return None


nccl_backend = share_one_gpu() if MODE == "cuda-gloo" else None
REFUSED: dict[tuple[str, torch.dtype], str] = {}
if MODE == "cuda-gloo":
    for op in OPS:
        for dtype in DTYPES:
            reason = refused_by_torch(op, dtype)
            if reason is not None:
                REFUSED[(op, dtype)] = reason
                print(f"REFUSED {op} {dtype_name(dtype)} {reason}", flush=True)


def check_allreduce(k: int, dtype: torch.dtype) -> None:
    everyone = [value(r, (5, 3), dtype, k) for r in range(N)]
    total = torch.stack([v.double() for v in everyone]).sum(0)
    out = hvd.allreduce(on(everyone[R]), op=hvd.Sum, name=f"ar.{k}")
    ck.true(out.device == dev, f"allreduce {dtype} stays on {dev}")
    ck.tensor(out.cpu(), total.to(dtype), f"allreduce Sum {dtype}")
    avg = hvd.allreduce(on(everyone[R]), name=f"avg.{k}")
    ck.tensor(avg.cpu(), (total / N).to(dtype), f"allreduce Average {dtype}", 1e-2, 1e-2)
    inplace = on(everyone[R])
    hvd.allreduce_(inplace, op=hvd.Sum, name=f"ar_.{k}")
    ck.tensor(inplace.cpu(), total.to(dtype), f"allreduce_ {dtype}")


def check_allgather(k: int, dtype: torch.dtype) -> None:
    rows = [value(r, (r + 1, 2), dtype, k) for r in range(N)]
    gathered = hvd.allgather(on(rows[R]), name=f"ag.{k}")
    ck.tensor(gathered.cpu(), torch.cat(rows), f"allgather {dtype} (uneven rows)")


def check_broadcast(k: int, dtype: torch.dtype) -> None:
    everyone = [value(r, (5, 3), dtype, k) for r in range(N)]
    b = hvd.broadcast(on(everyone[R]), root_rank=N - 1, name=f"bc.{k}")
    ck.tensor(b.cpu(), everyone[N - 1], f"broadcast {dtype}")


def check_alltoall(k: int, dtype: torch.dtype) -> None:
    send = torch.stack([value(R, (2,), dtype, k + j) for j in range(N)])
    splits_in = torch.ones(N, dtype=torch.int32)
    recv, splits = hvd.alltoall(on(send), splits=splits_in, name=f"a2a.{k}")
    want = torch.stack([value(r, (2,), dtype, k + R) for r in range(N)])
    ck.tensor(recv.cpu(), want, f"alltoall {dtype}")
    ck.eq(splits.tolist(), [1] * N, f"alltoall {dtype} received splits")


def check_reducescatter(k: int, dtype: torch.dtype) -> None:
    rs_in = [value(r, (2 * N, 2), dtype, k) for r in range(N)]
    rs = hvd.reducescatter(on(rs_in[R]), op=hvd.Sum, name=f"rs.{k}")
    rs_total = torch.stack([v.double() for v in rs_in]).sum(0)
    ck.tensor(rs.cpu(), rs_total[2 * R : 2 * R + 2].to(dtype), f"reducescatter {dtype}")
    # uneven rows (extra ones to low ranks): an allreduce and this rank's rows
    odd_in = [value(r, (2 * N + 1, 2), dtype, k) for r in range(N)]
    odd = hvd.reducescatter(on(odd_in[R]), op=hvd.Sum, name=f"rs_odd.{k}")
    odd_total = torch.stack([v.double() for v in odd_in]).sum(0)
    lo = 0 if R == 0 else 2 * R + 1  # rank 0 gets 3 rows, the others 2
    ck.tensor(odd.cpu(), odd_total[lo : lo + odd.shape[0]].to(dtype), f"reducescatter odd {dtype}")
    want_rows = 2 * N + 1 if N == 1 else (3 if R == 0 else 2)
    ck.eq(odd.shape[0], want_rows, f"reducescatter odd {dtype} rows")


CHECKS = {
    "allreduce": check_allreduce,
    "allgather": check_allgather,
    "broadcast": check_broadcast,
    "alltoall": check_alltoall,
    "reducescatter": check_reducescatter,
}
for op in OPS:
    if f"ops.{op}" not in SECTIONS:
        continue
    for k, dtype in enumerate(DTYPES):
        if (op, dtype) in REFUSED:
            continue
        with ck.section(f"ops.{op}.{dtype_name(dtype)}"):
            ck.true(path is not None and path.routes(dev.type), "the device path takes them")
            before = path.groups
            CHECKS[op](k, dtype)
            ck.eq(path.groups - before, GROUPS[op], f"every {op} went down the device path")

if "fusion" in SECTIONS:
    with ck.section("fusion"):
        stats0 = hvd.runtime_stats()
        tensors = [on(value(R, (i % 7 + 1, 3), torch.float32, i)) for i in range(100)]
        handles = [
            hvd.allreduce_async_(t, op=hvd.Sum, name=f"f.{i}") for i, t in enumerate(tensors)
        ]
        for i, (h, t) in enumerate(zip(handles, tensors, strict=True)):
            hvd.synchronize(h)
            want = torch.stack([value(r, (i % 7 + 1, 3), torch.float64, i) for r in range(N)]).sum(
                0
            )
            ck.tensor(t.cpu(), want.float(), f"fused tensor {i}")
        stats1 = hvd.runtime_stats()
        ck.true(
            stats1["fused_tensors"] - stats0["fused_tensors"] >= 2,
            f"tensors were fused ({stats0['fused_tensors']} -> {stats1['fused_tensors']})",
        )
        buffers = list(path.pool._buffers.values())
        ck.true(buffers, "the fusion buffers were made")
        ck.eq({b.device for b in buffers}, {dev}, "the fusion buffers are on the device")

if "routing" in SECTIONS:
    with ck.section("routing"):
        before = path.groups
        if on_gpu:  # CPU tensors keep the runtime's Gloo beside the device path
            out = hvd.allreduce(torch.ones(3) * (R + 1), op=hvd.Sum, name="cpu.ar")
            ck.tensor(out, torch.ones(3) * sum(range(1, N + 1)), "a CPU tensor beside the GPU")
            ck.eq(path.groups, before, "the CPU tensor did not use the device path")
        else:  # the stand-in's streams counted every wait: none on an unrecorded event
            clock = path.clock
            w0 = (clock.executor.waits, clock.user.waits)
            hvd.allreduce(torch.ones(3), name="cpu.ar")
            ck.true(clock.executor.waits > w0[0], "the executor's stream waited for the data")
            ck.true(clock.user.waits > w0[1], "the user's stream waited for the done event")

if "timing" in SECTIONS:
    with ck.section("timing"):
        watched: list[tuple[object, object]] = []
        backend = path.backend
        real = backend.pg

        class Watched:
            """The process group, with the test's own events around each allreduce."""

            def __getattr__(self, name: str) -> object:
                return getattr(real, name)

            def allreduce(self, tensors, options):  # type: ignore[no-untyped-def]
                start = path.clock.event()
                start.record()
                work = real.allreduce(tensors, options)
                outer = self

                class Work:
                    def wait(self) -> object:
                        done = work.wait()
                        end = path.clock.event()
                        end.record()
                        watched.append((start, end))
                        return done

                del outer
                return Work()

        backend.pg = Watched()
        try:
            for step in range(5):
                ts = [on(value(R, (256, 64), torch.float32, step + i)) for i in range(8)]
                hs = [hvd.allreduce_async_(t, name=f"t.{i}") for i, t in enumerate(ts)]
                for h in hs:
                    hvd.synchronize(h)
        finally:
            backend.pg = real
        for _, end in watched:
            end.synchronize()
        total = sum(s.elapsed_time(e) for s, e in watched)
        ck.true(len(watched) > 0, "allreduces were watched")
        print(f"EVENT_MS {total:.6f} {len(watched)}", flush=True)

if "nosync" in SECTIONS and on_gpu:
    with ck.section("nosync"):
        # the user's stream is kept busy (torch.cuda._sleep, then the kernel that makes
        # the data); allreduce_async_ + synchronize must come back before that work is
        # done: ordered by events on the GPU, nothing waited for on this thread
        t = torch.zeros(1 << 16, device=dev)
        torch.cuda.synchronize()
        t0 = torch.cuda.Event(enable_timing=True)
        t0.record()
        torch.cuda._sleep(2_000_000_000)  # ~1 s at the H200's 1.98 GHz
        t.add_(R + 1)
        made = torch.cuda.Event(enable_timing=True)
        made.record()
        called = time.perf_counter()
        h = hvd.allreduce_async_(t, op=hvd.Sum, name="nosync")
        hvd.synchronize(h)
        took_ms = (time.perf_counter() - called) * 1000.0
        busy = not made.query()
        ck.true(busy, f"synchronize(handle) returned while the GPU was busy ({took_ms:.1f} ms)")
        ck.tensor(t[:4].cpu(), torch.full((4,), float(sum(range(1, N + 1)))), "nosync result")
        gpu_ms = t0.elapsed_time(made)
        print(f"NOSYNC {gpu_ms:.3f} {took_ms:.3f} {int(busy)}", flush=True)

if "nvtx" in SECTIONS:  # the ranges through NVTX's own Python API, recorded on the way
    with ck.section("nvtx"):
        import json

        import nvtx

        from hvdprof.timeline.nvtx_ranges import PhaseRanges

        real = nvtx.get_domain("hvdprof")
        messages: dict[int, str] = {}
        log: list[str] = []

        class Recording:
            def get_event_attributes(self, message: str) -> object:
                attrs = real.get_event_attributes(message=message)
                messages[id(attrs)] = message
                return attrs

            def push_range(self, attrs: object) -> None:
                log.append("push " + messages[id(attrs)])
                real.push_range(attrs)

            def pop_range(self) -> None:
                log.append("pop")
                real.pop_range()

        executor = rt.get().executor
        executor.nvtx = PhaseRanges(domain=Recording())
        ts = [on(value(R, (4,), torch.float32, i)) for i in range(3)]
        hs = [hvd.allreduce_async_(t, name=f"n.{i}") for i, t in enumerate(ts)]
        for h in hs:
            hvd.synchronize(h)
        hvd.allgather(on(value(R, (2,), torch.float32, 0)), name="n.ag")
        executor.nvtx = None
        ck.true(log, "ranges were pushed")
        print("NVTX " + json.dumps(log), flush=True)

if nccl_backend is not None:  # (cuda-gloo) the runtime shuts its own group down
    path.backend = nccl_backend
hvd.shutdown()
ck.done()
