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
