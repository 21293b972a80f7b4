"""Idle ranks sleep on their control sockets instead of cycling (issue 47: a rank with
nothing new blocks, and takes no CPU from the training).

The jobs run with ``HVDPROF_IDLE_SLEEP_MAX_SECONDS`` far beyond their deadline, so only a
wake-up can end a sleep: a job whose wake-up were lost would hang until its hard timeout
and fail. First the wake flag itself, then the token round on real sockets (ranks as
threads), then whole jobs as real processes, in the star and in a chain.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from conftest import WORKERS, run_job, start_ranks
from test_control_tree import on_every_rank

from hvdprof.common.wakeup import WakeFlag
from hvdprof.runtime.control import ControlChannel, ControlError
from hvdprof.runtime.cycle_header import reply_size

NEVER = {"HVDPROF_IDLE_SLEEP_MAX_SECONDS": "3600"}
CHAIN = {"HVDPROF_CONTROL_FANOUT": "1"}


def test_a_wake_flag_set_from_another_thread_ends_its_wait_and_keeps_until_cleared() -> None:
    flag = WakeFlag()
    try:
        assert not flag.wait(0.01)
        threading.Timer(0.05, flag.set).start()
        assert flag.wait(30)
        assert flag.is_set() and flag.wait(0)  # set stays set...
        flag.set()  # (a second set writes nothing more)
        flag.clear()
        assert not flag.is_set() and not flag.wait(0)  # ...until cleared, byte and all
    finally:
        flag.close()
    flag.set()  # closed: harmless (the runtime may submit after the cycle ended)


@pytest.mark.parametrize("fanout", [0, 1, 2])
@pytest.mark.parametrize("waker", [0, 1, 3])
def test_one_rank_with_work_wakes_every_sleeping_rank(fanout: int, waker: int) -> None:
    """Four ranks asleep; only ``waker``'s flag is set. Every rank leaves its sleep, the
    star's and the tree's, and the channel then still carries an exchange correctly (no
    token left behind in a socket)."""
    flags = [WakeFlag() for _ in range(4)]

    def rank_fn(channel: ControlChannel) -> tuple[float, list[int]]:
        rank = channel.rank
        if rank == waker:
            threading.Timer(0.2, flags[rank].set).start()
        started = time.monotonic()
        channel.sleep(flags[rank], 3600)
        slept = time.monotonic() - started
        send = channel.send_buffer(12)
        send[:] = rank

        def reply(matrix: np.ndarray) -> np.ndarray:
            out = np.zeros(reply_size(4, 12), dtype=np.uint8)
            out[2:6] = matrix[:, 0]
            return out

        answer, _ = channel.exchange(reply)
        return slept, answer[2:6].tolist()

    try:
        results = on_every_rank(4, fanout, rank_fn)
    finally:
        for f in flags:
            f.close()
    for rank, result in enumerate(results):
        assert not isinstance(result, BaseException), f"rank {rank}: {result!r}"
        assert result[0] < 60, f"rank {rank} slept {result[0]:.1f} s"  # (not 3600)
        assert result[1] == [0, 1, 2, 3], f"rank {rank}'s exchange after the sleep"


def test_a_peer_that_dies_during_the_sleep_ends_it_with_its_name() -> None:
    """Rank 1 closes its connection while rank 0 sleeps: rank 0's sleep ends at once, on
    the socket's end, with an error naming rank 1 (no tick needed to find out)."""
    flags = [WakeFlag() for _ in range(2)]

    def rank_fn(channel: ControlChannel) -> object:
        if channel.rank == 1:
            time.sleep(0.2)
            return None  # the harness closes the channel: the connection ends
        channel.sleep(flags[0], 3600)
        return "slept through"

    try:
        results = on_every_rank(2, 0, rank_fn)
    finally:
        for f in flags:
            f.close()
    assert isinstance(results[0], ControlError), results[0]
    assert "rank 1" in str(results[0])


@pytest.mark.parametrize("env", [{}, CHAIN], ids=["star", "chain"])
def test_an_idle_job_stops_cycling_and_wakes_for_the_late_ranks(env: dict[str, str]) -> None:
    """Three ranks idle a second: a handful of cycles instead of one every 10 ms (the
    old back-off ticked about a hundred times). Then each submits 0.3 s after the last."""
    result = run_job("idle_sleep_worker.py", 3, "idle", ".", env={**NEVER, **env}, timeout=90)
    assert result.returncode == 0, result.describe()
    for rank in range(3):
        assert result.section(rank, "idle") and result.section(rank, "idle").startswith("OK")
        counts = [int(x.split()[1]) for x in result.lines(rank) if x.startswith("IDLE_CYCLES")]
        assert counts and counts[0] <= 10, f"rank {rank}: {counts} cycles while idle"


@pytest.mark.parametrize("env", [{}, CHAIN], ids=["star", "chain"])
def test_ranks_waiting_on_a_late_rank_sleep_instead_of_cycling(env: dict[str, str]) -> None:
    """Two ranks submit at once and wait a second for the third: every rank, the late
    one included, takes a handful of cycles (its sleep ends every 0.25 s for the stall
    inspector), not one per 5 ms cycle time (about 200 before: on the late rank, CPU
    taken from the training everyone waits for). The sum then arrives intact."""
    result = run_job("idle_sleep_worker.py", 3, "wait", ".", env={**NEVER, **env}, timeout=90)
    assert result.returncode == 0, result.describe()
    for rank in range(3):
        assert (result.section(rank, "wait") or "").startswith("OK"), result.describe()
        counts = [int(x.split()[1]) for x in result.lines(rank) if x.startswith("WAIT_CYCLES")]
        assert counts and counts[0] <= 20, f"rank {rank}: {counts} cycles while waiting"


def _numbers(result: Any, rank: int, key: str) -> list[float]:
    return [float(x.split()[1]) for x in result.lines(rank) if x.startswith(key)]


@pytest.mark.parametrize("eager", [False, True], ids=["small_ops_wait", "default"])
def test_a_small_cpu_op_submitted_while_every_rank_sleeps_waits_for_a_wait_or_poll(
    eager: bool,
) -> None:
    """With ``HVDPROF_WAKE_ON_SUBMIT_BYTES`` at 256 KiB (what -1 gives hosts with spare
    cores) a small CPU op submitted while every rank sleeps wakes no one (0 cycles in the
    half second before its rank waits on it: no rank's cores are taken mid-backward), and
    a 400 KB one runs at once; 0 runs both at once. Either way a polling loop completes its op at once, and a rank already
    waiting is woken by the late rank's submission, not by that rank's own wait two
    seconds later. Nothing but these wake-ups can end a sleep here
    (``HVDPROF_IDLE_SLEEP_MAX_SECONDS`` is an hour)."""
    env = {**NEVER, "HVDPROF_WAKE_ON_SUBMIT_BYTES": "0" if eager else "262144"}
    result = run_job("idle_sleep_worker.py", 3, "submit", ".", env=env, timeout=90)
    assert result.returncode == 0, result.describe()
    for rank in range(3):
        assert (result.section(rank, "submit") or "").startswith("OK"), result.describe()
        cycles = _numbers(result, rank, "SUBMIT_CYCLES")
        large = _numbers(result, rank, "LARGE_SUBMIT_CYCLES")
        assert cycles and large, result.describe()
        assert large[0] >= 1, f"rank {rank}: the 400 KB op did not run at its submission"
        if eager:
            assert cycles[0] >= 1, f"rank {rank}: the op did not run at its submission"
        else:
            assert cycles[0] == 0, f"rank {rank}: {cycles[0]} cycles woken by a submission"
        polled = _numbers(result, rank, "POLL_SECONDS")
        assert polled and polled[0] < 5, f"rank {rank}: polled for {polled} s"
    for rank in range(2):
        waited = _numbers(result, rank, "LATE_WAIT_SECONDS")
        assert waited and waited[0] < 2.0, f"rank {rank}: waited {waited} s for rank 2"


@pytest.mark.parametrize("held", [True, False], ids=["small_ops_wait", "default"])
def test_an_op_held_for_its_ranks_wait_negotiates_from_when_the_cycle_took_it(
    held: bool, tmp_path: Path
) -> None:
    """A held op's time in the queue is its rank computing, not waiting for its peers: its
    ``NEGOTIATE`` slice begins when the cycle took it, its readiness mark stays at its
    submission, and the breakdown of a balanced job still finds little negotiation wait.
    (Drawn from the submission, the slices covered each 0.1 s backward pass: half the
    wall time read as ranks waiting for each other.)"""
    from hvdprof.analysis import load_run, time_breakdown
    from hvdprof.trace.model import PHASE_NEGOTIATE

    env = {**NEVER, "HVDPROF_WAKE_ON_SUBMIT_BYTES": "262144" if held else "0"}
    timeline = tmp_path / "timeline"
    result = run_job(
        "idle_sleep_worker.py",
        2,
        "steps",
        ".",
        env=env,
        timeout=90,
        launcher_args=("--timeline", str(timeline)),
    )
    assert result.returncode == 0, result.describe()
    run = load_run(str(timeline), cache=False)
    s, marks = run.slices, run.marks
    grad = run.tensors.index("grad")
    for rank in range(2):
        negs = np.flatnonzero((s.rank == rank) & (s.tensor == grad) & (s.phase == PHASE_NEGOTIATE))
        assert len(negs) == 8, f"rank {rank}: {len(negs)} negotiations of 'grad'"
        own = (marks.observer == rank) & (marks.ready_rank == rank) & np.isin(marks.slice, negs)
        late_ms = (s.start_us[marks.slice[own]] - marks.ts_us[own]) / 1000.0
        assert len(late_ms) == 8, f"rank {rank}: {len(late_ms)} own readiness marks"
        if held:  # taken at the rank's wait, about 0.1 s after the submission
            assert (late_ms > 50).all(), f"rank {rank}: began {late_ms} ms after submission"
        else:
            assert (np.abs(late_ms) < 1).all(), f"rank {rank}: {late_ms} ms after submission"
    for r in time_breakdown(run).ranks:
        assert r.share("negotiate") < 0.2, f"rank {r.rank}: {r.shares}"


def test_ranks_sleep_as_soon_as_a_step_s_reductions_leave_nothing_pending() -> None:
    """Eight steps of one held op each take one cycle each: the cycle that reduced it
    left nothing pending on any rank, so every rank slept right after it. (They took two:
    a quiet cycle followed each step's a cycle time later, only to learn that, in the
    next step's compute; on a 2-core VM it cost a 12 ms step 1 ms.)"""
    env = {**NEVER, "HVDPROF_WAKE_ON_SUBMIT_BYTES": "262144"}
    result = run_job("idle_sleep_worker.py", 2, "steps", ".", env=env, timeout=90)
    assert result.returncode == 0, result.describe()
    for rank in range(2):
        counts = _numbers(result, rank, "STEP_CYCLES")
        assert counts and 8 <= counts[0] <= 11, f"rank {rank}: {counts} cycles for 8 steps"


@pytest.mark.parametrize("env", [{}, CHAIN], ids=["star", "chain"])
def test_a_process_set_wakes_rank_0_that_submits_nothing(
    env: dict[str, str], tmp_path: Path
) -> None:
    """Ranks 1 and 2 reduce in their set while rank 0, asleep, submits nothing until it
    sees that op's result: only the wake-up they send can run rank 0's cycle."""
    result = run_job(
        "idle_sleep_worker.py", 3, "set", str(tmp_path), env={**NEVER, **env}, timeout=90
    )
    assert result.returncode == 0, result.describe()
    for rank in range(3):
        assert (result.section(rank, "set") or "").startswith("OK"), result.describe()


@pytest.mark.parametrize("env", [{}, CHAIN], ids=["star", "chain"])
def test_a_rank_killed_while_every_rank_sleeps_is_named_by_the_survivors(
    env: dict[str, str],
) -> None:
    """Started without the launcher (which would stop the others when a rank dies): the
    last rank SIGKILLs itself while every rank sleeps; the survivors' next op raises,
    naming it, well before any timeout (the sleep ends on the socket's end)."""
    slow = {**NEVER, **env, "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS": "3600"}
    procs = start_ranks(WORKERS / "idle_sleep_worker.py", 3, ["kill", "."], slow, 90)
    try:
        outputs = ["\n".join(p.communicate(timeout=90)) for p in procs]
    except subprocess.TimeoutExpired:
        pytest.fail("a survivor never learnt that rank 2 died (a hang)")
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    assert procs[2].returncode == -signal.SIGKILL, outputs[2]
    errors = {}
    for rank in range(2):
        lines = [x for x in outputs[rank].splitlines() if x.startswith(("ERROR", "NO ERROR"))]
        assert lines and lines[0].startswith("ERROR"), f"rank {rank}:\n{outputs[rank]}"
        errors[rank] = lines[0]
    # the rank linked to it names it (the others lose that rank's link in turn)
    linked = 1 if env else 0
    assert "rank 2" in errors[linked], errors


def test_every_cpu_op_waits_where_the_training_fills_the_cores() -> None:
    """-1 (auto, the default): a one-host job whose torch threads fill its cores lets
    every CPU op wait (overlap would only take CPU from the training); spare cores or
    several hosts only ops to 256 KiB."""
    from hvdprof.runtime.runtime import WAKE_ON_SUBMIT_SPARE_CORES, wake_limit

    threads = torch.get_num_threads()
    assert wake_limit(-1, local_size=2, cores=2 * threads) > 1 << 40
    assert wake_limit(-1, local_size=1, cores=2 * threads) == WAKE_ON_SUBMIT_SPARE_CORES
    # across hosts the network's transfers overlap the compute: only small ops wait
    spare = WAKE_ON_SUBMIT_SPARE_CORES
    assert wake_limit(-1, local_size=2, cores=2 * threads, hosts=2) == spare
    assert wake_limit(0, local_size=2, cores=1) == 0  # set: as given
    assert wake_limit(4096, local_size=1, cores=64) == 4096
