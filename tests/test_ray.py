"""hvdprof on Ray (``hvdprof.ray``), against a real local Ray cluster.

The cluster is a separate ``ray start --head --block`` process with 2 CPUs, in a session
of its own, started once for this module and always stopped at the end (its whole
process group, then any process left in it), whatever the tests did. Each test has a hard
timeout, and every wait inside the executors is bounded.

The behaviours of Horovod's own ``test/single/test_ray.py`` are covered here (its GPU
tests need GPUs; their logic is tested through the pure function behind them):

* ``test_coordinator_registration`` -> ``test_ranks_are_numbered_node_by_node`` and
  ``test_horovods_coordinator_numbers_ranks_as_our_layout`` (``hvdprof.ray.runner``)
* ``test_colocator`` -> ``test_a_node_colocator_holds_the_cpus_its_workers_run_on``
* ``test_infeasible_placement`` -> ``test_infeasible_placement_times_out``
* ``test_gpu_ids`` (GPU) -> ``test_each_worker_sees_every_gpu_of_its_node``
* ``test_horovod_mixin`` -> ``test_worker_actor_reports_its_host_and_takes_variables``
* ``test_local``, ``test_ray_init``, ``test_ray_exec_func``, ``test_ray_exec_remote_func``,
  ``test_ray_executable`` -> ``test_executor_runs_functions_on_every_rank``
* ``test_horovod_train`` -> ``test_training_matches_hvdprof_run``
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, TESTS, WORKERS, child_env, run_job

from hvdprof.errors import HvdprofInternalError
from hvdprof.ray.failures import RankFailure, actor_death_reason, failure_line, is_echo
from hvdprof.ray.layout import (
    WorkerPlace,
    cluster_slots,
    forwarded_environment,
    rank_environment,
    rank_order,
    shared_visible_devices,
)
from hvdprof.ray.placement import plan_placement
from hvdprof.ray.timeline_gather import timeline_directory

sys.path.insert(0, str(WORKERS))
import ray_train

CLUSTER_START_S = 120.0
STEPS = 20
SLOW_RANK, SLOW_MS = 1, 40.0


def _ray_or_skip() -> Any:
    try:
        import ray
    except ImportError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"ray is missing but CI=true: .ci/setup installs it ({exc})")
        pytest.skip(f"ray is not installed (pip install 'hvdprof[ray]'): {exc}")
    return ray


# --- the rank layout and the driver's decisions, without a cluster ----------------------


def _place(host: str, node: str = "", gpus: tuple[str, ...] = ()) -> WorkerPlace:
    return WorkerPlace(host, node or f"node-{host}", f"10.0.0.{ord(host[0]) % 250}", 1, "", gpus)


def test_ranks_are_numbered_node_by_node() -> None:
    # Horovod's coordinator test: 12 workers registering round-robin from hosts a, b, c
    places = [_place("abc"[r % 3]) for r in range(12)]
    order = rank_order(places)
    hosts = [places[i].hostname for i in order]
    assert hosts == ["a"] * 4 + ["b"] * 4 + ["c"] * 4  # local ranks contiguous
    envs = [rank_environment(hosts, r, "10.0.0.97", 1234) for r in range(12)]
    assert {e["HVDPROF_CROSS_SIZE"] for e in envs} == {"3"}
    assert {e["HVDPROF_CROSS_RANK"] for e in envs} == {"0", "1", "2"}
    assert {e["HVDPROF_LOCAL_SIZE"] for e in envs} == {"4"}
    assert [e["HVDPROF_LOCAL_RANK"] for e in envs[4:8]] == ["0", "1", "2", "3"]
    assert [e["HVDPROF_RANK"] for e in envs] == [str(r) for r in range(12)]
    assert {
        (e["HVDPROF_SIZE"], e["HVDPROF_CONTROLLER_ADDR"], e["HVDPROF_CONTROLLER_PORT"])
        for e in envs
    } == {("12", "10.0.0.97", "1234")}


def test_horovods_coordinator_numbers_ranks_as_our_layout() -> None:
    from hvdprof.ray.executor import RayExecutor
    from hvdprof.ray.runner import ColocatedNode, Coordinator, MiniSettings

    coord = Coordinator(MiniSettings())
    assert (coord.world_size, coord.hoststring) == (0, "")
    for i, host in enumerate("abc"):  # Horovod's test: ranks round-robin over a, b, c
        for r in range(12):
            if r % 3 == i:
                coord.register(host, world_rank=r)
    assert (coord.world_size, coord.hoststring) == (12, "a:4,b:4,c:4")
    info = coord.finalize_registration()
    assert sorted(info) == list(range(12))
    assert info[4] == {  # host b's second rank
        "HOROVOD_CROSS_RANK": 1,
        "HOROVOD_CROSS_SIZE": 3,
        "HOROVOD_LOCAL_RANK": 1,
        "HOROVOD_LOCAL_SIZE": 4,
    }
    assert [info[r]["HOROVOD_LOCAL_RANK"] for r in (2, 5, 8, 11)] == [0, 1, 2, 3]
    hosts = ["abc"[r % 3] for r in range(12)]
    assert coord.rank_environment("10.0.0.9", 77) == {
        r: rank_environment(hosts, r, "10.0.0.9", 77) for r in range(12)
    }
    with pytest.raises(ValueError, match="already registered"):
        coord.register("d", world_rank=3)
    coord.register("d", world_rank=13)
    with pytest.raises(ValueError, match=r"ranks \[12\] of 13 were never registered"):
        coord.finalize_registration()
    # Horovod's settings object: its SSH and NIC fields accepted, the executor takes it
    job = RayExecutor(MiniSettings(timeout_s=5, nics={"eth0"}), num_hosts=1, num_slots=2)
    assert (job.settings.timeout_s, job.num_workers, job.workers) == (5, 2, [])
    assert ColocatedNode(node_rank=2, num_slots=3, world_size=9, use_gpu=False).world_ranks() == [
        6,
        7,
        8,
    ]
    with pytest.raises(ValueError, match="num_slots=0"):
        ColocatedNode(node_rank=0, num_slots=0, world_size=1, use_gpu=False)


def test_each_worker_sees_every_gpu_of_its_node() -> None:
    # Horovod's test_gpu_ids: the workers of a node share CUDA_VISIBLE_DEVICES
    places = [
        _place("a", gpus=("3",)),
        _place("a", gpus=("1",)),
        _place("b", gpus=("0",)),
        _place("a", gpus=("10",)),
    ]
    assert shared_visible_devices(places) == ["1,3,10", "1,3,10", "0", "1,3,10"]


def test_slots_come_from_rays_view_of_the_nodes() -> None:
    nodes = [
        {"Alive": True, "NodeManagerAddress": "10.0.0.1", "Resources": {"CPU": 4.0, "GPU": 1.0}},
        {"Alive": False, "NodeManagerAddress": "10.0.0.2", "Resources": {"CPU": 8.0}},
        {"Alive": True, "NodeManagerAddress": "10.0.0.3", "Resources": {"CPU": 3.0}},
    ]
    assert cluster_slots(nodes, 1) == {"10.0.0.1": 4, "10.0.0.3": 3}
    assert cluster_slots(nodes, 2) == {"10.0.0.1": 2, "10.0.0.3": 1}
    assert cluster_slots(nodes, 1, gpus_per_slot=1) == {"10.0.0.1": 1}


def test_the_drivers_hvdprof_and_horovod_variables_are_forwarded() -> None:
    env = {"HVDPROF_CYCLE_TIME": "2", "HOROVOD_FUSION_THRESHOLD": "9", "PATH": "/bin", "X": "1"}
    assert forwarded_environment(env) == {
        "HVDPROF_CYCLE_TIME": "2",
        "HOROVOD_FUSION_THRESHOLD": "9",
    }


def test_placement_plans() -> None:
    packed = plan_placement(3, None, None, 1.0, 0.0)
    assert packed.strategy == "PACK" and packed.bundles == [{"CPU": 1.0}] * 3
    per_host = plan_placement(None, 2, 3, 0.5, 1.0)
    assert per_host.strategy == "STRICT_SPREAD"
    assert per_host.bundles == [{"CPU": 1.5, "GPU": 3.0}] * 2
    assert per_host.bundle_of_worker == [0, 0, 0, 1, 1, 1]
    with pytest.raises(ValueError, match="num_workers"):
        plan_placement(None, None, None, 1.0, 0.0)
    with pytest.raises(ValueError, match="differs"):
        plan_placement(5, 2, 2, 1.0, 0.0)


def test_where_the_timeline_is_gathered(tmp_path: Path) -> None:
    assert timeline_directory(str(tmp_path / "opt"), {}) == str(tmp_path / "opt")
    env = {"HVDPROF_TIMELINE": str(tmp_path / "ours"), "HOROVOD_TIMELINE": "/x/t.json"}
    assert timeline_directory(None, env) == str(tmp_path / "ours")
    assert timeline_directory(None, {"HOROVOD_TIMELINE": str(tmp_path / "t.json")}) == str(
        tmp_path / "t.ranks"
    )
    assert timeline_directory(None, {"HOROVOD_TIMELINE": "DYNAMIC"}) is None
    assert timeline_directory(None, {}) is None


def test_the_failure_line_names_rank_and_node() -> None:
    class ActorDied(Exception):
        pass

    text = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RayWorker\n"
        "\tpid: 4011\n\tip: 10.0.0.5\nThe actor is dead because its worker process has died. "
        "Worker exit type: SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a "
        "connection error code 2. End of file. Some common causes include: ..."
    )
    reason = actor_death_reason(ActorDied(text))
    assert reason == (
        "its process (pid 4011) ended (SYSTEM_ERROR: Worker unexpectedly exits with a "
        "connection error code 2)"
    )
    place = WorkerPlace("host-a", "n1", "10.0.0.5", 4011, "1a2b3c4d5e6f")
    assert failure_line(1, place, True, reason, 3) == (
        "hvdprof ray: rank 1 (actor 1a2b3c4d on node 10.0.0.5 (host-a)) died: "
        + reason
        + "; the job is over, its other 3 ranks stopped"
    )


def test_the_job_is_put_down_to_a_dead_rank_before_its_echoes() -> None:
    class TaskError(Exception):
        def __init__(self, cause: BaseException) -> None:
            super().__init__(str(cause))
            self.cause = cause

    peer_gone = TaskError(HvdprofInternalError("hvdprof rank 0: communication failed"))
    assert is_echo(peer_gone) and not is_echo(TaskError(ValueError("bad batch")))
    echo = RankFailure(0, False, "HvdprofInternalError: ...", peer_gone, echo=True)
    raised = RankFailure(2, False, "ValueError: bad batch", ValueError("bad batch"))
    dead = RankFailure(3, True, "its process ended", RuntimeError())
    assert min([echo, raised, dead], key=RankFailure.blame_order) is dead
    assert min([echo, raised], key=RankFailure.blame_order) is raised


# --- a real cluster ---------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the head's whole session (``ray start --block`` stops what it started),
    then, soon (a test cluster has nothing to save), SIGKILL whatever of it is left."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=3)
    deadline = time.monotonic() + 1
    while time.monotonic() < deadline and _group_members(proc.pid):
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(timeout=5)


def _group_members(pgid: int) -> list[int]:
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError, IndexError, ValueError):
            stat = Path(f"/proc/{entry}/stat").read_text()
            fields = stat.rsplit(")", 1)[1].split()
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry))
    return members


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """A 2-CPU Ray head in its own session, and this process connected to it."""
    ray = _ray_or_skip()
    temp = tempfile.mkdtemp(prefix="hr", dir="/tmp")  # short: Ray's socket paths
    port = _free_port()
    # token auth off on both ends, explicitly: an earlier local ``ray.init()`` (Horovod's
    # own tests start such clusters) leaves ~/.ray/auth_token, and a head whose mode is
    # unset then turns token auth on, which this driver does not speak
    env = child_env({"RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"})
    auth_before = os.environ.get("RAY_AUTH_MODE")
    os.environ["RAY_AUTH_MODE"] = "disabled"
    env["PYTHONPATH"] = os.pathsep.join(
        [str(WORKERS), str(TESTS), str(REPO), env.get("PYTHONPATH", "")]
    ).rstrip(os.pathsep)
    env.pop("HVDTEST_DEADLINE_S", None)
    log_path = Path(temp) / "head.log"
    command = [
        str(Path(sys.executable).parent / "ray"),
        "start",
        "--head",
        "--block",
        "--num-cpus",
        "2",
        "--include-dashboard",
        "false",
        "--disable-usage-stats",
        "--temp-dir",
        temp,
        "--port",
        str(port),
        "--node-ip-address",
        "127.0.0.1",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=REPO,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + CLUSTER_START_S
        while b"block forever" not in log_path.read_bytes():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"ray start failed:\n{log_path.read_text(errors='replace')[-4000:]}")
            time.sleep(0.3)
        ray.init(address=f"127.0.0.1:{port}", log_to_driver=True, logging_level="warning")
        yield ray
    finally:
        with contextlib.suppress(Exception):
            ray.shutdown()
        _stop_group(proc)
        left = _group_members(proc.pid)
        for pid in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["rm", "-rf", temp], check=False, timeout=60)
        if auth_before is None:
            os.environ.pop("RAY_AUTH_MODE", None)
        else:
            os.environ["RAY_AUTH_MODE"] = auth_before


def _resources_back(ray: Any, before: dict[str, float]) -> bool:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = ray.available_resources()
        if all(now.get(k, 0.0) >= v for k, v in before.items() if k in ("CPU", "GPU")):
            return True
        time.sleep(0.3)
    return False


@pytest.mark.timeout(240)
def test_worker_actor_reports_its_host_and_takes_variables(ray_cluster: Any) -> None:
    from hvdprof.ray import BaseHorovodWorker, RayWorker

    assert BaseHorovodWorker is RayWorker
    assert RayWorker().hostname() == socket.gethostname()
    actor = ray_cluster.remote(RayWorker).options(num_cpus=0).remote()
    try:
        ray_cluster.get(actor.update_env_vars.remote({"TEST": 1123123}), timeout=60)
        assert ray_cluster.get(actor.env_vars.remote(), timeout=60)["TEST"] == "1123123"
    finally:
        ray_cluster.kill(actor)


@pytest.mark.timeout(120)
def test_infeasible_placement_times_out(ray_cluster: Any) -> None:
    from hvdprof.ray import RayExecutor

    before = ray_cluster.available_resources()
    settings = RayExecutor.create_settings(timeout_s=30, placement_group_timeout_s=3)
    job = RayExecutor(settings, num_hosts=1, num_slots=4)  # 4 CPUs on one node: there are 2
    with pytest.raises(TimeoutError, match="could not place 4 worker"):
        job.start()
    job.shutdown()
    assert not job.workers
    assert _resources_back(ray_cluster, before)


def _rank_and_size(worker: Any) -> tuple[int, int]:
    import hvdprof.torch as hvd

    hvd.init()
    return hvd.rank(), hvd.size()


def _log_values(count: int) -> int:
    from hvdprof.ray import ray_logger

    for i in range(count):
        ray_logger.log({"i": i, "rank": int(os.environ["HVDPROF_RANK"])})
    return count


def _times(num_epochs: int) -> int:
    import hvdprof.torch as hvd

    hvd.init()
    return hvd.rank() * num_epochs


def _settings_seen(worker: Any) -> dict[str, Any]:
    from hvdprof.runtime import runtime

    cfg = runtime.get().config
    return {
        "cycle_ms": cfg.cycle_time_ms,
        "fusion": cfg.fusion_threshold_bytes,
        "start_timeout": cfg.start_timeout_s,
        "extra": os.environ.get("RAY_TEST_EXTRA"),
    }


class _Executable:
    def __init__(self, epochs: int) -> None:
        import hvdprof.torch as hvd

        self.hvd = hvd
        self.epochs = epochs
        hvd.init()

    def rank_epoch(self) -> int:
        return self.hvd.rank() * self.epochs


@pytest.mark.timeout(240)
def test_executor_runs_functions_on_every_rank(
    ray_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hvdprof.ray import RayExecutor

    monkeypatch.setenv("HVDPROF_CYCLE_TIME", "3.5")
    monkeypatch.setenv("HOROVOD_FUSION_THRESHOLD", "1234567")
    before = ray_cluster.available_resources()
    job = RayExecutor(RayExecutor.create_settings(timeout_s=45), num_workers=2)
    try:
        job.start(
            executable_cls=_Executable, executable_args=[2], extra_env_vars={"RAY_TEST_EXTRA": "x"}
        )
        assert len(job.workers) == 2 and len(job.places) == 2
        assert job.execute(lambda w: w.rank_epoch()) == [0, 2]  # test_ray_executable
        assert job.execute(_rank_and_size) == [(0, 2), (1, 2)]  # test_ray_init
        assert job.run(_times, args=[3]) == [0, 3]  # test_ray_exec_func
        refs = job.run_remote(_times, args=[0])  # test_ray_exec_remote_func
        assert ray_cluster.get(refs, timeout=60) == [0, 0]
        assert job.execute_single(lambda w: w.rank_epoch()) == 0
        assert set(job.execute(lambda _: socket.gethostname())) == {socket.gethostname()}
        seen = job.execute(_settings_seen)  # the driver's variables reached every rank
        assert (
            seen[0]
            == seen[1]
            == {
                "cycle_ms": 3.5,
                "fusion": 1234567,
                "start_timeout": 45.0,
                "extra": "x",
            }
        )
        # Horovod's callbacks: rank 0's values alone, each to every callback, in order
        got: list[Any] = []
        assert job.run(_log_values, args=[3], callbacks=[got.append]) == [3, 3]
        assert got == [{"i": 0, "rank": 0}, {"i": 1, "rank": 0}, {"i": 2, "rank": 0}]
        assert job.execute(lambda w: _log_values(2), callbacks=[got.append]) == [2, 2]
        assert got[3:] == [{"i": 0, "rank": 0}, {"i": 1, "rank": 0}]
        # a call without callbacks after them: the workers no longer send to their queue
        assert job.run(_log_values, args=[1]) == [1, 1] and len(got) == 5
    finally:
        job.shutdown()
    assert not job.workers
    assert _resources_back(ray_cluster, before)  # test_local: every CPU came back


@pytest.mark.timeout(240)
def test_a_node_colocator_holds_the_cpus_its_workers_run_on(ray_cluster: Any) -> None:
    # Horovod's parts (NodeColocator, Coordinator) make a job hvd.init() accepts
    from hvdprof.ray.runner import Coordinator, NodeColocator

    ray = ray_cluster
    assert _resources_back(ray, {"CPU": 2.0})  # the cluster's 2 CPUs, all free
    colocator = NodeColocator.options(num_cpus=2).remote(
        node_rank=0, num_slots=2, world_size=2, use_gpu=False
    )
    try:
        node_id = ray.get(colocator.create_workers.remote(), timeout=60)
        workers = ray.get(colocator.get_workers.remote(), timeout=60)
        # the colocator holds both CPUs, so the workers could only start taking none
        places = ray.get([w.place.remote() for w in workers], timeout=60)
        assert [p.node_id for p in places] == [node_id, node_id]
        assert ray.available_resources().get("CPU", 0.0) == 0.0
        coord = Coordinator()
        for rank, place in zip(ray.get(colocator.world_ranks.remote()), places, strict=True):
            coord.register(place.hostname, world_rank=rank)
        port = ray.get(workers[0].free_port.remote(), timeout=60)
        env = coord.rank_environment(places[0].node_ip, port)
        ray.get([workers[r].update_env_vars.remote(env[r]) for r in env], timeout=60)
        assert ray.get([w.execute.remote(_rank_and_size) for w in workers], timeout=120) == [
            (0, 2),
            (1, 2),
        ]
    finally:
        ray.kill(colocator)
    assert _resources_back(ray, {"CPU": 2.0})
    deadline = time.monotonic() + 60  # its workers are its actors: they end with it
    with pytest.raises(ray.exceptions.RayActorError):
        while time.monotonic() < deadline:
            ray.get([w.hostname.remote() for w in workers], timeout=60)
            time.sleep(0.3)


# --- training: the same job as under hvdprof run, its timeline, a slowed rank -----------


@pytest.fixture(scope="module")
def ray_training(
    ray_cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> tuple[list[dict[str, Any]], Path]:
    from hvdprof.ray import RayExecutor

    timeline = tmp_path_factory.mktemp("ray") / "tl"
    settings = RayExecutor.create_settings(timeout_s=60, timeline=str(timeline))
    job = RayExecutor(settings, num_workers=2, cpus_per_worker=1)
    try:
        job.start()
        results = job.run(
            ray_train.train,
            kwargs={"steps": STEPS, "sleep_rank": SLOW_RANK, "sleep_ms": SLOW_MS},
        )
    finally:
        job.shutdown()
    return results, timeline


@pytest.mark.timeout(300)
def test_training_matches_hvdprof_run(
    ray_training: tuple[list[dict[str, Any]], Path], tmp_path: Path
) -> None:
    import torch

    results, _ = ray_training
    assert [(r["rank"], r["local_rank"], r["size"]) for r in results] == [(0, 0, 2), (1, 1, 2)]
    out = tmp_path / "params.pt"
    job = run_job("ray_train.py", 2, "--out", str(out), "--steps", str(STEPS), timeout=120)
    assert job.returncode == 0, job.describe()
    reference = torch.load(out)
    for ray_rank in results:
        assert len(ray_rank["params"]) == len(reference)
        for got, want in zip(ray_rank["params"], reference, strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    # and training moved them: the same seed's untrained model differs
    untrained, _ = ray_train._model_and_data(7, 0, 0)
    assert not torch.allclose(next(untrained.parameters()), reference[0])


@pytest.mark.timeout(120)
def test_the_timeline_names_the_slowed_rank(
    ray_training: tuple[list[dict[str, Any]], Path],
) -> None:
    import json

    from hvdprof.analysis import find_stragglers, load_run

    _, timeline = ray_training
    layout = json.loads((timeline / "ray.json").read_text())
    assert [r["rank"] for r in layout["ranks"]] == [0, 1] and layout["missing"] == {}
    assert {r["hostname"] for r in layout["ranks"]} == {socket.gethostname()}
    run = load_run(str(timeline), cache=False)
    found = find_stragglers(run)
    assert found.straggler == SLOW_RANK, found.verdict
    assert found.verdict.startswith(f"rank {SLOW_RANK} is the straggler")
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "analyze", str(timeline)],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"rank {SLOW_RANK} is the straggler" in proc.stdout


# --- failures -------------------------------------------------------------------------


@pytest.mark.timeout(180)
def test_a_dead_worker_ends_the_job_naming_rank_and_node(
    ray_cluster: Any, capfd: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from hvdprof.analysis import load_run
    from hvdprof.ray import RayExecutor, WorkerFailedError

    timeline = tmp_path / "tl"
    settings = RayExecutor.create_settings(timeout_s=60, failure_grace_s=20, timeline=str(timeline))
    job = RayExecutor(settings, num_workers=2)
    try:
        job.start()
        with pytest.raises(WorkerFailedError) as raised:
            job.run(ray_train.train_until_killed, kwargs={"die_rank": 1, "die_at": 3})
        place = job.places[1]
        err = raised.value
        assert err.rank == 1 and err.died and err.place == place
        message = str(err)
        assert message.startswith(f"rank 1 (actor {place.actor_id[:8]} on node {place.node_ip} (")
        assert f"died: its process (pid {place.pid}) ended" in message
        with pytest.raises(RuntimeError, match="this job has failed"):
            job.run(_times, args=[1])
    finally:
        job.shutdown()
    err_text = capfd.readouterr().err
    assert "hvdprof ray: rank 1 (actor " in err_text
    # the survivor shipped its timeline; the dead rank's was read from this node
    assert "rank 1's timeline recovered from " in err_text
    assert layout_missing(timeline) == {}
    assert load_run(str(timeline), cache=False).ranks == [0, 1]


def layout_missing(timeline: Path) -> dict[str, str]:
    import json

    return json.loads((timeline / "ray.json").read_text())["missing"]


@pytest.mark.timeout(240)
def test_the_elastic_executor_survives_a_removed_worker(ray_cluster: Any, tmp_path: Path) -> None:
    import json

    from hvdprof.analysis import load_run
    from hvdprof.ray import ElasticRayExecutor

    timeline = tmp_path / "tl"
    settings = ElasticRayExecutor.create_settings(
        min_np=1, max_np=2, timeout_s=30, timeline=str(timeline)
    )
    job = ElasticRayExecutor(settings, cpus_per_slot=1)
    job.start()
    try:
        results = job.run(lambda: ray_train.train_elastic(batches=40, kill_worker="1", kill_at=5))
    finally:
        job.shutdown()
    # every worker of the last generation finished every batch, and worker 1 was not one
    assert results and all(r["batch"] == 40 for r in results), results
    assert "1" not in {r["worker"] for r in results}
    assert [r["rank"] for r in results] == list(range(len(results)))
    first, second = job.history[0], job.history[1]
    assert first["workers"] == ["0", "1"] and first["reason"] == "start"
    assert second["workers"][0] == "0" and "1" not in second["workers"]
    assert second["reason"].startswith("rank 1 (worker 1, actor ") and " died: " in second["reason"]
    # each generation's timeline, gathered from the workers that lived to the end
    assert (timeline / "generation.1" / "rank.0.json").is_file()
    assert (timeline / "generation.2" / "rank.0.json").is_file()
    generations = json.loads((timeline / "elastic.json").read_text())["generations"]
    assert [g["generation"] for g in generations] == [g["generation"] for g in job.history]
    # the dead worker's part of generation 1 too: it ran on this (the driver's) node, so
    # its directory was read after it died; only a worker never admitted has no files
    assert "1" not in layout_missing(timeline) and set(layout_missing(timeline)) <= {"2"}
    assert load_run(str(timeline / "generation.1"), cache=False).ranks == [0, 1]


@pytest.mark.timeout(180)
def test_the_elastic_job_fails_below_min_np_naming_the_dead_worker(ray_cluster: Any) -> None:
    from hvdprof.ray import ElasticRayExecutor, WorkerFailedError

    settings = ElasticRayExecutor.create_settings(min_num_proc=2, max_num_proc=2, timeout_s=30)
    job = ElasticRayExecutor(settings, cpus_per_slot=1)
    job.start()
    try:
        with pytest.raises(WorkerFailedError) as raised:
            job.run(lambda: ray_train.train_elastic(batches=400, kill_worker="1", kill_at=3))
    finally:
        job.shutdown()
    message = str(raised.value)
    assert message.startswith("elastic job failed: 1 rank(s) left, fewer than min_np 2; gone: ")
    assert "rank 1 (worker 1, actor " in message and " died: its process (pid " in message
    assert raised.value.rank == 1 and raised.value.died


class _Collect:
    """A callback as a class with ``__call__`` (Horovod accepts either kind)."""

    def __init__(self) -> None:
        self.values: list[dict[str, Any]] = []

    def __call__(self, value: dict[str, Any]) -> None:
        self.values.append(value)


@pytest.mark.timeout(180)
def test_the_elastic_executor_hands_rank_0s_values_to_the_callbacks(ray_cluster: Any) -> None:
    from hvdprof.ray import ElasticRayExecutor

    settings = ElasticRayExecutor.create_settings(min_np=2, max_np=2, timeout_s=30)
    job = ElasticRayExecutor(settings, cpus_per_slot=1)
    seen: list[dict[str, Any]] = []
    collect = _Collect()
    job.start()
    try:
        results = job.run(
            lambda: ray_train.train_elastic(batches=8, kill_worker="none", report=True),
            callbacks=[seen.append, collect],
        )
    finally:
        job.shutdown()
    assert [r["batch"] for r in results] == [8, 8], results
    # rank 0 alone sends (chief_only), one value per committed batch, in the order sent,
    # and every callback gets every value
    assert [v["batch"] for v in seen] == list(range(1, 9)), seen
    assert {v["rank"] for v in seen} == {0}
    assert collect.values == seen
