"""Live autotuning of fusion threshold, cycle time and the response cache: candidates seeded
from the job's structure, raced in paired windows, a winner confirmed by a sequential test.

One concept per module: ``space`` (what is searched, on what scale), ``seeds`` (which
candidates the job's own structure points at), ``scoring`` (one noise-robust score per
sample), ``paired`` (interleaved windows to ratios against the default), ``tuner``
(ask/tell racing and the sequential test, no runtime), ``summary`` (the one line said at
the end of a round), ``log`` (the crash-safe CSV log and its reader), ``drift`` (when to
re-open tuning) and ``controller`` (the rank-0 cycle observer that ties them to the runtime).
"""

from hvdprof.autotune.controller import AutotuneController
from hvdprof.autotune.drift import DriftDetector
from hvdprof.autotune.log import (
    LOG_COLUMNS,
    AutotuneTrialLog,
    TrialRow,
    read_autotune_log,
    read_decision,
)
from hvdprof.autotune.scoring import SampleScore, SampleWindow, StepTotals, score_steps
from hvdprof.autotune.seeds import JobStructure, seed_candidates
from hvdprof.autotune.space import SearchSpace, env_assignments, space_from_config
from hvdprof.autotune.summary import end_line
from hvdprof.autotune.tuner import Decision, Observation, PairedTuner

__all__ = [
    "LOG_COLUMNS",
    "AutotuneController",
    "AutotuneTrialLog",
    "Decision",
    "DriftDetector",
    "JobStructure",
    "Observation",
    "PairedTuner",
    "SampleScore",
    "SampleWindow",
    "SearchSpace",
    "StepTotals",
    "TrialRow",
    "end_line",
    "env_assignments",
    "read_autotune_log",
    "read_decision",
    "score_steps",
    "seed_candidates",
    "space_from_config",
]
