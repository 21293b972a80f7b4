"""Values a Ray job's workers send to the driver, for ``ElasticRayExecutor.run``'s callbacks.

Horovod's ``horovod.ray.ray_logger``, by the same names: the user's function calls
``log({"epoch": 3, "loss": 0.21})`` and the driver calls every callback given to
``run(fn, callbacks=[...])`` with each value, in the order they were sent. By default
only rank 0 sends (``chief_only``), so one value per step reaches the driver however
many workers there are; in an elastic job rank 0 is whichever worker holds it in the
current generation.

The values travel through a ``ray.util.queue.Queue`` the executor opens for the run and
hands each worker (``RayWorker.set_queue``) before the function starts; they must be
picklable. ``log`` outside such a run (no callbacks) sends nothing and warns once.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from hvdprof.config import name_of

_queue: Any = None
_warned = False


def configure(queue: Any) -> None:
    """Send :func:`log`'s values to ``queue`` (the executor calls this on each worker)."""
    global _queue
    _queue = queue


def log(info: Any, chief_only: bool = True) -> None:
    """Send ``info`` to the driver's callbacks (only from rank 0 with ``chief_only``)."""
    global _warned
    if chief_only and _rank() != 0:
        return
    if _queue is None:
        if not _warned:
            warnings.warn(
                "ray_logger.log called but no callbacks receive it (give "
                "ElasticRayExecutor.run callbacks=[...])",
                stacklevel=2,
            )
            _warned = True
        return
    _queue.put(info)


def _rank() -> int | None:
    """This worker's rank now: the running runtime's, else its launcher's variable."""
    from hvdprof.runtime import runtime

    current = runtime.current()
    if current is not None:
        return current.rank
    raw = os.environ.get(name_of("rank"), "")
    return int(raw) if raw.isdigit() else None


# -- the driver's side ------------------------------------------------------------------
def open_queue() -> Any:
    """The queue a run's workers send to (:meth:`RayWorker.set_queue`); it takes no CPU."""
    from ray.util.queue import Queue

    return Queue(actor_options={"num_cpus": 0})


def deliver(queue: Any, callbacks: Sequence[Callable[[Any], Any]]) -> None:
    """Every value waiting in ``queue`` to every callback, in the order sent."""
    if queue is None:
        return
    count = queue.qsize()
    if not count:
        return
    for value in queue.get_nowait_batch(count):
        for callback in callbacks:
            callback(value)


def close_queue(queue: Any) -> None:
    if queue is not None:  # (the job is ending: a queue actor already gone is fine)
        with contextlib.suppress(Exception):
            queue.shutdown()
