"""The worker's side of an elastic job: which generation to join, as which rank.

``hvdprof run --min-np/--max-np`` (:mod:`hvdprof.launch.elastic_driver`) hosts a key-value
store (a ``torch.distributed.TCPStore``) that outlives every worker, and publishes the
job's membership there, one *generation* at a time:

* ``elastic/gen``: the newest generation number;
* ``elastic/plan/<g>``: JSON ``{"workers": [ids in rank order], "reason": ..., ...}``.

A worker (identified by ``HVDPROF_ELASTIC_WORKER``) waits for a generation that names it,
takes its rank from its position in the list, and meets the other members under
``hvdprof/init<g>/`` in the same store, so no rank has to host the rendezvous (rank 0 may
be the one that died). A worker whose collective failed asks for a new generation by
bumping ``elastic/reset/<g>``; the launcher answers with the workers still alive.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from dataclasses import dataclass
from typing import Any

from hvdprof.config import Config
from hvdprof.errors import ConfigError, HvdprofError

GEN_KEY = "elastic/gen"
_POLL_S = 0.02


def plan_key(generation: int) -> str:
    return f"elastic/plan/{generation}"


def reset_key(generation: int) -> str:
    return f"elastic/reset/{generation}"


def ready_key(worker: str) -> str:
    return f"elastic/ready/{worker}"


@dataclass
class Membership:
    """The generation this process last joined, and where its store is."""

    worker: str
    store: Any
    generation: int = 0
    workers: tuple[str, ...] = ()
    #: (generation, old size, new size, reason) of every generation this process joined
    history: list[dict[str, Any]] | None = None


_membership: Membership | None = None


def split_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ConfigError(f"HVDPROF_ELASTIC_STORE={text!r} is malformed: it accepts HOST:PORT")
    return host, int(port)


def membership() -> Membership | None:
    """This process's elastic membership, or None outside an elastic job."""
    return _membership


def _connect(cfg: Config) -> Membership:
    global _membership
    if _membership is None:
        import torch.distributed as dist

        if not cfg.elastic_worker:
            raise ConfigError(
                "HVDPROF_ELASTIC_STORE is set but HVDPROF_ELASTIC_WORKER is not: start elastic "
                "jobs with `hvdprof run --min-np N --max-np M`"
            )
        host, port = split_address(cfg.elastic_store)
        try:
            store = dist.TCPStore(
                host,
                port,
                is_master=False,
                timeout=datetime.timedelta(seconds=cfg.elastic_timeout_s),
            )
        except Exception as exc:
            raise HvdprofError(
                f"hvdprof worker {cfg.elastic_worker}: cannot reach the elastic launcher's "
                f"store at {cfg.elastic_store}: {str(exc).strip().splitlines()[0]}"
            ) from None
        _membership = Membership(cfg.elastic_worker, store, history=[])
    return _membership


def _get_int(store: Any, key: str) -> int:
    return int(store.get(key).decode())


def newest_generation() -> int:
    """The newest generation the launcher has published (0 outside an elastic job)."""
    m = _membership
    if m is None:
        return 0
    return _get_int(m.store, GEN_KEY)


def plan(generation: int) -> dict[str, Any]:
    m = _membership
    assert m is not None
    return json.loads(m.store.get(plan_key(generation)).decode())


def join(cfg: Config) -> Config:
    """Wait for a generation newer than the last one joined that names this worker.

    Returns ``cfg`` with the rank and size of that generation. Bounded by
    ``HVDPROF_ELASTIC_TIMEOUT_SECONDS``: a worker the launcher never includes fails with
    an error instead of waiting forever.
    """
    m = _connect(cfg)
    store = m.store
    store.set(ready_key(m.worker), "1")
    deadline = time.monotonic() + cfg.elastic_timeout_s
    while True:
        generation = _get_int(store, GEN_KEY) if store.check([GEN_KEY]) else 0
        if generation > m.generation:
            members = plan(generation)
            workers = tuple(members["workers"])
            if m.worker in workers:
                break
        if time.monotonic() > deadline:
            raise HvdprofError(
                f"hvdprof worker {m.worker}: no generation of the elastic job included this "
                f"worker within HVDPROF_ELASTIC_TIMEOUT_SECONDS={cfg.elastic_timeout_s:g}"
            )
        time.sleep(_POLL_S)
    rank = workers.index(m.worker)
    size = len(workers)
    old_size = len(m.workers)
    m.generation, m.workers = generation, workers
    assert m.history is not None
    m.history.append(
        {
            "generation": generation,
            "old_size": old_size,
            "new_size": size,
            "reason": members.get("reason", ""),
            "unix_time": time.time(),
        }
    )
    return _per_generation_outputs(cfg, generation).replace(
        rank=rank,
        size=size,
        local_rank=rank,
        local_size=size,
        cross_rank=0,
        cross_size=1,
        controller_port=split_address(cfg.elastic_store)[1],
    )


def _per_generation_outputs(cfg: Config, generation: int) -> Config:
    """Each generation writes its own timeline and autotune log.

    A generation has its own ranks and size, and a rank's files are named by rank, so the
    next generation would overwrite the last one's (a survivor's rank 2 becomes rank 1).
    The timeline of generation ``g`` goes to ``DIR/generation.<g>/`` (a complete timeline
    of its own, for ``hvdprof timeline merge``); the autotune log of ``g > 1`` to
    ``LOG.generation<g>``, and the tuner of ``g`` starts from the recommendation in
    ``g - 1``'s log (a new size is a new workload: it measures afresh, from there).
    """
    changes: dict[str, Any] = {}
    if cfg.timeline_dir:
        changes["timeline_dir"] = os.path.join(cfg.timeline_dir, f"generation.{generation}")
    if cfg.autotune_log and generation > 1:
        changes["autotune_log"] = autotune_log_path(cfg.autotune_log, generation)
        if not cfg.autotune_warm_start:
            changes["autotune_warm_start"] = autotune_log_path(cfg.autotune_log, generation - 1)
    return cfg.replace(**changes) if changes else cfg


def autotune_log_path(path: str, generation: int) -> str:
    """The autotune log of ``generation`` (the first generation's is the path given)."""
    return path if generation <= 1 else f"{path}.generation{generation}"


def generation_store() -> tuple[Any, int]:
    """The launcher's store and the generation joined: the runtime's rendezvous root."""
    m = _membership
    if m is None or not m.generation:
        raise HvdprofError("hvdprof: elastic rendezvous before joining a generation")
    return m.store, m.generation


def request_reset() -> None:
    """Ask the launcher for a new generation (a collective of this one failed)."""
    m = _membership
    if m is not None and m.generation:
        m.store.add(reset_key(m.generation), 1)
