"""The control channel over real sockets: three ranks as threads of one process.

The runtime's multi-process tests exercise it end to end; these pin down each exchange
and how a lost peer is reported, without a job around it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from hvdprof.runtime.control import ControlChannel, ControlError

SIZE = 3


class DictStore:
    """The two calls the channel makes on the rendezvous store (set, blocking get)."""

    def __init__(self) -> None:
        self._values: dict[str, bytes] = {}
        self._cond = threading.Condition()

    def set(self, key: str, value: str) -> None:
        with self._cond:
            self._values[key] = value.encode()
            self._cond.notify_all()

    def get(self, key: str) -> bytes:
        with self._cond:
            assert self._cond.wait_for(lambda: key in self._values, timeout=10)
            return self._values[key]


def on_every_rank(fn: Callable[[ControlChannel], Any], op_timeout_s: float = 10) -> list[Any]:
    """Connect SIZE channels and run ``fn`` on each in its own thread; results by rank."""
    store = DictStore()
    results: list[Any] = [None] * SIZE
    errors: list[BaseException] = []

    def rank_main(rank: int) -> None:
        channel = ControlChannel.connect(rank, SIZE, store, "127.0.0.1", 10, op_timeout_s)
        try:
            results[rank] = fn(channel)
        except BaseException as exc:  # reported below, with the rank
            results[rank] = exc
            errors.append(exc)
        finally:
            channel.close()

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(SIZE)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive(), "a rank hung"
    return results


def test_allgather_gather_broadcast_and_clock() -> None:
    def exchange(ch: ControlChannel) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for width in (9, 9, 40):  # the same width again reuses the buffers
            ch.send_buffer(width)[:] = np.arange(width, dtype=np.uint8) + ch.rank
            out[f"matrix{width}"] = ch.allgather_sent().copy()
        lengths = [3, 0, 5]  # rank 1 has nothing to send
        payload = [b"abc", b"", b"hello"][ch.rank]
        out["gathered"] = ch.gather_bytes(payload, lengths)
        out["broadcast"] = ch.broadcast_bytes(b"from rank 0" if ch.rank == 0 else None)
        out["clock"] = ch.clock_samples(time.perf_counter_ns, rounds=4)
        return out

    results = on_every_rank(exchange)
    for rank, out in enumerate(results):
        assert not isinstance(out, BaseException), out
        for width in (9, 40):
            expected = np.stack([np.arange(width, dtype=np.uint8) + r for r in range(SIZE)])
            np.testing.assert_array_equal(out[f"matrix{width}"], expected)
        assert out["gathered"] == ([b"abc", b"", b"hello"] if rank == 0 else None)
        assert out["broadcast"] == b"from rank 0"
        if rank == 0:
            assert out["clock"] == []
        else:
            assert len(out["clock"]) == 4
            assert all(t_send <= t_root <= t_recv for t_send, t_root, t_recv in out["clock"])


def test_a_peer_that_exits_fails_the_others_at_once() -> None:
    def exchange(ch: ControlChannel) -> float:
        ch.send_buffer(4)[:] = ch.rank
        ch.allgather_sent()
        if ch.rank == 2:
            return 0.0  # leaves: its connection closes
        start = time.monotonic()
        with pytest.raises(ControlError) as info:
            for _ in range(3):  # rank 0 notices at once; rank 1 when rank 0 drops it
                ch.allgather_sent()
        assert "rank" in str(info.value)
        return time.monotonic() - start

    results = on_every_rank(exchange)
    assert all(not isinstance(r, BaseException) for r in results), results
    assert max(results) < 5  # far below the 10 s receive timeout: no waiting for it


def test_a_silent_peer_times_out_with_its_rank_named() -> None:
    release = threading.Event()

    def exchange(ch: ControlChannel) -> str:
        if ch.rank == 1:
            release.wait(10)  # hangs: never contributes
            return ""
        ch.send_buffer(4)[:] = ch.rank
        try:
            ch.allgather_sent()
        except ControlError as exc:
            return str(exc)
        finally:
            if ch.rank == 0:
                release.set()
        return "no error"

    results = on_every_rank(exchange, op_timeout_s=0.5)
    assert "rank 1" in results[0] and "timeout" in results[0]
    assert results[2] != "no error"  # rank 2 loses rank 0, or times out itself
