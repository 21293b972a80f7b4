"""The control channel: small collectives the cycle uses to negotiate, on their own group.

Negotiation runs on a process group separate from the data so that a cycle's few
hundred bytes never queue behind a 100 MB allreduce.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import torch
import torch.distributed as dist

_CLOCK_SYNC_TAG = 7001


class ControlChannel:
    def __init__(self, pg: dist.ProcessGroup, rank: int, size: int) -> None:
        self.pg = pg
        self.rank = rank
        self.size = size
        self._width = -1
        self._send: torch.Tensor | None = None
        self._recv: torch.Tensor | None = None

    def allgather_vector(self, vector: np.ndarray) -> np.ndarray:
        """Every rank's uint8 vector (all the same length), as a (size, width) array."""
        width = vector.shape[0]
        if width != self._width:
            self._send = torch.empty(width, dtype=torch.uint8)
            self._recv = torch.empty((self.size, width), dtype=torch.uint8)
            self._width = width
        assert self._send is not None and self._recv is not None
        self._send.numpy()[:] = vector
        if self.size == 1:
            self._recv[0].copy_(self._send)
        else:
            self.pg.allgather([list(self._recv.unbind(0))], [self._send]).wait()
        return self._recv.numpy()

    def gather_bytes(self, payload: bytes, lengths: list[int]) -> list[bytes] | None:
        """Rank 0 receives every rank's payload; ``lengths`` (known to all) sizes the buffers."""
        longest = max(lengths)
        send = torch.zeros(longest, dtype=torch.uint8)
        if payload:
            send[: len(payload)] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
        if self.size == 1:
            return [payload]
        outputs = (
            [[torch.empty(longest, dtype=torch.uint8) for _ in range(self.size)]]
            if self.rank == 0
            else []
        )
        options = dist.GatherOptions()
        options.rootRank = 0
        self.pg.gather(outputs, [send], options).wait()
        if self.rank != 0:
            return None
        return [bytes(t[:n].numpy()) for t, n in zip(outputs[0], lengths, strict=True)]

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's payload on every rank."""
        if self.size == 1:
            assert payload is not None
            return payload
        length = torch.tensor(
            [len(payload) if self.rank == 0 and payload else 0], dtype=torch.int64
        )
        options = dist.BroadcastOptions()
        options.rootRank = 0
        self.pg.broadcast([length], options).wait()
        n = int(length.item())
        data = torch.empty(n, dtype=torch.uint8)
        if self.rank == 0 and n:
            data[:] = torch.frombuffer(bytearray(payload), dtype=torch.uint8)  # type: ignore[arg-type]
        if n:
            self.pg.broadcast([data], options).wait()
        return bytes(data.numpy())

    def clock_samples(
        self, clock: Callable[[], int], rounds: int = 8
    ) -> list[tuple[int, int, int]]:
        """NTP-style ping-pong with rank 0: this rank's (t_send, t_rank0, t_recv) samples.

        Rank 0 serves every other rank in turn and returns []. Deterministic message
        order, so it can run inside any cycle that all ranks agree on.
        """
        if self.size == 1:
            return []
        buf = torch.zeros(1, dtype=torch.int64)
        samples: list[tuple[int, int, int]] = []
        if self.rank == 0:
            for peer in range(1, self.size):
                for _ in range(rounds):
                    self.pg.recv([buf], peer, _CLOCK_SYNC_TAG).wait()
                    buf[0] = clock()
                    self.pg.send([buf], peer, _CLOCK_SYNC_TAG).wait()
            return samples
        for _ in range(rounds):
            t_send = clock()
            buf[0] = t_send
            self.pg.send([buf], 0, _CLOCK_SYNC_TAG).wait()
            self.pg.recv([buf], 0, _CLOCK_SYNC_TAG).wait()
            samples.append((t_send, int(buf[0]), clock()))
        return samples


def skewed_clock(skew_us: float) -> Callable[[], int]:
    """This rank's timeline clock; the skew is a testing aid that the offset must undo."""
    skew_ns = int(skew_us * 1000)
    if not skew_ns:
        return time.perf_counter_ns

    def clock() -> int:
        return time.perf_counter_ns() + skew_ns

    return clock
