"""Horovod's environment variables are honoured: a Horovod user's HOROVOD_TIMELINE,
HOROVOD_FUSION_THRESHOLD, HOROVOD_STALL_* ... work unchanged (ours win when both are
set), and HOROVOD_TIMELINE=FILE leaves a trace at FILE that opens in Perfetto."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_job

from hvdprof.config import Config, horovod_settings
from hvdprof.errors import ConfigError

pytestmark = pytest.mark.timeout(180)


def test_horovod_names_set_their_counterparts_and_ours_win():
    cfg = Config.from_env(
        {
            "HOROVOD_FUSION_THRESHOLD": "1048576",
            "HOROVOD_CYCLE_TIME": "3.5",
            "HOROVOD_CPU_OPERATIONS": "GLOO",
            "HOROVOD_STALL_CHECK_DISABLE": "1",
            "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": "30",
            "HOROVOD_LOG_LEVEL": "trace",
            "HOROVOD_AUTOTUNE": "1",
            "HOROVOD_CACHE_CAPACITY": "0",
            "HOROVOD_TIMELINE_MARK_CYCLES": "1",
            "HVDPROF_CACHE_CAPACITY": "7",  # ours wins
        }
    )
    assert cfg.fusion_threshold_bytes == 1048576
    assert cfg.cycle_time_ms == 3.5
    assert cfg.backend == "gloo"
    assert cfg.stall_check_time_s == 0.0
    assert cfg.stall_shutdown_time_s == 30.0
    assert cfg.log_level == "debug"
    assert cfg.autotune is True
    assert cfg.cache_capacity == 7
    assert cfg.timeline_mark_cycles is True
    # the tuner leaves settings the user made, by either name, alone
    assert {"HVDPROF_FUSION_THRESHOLD", "HVDPROF_CYCLE_TIME"} <= cfg.explicitly_set


def test_horovod_timeline_file_puts_the_ranks_beside_it(tmp_path):
    cfg = Config.from_env({"HOROVOD_TIMELINE": str(tmp_path / "timeline.json")})
    assert cfg.timeline_dir == str(tmp_path / "timeline.ranks")
    assert cfg.horovod_timeline_file == str(tmp_path / "timeline.json")


def test_values_hvdprof_cannot_take_are_errors_naming_horovods_variable():
    with pytest.raises(ConfigError, match="HOROVOD_CPU_OPERATIONS='ccl'"):
        Config.from_env({"HOROVOD_CPU_OPERATIONS": "ccl"})
    with pytest.raises(ConfigError, match=r"HOROVOD_CYCLE_TIME \(as HVDPROF_CYCLE_TIME\)='soon'"):
        Config.from_env({"HOROVOD_CYCLE_TIME": "soon"})
    assert horovod_settings({"HOROVOD_CYCLE_TIME": "2", "HVDPROF_CYCLE_TIME": "5"}) == {}


def test_a_horovod_users_job_gets_a_timeline_file_that_opens_in_perfetto(tmp_path):
    target = tmp_path / "timeline.json"
    result = run_job(
        "divergence_worker.py", 2, "0", timeout=120,
        env={"HOROVOD_TIMELINE": str(target), "HOROVOD_FUSION_THRESHOLD": "2097152"},
    )  # fmt: skip
    result.assert_done(2)
    said = [line for line in result.launcher if "honouring Horovod's variables" in line]
    assert len(said) == 1, result.describe()
    assert "HOROVOD_TIMELINE -> HVDPROF_TIMELINE=" in said[0]
    assert "HOROVOD_FUSION_THRESHOLD -> HVDPROF_FUSION_THRESHOLD=2097152" in said[0]
    ranks = tmp_path / "timeline.ranks"
    assert sorted(p.name for p in ranks.glob("rank.*.json")) == ["rank.0.json", "rank.1.json"]
    assert target.is_file() and not os.path.islink(target)
    doc = json.loads(target.read_text())
    events = doc["traceEvents"] if isinstance(doc, dict) else doc
    assert {e.get("pid") for e in events if e.get("ph") == "X"} >= {0, 1}
