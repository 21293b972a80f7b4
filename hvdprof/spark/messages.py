"""What a Spark task and the driver say to each other, one typed message each.

They travel over ``multiprocessing.connection`` (pickled, after its HMAC handshake with
a key only this job knows), so a message is any of these small classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hvdprof.spark.place import TaskPlace


@dataclass(frozen=True)
class Register:
    """Task -> driver, first: where the task runs and a port free on its host now."""

    place: TaskPlace
    free_port: int
    #: the directory the task records its timeline into ("" when none is wanted)
    staging: str = ""


@dataclass(frozen=True)
class Assignment:
    """Driver -> task, once every task registered: its rank and environment."""

    rank: int
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Output:
    """Task -> driver: one line the user's function wrote to ``stdout`` or ``stderr``."""

    stream: str
    text: str


@dataclass(frozen=True)
class TimelineFiles:
    """Task -> driver: every file of the rank's timeline, by path relative to its directory."""

    files: dict[str, bytes]


@dataclass(frozen=True)
class Outcome:
    """Task -> driver, last: how the user's function ended."""

    ok: bool
    reason: str = ""
    #: it failed because a peer went away (``HvdprofInternalError``): an echo
    echo: bool = False
