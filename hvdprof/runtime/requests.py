"""What a rank asks the runtime for, and the part of it every rank must agree on.

A ``Request`` lives on one rank and holds the tensors. Its ``Signature`` is the small,
picklable description the coordinator compares across ranks and the response cache
remembers, so the cycle never ships tensors through negotiation.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

from hvdprof.runtime.handles import Handle


class OpType(enum.IntEnum):
    ALLREDUCE = 0
    ALLGATHER = 1
    BROADCAST = 2
    ALLTOALL = 3
    REDUCESCATTER = 4
    BARRIER = 5


class ReduceOp(enum.IntEnum):
    """Horovod's reduction ops (``hvd.Average`` ... ``hvd.Product``), same values."""

    AVERAGE = 0
    SUM = 1
    ADASUM = 2
    MIN = 3
    MAX = 4
    PRODUCT = 5


#: ops whose first dimension may differ across ranks (compared without it)
VARIABLE_FIRST_DIM = frozenset({OpType.ALLGATHER, OpType.ALLTOALL})
#: ops that go through the coordinator every time: their outputs depend on every
#: rank's sizes, which a one-bit cache entry cannot carry.
NEVER_CACHED = frozenset({OpType.ALLGATHER, OpType.ALLTOALL, OpType.BARRIER})


class Signature(NamedTuple):
    """Everything about an op that must be identical on all ranks.

    A NamedTuple: built once per op on the user's thread and compared once per op on
    the cycle thread, so construction and equality must be C-speed.
    """

    op: OpType
    dtype: str
    shape: tuple[int, ...]
    reduce_op: ReduceOp
    root_rank: int
    prescale: float
    postscale: float
    device: str
    #: the process set's id (0: every rank); see :mod:`hvdprof.runtime.process_sets`
    process_set: int = 0

    def compared_shape(self) -> tuple[int, ...]:
        return self.shape[1:] if self.op in VARIABLE_FIRST_DIM else self.shape

    def differences(self, other: Signature) -> list[tuple[str, Any, Any]]:
        """The fields in which two ranks disagree, as (field, mine, theirs)."""
        out = []
        for field_name in (
            "op",
            "dtype",
            "reduce_op",
            "root_rank",
            "prescale",
            "postscale",
            "device",
            "process_set",
        ):
            a, b = getattr(self, field_name), getattr(other, field_name)
            if a != b:
                out.append((field_name, a, b))
        if self.compared_shape() != other.compared_shape():
            label = (
                "shape (all but the first dimension)" if self.op in VARIABLE_FIRST_DIM else "shape"
            )
            out.append((label, self.shape, other.shape))
        return out


class Request(Handle):
    """One op submitted on this rank, and the handle its submitter waits on.

    ``output`` receives the result. One object rather than a request plus a handle: it
    is created once per tensor per step on the user's thread, and every object that lives
    until the op completes costs construction time and garbage-collector work.
    """

    __slots__ = (
        "output",
        "signature",
        "splits",
        "stream_event",
        "t_offered",
        "t_submit",
        "tensor",
    )

    def __init__(
        self,
        name: str,
        signature: Signature,
        tensor: Any,
        output: Any,
        t_submit: int,
        splits: tuple[int, ...] | None = None,
        release: Any = None,
        retire: Any = None,
    ) -> None:
        self.name = name
        self.result = None
        self.error = None
        self.done_flag = False
        self.release = release
        self.retire = retire
        self.signature = signature
        self.tensor = tensor
        self.output = output
        self.t_submit = t_submit
        #: when the cycle took an op that was held for its rank's wait off the queue
        #: (``HVDPROF_WAKE_ON_SUBMIT_BYTES``): where its negotiation began; 0 otherwise
        self.t_offered = 0
        self.splits = splits
        #: device path (issue 28): the event after which the data is ready: recorded on
        #: the user's stream at submit, replaced by the op's done event at completion
        self.stream_event: Any = None

    @property
    def nbytes(self) -> int:
        t = self.tensor
        return 0 if t is None else t.numel() * t.element_size()
