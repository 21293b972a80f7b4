"""Every error path of hvdprof.torch, each followed by a correct allreduce.

Each section provokes one kind of error on every rank, checks the exception type and
message, and then proves the runtime still works. Prints ``SECTION ...`` lines and
``DONE`` (see ``_common.py``).
"""

from __future__ import annotations

import os
import re
import sys

import _common

_common.start_watchdog()

import torch  # noqa: E402

import hvdprof.torch as hvd  # noqa: E402
from hvdprof.errors import (  # noqa: E402
    HvdprofError,
    HvdprofInternalError,
    NotInitializedError,
    TensorMismatchError,
)

hvd.init()
R, N = hvd.rank(), hvd.size()
ck = _common.Checks(R)
_usable_count = 0


def usable(tag: str) -> None:
    """A correct allreduce (named and unnamed) after an error: the runtime still works."""
    global _usable_count
    _usable_count += 1
    x = torch.full((4,), float(R + _usable_count))
    want = torch.full((4,), float(sum(r + _usable_count for r in range(N))))
    ck.tensor(hvd.allreduce(x, op=hvd.Sum, name=f"usable.{tag}"), want, f"usable after {tag}")
    ck.tensor(hvd.allreduce(x, op=hvd.Sum), want, f"unnamed allreduce usable after {tag}")


def names_ranks_and_values(exc: BaseException | None, what: str, name: str, field: str, shown):
    """The message names the tensor, the field, and every rank with its value."""
    if exc is None:
        return
    text = str(exc)
    ck.true(name in text, f"{what}: message names the tensor {name!r}: {text}")
    ck.true(field in text, f"{what}: message names the field {field!r}: {text}")
    for r in range(N):
        prefix = f"rank {r} has "
        at = text.find(prefix)
        ck.true(at >= 0, f"{what}: message names rank {r}: {text}")
        if at >= 0:
            # what follows "rank r has ", up to the next rank or field
            shown_value = re.split(r", rank \d+ has |; ", text[at + len(prefix) :])[0]
            ck.true(
                shown(r) in shown_value,
                f"{what}: rank {r}'s value {shown(r)!r} is shown, got {shown_value!r}: {text}",
            )


def mismatch(what: str, name: str, field: str, fn, shown) -> None:
    exc = ck.raises(TensorMismatchError, fn, "ismatch")
    names_ranks_and_values(exc, what, name, field, shown)
    if exc is not None:
        ck.true(isinstance(exc, ValueError), "TensorMismatchError is a ValueError")
        ck.true(isinstance(exc, HvdprofError), "TensorMismatchError is an HvdprofError")
    usable(what)


# ------------------------------------------------------------------ mismatches
def check_mismatch_shape() -> None:
    mismatch(
        "shape",
        "mm.shape",
        "shape",
        lambda: hvd.allreduce(torch.ones(R + 1, 2), name="mm.shape"),
        lambda r: f"[{r + 1}, 2]",
    )


def check_mismatch_dtype() -> None:
    dtype = torch.float32 if R == 0 else torch.float64
    mismatch(
        "dtype",
        "mm.dtype",
        "dtype",
        lambda: hvd.allreduce(torch.ones(3, dtype=dtype), name="mm.dtype"),
        lambda r: "float32" if r == 0 else "float64",
    )


def check_mismatch_op() -> None:
    ops = [(hvd.Sum, "SUM"), (hvd.Max, "MAX"), (hvd.Min, "MIN")]
    mismatch(
        "reduce op",
        "mm.op",
        "reduce_op",
        lambda: hvd.allreduce(torch.ones(3), name="mm.op", op=ops[R][0]),
        lambda r: ops[r][1],
    )


def check_mismatch_root_rank() -> None:
    mismatch(
        "root rank",
        "mm.root",
        "root_rank",
        lambda: hvd.broadcast(torch.ones(3), root_rank=R, name="mm.root"),
        lambda r: str(r),
    )
    mismatch(
        "root rank in place",
        "mm.root_",
        "root_rank",
        lambda: hvd.broadcast_(torch.ones(3), root_rank=N - 1 - R, name="mm.root_"),
        lambda r: str(N - 1 - r),
    )


def check_mismatch_misc() -> None:
    def op_kind() -> None:
        if R == 0:
            hvd.allreduce(torch.ones(3), name="mm.kind")
        else:
            hvd.broadcast(torch.ones(3), 0, name="mm.kind")

    mismatch("op kind", "mm.kind", "op", op_kind, lambda r: "ALLREDUCE" if r == 0 else "BROADCAST")
    mismatch(
        "prescale",
        "mm.pre",
        "prescale",
        lambda: hvd.allreduce(torch.ones(3), name="mm.pre", prescale_factor=1.0 + R),
        lambda r: str(1.0 + r),
    )
    mismatch(
        "allgather trailing dims",
        "mm.gather",
        "shape",
        lambda: hvd.allgather(torch.ones(2, R + 1), name="mm.gather"),
        lambda r: f"[2, {r + 1}]",
    )
    mismatch(
        "alltoall trailing dims",
        "mm.a2a",
        "shape",
        lambda: hvd.alltoall(torch.ones(N, R + 2), name="mm.a2a"),
        lambda r: f"[{N}, {r + 2}]",
    )
    mismatch(
        "reducescatter shape",
        "mm.rs",
        "shape",
        lambda: hvd.reducescatter(torch.ones(N + R, 2), name="mm.rs"),
        lambda r: f"[{N + r}, 2]",
    )


def check_mismatch_cached_name() -> None:
    """A name already in the response cache, then submitted with different shapes."""
    for _ in range(3):
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="mm.cached")
        ck.tensor(out, torch.full((3,), float(N)), "cached name before the mismatch")
    mismatch(
        "cached name",
        "mm.cached",
        "shape",
        lambda: hvd.allreduce(torch.ones(R + 3), op=hvd.Sum, name="mm.cached"),
        lambda r: f"[{r + 3}]",
    )
    for _ in range(3):
        out = hvd.allreduce(torch.ones(3), op=hvd.Sum, name="mm.cached")
        ck.tensor(out, torch.full((3,), float(N)), "cached name after the mismatch")


def check_mismatch_fails_only_that_op() -> None:
    good = [
        hvd.allreduce_async(torch.full((2,), float(i)), op=hvd.Sum, name=f"ok.{i}")
        for i in range(5)
    ]
    bad = hvd.allreduce_async(torch.ones(R + 1), name="mm.only")
    more = [
        hvd.allreduce_async_(torch.full((2,), float(i)), op=hvd.Sum, name=f"ok2.{i}")
        for i in range(5)
    ]
    for i, h in enumerate(good + more):
        ck.tensor(hvd.synchronize(h), torch.full((2,), float(N * (i % 5))), "neighbour op")
    exc = ck.raises(TensorMismatchError, lambda: hvd.synchronize(bad), "mm.only")
    names_ranks_and_values(exc, "async mismatch", "mm.only", "shape", lambda r: f"[{r + 1}]")
    # a grouped op with one mismatched member: only that member fails
    h = hvd.grouped_allreduce_async(
        [torch.ones(2), torch.ones(R + 1), torch.ones(3)], op=hvd.Sum, name="mm.grp"
    )
    ck.raises(TensorMismatchError, lambda: hvd.synchronize(h), "mm.grp.1")
    usable("grouped mismatch")


# ------------------------------------------------------------------ local errors
def check_duplicate_name_in_flight() -> None:
    for owner in range(N):
        name = f"dup.{owner}"
        if owner == R:
            # the other ranks have not submitted it yet, so it cannot complete
            h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name=name)
            for fn in (
                lambda name=name: hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name=name),
                lambda name=name: hvd.allreduce(torch.ones(2), op=hvd.Sum, name=name),
                lambda name=name: hvd.broadcast_async(torch.ones(2), 0, name=name),
                lambda name=name: hvd.allgather_async(torch.ones(2), name=name),
            ):
                ck.raises(ValueError, fn, name, "in flight")
            hvd.barrier()
        else:
            hvd.barrier()
            h = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name=name)
        ck.tensor(hvd.synchronize(h), torch.full((2,), float(N)), "the first op still completes")
        # once synchronized, the name can be used again
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name=name)
        ck.tensor(out, torch.full((2,), float(N)), "name reusable after completion")
    usable("duplicate name")


def check_unsupported_dtype() -> None:
    for dtype in (torch.complex64, torch.bool):
        t = torch.ones(N, 2, dtype=dtype)
        name = str(dtype).replace("torch.", "")
        for what, fn in (
            ("allreduce", lambda t=t: hvd.allreduce(t)),
            ("allreduce_", lambda t=t: hvd.allreduce_(t)),
            ("allreduce_async", lambda t=t: hvd.allreduce_async(t)),
            ("grouped_allreduce", lambda t=t: hvd.grouped_allreduce([t])),
            ("allgather", lambda t=t: hvd.allgather(t)),
            ("broadcast", lambda t=t: hvd.broadcast(t, 0)),
            ("broadcast_", lambda t=t: hvd.broadcast_(t, 0)),
            ("alltoall", lambda t=t: hvd.alltoall(t)),
            ("reducescatter", lambda t=t: hvd.reducescatter(t)),
        ):
            exc = ck.raises(ValueError, fn, name, "supported", what=what)
            if exc is not None:
                ck.true("float32" in str(exc), f"{what}: the message lists supported dtypes")
    ck.raises(TypeError, lambda: hvd.allreduce_async([1.0, 2.0]), "Tensor")
    usable("unsupported dtype")


def check_non_contiguous_in_place() -> None:
    def nc():
        t = torch.ones(3, 2).t()
        assert not t.is_contiguous()
        return t

    for what, fn in (
        ("allreduce_", lambda: hvd.allreduce_(nc())),
        ("allreduce_async_", lambda: hvd.allreduce_async_(nc())),
        ("broadcast_", lambda: hvd.broadcast_(nc(), 0)),
        ("broadcast_async_", lambda: hvd.broadcast_async_(nc(), 0)),
        ("grouped_allreduce_", lambda: hvd.grouped_allreduce_([nc()])),
    ):
        ck.raises(ValueError, fn, "contiguous", what=what)
    # out of place, a non-contiguous input is fine
    out = hvd.allreduce(nc() * (R + 1), op=hvd.Sum)
    ck.tensor(out, torch.full((2, 3), float(sum(range(1, N + 1)))), "out-of-place non-contiguous")
    usable("non-contiguous")


def check_grouped_validation_is_atomic() -> None:
    """A grouped op with an invalid member raises before submitting any member: nothing
    is left running in the background, and the same name can be used right away."""
    first = torch.full((3,), float(R + 1))
    bad = torch.ones(3, 2).t()
    ck.raises(ValueError, lambda: hvd.grouped_allreduce_([first, bad], name="atomic"), "contiguous")
    hvd.barrier()
    hvd.allreduce(torch.ones(1), name="atomic.settle")
    ck.tensor(first, torch.full((3,), float(R + 1)), "the valid member was not reduced in place")
    try:
        outs = hvd.grouped_allreduce_([first, bad.contiguous()], op=hvd.Sum, name="atomic")
    except ValueError as exc:
        ck.fail("retrying the grouped op with the same name", f"raised {exc}")
    else:
        ck.tensor(outs[0], torch.full((3,), float(sum(range(1, N + 1)))), "retry works")
    usable("grouped validation")


def check_bad_alltoall_splits() -> None:
    t = torch.ones(N + 1, 2)
    for splits, what in (
        ([1] * (N + 1), "one entry too many"),
        ([N + 1] + [0] * (N - 2), "one entry too few"),
        ([N + 2, -1] + [0] * (N - 2), "a negative entry"),
        ([1] * N, "entries not summing to the first dimension"),
        (torch.tensor([N + 2] + [0] * (N - 1)), "a tensor summing too high"),
    ):
        ck.raises(ValueError, lambda s=splits: hvd.alltoall(t, splits=s), "splits", what=what)
        ck.raises(ValueError, lambda s=splits: hvd.alltoall_async(t, splits=s), "splits", what=what)
    ck.raises(ValueError, lambda: hvd.alltoall(torch.ones(N + 1, 2)), "divisible")
    usable("alltoall splits")


def check_broadcast_root_out_of_range() -> None:
    t = torch.ones(3)
    for root in (N, -1, N + 5):
        for fn in (
            lambda r=root: hvd.broadcast(t, r),
            lambda r=root: hvd.broadcast_(t, r),
            lambda r=root: hvd.broadcast_async(t, r),
            lambda r=root: hvd.broadcast_async_(t, r),
            lambda r=root: hvd.broadcast_parameters({"w": t}, r),
        ):
            ck.raises(ValueError, fn, "root_rank", str(root))
    usable("root out of range")


def check_bad_arguments() -> None:
    t = torch.ones(3)
    ck.raises(ValueError, lambda: hvd.allreduce(t, op=99), "99")
    # Adasum is supported (semantics_worker.py); on integers it is refused, clearly
    ck.raises(ValueError, lambda: hvd.allreduce(t.int(), op=hvd.Adasum), "Adasum", "floating")
    ck.raises(ValueError, lambda: hvd.allreduce(t, name=""), "name")
    ck.raises(ValueError, lambda: hvd.grouped_allreduce([]), "tensor")
    ck.raises(ValueError, lambda: hvd.reducescatter(torch.tensor(1.0)), "dimension")
    ck.raises(ValueError, lambda: hvd.init(comm=[0, 1]), "comm")
    ck.true(hvd.HorovodInternalError is HvdprofInternalError, "HorovodInternalError alias")
    usable("bad arguments")


def check_join_with_other_ops() -> None:
    if R == 0:
        last = hvd.join()
    else:
        exc = ck.raises(TensorMismatchError, lambda: hvd.broadcast(torch.ones(2), 1, name="j.b"))
        if exc is not None:
            ck.true("join" in str(exc) and "j.b" in str(exc), f"explains the join: {exc}")
        ck.raises(TensorMismatchError, lambda: hvd.allgather(torch.ones(2), name="j.g"), "join")
        out = hvd.allreduce(torch.ones(2), op=hvd.Sum, name="j.ar")
        ck.tensor(out, torch.full((2,), float(N - 1)), "allreduce while rank 0 has joined")
        last = hvd.join()
    # rank 0 joined first; with 3 ranks either of the others may be the last
    ck.true(1 <= last < N, f"join returns a rank that joined late, got {last}")
    everyone = hvd.allgather_object(last, name="j.last")
    ck.eq(everyone, [last] * N, "every rank gets the same last rank from join")
    usable("join with other ops")


def check_after_shutdown() -> None:
    hvd.shutdown()
    ck.true(not hvd.is_initialized(), "not initialized after shutdown")
    for what, fn in (
        ("allreduce", lambda: hvd.allreduce(torch.ones(2))),
        ("allreduce_async", lambda: hvd.allreduce_async(torch.ones(2))),
        ("broadcast", lambda: hvd.broadcast(torch.ones(2), 0)),
        ("barrier", hvd.barrier),
        ("size", hvd.size),
        ("rank", hvd.rank),
        ("runtime_stats", hvd.runtime_stats),
    ):
        exc = ck.raises(NotInitializedError, fn, "init", what=what)
        if exc is not None:
            ck.true(isinstance(exc, ValueError), f"{what}: NotInitializedError is a ValueError")


def check_init_after_shutdown() -> None:
    """Horovod allows init() again after shutdown() (elastic training relies on it)."""
    hvd.init()
    ck.true(hvd.is_initialized(), "initialized again")
    ck.eq((hvd.rank(), hvd.size()), (R, N), "same topology after init again")
    usable("init after shutdown")


SECTIONS = {
    "mismatch_shape": check_mismatch_shape,
    "mismatch_dtype": check_mismatch_dtype,
    "mismatch_op": check_mismatch_op,
    "mismatch_root_rank": check_mismatch_root_rank,
    "mismatch_misc": check_mismatch_misc,
    "mismatch_cached_name": check_mismatch_cached_name,
    "mismatch_fails_only_that_op": check_mismatch_fails_only_that_op,
    "duplicate_name_in_flight": check_duplicate_name_in_flight,
    "unsupported_dtype": check_unsupported_dtype,
    "non_contiguous_in_place": check_non_contiguous_in_place,
    "bad_alltoall_splits": check_bad_alltoall_splits,
    "broadcast_root_out_of_range": check_broadcast_root_out_of_range,
    "bad_arguments": check_bad_arguments,
    "join_with_other_ops": check_join_with_other_ops,
    "grouped_validation_is_atomic": check_grouped_validation_is_atomic,
    "after_shutdown": check_after_shutdown,
    "init_after_shutdown": check_init_after_shutdown,
}


def main() -> None:
    for name, check in SECTIONS.items():
        with ck.section(name):
            check()
    if "init_after_shutdown" in ck.failed_sections:
        # the other ranks may be stuck in their own init: fail the job so the launcher
        # stops them now instead of at its timeout
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(3)
    if hvd.is_initialized():
        hvd.shutdown()
    ck.done()


if __name__ == "__main__":
    main()
