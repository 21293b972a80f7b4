"""Negotiation: deciding, identically on every rank, which ops are ready to run.

Two paths, as in Horovod:
- The response cache: names negotiated before have a bit. Each cycle every rank shares
  its bit vector and the ops whose bit is set on every rank run, with no coordinator.
- The coordinator (rank 0): new names are gathered to rank 0, which waits until every
  rank has submitted a name, checks that all ranks agree on its signature, and replies
  with the responses in a fixed order. A disagreement fails that op on every rank.

In a tree of control messages (``HVDPROF_CONTROL_FANOUT``) each relaying rank merges its
subtree's new names before forwarding them (:func:`merge_requests`): one entry per distinct
(name, signature, splits) with the ranks that sent it, so rank 0 reads and handles its k
children's entries (``Coordinator.handle_merged``), not every rank's.

Everything here is plain state and pure logic; the cycle moves the bytes.
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from hvdprof.runtime.directives import Directive
from hvdprof.runtime.dtypes import torch_attr
from hvdprof.runtime.fusion import fusion_key, signature_nbytes
from hvdprof.runtime.requests import NEVER_CACHED, OpType, ReduceOp, Signature


@dataclass(frozen=True, slots=True)
class RequestMeta:
    """The wire form of a request: what a rank tells the coordinator."""

    name: str
    signature: Signature
    splits: tuple[int, ...] | None = None


@dataclass(slots=True)
class Response:
    """The coordinator's verdict on one name, applied by every rank in reply order."""

    name: str
    signature: Signature
    error: str | None = None
    cacheable: bool = False
    #: rank -> cycle in which the coordinator learned that rank was ready
    ready_cycles: dict[int, int] = field(default_factory=dict)
    #: allgather/alltoall: every rank's first dimension
    first_dims: tuple[int, ...] | None = None
    #: alltoall: every rank's send splits
    splits: tuple[tuple[int, ...], ...] | None = None
    #: ranks that had joined and contribute zeros instead of a tensor
    joined: tuple[int, ...] = ()


@dataclass(slots=True)
class CoordinatorReply:
    responses: list[Response] = field(default_factory=list)
    #: names removed from the response cache, in order, before new entries are added
    evicted: list[str] = field(default_factory=list)
    #: cycle-level orders from rank 0 (hvdprof/runtime/directives.py), applied by every
    #: rank at the end of this cycle
    directives: list[Directive] = field(default_factory=list)


class AgreedOp:
    """An op every rank agreed to run, with what the hot path needs precomputed.

    The response cache keeps one per cached name, and the cycle hands those same objects
    to the executor every time the name is ready: the fast path allocates nothing per op.
    """

    __slots__ = ("description", "fusable", "key", "name", "nbytes", "numel", "signature")

    #: set on a :class:`NegotiatedOp` only (the coordinator's verdict for a new name)
    error: str | None = None
    first_dims: tuple[int, ...] | None = None
    splits: tuple[tuple[int, ...], ...] | None = None

    def __init__(self, name: str, signature: Signature) -> None:
        self.name = name
        self.signature = signature
        self.key = fusion_key(signature)
        self.nbytes = signature_nbytes(signature)
        self.numel = math.prod(signature.shape)
        #: an allreduce that may share a fusion buffer (a failed op never runs; Adasum
        #: combines whole tensors, one at a time)
        self.fusable = signature.op == OpType.ALLREDUCE and signature.reduce_op != ReduceOp.ADASUM
        #: (op, dtype, shape, nbytes) as the timeline shows them, made once per name,
        #: and the process set's id after them for an op of a set other than the global
        self.description: tuple[Any, ...] = (
            signature.op.name,
            torch_attr(signature.dtype),
            tuple(signature.shape),
            self.nbytes,
        )
        if signature.process_set:
            self.description += (signature.process_set,)


class NegotiatedOp(AgreedOp):
    """The coordinator's verdict on a new name: an error, or what the op's outputs need."""

    __slots__ = ("error", "first_dims", "splits")

    def __init__(self, response: Response) -> None:
        super().__init__(response.name, response.signature)
        self.error = response.error
        self.first_dims = response.first_dims
        self.splits = response.splits
        if response.error is not None:
            self.fusable = False


class ResponseCache:
    """Replicated on every rank: the same calls in the same order give the same bits.

    Bits are allocated lowest-free-first, so no bit numbers need to travel.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._bit_of: dict[str, int] = {}
        self._entries: list[AgreedOp | None] = []
        self._free: list[int] = []

    def __len__(self) -> int:
        return len(self._bit_of)

    @property
    def width(self) -> int:
        """Length of the bit vector: identical on every rank."""
        return len(self._entries)

    @property
    def bit_of(self) -> dict[str, int]:
        """name -> bit; read-only view for the cycle's hot loop."""
        return self._bit_of

    def bit(self, name: str) -> int:
        return self._bit_of.get(name, -1)

    def lookup(self, name: str) -> tuple[int, Signature] | None:
        bit = self._bit_of.get(name)
        if bit is None:
            return None
        entry = self._entries[bit]
        assert entry is not None
        return bit, entry.signature

    def entry(self, bit: int) -> AgreedOp:
        entry = self._entries[bit]
        assert entry is not None, f"response cache bit {bit} is empty"
        return entry

    def entries(self) -> list[AgreedOp | None]:
        """By bit; read-only view for the cycle's hot loop."""
        return self._entries

    def put(self, name: str, signature: Signature) -> int:
        """Cache ``name``; -1 when full. Deterministic: every rank gets the same bit."""
        if name in self._bit_of:
            bit = self._bit_of[name]
            self._entries[bit] = AgreedOp(name, signature)
            return bit
        if len(self._bit_of) >= self.capacity:
            return -1
        if self._free:
            self._free.sort()
            bit = self._free.pop(0)
            self._entries[bit] = AgreedOp(name, signature)
        else:
            bit = len(self._entries)
            self._entries.append(AgreedOp(name, signature))
        self._bit_of[name] = bit
        return bit

    def evict(self, name: str) -> int:
        bit = self._bit_of.pop(name, -1)
        if bit >= 0:
            self._entries[bit] = None
            self._free.append(bit)
        return bit

    def clear(self) -> list[str]:
        names = list(self._bit_of)
        for name in names:
            self.evict(name)
        return names

    def apply(self, reply: CoordinatorReply, enabled: bool) -> None:
        for name in reply.evicted:
            self.evict(name)
        if not enabled:
            return
        for response in reply.responses:
            if response.cacheable:
                self.put(response.name, response.signature)


@dataclass(slots=True)
class _Pending:
    metas: dict[int, RequestMeta] = field(default_factory=dict)
    cycles: dict[int, int] = field(default_factory=dict)
    first_seen: float = 0.0


class Coordinator:
    """Rank 0's table of names some ranks have submitted and others not yet.

    An op of a process set waits for that set's members only (``sets``: the runtime's
    :class:`~hvdprof.runtime.process_sets.ProcessSetTable`, or None: every op is global).
    """

    def __init__(self, size: int, sets: Any = None) -> None:
        self.size = size
        self.sets = sets
        self._everyone = frozenset(range(size))
        self._table: dict[str, _Pending] = {}

    def pending(self) -> dict[str, tuple[frozenset[int], float]]:
        """name -> (ranks that submitted it, when the first one did): for the stall inspector.

        For an op of a process set, the ranks outside the set count as ready: they never
        submit it, so they are never the late ones it waits for."""
        out = {}
        for n, p in self._table.items():
            ready = frozenset(p.metas)
            set_id = next(iter(p.metas.values())).signature.process_set
            members = self.sets.members(set_id) if set_id and self.sets is not None else None
            if members is not None:
                ready |= self._everyone - frozenset(members)
            out[n] = (ready, p.first_seen)
        return out

    def pending_outsiders(self) -> dict[str, frozenset[int]]:
        """name -> the ranks outside its process set, for each pending op of a set (the
        stall line must not say they submitted it)."""
        out = {}
        for n, p in self._table.items():
            set_id = next(iter(p.metas.values())).signature.process_set
            members = self.sets.members(set_id) if set_id and self.sets is not None else None
            if members is not None:
                out[n] = self._everyone - frozenset(members)
        return out

    def pending_kinds(self) -> dict[str, str]:
        """name -> op type (``ALLREDUCE``...) of every pending name, as its first rank sent it."""
        return {n: next(iter(p.metas.values())).signature.op.name for n, p in self._table.items()}

    def handle(
        self,
        cycle: int,
        messages: Iterable[tuple[int, list[RequestMeta]]],
        joined: frozenset[int],
        cache: ResponseCache,
        cache_enabled: bool,
        now: float,
    ) -> CoordinatorReply:
        reply = CoordinatorReply()
        evicted: set[str] = set()
        for rank, metas in messages:
            for meta in metas:
                entry = self._entry(meta, reply, evicted, cache, now)
                entry.metas[rank] = meta
                entry.cycles[rank] = cycle
        self._decide(reply, joined, cache_enabled)
        return reply

    def _entry(
        self,
        meta: RequestMeta,
        reply: CoordinatorReply,
        evicted: set[str],
        cache: ResponseCache,
        now: float,
    ) -> _Pending:
        """The pending entry ``meta`` files into (made on first sight). A rank sends a
        cached name here only when its signature changed: the cached entry is then stale
        for everyone, and the reply evicts it once."""
        if cache.bit(meta.name) >= 0 and meta.name not in evicted:
            evicted.add(meta.name)
            reply.evicted.append(meta.name)
        # names are per process set, as each of Horovod's sets has its own queue
        key = meta.name
        if meta.signature.process_set:
            key = f"{meta.name} (process set {meta.signature.process_set})"
        entry = self._table.get(key)
        if entry is None:
            entry = self._table[key] = _Pending(first_seen=now)
        return entry

    def handle_merged(
        self,
        cycle: int,
        groups: Iterable[tuple[RequestMeta, Sequence[int]]],
        joined: frozenset[int],
        cache: ResponseCache,
        cache_enabled: bool,
        now: float,
    ) -> CoordinatorReply:
        """``handle`` for requests merged up a tree (:func:`read_merged`): each distinct
        request once, with the ranks that sent it. The same table and the same verdicts
        (the ranks in a group share one meta object, so comparing them is an identity
        check), at the cost of a dict update per group instead of a loop per rank."""
        reply = CoordinatorReply()
        evicted: set[str] = set()
        for meta, ranks in groups:
            entry = self._entry(meta, reply, evicted, cache, now)
            entry.metas.update(dict.fromkeys(ranks, meta))
            entry.cycles.update(dict.fromkeys(ranks, cycle))
        self._decide(reply, joined, cache_enabled)
        return reply

    def _decide(self, reply: CoordinatorReply, joined: frozenset[int], cache_enabled: bool) -> None:
        """The verdict on every name now submitted by every rank it waits for."""
        for key in list(self._table):
            entry = self._table[key]
            submitted = set(entry.metas)
            first = next(iter(entry.metas.values()))
            name, set_id = first.name, first.signature.process_set
            if set_id:
                members = self.sets.members(set_id) if self.sets is not None else None
                if members is None:  # removed while some members still had it pending
                    del self._table[key]
                    reply.responses.append(self._removed_set(name, entry, set_id))
                    continue
                if set(members) - submitted:  # (join() concerns the global set only)
                    continue
                del self._table[key]
                reply.responses.append(self._verdict(name, entry, (), cache_enabled, members))
                continue
            missing = self._everyone - submitted - joined
            if missing:
                continue
            del self._table[key]
            reply.responses.append(
                self._verdict(name, entry, tuple(sorted(set(joined) - submitted)), cache_enabled)
            )

    def _removed_set(self, name: str, entry: _Pending, set_id: int) -> Response:
        sig = next(iter(entry.metas.values())).signature
        return Response(
            name=name,
            signature=sig,
            ready_cycles=dict(entry.cycles),
            error=(
                f"{sig.op.name.lower()} of tensor {name!r} was submitted to process set "
                f"{set_id}, which has been removed"
            ),
        )

    def _verdict(
        self,
        name: str,
        entry: _Pending,
        joined: tuple[int, ...],
        cache_enabled: bool,
        members: tuple[int, ...] | None = None,
    ) -> Response:
        ranks = sorted(entry.metas)
        first = entry.metas[ranks[0]]
        sig = first.signature
        response = Response(name=name, signature=sig, ready_cycles=dict(entry.cycles))
        error = _mismatch_message(name, entry.metas)
        stray = sorted(set(ranks) - set(members)) if members is not None else []
        if error is None and stray:
            error = (
                f"{sig.op.name.lower()} of tensor {name!r} for process set {sig.process_set} "
                f"(ranks {list(members or ())}) was also submitted by rank(s) {stray}, "
                "which are not in it"
            )
        order = range(self.size) if members is None else members
        if error is None and joined and sig.op != OpType.ALLREDUCE:
            error = (
                f"{sig.op.name.lower()} of tensor {name!r} was submitted while rank(s) "
                f"{list(joined)} had called join(); only allreduce can run with joined ranks"
            )
        if error is None and sig.op in (OpType.ALLGATHER, OpType.ALLTOALL):
            response.first_dims = tuple(
                entry.metas[r].signature.shape[0] if entry.metas[r].signature.shape else 1
                for r in order
            )
        if error is None and sig.op == OpType.ALLTOALL:
            response.splits = tuple(entry.metas[r].splits or () for r in order)
        response.error = error
        response.joined = joined
        # An op of a process set goes through the coordinator every time: a cache bit is
        # ready when set on every rank, and the ranks outside the set never set it.
        response.cacheable = (
            cache_enabled
            and error is None
            and not joined
            and sig.op not in NEVER_CACHED
            and not sig.process_set
        )
        return response


def _mismatch_message(name: str, metas: dict[int, RequestMeta]) -> str | None:
    ranks = sorted(metas)
    base = metas[ranks[0]].signature
    first = metas[ranks[0]]
    by_field: dict[str, dict[int, Any]] = {}
    for rank in ranks[1:]:
        theirs_meta = metas[rank]
        if theirs_meta is first:  # merged up a tree: one object for the ranks that agree
            continue
        for field_name, _mine, theirs in base.differences(theirs_meta.signature):
            values = by_field.setdefault(field_name, {})
            values[rank] = theirs
    if not by_field:
        return None
    parts = []
    for field_name, values in by_field.items():
        shown = {ranks[0]: _field_value(base, field_name)}
        shown.update(values)
        detail = ", ".join(f"rank {r} has {_show(v)}" for r, v in sorted(shown.items()))
        parts.append(f"{field_name}: {detail}")
    return f"Mismatched {base.op.name.lower()} for tensor {name!r} across ranks: " + "; ".join(
        parts
    )


def _field_value(sig: Signature, field_name: str) -> Any:
    if field_name.startswith("shape"):
        return sig.shape
    return getattr(sig, field_name)


def _show(value: Any) -> str:
    if hasattr(value, "name") and not isinstance(value, str):
        return value.name
    if isinstance(value, tuple):
        return "[" + ", ".join(str(v) for v in value) + "]"
    return repr(value)


# --- requests merged up a tree of control messages -------------------------------------
#: the first byte of a merged block: a rank that reads another version refuses it by name
MERGED_REQUESTS_VERSION = 2


class MergedRequestsError(RuntimeError):
    """A merged block this version cannot read (ranks running different hvdprof versions)."""


def merge_requests(parts: Sequence[tuple[int, bytes]]) -> bytes:
    """One block for a subtree's new names: ``parts`` are (rank, that rank's own payload,
    a pickled list of :class:`RequestMeta`) or (-1, a child subtree's merged block), in
    rank order. Each distinct (name, signature, splits) appears once, with its ranks in
    order, and in the order of its first appearance, so rank 0 sees the names in the
    order the star would have given it (subtrees are contiguous ranges)."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for rank, blob in parts:
        if rank >= 0:
            for meta in pickle.loads(blob):
                key = (meta.name, meta.signature, meta.splits)
                ranks = groups.get(key)
                if ranks is None:
                    groups[key] = [rank]
                else:
                    ranks.append(rank)
            continue
        for name, signature, splits, ranks_in in _read_block(blob):
            key = (name, signature, splits)
            ranks = groups.get(key)
            if ranks is None:
                groups[key] = list(ranks_in)
            else:
                ranks.extend(ranks_in)
    body = [(*key, tuple(ranks)) for key, ranks in groups.items()]
    return bytes([MERGED_REQUESTS_VERSION]) + pickle.dumps(body, protocol=pickle.HIGHEST_PROTOCOL)


def read_merged(block: bytes) -> list[tuple[RequestMeta, tuple[int, ...]]]:
    """Rank 0: the whole job's merged block as ``Coordinator.handle_merged`` takes it."""
    return [
        (RequestMeta(name, signature, splits), ranks)
        for name, signature, splits, ranks in _read_block(block)
    ]


def _read_block(block: bytes) -> list[tuple[Any, ...]]:
    if not block or block[0] != MERGED_REQUESTS_VERSION:
        version = block[0] if block else "none"
        raise MergedRequestsError(
            f"merged requests of wire version {version}, where this hvdprof reads version "
            f"{MERGED_REQUESTS_VERSION}: every rank needs the same hvdprof"
        )
    return pickle.loads(memoryview(block)[1:])
