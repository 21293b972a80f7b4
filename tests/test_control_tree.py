"""The cycle's reduced reply and the tree of control messages (HVDPROF_CONTROL_FANOUT).

First the pieces, with ranks as threads on real sockets: rank 0's reply read back on
every rank, the tree's exchange, gather and broadcast equal to the star's, a lost peer
reported. Then whole jobs as real processes through ``hvdprof run`` with a tree of
fan-out 2 (inner ranks relaying for others; the errors worker's 3 ranks as a chain): the ops and join, the response cache,
mismatched shapes, process sets, the stall inspector naming a rank below an inner
rank, and every rank's timeline carrying the other ranks' readiness marks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import run_job
from test_control_channel import DictStore

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


def test_every_rank_records_the_late_rank_through_a_tree(tmp_path: Path) -> None:
    """The timeline's readiness marks need every rank's bits: a recording rank asks for
    the matrix and gets it down the tree. Rank 1 (an inner rank at 5 ranks and fan-out 2)
    submits 0.3 s late in two steps; on the cache's path too, every rank's trace names it
    as the last rank ready, which only the per-rank bits can tell."""
    from test_timeline_e2e import GRAD_NAMES, STRAGGLE_STEPS, STRAGGLER, load_strict, op_units

    env = {**TREE, "HVDPROF_TIMELINE": str(tmp_path / "init")}
    result = run_job("timeline_worker.py", 5, "main", str(tmp_path), env=env, timeout=300)
    assert result.returncode == 0, result.describe()
    for rank in range(5):
        units = op_units(load_strict(tmp_path / "init" / f"rank.{rank}.json"))
        negs = [
            u["negotiate"]["args"] for u in units if u["negotiate"]["args"]["tensor"] in GRAD_NAMES
        ]
        by_name: dict[str, list[dict[str, Any]]] = {}
        for args in negs:
            by_name.setdefault(args["tensor"], []).append(args)
        for name in GRAD_NAMES:
            for k in STRAGGLE_STEPS:
                args = by_name[name][k]
                assert args["last_ready_rank"] == STRAGGLER, (rank, name, k, args)
        assert any(a["cached"] for a in negs), f"rank {rank}: no cached op"


def test_a_rank_with_another_fanout_is_refused_by_name() -> None:
    store = DictStore()
    store.set("hvdprof/control/fanout", "2")  # what rank 0 published
    with pytest.raises(ControlError, match="HVDPROF_CONTROL_FANOUT is 0 on rank 3 but 2 on rank 0"):
        ControlChannel.connect(3, 5, store, "127.0.0.1", 1, 1, 0)
