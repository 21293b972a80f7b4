"""What the tuner says at the end of a round: one line, true, with the variables to paste.

Users of Horovod's tuner ask which row of its log to use and whether it finished. So the
round ends with exactly one line on rank 0's stderr, also recorded on the timeline (the
sample's ``decision``) and in the autotune log (a ``decision`` row), e.g.::

    hvdprof autotune: HVDPROF_CYCLE_TIME=0.5 — step time -14% against the default
    (95% interval -18% to -10%), confirmed over 60 paired steps

or, when nothing passed the test, ``hvdprof autotune: kept the default — nothing to set:
none of the 9 settings tried beat it with 95% confidence; the most promising, ...``
(a setting that measured faster, not surely), or ``...; no setting tried measured faster
than the default: the closest, ...`` (none is called promising when it measured slower). The default's own values are never printed as if they were a finding. Knobs the user pinned
(set explicitly, so never tuned) are named, with what the tuner believes the pin costs when
it can estimate it (see ``pin_cost``). Pure functions.
"""

from __future__ import annotations

import math

from hvdprof.autotune.seeds import JobStructure
from hvdprof.autotune.space import (
    CACHE_CAPACITY_VAR,
    CYCLE_TIME_VAR,
    FUSION_THRESHOLD_VAR,
    env_assignments,
)
from hvdprof.autotune.tuner import Decision, interval_text, kept_reason, percent
from hvdprof.common.records import TunableParams
from hvdprof.config import Config

PREFIX = "hvdprof autotune: "
#: the knobs the tuner may move, as variables
TUNABLE_VARS = (FUSION_THRESHOLD_VAR, CYCLE_TIME_VAR, CACHE_CAPACITY_VAR)


def changed_assignments(
    params: TunableParams, default: TunableParams, cache_capacity: int
) -> dict[str, str]:
    """The ``HVDPROF_*`` variables whose values differ between ``params`` and ``default``."""
    new = env_assignments(params, cache_capacity)
    old = env_assignments(default, cache_capacity)
    return {k: v for k, v in new.items() if old.get(k) != v}


def assignments_text(assignments: dict[str, str]) -> str:
    return " ".join(f"{k}={v}" for k, v in assignments.items())


def pin_cost(config: Config, structure: JobStructure | None) -> dict[str, str]:
    """Each pinned tunable variable -> what the tuner believes the pin costs, in words.

    A cycle time pinned above the default: the cycle thread's waits between cycles scale
    with the cycle time, so at the default they would shrink by ``default / pinned``; the
    step could be shorter by up to ``wait share x (1 - default / pinned)``. The tuner does
    not override a pin to measure it (Horovod's rule), so other pins are not estimated.
    """
    out: dict[str, str] = {}
    defaults = Config()
    for var in TUNABLE_VARS:
        if var not in config.explicitly_set:
            continue
        if var == CYCLE_TIME_VAR:
            pinned, default = config.cycle_time_ms, defaults.cycle_time_ms
            if pinned > default and structure is not None and structure.wait_fraction > 0:
                saving = structure.wait_fraction * (1 - default / pinned)
                out[var] = (
                    f"the cycle's waits were {structure.wait_fraction:.0%} of the step; at "
                    f"the default {default:g} ms the step might be up to {saving:.0%} shorter"
                )
                continue
        out[var] = "not tuned; its cost was not measured"
    return out


def pinned_text(config: Config, structure: JobStructure | None) -> str:
    """``; pinned by you (not tuned): HVDPROF_CYCLE_TIME=5 (...)``, or ``""``."""
    costs = pin_cost(config, structure)
    if not costs:
        return ""
    values = {
        FUSION_THRESHOLD_VAR: str(config.fusion_threshold_bytes),
        CYCLE_TIME_VAR: f"{config.cycle_time_ms:g}",
        CACHE_CAPACITY_VAR: str(config.cache_capacity),
    }
    parts = [f"{var}={values[var]} ({cost})" for var, cost in costs.items()]
    return "; pinned by you (not tuned): " + ", ".join(parts)


def end_line(
    decision: Decision,
    config: Config,
    steps_per_window: int,
    structure: JobStructure | None = None,
) -> str:
    """The one line said when a round ends (see the module doc)."""
    capacity = config.cache_capacity
    steps = decision.windows * steps_per_window
    if not decision.kept_default:
        changed = changed_assignments(decision.params, decision.default, capacity)
        how = "confirmed" if decision.confirmed else "measured"
        text = (
            f"{PREFIX}{assignments_text(changed)} — step time "
            f"{percent(decision.step_time_change())} against the default "
            f"({interval_text(decision)}), {how} over {steps} paired steps"
        )
    else:
        text = f"{PREFIX}kept the default — nothing to set: {kept_reason(decision)}"
        best = decision.best_tried
        # too noisy: no measurement is worth naming; default best: the line said how the
        # settings measured (an estimate of one dropped early would read as a contradiction)
        named = decision.reason not in ("too noisy", "default best")
        if named and best is not None and math.isfinite(decision.std_error):
            changed = changed_assignments(best, decision.default, capacity)
            change = decision.step_time_change()
            # "promising" only for a setting that measured faster: a slower best is the
            # least slow, and the line says the default was the fastest measured
            text += (
                f"; the most promising, {assignments_text(changed)}, measured step time "
                if percent(change).startswith("-")
                else f"; no setting tried measured faster than the default: the closest, "
                f"{assignments_text(changed)}, measured step time "
            ) + f"{percent(change)} ({interval_text(decision)}) over {steps} paired steps"
    return text + pinned_text(config, structure)


def stopped_line(
    windows: int,
    config: Config | None = None,
    structure: JobStructure | None = None,
    steps_used: int = 0,
    budget_steps: int = 0,
) -> str:
    """Said at exit when the job ended before the round did: the job was too short to
    tune at this budget, and nothing is recommended (no decision row is logged, so
    ``--autotune-from`` has nothing to start from)."""
    text = (
        f"{PREFIX}the job ended while tuning ({windows} windows measured, no decision "
        "yet): nothing to set"
    )
    if budget_steps > 0:
        text += (
            f" — too short to tune: the round had used {steps_used} of its "
            f"{budget_steps}-step budget"
        )
    return text + ("" if config is None else pinned_text(config, structure))


def assignments_from_log(path: str) -> tuple[dict[str, str], bool]:
    """The variables an earlier job's tuner decided, from its autotune log's last decision
    row, and whether that decision kept the default (then there is nothing to set: ``{}``).

    Raises ``ValueError`` naming the file when it is missing, not an autotune log, or holds
    no decision (the job ended before a round did).
    """
    import os

    from hvdprof.autotune.log import ROLE_KEPT, read_decision

    if not os.path.isfile(path):
        raise ValueError(f"{path}: no such file")
    row = read_decision(path)
    if row.role == ROLE_KEPT:
        return {}, True
    return env_assignments(row.params, Config().cache_capacity), False
