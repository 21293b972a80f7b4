"""Pure unit tests (no processes) of the runtime's deterministic pieces: fusion planning,
the response cache, the coordinator's verdicts and mismatch messages, Horovod's
reducescatter split, Config.from_env errors, and generated names."""

from __future__ import annotations

import itertools
import logging
import random
import threading

import pytest

from hvdprof.config import ENV_VARS, Config
from hvdprof.errors import ConfigError, HvdprofError
from hvdprof.runtime.collective_core import FusionBufferPool, UnpackViews, reducescatter_rows
from hvdprof.runtime.fusion import FusionKey, fusion_key, plan_fusion, signature_nbytes
from hvdprof.runtime.negotiation import (
    Coordinator,
    CoordinatorReply,
    RequestMeta,
    Response,
    ResponseCache,
)
from hvdprof.runtime.requests import OpType, ReduceOp, Signature
from hvdprof.runtime.runtime import NameAllocator

pytestmark = pytest.mark.timeout(60)


def sig(
    op: OpType = OpType.ALLREDUCE,
    dtype: str = "torch.float32",
    shape: tuple[int, ...] = (4,),
    reduce_op: ReduceOp = ReduceOp.SUM,
    root_rank: int = -1,
    prescale: float = 1.0,
    postscale: float = 1.0,
) -> Signature:
    return Signature(op, dtype, shape, reduce_op, root_rank, prescale, postscale, "cpu")


F32 = fusion_key(sig())
F64 = fusion_key(sig(dtype="torch.float64"))


# ================================================================== fusion
def indices(groups) -> list[list[int]]:
    return [g.indices for g in groups]


def test_fusion_packs_in_order_up_to_the_threshold() -> None:
    groups = plan_fusion([(F32, 10)] * 5, 25)
    assert indices(groups) == [[0, 1], [2, 3], [4]]
    assert [g.nbytes for g in groups] == [20, 20, 10]
    assert [g.fused for g in groups] == [True, True, False]


def test_fusion_exact_fit_shares_a_buffer() -> None:
    assert indices(plan_fusion([(F32, 10), (F32, 15), (F32, 1)], 25)) == [[0, 1], [2]]


def test_fusion_threshold_zero_disables_fusion() -> None:
    groups = plan_fusion([(F32, 4)] * 4, 0)
    assert indices(groups) == [[0], [1], [2], [3]]
    assert not any(g.fused for g in groups)


def test_fusion_large_tensor_gets_its_own_group_and_keeps_the_open_one() -> None:
    groups = plan_fusion([(F32, 10), (F32, 25), (F32, 10), (F32, 100)], 25)
    assert indices(groups) == [[0, 2], [1], [3]]  # ordered by their first item
    assert [g.fused for g in groups] == [True, False, False]


def test_fusion_never_mixes_keys() -> None:
    keys = [
        F32,
        F64,
        fusion_key(sig(reduce_op=ReduceOp.MAX)),
        fusion_key(sig(prescale=2.0)),
        fusion_key(sig(postscale=0.5)),
    ]
    items = [(keys[i % len(keys)], 4) for i in range(10)]
    groups = plan_fusion(items, 1 << 20)
    assert indices(groups) == [[i, i + 5] for i in range(5)]
    for g in groups:
        assert {items[i][0] for i in g.indices} == {g.key}


def test_fusion_of_nothing_is_nothing() -> None:
    assert plan_fusion([], 100) == []


@pytest.mark.parametrize("seed", range(20))
def test_fusion_plan_invariants(seed: int) -> None:
    rng = random.Random(seed)
    keys = [F32, F64, fusion_key(sig(reduce_op=ReduceOp.MIN))]
    items = [(rng.choice(keys), rng.choice([0, 1, 4, 8, 64, 100, 300])) for _ in range(60)]
    threshold = rng.choice([0, 1, 64, 128, 1000])
    groups = plan_fusion(items, threshold)
    assert sorted(i for g in groups for i in g.indices) == list(range(len(items)))
    assert [g.indices[0] for g in groups] == sorted(g.indices[0] for g in groups)
    for g in groups:
        assert g.indices == sorted(g.indices)
        assert all(items[i][0] == g.key for i in g.indices)
        assert g.nbytes == sum(items[i][1] for i in g.indices)
        if len(g.indices) > 1:
            assert threshold > 0 and g.nbytes <= threshold
            assert all(items[i][1] < threshold for i in g.indices)
    again = plan_fusion(list(items), threshold)  # identical on every rank
    assert indices(again) == indices(groups)


@pytest.mark.parametrize("seed", range(20))
def test_single_key_fast_plan_matches_the_general_loop(seed: int) -> None:
    """One key and no item at the threshold takes a bisecting fast path: same plan."""
    rng = random.Random(seed)
    threshold = rng.choice([2, 64, 1000, 4 << 20])
    sizes = [rng.randrange(1, threshold) for _ in range(rng.randrange(1, 300))]
    fast = plan_fusion([(F32, n) for n in sizes], threshold)
    # a trailing item with another key sends the same items through the general loop
    general = plan_fusion([(F32, n) for n in sizes] + [(F64, 1)], threshold)
    assert general[-1].key == F64 and general[-1].indices == [len(sizes)]
    assert [(g.indices, g.nbytes, g.key) for g in fast] == [
        (g.indices, g.nbytes, g.key) for g in general[:-1]
    ]


class _Member:
    """A cached op as the executor sees it: the unpacking reads only its size."""

    def __init__(self, numel: int) -> None:
        self.numel = numel


def test_unpack_views_are_made_once_per_group_and_follow_the_buffer() -> None:
    import torch

    pool = FusionBufferPool()
    unpack = UnpackViews(pool)
    cpu = torch.device("cpu")
    ops = [_Member(n) for n in (3, 1, 4, 2)]
    outs = [torch.zeros(op.numel) for op in ops]
    for step in range(3):  # the same group each step, new values each step
        flat = pool.get(cpu, torch.float32, 0, 10, 64)
        flat.copy_(torch.arange(10, dtype=torch.float32) + 100 * step)
        unpack.copy_out(flat, list(ops), outs)  # a new list each cycle, as the executor's
        got = torch.cat(outs)
        assert torch.equal(got, torch.arange(10, dtype=torch.float32) + 100 * step)
        assert len(unpack) == 1  # made at the first step, reused after
    kept_views = next(iter(unpack._kept.values()))[1]

    # another group in the same buffer (other members, or the same in another order)
    other = [ops[1], ops[0], ops[3], ops[2]]
    other_outs = [torch.zeros(op.numel) for op in other]
    flat = pool.get(cpu, torch.float32, 0, 10, 64)
    flat.copy_(-torch.arange(10, dtype=torch.float32))
    unpack.copy_out(flat, other, other_outs)
    assert [t.tolist() for t in other_outs] == [
        [-0.0],
        [-1.0, -2.0, -3.0],
        [-4.0, -5.0],
        [-6, -7, -8, -9],
    ]
    assert len(unpack) == 2
    unpack.copy_out(flat, list(ops), outs)  # the first group's views are still the same
    assert next(iter(unpack._kept.values()))[1] is kept_views

    # the pool replaces the buffer (a larger group, then a smaller one): the old is let go
    old_address = flat.data_ptr()
    pool.get(cpu, torch.float32, 0, 40, 64)
    flat = pool.get(cpu, torch.float32, 0, 10, 64)
    assert flat.data_ptr() != old_address
    flat.copy_(torch.full((10,), 7.0))
    unpack.copy_out(flat, list(ops), outs)
    assert torch.equal(torch.cat(outs), torch.full((10,), 7.0))
    assert [k[0] for k in unpack._kept] == [flat.data_ptr()]


def test_fusion_key_and_nbytes() -> None:
    s = sig(dtype="torch.float16", shape=(2, 3), reduce_op=ReduceOp.AVERAGE, prescale=0.5)
    assert fusion_key(s) == FusionKey("torch.float16", ReduceOp.AVERAGE, 0.5, 1.0, "cpu", 0)
    assert fusion_key(s._replace(process_set=2)) != fusion_key(s)  # sets never share a buffer
    sizes = {
        "torch.float16": 2,
        "torch.bfloat16": 2,
        "torch.float32": 4,
        "torch.float64": 8,
        "torch.int8": 1,
        "torch.uint8": 1,
        "torch.int32": 4,
        "torch.int64": 8,
    }
    for dtype, itemsize in sizes.items():
        assert signature_nbytes(sig(dtype=dtype, shape=(2, 3))) == 6 * itemsize
        assert signature_nbytes(sig(dtype=dtype, shape=())) == itemsize
        assert signature_nbytes(sig(dtype=dtype, shape=(0, 5))) == 0


# ================================================================== response cache
def test_cache_assigns_lowest_free_bits_and_reuses_them() -> None:
    cache = ResponseCache(10)
    assert [cache.put(n, sig()) for n in "abcd"] == [0, 1, 2, 3]
    assert len(cache) == 4 and cache.width == 4
    assert cache.bit("c") == 2 and cache.bit("zzz") == -1
    assert cache.lookup("b") == (1, sig())
    assert cache.lookup("zzz") is None
    assert cache.evict("c") == 2 and cache.evict("a") == 0
    assert cache.evict("a") == -1  # already gone
    assert cache.width == 4  # bits are not renumbered
    assert cache.put("e", sig()) == 0  # lowest free first
    assert cache.put("f", sig()) == 2
    assert cache.put("g", sig()) == 4
    assert cache.entry(4).name == "g" and cache.entry(4).nbytes == 16


def test_cache_put_of_a_known_name_updates_its_signature_in_place() -> None:
    cache = ResponseCache(4)
    cache.put("a", sig())
    assert cache.put("a", sig(shape=(8,))) == 0
    assert cache.lookup("a") == (0, sig(shape=(8,)))
    assert cache.entry(0).nbytes == 32
    assert len(cache) == 1


def test_cache_capacity() -> None:
    cache = ResponseCache(2)
    assert cache.put("a", sig()) == 0 and cache.put("b", sig()) == 1
    assert cache.put("c", sig()) == -1
    assert cache.bit("c") == -1 and len(cache) == 2
    assert ResponseCache(0).put("a", sig()) == -1


def test_cache_clear_and_empty_entry() -> None:
    cache = ResponseCache(4)
    for n in "abc":
        cache.put(n, sig())
    assert sorted(cache.clear()) == ["a", "b", "c"]
    assert len(cache) == 0
    with pytest.raises(AssertionError):
        cache.entry(0)


def test_cache_apply_evicts_first_then_adds_cacheable_responses() -> None:
    cache = ResponseCache(8)
    cache.put("old", sig())
    reply = CoordinatorReply(
        responses=[
            Response("new", sig(), cacheable=True),
            Response("failed", sig(), error="boom", cacheable=False),
            Response("old", sig(shape=(2,)), cacheable=True),
        ],
        evicted=["old"],
    )
    cache.apply(reply, enabled=True)
    assert cache.bit("new") == 0  # "old" freed bit 0 before "new" was added
    assert cache.bit("old") == 1 and cache.lookup("old") == (1, sig(shape=(2,)))
    assert cache.bit("failed") == -1
    disabled = ResponseCache(8)
    disabled.put("old", sig())
    disabled.apply(reply, enabled=False)  # evictions still apply, nothing is added
    assert len(disabled) == 0


def test_cache_replicas_agree_bit_for_bit() -> None:
    rng = random.Random(3)
    a, b = ResponseCache(16), ResponseCache(16)
    for _ in range(500):
        name = f"t{rng.randrange(30)}"
        if rng.random() < 0.4:
            assert a.evict(name) == b.evict(name)
        else:
            assert a.put(name, sig()) == b.put(name, sig())
        assert a.width == b.width
    assert {n: a.bit(n) for n in map("t{}".format, range(30))} == {
        n: b.bit(n) for n in map("t{}".format, range(30))
    }


# ================================================================== coordinator
def meta(name: str, s: Signature, splits=None) -> RequestMeta:
    return RequestMeta(name, s, splits)


def run(coord: Coordinator, per_rank: dict[int, Signature], name: str = "x", **kw) -> Response:
    reply = coord.handle(
        kw.get("cycle", 1),
        [(r, [meta(name, s, kw.get("splits", {}).get(r))]) for r, s in per_rank.items()],
        kw.get("joined", frozenset()),
        kw.get("cache", ResponseCache(8)),
        kw.get("cache_enabled", True),
        0.0,
    )
    assert len(reply.responses) == 1, reply
    return reply.responses[0]


def test_coordinator_waits_for_every_rank() -> None:
    coord = Coordinator(3)
    cache = ResponseCache(8)
    reply = coord.handle(
        5, [(0, [meta("x", sig())]), (2, [meta("x", sig())])], frozenset(), cache, True, 1.5
    )
    assert reply.responses == []
    assert coord.pending() == {"x": (frozenset({0, 2}), 1.5)}
    reply = coord.handle(7, [(1, [meta("x", sig())])], frozenset(), cache, True, 2.0)
    [response] = reply.responses
    assert response.name == "x" and response.error is None and response.cacheable
    assert response.ready_cycles == {0: 5, 1: 7, 2: 5}
    assert coord.pending() == {}


def test_coordinator_replies_in_a_fixed_order() -> None:
    coord = Coordinator(2)
    names = [f"t{i}" for i in range(6)]
    reply = coord.handle(
        1,
        [(0, [meta(n, sig()) for n in names]), (1, [meta(n, sig()) for n in reversed(names)])],
        frozenset(),
        ResponseCache(8),
        True,
        0.0,
    )
    assert [r.name for r in reply.responses] == names  # rank 0's order


def test_mismatch_message_names_the_tensor_field_ranks_and_values() -> None:
    response = run(
        Coordinator(3), {0: sig(shape=(2,)), 1: sig(shape=(3,)), 2: sig(shape=(4, 1))}, "grad.w"
    )
    assert response.error is not None and not response.cacheable
    text = response.error
    assert "allreduce" in text and "'grad.w'" in text
    assert "shape: rank 0 has [2], rank 1 has [3], rank 2 has [4, 1]" in text


def test_mismatch_message_lists_only_disagreeing_ranks_and_every_field() -> None:
    response = run(
        Coordinator(3),
        {
            0: sig(),
            1: sig(),
            2: sig(dtype="torch.float64", reduce_op=ReduceOp.MAX),
        },
    )
    text = response.error
    assert "dtype: rank 0 has 'torch.float32', rank 2 has 'torch.float64'" in text
    assert "reduce_op: rank 0 has SUM, rank 2 has MAX" in text
    assert "rank 1" not in text


@pytest.mark.parametrize(
    ("field", "a", "b", "shown"),
    [
        (
            "root_rank",
            sig(OpType.BROADCAST, root_rank=0),
            sig(OpType.BROADCAST, root_rank=1),
            ("0", "1"),
        ),
        ("prescale", sig(prescale=1.0), sig(prescale=2.0), ("1.0", "2.0")),
        ("postscale", sig(postscale=1.0), sig(postscale=0.5), ("1.0", "0.5")),
        (
            "op",
            sig(OpType.ALLREDUCE),
            sig(OpType.BROADCAST, root_rank=0),
            ("ALLREDUCE", "BROADCAST"),
        ),
    ],
)
def test_mismatch_message_per_field(field: str, a: Signature, b: Signature, shown) -> None:
    text = run(Coordinator(2), {0: a, 1: b}).error
    assert text is not None
    assert f"{field}: rank 0 has {shown[0]}, rank 1 has {shown[1]}" in text, text


def test_allgather_and_alltoall_allow_different_first_dims() -> None:
    response = run(
        Coordinator(3),
        {r: sig(OpType.ALLGATHER, shape=(r + 1, 2)) for r in range(3)},
    )
    assert response.error is None and response.first_dims == (1, 2, 3)
    assert not response.cacheable  # outputs depend on every rank's sizes
    splits = {0: (1, 0), 1: (2, 2)}
    response = run(
        Coordinator(2),
        {0: sig(OpType.ALLTOALL, shape=(1, 3)), 1: sig(OpType.ALLTOALL, shape=(4, 3))},
        splits=splits,
    )
    assert response.error is None and response.splits == ((1, 0), (2, 2))
    assert response.first_dims == (1, 4) and not response.cacheable


def test_allgather_trailing_dims_must_agree() -> None:
    response = run(
        Coordinator(2),
        {0: sig(OpType.ALLGATHER, shape=(2, 3)), 1: sig(OpType.ALLGATHER, shape=(2, 4))},
    )
    assert "shape (all but the first dimension): rank 0 has [2, 3], rank 1 has [2, 4]" in (
        response.error or ""
    )


def test_joined_ranks_complete_allreduce_but_not_other_ops() -> None:
    coord = Coordinator(3)
    response = run(coord, {0: sig(), 2: sig()}, joined=frozenset({1}))
    assert response.error is None and response.joined == (1,)
    assert not response.cacheable  # a joined rank's zeros are not a normal submission
    response = run(coord, {0: sig(OpType.BROADCAST, root_rank=0)}, "b", joined=frozenset({1, 2}))
    assert response.error is not None and "join" in response.error and "[1, 2]" in response.error


def test_cacheable_only_when_enabled_and_cacheable_op() -> None:
    assert run(Coordinator(2), {0: sig(), 1: sig()}).cacheable
    assert not run(Coordinator(2), {0: sig(), 1: sig()}, cache_enabled=False).cacheable
    barrier = sig(OpType.BARRIER, dtype="none", shape=())
    assert not run(Coordinator(2), {0: barrier, 1: barrier}).cacheable
    rs = sig(OpType.REDUCESCATTER, shape=(4, 2))
    assert run(Coordinator(2), {0: rs, 1: rs}).cacheable


def test_a_cached_name_sent_to_the_coordinator_is_evicted_once() -> None:
    cache = ResponseCache(8)
    cache.put("x", sig())
    coord = Coordinator(2)
    reply = coord.handle(
        1,
        [(0, [meta("x", sig(shape=(8,)))]), (1, [meta("x", sig(shape=(8,)))])],
        frozenset(),
        cache,
        True,
        0.0,
    )
    assert reply.evicted == ["x"]
    assert reply.responses[0].signature == sig(shape=(8,))


# ================================================================== reducescatter split
@pytest.mark.parametrize(
    ("rows", "size", "expected"),
    [
        (5, 2, [(0, 3), (3, 5)]),
        (7, 3, [(0, 3), (3, 5), (5, 7)]),
        (6, 3, [(0, 2), (2, 4), (4, 6)]),
        (1, 3, [(0, 1), (1, 1), (1, 1)]),
        (0, 2, [(0, 0), (0, 0)]),
        (4, 1, [(0, 4)]),
    ],
)
def test_reducescatter_rows_examples(rows: int, size: int, expected) -> None:
    assert [reducescatter_rows(rows, size, r) for r in range(size)] == expected


@pytest.mark.parametrize("size", range(1, 8))
def test_reducescatter_rows_cover_evenly_with_extra_rows_to_low_ranks(size: int) -> None:
    for rows in range(0, 40):
        ranges = [reducescatter_rows(rows, size, r) for r in range(size)]
        assert ranges[0][0] == 0 and ranges[-1][1] == rows
        for (_, stop), (start, _) in itertools.pairwise(ranges):
            assert stop == start  # contiguous, in rank order
        counts = [b - a for a, b in ranges]
        assert max(counts) - min(counts) <= 1
        assert counts == sorted(counts, reverse=True)  # the extra rows go to low ranks


# ================================================================== Config.from_env
def test_config_defaults_from_an_empty_environment_match_the_registry() -> None:
    """The registry's defaults are what `hvdprof env` and the README document."""
    config = Config.from_env({})
    assert config == Config()
    assert config.explicitly_set == frozenset()
    for var in ENV_VARS:
        assert getattr(config, var.attr) == var.default, var.name


def test_config_parses_valid_values() -> None:
    config = Config.from_env(
        {
            "HVDPROF_FUSION_THRESHOLD": "0x40",
            "HVDPROF_CACHE_CAPACITY": "1_000",
            "HVDPROF_CYCLE_TIME": " 2.5 ",
            "HVDPROF_TIMELINE_GZIP": "yes",
            "HVDPROF_LOG_LEVEL": "DEBUG",
            "HVDPROF_TIMELINE_STEPS": "3-7",
        }
    )
    assert config.fusion_threshold_bytes == 64
    assert config.cache_capacity == 1000
    assert config.cycle_time_ms == 2.5
    assert config.timeline_gzip is True
    assert config.log_level == "debug"
    assert config.timeline_steps == (3, 7)
    assert "HVDPROF_CYCLE_TIME" in config.explicitly_set
    assert "HVDPROF_RANK" not in config.explicitly_set


@pytest.mark.parametrize(
    ("name", "value", "accepts"),
    [
        ("HVDPROF_FUSION_THRESHOLD", "abc", "an integer"),
        ("HVDPROF_FUSION_THRESHOLD", "-1", "an integer >= 0"),
        ("HVDPROF_FUSION_THRESHOLD", "1.5", "an integer"),
        ("HVDPROF_CYCLE_TIME", "-1", "a number >= 0"),
        ("HVDPROF_CYCLE_TIME", "fast", "a number"),
        ("HVDPROF_CYCLE_TIME", "nan", "finite"),
        ("HVDPROF_CYCLE_TIME", "inf", "finite"),
        ("HVDPROF_COLLECTIVE_TIMEOUT_SECONDS", "0", ">= 0.001"),
        ("HVDPROF_MAX_INFLIGHT", "0", ">= 1"),
        ("HVDPROF_SIZE", "0", ">= 1"),
        ("HVDPROF_RANK", "-2", ">= 0"),
        ("HVDPROF_LOG_LEVEL", "loud", "one of debug, info, warning, error"),
        ("HVDPROF_BACKEND", "nccl", "one of auto, gloo"),
        ("HVDPROF_TIMELINE_GZIP", "maybe", "1/0"),
        ("HVDPROF_TIMELINE_STEPS", "7-3", "START-END"),
        ("HVDPROF_TIMELINE_STEPS", "x-y", "START-END"),
        ("HVDPROF_STALL_SHUTDOWN_TIME_SECONDS", "-3", ">= 0"),
    ],
)
def test_config_error_names_the_variable_and_what_it_accepts(
    name: str, value: str, accepts: str
) -> None:
    with pytest.raises(ConfigError) as info:
        Config.from_env({name: value})
    text = str(info.value)
    assert text.startswith(f"{name}={value!r} is malformed"), text
    assert accepts in text, text
    assert isinstance(info.value, ValueError) and isinstance(info.value, HvdprofError)


def test_config_error_names_the_first_bad_variable_even_among_good_ones() -> None:
    with pytest.raises(ConfigError, match="HVDPROF_CACHE_CAPACITY"):
        Config.from_env(
            {"HVDPROF_CYCLE_TIME": "2", "HVDPROF_CACHE_CAPACITY": "lots", "PATH": "/bin"}
        )


def test_config_warns_about_unknown_variables(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="hvdprof"):
        config = Config.from_env({"HVDPROF_FUSION_TRESHOLD": "1"})  # sic
    assert config.fusion_threshold_bytes == Config().fusion_threshold_bytes
    assert "HVDPROF_FUSION_TRESHOLD" in caplog.text


def test_config_is_immutable() -> None:
    config = Config.from_env({})
    with pytest.raises(AttributeError):
        config.cycle_time_ms = 5.0  # type: ignore[misc]
    assert config.replace(cycle_time_ms=5.0).cycle_time_ms == 5.0


# ================================================================== generated names
def test_names_are_the_lowest_free_slot_per_kind() -> None:
    names = NameAllocator()
    a, release_a = names.allocate("allreduce")
    b, release_b = names.allocate("allreduce")
    g, _ = names.allocate("allgather")
    assert (a, b, g) == ("allreduce.noname.0", "allreduce.noname.1", "allgather.noname.0")
    release_a()
    assert names.allocate("allreduce")[0] == "allreduce.noname.0"
    assert names.allocate("allreduce")[0] == "allreduce.noname.2"
    release_b()
    assert names.allocate("allreduce")[0] == "allreduce.noname.1"


def test_a_blocking_loop_reuses_one_name() -> None:
    names = NameAllocator()
    seen = set()
    for _ in range(100):
        name, release = names.allocate("broadcast")
        seen.add(name)
        release()
    assert seen == {"broadcast.noname.0"}


def test_names_stay_unique_across_threads() -> None:
    names = NameAllocator()
    out: list[str] = []
    lock = threading.Lock()

    def work() -> None:
        mine = [names.allocate("allreduce")[0] for _ in range(200)]
        with lock:
            out.extend(mine)

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == len(set(out)) == 1600
    assert set(out) == {f"allreduce.noname.{i}" for i in range(1600)}
