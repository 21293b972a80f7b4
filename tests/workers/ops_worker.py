"""Every collective of hvdprof.torch, every dtype, checked numerically on every rank.

Usage: ops_worker.py SHARED_DIR. Expectations adapt to HVDPROF_FUSION_THRESHOLD and
HVDPROF_CACHE_CAPACITY (0 means that fusion / the response cache must not happen).
Prints ``OK <checks>`` at the end.
"""

from __future__ import annotations

import copy
import os
import sys
import time
import warnings
from pathlib import Path

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.errors import HvdprofInternalError  # noqa: E402
from hvdprof.runtime import runtime as rt  # noqa: E402
from hvdprof.runtime.dtypes import ITEMSIZE, torch_attr  # noqa: E402

SHARED = Path(sys.argv[1])
FUSION_ON = os.environ.get("HVDPROF_FUSION_THRESHOLD", "1") != "0"
CACHE_CAPACITY = int(os.environ.get("HVDPROF_CACHE_CAPACITY", "4096"))
CACHE_ON = CACHE_CAPACITY != 0
#: room for every name this worker uses; a smaller cache fills up in the first sections,
#: and every later name is negotiated by the coordinator each time
ROOMY_CACHE = CACHE_CAPACITY >= 4096
#: allreduce buffers up to this size go over the control channel's sockets
SMALL_BYTES = int(os.environ.get("HVDPROF_SMALL_ALLREDUCE_BYTES", str(256 * 1024)))
#: bigger allreduce buffers go through shared memory (all ranks share this host)
SHM_ON = os.environ.get("HVDPROF_BACKEND", "auto") not in ("gloo", "mpi")

#: every dtype the runtime supports, from its own table (a dtype added there is tested here)
DTYPES = [getattr(torch, torch_attr(name)) for name in ITEMSIZE]
OPS = {
    "Average": hvd.Average,
    "Sum": hvd.Sum,
    "Min": hvd.Min,
    "Max": hvd.Max,
    "Product": hvd.Product,
}

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-6, "atol": 1e-6}
    return {}


def value(r: int, shape: tuple[int, ...] = (2, 3), offset: int = 0) -> torch.Tensor:
    """Rank ``r``'s input, as float64: small integers, exact in every dtype."""
    numel = 1
    for d in shape:
        numel *= d
    return (torch.arange(numel, dtype=torch.float64) % 3 + r + 1 + offset).reshape(shape)


def reduced(op: str, dtype: torch.dtype, shape=(2, 3), pre: float = 1.0, post: float = 1.0):
    """What allreduce of ``value(r)`` over all ranks must give, in ``dtype``."""
    vals = torch.stack([value(r, shape) * pre for r in range(N)])
    return (_common.expected_allreduce(vals, op, dtype) * post).to(dtype)


# ------------------------------------------------------------------ topology
def check_topology() -> None:
    runtime = rt.current()
    hvd.init()  # idempotent: the same runtime keeps running
    ck.true(rt.current() is runtime, "init() twice keeps the running runtime")
    ck.true(hvd.is_initialized(), "is_initialized")
    # (HVDTEST_*: the launcher's own variables, under mpirun/torchrun/srun; see launched.py)
    ck.eq(hvd.size(), int(os.environ.get("HVDPROF_SIZE") or os.environ["HVDTEST_SIZE"]), "size")
    ck.eq(hvd.rank(), int(os.environ.get("HVDPROF_RANK") or os.environ["HVDTEST_RANK"]), "rank")
    ck.eq(hvd.local_size(), N, "local_size")
    ck.eq(hvd.local_rank(), R, "local_rank")
    ck.eq(hvd.cross_size(), 1, "cross_size")
    ck.eq(hvd.cross_rank(), 0, "cross_rank")
    ck.true(hvd.HorovodInternalError is HvdprofInternalError, "HorovodInternalError exported")
    ranks = hvd.allgather(torch.tensor([hvd.rank()]), name="topology.ranks")
    ck.tensor(ranks, torch.arange(N), "every rank has a distinct rank")


# ------------------------------------------------------------------ allreduce
def check_allreduce_blocking() -> None:
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            t = value(R).to(dtype)
            before = t.clone()
            expected = reduced(op_name, dtype)
            what = f"allreduce {op_name} {dtype}"
            out = hvd.allreduce(t, op=op, name=f"ar.{op_name}.{dtype}")
            ck.tensor(out, expected, what, **tol(dtype))
            ck.tensor(t, before, what + " leaves its input alone")
            out = hvd.allreduce_(t, op=op)  # unnamed
            ck.true(out is t, "allreduce_ returns its input")
            ck.tensor(t, expected, "allreduce_ " + what, **tol(dtype))


def check_allreduce_async_many() -> None:
    """Both async forms, every dtype and op, all in flight at once."""
    pending = []
    for dtype in DTYPES:
        for op_name, op in OPS.items():
            t = value(R).to(dtype)
            h = hvd.allreduce_async(t, op=op, name=f"ara.{op_name}.{dtype}")
            t2 = value(R).to(dtype)
            h2 = hvd.allreduce_async_(t2, op=op, name=f"ara_.{op_name}.{dtype}")
            pending.append((h, h2, t, t2, reduced(op_name, dtype), op_name, dtype))
    for h, h2, t, t2, expected, op_name, dtype in pending:
        what = f"allreduce_async {op_name} {dtype}"
        ck.tensor(hvd.synchronize(h), expected, what, **tol(dtype))
        ck.tensor(t, value(R).to(dtype), what + " leaves its input alone")
        out = hvd.synchronize(h2)
        ck.true(out is t2, "allreduce_async_ returns its input")
        ck.tensor(t2, expected, "allreduce_async_ " + what, **tol(dtype))


def check_allreduce_options() -> None:
    for dtype in DTYPES:
        t = value(R).to(dtype)
        what = f"prescale/postscale {dtype}"
        if dtype.is_floating_point:
            out = hvd.allreduce(t, op=hvd.Average, prescale_factor=2.0, postscale_factor=0.5)
            ck.tensor(out, reduced("Average", dtype, pre=2.0, post=0.5), what, **tol(dtype))
            out = hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
            ck.tensor(out, reduced("Sum", dtype, pre=0.5, post=3.0), what, **tol(dtype))
        else:
            out = hvd.allreduce(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=3.0)
            ck.tensor(out, reduced("Sum", dtype, pre=2.0, post=3.0), what)
    # the default op is Average
    t = value(R)
    ck.tensor(hvd.allreduce(t), reduced("Average", torch.float64), "default op is Average")
    # deprecated average=
    for average, op_name in ((True, "Average"), (False, "Sum")):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = hvd.allreduce(t, average=average)
        ck.true(
            any(issubclass(w.category, DeprecationWarning) for w in caught),
            f"average={average} warns DeprecationWarning",
        )
        ck.tensor(out, reduced(op_name, torch.float64), f"average={average}")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            h = hvd.allreduce_async_(t.clone(), average=average)
            out = hvd.synchronize(h)
        ck.true(
            any(issubclass(w.category, DeprecationWarning) for w in caught),
            f"allreduce_async_(average={average}) warns",
        )
        ck.tensor(out, reduced(op_name, torch.float64), f"allreduce_async_ average={average}")
    for fn in (hvd.allreduce, hvd.allreduce_, hvd.allreduce_async, hvd.allreduce_async_):
        ck.raises(ValueError, lambda fn=fn: fn(t.clone(), average=True, op=hvd.Sum), "average")
    # compression
    f = value(R).float() / 3.0
    expected = torch.stack([value(r).float() / 3.0 for r in range(N)]).sum(0)
    out = hvd.allreduce(f, op=hvd.Sum, compression=hvd.Compression.fp16)
    ck.tensor(out, expected, "fp16 compression keeps float32", rtol=5e-3, atol=5e-3)
    out = hvd.allreduce(f, compression=hvd.Compression.none, op=hvd.Sum)
    ck.tensor(out, expected, "no compression", rtol=1e-6)
    i = value(R).int()
    out = hvd.allreduce(i, op=hvd.Sum, compression=hvd.Compression.fp16)
    ck.tensor(out, reduced("Sum", torch.int32), "fp16 compression leaves int32 alone")
    # shapes: scalar, 1-d, 4-d, empty, non-contiguous (copied, not in place)
    for shape in ((), (5,), (2, 1, 3, 2)):
        out = hvd.allreduce(value(R, shape), op=hvd.Sum, name=f"shape.{shape}")
        ck.tensor(out, reduced("Sum", torch.float64, shape), f"allreduce of shape {shape}")
    empty = hvd.allreduce(torch.zeros(0, 3), op=hvd.Sum, name="empty")
    ck.tensor(empty, torch.zeros(0, 3), "allreduce of an empty tensor")
    nc = value(R, (3, 2)).t()
    ck.true(not nc.is_contiguous(), "test input is non-contiguous")
    expected = torch.stack([value(r, (3, 2)).t() for r in range(N)]).sum(0)
    ck.tensor(hvd.allreduce(nc, op=hvd.Sum), expected, "non-contiguous allreduce")


def check_allreduce_autograd() -> None:
    for op_name, op in (("Sum", hvd.Sum), ("Average", hvd.Average)):
        x = torch.full((3,), float(R + 1), dtype=torch.float64, requires_grad=True)
        y = hvd.allreduce(x, op=op, name=f"grad.{op_name}")
        total = sum(range(1, N + 1))
        want = total if op_name == "Sum" else total / N
        ck.tensor(y.detach(), torch.full((3,), float(want), dtype=torch.float64), "forward")
        ck.true(y.requires_grad, "allreduce output requires grad")
        w = torch.arange(3, dtype=torch.float64) + R
        (y * w).sum().backward()
        grads = torch.stack([torch.arange(3, dtype=torch.float64) + r for r in range(N)]).sum(0)
        if op_name == "Average":
            grads = grads / N
        ck.tensor(x.grad, grads, f"backward of allreduce {op_name} is an allreduce of grad")


# ------------------------------------------------------------------ grouped allreduce
def check_grouped() -> None:
    shapes = [(3,), (2, 2), (), (4, 1)]
    dtypes = [torch.float32, torch.float32, torch.float64, torch.int32]
    for op_name, op in OPS.items():

        def inputs():
            return [value(R, s).to(d) for s, d in zip(shapes, dtypes, strict=True)]

        expected = [reduced(op_name, d, s) for s, d in zip(shapes, dtypes, strict=True)]
        ts = inputs()
        outs = hvd.grouped_allreduce(ts, op=op, name=f"grp.{op_name}")
        for o, e, t, s, d in zip(outs, expected, ts, shapes, dtypes, strict=True):
            ck.tensor(o, e, f"grouped_allreduce {op_name}", **tol(d))
            ck.tensor(t, value(R, s).to(d), "grouped_allreduce leaves its inputs alone")
        ts = inputs()
        outs = hvd.grouped_allreduce_(ts, op=op)
        for o, e, t, d in zip(outs, expected, ts, dtypes, strict=True):
            ck.true(o is t, "grouped_allreduce_ returns its inputs")
            ck.tensor(t, e, f"grouped_allreduce_ {op_name}", **tol(d))
        ts = inputs()
        h = hvd.grouped_allreduce_async(ts, op=op, name=f"grpa.{op_name}")
        ts2 = inputs()
        h2 = hvd.grouped_allreduce_async_(ts2, op=op)
        outs = hvd.synchronize(h)
        ck.eq(len(outs), len(ts), "grouped_allreduce_async returns a list")
        for o, e, d in zip(outs, expected, dtypes, strict=True):
            ck.tensor(o, e, f"grouped_allreduce_async {op_name}", **tol(d))
        outs = hvd.synchronize(h2)
        for o, e, t, d in zip(outs, expected, ts2, dtypes, strict=True):
            ck.true(o is t, "grouped_allreduce_async_ returns its inputs")
            ck.tensor(t, e, f"grouped_allreduce_async_ {op_name}", **tol(d))
    f = [value(R).float() / 3, value(R, (4,)).float() / 7]
    outs = hvd.grouped_allreduce(f, op=hvd.Sum, compression=hvd.Compression.fp16)
    for o, s, div in zip(outs, [(2, 3), (4,)], [3, 7], strict=True):
        e = torch.stack([value(r, s).float() / div for r in range(N)]).sum(0)
        ck.tensor(o, e, "grouped_allreduce with fp16 compression", rtol=5e-3, atol=5e-3)


# ------------------------------------------------------------------ allgather
def check_allgather() -> None:
    for dtype in DTYPES:
        for rows_of in (lambda r: r + 1, lambda r: r):  # differing first dims, one empty
            t = torch.full((rows_of(R), 2), R + 1).to(dtype)
            expected = torch.cat([torch.full((rows_of(r), 2), r + 1) for r in range(N)]).to(dtype)
            ck.tensor(hvd.allgather(t), expected, f"allgather {dtype}")
            h = hvd.allgather_async(t, name=f"aga.{dtype}")
            ck.tensor(hvd.synchronize(h), expected, f"allgather_async {dtype}")
    t = value(R, (R + 1, 2, 2))
    expected = torch.cat([value(r, (r + 1, 2, 2)) for r in range(N)])
    ck.tensor(hvd.allgather(t, name="ag.3d"), expected, "allgather of 3-d tensors")
    t = torch.tensor([R * 10, R * 10 + 1])
    expected = torch.tensor([v for r in range(N) for v in (r * 10, r * 10 + 1)])
    ck.tensor(hvd.allgather(t), expected, "allgather 1-d")


# ------------------------------------------------------------------ broadcast
def check_broadcast() -> None:
    for root in range(N):
        for dtype in DTYPES:
            what = f"broadcast root {root} {dtype}"
            expected = value(root).to(dtype)
            t = value(R).to(dtype)
            out = hvd.broadcast(t, root)
            ck.tensor(out, expected, what)
            ck.tensor(t, value(R).to(dtype), what + " leaves its input alone")
            t = value(R).to(dtype)
            out = hvd.broadcast_(t, root_rank=root, name=f"bc_.{root}.{dtype}")
            ck.true(out is t, "broadcast_ returns its input")
            ck.tensor(t, expected, "broadcast_ " + what)
            t = value(R).to(dtype)
            h = hvd.broadcast_async(t, root, name=f"bca.{root}.{dtype}")
            t2 = value(R).to(dtype)
            h2 = hvd.broadcast_async_(t2, root)
            ck.tensor(hvd.synchronize(h), expected, "broadcast_async " + what)
            ck.tensor(t, value(R).to(dtype), "broadcast_async leaves its input alone")
            ck.true(hvd.synchronize(h2) is t2, "broadcast_async_ returns its input")
            ck.tensor(t2, expected, "broadcast_async_ " + what)
    t = torch.tensor(float(R))
    ck.tensor(hvd.broadcast(t, N - 1), torch.tensor(float(N - 1)), "broadcast of a scalar")


# ------------------------------------------------------------------ alltoall
def splits_of(src: int) -> list[int]:
    return [(src + dst) % 3 + (1 if dst == 0 else 0) for dst in range(N)]


def check_alltoall() -> None:
    for dtype in DTYPES:
        mine = splits_of(R)
        t = torch.cat([torch.full((n, 2), R * 10 + dst) for dst, n in enumerate(mine)]).to(dtype)
        expected = torch.cat(
            [torch.full((splits_of(src)[R], 2), src * 10 + R) for src in range(N)]
        ).to(dtype)
        recv = [splits_of(src)[R] for src in range(N)]
        for form, splits in (("list", mine), ("tensor", torch.tensor(mine, dtype=torch.int32))):
            result = hvd.alltoall(t, splits=splits, name=f"a2a.{form}.{dtype}")
            ck.true(isinstance(result, tuple) and len(result) == 2, "alltoall with splits: a pair")
            out, received = result
            ck.tensor(out, expected, f"alltoall splits={form} {dtype}")
            ck.eq([int(v) for v in received], recv, f"alltoall received splits {dtype}")
        h = hvd.alltoall_async(t, splits=mine)
        out, received = hvd.synchronize(h)
        ck.tensor(out, expected, f"alltoall_async {dtype}")
        ck.eq([int(v) for v in received], recv, "alltoall_async received splits")
        # without splits: equal chunks of the first dimension
        t = torch.cat([torch.full((2, 3), R * 10 + dst) for dst in range(N)]).to(dtype)
        expected = torch.cat([torch.full((2, 3), src * 10 + R) for src in range(N)]).to(dtype)
        out = hvd.alltoall(t)
        ck.true(isinstance(out, torch.Tensor), "alltoall without splits returns a tensor")
        ck.tensor(out, expected, f"alltoall without splits {dtype}")
        # as Horovod's: synchronize gives (output, received splits) even without splits
        out, received = hvd.synchronize(hvd.alltoall_async(t, name=f"a2a.nosplit.{dtype}"))
        ck.tensor(out, expected, f"alltoall_async without splits {dtype}")
        ck.eq([int(v) for v in received], [2] * N, "alltoall_async without splits: received")


# ------------------------------------------------------------------ reducescatter
def rows_of_rank(rows: int) -> list[tuple[int, int]]:
    """Horovod's split, computed independently of the runtime: extra rows to low ranks."""
    counts = [rows // N + (1 if r < rows % N else 0) for r in range(N)]
    starts = [sum(counts[:r]) for r in range(N)]
    return [(s, s + c) for s, c in zip(starts, counts, strict=True)]


def check_reducescatter() -> None:
    for rows in (2 * N + 1, N, N - 1, 3 * N):
        start, stop = rows_of_rank(rows)[R]
        for dtype in DTYPES:
            for op_name, op in OPS.items():
                t = value(R, (rows, 2)).to(dtype)
                expected = reduced(op_name, dtype, (rows, 2))[start:stop]
                what = f"reducescatter {rows} rows {op_name} {dtype}"
                out = hvd.reducescatter(t, op=op, name=f"rs.{rows}.{op_name}.{dtype}")
                ck.tensor(out, expected, what, **tol(dtype))
                ck.tensor(t, value(R, (rows, 2)).to(dtype), what + " leaves its input alone")
    start, stop = rows_of_rank(5)[R]
    t = value(R, (5, 3))
    h = hvd.reducescatter_async(t, op=hvd.Sum)
    ck.tensor(hvd.synchronize(h), reduced("Sum", torch.float64, (5, 3))[start:stop], "rs async")
    out = hvd.reducescatter(t)  # default op: Average
    ck.tensor(out, reduced("Average", torch.float64, (5, 3))[start:stop], "rs default Average")
    out = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
    expected = reduced("Sum", torch.float64, (5, 3), pre=2.0, post=0.25)[start:stop]
    ck.tensor(out, expected, "reducescatter prescale/postscale")
    f = value(R, (5, 3)).float() / 3
    expected = torch.stack([value(r, (5, 3)).float() / 3 for r in range(N)]).sum(0)[start:stop]
    out = hvd.reducescatter(f, op=hvd.Sum, compression=hvd.Compression.fp16)
    ck.tensor(out, expected, "reducescatter fp16 compression", rtol=5e-3, atol=5e-3)


# ------------------------------------------------------------------ barrier, poll, join
def check_barrier() -> None:
    for round_ in range(2):
        # the later ranks arrive later: without a real barrier rank 0 would look too early
        time.sleep(0.3 * R)
        (SHARED / f"barrier.{round_}.{R}").write_text("here")
        hvd.barrier()
        present = sorted(p.name for p in SHARED.glob(f"barrier.{round_}.*"))
        ck.eq(present, [f"barrier.{round_}.{r}" for r in range(N)], "every rank reached barrier")
        hvd.barrier()  # nobody moves on to the next round before everyone has looked


def check_poll_synchronize() -> None:
    t = value(R, (64, 64))
    h = hvd.allreduce_async(t, op=hvd.Sum, name="poll.me")
    ck.true(isinstance(h, int), "async ops return integer handles")
    while not hvd.poll(h):  # bounded by the watchdog
        time.sleep(0.001)
    ck.true(hvd.poll(h), "poll stays True once done")
    ck.tensor(hvd.synchronize(h), reduced("Sum", torch.float64, (64, 64)), "poll then synchronize")


def check_join() -> None:
    """Rank 0 joins first, rank 1 last; joined ranks contribute zeros."""
    warm = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="join.cached")  # now in the cache
    ck.tensor(warm, torch.full((4,), float(N)), "before join")
    if R == 0:
        last = hvd.join()
    else:
        for i in range(3):
            x = torch.full((4,), float(R + i))
            out = hvd.allreduce(x, op=hvd.Sum, name="join.cached")
            want = float(sum(r + i for r in range(1, N)))
            ck.tensor(out, torch.full((4,), want), "cached allreduce with rank 0 joined")
            out = hvd.allreduce(x, op=hvd.Sum, name=f"join.fresh.{i}")
            ck.tensor(out, torch.full((4,), want), "new allreduce with rank 0 joined")
            outs = hvd.grouped_allreduce([x, x * 2], op=hvd.Sum, name=f"join.grp.{i}")
            ck.tensor(outs[1], torch.full((4,), 2 * want), "grouped allreduce while joined")
            out = hvd.allreduce(x, op=hvd.Max, name=f"join.max.{i}")
            ck.tensor(out, torch.full((4,), float(N - 1 + i)), "Max with a joined rank")
        if R == 1 and N > 2:
            # let every other rank join first: rank 1 is then the last to join
            time.sleep(2.0)
        last = hvd.join()
    ck.eq(last, 1, "join() returns the rank that joined last")
    out = hvd.allreduce(torch.ones(4), op=hvd.Sum, name="join.cached")
    ck.tensor(out, torch.full((4,), float(N)), "after everyone joined, allreduce is normal again")


# ------------------------------------------------------------------ helpers on top
def check_functions() -> None:
    torch.manual_seed(100 + R)  # a different model on every rank
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    model[0].register_buffer("counter", torch.tensor([R]))
    torch.manual_seed(100 + N - 1)
    reference = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    hvd.broadcast_parameters(model.state_dict(), root_rank=N - 1)
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        ck.tensor(p.detach(), q.detach(), f"broadcast_parameters(state_dict) {name}")
    ck.tensor(model[0].counter, torch.tensor([N - 1]), "broadcast_parameters covers buffers")
    with torch.no_grad():
        for p in model.parameters():
            p.add_(R)
    hvd.broadcast_parameters(list(model.named_parameters()), root_rank=0)
    for (name, p), (_, q) in zip(
        model.named_parameters(), reference.named_parameters(), strict=True
    ):
        ck.tensor(p.detach(), q.detach(), f"broadcast_parameters(named_parameters) {name}")
    ck.raises(ValueError, lambda: hvd.broadcast_parameters(3, 0), "params")

    opt = torch.optim.Adam(model.parameters(), lr=0.01 * (R + 1))
    model(torch.full((2, 4), float(R))).sum().backward()
    opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    state = copy.deepcopy(opt.state_dict())
    states = hvd.allgather_object(state, name="opt.states")
    for r, other in enumerate(states):
        ck.eq(other["param_groups"], states[0]["param_groups"], f"param_groups of rank {r}")
        for key, s in other["state"].items():
            for k, v in s.items():
                ck.true(torch.equal(v, states[0]["state"][key][k]), f"state {key}.{k} rank {r}")
    ck.eq(opt.param_groups[0]["lr"], 0.01, "broadcast_optimizer_state sets hyper-parameters")

    obj = {"rank": R, "list": list(range(R + 2)), "tensor": torch.arange(3) * R}
    for root in range(N):
        got = hvd.broadcast_object(obj, root_rank=root)
        ck.eq(got["rank"], root, "broadcast_object")
        ck.eq(got["list"], list(range(root + 2)), "broadcast_object list")
        ck.true(torch.equal(got["tensor"], torch.arange(3) * root), "broadcast_object tensor")
    got = hvd.broadcast_object("s" * 1000 if R == 0 else None, name="string.object")
    ck.eq(got, "s" * 1000, "broadcast_object of a string")
    everyone = hvd.allgather_object({"r": R, "payload": "x" * (R * 100)})
    ck.eq(everyone, [{"r": r, "payload": "x" * (r * 100)} for r in range(N)], "allgather_object")
    ck.eq(hvd.allgather_object(R * 7, name="ints"), [r * 7 for r in range(N)], "allgather ints")


# ------------------------------------------------------------------ names, cache, fusion
def check_names_and_cache() -> None:
    cache = rt.get().cycle.cache
    hvd.allreduce(torch.ones(3), name="my.named.tensor")
    if ROOMY_CACHE:
        ck.true(cache.bit("my.named.tensor") >= 0, "a given name is kept (and cached)")
    before = hvd.runtime_stats()
    for i in range(10):
        out = hvd.allreduce(torch.full((5,), float(i)), op=hvd.Sum)
        ck.tensor(out, torch.full((5,), float(i * N)), "unnamed allreduce in a loop")
    after = hvd.runtime_stats()
    if ROOMY_CACHE:
        ck.true(cache.bit("allreduce.noname.0") >= 0, "unnamed ops get a stable generated name")
        ck.true(
            after["cache_entries"] - before["cache_entries"] <= 1,
            f"an unnamed loop reuses one name: {before} -> {after}",
        )
        ck.true(
            after["cache_hits"] - before["cache_hits"] >= 9,
            f"an unnamed loop hits the cache: {before} -> {after}",
        )
    elif CACHE_ON:
        ck.eq(after["cache_entries"], CACHE_CAPACITY, "the small cache is full")
    else:
        ck.eq(after["cache_hits"], 0, "no cache hits with HVDPROF_CACHE_CAPACITY=0")
        ck.eq(after["cache_entries"], 0, "no cache entries with HVDPROF_CACHE_CAPACITY=0")
    # Before any rank reuses the name with another shape (h1 below): a peer that ran ahead
    # would send it to the coordinator, which evicts the entry while this rank still checks.
    hvd.barrier()
    # two unnamed ops in flight get two names, and the loop above did not leak slots
    h1 = hvd.allreduce_async(torch.ones(2), op=hvd.Sum)
    h2 = hvd.allreduce_async(torch.ones(2) * 2, op=hvd.Sum)
    ck.tensor(hvd.synchronize(h2), torch.full((2,), 2.0 * N), "second unnamed in flight")
    ck.tensor(hvd.synchronize(h1), torch.full((2,), 1.0 * N), "first unnamed in flight")


def check_many_in_flight() -> None:
    before = hvd.runtime_stats()
    count = 300
    for _round in range(3):
        handles = []
        for i in range(count):
            dtype = (torch.float32, torch.float64, torch.int32)[i % 3]
            t = torch.full((16,), i + R).to(dtype)
            if i % 2:
                handles.append((hvd.allreduce_async_(t, op=hvd.Sum, name=f"many.{i}"), i, dtype))
            else:
                handles.append((hvd.allreduce_async(t, op=hvd.Sum, name=f"many.{i}"), i, dtype))
        # larger than a small fusion threshold (reduced alone) and than the default
        # HVDPROF_SMALL_ALLREDUCE_BYTES (480 KB: it goes to shared memory, or Gloo)
        big = value(R, (300, 200))
        hb = hvd.allreduce_async(big, op=hvd.Sum, name="many.big")
        for h, i, dtype in handles:
            want = torch.full((16,), N * i + sum(range(N))).to(dtype)
            ck.tensor(hvd.synchronize(h), want, f"many in flight #{i}")
        ck.tensor(hvd.synchronize(hb), reduced("Sum", torch.float64, (300, 200)), "big one")
    after = hvd.runtime_stats()
    groups = after["fused_groups"] - before["fused_groups"]
    tensors = after["fused_tensors"] - before["fused_tensors"]
    hits = after["cache_hits"] - before["cache_hits"]
    if FUSION_ON:
        ck.true(groups > 0, f"fusion happened: {before} -> {after}")
        ck.true(tensors > groups, f"fused groups hold several tensors: {before} -> {after}")
    else:
        ck.eq(after["fused_groups"], 0, "no fusion with HVDPROF_FUSION_THRESHOLD=0")
    if ROOMY_CACHE:
        ck.true(hits >= 2 * count, f"repeated names hit the cache: {before} -> {after}")
    ck.true(after["cache_entries"] <= CACHE_CAPACITY, f"cache within capacity: {after}")
    ck.true(after["ops_completed"] > before["ops_completed"], "ops_completed counts")
    ck.true(after["bytes_reduced"] > before["bytes_reduced"], "bytes_reduced counts")
    ck.true(after["backend_calls"] > before["backend_calls"], "backend_calls counts")
    small = after["small_allreduces"] - before["small_allreduces"]
    calls = after["backend_calls"] - before["backend_calls"]
    if SMALL_BYTES:
        ck.true(0 < small < calls, f"small buffers over sockets, the big one not: {small}/{calls}")
    else:
        ck.eq(small, 0, "nothing over sockets with HVDPROF_SMALL_ALLREDUCE_BYTES=0")
    shm_calls = after["shm_allreduces"] - before["shm_allreduces"]
    if SHM_ON:
        ck.true(0 < shm_calls < calls, f"the big one through shared memory: {shm_calls}/{calls}")
    else:
        ck.eq(shm_calls, 0, "nothing through shared memory with HVDPROF_BACKEND=gloo")
    ck.true(after["cycles"] > before["cycles"], "cycles count")


def check_autograd_like_horovod() -> None:
    """horovod.torch: allgather's and broadcast's backward average the gradient over ranks
    (``allreduce(grad, average=True)``), and alltoall is differentiable."""
    x = torch.arange(float(R + 1), dtype=torch.float64).reshape(R + 1, 1).requires_grad_()
    y = hvd.allgather(x, name="grad.allgather")
    weights = torch.arange(y.shape[0], dtype=torch.float64).reshape(-1, 1)
    (y * weights).sum().backward()
    offset = sum(r + 1 for r in range(R))
    expected = (torch.arange(R + 1, dtype=torch.float64) + offset).reshape(-1, 1)
    ck.tensor(x.grad, expected, "allgather backward: average of grad over ranks, my rows")

    x = torch.full((3,), float(R), dtype=torch.float64, requires_grad=True)
    y = hvd.broadcast(x, root_rank=0, name="grad.broadcast")
    (y * (R + 1)).sum().backward()
    root_grad = sum(r + 1 for r in range(N)) / N
    expected = torch.full((3,), root_grad if R == 0 else 0.0, dtype=torch.float64)
    ck.tensor(x.grad, expected, "broadcast backward: average of grad on root, zero elsewhere")

    x = torch.ones((N, 2), dtype=torch.float64, requires_grad=True)
    y = hvd.alltoall(x, name="grad.alltoall")
    ck.true(y.requires_grad, "alltoall output requires grad when its input does")
    if y.requires_grad:
        (y * (R + 1)).sum().backward()
        # row j of x went to rank j, whose upstream gradient is j + 1
        expected = (torch.arange(N, dtype=torch.float64) + 1).reshape(N, 1).expand(N, 2)
        ck.tensor(x.grad, expected.contiguous(), "alltoall backward sends grads back")


SECTIONS = {
    "topology": check_topology,
    "allreduce_blocking": check_allreduce_blocking,
    "allreduce_async_many": check_allreduce_async_many,
    "allreduce_options": check_allreduce_options,
    "allreduce_autograd": check_allreduce_autograd,
    "grouped_allreduce": check_grouped,
    "allgather": check_allgather,
    "broadcast": check_broadcast,
    "alltoall": check_alltoall,
    "reducescatter": check_reducescatter,
    "barrier": check_barrier,
    "poll_synchronize": check_poll_synchronize,
    "names_and_cache": check_names_and_cache,
    "many_in_flight_fusion": check_many_in_flight,
    "functions": check_functions,
    "autograd_like_horovod": check_autograd_like_horovod,
    "join": check_join,
}


def main() -> None:
    for name, check in SECTIONS.items():
        with ck.section(name):
            check()
    with ck.section("shutdown"):
        hvd.shutdown()
        ck.true(not hvd.is_initialized(), "shutdown: not initialized any more")
    ck.done()


if __name__ == "__main__":
    main()
