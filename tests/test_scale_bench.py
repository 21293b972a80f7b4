"""The control-plane scale benchmark: its quick run, its model's fit, its simulator.

No timing is asserted: the numbers come from the full runs (docs/how-it-works.md).
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale_accounting  # noqa: E402
import scale_model  # noqa: E402
import scale_sim  # noqa: E402

POINT_FIELDS = {
    "engine",
    "ranks",
    "mode",
    "step_ms",
    "cycles",
    "slow_cycles",
    "names",
    "width",
    "rank0_negotiate_cpu_us",
    "rank0_negotiate_wall_us",
    "rank0_cpu_per_cycle_us",
    "rank0_wait_per_cycle_us",
    "worker_negotiate_cpu_us",
    "worker_cpu_per_cycle_us",
    "worker_wait_per_cycle_us",
}


@pytest.mark.timeout(240)
def test_quick_run_measures_hit_and_miss_at_each_rank_count(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale_bench.py"),
            "--quick",
            "--ranks",
            "2,3",
            "--fresh",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=220,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    points = doc["points"]
    assert sorted((p["ranks"], p["mode"]) for p in points) == [
        (2, "hit"),
        (2, "miss"),
        (3, "hit"),
        (3, "miss"),
    ]
    for p in points:
        assert set(p) >= POINT_FIELDS, sorted(POINT_FIELDS - set(p))
        assert p["tensors"] == 16 and p["width"] == 16
        assert p["cycles"] >= 1 and p["rank0_negotiate_cpu_us"] > 0
        if p["mode"] == "hit":  # every name came through the response cache
            assert p["slow_cycles"] == 0 and p["names"] == 0 and p["cache_hits"] == 16
        else:  # every name went to the coordinator
            assert p["slow_cycles"] >= 1 and p["names"] == 16
    assert set(doc["model"]["rank0"]["params_us"]) == set(scale_model.TERMS)
    assert "OVERSUBSCRIBED" in proc.stdout


def test_model_recovers_known_costs_from_synthetic_points() -> None:
    truth = {
        "step": 30.0,
        "cycle": 40.0,
        "msg": 6.0,
        "kb": 0.8,
        "name": 12.0,
        "item": 2.5,
        "msg_x_load": 0.3,
    }
    assert set(truth) == set(scale_model.TERMS)
    points = []
    for ranks in (2, 4, 8, 16, 32, 64):
        for tensors, cycles in ((16, 1.0), (64, 2.5)):
            for mode, slow, names in (("hit", 0, 0), ("miss", 1.5, tensors)):
                p = {"ranks": ranks, "mode": mode, "tensors": tensors, "width": tensors}
                p.update(cycles=cycles + (ranks % 3) / 2, slow_cycles=slow, names=names)
                for role in ("rank0", "worker"):
                    row = scale_model.design([p], role)[0]
                    p[f"{role}_negotiate_cpu_us"] = float(
                        sum(truth[t] * v for t, v in zip(scale_model.TERMS, row, strict=True))
                    )
                points.append(p)
    train = [p for p in points if p["ranks"] <= 16]
    held = [p for p in points if p["ranks"] > 16]
    params = scale_model.fit(train, "rank0", "rank0_negotiate_cpu_us")
    for term, value in truth.items():
        assert params[term] == pytest.approx(value, rel=1e-6), (term, params)
    errors = scale_model.held_out_errors(params, held, "rank0", "rank0_negotiate_cpu_us")
    assert len(errors) == 8 and all(abs(e["error"]) < 1e-6 for e in errors)


def test_reply_size_grows_with_ranks_and_names() -> None:
    """The reply's size comes from pickling the real coordinator's reply."""
    small = scale_model.reply_bytes(2, 4)
    assert scale_model.reply_bytes(64, 4) > small
    assert scale_model.reply_bytes(2, 16) > small
    assert scale_model.reply_bytes(8, 0) == 0


@pytest.mark.timeout(120)
def test_simulated_control_plane_runs_the_real_wire_protocol() -> None:
    """Each topology's cycles run on real channels: the full reply, the reduced one, a tree."""
    points = scale_sim.simulate(12, 4, cycles=2, processes=2, fanout=3)
    assert [(p["topology"], p["mode"]) for p in points] == [
        (t, m) for t in ("full", "star", "tree") for m in ("hit", "miss")
    ]
    for p in points:
        assert p["ranks"] == 12 and p["fanout"] == (3 if p["topology"] == "tree" else 0)
        assert p["rank0_cpu_per_cycle_us"] > 0 and p["worker_cpu_per_cycle_us"] > 0


@pytest.mark.timeout(300)
def test_quick_run_sets_the_star_against_a_tree(tmp_path: pathlib.Path) -> None:
    """--fanouts 0,2 at 4 ranks: one job per topology, both measured, the tree compared
    with the star (no timing asserted: only that the comparison is there and sound)."""
    out = tmp_path / "scale.json"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "scale_bench.py"),
            "--quick",
            "--ranks",
            "4",
            "--fanouts",
            "0,2",
            "--fresh",
            "--output",
            str(out),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(out.read_text())
    seen = sorted((p["fanout"], p["mode"], p["reply"]) for p in doc["points"])
    assert seen == [(k, m, "reduced") for k in (0, 2) for m in ("hit", "miss")]
    for p in doc["points"]:
        if p["mode"] == "hit":  # every name through the cache, in either topology
            assert p["slow_cycles"] == 0 and p["cache_hits"] == 16
        else:
            assert p["names"] == 16
    for p in doc["points"]:  # the timed phase's machine time, term by term
        a = p["accounting"]
        assert a["capacity_ms"] > 0 and a["steps"] == 6, a
        assert set(a["per_step_ms"]) >= {"ranks_cycle_negotiate", "ranks_training_threads", "idle"}
        assert a["per_step_ms"]["ranks_cycle_negotiate"] > 0
    rows = {(c["topology"], c["mode"]): c for c in doc["topologies"]}
    assert set(rows) == {(t, m) for t in ("star", "tree2") for m in ("hit", "miss")}
    assert rows[("star", "hit")]["rank0_cpu_vs_star"] == 1.0
    assert rows[("tree2", "hit")]["rank0_cpu_vs_star"] > 0
    assert set(doc["model"]["predicted_topologies"]["1024"]) >= {
        "full_hit_us",
        "star_hit_rank0_us",
        "tree8_hit_rank0_us",
        "tree8_hit_relay_us",
    }


def test_byte_cost_is_recovered_from_simulated_points() -> None:
    """The cost per KB rank 0 sends, taken from simulated hit cycles (fixed + calls + KB)."""
    sims = []
    for ranks in (16, 64, 256, 1024):
        c = scale_model.counts(ranks, 16, 16, 1, 0, 0, cores=ranks)["rank0"]
        cpu = 80.0 + 4.0 * c["msg"] + 0.4 * c["kb"]
        sims.append({"ranks": ranks, "mode": "hit", "tensors": 16, "rank0_cpu_per_cycle_us": cpu})
    assert scale_model.kb_cost_from_simulation(sims) == pytest.approx(0.4, rel=1e-6)
    assert scale_model.kb_cost_from_simulation(sims[:2]) is None  # too few to tell
    params = {t: 0.0 for t in scale_model.TERMS} | {"cycle": 80.0, "msg": 4.0, "kb": 0.4}
    shape = scale_model.shape_check(params, sims)
    assert [s["ranks"] for s in shape] == [16, 64, 256, 1024]
    assert all(abs(s["error"]) < 1e-3 for s in shape)


def test_accounting_names_every_term_of_the_machine_time() -> None:
    """Two ranks and one other process over a 1 s phase on 2 cores: what the kernel's
    counters say, term by term, and the residue is what neither source accounts for."""
    machine0 = dict.fromkeys(
        ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal"), 0.0
    )
    machine1 = {
        **machine0,
        "user": 1300.0,
        "system": 200.0,
        "idle": 300.0,
        "irq": 10.0,
        "steal": 50.0,
    }
    start = [
        {
            "pid": 10,
            "wall_ms": 0.0,
            "cycle_ms": {"negotiate": 0.0, "perform": 0.0},
            "machine": machine0,
            "processes": {10: ("python", 0.0), 11: ("python", 0.0), 99: ("pytest", 5.0)},
        },
        {"pid": 11, "wall_ms": 0.0, "cycle_ms": {"negotiate": 0.0, "perform": 0.0}},
    ]
    end = [
        {"pid": 10, "wall_ms": 1000.0, "cycle_ms": {"negotiate": 300.0, "perform": 200.0}, "main_ms": 100.0,
         "machine": machine1, "processes": {10: ("python", 700.0), 11: ("python", 500.0), 99: ("pytest", 205.0), 120: ("cc1", 40.0)}},
        {"pid": 11, "wall_ms": 1000.0, "cycle_ms": {"negotiate": 100.0, "perform": 100.0}, "main_ms": 50.0},
    ]  # fmt: skip
    a = scale_accounting.account(start, end, cores=2, steps=10)
    per = a["per_step_ms"]
    assert a["capacity_ms"] == 2000.0
    assert per["ranks_cycle_negotiate"] == 40.0 and per["ranks_cycle_perform"] == 30.0
    # 1,200 ms of the ranks' CPU: 700 in cycle threads, 150 in the training threads
    assert per["ranks_training_threads"] == 15.0 and per["ranks_other_threads"] == 35.0
    assert per["other_processes"] == 24.0  # pytest's 200 and a new process's 40
    assert per["idle"] == 30.0 and per["steal"] == 5.0 and per["interrupts"] == 1.0
    assert a["residue_ms_per_step"] == 20.0  # 2,000 - 1,800 of terms
    assert a["others_by_command_ms"] == {"pytest": 200.0, "cc1": 40.0}
    assert scale_accounting.account(start[1:], end[1:], 2, 10) == {}  # no machine view
