"""How a Spark job of hvdprof ends when one of its tasks dies or raises.

The driver learns of it twice: at once, from the task's connection to it (a dead
process's connection closes; a raising function reports its exception), and a moment
later from Spark, whose barrier stage then fails and kills the other tasks. The first
gives the rank and where it ran; Spark's message gives the cause of a death
("Python worker exited unexpectedly (crashed)", a lost executor), read by
:func:`spark_cause`.
"""

from __future__ import annotations

import re

from hvdprof.cluster.failures import first_line
from hvdprof.errors import HvdprofError
from hvdprof.spark.place import TaskPlace

#: every line the driver prints starts with this
LOG_PREFIX = "hvdprof spark: "

#: Spark's words for why a task's process or executor went away, most telling first
_CAUSES = (
    re.compile(r"(ExecutorLostFailure \([^\n]*)"),
    re.compile(r"(Python worker exited unexpectedly[^\n]*)"),
    re.compile(r"(Connection reset by peer[^\n]*)"),
    re.compile(r"(EOFException[^\n]*)"),
)


#: the exception line that ends a Python traceback Spark relays (``ValueError: bad``)
_PYTHON_RAISED = re.compile(
    r"PythonException:.*?Traceback \(most recent call last\):\n(?:[ \t].*\n)*([\w.]+(?::[^\n]*)?)\n",
    re.S,
)


class TaskFailedError(HvdprofError):
    """A rank of a Spark job died or raised; the job is over."""

    def __init__(self, message: str, rank: int | None, place: TaskPlace | None, died: bool) -> None:
        super().__init__(message)
        self.rank = rank
        self.place = place
        self.died = died


def spark_cause(text: str) -> str:
    """The clause of Spark's job failure that says why a task's process ended, or ""."""
    for pattern in _CAUSES:
        found = pattern.search(text)
        if found:
            # its first sentence: Spark goes on with advice ("Consider setting ...")
            return re.split(r"\.\s+(?=[A-Z])", found[1].strip(), maxsplit=1)[0].rstrip(".")
    return ""


def spark_summary(text: str) -> str:
    """One line for a Spark job failure that no task reported itself: the Python
    exception a task raised (the last line of its traceback), else why Spark says a task
    ended, else the reason Spark aborted the job."""
    raised = _PYTHON_RAISED.search(text)
    if raised:
        return raised[1].strip()
    cause = spark_cause(text)
    if cause:
        return cause
    reason = re.search(r"(Job aborted due to stage failure: [^\n]*)", text)
    return reason[1].strip() if reason else first_line(text)


def death_reason(pid: int, cause: str) -> str:
    """``its process (pid 4011) ended (Python worker exited unexpectedly (crashed))``."""
    return f"its process (pid {pid}) ended" + (f" ({cause})" if cause else "")
