"""Every name that appears in an hvdprof timeline, defined once.

The sink writes these names, the reader, the analyses, the dashboard and the tests look
for them, and the NVTX ranges reuse them: a rename here is a rename everywhere. The
activity names follow Horovod's timeline (``NEGOTIATE_ALLREDUCE``, ``QUEUE``,
``MEMCPY_IN_FUSION_BUFFER``, ...) so that people who know Horovod's traces can read ours.
"""

from __future__ import annotations

#: The collective ops the runtime reports (``OpRecord.op`` / ``GroupRecord.op``).
OPS: tuple[str, ...] = (
    "ALLREDUCE",
    "ALLGATHER",
    "BROADCAST",
    "ALLTOALL",
    "REDUCESCATTER",
    "BARRIER",
    "JOIN",
)

#: Prefix of the slice from submission until every rank is ready (``NEGOTIATE_ALLREDUCE``).
NEGOTIATE_PREFIX = "NEGOTIATE_"
#: Child of the op slice: negotiated, waiting for its fusion buffer / backend call.
QUEUE = "QUEUE"
#: Child of the op slice (device path): until the kernel that produced the tensor is done.
WAIT_FOR_DATA = "WAIT_FOR_DATA"
#: Child of the op slice: packing the tensor into the fusion buffer.
MEMCPY_IN_FUSION_BUFFER = "MEMCPY_IN_FUSION_BUFFER"
#: Child of the op slice: unpacking the result out of the fusion buffer.
MEMCPY_OUT_FUSION_BUFFER = "MEMCPY_OUT_FUSION_BUFFER"
#: Instant inside the negotiate slice: when this rank learned that rank N was ready.
READY_PREFIX = "READY rank "
#: the barrier ``shutdown()`` runs when the job has process sets (a rank whose sets are
#: done waits there for the others): the runtime's, not the training's; not a step's op
SHUTDOWN_BARRIER = "hvdprof.shutdown"
#: Slice per negotiation cycle (HVDPROF_TIMELINE_MARK_CYCLES=1).
CYCLE_PREFIX = "CYCLE "
#: Instant: the autotuner applied new parameters at this cycle.
AUTOTUNE_PARAMS = "AUTOTUNE_PARAMS"
#: ranks found holding different weights or averaged gradients (HVDPROF_CHECK_DIVERGENCE)
DIVERGENCE = "DIVERGENCE"
#: Instant: the autotuner scored one sample.
AUTOTUNE_SAMPLE = "AUTOTUNE_SAMPLE"
#: Instant on rank 0: ranks have not submitted what others wait on (args: the stall line,
#: the missing ranks, the names, the time waited so far, each missing rank's stack).
STALL = "STALL"
#: Instant: this rank printed its Python stacks (SIGUSR1); args carry the text.
STACKS = "STACKS"

#: Counter tracks (``ph: "C"``); each name is one track per rank.
COUNTER_FUSION_THRESHOLD = "fusion threshold (MiB)"
COUNTER_CYCLE_TIME = "cycle time (ms)"
COUNTER_CYCLE_DURATION = "cycle duration (ms)"
COUNTER_BYTES_REDUCED = "bytes reduced per cycle"
COUNTER_AUTOTUNE_SCORE = "autotune score"
#: Per rank, at the moment its training thread got control back from its last wait on ops
#: that blocked (its next submission reports it): how long it was blocked since it last
#: submitted.
#: The straggler analysis starts a rank's own work of a step there.
COUNTER_WAITED = "waited for collectives (ms)"

#: Metadata event written last on a clean close (its args carry the final counts).
TRACE_END = "hvdprof_trace_end"

#: Fixed lanes (Chrome ``tid``) of every rank; tensor lanes come after them.
LANE_RUNTIME = 0
LANE_CYCLES = 1
LANE_AUTOTUNE = 2
LANE_NAMES: dict[int, str] = {
    LANE_RUNTIME: "runtime",
    LANE_CYCLES: "cycles",
    LANE_AUTOTUNE: "autotune",
}
#: First tid used for per-tensor lanes.
FIRST_TENSOR_LANE = 16

#: NVTX phases the cycle thread marks (domain :data:`NVTX_DOMAIN`).
NVTX_DOMAIN = "hvdprof"
NVTX_CYCLE = "CYCLE"
NVTX_NEGOTIATE = "NEGOTIATE"
NVTX_MEMCPY_IN = MEMCPY_IN_FUSION_BUFFER
NVTX_COLLECTIVE = "COLLECTIVE"
NVTX_MEMCPY_OUT = MEMCPY_OUT_FUSION_BUFFER


def negotiate_name(op: str) -> str:
    """``NEGOTIATE_<OP>``, e.g. ``NEGOTIATE_ALLREDUCE``."""
    return NEGOTIATE_PREFIX + op


def collective_name(backend: str, op: str) -> str:
    """The backend call of an op, e.g. ``GLOO_ALLREDUCE`` or ``MPI_ALLREDUCE``."""
    return f"{backend}_{op}"


def ready_name(rank: int) -> str:
    """``READY rank <r>``: the readiness mark of one rank inside a negotiate slice."""
    return f"{READY_PREFIX}{rank}"


def cycle_name(cycle: int) -> str:
    """``CYCLE <n>``: the slice of one negotiation cycle."""
    return f"{CYCLE_PREFIX}{cycle}"


def process_name(rank: int, hostname: str) -> str:
    """Name of a rank's process track: ``rank <r> (<host>)``."""
    return f"rank {rank} ({hostname})"


def profiler_process_name(rank: int) -> str:
    """Name of the process track a merged torch.profiler (Kineto) trace gets."""
    return f"rank {rank} torch.profiler"
