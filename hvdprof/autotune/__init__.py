"""Live autotuning of fusion threshold, cycle time and the response cache, by paired comparisons.

One concept per module: ``space`` (what is searched, on what scale), ``scoring`` (one
noise-robust score per sample), ``paired`` (interleaved windows to ratios against the default), ``tuner`` (ask/tell, no
runtime),
``log`` (the crash-safe CSV log and its reader), ``drift`` (when to re-open tuning) and
``controller`` (the rank-0 cycle observer that ties them to the runtime).
"""

from hvdprof.autotune.controller import AutotuneController, format_best
from hvdprof.autotune.drift import DriftDetector
from hvdprof.autotune.log import LOG_COLUMNS, AutotuneTrialLog, TrialRow, read_autotune_log
from hvdprof.autotune.scoring import SampleScore, SampleWindow, StepTotals, score_steps
from hvdprof.autotune.space import SearchSpace, env_assignments, space_from_config
from hvdprof.autotune.tuner import Observation, PairedTuner

__all__ = [
    "LOG_COLUMNS",
    "AutotuneController",
    "AutotuneTrialLog",
    "DriftDetector",
    "Observation",
    "PairedTuner",
    "SampleScore",
    "SampleWindow",
    "SearchSpace",
    "StepTotals",
    "TrialRow",
    "env_assignments",
    "format_best",
    "read_autotune_log",
    "score_steps",
    "space_from_config",
]
