"""Horovod's semantics where a script can notice them, checked on every rank.

Usage: semantics_worker.py MODE, MODE one of:

- ``all``: every section below (run at 2 ranks, through each backend);
- ``not_power_of_two``: only what Adasum does when the ranks are not a power of two.

Sections: dtypes (int16 through every op; bool and others refused), integer averages
truncating toward zero, autograd of every differentiable op (closed forms as in
Horovod's tests, and finite differences of the global loss for the reductions),
Adasum (Horovod's reference tree reduction) and the delta optimizer, and the API's
return types and ``process_set=``.
"""

from __future__ import annotations

import copy
import math
import sys

import _common

_common.start_watchdog()

import numpy as np  # noqa: E402
import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.runtime.dtypes import ITEMSIZE, torch_attr  # noqa: E402

MODE = sys.argv[1] if len(sys.argv) > 1 else "all"
DTYPES = [getattr(torch, torch_attr(name)) for name in ITEMSIZE]
OPS = {"Average": hvd.Average, "Sum": hvd.Sum, "Min": hvd.Min, "Max": hvd.Max}

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)


def tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype in (torch.float16, torch.bfloat16):
        return {"rtol": 1e-2, "atol": 1e-2}
    if dtype == torch.float32:
        return {"rtol": 1e-5, "atol": 1e-5}
    return {"rtol": 1e-10, "atol": 1e-10} if dtype == torch.float64 else {}


def mine(r: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Rank ``r``'s small signed integers, exact in every dtype (unsigned: kept >= 0)."""
    numel = math.prod(shape)
    base = torch.arange(numel, dtype=torch.float64) % 5 - 2 + r
    if dtype == torch.uint8:
        base = base + 2
    return base.reshape(shape).to(dtype)


# ------------------------------------------------------------------ dtypes
def check_int16_everywhere() -> None:
    """int16 (which Horovod takes and Gloo itself refuses) through every op, small and
    large (the socket path, shared memory or Gloo)."""
    d = torch.int16
    for numel in (6, 100_000):  # 12 bytes and 200 KB... and one above the socket limit
        for shape in ((numel,), (numel // 2, 2)):
            for op_name, op in OPS.items():
                vals = torch.stack([mine(r, shape, d).double() for r in range(N)])
                want = _common.expected_allreduce(vals, op_name, d).to(d)
                out = hvd.allreduce(mine(R, shape, d), op=op, name=f"i16.{op_name}.{shape}")
                ck.tensor(out, want, f"int16 allreduce {op_name} {shape}")
    big = torch.full((200_000,), R + 1, dtype=d)  # 400 KB: above the socket limit
    ck.tensor(hvd.allreduce(big, op=hvd.Sum), torch.full_like(big, N * (N + 1) // 2), "big")
    rows = R + 1
    t = torch.full((rows, 3), R, dtype=d)
    want = torch.cat([torch.full((r + 1, 3), r, dtype=d) for r in range(N)])
    ck.tensor(hvd.allgather(t, name="i16.ag"), want, "int16 allgather, uneven first dims")
    for root in range(N):
        b = torch.full((2, 2), R * 7 - 3, dtype=d)
        ck.tensor(hvd.broadcast(b, root), torch.full((2, 2), root * 7 - 3, dtype=d), "bcast")
    send = torch.cat([torch.full((1, 2), R * 10 + dst, dtype=d) for dst in range(N)])
    want = torch.cat([torch.full((1, 2), src * 10 + R, dtype=d) for src in range(N)])
    ck.tensor(hvd.alltoall(send), want, "int16 alltoall")
    splits = [dst + 1 for dst in range(N)]
    send = torch.cat([torch.full((dst + 1,), R * 10 + dst, dtype=d) for dst in range(N)])
    out, received = hvd.alltoall(send, splits=splits)
    want = torch.cat([torch.full((R + 1,), src * 10 + R, dtype=d) for src in range(N)])
    ck.tensor(out, want, "int16 alltoall with splits")
    ck.eq(received.tolist(), [R + 1] * N, "int16 alltoall received splits")
    rs = hvd.reducescatter(torch.full((2 * N, 2), R + 1, dtype=d), op=hvd.Sum)
    ck.tensor(rs, torch.full((2, 2), N * (N + 1) // 2, dtype=d), "int16 reducescatter")
    outs = hvd.grouped_allreduce([torch.ones(3, dtype=d), torch.ones(2, 2, dtype=d)], op=hvd.Sum)
    ck.tensor(outs[1], torch.full((2, 2), N, dtype=d), "int16 grouped allreduce")
    # int16 sums wrap as in Horovod (C++ int16 arithmetic): 30000 * 2 -> -5536
    wrap = hvd.allreduce(torch.full((4,), 30000, dtype=d), op=hvd.Sum)
    ck.tensor(wrap, torch.full((4,), 30000 * N, dtype=torch.int64).to(d), "int16 sum wraps")


def check_dtype_table() -> None:
    """Every dtype of the runtime's table through allreduce, allgather, broadcast and
    alltoall; bool, complex and the wide unsigned types refused with a clear error."""
    for d in DTYPES:
        vals = torch.stack([mine(r, (4,), d).double() for r in range(N)])
        out = hvd.allreduce(mine(R, (4,), d), op=hvd.Sum, name=f"tbl.{d}")
        ck.tensor(out, _common.expected_allreduce(vals, "Sum", d).to(d), f"sum {d}", **tol(d))
        ag = hvd.allgather(mine(R, (2,), d))
        ck.tensor(ag, torch.cat([mine(r, (2,), d) for r in range(N)]), f"allgather {d}")
        ck.tensor(hvd.broadcast(mine(R, (3,), d), 0), mine(0, (3,), d), f"broadcast {d}")
        a2a = hvd.alltoall(torch.cat([mine(R, (1,), d)] * N))
        ck.tensor(a2a, torch.cat([mine(r, (1,), d) for r in range(N)]), f"alltoall {d}")
    for bad in (torch.bool, torch.complex64, torch.uint16, torch.uint32):
        t = torch.zeros(3, dtype=bad)
        for what, fn in (
            ("allreduce", lambda t=t: hvd.allreduce(t)),
            ("allgather", lambda t=t: hvd.allgather(t)),
            ("broadcast", lambda t=t: hvd.broadcast(t, 0)),
            ("alltoall", lambda t=t: hvd.alltoall(torch.zeros(N, dtype=t.dtype))),
        ):
            ck.raises(ValueError, fn, "does not support dtype", str(bad), f"rank {R}", what=what)
    # the runtime is still fine afterwards
    ck.tensor(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(N)), "after")


# ------------------------------------------------------------------ integer averages
def check_integer_average() -> None:
    """Horovod's Average on integers truncates toward zero: -75 / 2 = -37, not -38."""
    signed = [torch.int8, torch.int16, torch.int32, torch.int64]
    rank_vals = {0: [-75, 75, -1, 1, -3, 3, 0, -7], 1: [0, 0, 0, 0, 0, 0, 0, -2]}
    for d in signed:
        for numel_repeat in (1, 20_000):  # 8 elements, and 160,000 (shared memory or Gloo)
            mine_vals = rank_vals.get(R, [0] * 8) * numel_repeat
            t = torch.tensor(mine_vals, dtype=d)
            sums = [sum(rank_vals.get(r, [0] * 8)[i] for r in range(N)) for i in range(8)]
            want = torch.tensor([int(s / N) for s in sums] * numel_repeat, dtype=d)
            out = hvd.allreduce(t, name=f"iavg.{d}.{numel_repeat}")  # default op: Average
            ck.tensor(out, want, f"integer Average truncates {d} x{numel_repeat}")
            if N == 2:
                ck.eq(int(out[0]), -37, f"-75 / 2 is -37 ({d})")
    # with a postscale factor, as Horovod's ScaleBuffer: in double, truncated
    t = torch.tensor([-75, 75], dtype=torch.int32) if R == 0 else torch.zeros(2, dtype=torch.int32)
    out = hvd.allreduce(t, op=hvd.Average, postscale_factor=3.0, name="iavg.post")
    want = torch.tensor([math.trunc(-75 * 3.0 / N), math.trunc(75 * 3.0 / N)], dtype=torch.int32)
    ck.tensor(out, want, "integer Average with postscale truncates")
    out = hvd.allreduce(t, op=hvd.Sum, prescale_factor=0.5, name="iavg.pre")
    want = torch.tensor([math.trunc(-75 * 0.5), math.trunc(75 * 0.5)], dtype=torch.int32)
    ck.tensor(out, want, "integer prescale truncates each contribution")
    rs = hvd.reducescatter(torch.full((N,), -75 if R == 0 else 0, dtype=torch.int64))
    ck.tensor(rs, torch.tensor([int(-75 / N)], dtype=torch.int64), "reducescatter Average")
    grp = hvd.grouped_allreduce([torch.full((3,), -75 if R == 0 else 0, dtype=torch.int32)])
    ck.tensor(grp[0], torch.full((3,), int(-75 / N), dtype=torch.int32), "grouped Average")


# ------------------------------------------------------------------ autograd
def global_sum(local: torch.Tensor) -> float:
    return float(hvd.allreduce(local.detach().reshape(1).double(), op=hvd.Sum))


def finite_difference(fn, inputs: list[torch.Tensor], eps: float = 1e-6) -> list[torch.Tensor]:
    """d(sum over ranks of fn(inputs))/d(this rank's inputs), by central differences.

    Every rank perturbs in turn (the others evaluate unchanged), so each rank learns how
    the global loss depends on its own inputs.
    """
    grads = [torch.zeros_like(x) for x in inputs]
    for owner in range(N):
        for k, x in enumerate(inputs):
            for j in range(x.numel()):
                values = []
                for sign in (1.0, -1.0):
                    xs = [y.detach().clone() for y in inputs]
                    if owner == R:
                        xs[k].view(-1)[j] += sign * eps
                    values.append(global_sum(fn(xs)))
                if owner == R:
                    grads[k].view(-1)[j] = (values[0] - values[1]) / (2 * eps)
    return grads


def check_autograd_grouped() -> None:
    """The gradient of a grouped allreduce is a grouped allreduce of the gradients, with
    the same op and scale factors; checked in closed form and by finite differences."""
    shapes = [(3,), (2, 2)]
    weights = [torch.arange(math.prod(s), dtype=torch.float64).reshape(s) + R for s in shapes]
    for op_name, op, pre, post in (
        ("Sum", hvd.Sum, 1.0, 1.0),
        ("Average", hvd.Average, 1.0, 1.0),
        ("Sum", hvd.Sum, 0.5, 3.0),
        ("Average", hvd.Average, 2.0, 0.25),
    ):

        def loss(xs, op=op, pre=pre, post=post):
            ys = hvd.grouped_allreduce(xs, op=op, prescale_factor=pre, postscale_factor=post)
            return sum((y * w).sum() for y, w in zip(ys, weights, strict=True))

        xs = [torch.full(s, float(R + 1), dtype=torch.float64, requires_grad=True) for s in shapes]
        ys = hvd.grouped_allreduce(
            xs, op=op, prescale_factor=pre, postscale_factor=post, name=f"ag.{op_name}.{pre}"
        )
        what = f"grouped_allreduce {op_name} pre={pre} post={post}"
        ck.true(isinstance(ys, list) and all(y.requires_grad for y in ys), what + " outputs")
        sum(
            (y * w).sum() for y, w in zip(ys, weights, strict=True)
        ).backward()  # Horovod: each rank's loss; the gradient sums over ranks
        factor = pre * post / (N if op_name == "Average" else 1)
        for x, s in zip(xs, shapes, strict=True):
            numel = math.prod(s)
            w_sum = sum(torch.arange(numel, dtype=torch.float64).reshape(s) + r for r in range(N))
            ck.tensor(x.grad, w_sum * factor, what + " closed form", rtol=1e-12, atol=1e-12)
        numeric = finite_difference(loss, [x.detach() for x in xs])
        for x, g in zip(xs, numeric, strict=True):
            ck.tensor(x.grad, g, what + " finite differences", rtol=1e-5, atol=1e-5)
    # mixed requires_grad and compression: gradients reach only the tensors that need them
    a = torch.ones(2, dtype=torch.float32, requires_grad=True)
    b = torch.ones(2, dtype=torch.float32)
    ys = hvd.grouped_allreduce([a, b], op=hvd.Sum, compression=hvd.Compression.fp16)
    (ys[0] * (R + 1)).sum().backward()
    ck.tensor(a.grad, torch.full((2,), float(N * (N + 1) // 2)), "grouped fp16 backward")
    ck.true(b.grad is None, "a member without requires_grad gets no gradient")


def check_autograd_allreduce() -> None:
    for op, pre, post in ((hvd.Sum, 2.0, 0.5), (hvd.Average, 1.0, 3.0)):
        x = torch.full((3,), float(R + 1), dtype=torch.float64, requires_grad=True)
        w = torch.arange(3, dtype=torch.float64) - R

        def loss(xs, op=op, pre=pre, post=post, w=w):
            return (
                hvd.allreduce(xs[0], op=op, prescale_factor=pre, postscale_factor=post) * w
            ).sum()

        loss([x]).backward()
        numeric = finite_difference(loss, [x.detach()])
        ck.tensor(x.grad, numeric[0], f"allreduce op={op} finite differences", rtol=1e-5, atol=1e-5)


def check_autograd_others() -> None:
    """allgather, broadcast, alltoall, reducescatter and the grouped forms: the
    gradients Horovod defines (its tests' expectations)."""
    # allgather: the average of the gradients, this rank's rows
    x = torch.full((R + 1, 2), float(R), dtype=torch.float64, requires_grad=True)
    g = hvd.allgather(x)
    grad_ys = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(N)]).double()
    g.backward(grad_ys)
    ck.tensor(x.grad, torch.full((R + 1, 2), float(R), dtype=torch.float64), "allgather grad")
    # grouped allgather: the same per member
    xs = [
        torch.full((R + 1,), 1.0, dtype=torch.float64, requires_grad=True),
        torch.full((2, 3), 1.0, dtype=torch.float64, requires_grad=True),
    ]
    gs = hvd.grouped_allgather(xs)
    ck.eq([tuple(t.shape) for t in gs], [(N * (N + 1) // 2,), (2 * N, 3)], "grouped_allgather")
    (gs[0] * (R + 1)).sum().backward(retain_graph=True)
    mean_w = sum(r + 1 for r in range(N)) / N
    ck.tensor(xs[0].grad, torch.full((R + 1,), mean_w, dtype=torch.float64), "grouped ag grad")
    ck.tensor(xs[1].grad, torch.zeros(2, 3, dtype=torch.float64), "unused member: zero grad")
    # broadcast: the average on the root, zero elsewhere
    for root in range(N):
        x = torch.full((3,), float(R), dtype=torch.float64, requires_grad=True)
        (hvd.broadcast(x, root) * (R + 1)).sum().backward()
        want = mean_w if root == R else 0.0
        ck.tensor(x.grad, torch.full((3,), want, dtype=torch.float64), f"broadcast grad {root}")
    # alltoall: the inverse alltoall of the gradients
    splits = [1 + (R + dst) % 2 for dst in range(N)]
    x = torch.arange(sum(splits), dtype=torch.float64).requires_grad_()
    out, _ = hvd.alltoall(x, splits=splits)
    (out * (R + 1)).sum().backward()
    ck.tensor(
        x.grad,
        torch.cat([torch.full((s,), float(d + 1)) for d, s in enumerate(splits)]).double(),
        "alltoall grad",
    )
    # reducescatter: Sum scales by the ranks, both factors apply, then an allgather
    for op, pre, post in ((hvd.Sum, 1.0, 1.0), (hvd.Average, 1.0, 1.0), (hvd.Sum, 2.0, 0.5)):
        x = torch.ones(2 * N, 2, dtype=torch.float64, requires_grad=True)
        y = hvd.reducescatter(x, op=op, prescale_factor=pre, postscale_factor=post)
        ck.eq(tuple(y.shape), (2, 2), "reducescatter shape")
        (y * (R + 1)).sum().backward()
        factor = (N if op == hvd.Sum else 1) * pre * post
        want = torch.cat([torch.full((2, 2), float(r + 1)) for r in range(N)]).double() * factor
        ck.tensor(x.grad, want, f"reducescatter grad op={op} pre={pre} post={post}")
    xs = [
        torch.ones(N, dtype=torch.float64, requires_grad=True),
        torch.ones(2 * N, 3, dtype=torch.float64, requires_grad=True),
    ]
    ys = hvd.grouped_reducescatter(xs, op=hvd.Sum)
    ck.tensor(ys[1], torch.full((2, 3), float(N), dtype=torch.float64), "grouped_reducescatter")
    (ys[0] * (R + 1)).sum().backward(retain_graph=True)
    want = torch.tensor([float(r + 1) for r in range(N)], dtype=torch.float64) * N
    ck.tensor(xs[0].grad, want, "grouped_reducescatter grad")


# ------------------------------------------------------------------ Adasum
def adasum_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Horovod's test reference (test/parallel/test_adasum_*.py), written out again."""
    anormsq = float(np.inner(a.ravel(), a.ravel()))
    bnormsq = float(np.inner(b.ravel(), b.ravel()))
    dot = float(np.dot(a.ravel(), b.ravel()))
    acoeff = 1.0 - dot / anormsq * 0.5 if anormsq != 0 else 1.0
    bcoeff = 1.0 - dot / bnormsq * 0.5 if bnormsq != 0 else 1.0
    return acoeff * a + bcoeff * b


def tree_reference(per_rank: list[list[np.ndarray]]) -> list[np.ndarray]:
    level = [list(ts) for ts in per_rank]
    while len(level) > 1:
        level = [
            [adasum_reference(a, b) for a, b in zip(level[i], level[i + 1], strict=True)]
            for i in range(0, len(level), 2)
        ]
    return level[0]


def check_adasum() -> None:
    """Horovod's numerical check: every rank draws the same random tensors (seed 1234),
    takes its own, allreduces with op=Adasum; the result is the reference tree reduction
    (fp16 within 1e-2)."""
    rng = np.random.RandomState(1234)
    per_rank = [[rng.random_sample((2, 2)), rng.random_sample((2, 2))] for _ in range(N)]
    answer = tree_reference(per_rank)
    for d in (torch.float16, torch.float32, torch.float64, torch.bfloat16):
        atol = 1e-2 if d in (torch.float16, torch.bfloat16) else 1e-6
        outs = [hvd.allreduce(torch.tensor(t).to(d), op=hvd.Adasum) for t in per_rank[R]]
        for i, (o, a) in enumerate(zip(outs, answer, strict=True)):
            ck.true(o.dtype == d, f"adasum keeps {d}")
            ck.true(np.allclose(o.double().numpy(), a, atol=atol), f"adasum {d} #{i}: {o} vs {a}")
        grp = hvd.grouped_allreduce([torch.tensor(t).to(d) for t in per_rank[R]], op=hvd.Adasum)
        for o, a in zip(grp, answer, strict=True):
            ck.true(np.allclose(o.double().numpy(), a, atol=atol), f"grouped adasum {d}")
        t = torch.tensor(per_rank[R][0]).to(d)
        hvd.synchronize(hvd.allreduce_async_(t, op=hvd.Adasum, name=f"adasum.inplace.{d}"))
        ck.true(np.allclose(t.double().numpy(), answer[0], atol=atol), f"in-place adasum {d}")
    # larger tensors through every path: the same formula per tensor
    big = [torch.tensor(np.random.RandomState(7 + r).standard_normal(100_000)) for r in range(N)]
    want = tree_reference([[b.numpy()] for b in big])[0]
    out = hvd.allreduce(big[R].float(), op=hvd.Adasum, name="adasum.big")
    ck.true(np.allclose(out.double().numpy(), want, atol=1e-4), "adasum of 100,000 floats")
    # orthogonal gradients add, identical ones average (what Adasum is for)
    e = torch.zeros(N, dtype=torch.float64)
    e[R] = 1.0
    ck.tensor(hvd.allreduce(e, op=hvd.Adasum), torch.ones(N, dtype=torch.float64), "orthogonal")
    same = torch.full((4,), 3.0, dtype=torch.float64)
    ck.tensor(hvd.allreduce(same, op=hvd.Adasum), same, "identical gradients average")
    ck.raises(
        ValueError,
        lambda: hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Adasum),
        "Adasum",
        "floating-point",
        what="adasum on integers",
    )


def check_adasum_optimizer() -> None:
    """DistributedOptimizer(op=Adasum): each rank steps locally, the parameter deltas are
    combined with Adasum, every rank ends with start + Adasum(deltas)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 1)).double()
    reference = copy.deepcopy(model)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5),
        named_parameters=model.named_parameters(),
        op=hvd.Adasum,
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.5)
    ck.true(isinstance(opt, torch.optim.SGD), "still an SGD")
    for step in range(3):
        gen = torch.Generator().manual_seed(100 * step + R)
        data, target = (
            torch.randn(8, 4, generator=gen).double(),
            torch.randn(8, 1, generator=gen).double(),
        )
        starts = {n: p.detach().clone() for n, p in reference.named_parameters()}
        ref_opt.zero_grad()
        torch.nn.functional.mse_loss(reference(data), target).backward()
        ref_opt.step()  # this rank's local step, on an exact copy
        deltas = {n: p.detach() - starts[n] for n, p in reference.named_parameters()}
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(data), target).backward()
        opt.step()
        for n, p in model.named_parameters():
            everyone = hvd.allgather(deltas[n].reshape(1, -1)).numpy()
            want = tree_reference([[everyone[r]] for r in range(N)])[0]
            got = (p.detach() - starts[n]).reshape(-1).numpy()
            ck.true(np.allclose(got, want, atol=1e-10), f"step {step} {n}: start + Adasum(deltas)")
            same = hvd.allgather(p.detach().reshape(1, -1))
            ck.true(bool((same == same[0]).all()), f"step {step} {n}: equal on every rank")
        with torch.no_grad():  # the copy follows the combined parameters
            for (_, p), (_, q) in zip(
                model.named_parameters(), reference.named_parameters(), strict=True
            ):
                q.copy_(p)
    ck.raises(AssertionError, lambda: opt.skip_synchronize().__enter__(), "Adasum")


# ------------------------------------------------------------------ API
def check_api() -> None:
    """Return types and ``process_set=`` as in Horovod's mpi_ops.py."""
    ts = [torch.ones(2), torch.ones(3)]
    out = hvd.synchronize(hvd.grouped_allreduce_async(ts, op=hvd.Sum))
    ck.true(type(out) is tuple and len(out) == 2, "synchronize of a grouped op: a tuple")
    ck.true(type(hvd.grouped_allreduce_(ts, op=hvd.Sum)) is tuple, "grouped_allreduce_: tuple")
    ck.true(type(hvd.grouped_allreduce(ts)) is list, "grouped_allreduce: a list")
    pair = hvd.synchronize(hvd.alltoall_async(torch.arange(N)))
    ck.true(type(pair) is tuple and len(pair) == 2, "synchronize(alltoall_async): a pair")
    ck.eq(pair[1].dtype, torch.int32, "received splits are int32")
    _, rec = hvd.alltoall(torch.arange(N), splits=torch.ones(N, dtype=torch.int64))
    ck.eq(rec.dtype, torch.int64, "received splits take the dtype of a splits tensor")
    ck.true(isinstance(hvd.join(), int), "join returns an int")
    ck.true(hvd.synchronize(123456789) is None, "an unknown handle synchronizes to None")
    for ps in (hvd.global_process_set, hvd.process_set_by_id(0)):
        ck.tensor(
            hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=ps),
            torch.full((2,), float(N)),
            f"allreduce {ps}",
        )
        ck.tensor(hvd.allgather(torch.ones(1), process_set=ps), torch.ones(N), "allgather ps")
        ck.tensor(hvd.broadcast(torch.ones(1) * R, 0, process_set=ps), torch.zeros(1), "bcast ps")
        ck.tensor(hvd.alltoall(torch.ones(N), process_set=ps), torch.ones(N), "alltoall ps")
        ck.tensor(hvd.reducescatter(torch.ones(N), process_set=ps), torch.ones(1), "rs ps")
        ck.true(type(hvd.grouped_allreduce([torch.ones(1)], process_set=ps)) is list, "grp ps")
        hvd.barrier(process_set=ps)
    ck.eq((hvd.global_process_set.size(), hvd.global_process_set.rank()), (N, R), "global set")
    if N > 1:
        part = hvd.ProcessSet([0])
        for what, fn in (
            ("allreduce", lambda: hvd.allreduce(torch.ones(1), process_set=part)),
            ("allgather", lambda: hvd.allgather(torch.ones(1), process_set=part)),
            ("broadcast_", lambda: hvd.broadcast_(torch.ones(1), 0, process_set=part)),
            ("grouped_allreduce", lambda: hvd.grouped_allreduce([torch.ones(1)], process_set=part)),
            ("barrier", lambda: hvd.barrier(process_set=part)),
        ):  # a set never registered (init(process_sets=...) or add_process_set)
            ck.raises(ValueError, fn, "not registered", f"rank {R}", what=what)
        # as Horovod: adding a set after init() needs dynamic process sets
        ck.raises(ValueError, lambda: hvd.add_process_set([0]), "DYNAMIC_PROCESS_SETS", what="add")
    ck.eq(hvd.remove_process_set(hvd.global_process_set), False, "the global set stays")


def check_not_power_of_two() -> None:
    for what, fn in (
        ("allreduce", lambda: hvd.allreduce(torch.ones(3), op=hvd.Adasum)),
        ("allreduce_async_", lambda: hvd.allreduce_async_(torch.ones(3), op=hvd.Adasum)),
        ("grouped_allreduce", lambda: hvd.grouped_allreduce([torch.ones(3)], op=hvd.Adasum)),
    ):
        ck.raises(NotImplementedError, fn, "power-of-two", f"{N}", f"rank {R}", what=what)
    model = torch.nn.Linear(2, 1)
    ck.raises(
        NotImplementedError,
        lambda: hvd.DistributedOptimizer(
            torch.optim.SGD(model.parameters(), lr=0.1), op=hvd.Adasum
        ),
        "power-of-two",
        what="DistributedOptimizer(op=Adasum)",
    )
    # the runtime still works
    ck.tensor(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(N)), "after")


if MODE == "not_power_of_two":
    with ck.section("adasum_not_power_of_two"):
        check_not_power_of_two()
else:
    for name, fn in (
        ("int16_everywhere", check_int16_everywhere),
        ("dtype_table", check_dtype_table),
        ("integer_average", check_integer_average),
        ("autograd_grouped_allreduce", check_autograd_grouped),
        ("autograd_allreduce", check_autograd_allreduce),
        ("autograd_others", check_autograd_others),
        ("adasum", check_adasum),
        ("adasum_optimizer", check_adasum_optimizer),
        ("api", check_api),
    ):
        with ck.section(name):
            fn()
hvd.shutdown()
ck.done()
