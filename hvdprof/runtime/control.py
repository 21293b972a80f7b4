"""The control channel: the small messages the cycle negotiates with, on plain sockets.

Every cycle allgathers a few bytes per rank, so the channel's latency is a floor under
every op's. Through a Gloo process group an allgather of 16 bytes took about 0.7 ms and
50 us of CPU at 2 ranks on 2 cores (each call hops through Gloo's worker and I/O threads);
a blocking TCP exchange with rank 0 takes about 30 us and 15 us of CPU. So the channel is
a star of TCP connections to rank 0, which gathers every rank's message and answers each
with the combined result; the data (tensors) stay on the backend's process group.

A peer that dies closes its connection, so the survivors fail at once; a peer that hangs
makes every receive time out after ``HVDPROF_COLLECTIVE_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

_LENGTH = struct.Struct("<I")
_CLOCK = struct.Struct("<q")
_TOKEN = b"b"


class ControlError(RuntimeError):
    """A peer is gone or too late: the job cannot continue."""


class CycleVectors:
    """The cycle's allgather buffers, kept while the vector's width holds: shared by the
    socket channel here and the MPI one (``backends/mpi.py``), which differ only in how
    they move the bytes."""

    size: int

    def _init_vectors(self) -> None:
        self._width = -1
        self._send_np = np.zeros(0, dtype=np.uint8)
        self._recv_np = np.zeros((self.size, 0), dtype=np.uint8)

    def send_buffer(self, width: int) -> np.ndarray:
        """This rank's next vector for ``allgather_sent``, to fill in place."""
        if width != self._width:
            self._send_np = np.zeros(width, dtype=np.uint8)
            self._recv_np = np.zeros((self.size, width), dtype=np.uint8)
            self._width = width
        return self._send_np

    @property
    def last_matrix(self) -> np.ndarray:
        """What the last ``allgather_sent`` returned."""
        return self._recv_np


class ControlChannel(CycleVectors):
    """Rank 0 holds one connection per other rank; the others one connection to rank 0.

    Every method is collective (all ranks call it in the same order), and only the cycle
    thread uses the channel once the runtime runs.
    """

    def __init__(self, rank: int, size: int, peers: dict[int, socket.socket]) -> None:
        self.rank = rank
        self.size = size
        #: rank 0: rank -> connection; other ranks: {0: connection}
        self.peers = peers
        self._init_vectors()
        self._scratch = bytearray(0)
        self._token_buf = memoryview(bytearray(1))

    # --- set-up ------------------------------------------------------------------------
    @classmethod
    def connect(
        cls,
        rank: int,
        size: int,
        store: Any,
        host: str,
        timeout_s: float,
        op_timeout_s: float,
    ) -> ControlChannel:
        """Build the star through the rendezvous ``store`` (rank 0 publishes its address).

        ``host`` is where the other ranks reach rank 0: 127.0.0.1 on one machine (rank 0
        then listens on loopback only), else rank 0's hostname (it listens everywhere).
        """
        peers: dict[int, socket.socket] = {}
        if size == 1:
            return cls(rank, size, peers)
        key = "hvdprof/control/address"
        if rank == 0:
            bind = host if host == "127.0.0.1" else ""
            server = socket.create_server((bind, 0), backlog=size)
            try:
                server.settimeout(timeout_s)
                store.set(key, f"{host}:{server.getsockname()[1]}")
                while len(peers) < size - 1:
                    conn, _ = server.accept()
                    conn.settimeout(timeout_s)
                    peer = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size, "a new peer"))[0]
                    peers[peer] = conn
            finally:
                server.close()
        else:
            addr = store.get(key).decode()
            peer_host, port = addr.rsplit(":", 1)
            conn = socket.create_connection((peer_host, int(port)), timeout=timeout_s)
            conn.sendall(_LENGTH.pack(rank))
            peers[0] = conn
        for conn in peers.values():
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(op_timeout_s)
        return cls(rank, size, peers)

    def close(self) -> None:
        for conn in self.peers.values():
            conn.close()
        self.peers = {}

    # --- the cycle's allgather ------------------------------------------------------------
    def allgather_sent(self) -> np.ndarray:
        """Every rank's send buffer, as a (size, width) array (valid until the next call)."""
        recv = self._recv_np
        if self.size == 1:
            recv[0] = self._send_np
            return recv
        if self.rank == 0:
            recv[0] = self._send_np
            width = self._width
            for peer in range(1, self.size):
                row = memoryview(recv[peer])
                _recv_into(self.peers[peer], row, width, peer)
            whole = recv.tobytes()
            for peer in range(1, self.size):
                _send(self.peers[peer], whole, peer)
        else:
            conn = self.peers[0]
            _send(conn, self._send_np.tobytes(), 0)
            _recv_into(conn, memoryview(recv).cast("B"), recv.nbytes, 0)
        return recv

    # --- small reductions ---------------------------------------------------------------
    def reduce_in_place(self, data: memoryview, combine: Callable[[memoryview], None]) -> None:
        """Every rank's ``data`` combined into every rank's ``data`` (a star through rank 0).

        Rank 0 receives each peer's bytes into a scratch buffer, calls ``combine`` on it
        (which folds it into ``data``), and sends the result back to everyone.
        """
        n = data.nbytes
        if self.size == 1 or n == 0:  # (every rank has the same size: all skip together)
            return
        if self.rank != 0:
            conn = self.peers[0]
            _send(conn, data, 0)
            _fill(conn, data, n, "rank 0")
            return
        if len(self._scratch) < n:
            self._scratch = bytearray(n)
        scratch = memoryview(self._scratch)[:n]
        for peer in range(1, self.size):
            _fill(self.peers[peer], scratch, n, f"rank {peer}")
            combine(scratch)
        for peer in range(1, self.size):
            _send(self.peers[peer], data, peer)

    # --- synchronisation -----------------------------------------------------------------
    def barrier(self) -> None:
        """Return once every rank has called it: one byte to rank 0 and one byte back."""
        if self.size == 1:
            return
        if self.rank != 0:
            conn = self.peers[0]
            _send(conn, _TOKEN, 0)
            _fill(conn, self._token_buf, 1, "rank 0")
            return
        for peer in range(1, self.size):
            _fill(self.peers[peer], self._token_buf, 1, f"rank {peer}")
        for peer in range(1, self.size):
            _send(self.peers[peer], _TOKEN, peer)

    # --- the coordinator's exchanges -----------------------------------------------------
    def gather_bytes(self, payload: bytes, lengths: list[int]) -> list[bytes] | None:
        """Rank 0 receives every rank's payload (``lengths``, known to all, says who sends)."""
        if self.size == 1:
            return [payload]
        if self.rank != 0:
            if lengths[self.rank]:
                _send_frame(self.peers[0], payload, 0)
            return None
        out = [payload]
        for peer in range(1, self.size):
            out.append(_recv_frame(self.peers[peer], peer) if lengths[peer] else b"")
        return out

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's payload on every rank."""
        if self.size == 1:
            assert payload is not None
            return payload
        if self.rank == 0:
            assert payload is not None
            for peer in range(1, self.size):
                _send_frame(self.peers[peer], payload, peer)
            return payload
        return _recv_frame(self.peers[0], 0)

    def clock_samples(
        self, clock: Callable[[], int], rounds: int = 8
    ) -> list[tuple[int, int, int]]:
        """NTP-style ping-pong with rank 0: this rank's (t_send, t_rank0, t_recv) samples.

        Rank 0 serves every other rank in turn and returns []. Deterministic message
        order, so it can run inside any cycle that all ranks agree on.
        """
        if self.size == 1:
            return []
        samples: list[tuple[int, int, int]] = []
        if self.rank == 0:
            for peer in range(1, self.size):
                conn = self.peers[peer]
                for _ in range(rounds):
                    _recv_exact(conn, _CLOCK.size, f"rank {peer}")
                    _send(conn, _CLOCK.pack(clock()), peer)
            return samples
        conn = self.peers[0]
        for _ in range(rounds):
            t_send = clock()
            _send(conn, _CLOCK.pack(t_send), 0)
            t_root = _CLOCK.unpack(_recv_exact(conn, _CLOCK.size, "rank 0"))[0]
            samples.append((t_send, t_root, clock()))
        return samples


# --- framing ---------------------------------------------------------------------------
def _send(conn: socket.socket, data: bytes | memoryview, peer: int) -> None:
    try:
        conn.sendall(data)
    except TimeoutError:
        raise ControlError(f"sending to rank {peer} timed out") from None
    except OSError as exc:
        raise ControlError(f"the connection to rank {peer} is lost ({exc})") from None


def _send_frame(conn: socket.socket, payload: bytes, peer: int) -> None:
    _send(conn, _LENGTH.pack(len(payload)) + payload, peer)


def _recv_frame(conn: socket.socket, peer: int) -> bytes:
    n = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size, f"rank {peer}"))[0]
    return _recv_exact(conn, n, f"rank {peer}") if n else b""


def _recv_exact(conn: socket.socket, n: int, who: str) -> bytes:
    buf = bytearray(n)
    _fill(conn, memoryview(buf), n, who)
    return bytes(buf)


def _recv_into(conn: socket.socket, view: memoryview, n: int, peer: int) -> None:
    _fill(conn, view, n, f"rank {peer}")


def _fill(conn: socket.socket, view: memoryview, n: int, who: str) -> None:
    got = 0
    while got < n:
        try:
            k = conn.recv_into(view[got:], n - got)
        except TimeoutError:
            raise ControlError(
                f"no message from {who} within the collective timeout: it has stopped "
                "responding (hung, stopped, or still in a long computation)"
            ) from None
        except OSError as exc:
            raise ControlError(f"the connection to {who} is lost ({exc})") from None
        if k == 0:
            raise ControlError(f"{who} closed its connection (it has exited or been killed)")
        got += k


def skewed_clock(skew_us: float) -> Callable[[], int]:
    """This rank's timeline clock; the skew is a testing aid that the offset must undo."""
    skew_ns = int(skew_us * 1000)
    if not skew_ns:
        return time.perf_counter_ns

    def clock() -> int:
        return time.perf_counter_ns() + skew_ns

    return clock
