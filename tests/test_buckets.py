"""Bucket layouts of ``DistributedOptimizer`` (``hvdprof.torch.buckets``): pure functions.

The layouts must be the same on every rank from the parameters alone, close at the cap,
never mix dtypes in one flat tensor, and follow Horovod's ``groups`` split. Training
through them, bit-identical to one allreduce per gradient, is in test_training.py.
"""

from __future__ import annotations

import pytest
import torch

from hvdprof.torch import buckets


def _params(*sizes: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    return [torch.zeros(n, dtype=dtype, requires_grad=True) for n in sizes]


def test_by_size_reverses_and_closes_at_the_cap() -> None:
    a, b, c, d, e = _params(100, 100, 300, 10, 5)  # 400, 400, 1200, 40, 20 bytes
    layout = buckets.by_size([a, b, c, d, e], cap_bytes=800)
    # the first gradient backward produces (e) alone, then [d, c] closes at the cap
    assert [[id(p) for p in g] for g in layout] == [[id(e)], [id(d), id(c)], [id(b), id(a)]]


def test_a_large_gradient_is_a_bucket_of_its_own() -> None:
    small, large, tail, first = _params(10, 1000, 10, 1)
    layout = buckets.by_size([small, large, tail, first], cap_bytes=1000)
    assert [len(g) for g in layout] == [1, 2, 1]  # [first], [tail, large] at the cap, [small]
    names = {small: "s", large: "l", tail: "t", first: "f"}
    plan = buckets.plan([small, large, tail, first], names, None, 1000)
    assert [b.params for b in plan.buckets] == [(tail, large)]
    assert small not in plan.of and first not in plan.of  # alone: as without buckets


def test_dtypes_never_share_a_bucket() -> None:
    f32 = _params(4, 4, 4)
    f64 = _params(4, dtype=torch.float64)
    layout = buckets.by_size([f32[0], f64[0], f32[1], f32[2]], cap_bytes=1 << 20)
    kinds = [[p.dtype for p in g] for g in layout]
    assert kinds == [[torch.float32], [torch.float32], [torch.float64], [torch.float32]]


def test_names_say_the_first_member_and_how_many_more() -> None:
    a, b, c, d = _params(1, 1, 1, 1)
    names = {a: "fc.weight", b: "fc.bias", c: "out.bias", d: "head.bias"}
    plan = buckets.plan([a, b, c, d], names, None, 1 << 20)
    assert [bk.name for bk in plan.buckets] == ["allreduce.bucket0.out.bias+2"]


def test_zero_cap_is_one_allreduce_per_gradient() -> None:
    ps = _params(1, 2, 3)
    assert buckets.plan(ps, {p: str(i) for i, p in enumerate(ps)}, None, 0).buckets == []


@pytest.mark.parametrize(
    ("count", "groups", "sizes"),
    [(10, 3, [4, 3, 3]), (4, 4, [1, 1, 1, 1]), (3, 5, [1, 1, 1]), (7, 1, [7])],
)
def test_horovod_groups_split_like_horovod(count: int, groups: int, sizes: list[int]) -> None:
    ps = _params(*([1] * count))
    layout = buckets.horovod_groups(ps, groups)
    assert [len(g) for g in layout] == sizes
    assert [p for g in layout for p in g] == ps  # registration order, contiguous


def test_listed_groups_keep_their_members_and_split_by_dtype() -> None:
    a, b = _params(2, 2)
    (c,) = _params(2, dtype=torch.float64)
    layout = buckets.horovod_groups([a, b, c], [[a, c, b]])
    assert [[id(p) for p in g] for g in layout] == [[id(a)], [id(c)], [id(b)]]


@pytest.mark.parametrize("bad", [-1, "3", [[1]], [1, 2], True])
def test_bad_groups_are_a_value_error(bad: object) -> None:
    with pytest.raises(ValueError, match="groups"):
        buckets.check_groups(bad)


def test_a_parameter_in_two_groups_is_a_value_error() -> None:
    (a,) = _params(1)
    with pytest.raises(ValueError, match="more than one group"):
        buckets.check_groups([[a], [a]])


def test_flatten_and_back_round_trips() -> None:
    grads = [torch.arange(6.0).reshape(2, 3), torch.arange(4.0).reshape(2, 2).t()]
    flat = buckets.flatten(grads) * 2
    out = [torch.empty(2, 3), torch.empty(2, 2).t()]
    buckets.unflatten_into(flat, out)
    assert torch.equal(out[0], grads[0] * 2) and torch.equal(out[1], grads[1] * 2)


def _bucket_with_grads(*sizes: int) -> tuple[buckets.Bucket, list[torch.Tensor]]:
    params = _params(*sizes)
    for i, p in enumerate(params):
        p.grad = torch.full_like(p, float(i + 1))
    return buckets.Bucket(0, tuple(params), "allreduce.bucket0.x+1"), params


def _copies(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many tensors each ``torch._foreach_copy_`` call copied, call by call."""
    calls: list[int] = []
    real = torch._foreach_copy_

    def counted(dst: list[torch.Tensor], src: list[torch.Tensor]) -> None:
        calls.append(len(dst))
        real(dst, src)

    monkeypatch.setattr(torch, "_foreach_copy_", counted)
    return calls


def test_gradients_become_views_of_the_buckets_own_buffer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bucket, params = _bucket_with_grads(3, 5, 2)
    copies = _copies(monkeypatch)
    flat = buckets.into_buffer(bucket, params)
    assert flat is not None and flat.numel() == 10
    assert flat.tolist() == [1.0] * 3 + [2.0] * 5 + [3.0] * 2  # backward's order kept
    assert copies == [3]
    for p, view in zip(params, bucket.views, strict=True):
        assert p.grad is view and p.grad.shape == p.shape
        assert p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr()
    flat.mul_(10)  # the reduction, in place: every gradient sees it, nothing copied back
    assert params[1].grad.tolist() == [20.0] * 5

    # accumulated in place (zero_grad(set_to_none=False)): nothing to copy the next time
    assert buckets.into_buffer(bucket, params) is flat and copies == [3]
    # one gradient replaced (set to None, then made anew by autograd): only it is copied
    params[2].grad = torch.full((2,), 7.0)
    assert buckets.into_buffer(bucket, params) is flat and copies == [3, 1]
    assert params[2].grad is bucket.views[2] and flat[8:].tolist() == [7.0, 7.0]


def test_a_bucket_that_cannot_hold_views_says_so_once() -> None:
    f32 = torch.zeros(4, requires_grad=True)
    f64 = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    f32.grad, f64.grad = torch.ones(4), torch.ones(4, dtype=torch.float64)
    bucket = buckets.Bucket(0, (f32, f64), "allreduce.bucket0.g+1")  # Horovod groups mix
    assert buckets.into_buffer(bucket, [f32, f64]) is None and not bucket.viewable
    assert f32.grad.untyped_storage().data_ptr() != f64.grad.untyped_storage().data_ptr()
    wide = torch.zeros(4, 6, requires_grad=True)
    tall = torch.zeros(6, 4).t().requires_grad_()  # a transposed parameter: strided
    wide.grad, tall.grad = torch.ones(4, 6), torch.ones(4, 6)
    assert buckets.into_buffer(buckets.Bucket(1, (wide, tall), "b"), [wide, tall]) is None
