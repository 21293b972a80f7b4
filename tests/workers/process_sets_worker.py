"""Process sets on real ranks: every collective within even and odd ranks, the optimizer on
a set, sparse gradients, the errors Horovod gives, removal, and a job whose two sets
train apart (``train`` mode, recorded by the test's timeline).

Usage: process_sets_worker.py MODE. Modes: ``ops`` (every check; prints ``OK <n>``),
``static`` (sets from ``init(process_sets=...)``), ``train SLOW_RANK DELAY_MS`` (sets
{0, 1} and {2, 3} each reduce their own gradients; SLOW_RANK sleeps DELAY_MS per step).
"""

from __future__ import annotations

import os
import sys
import time

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402

MODE = sys.argv[1]
checks = 0


def check(cond: bool, what: str) -> None:
    global checks
    if not cond:
        raise AssertionError(f"rank {hvd.rank()}: {what}")
    checks += 1


def expect_error(kind: type[BaseException], fn, words: str) -> None:  # type: ignore[no-untyped-def]
    try:
        fn()
    except kind as exc:
        check(words in str(exc), f"error {exc!r} lacks {words!r}")
        return
    raise AssertionError(f"rank {hvd.rank()}: no {kind.__name__} ({words})")


def ops() -> None:
    # (the ``static`` mode checks that adding a set needs dynamic process sets)
    hvd.init(process_sets="dynamic")
    rank, size = hvd.rank(), hvd.size()
    evens = [r for r in range(size) if r % 2 == 0]
    odds = [r for r in range(size) if r % 2 == 1]
    even_set = hvd.add_process_set(evens)
    odd_set = hvd.add_process_set(hvd.ProcessSet(odds))
    mine, other = (even_set, odd_set) if rank % 2 == 0 else (odd_set, even_set)
    members = mine.ranks
    check(mine.included() and not other.included(), "included()")
    check(mine.size() == len(members) and mine.rank() == members.index(rank), "rank/size")
    check(other.rank() == -1, "rank() outside the set is -1")
    check(hvd.process_set_by_id(mine.process_set_id) is mine, "process_set_by_id")
    check([p.process_set_id for p in hvd.process_sets()] == [0, 1, 2], "process_sets()")
    expect_error(ValueError, lambda: hvd.add_process_set(evens), "already exists")

    # every collective, within the set
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        t = torch.full((3, 5), rank + 1, dtype=dtype)
        out = hvd.allreduce(t, op=hvd.Sum, process_set=mine)
        check(torch.equal(out, torch.full_like(t, sum(r + 1 for r in members))), f"sum {dtype}")
    avg = hvd.allreduce(torch.full((4,), float(rank)), process_set=mine)
    check(torch.allclose(avg, torch.full((4,), sum(members) / len(members))), "average")
    mx = hvd.allreduce(torch.tensor([float(rank)]), op=hvd.Max, process_set=mine)
    check(mx.item() == max(members), "max")
    # fused: many small tensors of one set in one buffer, named the same in both sets
    handles = [
        hvd.allreduce_async(
            torch.full((7,), float(rank)), op=hvd.Sum, name=f"g{i}", process_set=mine
        )
        for i in range(16)
    ]
    check(all(hvd.synchronize(h)[0].item() == sum(members) for h in handles), "fused")
    grouped = hvd.grouped_allreduce(
        [torch.ones(3) * rank, torch.ones(2) * rank], op=hvd.Sum, process_set=mine
    )
    check(all(g[0].item() == sum(members) for g in grouped), "grouped allreduce")
    gathered = hvd.allgather(torch.full((rank + 1, 2), rank), process_set=mine)
    want = torch.cat([torch.full((r + 1, 2), r) for r in members])
    check(torch.equal(gathered, want), "allgather of different first dimensions")
    root = members[-1]
    b = hvd.broadcast(torch.tensor([rank, rank]), root_rank=root, process_set=mine)
    check(b.tolist() == [root, root], "broadcast from the set's last rank")
    rows = 2 * len(members)
    scattered = hvd.reducescatter(torch.ones(rows, 3), op=hvd.Sum, process_set=mine)
    check(scattered.shape == (2, 3) and scattered.sum().item() == 6 * len(members), "reducescatter")
    sent = torch.arange(len(members)) + 100 * rank
    received = hvd.alltoall(sent, process_set=mine)
    check(received.tolist() == [100 * r + members.index(rank) for r in members], "alltoall")
    obj = hvd.broadcast_object({"from": rank}, root_rank=root, process_set=mine)
    check(obj == {"from": root}, "broadcast_object")
    objs = hvd.allgather_object(rank, process_set=mine)
    check(objs == members, "allgather_object")
    hvd.barrier(process_set=mine)

    # gradients flow within the set
    x = torch.ones(2, requires_grad=True)
    hvd.allreduce(x * (rank + 1), op=hvd.Sum, process_set=mine).sum().backward()
    check(torch.equal(x.grad, torch.full((2,), float(len(members) * (rank + 1)))), "grad")

    # the optimizer on a set: every member ends with the same weights
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 1)
    hvd.broadcast_parameters(model.state_dict(), root_rank=members[0], process_set=mine)
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1),
        named_parameters=model.named_parameters(),
        process_set=mine,
    )
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(8, 4)).pow(2).mean().backward()
        opt.step()
    w = hvd.allgather(model.weight.detach(), process_set=mine)
    check(all(torch.equal(w[i], w[0]) for i in range(len(members))), "optimizer on a set")
    # as Horovod's: a rank outside the optimizer's set builds it and steps on its own
    lone = torch.nn.Linear(4, 1)
    before = lone.weight.detach().clone()
    outside = hvd.DistributedOptimizer(
        torch.optim.SGD(lone.parameters(), lr=0.1),
        named_parameters=lone.named_parameters(),
        process_set=other,
    )
    outside.zero_grad()
    lone(torch.ones(2, 4)).sum().backward()
    local = before - 0.1 * lone.weight.grad
    outside.step()
    check(torch.allclose(lone.weight.detach(), local), "outside its set: a local step")

    # sparse gradients stay sparse, so SparseAdam works (Horovod's test_sparse_embeddings);
    # under MPI this once hung at 4 ranks (a one-row gradient's strides: see backends/mpi)
    sparse_adam(rank, size)

    # Horovod's errors: a rank outside the set, a root outside it, a removed set
    expect_error(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=other), "not part")
    expect_error(
        ValueError,
        lambda: hvd.broadcast(torch.ones(1), root_rank=other.ranks[0], process_set=mine),
        "not in process set",
    )
    # the global set still works beside them
    total = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum)
    check(total.item() == size, "global allreduce")
    check(hvd.remove_process_set(odd_set) and hvd.remove_process_set(even_set), "removed")
    check(not hvd.remove_process_set(hvd.global_process_set), "the global set stays")
    check(mine.process_set_id is None and mine.size() is None, "invalidated")
    expect_error(
        ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=mine), "not registered"
    )
    hvd.shutdown()
    print(f"OK {checks}", flush=True)


def sparse_adam(rank: int, size: int) -> None:
    emb = torch.nn.Embedding(10, 3, sparse=True)
    hvd.broadcast_parameters(emb.state_dict(), root_rank=0)
    sparse_opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(emb.parameters(), lr=0.1), named_parameters=emb.named_parameters()
    )
    hvd.broadcast_optimizer_state(sparse_opt, root_rank=0)
    for _ in range(2):
        sparse_opt.zero_grad()
        emb(torch.tensor([rank % 10, 3])).sum().backward()
        check(emb.weight.grad.is_sparse, "the gradient is sparse before step")
        sparse_opt.step()
    w = hvd.allgather(emb.weight.detach()[None])
    check(all(torch.equal(w[i], w[0]) for i in range(size)), "SparseAdam in step on every rank")
    # sparse_as_dense: reduced densely, handed back sparse (SparseAdam refuses dense)
    dense_opt = hvd.DistributedOptimizer(
        torch.optim.SparseAdam(emb.parameters(), lr=0.1),
        named_parameters=emb.named_parameters(),
        sparse_as_dense=True,
    )
    dense_opt.zero_grad()
    emb(torch.tensor([rank % 10])).sum().backward()
    dense_opt.synchronize()
    check(emb.weight.grad.is_sparse, "sparse_as_dense gives a sparse gradient back")
    with dense_opt.skip_synchronize():
        dense_opt.step()


def static() -> None:
    size = int(os.environ.get("HVDPROF_SIZE") or os.environ["OMPI_COMM_WORLD_SIZE"])
    low, high = list(range(size // 2)), list(range(size // 2, size))
    hvd.init(process_sets=[hvd.ProcessSet(low), hvd.ProcessSet(high), hvd.ProcessSet(low)])
    rank = hvd.rank()
    check([p.ranks for p in hvd.process_sets()] == [list(range(size)), low, high], "static ids")
    mine = hvd.process_sets()[1 if rank in low else 2]
    out = hvd.allreduce(torch.tensor([1.0]), op=hvd.Sum, process_set=mine)
    check(out.item() == len(mine.ranks), "static set allreduce")
    expect_error(ValueError, lambda: hvd.add_process_set([0]), "dynamic")
    hvd.shutdown()
    print(f"OK {checks}", flush=True)


def train(slow_rank: int, delay_ms: float) -> None:
    """Two sets training apart; the slow rank's set finishes later than the other."""
    hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])])
    rank = hvd.rank()
    mine = hvd.process_sets()[1 if rank < 2 else 2]
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    opt = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.01),
        named_parameters=model.named_parameters(),
        process_set=mine,
    )
    for step in range(40):
        if rank == slow_rank and step >= 5:
            time.sleep(delay_ms / 1000.0)
        opt.zero_grad()
        model(torch.randn(16, 32)).pow(2).mean().backward()
        opt.step()
    hvd.shutdown()
    print("OK train", flush=True)


def stall() -> None:
    """Rank 1 is 3 s late for set {0, 1}'s allreduce while set {2, 3} keeps working: the
    stall line names rank 1 alone; ranks 2 and 3 are neither late for it nor said to
    have submitted it."""
    hvd.init(process_sets=[hvd.ProcessSet([0, 1]), hvd.ProcessSet([2, 3])])
    rank = hvd.rank()
    mine = hvd.process_sets()[1 if rank < 2 else 2]
    started = time.monotonic()
    if rank == 1:
        time.sleep(3.0)
    if rank < 2:
        hvd.allreduce(torch.ones(4), name="x", process_set=mine)
    else:
        # both members stop at the same op: the allreduce itself carries the decision (each
        # rank's own clock once let one of them submit one 'y' more, a real deadlock)
        keep = True
        while keep:
            going = 1.0 if time.monotonic() - started < 3.0 else 0.0
            keep = bool(
                hvd.allreduce(torch.tensor([going]), name="y", op=hvd.Min, process_set=mine)
            )
            time.sleep(0.01)
    hvd.shutdown()
    print("OK stall", flush=True)


if MODE == "ops":
    ops()
elif MODE == "static":
    static()
elif MODE == "stall":
    stall()
elif MODE == "train":
    train(int(sys.argv[2]), float(sys.argv[3]))
else:
    raise SystemExit(f"unknown mode {MODE!r}")
