"""Elastic training (``hvd.elastic`` + ``hvdprof run --min-np/--max-np``), real processes.

Every job runs through the real launcher with a ``--timeout``, a subprocess timeout and
the workers' own watchdog (see ``conftest.run_job``), so a hang fails the test instead of
CI. Workers are named by the launcher's worker id in the output prefix (``[W]``), which
stays fixed while their rank changes from generation to generation.
"""

from __future__ import annotations

import collections
import json
import os
import re
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, WORKERS, JobResult, child_env, parse_output, run_job

from hvdprof.errors import ConfigError
from hvdprof.launch.elastic_local import parse_discovery

WORKER = "elastic_train_worker.py"
SAMPLES = 96


def _committed(result: JobResult) -> dict[int, collections.Counter]:
    """Per epoch, how many times each sample index was trained in a committed batch."""
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for lines in result.stdout.values():
        for line in lines:
            if line.startswith("COMMITTED "):
                _, epoch, indices = line.split(" ", 2)
                seen[int(epoch)].update(json.loads(indices))
    return seen


def _weights(result: JobResult, worker: int) -> list:
    found = result.values(worker, "WEIGHTS")
    assert len(found) == 1, result.describe()
    return json.loads(found[0])


@pytest.mark.parametrize(("num_proc", "killed"), [(3, 1), (2, 0)])
def test_sigkilled_rank_job_finishes_on_the_survivors(tmp_path: Path, num_proc: int, killed: int):
    """A rank SIGKILLed mid-epoch: the others restore the last commit, re-form one rank
    smaller and finish; every sample is trained exactly once per epoch; the final weights
    equal those of a fresh job started from the committed state the survivors restored."""
    committed = tmp_path / "committed.pt"
    timeline = tmp_path / "timeline"
    result = run_job(
        WORKER,
        num_proc,
        "--kill-worker",
        str(killed),
        "--kill-step",
        "5",
        "--save-committed",
        str(committed),
        launcher_args=(
            "--min-np",
            str(num_proc - 1),
            "--max-np",
            str(num_proc),
            "--timeline",
            str(timeline),
        ),
        timeout=150,
    )
    assert result.returncode == 0, result.describe()
    _check_timeline(timeline, num_proc, killed)
    survivors = [w for w in range(num_proc) if w != killed]
    assert "DONE" not in result.lines(killed), result.describe()
    for w in survivors:
        assert "DONE" in result.lines(w), result.describe()
        resets = [json.loads(v) for v in result.values(w, "RESET")]
        assert [(r["old_size"], r["new_size"]) for r in resets] == [(num_proc, num_proc - 1)]
        assert result.values(w, "FINAL")[0].startswith(f"size={num_proc - 1} ")
    assert any(
        f"{num_proc} -> {num_proc - 1} ranks" in line and "SIGKILL" in line
        for line in result.launcher
    ), result.describe()
    # exactly once: the killed rank's uncommitted batch is the only work lost
    for epoch, counts in _committed(result).items():
        assert sorted(counts) == list(range(SAMPLES)), (epoch, result.describe())
        assert set(counts.values()) == {1}, (epoch, counts)
    # the new rank 0 is the lowest surviving worker
    final_rank0 = next(w for w in survivors if result.values(w, "WEIGHTS"))
    assert final_rank0 == survivors[0]
    assert committed.exists(), result.describe()
    if num_proc - 1 < 2:
        return  # a 1-rank reference is the same single process: nothing to compare across
    reference = run_job(WORKER, num_proc - 1, "--load", str(committed), timeout=150)
    assert reference.returncode == 0, reference.describe()
    assert _weights(reference, 0) == _weights(result, final_rank0)


def _check_timeline(timeline: Path, num_proc: int, killed: int) -> None:
    """One timeline per generation, each opened by a re-formation event on every rank;
    ``elastic.json`` holds the job's history."""
    history = json.loads((timeline / "elastic.json").read_text())["generations"]
    assert [(g["generation"], g["old_size"], g["new_size"]) for g in history] == [
        (1, 0, num_proc),
        (2, num_proc, num_proc - 1),
    ]
    assert str(killed) not in history[1]["workers"] and "SIGKILL" in history[1]["reason"]
    first = sorted(p.name for p in (timeline / "generation.1").glob("rank.*.json"))
    assert first == [f"rank.{r}.json" for r in range(num_proc)]
    for r in range(num_proc - 1):
        events = json.loads((timeline / "generation.2" / f"rank.{r}.json").read_text())
        events = events["traceEvents"] if isinstance(events, dict) else events
        reform = [e for e in events if e.get("name") == "elastic.reform"]
        assert len(reform) == 1, r
        assert (reform[0]["args"]["old_size"], reform[0]["args"]["new_size"]) == (
            num_proc,
            num_proc - 1,
        )


def test_shrinking_below_min_np_fails_naming_the_ranks_gone():
    result = run_job(
        WORKER,
        2,
        "--kill-worker",
        "1",
        "--kill-step",
        "3",
        launcher_args=("--min-np", "2", "--max-np", "2"),
        timeout=120,
    )
    assert result.returncode == 128 + signal.SIGKILL, result.describe()
    message = [line for line in result.launcher if "fewer than --min-np 2" in line]
    assert message, result.describe()
    assert "rank 1 (worker 1) exited with signal SIGKILL" in message[0], message[0]
    assert "DONE" not in result.lines(0)


def _discovery_script(directory: Path, command: str) -> Path:
    """An executable ``--host-discovery-script`` that runs one shell ``command``."""
    script = directory / "discover.sh"
    script.write_text(f"#!/bin/sh\n{command}\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return script


def test_job_grows_when_discovery_reports_a_new_slot(tmp_path: Path):
    slots = tmp_path / "slots"
    slots.write_text("localhost:2\n")
    script = _discovery_script(tmp_path, f"cat {slots}")
    result = run_job(
        WORKER,
        2,
        "--epochs",
        "1000",
        "--grow-file",
        str(slots),
        "--grow-step",
        "3",
        "--step-sleep",
        "0.05",
        launcher_args=(
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--host-discovery-script",
            str(script),
        ),
        timeout=150,
    )
    assert result.returncode == 0, result.describe()
    for w in (0, 1, 2):
        assert "DONE" in result.lines(w), result.describe()
        assert result.values(w, "FINAL")[0].startswith("size=3 "), result.describe()
    for w in (0, 1):  # the original workers re-formed once, from 2 to 3 ranks
        resets = [json.loads(v) for v in result.values(w, "RESET")]
        assert [(r["old_size"], r["new_size"]) for r in resets] == [(2, 3)]
    assert 3 not in result.stdout, "no worker may start after the training finished"
    # the new worker took rank 2 and the same weights: rank 0 printed them
    assert result.values(0, "WEIGHTS")


def test_dead_worker_is_replaced_while_discovery_reports_its_slot(tmp_path: Path):
    """Discovery keeps reporting 2 slots: after worker 1's SIGKILL the job goes on at 1
    rank, the launcher starts worker 2 in the free slot, and the job grows back to 2;
    across both re-formations every sample is trained exactly once per epoch."""
    script = _discovery_script(tmp_path, "echo localhost:2")
    result = run_job(
        WORKER,
        2,
        "--epochs",
        "3",
        "--kill-worker",
        "1",
        "--kill-step",
        "5",
        "--step-sleep",
        "0.1",
        "--hold-until-size",
        "2",
        launcher_args=(
            "--min-np",
            "1",
            "--max-np",
            "2",
            "--host-discovery-script",
            str(script),
        ),
        timeout=150,
    )
    assert result.returncode == 0, result.describe()
    resets = [json.loads(v) for v in result.values(0, "RESET")]
    assert [(r["old_size"], r["new_size"]) for r in resets] == [(2, 1), (1, 2)], result.describe()
    assert result.values(2, "FINAL")[0].startswith("size=2 rank=1"), result.describe()
    committed = _committed(result)
    assert sorted(committed) == [0, 1, 2]
    for epoch, counts in committed.items():
        assert sorted(counts) == list(range(SAMPLES)), (epoch, result.describe())
        assert set(counts.values()) == {1}, (epoch, counts)


def _benchmark_command(*extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "hvdprof",
        "run",
        "--min-np",
        "1",
        "--max-np",
        "2",
        "--timeout",
        "150",
        *extra,
        "--",
        sys.executable,
        str(WORKERS / "horovod_pytorch_synthetic_benchmark_elastic.py"),
        "--model",
        "tiny_resnet",
        "--batch-size",
        "4",
        "--num-warmup-batches",
        "2",
        "--num-batches-per-iter",
        "2",
    ]


def _benchmark_env() -> dict[str, str]:
    path = [str(WORKERS / "torchvision_standin"), os.environ.get("PYTHONPATH", "")]
    return child_env({"PYTHONPATH": os.pathsep.join(p for p in path if p)}, 150)


def test_horovod_elastic_synthetic_benchmark_runs_to_the_end():
    """Horovod's own example, only its import changed (see tests/workers/torchvision_standin)."""
    proc = subprocess.run(
        [*_benchmark_command(), "--num-iters", "3"],
        capture_output=True,
        text=True,
        timeout=180,
        env=_benchmark_env(),
        cwd=REPO,
    )
    result = JobResult(proc.returncode, proc.stdout + proc.stderr, 0.0)
    parse_output(proc.stdout, result)
    assert proc.returncode == 0, result.describe()
    lines = result.lines(0)
    assert "Number of CPUs: 2" in lines, result.describe()
    assert [line.split(":")[0] for line in lines if line.startswith("Iter #")] == [
        "Iter #0",
        "Iter #1",
        "Iter #2",
    ]
    assert any(line.startswith("Total img/sec on 2 CPU(s)") for line in lines)


def test_horovod_elastic_synthetic_benchmark_survives_a_killed_worker():
    """SIGKILL worker 1 once the benchmark iterates: it finishes on the one worker left."""
    env = _benchmark_env()
    proc = subprocess.Popen(
        [*_benchmark_command("--verbose"), "--num-iters", "40"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )
    lines: list[str] = []
    deadline = time.monotonic() + 170
    killed = False
    pid_of: dict[str, int] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            started = re.search(r"worker (\d+) started, pid (\d+)", line)
            if started:
                pid_of[started[1]] = int(started[2])
            if not killed and "Iter #1:" in line:
                os.kill(pid_of["1"], signal.SIGKILL)
                killed = True
            if time.monotonic() > deadline:
                break
        proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = "".join(lines)
    assert killed, output[-6000:]
    assert proc.returncode == 0, output[-6000:]
    assert "2 -> 1 ranks" in output, output[-6000:]
    assert "Iter #39:" in output, output[-6000:]
    assert "Total img/sec on 1 CPU(s)" in output, output[-6000:]


# ---------------------------------------------------------------- in-process checks
def test_discovery_output_parsing():
    assert parse_discovery("localhost:2\n# comment\n\n127.0.0.1:1\n") == 3
    assert parse_discovery("localhost\n") == 1
    with pytest.raises(ConfigError, match="other-host"):
        parse_discovery("other-host:4\n")
    with pytest.raises(ConfigError, match="HOST:SLOTS"):
        parse_discovery("localhost:x\n")


def test_elastic_options_are_checked_before_any_worker_starts():
    run = subprocess.run(
        [sys.executable, "-m", "hvdprof", "run", "--min-np", "3", "--max-np", "2", "--", "true"],
        capture_output=True,
        text=True,
        timeout=60,
        env=child_env(),
    )
    assert run.returncode != 0
    assert "--min-np 3 and --max-np 2" in run.stderr, run.stderr


def test_recovery_benchmark_quick_run(tmp_path: Path):
    """benchmarks/elastic_recovery.py end to end (no timing asserted: see the README)."""
    out = tmp_path / "result.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "benchmarks" / "elastic_recovery.py"),
            "--quick",
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=280,
        env=child_env(deadline=200),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    for size in ("2_ranks", "3_ranks"):
        run = result["recovery"][size]["runs"][0]
        assert run["death_to_first_step_s"] > 0
        parts = run["detection_s"] + run["reformation_s"] + run["first_step_s"]
        assert abs(parts - run["death_to_first_step_s"]) < 1e-3
    assert result["resnet50_commit"]["parameters"] == 25_557_032


def test_elastic_sampler_deals_the_rest_of_the_epoch_after_a_reset():
    """The sampler's arithmetic alone (no job: it behaves as one rank, then as two)."""
    from hvdprof.torch.elastic import ElasticSampler

    sampler = ElasticSampler(list(range(20)), shuffle=True, seed=3)
    order = list(iter(sampler))
    assert sorted(order) == list(range(20))
    sampler.record_batch(0, 6)
    sampler.record_batch(1, 6)  # 12 samples done
    state = sampler.state_dict()
    again = ElasticSampler(list(range(20)), shuffle=True, seed=3)
    again.load_state_dict(state)
    assert list(iter(again)) == order[12:]
    again.set_epoch(1)
    assert sorted(again) == list(range(20)) and list(again) != order
