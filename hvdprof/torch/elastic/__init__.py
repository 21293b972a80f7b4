"""``hvd.elastic``: training that survives ranks leaving and joining (Horovod's API).

``@hvd.elastic.run`` wraps the training function. When a collective fails because a rank
died, every survivor gets ``HorovodInternalError``; the wrapper restores the last
``commit()``, shuts the runtime down, joins the next generation of the job that the
launcher (``hvdprof run --min-np N --max-np M``) publishes, syncs the state from the new
rank 0, runs the reset callbacks and calls the function again. When workers are added,
``HostsUpdatedInterrupt`` leaves the function at the next ``commit()`` on every rank and
the job re-forms the same way, without a rollback.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from hvdprof.errors import HvdprofError, HvdprofInternalError
from hvdprof.runtime import elastic as _membership
from hvdprof.torch.elastic.sampler import ElasticSampler
from hvdprof.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState

log = logging.getLogger("hvdprof")
F = TypeVar("F", bound=Callable[..., Any])

#: the instant event that opens a re-formed generation's timeline (args: the record below)
REFORM_EVENT = "elastic.reform"
#: (seconds, what) of every reset this process went through: failure seen -> re-formed
resets: list[dict[str, Any]] = []


def run(func: F) -> F:
    """Run ``func(state, ...)``, re-forming the job and retrying after every reset.

    Outside an elastic job (no ``hvdprof run --min-np/--max-np``) a failure is final:
    ``HorovodInternalError`` propagates, as there is nobody to re-form with.
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> Any:
        skip_sync = False
        while True:
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HvdprofInternalError as exc:
                if _membership.membership() is None:
                    raise
                failed_at = time.monotonic()
                log.warning("hvdprof: %s; restoring the last commit and re-forming", exc)
                state.restore()
                skip_sync = False
                _reset(failed=True, since=failed_at, reason=str(exc).splitlines()[0])
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
                _reset(failed=False, since=time.monotonic(), reason="hosts updated")
            state.on_reset()

    return wrapper  # type: ignore[return-value]


def _reset(failed: bool, since: float, reason: str) -> None:
    """Shut the runtime down and join the next generation (retrying failed rendezvous)."""
    from hvdprof.runtime import runtime as _rt
    from hvdprof.torch import mpi_ops

    old = _rt.current()
    old_size = old.size if old is not None else 0
    old_rank = old.rank if old is not None else -1
    mpi_ops.shutdown()
    if failed:
        _membership.request_reset()
    attempts = 0
    while True:
        try:
            mpi_ops.init()
            break
        except HvdprofError as exc:
            attempts += 1
            if attempts >= 5:
                raise
            log.warning("hvdprof: re-forming the elastic job failed (%s); retrying", exc)
            _membership.request_reset()
    runtime = _rt.get()
    m = _membership.membership()
    record = {
        "generation": m.generation if m is not None else 0,
        "old_size": old_size,
        "new_size": runtime.size,
        "old_rank": old_rank,
        "new_rank": runtime.rank,
        "failed": failed,
        "reason": reason,
        "reform_s": time.monotonic() - since,
        # wall clock, comparable across the processes of one host (benchmarks use it)
        "seen_unix_ns": time.time_ns() - int((time.monotonic() - since) * 1e9),
        "reformed_unix_ns": time.time_ns(),
    }
    resets.append(record)
    sink = getattr(runtime.timeline, "sink", None)
    if sink is not None:  # the first event of the new generation's timeline
        sink.add_instant(REFORM_EVENT, record, scope="g")
    log.warning(
        "hvdprof: elastic job re-formed: generation %d, %d -> %d ranks (this worker: rank %d)",
        record["generation"],
        old_size,
        runtime.size,
        runtime.rank,
    )


__all__ = [
    "ElasticSampler",
    "HostsUpdatedInterrupt",
    "ObjectState",
    "State",
    "TorchState",
    "resets",
    "run",
]
