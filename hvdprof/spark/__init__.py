"""hvdprof on a Spark cluster: Horovod's ``horovod.spark.run`` for hvdprof jobs.

``run(fn, num_proc=N)`` runs ``fn`` as N ranks, one Spark task each, inside the current
PySpark application. Needs ``pip install 'hvdprof[spark]'`` and a Java runtime; nothing
in hvdprof imports this package.
"""

from __future__ import annotations

from hvdprof.spark.failures import TaskFailedError
from hvdprof.spark.place import TaskPlace
from hvdprof.spark.runner import run

__all__ = ["TaskFailedError", "TaskPlace", "run"]
