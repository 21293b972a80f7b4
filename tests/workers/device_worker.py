"""The device path (issue 28) at 2 ranks: the same checks on a GPU and on the CPU stand-in.

Usage: device_worker.py DEVICE [SECTION ...], DEVICE ``cuda`` (NCCL, CUDA events) or ``cpu``
(run with HVDPROF_DEVICE_PATH_ON_CPU=1: a Gloo group and host events). Prints one
``SECTION <name> ...`` line per section and ``DONE``; ``timing`` also prints
``EVENT_MS <total>``, the test's own event timings of the collectives it watched.
"""

from __future__ import annotations

import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime import runtime as rt  # noqa: E402

DEVICE = sys.argv[1]
SECTIONS = set(sys.argv[2:]) or {"ops", "fusion", "routing", "timing"}
hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
path = rt.get().device_path
dev = torch.device("cuda", torch.cuda.current_device()) if DEVICE == "cuda" else torch.device("cpu")
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def value(rank: int, shape: tuple[int, ...], dtype: torch.dtype, salt: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    base = (torch.arange(n, dtype=torch.int64) * 3 + salt + rank * 5) % 7 + 1
    return base.reshape(shape).to(dtype)


def on(t: torch.Tensor) -> torch.Tensor:
    return t.to(dev, copy=True)


if "ops" in SECTIONS:
    with ck.section("ops"):
        ck.true(path is not None and path.routes(dev.type), "the device path takes these tensors")
        before = path.groups
        for k, dtype in enumerate(DTYPES):
            shape = (5, 3)
            everyone = [value(r, shape, dtype, k) for r in range(N)]
            total = torch.stack([v.double() for v in everyone]).sum(0)
            out = hvd.allreduce(on(everyone[R]), op=hvd.Sum, name=f"ar.{k}")
            ck.true(out.device == dev, f"allreduce {dtype} stays on {dev}")
            ck.tensor(out.cpu(), total.to(dtype), f"allreduce Sum {dtype}")
            avg = hvd.allreduce(on(everyone[R]), name=f"avg.{k}")
            ck.tensor(avg.cpu(), (total / N).to(dtype), f"allreduce Average {dtype}", 1e-2, 1e-2)
            inplace = on(everyone[R])
            hvd.allreduce_(inplace, op=hvd.Sum, name=f"ar_.{k}")
            ck.tensor(inplace.cpu(), total.to(dtype), f"allreduce_ {dtype}")
            rows = [value(r, (r + 1, 2), dtype, k) for r in range(N)]
            gathered = hvd.allgather(on(rows[R]), name=f"ag.{k}")
            ck.tensor(gathered.cpu(), torch.cat(rows), f"allgather {dtype} (uneven rows)")
            b = hvd.broadcast(on(everyone[R]), root_rank=N - 1, name=f"bc.{k}")
            ck.tensor(b.cpu(), everyone[N - 1], f"broadcast {dtype}")
            send = torch.stack([value(R, (2,), dtype, k + j) for j in range(N)])
            splits_in = torch.ones(N, dtype=torch.int32)
            recv, splits = hvd.alltoall(on(send), splits=splits_in, name=f"a2a.{k}")
            want = torch.stack([value(r, (2,), dtype, k + R) for r in range(N)])
            ck.tensor(recv.cpu(), want, f"alltoall {dtype}")
            ck.eq(splits.tolist(), [1] * N, f"alltoall {dtype} received splits")
            rs_in = [value(r, (2 * N, 2), dtype, k) for r in range(N)]
            rs = hvd.reducescatter(on(rs_in[R]), op=hvd.Sum, name=f"rs.{k}")
            rs_total = torch.stack([v.double() for v in rs_in]).sum(0)
            ck.tensor(rs.cpu(), rs_total[2 * R : 2 * R + 2].to(dtype), f"reducescatter {dtype}")
            # uneven rows (extra ones to low ranks): an allreduce and this rank's rows
            odd_in = [value(r, (2 * N + 1, 2), dtype, k) for r in range(N)]
            odd = hvd.reducescatter(on(odd_in[R]), op=hvd.Sum, name=f"rs_odd.{k}")
            odd_total = torch.stack([v.double() for v in odd_in]).sum(0)
            lo = 0 if R == 0 else 2 * R + 1  # rank 0 gets 3 rows, the others 2
            ck.tensor(
                odd.cpu(), odd_total[lo : lo + odd.shape[0]].to(dtype), f"reducescatter odd {dtype}"
            )
            ck.eq(odd.shape[0], 3 if R == 0 else 2, f"reducescatter odd {dtype} rows")
        ck.eq(path.groups - before, 8 * len(DTYPES), "every op went down the device path")

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

if "routing" in SECTIONS:
    with ck.section("routing"):
        before = path.groups
        if DEVICE == "cuda":  # CPU tensors keep Gloo beside NCCL
            out = hvd.allreduce(torch.ones(3) * (R + 1), op=hvd.Sum, name="cpu.ar")
            ck.tensor(out, torch.ones(3) * sum(range(1, N + 1)), "a CPU tensor beside NCCL")
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

hvd.shutdown()
ck.done()
