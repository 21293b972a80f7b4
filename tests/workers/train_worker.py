"""Training with ``hvd.DistributedOptimizer`` matches one process on the whole batch.

Every rank starts from a different random model; ``broadcast_parameters`` and
``broadcast_optimizer_state`` make them equal to rank 0's. Each step rank r trains on
its slice of a global batch; a plain-torch reference (computed on every rank, from the
same initial weights) trains on the whole batch. After a few steps every rank's weights
must equal the reference's (within a tolerance) and each other's (exactly).
Then the optimizer's safety checks. Prints ``SECTION ...`` lines and ``DONE``.
"""

from __future__ import annotations

import copy
import hashlib
import os
import warnings

import _common

_common.start_watchdog()

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
import hvdprof.torch.optimizer as _optimizer_module  # noqa: E402

torch.set_num_threads(1)
hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
BATCH = 8  # per rank


def mlp() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(),
        torch.nn.Linear(16, 4),
    )  # fmt: skip


def convnet() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(2, 4, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(4, 4, 3),
        torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(4 * 4 * 4, 4),
    )  # fmt: skip


def batches(model_kind: str, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batches, identical on every rank (fixed seed)."""
    g = torch.Generator().manual_seed(12345)
    shape = (8,) if model_kind == "mlp" else (2, 6, 6)
    x = torch.randn((steps, N * BATCH, *shape), generator=g)
    y = torch.randn((steps, N * BATCH, 4), generator=g)
    return x, y


def flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def train_case(
    case: str,
    model_kind: str,
    make_opt,
    steps: int = 6,
    bpps: int = 1,
    compression=hvd.Compression.none,
    tol: float = 1e-5,
    groups_of=None,
    set_to_none: bool = True,
    channels_last: bool = False,
    **dist_kwargs,
) -> None:
    torch.manual_seed(1000 + R)  # a different model on every rank
    model = mlp() if model_kind == "mlp" else convnet()
    if channels_last:  # conv weights (and their gradients) no longer contiguous
        model = model.to(memory_format=torch.channels_last)
    if groups_of is not None:
        dist_kwargs["groups"] = groups_of(model)
    opt = make_opt(model.parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(opt, root_rank=0)
    initial = flat(model)
    first = hvd.broadcast(initial, root_rank=0, name=f"{case}.initial")
    ck.tensor(initial, first, f"{case}: every rank starts from rank 0's weights")

    reference = copy.deepcopy(model)
    ref_opt = make_opt(reference.parameters())
    dopt = hvd.DistributedOptimizer(
        opt,
        named_parameters=model.named_parameters(),
        compression=compression,
        backward_passes_per_step=bpps,
        **dist_kwargs,
    )
    ck.true(isinstance(dopt, type(opt)), f"{case}: still an instance of {type(opt).__name__}")
    x, y = batches(model_kind, steps)
    # the ops the optimizer submits, counted where it calls them (the runtime's completion
    # counter is updated after the handles complete: it can lag the last step's ops)
    submitted = [0]
    real_submit = _optimizer_module.allreduce_async_

    def counting_submit(*args, **kwargs):
        submitted[0] += 1
        return real_submit(*args, **kwargs)

    _optimizer_module.allreduce_async_ = counting_submit
    for step in range(steps):
        dopt.zero_grad(set_to_none=set_to_none)
        micro = BATCH // bpps
        for m in range(bpps):
            part = slice(R * BATCH + m * micro, R * BATCH + (m + 1) * micro)
            loss = F.mse_loss(model(x[step, part]), y[step, part]) / bpps
            loss.backward()
        dopt.step()

        ref_opt.zero_grad()
        F.mse_loss(reference(x[step]), y[step]).backward()
        ref_opt.step()

    _optimizer_module.allreduce_async_ = real_submit
    print(f"OPS {case} {submitted[0]}", flush=True)
    mine, ref = flat(model), flat(reference)
    ck.true(not torch.equal(mine, initial), f"{case}: the weights moved")
    worst = (mine - ref).abs().max().item()
    ck.tensor(mine, ref, f"{case}: same weights as one process (max diff {worst:.2e})", tol, tol)
    everyone = hvd.allgather(mine.unsqueeze(0), name=f"{case}.final")
    for r in range(N):
        ck.tensor(everyone[r], everyone[0], f"{case}: rank {r} has rank 0's weights exactly")
    print(f"MAXDIFF {case} {worst:.3e}", flush=True)
    # the exact weights, compared across launches with other HVDPROF_BUCKET_BYTES
    print(f"WEIGHTS {case} {hashlib.sha256(mine.numpy().tobytes()).hexdigest()}", flush=True)


def check_groups() -> None:
    """Horovod's groups: bad values fail at construction; num_groups is deprecated but
    still groups; an integer and lists train like one process."""
    model = mlp()
    params = list(model.parameters())
    for bad in (-1, [[1, 2]], [params[:1], params[:1]], "two"):
        ck.raises(
            ValueError,
            lambda bad=bad: hvd.DistributedOptimizer(
                sgd(params), named_parameters=model.named_parameters(), groups=bad
            ),
            "groups",
        )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dopt = hvd.DistributedOptimizer(
            sgd(params), named_parameters=model.named_parameters(), num_groups=2
        )
    ck.true(
        any(issubclass(w.category, DeprecationWarning) for w in caught),
        "num_groups warns that it is deprecated",
    )
    ck.eq(len(dopt._buckets.buckets), 2, "num_groups=2: two groups")
    train_case("sgd_groups_int", "conv", sgd, groups=3)
    train_case(
        "adam_groups_list",
        "mlp",
        adam,
        groups_of=lambda m: [list(m.parameters())[:2], list(m.parameters())[2:]],
    )


class _WithUnused(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = mlp()
        self.unused = torch.nn.Linear(4, 4)  # never in forward: no gradient, ever

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def check_unused_parameter() -> None:
    """A parameter that never gets a gradient: its bucket is completed with zeros in
    step(), as a lone parameter's reduction is, and training matches one process."""
    torch.manual_seed(5)
    model = _WithUnused()
    reference = copy.deepcopy(model)
    dopt = hvd.DistributedOptimizer(
        sgd(model.parameters()), named_parameters=model.named_parameters()
    )
    ref_opt = sgd(reference.parameters())
    x, y = batches("mlp", 3)
    for step in range(3):
        dopt.zero_grad()
        part = slice(R * BATCH, (R + 1) * BATCH)
        F.mse_loss(model(x[step, part]), y[step, part]).backward()
        dopt.step()
        ref_opt.zero_grad()
        F.mse_loss(reference(x[step]), y[step]).backward()
        ref_opt.step()
    ck.tensor(
        flat(model), flat(reference), "unused parameter: same weights as one process", 1e-5, 1e-5
    )
    ck.tensor(
        model.unused.weight.grad, torch.zeros(4, 4), "the unused parameter's gradient is zeros"
    )


def sgd(params):
    return torch.optim.SGD(params, lr=0.1, momentum=0.9)


def adam(params):
    return torch.optim.Adam(params, lr=0.01)


def check_safety() -> None:
    torch.manual_seed(7)
    model = mlp()
    x, y = batches("mlp", 1)
    batch = (x[0, R * BATCH : (R + 1) * BATCH], y[0, R * BATCH : (R + 1) * BATCH])

    def backward() -> None:
        F.mse_loss(model(batch[0]), batch[1]).backward()

    params = list(model.parameters())
    ck.raises(
        ValueError,
        lambda: hvd.DistributedOptimizer(
            sgd(params), named_parameters=[("same", p) for p in params]
        ),
        "unique",
        "same",
    )
    ck.raises(
        ValueError,
        lambda: hvd.DistributedOptimizer(
            sgd(params), named_parameters=list(model.named_parameters())[:2]
        ),
        "not named",
    )

    dopt = hvd.DistributedOptimizer(sgd(params), named_parameters=model.named_parameters())
    backward()
    ck.raises(AssertionError, dopt.zero_grad, "zero_grad")
    dopt.synchronize()  # the pending allreduces complete; zero_grad is fine again
    with dopt.skip_synchronize():
        dopt.step()
    dopt.zero_grad()

    backward()
    dopt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dopt.step()
    ck.true(
        any("skip_synchronize" in str(w.message) for w in caught),
        f"step() after synchronize() warns: {[str(w.message) for w in caught]}",
    )
    dopt.zero_grad()

    backward()
    dopt.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with dopt.skip_synchronize():
            dopt.step()
    ck.eq(
        [str(w.message) for w in caught if "synchronize" in str(w.message)],
        [],
        "no warning inside skip_synchronize()",
    )
    dopt.zero_grad()

    # more backward passes than backward_passes_per_step before step()
    backward()
    ck.raises(AssertionError, backward, "backward_passes_per_step")
    dopt.synchronize()
    with dopt.skip_synchronize():
        dopt.step()
    dopt.zero_grad()

    # gradients of the same step on every rank are the averaged ones
    backward()
    dopt.synchronize()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    everyone = hvd.allgather(grads.unsqueeze(0), name="safety.grads")
    for r in range(N):
        ck.tensor(everyone[r], everyone[0], f"rank {r} has the averaged gradients")
    with dopt.skip_synchronize():
        dopt.step()
    dopt.zero_grad()
    everyone = hvd.allgather(flat(model).unsqueeze(0), name="safety.weights")
    ck.tensor(everyone[-1], everyone[0], "weights still equal on every rank")


def train_embedding(case: str, sparse_as_dense: bool, steps: int = 5) -> None:
    """An ``nn.Embedding(sparse=True)`` model (sparse gradients: each rank touches its own
    rows) trained with DistributedOptimizer equals a dense model trained in one process
    on the whole batch, with the default (allgathered indices and values) and with
    ``sparse_as_dense``."""

    def make(sparse: bool) -> torch.nn.Module:
        torch.manual_seed(77)
        return torch.nn.ModuleDict(
            {"emb": torch.nn.Embedding(50, 6, sparse=sparse), "out": torch.nn.Linear(6, 3)}
        )

    def forward(m: torch.nn.Module, idx: torch.Tensor) -> torch.Tensor:
        return m["out"](m["emb"](idx).mean(1))

    model, reference = make(True), make(False)
    g = torch.Generator().manual_seed(5)
    idx = torch.randint(0, 50, (steps, N * BATCH, 4), generator=g)
    y = torch.randn((steps, N * BATCH, 3), generator=g)
    dopt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.5),
        named_parameters=model.named_parameters(),
        sparse_as_dense=sparse_as_dense,
    )
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.5)
    part = slice(R * BATCH, (R + 1) * BATCH)
    for step in range(steps):
        dopt.zero_grad()
        F.mse_loss(forward(model, idx[step, part]), y[step, part]).backward()
        ck.true(model["emb"].weight.grad.is_sparse, f"{case}: the embedding's gradient is sparse")
        dopt.step()
        ref_opt.zero_grad()
        F.mse_loss(forward(reference, idx[step]), y[step]).backward()
        ref_opt.step()
    mine, ref = flat(model), flat(reference)
    worst = (mine - ref).abs().max().item()
    ck.tensor(
        mine,
        ref,
        f"{case}: same weights as dense training in one process ({worst:.1e})",
        1e-5,
        1e-5,
    )
    everyone = hvd.allgather(mine.unsqueeze(0), name=f"{case}.final")
    for r in range(N):
        ck.tensor(everyone[r], everyone[0], f"{case}: rank {r} has rank 0's weights exactly")


def check_sparse_allreduce() -> None:
    """``hvd.sparse_allreduce_async`` sums (or averages) every rank's sparse rows."""
    dense = torch.zeros(6, 2)
    dense[R] = float(R + 1)
    dense[5] = 1.0  # a row every rank touches
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / N)):
        wait = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sparse.{op}", op=op)
        got = hvd.synchronize(wait)
        ck.true(got.is_sparse, "the result is sparse")
        want = torch.zeros(6, 2)
        for r in range(N):
            want[r] += float(r + 1)
        want[5] = float(N)
        ck.tensor(got.to_dense(), want * scale, f"op {op}: every rank's rows, duplicates summed")


def check_sync_batch_norm() -> None:
    """``hvd.SyncBatchNorm`` on each rank's slice equals ``BatchNorm`` in one process on the
    concatenated batch: outputs, input gradients, the summed weight gradients and the
    running statistics (2-D and 4-D inputs, two steps)."""
    for dims, ref_cls in (((5,), torch.nn.BatchNorm1d), ((3, 4, 4), torch.nn.BatchNorm2d)):
        channels = dims[0]
        g = torch.Generator().manual_seed(21)
        sync = hvd.SyncBatchNorm(channels, momentum=0.3)
        ref = ref_cls(channels, momentum=0.3)
        with torch.no_grad():
            w, b = torch.randn(channels, generator=g), torch.randn(channels, generator=g)
            for m in (sync, ref):
                m.weight.copy_(w)
                m.bias.copy_(b)
        for step in range(2):
            x = torch.randn((N * BATCH, *dims), generator=g) * 3 + 1
            coeff = torch.randn((N * BATCH, *dims), generator=g)
            part = slice(R * BATCH, (R + 1) * BATCH)
            mine = x[part].clone().requires_grad_(True)
            out = sync(mine)
            (out * coeff[part]).sum().backward()
            whole = x.clone().requires_grad_(True)
            ref_out = ref(whole)
            (ref_out * coeff).sum().backward()
            what = f"{len(dims) + 1}-D, step {step}"
            ck.tensor(out, ref_out[part], f"{what}: outputs", 1e-4, 1e-4)
            ck.tensor(mine.grad, whole.grad[part], f"{what}: input gradients", 1e-4, 1e-4)
            wsum = hvd.allreduce(sync.weight.grad, op=hvd.Sum, name="sbn.w")
            ck.tensor(wsum, ref.weight.grad, f"{what}: weight gradients, summed", 1e-3, 1e-4)
            ck.tensor(sync.running_mean, ref.running_mean, f"{what}: running mean", 1e-5, 1e-5)
            ck.tensor(sync.running_var, ref.running_var, f"{what}: running var", 1e-4, 1e-5)
            for m in (sync, ref):
                m.zero_grad()
        sync.eval()
        probe = torch.randn((2, *dims), generator=g)
        ck.tensor(sync(probe), ref.eval()(probe), "eval mode: the running statistics", 1e-5, 1e-5)


def check_state_without_grads() -> None:
    """``broadcast_optimizer_state`` before any step, with a parameter that needs no
    gradient (Horovod's test_broadcast_state_no_grad): the state is created by a step on
    zero gradients, the parameter without ``requires_grad`` keeps ``grad`` None, and the
    others' gradients can be broadcast. And reducescatter with Adasum raises a
    RuntimeError, as Horovod's does."""
    a = torch.nn.Parameter(torch.tensor([1, 3], dtype=torch.int32), requires_grad=False)
    b = torch.nn.Parameter(torch.rand(4))
    opt = torch.optim.SGD([a, b], lr=0.001, weight_decay=1e-6, momentum=0.9, nesterov=True)
    dopt = hvd.DistributedOptimizer(opt, named_parameters=[("a", a), ("b", b)])
    hvd.broadcast_parameters({"a": a, "b": b}, root_rank=0)
    hvd.broadcast_optimizer_state(dopt, root_rank=0)
    ck.true(a.grad is None, "the parameter without requires_grad has no gradient")
    ck.true(isinstance(b.grad, torch.Tensor), "the others have one (zeros)")
    got = hvd.broadcast(b.grad, root_rank=0, name="nograd.b")
    ck.tensor(got, torch.zeros(4), "and it can be broadcast")
    ck.true("momentum_buffer" in dopt.state[b], "the optimizer's state exists")
    ck.raises(RuntimeError, lambda: hvd.reducescatter(torch.ones(4 * N), op=hvd.Adasum), "Adasum")


def check_misuse_after_reduction() -> None:
    """A second backward() while the first one's allreduces are still in flight raises,
    and leaves the gradients as they were.

    The interleaving is forced: rank 0 holds back its first backward until every other
    rank has made its second (misused) one, so the other ranks' allreduces of ``p.grad``
    are certainly pending then. Autograd must not have accumulated into a buffer that a
    reduction owns: the check has to fire before the gradient is accumulated, not after.
    """
    import tempfile
    import time

    torch.manual_seed(11)
    model = mlp()
    x, y = batches("mlp", 1)
    batch = (x[0, R * BATCH : (R + 1) * BATCH], y[0, R * BATCH : (R + 1) * BATCH])
    token = int(hvd.broadcast(torch.randint(0, 2**30, (1,)), root_rank=0, name="misuse.token"))
    marks = os.path.join(tempfile.gettempdir(), f"hvdprof-misuse-{token}")

    def backward() -> None:
        F.mse_loss(model(batch[0]), batch[1]).backward()

    params = list(model.parameters())
    dopt = hvd.DistributedOptimizer(sgd(params), named_parameters=model.named_parameters())
    if R == 0:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not all(
            os.path.exists(f"{marks}.{r}") for r in range(1, N)
        ):
            time.sleep(0.01)
        ck.true(time.monotonic() < deadline, "the other ranks made their second backward")
        backward()
    else:
        backward()  # its allreduces wait for rank 0, which is held back
        before = [p.grad.clone() for p in params]
        ck.raises(AssertionError, backward, "backward_passes_per_step")
        after = [p.grad for p in params]
        changed = [
            name
            for (name, _), b, a in zip(model.named_parameters(), before, after, strict=True)
            if not torch.equal(b, a)
        ]
        ck.eq(changed, [], "a misused backward leaves every gradient as it was")
        open(f"{marks}.{R}", "w").close()
    dopt.synchronize()
    grads = torch.cat([p.grad.reshape(-1) for p in params])
    everyone = hvd.allgather(grads.unsqueeze(0), name="misuse.grads")
    for r in range(N):
        ck.tensor(everyone[r], everyone[0], f"rank {r} has the averaged gradients")
    with dopt.skip_synchronize():
        dopt.step()
    dopt.zero_grad()
    everyone = hvd.allgather(flat(model).unsqueeze(0), name="misuse.weights")
    ck.tensor(everyone[-1], everyone[0], "weights still equal on every rank")
    hvd.barrier()
    if R != 0:
        os.unlink(f"{marks}.{R}")


SECTIONS = {
    "sgd_mlp": lambda: train_case("sgd_mlp", "mlp", sgd),
    "adam_convnet": lambda: train_case("adam_convnet", "conv", adam),
    "sgd_convnet": lambda: train_case("sgd_convnet", "conv", sgd),
    "adam_mlp": lambda: train_case("adam_mlp", "mlp", adam),
    "sgd_backward_passes_2": lambda: train_case("sgd_bpps2", "mlp", sgd, bpps=2),
    "adam_backward_passes_2": lambda: train_case("adam_bpps2", "conv", adam, bpps=2),
    "sgd_predivide": lambda: train_case("sgd_predivide", "mlp", sgd, gradient_predivide_factor=2.0),
    "sgd_fp16_compression": lambda: train_case(
        "sgd_fp16", "mlp", sgd, compression=hvd.Compression.fp16, tol=1e-3
    ),
    "adam_fp16_compression": lambda: train_case(
        "adam_fp16", "conv", adam, compression=hvd.Compression.fp16, tol=1e-3
    ),
    "sgd_keep_grads": lambda: train_case("sgd_keep_grads", "mlp", sgd, set_to_none=False),
    "adam_keep_grads_backward_passes_2": lambda: train_case(
        "adam_keep_grads_bpps2", "conv", adam, bpps=2, set_to_none=False
    ),
    "sgd_channels_last": lambda: train_case("sgd_channels_last", "conv", sgd, channels_last=True),
    "optimizer_safety": check_safety,
    "groups": check_groups,
    "unused_parameter": check_unused_parameter,
    "misuse_after_reduction": check_misuse_after_reduction,
    "sparse_allreduce": check_sparse_allreduce,
    "sparse_embedding": lambda: train_embedding("sparse_embedding", sparse_as_dense=False),
    "sparse_as_dense": lambda: train_embedding("sparse_as_dense", sparse_as_dense=True),
    "sync_batch_norm": check_sync_batch_norm,
    "optimizer_state_without_grads": check_state_without_grads,
}


def main() -> None:
    # HVDTEST_ONLY=a,b runs only those sections (for repeating one section many times)
    only = [n for n in os.environ.get("HVDTEST_ONLY", "").split(",") if n]
    for name, check in SECTIONS.items():
        if only and name not in only:
            continue
        with ck.section(name):
            check()
    hvd.shutdown()
    ck.done()


if __name__ == "__main__":
    main()
