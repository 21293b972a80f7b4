"""The control channel: the small messages the cycle negotiates with, on plain sockets.

Every cycle allgathers a few bytes per rank, so the channel's latency is a floor under
every op's. Through a Gloo process group an allgather of 16 bytes took about 0.7 ms and
50 us of CPU at 2 ranks on 2 cores (each call hops through Gloo's worker and I/O threads);
a blocking TCP exchange with rank 0 takes about 30 us and 15 us of CPU. So the channel is
a star of TCP connections to rank 0, which gathers every rank's message and answers each
with the reduced result (``cycle_header.reduce``); the data (tensors) stay on the
backend's process group.

Rank 0 of a star makes 2 (N-1) socket calls a cycle, which passes the cycle time near
230 ranks (docs/how-it-works.md). ``HVDPROF_CONTROL_FANOUT=k`` routes the cycle's
exchange and the coordinator's gather and broadcast through a tree instead: each rank
gathers the rows of its subtree (a contiguous range of ranks, so a row block arrives in
one piece) from at most k children and forwards them up; the reply comes down the same
way. Rank 0 still sees every row, so everything it reads per rank (the stall inspector,
the deadlock check) is unchanged. The coordinator's new names are merged on the way up
(``gather_merged``): each relaying rank forwards one entry per distinct request with the
ranks that sent it, so rank 0 reads k blocks of distinct requests, not N ranks' lists.
Barriers, small reductions and clock samples stay on the star. The tree's messages are
versioned (``PROTOCOL``): rank 0 publishes it with the fan-out, and a rank of another
version is refused at init, by name.

A peer that dies closes its connection, so the survivors fail at once; a peer that hangs
makes every receive time out after ``HVDPROF_COLLECTIVE_TIMEOUT_SECONDS``.
"""

from __future__ import annotations

import itertools
import selectors
import socket
import struct
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from hvdprof.runtime.cycle_header import FULL, reply_size

#: the control messages' version: 2 merges the coordinator's requests up the tree; 3 lets
#: idle ranks sleep on their sockets (``ControlChannel.sleep``)
PROTOCOL = 3
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
    #: whether rank 0 alone reduces the matrix, so that it may tell every rank to sleep
    #: (:meth:`ControlChannel.sleep`); under MPI every rank reduces it itself
    can_sleep = False

    @property
    def is_tree(self) -> bool:
        """Whether the cycle's messages go through a tree rather than the star."""
        return False

    def _init_vectors(self) -> None:
        self._width = -1
        self._send_np = np.zeros(0, dtype=np.uint8)
        self._recv_np = np.zeros((self.size, 0), dtype=np.uint8)
        self._reply_np = np.zeros(0, dtype=np.uint8)

    def send_buffer(self, width: int) -> np.ndarray:
        """This rank's next vector for ``allgather_sent`` or ``exchange``, to fill in place."""
        if width != self._width:
            self._send_np = np.zeros(width, dtype=np.uint8)
            self._recv_np = np.zeros((self.size, width), dtype=np.uint8)
            self._reply_np = np.zeros(reply_size(self.size, width), dtype=np.uint8)
            self._width = width
        return self._send_np

    @property
    def last_matrix(self) -> np.ndarray:
        """What the last ``allgather_sent`` returned (the last ``exchange``'s matrix on
        rank 0)."""
        return self._recv_np

    def allgather_sent(self) -> np.ndarray:
        raise NotImplementedError

    def exchange(
        self, reduce: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The cycle's exchange: (rank 0's reply, the matrix where this rank has it).

        Here every rank gets the matrix (an allgather) and reduces it itself: ``reduce``
        must then give the same reply on every rank. The socket channel overrides it."""
        matrix = self.allgather_sent()
        return reduce(matrix), matrix


def tree_links(rank: int, size: int, fanout: int) -> tuple[int, int, list[tuple[int, int]]]:
    """(parent, end of this rank's subtree, children's subtrees as (first, end) ranges).

    The subtree of rank r is ranks r..end-1: the ranks after r split into at most
    ``fanout`` contiguous ranges, each rooted at its first rank (1: a chain). 0 (or at
    least size - 1) is the star: rank 0's children are every other rank."""
    if fanout < 1 or fanout >= size - 1:
        fanout = max(size - 1, 1)
    lo, hi, parent = 0, size, -1
    while True:
        n = hi - lo - 1
        k = min(fanout, n)
        cuts = [lo + 1 + (n * i) // k for i in range(k + 1)] if k > 0 else [lo + 1]
        chunks = list(itertools.pairwise(cuts))
        if rank == lo:
            return parent, hi, chunks
        for a, b in chunks:
            if a <= rank < b:
                parent, lo, hi = lo, a, b
                break


class ControlChannel(CycleVectors):
    """Rank 0 holds one connection per other rank; the others one connection to rank 0
    (the star), and in a tree one to their parent and one per child as well.

    Every method is collective (all ranks call it in the same order), and only the cycle
    thread uses the channel once the runtime runs.
    """

    def __init__(
        self,
        rank: int,
        size: int,
        peers: dict[int, socket.socket],
        fanout: int = 0,
        links: dict[int, socket.socket] | None = None,
    ) -> None:
        self.rank = rank
        self.size = size
        #: rank 0: rank -> connection; other ranks: {0: connection}
        self.peers = peers
        self.fanout = fanout
        parent, self._end, children = tree_links(rank, size, fanout)
        links = {**peers, **(links or {})}
        self._parent = parent
        self._up = links.get(parent) if parent >= 0 else None
        #: (connection, first rank, end, how errors name it) of each child's subtree
        self._down = [(links[a], a, b, _subtree(a, b)) for a, b in children] if size > 1 else []
        #: how errors name this rank's parent (in the tree: its place)
        self._up_name = (
            f"rank {parent}" if parent <= 0 else f"rank {parent} (this rank's parent in the tree)"
        )
        self._own_links = [c for r, c in (links.items()) if r not in peers]
        self._init_vectors()
        self._scratch = bytearray(0)
        self._token_buf = memoryview(bytearray(1))
        self._sleep_selector: selectors.BaseSelector | None = None
        self._sleep_wake: Any = None  # the wake flag the selector watches

    @property
    def is_tree(self) -> bool:
        """Whether the cycle's messages go through a tree rather than the star."""
        return 1 <= self.fanout < self.size - 1

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
        fanout: int = 0,
    ) -> ControlChannel:
        """Build the star through the rendezvous ``store`` (rank 0 publishes its address),
        and with ``fanout`` >= 1 the tree: each rank with children below rank 0's listens
        and publishes its address too, and its children connect to it.

        ``host`` is where the other ranks reach this one: 127.0.0.1 on one machine (a
        rank then listens on loopback only), else this rank's hostname (rank 0's for the
        star; it listens everywhere).
        """
        peers: dict[int, socket.socket] = {}
        if size == 1:
            return cls(rank, size, peers)
        if rank == 0:
            store.set("hvdprof/control/protocol", str(PROTOCOL))
            store.set("hvdprof/control/fanout", str(fanout))
            peers = _accept_peers(store, "hvdprof/control/address", host, size - 1, timeout_s)
        else:
            theirs = int(store.get("hvdprof/control/fanout").decode())
            if theirs != fanout:  # the two topologies would wait on each other forever
                raise ControlError(
                    f"HVDPROF_CONTROL_FANOUT is {fanout} on rank {rank} but {theirs} on "
                    "rank 0: every rank needs the same value"
                )
            protocol = int(store.get("hvdprof/control/protocol").decode())
            if protocol != PROTOCOL:  # (set before the fan-out: never waited for)
                raise ControlError(
                    f"the control messages are version {PROTOCOL} on rank {rank} but "
                    f"{protocol} on rank 0: every rank needs the same hvdprof"
                )
            peers[0] = _connect_to(store, "hvdprof/control/address", rank, timeout_s)
        links: dict[int, socket.socket] = {}
        parent, _, children = tree_links(rank, size, fanout)
        try:
            if rank != 0 and children:  # an inner rank: its children connect to it
                links.update(
                    _accept_peers(
                        store, f"hvdprof/control/tree/{rank}", host, len(children), timeout_s
                    )
                )
            if parent > 0:
                links[parent] = _connect_to(
                    store, f"hvdprof/control/tree/{parent}", rank, timeout_s
                )
        except BaseException:
            for conn in [*peers.values(), *links.values()]:
                conn.close()
            raise
        for conn in [*peers.values(), *links.values()]:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn.settimeout(op_timeout_s)
        return cls(rank, size, peers, fanout, links)

    def close(self) -> None:
        if self._sleep_selector is not None:
            self._sleep_selector.close()
            self._sleep_selector = None
        for conn in [*self.peers.values(), *self._own_links]:
            conn.close()
        self.peers = {}
        self._own_links = []

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

    def exchange(
        self, reduce: Callable[[np.ndarray], np.ndarray]
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """The cycle's exchange: every rank's row (``send_buffer``) up to rank 0, which
        calls ``reduce`` on the matrix; its reply down to every rank, the matrix after it
        when the reply says so (``FULL``). Returns (reply, the matrix or None); both are
        valid until the next call.

        Each rank receives its children's row blocks straight into its own copy of the
        matrix and sends its subtree's rows up in one call: in the star, rank 0 makes
        N-1 receives and N-1 sends, a worker one of each."""
        recv = self._recv_np
        recv[self.rank] = self._send_np
        if self.size == 1:
            return reduce(recv), recv
        width = self._width
        for conn, a, b, who_a in self._down:
            _fill(conn, memoryview(recv[a:b]).cast("B"), (b - a) * width, who_a)
        if self.rank == 0:
            reply = reduce(recv)
            full = bool(reply[1] & FULL)
            data = reply.tobytes() + recv.tobytes() if full else reply.tobytes()
            for conn, a, _, who_a in self._down:
                _send(conn, data, a, who_a)
            return reply, recv
        up = self._up
        assert up is not None
        who = self._up_name
        _send(up, memoryview(recv[self.rank : self._end]).cast("B"), self._parent, who)
        reply = self._reply_np
        _fill(up, memoryview(reply), reply.nbytes, who)
        full = bool(reply[1] & FULL)
        if full:
            _fill(up, memoryview(recv).cast("B"), recv.nbytes, who)
        if self._down:
            data = reply.tobytes() + recv.tobytes() if full else reply.tobytes()
            for conn, a, _, who_a in self._down:
                _send(conn, data, a, who_a)
        return reply, recv if full else None

    # --- the idle sleep ---------------------------------------------------------------
    can_sleep = True

    def sleep(self, wake: Any, timeout: float) -> None:
        """Sleep until this rank or any other has work (``wake`` set, on some rank), or
        ``timeout`` passes; every rank calls it after the same reply (``QUIET_SLEEP``).

        Each rank watches its own ``wake`` and its links at once: nothing ticks while the
        job is idle, and a dead peer ends the sleep at once (its socket reads the end).
        Whatever ends it, the wake-up then crosses the tree as one token on every link
        each way: a rank sends one up when it wakes, rank 0 (and then each rank on
        receiving its parent's) sends one down to each child, and each rank reads one from
        its parent and one from each child. Every rank thus leaves after every other has
        woken, and no token is left in a socket to be misread as the next exchange."""
        if self.size == 1:
            wake.wait(timeout)
            return
        selector = self._sleep_selector
        if selector is not None and self._sleep_wake is not wake:  # (a new cycle loop)
            selector.close()
            selector = None
        if selector is None:
            self._sleep_wake = wake
            selector = self._sleep_selector = selectors.DefaultSelector()
            selector.register(wake.fileno(), selectors.EVENT_READ, None)
            if self._up is not None:
                selector.register(self._up, selectors.EVENT_READ, -1)
            for i, (conn, *_) in enumerate(self._down):
                selector.register(conn, selectors.EVENT_READ, i)
        read_up, read_down = False, set()
        if timeout > 0 and not wake.is_set():
            for key, _ in selector.select(timeout):
                if key.data == -1:
                    _fill(self._up, self._token_buf, 1, self._up_name)
                    read_up = True
                elif key.data is not None:
                    conn, _, _, who = self._down[key.data]
                    _fill(conn, self._token_buf, 1, who)
                    read_down.add(key.data)
        if self._up is not None:
            _send(self._up, _TOKEN, self._parent, self._up_name)
            if not read_up:
                _fill(self._up, self._token_buf, 1, self._up_name)
        for conn, a, _, who in self._down:
            _send(conn, _TOKEN, a, who)
        for i, (conn, _, _, who) in enumerate(self._down):
            if i not in read_down:
                _fill(conn, self._token_buf, 1, who)

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
        """Rank 0 receives every rank's payload (``lengths``, known to all, says who sends).

        Up the tree (or the star), each rank sends one frame for its subtree when anyone
        in it sends: its own payload for a single rank, else the subtree's payloads in rank
        order, each with its length."""
        if self.size == 1:
            return [payload]
        if self.rank != 0:
            if any(lengths[self.rank : self._end]):
                block = (
                    payload if self._end == self.rank + 1 else self._gather_block(payload, lengths)
                )
                _send_frame(self._up, block, self._parent, self._up_name)  # type: ignore[arg-type]
            return None
        out = [payload] + [b""] * (self.size - 1)
        for conn, a, b, who_a in self._down:
            if not any(lengths[a:b]):
                continue
            block = _recv_frame(conn, a, who_a)
            if b == a + 1:
                out[a] = block
                continue
            view, at = memoryview(block), 0
            for r in range(a, b):
                if lengths[r]:
                    n = _LENGTH.unpack_from(view, at)[0]
                    out[r] = bytes(view[at + 4 : at + 4 + n])
                    at += 4 + n
        return out

    def gather_merged(
        self,
        payload: bytes,
        lengths: list[int],
        merge: Callable[[list[tuple[int, bytes]]], bytes],
    ) -> bytes | None:
        """Rank 0: ``merge`` of every sending rank's payload (None on the other ranks).

        ``merge`` takes (rank, that rank's payload) and (-1, a block ``merge`` made) in
        rank order and returns one block. A leaf sends its payload bare; a relaying rank
        merges its own with its children's and forwards one frame; rank 0 merges its
        children's frames: k frames however many ranks sent."""
        if self.rank != 0 and not any(lengths[self.rank : self._end]):
            return None
        if self.rank != 0 and self._end == self.rank + 1:
            _send_frame(self._up, payload, self._parent, self._up_name)  # type: ignore[arg-type]
            return None
        parts = [(self.rank, payload)] if lengths[self.rank] else []
        for conn, a, b, who_a in self._down:
            if not any(lengths[a:b]):
                continue
            block = _recv_frame(conn, a, who_a)
            parts.append((a if b == a + 1 else -1, block))
        merged = merge(parts)
        if self.rank == 0:
            return merged
        _send_frame(self._up, merged, self._parent, self._up_name)  # type: ignore[arg-type]
        return None

    def _gather_block(self, payload: bytes, lengths: list[int]) -> bytes:
        """An inner rank's frame for ``gather_bytes``: its own payload and its children's."""
        parts = [_LENGTH.pack(len(payload)), payload] if lengths[self.rank] else []
        for conn, a, b, who_a in self._down:
            if not any(lengths[a:b]):
                continue
            block = _recv_frame(conn, a, who_a)
            if b == a + 1:  # a leaf sends its payload bare
                parts += [_LENGTH.pack(len(block)), block]
            else:
                parts.append(block)
        return b"".join(parts)

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        """Rank 0's payload on every rank (down the tree, or the star)."""
        if self.size == 1:
            assert payload is not None
            return payload
        if self.rank != 0:
            payload = _recv_frame(self._up, self._parent, self._up_name)  # type: ignore[arg-type]
        assert payload is not None
        for conn, a, _, who_a in self._down:
            _send_frame(conn, payload, a, who_a)
        return payload

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


# --- set-up ----------------------------------------------------------------------------
def _accept_peers(
    store: Any, key: str, host: str, count: int, timeout_s: float
) -> dict[int, socket.socket]:
    """Listen, publish the address under ``key``, take ``count`` connections: rank -> conn."""
    peers: dict[int, socket.socket] = {}
    bind = host if host == "127.0.0.1" else ""
    server = socket.create_server((bind, 0), backlog=max(count, 1))
    try:
        server.settimeout(timeout_s)
        store.set(key, f"{host}:{server.getsockname()[1]}")
        while len(peers) < count:
            conn, _ = server.accept()
            conn.settimeout(timeout_s)
            peer = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size, "a new peer"))[0]
            peers[peer] = conn
    except BaseException:
        for conn in peers.values():
            conn.close()
        raise
    finally:
        server.close()
    return peers


def _connect_to(store: Any, key: str, rank: int, timeout_s: float) -> socket.socket:
    """Connect to the address published under ``key`` and say who this is."""
    addr = store.get(key).decode()
    peer_host, port = addr.rsplit(":", 1)
    conn = socket.create_connection((peer_host, int(port)), timeout=timeout_s)
    conn.sendall(_LENGTH.pack(rank))
    return conn


# --- framing ---------------------------------------------------------------------------
def _send(conn: socket.socket, data: bytes | memoryview, peer: int, who: str = "") -> None:
    who = who or f"rank {peer}"
    try:
        conn.sendall(data)
    except TimeoutError:
        raise ControlError(f"sending to {who} timed out") from None
    except OSError as exc:
        raise ControlError(f"the connection to {who} is lost ({exc})") from None


def _send_frame(conn: socket.socket, payload: bytes, peer: int, who: str = "") -> None:
    _send(conn, _LENGTH.pack(len(payload)) + payload, peer, who)


def _recv_frame(conn: socket.socket, peer: int, who: str = "") -> bytes:
    who = who or f"rank {peer}"
    n = _LENGTH.unpack(_recv_exact(conn, _LENGTH.size, who))[0]
    return _recv_exact(conn, n, who) if n else b""


def _subtree(a: int, b: int) -> str:
    """How errors name a child: the rank, and the ranks it relays for in a tree (one of
    them may be the one that is gone)."""
    if b == a + 1:
        return f"rank {a}"
    below = f"rank {a + 1}" if b == a + 2 else f"ranks {a + 1}-{b - 1}"
    return f"rank {a} (relaying for {below})"


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
            gone = "it, or a rank it relays for," if "relaying" in who else "it"
            raise ControlError(f"{who} closed its connection ({gone} has exited or been killed)")
        got += k


def skewed_clock(skew_us: float) -> Callable[[], int]:
    """This rank's timeline clock; the skew is a testing aid that the offset must undo."""
    skew_ns = int(skew_us * 1000)
    if not skew_ns:
        return time.perf_counter_ns

    def clock() -> int:
        return time.perf_counter_ns() + skew_ns

    return clock
