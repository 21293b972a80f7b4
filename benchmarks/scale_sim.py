"""A simulated control plane: hundreds of ranks as threads on the real TCP channel.

Processes cannot go past about 64 ranks on this 2-core machine (each imports torch), but
the control plane needs none of torch: every rank here is a thread holding a real
:class:`~hvdprof.runtime.control.ControlChannel` (built by its own ``connect``, on
loopback), writing the real cycle header (``OwnHeader``) and bits, and calling the real
``allgather_sent``; on a miss cycle, ``gather_bytes`` of pickled ``RequestMeta``, rank 0's
real ``Coordinator.handle`` and ``broadcast_bytes`` of its pickled reply (in the tree,
``gather_merged`` with the relaying ranks merging, and ``Coordinator.handle_merged``). Rank 0 is a
thread of the calling process; the other ranks are threads of a few worker processes.

Three topologies side by side, cycle by cycle interleaved (every rank holds a channel of
each): ``full`` (the star as it was: ``allgather_sent``, the whole matrix back to every
rank), ``star`` (rank 0 replies with the reduced vector: ``exchange`` and
``cycle_header.reduce``, as the runtime does now) and ``tree`` (the same exchange, and
the coordinator's gather and broadcast, through a tree of fan-out ``fanout``).

What it measures: rank 0's CPU (thread time) per cycle, its wall per cycle, and a median
worker thread's CPU per cycle. Wall time here is dominated by waking a thousand threads
on two cores; rank 0's CPU is what carries over (it serves the peers one after another).
"""

from __future__ import annotations

import itertools
import multiprocessing as mp
import pickle
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hvdprof.runtime.control import ControlChannel
from hvdprof.runtime.cycle_header import HEADER, WORK, OwnHeader, Said, reduce
from hvdprof.runtime.negotiation import (
    Coordinator,
    RequestMeta,
    ResponseCache,
    merge_requests,
    read_merged,
)
from hvdprof.runtime.requests import OpType, ReduceOp, Signature

_SIG = Signature(OpType.ALLREDUCE, "float32", (64,), ReduceOp.SUM, -1, 1.0, 1.0, "cpu")
_TIMEOUT_S = 300.0
MODES = ("hit", "miss")
TOPOLOGIES = ("full", "star", "tree")
#: the tree's fan-out when none is given
FANOUT = 8


class FileStore:
    """The rendezvous ``ControlChannel.connect`` needs (``set``/``get``), in a folder:
    rank 0 publishes its address, the others wait for it."""

    def __init__(self, folder: str) -> None:
        self.folder = Path(folder)

    def _path(self, key: str) -> Path:
        return self.folder / key.replace("/", "_")

    def set(self, key: str, value: str) -> None:
        tmp = self._path(key).with_suffix(".tmp")
        tmp.write_text(value)
        tmp.replace(self._path(key))

    def get(self, key: str) -> bytes:
        deadline = time.monotonic() + _TIMEOUT_S
        while not self._path(key).exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {key} in {self.folder}")
            time.sleep(0.01)
        return self._path(key).read_bytes()


def _said(ch: ControlChannel, topology: str) -> Said:
    """The cycle's exchange in one topology, read as the cycle reads it."""
    if topology == "full":  # every rank reduces the whole matrix itself
        matrix = ch.allgather_sent()
        return Said.read(reduce(matrix, WORK), ch.size, matrix)
    reply, matrix = ch.exchange(lambda m: reduce(m, WORK))
    return Said.read(reply, ch.size, matrix)


def _cycle(
    ch: ControlChannel, topology: str, tensors: int, mode: str, c: int, coordinator: Any
) -> None:
    """One negotiate stage, as the cycle does it: header and bits exchanged; on a miss,
    the new names gathered to rank 0, coordinated, and the reply broadcast."""
    payload = b""
    if mode == "miss":
        metas = [RequestMeta(f"miss.{c}.{i}", _SIG) for i in range(tensors)]
        payload = pickle.dumps(metas, protocol=pickle.HIGHEST_PROTOCOL)
    send = ch.send_buffer(HEADER + tensors)
    OwnHeader(payload_len=len(payload)).write(send[:HEADER])
    send[HEADER:] = 1 if mode == "hit" else 0
    said = _said(ch, topology)
    if mode == "hit":
        np.flatnonzero(said.ready)  # the names every rank runs
        return
    lengths = said.lengths(ch.size)
    blob = None
    if topology == "tree":  # relaying ranks merge their subtree's requests, as the cycle
        merged = ch.gather_merged(payload, lengths, merge_requests)
        if ch.rank == 0:
            assert merged is not None
            groups = read_merged(merged)
            reply = coordinator.handle_merged(c, groups, frozenset(), ResponseCache(0), False, 0.0)
            blob = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(ch.broadcast_bytes(blob))
        return
    gathered = ch.gather_bytes(payload, lengths)
    if ch.rank == 0:
        assert gathered is not None
        messages = [(r, pickle.loads(b)) for r, b in enumerate(gathered) if b]
        reply = coordinator.handle(c, messages, frozenset(), ResponseCache(0), False, 0.0)
        blob = pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL)
    pickle.loads(ch.broadcast_bytes(blob))


def _connect(rank: int, size: int, folder: str, fanout: int) -> dict[str, ControlChannel]:
    """This rank's channel of each topology (``full`` shares the star's)."""
    chans: dict[str, ControlChannel] = {}
    for topology, k in (("star", 0), ("tree", fanout)):
        sub = Path(folder) / topology
        sub.mkdir(exist_ok=True)
        chans[topology] = ControlChannel.connect(
            rank, size, FileStore(str(sub)), "127.0.0.1", _TIMEOUT_S, _TIMEOUT_S, k
        )
    chans["full"] = chans["star"]
    return chans


def _run_rank(
    rank: int, size: int, folder: str, tensors: int, cycles: int, fanout: int = FANOUT
) -> dict[str, list[int]]:
    """Connect, then every mode's cycles, the topologies interleaved cycle by cycle:
    this rank's (cpu_ns, wall_ns) per cycle, by topology and mode."""
    chans = _connect(rank, size, folder, fanout)
    coordinator = Coordinator(size) if rank == 0 else None
    out: dict[str, list[int]] = {}
    star = chans["star"]
    try:
        for mode in MODES:
            star.barrier()
            for topology, ch in chans.items():
                for c in range(2):  # warm-up: buffers sized, first pickles done
                    _cycle(ch, topology, tensors, mode, -1 - c, coordinator)
            for c in range(cycles):
                for topology in TOPOLOGIES:
                    star.barrier()
                    t0, w0 = time.thread_time_ns(), time.perf_counter_ns()
                    _cycle(chans[topology], topology, tensors, mode, c, coordinator)
                    cpu, wall = time.thread_time_ns() - t0, time.perf_counter_ns() - w0
                    out.setdefault(f"{topology}/{mode}_cpu", []).append(cpu)
                    out.setdefault(f"{topology}/{mode}_wall", []).append(wall)
    finally:
        for ch in {id(c): c for c in chans.values()}.values():
            ch.close()
    return out


def _worker_process(
    ranks: range, size: int, folder: str, tensors: int, cycles: int, fanout: int, q: Any
) -> None:
    """Many ranks as threads; puts each rank's median CPU per cycle by topology and mode."""
    results: dict[int, dict[str, list[int]]] = {}
    errors: list[str] = []

    def one(r: int) -> None:
        try:
            results[r] = _run_rank(r, size, folder, tensors, cycles, fanout)
        except Exception as exc:  # reported by the parent, with the rank
            errors.append(f"rank {r}: {exc}")

    threading.stack_size(256 * 1024)
    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(_TIMEOUT_S)
    q.put(
        {
            "errors": errors,
            "cpu_ns": {
                f"{topology}/{mode}": [
                    statistics.median(v[f"{topology}/{mode}_cpu"]) for v in results.values()
                ]
                for topology in TOPOLOGIES
                for mode in MODES
            },
        }
    )


def simulate(
    size: int, tensors: int, cycles: int = 20, processes: int = 4, fanout: int = FANOUT
) -> list[dict[str, Any]]:
    """One point per topology and mode at ``size`` ranks: rank 0's and a worker's CPU per
    cycle (us), rank 0's wall per cycle (us), medians over ``cycles`` cycles."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="hvdprof-sim-") as folder:
        bounds = np.linspace(1, size, processes + 1).astype(int)
        procs = [
            ctx.Process(
                target=_worker_process,
                args=(range(int(a), int(b)), size, folder, tensors, cycles, fanout, q),
                daemon=True,
            )
            for a, b in itertools.pairwise(bounds)
            if b > a
        ]
        for p in procs:
            p.start()
        try:
            mine = _run_rank(0, size, folder, tensors, cycles, fanout)
            reports = [q.get(timeout=_TIMEOUT_S) for _ in procs]
        finally:
            for p in procs:
                p.join(30)
                if p.is_alive():
                    p.kill()
    errors = [e for r in reports for e in r["errors"]]
    if errors:
        raise SystemExit(f"simulated control plane at {size} ranks failed: {errors[:3]}")
    out = []
    for topology in TOPOLOGIES:
        for mode in MODES:
            key = f"{topology}/{mode}"
            workers = [c for r in reports for c in r["cpu_ns"][key]]
            out.append(
                {
                    "ranks": size,
                    "mode": mode,
                    "topology": topology,
                    "fanout": fanout if topology == "tree" else 0,
                    "tensors": tensors,
                    "cycles": cycles,
                    "rank0_cpu_per_cycle_us": round(statistics.median(mine[f"{key}_cpu"]) / 1e3, 1),
                    "rank0_wall_per_cycle_us": round(
                        statistics.median(mine[f"{key}_wall"]) / 1e3, 1
                    ),
                    "worker_cpu_per_cycle_us": round(statistics.median(workers) / 1000, 1),
                    "worker_cpu_max_us": round(max(workers) / 1000, 1),
                }
            )
    return out


if __name__ == "__main__":
    import sys

    n, k = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 16
    for point in simulate(n, k, 5, fanout=int(sys.argv[3]) if len(sys.argv) > 3 else FANOUT):
        print(point)
