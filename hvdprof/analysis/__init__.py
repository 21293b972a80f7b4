"""Trace analysis: answers to "why is my step slow?" from hvdprof and Horovod timelines.

Reading lives in one place (:mod:`hvdprof.analysis.loader`, into the columnar
:class:`Run` of :mod:`hvdprof.analysis.model`); each question is one module with one
plain function over a :class:`Run`. The CLI (``hvdprof analyze`` / ``hvdprof diff``), the
dashboard and the tests all call these functions. Every result is a dataclass with
``to_dict()`` (JSON-safe) and, where it makes sense, a plain-words ``verdict``.
"""

from hvdprof.analysis.loader import LoadError, load_run
from hvdprof.analysis.model import PHASES, Problem, Run

__all__ = ["PHASES", "LoadError", "Problem", "Run", "load_run"]
