"""A cost model of the star control channel, fitted to ``scale_bench.py``'s points.

Why a model of counts, not a curve in N: the star's cost is made of things we can count
exactly for any ranks N and tensors K, and a curve fitted in N alone cannot tell a
per-connection cost from a per-byte one (both grow with N). Per cycle, on rank 0:

* ``msgs``: socket calls. The allgather receives one row from each of the N-1 peers and
  sends each the whole matrix (2(N-1)); a slow-path cycle adds the gather of new names
  (a length and a body from each peer) and the broadcast of the reply (3(N-1) more);
* ``bytes``: what rank 0 sends. The whole matrix, N rows of 9+K bytes, to each peer:
  (N-1) N (9+K), the star's one quadratic term; a slow-path cycle adds the pickled reply
  (its size measured by pickling a real ``CoordinatorReply``) to each peer;
* ``name``: per new name, whatever the ranks (its verdict, ``Response``, ``NegotiatedOp``);
* ``items``: Python objects the coordinator handles per new name per rank (unpickling
  each rank's ``RequestMeta``, ``Coordinator.handle``, the reply's per-rank
  ``ready_cycles``): N per name coordinated;
* ``msg_x_load``: socket calls times (ranks per core - 1). On this 2-core machine a call
  that wakes a peer costs more CPU the longer the run queue (scheduler work, cold caches);
  on a core per rank the term is zero.

* ``step``: what is paid once per step of K ops whatever the ranks (each op drained,
  looked up in the cache, agreed): every point has K = 16, so it is one count per step.

A worker sends one row and receives the matrix (2 calls, N(9+K) bytes in; 3 more on a
slow-path cycle), and on the
slow path pickles its K names and unpickles the reply (items ~ N per name). The cost of
each count is fitted by non-negative least squares on some rank counts and checked on the
others. The model predicts CPU, not waiting: on this 2-core machine, wall time at N ranks
is mostly the other N-1 ranks' CPU; on a core per rank, a cycle's critical path is rank
0's CPU (it serves the peers one after another) plus one round trip.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Any

import numpy as np
from scipy.optimize import nnls

from hvdprof.runtime.cycle_header import HEADER
from hvdprof.runtime.negotiation import Coordinator, RequestMeta, ResponseCache
from hvdprof.runtime.requests import OpType, ReduceOp, Signature

#: the fitted cost of each count, in microseconds (the model's parameters)
TERMS = ("step", "cycle", "msg", "kb", "name", "item", "msg_x_load")
#: cores of the machine the points were measured on (this one)
CORES = 2


@cache
def reply_bytes(ranks: int, tensors: int) -> int:
    """Size of the coordinator's pickled reply when ``tensors`` new names are ready on
    every one of ``ranks`` ranks: the real classes, pickled as the cycle pickles them."""
    if tensors == 0:
        return 0
    sig = Signature(OpType.ALLREDUCE, "float32", (64,), ReduceOp.SUM, -1, 1.0, 1.0, "cpu")
    metas = [RequestMeta(f"miss.0.{i}", sig) for i in range(tensors)]
    coordinator = Coordinator(ranks)
    reply = coordinator.handle(
        0, [(r, metas) for r in range(ranks)], frozenset(), ResponseCache(0), False, 0.0
    )
    return len(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))


def counts(
    ranks: int,
    tensors: int,
    width: int,
    cycles: float,
    slow_cycles: float,
    names: float,
    cores: int = CORES,
) -> dict[str, dict[str, float]]:
    """The counts of one step (or one cycle) for rank 0 and for a worker.

    ``width``: the cache's bit vector (bytes per rank after the header); ``cycles`` and
    ``slow_cycles``: cycles run and those with new names; ``names``: names coordinated.
    """
    n, row = ranks, HEADER + width
    per_slow_reply = reply_bytes(ranks, tensors)
    peers = n - 1
    load = max(1.0, n / cores)  # ranks per core: 1 on a core per rank
    out = {
        "rank0": {
            "cycle": cycles,
            "msg": cycles * 2 * peers + slow_cycles * 3 * peers,
            "kb": (cycles * peers * n * row + slow_cycles * peers * per_slow_reply) / 1024,
            "item": names * n,
        },
        "worker": {
            "cycle": cycles,
            "msg": cycles * 2 + slow_cycles * 3,
            "kb": (cycles * n * row + slow_cycles * per_slow_reply) / 1024,
            "item": names * n,
        },
    }
    for c in out.values():  # a socket call's CPU grows with the run queue it wakes
        c["msg_x_load"] = c["msg"] * (load - 1)
        c["step"] = 1.0  # the step's K ops drained, looked up and agreed, once
        c["name"] = names  # a new name's verdict, response and op, whatever the ranks
    return out


def design(points: Sequence[Mapping[str, Any]], role: str) -> np.ndarray:
    """One row of counts per measured point (per step), in the order of ``TERMS``."""
    rows = []
    for p in points:
        c = counts(p["ranks"], p["tensors"], p["width"], p["cycles"], p["slow_cycles"], p["names"])[
            role
        ]
        rows.append([c[t] for t in TERMS])
    return np.array(rows, dtype=float)


def fit(points: Sequence[Mapping[str, Any]], role: str, key: str) -> dict[str, float]:
    """Non-negative cost per count (us) from the points' measured ``key`` (us per step).

    Each row is scaled by its measurement so that every point weighs alike in relative
    terms (small rank counts would otherwise not count at all next to 64 ranks).
    """
    a = design(points, role)
    y = np.array([p[key] for p in points], dtype=float)
    scale = 1.0 / np.maximum(y, 1e-9)
    coef, _ = nnls(a * scale[:, None], y * scale)
    return {t: float(c) for t, c in zip(TERMS, coef, strict=True)}


def predict(params: Mapping[str, float], row: Mapping[str, float]) -> float:
    return sum(params[t] * row[t] for t in TERMS)


def held_out_errors(
    params: Mapping[str, float], points: Sequence[Mapping[str, Any]], role: str, key: str
) -> list[dict[str, Any]]:
    """Per held-out point: measured, predicted, relative error."""
    out = []
    for p, row in zip(points, design(points, role), strict=True):
        pred = float(np.dot([params[t] for t in TERMS], row))
        out.append(
            {
                "engine": p.get("engine"),
                "ranks": p["ranks"],
                "mode": p["mode"],
                "measured_us": round(p[key], 1),
                "predicted_us": round(pred, 1),
                "error": round(pred / p[key] - 1, 3) if p[key] else None,
            }
        )
    return out


def per_cycle(
    params: Mapping[str, float],
    role: str,
    ranks: int,
    tensors: int,
    slow: bool,
    cores: int | None = None,
) -> float:
    """Predicted CPU of one cycle (us): a cache-hit cycle, or a slow-path cycle that
    coordinates ``tensors`` new names (the bit vector then ``tensors`` wide as well).
    ``cores``: None for a core per rank (no oversubscription)."""
    row = counts(
        ranks, tensors, tensors, 1, 1 if slow else 0, tensors if slow else 0, cores or ranks
    )[role]
    return predict(params, row)


def topology_cycle(
    params: Mapping[str, float],
    ranks: int,
    tensors: int,
    slow: bool,
    fanout: int = 0,
) -> dict[str, float]:
    """Predicted CPU of one cycle (us, a core per rank) with the reduced reply, on rank 0
    and on the busiest relaying rank, from the star's fitted costs: the same counts with
    the reply's bytes (``reply_size``: 2 + K + 3N/8 instead of the N (10 + K) matrix) and,
    in a tree of ``fanout`` (0: the star), rank 0's calls to its k children only. A rank
    that relays makes 2k + 2 calls a cycle (5k + 5 on a slow-path cycle) and sends
    its subtree's rows up. In a tree the new names are merged on the way up, so rank 0
    reads k lists of the names (items: names x k, not names x N) and a relaying rank
    merges its own and its k children's (names x (k + 1))."""
    k = ranks - 1 if fanout <= 0 or fanout >= ranks - 1 else fanout
    tree = k < ranks - 1
    width = HEADER + tensors
    reply = 2 + tensors + 3 * ((ranks + 7) // 8)
    slow_reply = reply_bytes(ranks, tensors) if slow else 0
    names = tensors if slow else 0
    base = {"cycle": 1.0, "step": 1.0, "name": names, "item": names * ranks, "msg_x_load": 0.0}
    rank0 = {
        **base,
        "item": names * (k if tree else ranks),
        "msg": 2 * k + (3 * k if slow else 0),
        "kb": k * (reply + slow_reply) / 1024,
    }
    out = {"rank0": predict(params, rank0)}
    if tree:  # the first child of rank 0 relays for the largest subtree
        subtree = -(-(ranks - 1) // k)
        relay = {
            **base,
            "name": names,
            "item": names * (k + 1),
            "msg": 2 * k + 2 + (3 * k + 3 if slow else 0),
            "kb": (subtree * width + k * (reply + slow_reply)) / 1024,
        }
        out["relay"] = predict(params, relay)
    return out


def kb_cost_from_simulation(sims: Sequence[Mapping[str, Any]]) -> float | None:
    """Rank 0's CPU per KB sent, from the simulated cache-hit cycles (fixed + per call +
    per KB): the measured points send at most 100 KB a cycle, too little to show it."""
    hits = [s for s in sims if s["mode"] == "hit" and s["ranks"] >= 16]
    if len(hits) < 3:
        return None
    rows, y = [], []
    for s in hits:
        c = counts(s["ranks"], s["tensors"], s["tensors"], 1, 0, 0, cores=s["ranks"])["rank0"]
        rows.append([1.0, c["msg"], c["kb"]])
        y.append(s["rank0_cpu_per_cycle_us"])
    a, b = np.array(rows), np.array(y)
    coef, _ = nnls(a / b[:, None], np.ones_like(b))
    return float(coef[2])


def shape_check(
    params: Mapping[str, float], sims: Sequence[Mapping[str, Any]], base: int = 64
) -> list[dict[str, Any]]:
    """The model's growth against the simulation's, from ``base`` ranks: the simulated
    cycle is lighter than the real one (no drain, no executor), so compare ratios."""
    out = []
    for mode in ("hit", "miss"):
        by_n = {s["ranks"]: s for s in sims if s["mode"] == mode}
        if base not in by_n:
            continue
        tensors = by_n[base]["tensors"]
        model_base = per_cycle(params, "rank0", base, tensors, mode == "miss")
        for n, s in sorted(by_n.items()):
            sim_ratio = s["rank0_cpu_per_cycle_us"] / by_n[base]["rank0_cpu_per_cycle_us"]
            model_ratio = per_cycle(params, "rank0", n, tensors, mode == "miss") / model_base
            out.append(
                {
                    "mode": mode,
                    "ranks": n,
                    "simulated_growth": round(sim_ratio, 2),
                    "model_growth": round(model_ratio, 2),
                    "error": round(model_ratio / sim_ratio - 1, 3),
                }
            )
    return out
