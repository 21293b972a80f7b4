"""Ranks that diverge: a deadlock is an error on every rank, a slow rank is waited for.

Each rank tells rank 0, in every cycle's header, whether its user thread is blocked
waiting on an op (``hvdprof/runtime/handles.py``). When every rank that has not joined is
blocked on names another blocked rank never submitted, nothing can ever move: rank 0's
stall inspector (``hvdprof/runtime/stall.py``) makes that a StallAbortError on every rank,
naming each rank and what it waits on, well within HVDPROF_STALL_CHECK_TIME_SECONDS. A
rank that is merely slow (computing, not blocked) still only gets the stall warning.

The jobs run with HVDPROF_STALL_SHUTDOWN_TIME_SECONDS unset (never abort): without the
detection, a deadlock would hang until the worker's watchdog. That the error comes before
the stall check time is shown without timing the test: rank 0's stall warning, logged
once a name has waited that long, must not have appeared.
"""

from __future__ import annotations

import threading
import time

import pytest
from conftest import run_job

from hvdprof.runtime import handles
from hvdprof.runtime.stall import DeadlockDetector, describe_deadlock

CHECK_S = 6.0
STALL_WARNING = "hvdprof stall: "


def deadlock_job(mode: str, num_proc: int) -> None:
    env = {"HVDPROF_STALL_CHECK_TIME_SECONDS": str(CHECK_S)}
    result = run_job("deadlock_worker.py", num_proc, mode, env=env, timeout=120)
    result.assert_section(mode, num_proc)
    if mode != "join":
        result.assert_section("recover", num_proc)
    result.assert_done(num_proc)
    for rank in range(num_proc):
        assert len(result.values(rank, "DEADLOCK_AFTER")) == 1, result.describe()
    assert not any(STALL_WARNING in line for line in result.lines(0, "stderr")), (
        "the stall warning came first: the deadlock was not reported within "
        f"HVDPROF_STALL_CHECK_TIME_SECONDS={CHECK_S:g}\n{result.describe()}"
    )
    assert "Traceback" not in result.output, result.describe()


@pytest.mark.parametrize("num_proc", [2, 3])
def test_divergent_ranks_raise_a_deadlock_error_on_every_rank(num_proc: int) -> None:
    deadlock_job("diverge", num_proc)


def test_deadlock_on_the_response_cache_path() -> None:
    deadlock_job("cached", 2)


def test_deadlock_with_a_joined_rank() -> None:
    deadlock_job("join", 3)


def test_a_slow_rank_is_waited_for_and_only_warned_about() -> None:
    env = {"HVDPROF_STALL_CHECK_TIME_SECONDS": "2"}
    result = run_job("deadlock_worker.py", 2, "slow", env=env, timeout=120)
    result.assert_section("slow", 2)
    result.assert_done(2)
    warnings = [line for line in result.lines(0, "stderr") if STALL_WARNING in line]
    assert any("rank 1 has not submitted 'dl.slow'" in w for w in warnings), result.describe()
    assert "hvdprof deadlock" not in result.output, result.describe()


# ------------------------------------------------------------- the decision, no processes
def test_detector_needs_every_active_rank_blocked_and_a_steady_state() -> None:
    waiting = {"a": (frozenset({0}), 0.0), "b": (frozenset({1}), 0.0)}
    d = DeadlockDetector(2, confirm_s=1.0)
    assert not d.observe(0.0, [True, False], frozenset(), waiting, 5)  # rank 1 computes
    assert not d.observe(5.0, [True, False], frozenset(), waiting, 5)
    assert not d.observe(5.0, [True, True], frozenset(), waiting, 5)  # both blocked: start
    assert not d.observe(5.5, [True, True], frozenset(), waiting, 5)
    assert not d.observe(6.2, [True, True], frozenset(), waiting, 6)  # progress: restart
    assert not d.observe(7.0, [True, True], frozenset(), waiting, 6)
    assert d.observe(7.3, [True, True], frozenset(), waiting, 6)
    assert not d.observe(8.0, [True, True], frozenset(), {}, 6)  # nothing pending


def test_detector_leaves_joined_ranks_out() -> None:
    waiting = {"a": (frozenset({1}), 0.0), "b": (frozenset({2}), 0.0)}
    d = DeadlockDetector(3, confirm_s=0.5)
    assert not d.observe(0.0, [False, True, True], frozenset({0}), waiting, 0)
    assert d.observe(1.0, [False, True, True], frozenset({0}), waiting, 0)


def test_deadlock_message_names_each_rank_and_what_it_waits_on() -> None:
    waiting = {"a": (frozenset({0}), 0.0), "b": (frozenset({1, 2}), 0.0)}
    text = describe_deadlock(4, frozenset({3}), waiting, {"a": "ALLREDUCE", "b": "ALLGATHER"}, 9)
    assert "rank 0 waits on allreduce 'a' (not submitted by rank(s) [1, 2])" in text
    assert "rank 1 waits on allgather 'b' (not submitted by rank(s) [0])" in text
    assert "rank 2 waits on allgather 'b'" in text
    assert "rank 3 has called join()" in text
    assert "HVDPROF_STALL_CHECK_TIME_SECONDS=9" in text


def _until(condition, limit: float = 10.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, "the threads did not get there"
        time.sleep(0.005)


def test_blocked_means_every_thread_that_waits_is_waiting_on_an_unfinished_op(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a rank reports in its header, with real threads and real handles."""
    monkeypatch.setattr(handles, "_blocked_on", {})
    monkeypatch.setattr(handles, "_waiters", {})
    assert not handles.user_thread_blocked()  # nobody waits: computing
    main_op, helper_op = handles.Handle("main"), handles.Handle("helper")
    main = threading.Thread(target=main_op.wait)
    main.start()
    _until(lambda: len(handles._blocked_on) == 1)
    assert handles.user_thread_blocked()

    # A helper thread that has waited on an op before and now computes may still submit.
    computing = threading.Event()
    finish = threading.Event()

    def helper() -> None:
        helper_op.wait()
        computing.set()
        finish.wait(10)

    worker = threading.Thread(target=helper)
    worker.start()
    _until(lambda: len(handles._blocked_on) == 2)
    helper_op.complete(None)
    handles.notify_waiters()
    computing.wait(10)
    assert not handles.user_thread_blocked()
    finish.set()
    worker.join(10)
    assert handles.user_thread_blocked()  # it exited: only the main thread is left

    # An op that completed wakes its thread, which may submit more: not blocked.
    main_op.complete(None)  # (the waiter is not woken yet)
    assert not handles.user_thread_blocked()
    handles.notify_waiters()
    main.join(10)
    assert not main.is_alive() and not handles.user_thread_blocked()
