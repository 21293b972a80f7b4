"""The cycle's reduced reply and the tree of control messages (HVDPROF_CONTROL_FANOUT).

First the pieces, with ranks as threads on real sockets: rank 0's reply read back on
every rank, the tree's exchange, gather and broadcast equal to the star's, a lost peer
reported. Then whole jobs as real processes through ``hvdprof run`` with a tree of
fan-out 2 (inner ranks relaying for others; the errors worker's 3 ranks as a chain): the ops and join, the response cache,
mismatched shapes, process sets, the stall inspector naming a rank below an inner
rank, and every rank's timeline carrying the other ranks' readiness marks.
"""

from __future__ import annotations

import json
import pickle
import signal
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import WORKERS, run_job, start_ranks
from test_control_channel import DictStore
from test_failures import SURVIVOR_EXIT, collect

from hvdprof.runtime.control import ControlChannel, ControlError, tree_links
from hvdprof.runtime.cycle_header import (
    COMMAND,
    DETAILED,
    DIRECTIVE,
    HEADER,
    JOINED,
    QUIET_BUSY,
    SHUTDOWN,
    WORK,
    OwnHeader,
    Said,
    reduce,
    reply_size,
)
from hvdprof.runtime.negotiation import (
    MERGED_REQUESTS_VERSION,
    Coordinator,
    MergedRequestsError,
    RequestMeta,
    ResponseCache,
    merge_requests,
    read_merged,
)
from hvdprof.runtime.requests import OpType, ReduceOp, Signature

TREE = {"HVDPROF_CONTROL_FANOUT": "2"}


def on_every_rank(
    size: int, fanout: int, fn: Callable[[ControlChannel], Any], op_timeout_s: float = 10
) -> list[Any]:
    """``size`` channels of fan-out ``fanout``, ``fn`` on each in its own thread."""
    store = DictStore()
    results: list[Any] = [None] * size

    def rank_main(rank: int) -> None:
        channel = ControlChannel.connect(rank, size, store, "127.0.0.1", 10, op_timeout_s, fanout)
        try:
            results[rank] = fn(channel)
        except BaseException as exc:  # returned, with the rank's place
            results[rank] = exc
        finally:
            channel.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a rank hung"
    return results


# ------------------------------------------------------------------------- the layout
@pytest.mark.parametrize(
    ("size", "fanout"), [(2, 0), (5, 0), (3, 1), (7, 2), (10, 3), (64, 8), (9, 8)]
)
def test_every_rank_has_one_parent_and_subtrees_are_contiguous(size: int, fanout: int) -> None:
    links = [tree_links(r, size, fanout) for r in range(size)]
    assert links[0][0] == -1 and links[0][1] == size
    reached = {0}
    for rank, (_, end, children) in enumerate(links):
        assert len(children) <= (fanout if 1 <= fanout < size - 1 else size - 1)
        assert sum(b - a for a, b in children) == end - rank - 1
        for a, b in children:
            assert links[a][0] == rank and links[a][1] == b
            reached.add(a)
    assert reached == set(range(size))
    if fanout in (0, size - 1) or fanout >= size - 1:
        assert all(links[r][0] == 0 for r in range(1, size))  # the star


# ------------------------------------------------------------------------ the reply
def _matrix(rows: list[dict[str, Any]], bits: list[list[int]]) -> np.ndarray:
    matrix = np.zeros((len(rows), HEADER + len(bits[0])), dtype=np.uint8)
    for r, row in enumerate(rows):
        OwnHeader(**row).write(matrix[r, :HEADER])
        matrix[r, HEADER:] = bits[r]
    return matrix


def test_the_reply_says_what_every_rank_needs_in_a_few_bytes() -> None:
    rows = [
        {"command": True, "directive": True},
        {"joined": True, "command": True},
        {"payload_len": 300, "command": True},
        {"shutdown": True, "command": True},
        {"command": True},
        {"command": True, "payload_len": 1},
        {"joined": True, "command": True},
        {"command": True},
        {"command": True},
    ]
    bits = [[1, 1, 0, 1]] * 9
    bits = [list(b) for b in bits]
    bits[1] = [0, 0, 0, 0]  # a joined rank's bits do not hold the others back
    bits[4] = [1, 0, 0, 1]
    matrix = _matrix(rows, bits)
    reply = reduce(matrix, WORK)
    assert reply.nbytes == reply_size(9, matrix.shape[1]) == 2 + 4 + 3 * 2
    said = Said.read(reply, 9, None)
    assert said.kind == WORK and said.matrix is None
    assert said.joined == frozenset({1, 6}) and said.any_active
    assert said.shutdown_ranks.tolist() == [3]
    assert said.news.tolist() == [2, 5] and said.lengths(9) == [0, 0, 1, 0, 0, 1, 0, 0, 0]
    assert said.every_rank_commands and said.directive and said.any_bit
    assert said.ready.tolist() == [1, 0, 0, 1]  # AND over the ranks that have not joined


def test_the_matrix_follows_only_when_a_rank_records_readiness() -> None:
    rows: list[dict[str, Any]] = [{}, {}, {"detailed": True}]
    matrix = _matrix(rows, [[1], [0], [1]])
    reply = reduce(matrix, WORK)
    said = Said.read(reply, 3, matrix)
    assert not said.every_rank_commands and not said.directive and said.any_bit
    assert said.ready.tolist() == [0] and said.joined == frozenset()
    assert reply[1] & 32  # FULL
    assert not reduce(_matrix([{}, {}, {}], [[1], [0], [1]]), WORK)[1] & 32
    # every active rank's bits agree: each showed them in this cycle, which the reply says
    agreed = reduce(_matrix(rows, [[1], [1], [1]]), WORK)
    assert not agreed[1] & 32 and Said.read(agreed, 3, None).ready.tolist() == [1]
    assert not Said.read(agreed, 3, None).full and Said.read(reply, 3, matrix).full
    # a rank inside join(): the rows differ in meaning, so the matrix goes along
    joined = _matrix([{}, {"joined": True}, {"detailed": True}], [[1], [1], [1]])
    assert reduce(joined, WORK)[1] & 32
    everyone_joined = _matrix([{"joined": True}] * 2, [[1], [1]])
    said = Said.read(reduce(everyone_joined, WORK), 2, None)
    assert not said.any_active and said.ready.tolist() == [0]
    quiet = reduce(matrix, QUIET_BUSY)
    assert Said.read(quiet, 3, None).kind == QUIET_BUSY
    assert matrix[2, DETAILED] == 1 and not matrix[:, [SHUTDOWN, JOINED, COMMAND, DIRECTIVE]].any()


# ------------------------------------------------------------------ the channel's tree
@pytest.mark.parametrize(("size", "fanout"), [(7, 2), (10, 3), (5, 0)])
def test_tree_exchange_gather_and_broadcast_match_the_star(size: int, fanout: int) -> None:
    def run(ch: ControlChannel) -> dict[str, Any]:
        out: dict[str, Any] = {"tree": ch.is_tree}
        for width in (HEADER + 3, HEADER + 3, HEADER + 20):
            send = ch.send_buffer(width)
            OwnHeader(detailed=ch.rank == size - 1).write(send[:HEADER])
            send[HEADER:] = (np.arange(width - HEADER) + ch.rank) % 2
            reply, matrix = ch.exchange(lambda m: reduce(m, WORK))
            out[f"ready{width}"] = Said.read(reply, size, matrix).ready.tolist()
            out[f"matrix{width}"] = None if matrix is None else matrix.copy()
        lengths = [1 if r % 3 != 1 else 0 for r in range(size)]
        payload = f"from {ch.rank}".encode() * (ch.rank + 1) if lengths[ch.rank] else b""
        out["gathered"] = ch.gather_bytes(payload, lengths)
        out["nobody"] = ch.gather_bytes(b"", [0] * size)
        out["broadcast"] = ch.broadcast_bytes(b"x" * 70000 if ch.rank == 0 else None)
        ch.barrier()
        return out

    results = on_every_rank(size, fanout, run)
    for rank, out in enumerate(results):
        assert not isinstance(out, BaseException), (rank, out)
        assert out["tree"] == (fanout != 0)
        for width in (HEADER + 3, HEADER + 20):
            rows = np.stack([(np.arange(width - HEADER) + r) % 2 for r in range(size)])
            assert out[f"ready{width}"] == rows.min(axis=0).tolist()
            # the last rank asked for the matrix: every rank has it, exactly
            np.testing.assert_array_equal(out[f"matrix{width}"][:, HEADER:], rows)
        expected = [f"from {r}".encode() * (r + 1) if r % 3 != 1 else b"" for r in range(size)]
        assert out["gathered"] == (expected if rank == 0 else None)
        assert out["nobody"] == ([b""] * size if rank == 0 else None)
        assert out["broadcast"] == b"x" * 70000


def _requests_of(rank: int, size: int) -> list[RequestMeta]:
    """Rank ``rank``'s new names in one cycle: shared names, an allgather whose first
    dimension is the rank's, a name only the even ranks send, and a name whose shape
    rank 5 (under an inner rank) disagrees on."""
    sig = Signature(OpType.ALLREDUCE, "float32", (4,), ReduceOp.SUM, 0, 1.0, 1.0, "cpu", 0)
    out = [RequestMeta(f"grad.{i}", sig) for i in range(3)]
    out.append(RequestMeta("gathered", sig._replace(op=OpType.ALLGATHER, shape=(rank + 1, 2))))
    if rank % 2 == 0:
        out.append(RequestMeta("even", sig))
    bad = sig._replace(shape=(5,)) if rank == 5 else sig
    out.append(RequestMeta("shape", bad))
    return out


@pytest.mark.parametrize(("size", "fanout"), [(7, 2), (10, 3), (3, 1)])
def test_merged_requests_give_the_stars_verdicts(size: int, fanout: int) -> None:
    """Two cycles of new names (the odd ranks send "even" in neither): merged up the
    tree, rank 0's coordinator gives the same responses, in the same order, with the
    same errors, first dimensions and per-rank cycles as from every rank's own list
    through the star."""

    def run(ch: ControlChannel) -> Any:
        coordinator = Coordinator(ch.size) if ch.rank == 0 else None
        replies = []
        for cycle in (4, 5):
            metas = _requests_of(ch.rank, ch.size) if cycle == 4 else []
            if cycle == 5 and ch.rank % 2:
                metas = [RequestMeta("even", _requests_of(0, ch.size)[0].signature)]
            payload = pickle.dumps(metas) if metas else b""
            lengths = [1 if r % 2 or cycle == 4 else 0 for r in range(ch.size)]
            merged = ch.gather_merged(payload, lengths, merge_requests)
            if coordinator is not None:
                assert merged is not None and merged[0] == MERGED_REQUESTS_VERSION
                groups = read_merged(merged)
                reply = coordinator.handle_merged(
                    cycle, groups, frozenset(), ResponseCache(8), True, 0.0
                )
                replies.append((len(groups), reply))
            else:
                assert merged is None
        return replies

    results = on_every_rank(size, fanout, run)
    assert all(not isinstance(r, BaseException) for r in results), results
    star = Coordinator(size)
    expected = []
    for cycle in (4, 5):
        messages = []
        for r in range(size):
            if cycle == 4:
                messages.append((r, _requests_of(r, size)))
            elif r % 2:
                messages.append((r, [RequestMeta("even", _requests_of(0, size)[0].signature)]))
        expected.append(star.handle(cycle, messages, frozenset(), ResponseCache(8), True, 0.0))
    for (_, got), want in zip(results[0], expected, strict=True):
        assert [x.name for x in got.responses] == [x.name for x in want.responses]
        for a, b in zip(got.responses, want.responses, strict=True):
            assert (a.error, a.first_dims, a.cacheable) == (b.error, b.first_dims, b.cacheable)
            assert a.ready_cycles == b.ready_cycles
    first, second = expected
    names = ["grad.0", "grad.1", "grad.2", "gathered", "shape"]
    assert [x.name for x in first.responses] == names
    assert first.responses[3].first_dims == tuple(range(1, size + 1))
    assert (first.responses[4].error is not None) == (size > 5)
    if size > 5:
        assert "shape: rank 0 has [4], rank 5 has [5]" in str(first.responses[4].error)
    assert [x.name for x in second.responses] == ["even"]
    assert second.responses[0].ready_cycles[0] == 4 and second.responses[0].ready_cycles[1] == 5
    # rank 0 read one entry per distinct request: 3 grads, one allgather per first
    # dimension, "even", and "shape" once per shape
    assert results[0][0][0] == 3 + size + 1 + 1 + (size > 5)


def test_a_merged_block_of_another_version_is_refused() -> None:
    block = merge_requests([(0, pickle.dumps(_requests_of(0, 2)))])
    with pytest.raises(MergedRequestsError, match=r"wire version 1, .* reads version 2"):
        read_merged(b"\x01" + block[1:])


def test_without_a_request_workers_get_only_the_reply() -> None:
    def run(ch: ControlChannel) -> tuple[list[int], bool]:
        send = ch.send_buffer(HEADER + 2)
        OwnHeader().write(send[:HEADER])
        send[HEADER:] = 1
        reply, matrix = ch.exchange(lambda m: reduce(m, WORK))
        return Said.read(reply, ch.size, matrix).ready.tolist(), matrix is None

    results = on_every_rank(7, 2, run)
    assert [r[0] for r in results] == [[1, 1]] * 7
    assert [r[1] for r in results] == [False] + [True] * 6  # rank 0 alone holds the matrix


def test_a_lost_rank_below_an_inner_rank_fails_every_rank() -> None:
    """Rank 3 (a leaf under rank 1 at fan-out 2) leaves: no rank waits for the timeout."""

    def run(ch: ControlChannel) -> str:
        send = ch.send_buffer(HEADER)
        send[:] = 0
        ch.exchange(lambda m: reduce(m, WORK))
        if ch.rank == 3:
            return "left"
        try:
            for _ in range(3):
                ch.exchange(lambda m: reduce(m, WORK))
        except ControlError as exc:
            return str(exc)
        return "no error"

    assert tree_links(3, 7, 2)[0] == 1
    results = on_every_rank(7, 2, run, op_timeout_s=20)
    assert results[3] == "left"
    others = [r for i, r in enumerate(results) if i != 3]
    assert all(isinstance(r, str) and "rank" in r for r in others), results
    assert "rank 3" in results[1], results[1]  # its parent names it


# ------------------------------------------------------------- jobs with real processes
pytestmark = pytest.mark.timeout(420)


def test_ops_join_and_cache_through_a_tree(tmp_path: Path) -> None:
    sections = ("allreduce_async_many", "names_and_cache", "many_in_flight_fusion", "join")
    result = run_job("ops_worker.py", 5, str(tmp_path), env=TREE, timeout=300)
    for section in sections:
        result.assert_section(section, 5)
    result.assert_done(5)


def test_mismatches_and_join_errors_through_a_chain() -> None:
    """The errors worker is written for 3 ranks: fan-out 1 makes them a chain 0-1-2."""
    env = {
        "HVDPROF_CONTROL_FANOUT": "1",
        "HVDPROF_START_TIMEOUT_SECONDS": "30",
        "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "30",
    }
    result = run_job("errors_worker.py", 3, env=env, timeout=240)
    for section in ("mismatch_shape", "mismatch_op", "mismatch_cached_name", "join_with_other_ops"):
        result.assert_section(section, 3)
    result.assert_done(3)


def test_process_sets_through_a_tree() -> None:
    result = run_job("process_sets_worker.py", 5, "ops", env=TREE, timeout=240)
    assert result.returncode == 0, result.describe()
    for rank in range(5):
        assert any(line.startswith("OK") for line in result.lines(rank)), result.describe()


def test_the_stall_inspector_names_a_rank_below_an_inner_rank() -> None:
    """At 5 ranks and fan-out 2, rank 4 is a leaf under rank 3: rank 0 still sees its
    row, and names it, on the coordinator's path and the cache's."""
    late = 4
    assert tree_links(late, 5, 2)[0] != 0
    env = {**TREE, "HVDPROF_STALL_CHECK_TIME_SECONDS": "2"}
    result = run_job("stall_worker.py", 5, "warn", str(late), env=env, timeout=240)
    result.assert_done(5)
    warnings = [line for line in result.lines(0, "stderr") if "stall" in line]
    for name in ("stall.fresh", "stall.cached"):
        wanted = f"rank {late} has not submitted {name!r}"
        assert any(wanted in w for w in warnings), (wanted, result.text(0, "stderr"))


def test_the_tree_gives_the_stars_results_and_readiness(tmp_path: Path) -> None:
    """The timeline's readiness marks need every rank's bits: a recording rank asks for
    the matrix and gets it down the tree; new names are merged on the way up. Rank 1 (an
    inner rank at 5 ranks and fan-out 2) submits 0.3 s late in two steps (step 0 on the
    coordinator's path, step 3 on the cache's). The same job through the star and the
    tree: every sum checks (the worker's sections), and every rank's trace has the same
    ops, each cached or not alike, naming rank 1 as the last rank ready where it was
    late, which only the per-rank bits and cycles can tell."""
    from test_timeline_e2e import GRAD_NAMES, STRAGGLE_STEPS, STRAGGLER, load_strict, op_units

    seen: dict[str, list[dict[str, list[tuple[bool, int | None]]]]] = {}
    for topology, fanout in (("star", "0"), ("tree", "2")):
        out = tmp_path / topology
        env = {"HVDPROF_CONTROL_FANOUT": fanout, "HVDPROF_TIMELINE": str(out / "init")}
        result = run_job("timeline_worker.py", 5, "main", str(out), env=env, timeout=300)
        assert result.returncode == 0, result.describe()
        seen[topology] = []
        for rank in range(5):
            units = op_units(load_strict(out / "init" / f"rank.{rank}.json"))
            by_name: dict[str, list[tuple[bool, int | None]]] = {n: [] for n in GRAD_NAMES}
            for u in units:
                args = u["negotiate"]["args"]
                if args["tensor"] in by_name:
                    k = len(by_name[args["tensor"]])
                    late = args["last_ready_rank"] if k in STRAGGLE_STEPS else None
                    by_name[args["tensor"]].append((bool(args["cached"]), late))
            for name in GRAD_NAMES:
                for k in STRAGGLE_STEPS:
                    assert by_name[name][k][1] == STRAGGLER, (topology, rank, name, k)
            assert any(c for ops in by_name.values() for c, _ in ops), f"rank {rank}: none cached"
            seen[topology].append(by_name)
    assert seen["tree"] == seen["star"]


def test_a_rank_with_another_fanout_is_refused_by_name() -> None:
    store = DictStore()
    store.set("hvdprof/control/fanout", "2")  # what rank 0 published
    with pytest.raises(ControlError, match="HVDPROF_CONTROL_FANOUT is 0 on rank 3 but 2 on rank 0"):
        ControlChannel.connect(3, 5, store, "127.0.0.1", 1, 1, 0)


# ----------------------------------------------------------- a rank lost from the tree
def _start_ranks(num_proc: int, args: list[str], env: dict[str, str]) -> list[Any]:
    return start_ranks(WORKERS / "tree_failure_worker.py", num_proc, args, env, 140)


@pytest.mark.parametrize(
    ("victim", "step"),
    [(3, 0), (4, 20)],
    ids=["inner-rank-killed-before-its-first-op", "leaf-killed-on-the-cache-path"],
)
def test_a_rank_killed_in_the_tree_fails_every_survivor_by_name(victim: int, step: int) -> None:
    """At 5 ranks and fan-out 2, rank 3 relays for rank 4. Killed early (rank 3, while
    the others negotiate new names merged up the tree) or late (rank 4, on the cache's
    path), every survivor raises on its own, long before the collective timeout (no
    hang), the victim's neighbours name it, and rank 0 names it or the rank relaying
    for it."""
    assert tree_links(4, 5, 2)[0] == 3 and tree_links(3, 5, 2)[0] == 0
    # Far beyond the test's own limit: a survivor that waits for it fails as a hang.
    env = {**TREE, "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "600"}
    procs = _start_ranks(5, [str(victim), str(step)], env)
    results = collect(procs, 150.0)
    report = "\n".join(
        f"--- rank {r}: exit {code}\nstdout:\n{out}\nstderr:\n{err[-2000:]}"
        for r, (code, out, err) in enumerate(results)
    )
    assert results[victim][0] == -signal.SIGKILL, report
    said: dict[int, str] = {}
    for rank, (code, out, _) in enumerate(results):
        if rank == victim:
            continue
        raised = [line for line in out.splitlines() if line.startswith("RAISED ")]
        assert code == SURVIVOR_EXIT and len(raised) == 1, report
        said[rank] = raised[0]
    # (closed, or reset when it died with bytes unread: either way the link is named)
    neighbours = {3: (0, 4), 4: (3,)}[victim]
    for rank in neighbours:
        assert f"rank {victim}" in said[rank], report
    if victim == 3:
        assert "rank 3 (this rank's parent in the tree)" in said[4], report
    else:  # rank 0 never talks to rank 4: it names the rank relaying for it
        assert "rank 3 (relaying for rank 4)" in said[0], report


def test_elastic_rebuilds_the_tree_after_losing_a_relaying_rank() -> None:
    """``hvdprof run --min-np`` with a chain of control messages (fan-out 1) at 4 ranks:
    worker 1, which relays for ranks 2 and 3, is SIGKILLed mid-epoch; the survivors
    re-form at 3 ranks, whose control messages are again a chain (0-1-2, rebuilt from the
    new ranks), and finish, every sample trained exactly once per epoch. (Killed at step
    3: the 48 samples left of the first epoch split evenly over 3 ranks, so the sampler
    pads none with repeats.)"""
    from test_elastic import SAMPLES, WORKER, _committed

    assert tree_links(2, 4, 1)[0] == 1 and tree_links(2, 3, 1)[0] == 1  # chains both
    result = run_job(
        WORKER,
        4,
        "--kill-worker",
        "1",
        "--kill-step",
        "3",
        env={"HVDPROF_CONTROL_FANOUT": "1"},
        launcher_args=("--min-np", "3", "--max-np", "4"),
        timeout=200,
    )
    assert result.returncode == 0, result.describe()
    for w in (0, 2, 3):
        assert "DONE" in result.lines(w), result.describe()
        resets = [json.loads(v) for v in result.values(w, "RESET")]
        assert [(r["old_size"], r["new_size"]) for r in resets] == [(4, 3)], result.describe()
    for epoch, counts in _committed(result).items():
        assert sorted(counts) == list(range(SAMPLES)), (epoch, result.describe())
        assert set(counts.values()) == {1}, (epoch, counts)
