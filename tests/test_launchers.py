"""Jobs started by mpirun, torchrun and Slurm, and jobs whose ranks sit on two "hosts".

The detection rules are checked on hand-written environments first (what each launcher
sets, read from their documentation); then real jobs run under each launcher with
``workers/engines_worker.py``, which checks rank, size, local and cross ranks against the
launcher's own variables and the host names, and every collective's values. Slurm is
not installed here, so its run sets the ``SLURM_*`` variables by hand, as ``srun`` would.
Two "hosts" on one machine: ``HVDPROF_HOSTNAME`` gives each rank its host name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, WORKERS, JobResult, child_env, run_job
from launch_support import mpi_or_skip, run_command, run_mpi, run_slurm_style, run_torchrun

from hvdprof.config import Config
from hvdprof.errors import ConfigError
from hvdprof.runtime import environment as envmod
from hvdprof.runtime.runtime import resolve_topology

pytestmark = pytest.mark.timeout(400)

SECTIONS = ("topology", "engine", "collectives", "shutdown")


# ------------------------------------------------------------------ detection rules
@pytest.mark.parametrize(
    ("env", "launcher", "expected"),
    [
        (
            {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
             "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"},
            envmod.OPENMPI, (3, 4, 1, 2),
        ),
        (
            {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "1"},
            envmod.MPICH, (2, 3, 0, 1),
        ),
        (
            {"RANK": "1", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
             "MASTER_ADDR": "node7", "MASTER_PORT": "29501"},
            envmod.TORCHRUN, (1, 4, 1, 2),
        ),
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_NODELIST": "gpu[03-06]", "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_JOB_ID": "77"},
            envmod.SLURM, (5, 8, 1, 2),
        ),
        ({"HVDPROF_RANK": "0", "HVDPROF_SIZE": "2"}, envmod.HVDPROF, (None, None, None, None)),
        ({}, envmod.NONE, (None, None, None, None)),
    ],
    ids=["openmpi", "mpich", "torchrun", "slurm", "hvdprof", "none"],
)  # fmt: skip
def test_detect_reads_each_launchers_variables(
    env: dict[str, str], launcher: str, expected: tuple[int | None, ...]
) -> None:
    launch = envmod.detect(env)
    assert launch.launcher == launcher
    assert (launch.rank, launch.size, launch.local_rank, launch.local_size) == expected
    assert launch.is_mpi == (launcher in (envmod.OPENMPI, envmod.MPICH))


def test_torchrun_and_slurm_give_the_rendezvous_address() -> None:
    torch_env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "node7", "MASTER_PORT": "29501",
                 "TORCHELASTIC_USE_AGENT_STORE": "True", "TORCHELASTIC_RESTART_COUNT": "2"}  # fmt: skip
    launch = envmod.detect(torch_env)
    assert (launch.addr, launch.port, launch.agent_store) == ("node7", 29501, True)
    assert launch.namespace == "attempt2/"  # a restarted attempt never reads old keys
    cfg = envmod.with_launcher_rendezvous(Config(), launch)
    assert (cfg.controller_addr, cfg.controller_port) == ("node7", 29501)
    # explicit HVDPROF_CONTROLLER_* win over the launcher's
    explicit = Config.from_env(
        {"HVDPROF_CONTROLLER_ADDR": "10.0.0.1", "HVDPROF_CONTROLLER_PORT": "5"}
    )
    cfg = envmod.with_launcher_rendezvous(explicit, launch)
    assert (cfg.controller_addr, cfg.controller_port) == ("10.0.0.1", 5)

    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_NODELIST": "cn[009-012],big1",
             "SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "3"}  # fmt: skip
    launch = envmod.detect(slurm)
    assert launch.addr == "cn009"
    assert launch.port == 20000 + (16 * 123456 + 3) % 10000
    other_step = envmod.detect({**slurm, "SLURM_STEP_ID": "4"})
    assert other_step.port != launch.port  # two steps of a job do not collide
    # srun's step variables win over the allocation's
    step = envmod.detect({**slurm, "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "x1"})
    assert (step.size, step.addr) == (2, "x1")


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [("node1", "node1"), ("node[1-3]", "node1"), ("n[007,9]", "n007"), ("a[2-4]-ib,b1", "a2-ib"),
     ("gpu01,gpu02", "gpu01"), ("10.1.2.3", "10.1.2.3")],
)  # fmt: skip
def test_first_slurm_node(nodelist: str, first: str) -> None:
    assert envmod.first_slurm_node(nodelist) == first


@pytest.mark.parametrize("bad", ["", "[1-2]x", "node[a-b]"])
def test_malformed_slurm_nodelist_is_named(bad: str) -> None:
    with pytest.raises(ConfigError, match="SLURM_NODELIST"):
        envmod.first_slurm_node(bad)


def test_resolve_topology_from_launchers_and_malformed_values() -> None:
    t = resolve_topology(Config(), {"PMI_RANK": "1", "PMI_SIZE": "2"})
    assert (t.rank, t.size) == (1, 2)
    with pytest.raises(ConfigError, match="OMPI_COMM_WORLD_RANK='x'"):
        resolve_topology(Config(), {"OMPI_COMM_WORLD_RANK": "x", "OMPI_COMM_WORLD_SIZE": "2"})
    # hvdprof run's own variables win over anything else in the environment
    t = resolve_topology(Config(rank=0, size=3), {"RANK": "1", "WORLD_SIZE": "2"})
    assert (t.rank, t.size) == (0, 3)


def test_host_topology_and_host_name_override() -> None:
    hosts = ["b", "b", "a", "b", "a"]
    got = [envmod.host_topology(hosts, r) for r in range(5)]
    # hosts numbered by their lowest rank: b is 0, a is 1
    assert got == [(0, 3, 0, 2), (1, 3, 0, 2), (0, 2, 1, 2), (2, 3, 0, 2), (1, 2, 1, 2)]
    assert envmod.host_name(2, "h0,h0,h1") == "h1"
    assert envmod.host_name(0, "solo") == "solo"
    with pytest.raises(ConfigError, match="none for rank 3"):
        envmod.host_name(3, "h0,h1")


def test_auto_picks_mpi_only_when_mpi_started_the_job() -> None:
    mpi = envmod.Launch(envmod.OPENMPI, 0, 2)
    torchrun = envmod.Launch(envmod.TORCHRUN, 0, 2)
    assert envmod.data_backend("auto", mpi, True) == "mpi"
    assert envmod.data_backend("auto", mpi, False) == "gloo"  # no mpi4py: Gloo
    assert envmod.data_backend("auto", torchrun, True) == "gloo"
    assert envmod.data_backend("gloo", mpi, True) == "gloo"
    assert envmod.data_backend("mpi", torchrun, True) == "mpi"  # (refused at init)
    with pytest.raises(ConfigError, match=r"needs an MPI launcher.*torchrun"):
        envmod.check_mpi_launch(torchrun, 2)


# ------------------------------------------------------------------ real launches
def infos(result: JobResult, rank: int) -> dict[str, str]:
    return dict(v.split(" ", 1) for v in result.values(rank, "INFO"))


def assert_job(result: JobResult, num_proc: int) -> None:
    for section in SECTIONS:
        result.assert_section(section, num_proc)
    result.assert_done(num_proc)


def test_mpirun_auto_uses_mpi_and_shared_memory_on_one_host() -> None:
    result = run_mpi("engines_worker.py", 2, "-")
    assert_job(result, 2)
    for rank in range(2):
        info = infos(result, rank)
        assert info["launcher"] in (envmod.OPENMPI, envmod.MPICH), info
        assert (info["engine"], info["shm"], info["control"]) == ("mpi", "1", "MpiControlChannel")


@pytest.mark.parametrize(("np", "backend"), [(2, "auto"), (3, "mpi")])
def test_mpich_hydra_mpiexec(np: int, backend: str) -> None:
    """MPICH's Hydra sets PMI_RANK/PMI_SIZE and MPI_LOCALRANKID/MPI_LOCALNRANKS."""
    result = run_mpi(
        "engines_worker.py", np, "-", env={"HVDPROF_BACKEND": backend}, mpich=True, timeout=200
    )
    assert_job(result, np)
    for rank in range(np):
        info = infos(result, rank)
        shm = "1" if backend == "auto" else "0"
        assert (info["launcher"], info["engine"], info["shm"]) == (envmod.MPICH, "mpi", shm)


def test_mpirun_with_gloo_data_keeps_control_on_mpi() -> None:
    """HVDPROF_BACKEND=gloo under mpirun: no port configured, rank 0 opens Gloo's store on
    a port it announces over MPI; 3 ranks."""
    result = run_mpi("engines_worker.py", 3, "-", env={"HVDPROF_BACKEND": "gloo"})
    assert_job(result, 3)
    for rank in range(3):
        info = infos(result, rank)
        assert (info["engine"], info["shm"], info["control"]) == ("gloo", "0", "MpiControlChannel")


def test_torchrun_needs_no_extra_variable() -> None:
    result = run_torchrun("engines_worker.py", 2, "-")
    assert_job(result, 2)
    for rank in range(2):
        info = infos(result, rank)
        assert (info["launcher"], info["engine"], info["shm"]) == (envmod.TORCHRUN, "gloo", "1")


def test_slurm_style_run_finds_its_rendezvous_from_the_slurm_variables() -> None:
    result = run_slurm_style("engines_worker.py", 2, "-")
    assert_job(result, 2)
    for rank in range(2):
        info = infos(result, rank)
        assert (info["launcher"], info["engine"], info["shm"]) == (envmod.SLURM, "gloo", "1")


def test_hvdprof_run_with_two_host_names() -> None:
    env = {"HVDPROF_HOSTNAME": "hostA,hostB"}
    result = run_job("engines_worker.py", 2, "hostA,hostB", env=env, timeout=120)
    assert_job(result, 2)
    assert all(infos(result, r)["shm"] == "0" for r in range(2))


def test_two_hosts_under_mpirun_timeline_and_clock(tmp_path: Path) -> None:
    """4 ranks on two "hosts" (2 + 2): local/cross ranks, no shared memory, the timeline
    names both hosts, records launcher and backend, and the clock offset of the second
    host's ranks (run 30 ms ahead) is estimated and undone."""
    hosts = "hostA,hostA,hostB,hostB"
    skew_us = 30_000.0
    tl = tmp_path / "tl"
    env = {"HVDPROF_HOSTNAME": hosts, "HVDPROF_TIMELINE": str(tl)}
    result = run_mpi("engines_worker.py", 4, hosts, "--skew-us", str(skew_us), env=env, timeout=200)
    assert_job(result, 4)
    manifests = {r: json.loads((tl / f"manifest.rank.{r}.json").read_text()) for r in range(4)}
    assert [manifests[r]["hostname"] for r in range(4)] == hosts.split(",")
    for m in manifests.values():
        assert m["backend"] == "mpi" and m["launcher"] in (envmod.OPENMPI, envmod.MPICH), m
    for rank in (2, 3):
        clock = manifests[rank]["clock"]
        assert clock["samples"] > 0 and clock["skew_us"] == skew_us
        assert abs(clock["offset_ns"] + skew_us * 1000) <= clock["error_ns"] + 3_000_000, clock
    merged = tmp_path / "merged.json"
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "timeline", "merge", str(tl), "-o", str(merged)],
        capture_output=True, text=True, timeout=120, env=child_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = json.loads(merged.read_text())["traceEvents"]
    names = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert any("hostA" in n for n in names) and any("hostB" in n for n in names), names
    assert any(str(e.get("name", "")).startswith("MPI_ALLREDUCE") for e in events)
    # aligned: the k-th MPI_ALLREDUCE call of rank 0 and of rank 2 (the same collective:
    # negotiation makes every rank's groups alike) overlap once the offset is applied
    pids = {
        e["pid"]: int(e["args"]["name"].split()[1])
        for e in events
        if e.get("name") == "process_name"
    }
    calls: dict[int, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("name") == "MPI_ALLREDUCE" and e.get("ph") == "X" and e["pid"] in pids:
            calls.setdefault(pids[e["pid"]], []).append((e["ts"], e["ts"] + e["dur"]))
    first, other = sorted(calls[0]), sorted(calls[2])
    assert len(first) == len(other) >= 3, (len(first), len(other))
    tol_us = manifests[2]["clock"]["error_ns"] / 1000 + 1000
    for (s0, e0), (s2, e2) in zip(first, other, strict=True):
        assert e0 >= s2 - tol_us and e2 >= s0 - tol_us, ((s0, e0), (s2, e2), tol_us)


def test_shm_across_hosts_is_refused_with_the_reason() -> None:
    env = {"HVDPROF_HOSTNAME": "hostA,hostB", "HVDPROF_BACKEND": "shm"}
    result = run_job("engines_worker.py", 2, "hostA,hostB", env=env, timeout=90)
    assert result.returncode != 0
    assert "HVDPROF_BACKEND=shm needs every rank on one host" in result.output, result.describe()
    assert "span 2 hosts" in result.output


def test_mpi_backend_under_hvdprof_run_says_to_use_mpirun() -> None:
    pytest.importorskip("mpi4py")
    result = run_job("engines_worker.py", 2, "-", env={"HVDPROF_BACKEND": "mpi"}, timeout=90)
    assert result.returncode != 0
    assert "HVDPROF_BACKEND=mpi needs an MPI launcher" in result.output, result.describe()
    assert "mpirun -np 2" in result.output


def test_host_name_override_is_checked_at_init() -> None:
    code = "import hvdprof.torch as hvd; hvd.init()"
    env = child_env({"HVDPROF_HOSTNAME": "a,b,c"})
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr  # a list longer than the job is fine
    env["HVDPROF_HOSTNAME"] = ","
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env,
        cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0, proc.stderr
    assert "HVDPROF_HOSTNAME=',' is malformed" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ hvdprof run -H
def test_hvdprof_run_with_hosts_delegates_to_mpirun(tmp_path: Path) -> None:
    """``-H localhost:1,127.0.0.1:1``: two host entries that are both this machine, so
    mpirun starts both ranks here; run's options reach the ranks (the timeline is
    written), and the runtime finds itself under MPI."""
    mpi_or_skip()
    tl = tmp_path / "tl"
    command = [
        sys.executable, "-m", "hvdprof", "run", "-H", "localhost:1,127.0.0.1:1", "--verbose",
        "--timeout", "150", "--timeline", str(tl), "--",
        sys.executable, str(WORKERS / "launched.py"), str(WORKERS / "engines_worker.py"), "-",
    ]  # fmt: skip
    result = run_command(command, child_env({"OMP_NUM_THREADS": "1"}), 180)
    assert_job(result, 2)
    assert "mpirun -np 2 -H localhost:1,127.0.0.1:1" in result.output, result.describe()
    for rank in range(2):
        assert infos(result, rank)["launcher"] in (envmod.OPENMPI, envmod.MPICH)
        manifest = json.loads((tl / f"manifest.rank.{rank}.json").read_text())
        assert manifest["backend"] == "mpi"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["-H", "host1:x"], "-H 'host1:x' is malformed at 'host1:x'"),
        (["-H", "a:2,:1"], "is malformed at ':1'"),
        (["-np", "5", "-H", "a:2,b:2"], "-np 5 is more than the 4 slots"),
    ],
)
def test_hvdprof_run_hosts_errors(argv: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "hvdprof", "run", *argv, "--", "true"],
        capture_output=True, text=True, timeout=60, env=child_env(), cwd=REPO,
    )  # fmt: skip
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_missing_rendezvous_hint_names_what_to_do() -> None:
    assert "pip install 'hvdprof[mpi]'" in envmod.missing_rendezvous_hint(
        envmod.Launch(envmod.OPENMPI, 0, 2)
    )
    assert "hvdprof run -np N" in envmod.missing_rendezvous_hint(envmod.Launch(envmod.NONE))
