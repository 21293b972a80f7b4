"""The runtime's step counter: the batched path counts exactly as name-by-name does.

``completed_many`` takes shortcuts for a step's worth of names at a time (the cycle
completes thousands per step); any batch must give the count and state that calling
``completed`` for each name gives.
"""

from __future__ import annotations

import random

from hvdprof.runtime.steps import StepCounter


class _Op:
    """What the cycle completes: an object with a name (a response cache entry)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


def _replay(batches: list[list[str]]) -> list[tuple[int, bool, frozenset[str]]]:
    batched, single = StepCounter(), StepCounter()
    seen = []
    for batch in batches:
        batched.completed_many(batch)
        for name in batch:
            single.completed(name)
        assert (batched.step, batched._named, batched._seen) == (
            single.step,
            single._named,
            single._seen,
        ), f"after {batch!r}"
        seen.append((batched.step, batched._named, frozenset(batched._seen)))
    return seen


def test_a_step_of_named_gradients_per_batch_counts_one_step_per_repeat() -> None:
    names = [f"allreduce.grad.{i}" for i in range(2000)]
    states = _replay([names] * 5)
    assert [s[0] for s in states] == [0, 1, 2, 3, 4]


def test_a_batch_that_starts_mid_step_ends_the_step_at_its_first_repeat() -> None:
    names = [f"g{i}" for i in range(10)]
    states = _replay([names[:4], names[4:] + names[:3], names[3:] + names[:5]])
    assert [s[0] for s in states] == [0, 1, 2]


def test_random_batches_agree_with_name_by_name_counting() -> None:
    rng = random.Random(47)
    pool = [f"t{i}" for i in range(12)] + [f"allreduce.noname.{i}" for i in range(3)]
    for _ in range(300):
        batches = [
            [rng.choice(pool) for _ in range(rng.randint(0, 9))]
            if rng.random() < 0.5
            else rng.sample(pool[:12], rng.randint(0, 12))  # distinct, named: the shortcut
            for _ in range(rng.randint(1, 8))
        ]
        _replay(batches)


def test_the_same_ops_again_count_as_name_by_name() -> None:
    """``completed_ops`` skips the names when the batch is the very same op objects as the
    last: every sequence of batches, repeated or not, counts as one name at a time."""
    rng = random.Random(4747)
    pool = [_Op(f"t{i}") for i in range(10)] + [_Op(f"allreduce.noname.{i}") for i in range(2)]
    for _ in range(300):
        by_ops, single = StepCounter(), StepCounter()
        batch: list[_Op] = []
        for _ in range(rng.randint(1, 12)):
            roll = rng.random()
            if roll < 0.5 and batch:
                pass  # the same list object again: a cached step
            elif roll < 0.8:
                batch = rng.sample(pool[:10], rng.randint(1, 10))  # distinct, named
            else:
                batch = [rng.choice(pool) for _ in range(rng.randint(0, 6))]
            by_ops.completed_ops(batch)
            for op in batch:
                single.completed(op.name)
            assert (by_ops.step, by_ops._named, by_ops._seen) == (
                single.step,
                single._named,
                single._seen,
            ), [op.name for op in batch]


def test_a_cached_step_of_2000_ops_counts_one_step_each_time() -> None:
    ops = [_Op(f"allreduce.grad.{i}") for i in range(2000)]
    counter = StepCounter()
    for _ in range(6):
        counter.completed_ops(ops)
    assert counter.step == 5
