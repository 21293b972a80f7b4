"""Turning cycle records into Chrome trace events (in the renderer process, see below).

Layout of one rank (one Chrome process, ``pid = rank``):

* fixed lanes ``runtime`` (instants), ``cycles`` (``CYCLE <n>`` slices) and ``autotune``;
* one lane per tensor name (``thread_name`` = the name). An op draws
  ``NEGOTIATE_<OP>`` from submission to negotiation (an op held for its rank's wait:
  from when the cycle took it), with this rank's ``READY rank <r>`` instant at the
  submission and the last rank to be ready in its args (so an op's events do not grow
  with the ranks), then ``<OP>`` until done, containing ``QUEUE``,
  ``MEMCPY_IN_FUSION_BUFFER``, ``<BACKEND>_<OP>`` and ``MEMCPY_OUT_FUSION_BUFFER``;
* counters (fusion threshold, cycle time, cycle duration, bytes reduced) on the process.

Every slice is a complete ``X`` event, so nothing can be left open by a crash, and children
are clamped into their parent and after their elder sibling, so a lane always nests. Lanes
are bounded: after ``max_named_lanes`` tensor names, ops go to a bounded pool of shared
lanes, packed first-fit so that slices in one lane still never overlap.

Events are formatted by hand rather than through ``json.dumps`` of a dict: it is several
times cheaper. Strings that reach the file (tensor names, dtypes, errors) always pass
through ``json.dumps``.

Where it runs: normally in the rank's renderer child process
(:mod:`hvdprof.timeline.render_process`), which gets the records through
:mod:`hvdprof.timeline.transport`; there it owns its interpreter and ``yield_gil=False``.
In the in-process fallback it runs on the writer thread, under the GIL next to the
training loop, and hands the GIL over every few ops (``yield_gil=True``, the default).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from hvdprof.common import activities as act
from hvdprof.timeline.writer import Lines, dumps_event

if TYPE_CHECKING:  # the renderer process never imports the runtime (nor numpy)
    from hvdprof.common.records import CycleRecord

#: Tensor names that get a lane of their own; later names share the pool.
MAX_NAMED_LANES = 4096
#: Size of the shared pool for names beyond MAX_NAMED_LANES (and for self-overlapping ops).
MAX_SHARED_LANES = 256

_ESCAPE_CACHE_LIMIT = 16384
#: ops rendered between voluntary GIL releases (about 0.3 ms of work)
_OPS_PER_GIL_SLICE = 32

# Item tags understood by CycleRenderer.render.
ITEM_CYCLE = 0
ITEM_INSTANT = 1
ITEM_COUNTER = 2
ITEM_EVENT = 3
ITEM_LINES = 4
#: a cycle in plain form: ``(ITEM_COLUMNS, head, groups, columns, shift)`` (the renderer
#: process gets cycles this way; see :func:`cycle_columns`)
ITEM_COLUMNS = 5

#: "not known" in the readiness column (``hvdprof.common.records.NO_TIME``)
NO_TIME = -(1 << 63)


class GroupRow(NamedTuple):
    """One backend call as the renderer gets it: ``GroupRecord``'s fields, by name.

    A tuple on the wire (pickled at C speed) that is read by field name, not position;
    built once per group by :func:`group_rows` on both the in-process and the child path.
    """

    group_id: int
    op: str
    backend: str
    num_tensors: int
    nbytes: int
    buffer_bytes: int
    dtype: str
    t_pack_start: int
    t_pack_end: int
    t_collective_start: int
    t_collective_end: int
    t_unpack_start: int
    t_unpack_end: int
    t_wait_start: int = 0  # device path only
    t_wait_end: int = 0


class ParamsRow(NamedTuple):
    """``TunableParams``' fields, by name."""

    fusion_threshold_bytes: int
    cycle_time_ms: float
    cache_enabled: bool


class CycleHead(NamedTuple):
    """A cycle's own facts, built once by :func:`cycle_head` (the transport sends it)."""

    cycle: int
    step: int
    t_start: int
    t_negotiated: int
    t_end: int
    params: ParamsRow
    bytes_reduced: int
    params_changed: bool


class OpColumns(NamedTuple):
    """A cycle's ops by column, as the renderer reads them. ``ready`` is flat (op ``i``,
    rank ``r`` at ``i * ranks + r``, :data:`NO_TIME` when unknown); ``errors`` maps
    positions to messages. (On the wire, ``t_negotiated`` may be one int, ``ready`` and
    ``cached`` bytes: see :mod:`hvdprof.timeline.wire`.)"""

    names: list[str]
    kinds: list[tuple[Any, ...]]
    t_submit: list[int]
    t_negotiated: Any
    ready: Any
    ranks: int
    cached: Any
    group_ids: list[int]
    t_done: list[int]
    errors: dict[int, str]


#: a group row's fields: ``GroupRecord``'s, in this order
GROUP_FIELDS = GroupRow._fields
#: the params row's: ``TunableParams``'
PARAM_FIELDS = ParamsRow._fields


def us(ns: int) -> str:
    """Nanoseconds as microseconds with exactly three decimals, without float rounding.

    Exact decimal output means ``ts + dur`` of a child never exceeds its parent's end by a
    rounding step, which would break nesting in the viewer.
    """
    if ns >= 1000:  # the common case, by string slicing (cheaper than divmod + format)
        text = str(ns)
        return text[:-3] + "." + text[-3:]
    if ns >= 0:
        q, r = divmod(ns, 1000)
        return f"{q}.{r:03d}"
    q, r = divmod(-ns, 1000)
    return f"-{q}.{r:03d}"


class _Times(dict[int, str]):
    """Timeline text of local times (ns), each formatted once (``us(t + shift)``)."""

    __slots__ = ("shift",)

    def __init__(self, shift: int) -> None:
        super().__init__()
        self.shift = shift

    def __missing__(self, t: int) -> str:
        text = self[t] = us(t + self.shift)
        return text


class _Lane:
    """One track. Caches the text that repeats for every op drawn on it."""

    __slots__ = ("args_key", "args_text", "last_end", "tail", "tid")

    def __init__(self, tid: int, pid: int = 0) -> None:
        self.tid = tid
        self.last_end = -(1 << 62)
        self.tail = f'"pid":{pid},"tid":{tid}}}'
        self.args_key: Any = None
        self.args_text = ""


class CycleRenderer:
    """Stateful converter from queued items to JSON event lines for one rank.

    Single-threaded by design: only one thread (the renderer process's main thread, or the
    fallback writer thread) calls :meth:`render`.
    """

    def __init__(
        self,
        rank: int,
        hostname: str,
        *,
        mark_cycles: bool = False,
        max_named_lanes: int = MAX_NAMED_LANES,
        max_shared_lanes: int = MAX_SHARED_LANES,
        yield_gil: bool = True,
    ) -> None:
        self.rank = rank
        self.hostname = hostname
        self.mark_cycles = mark_cycles
        self._pid = rank
        self._max_named = max_named_lanes
        self._max_shared = max(1, max_shared_lanes)
        self._named: dict[str, _Lane] = {}
        self._shared: list[_Lane] = []
        self._escaped: dict[str, str] = {}
        self._cycle_lane = _Lane(act.LANE_CYCLES, rank)
        self._params: Any = None
        self._bytes_reduced: int | None = None
        self.lanes_clamped = 0  # ops whose start had to be delayed to fit a busy lane
        # ops between voluntary GIL releases; 0: never (alone in its process)
        self._gil_slice = _OPS_PER_GIL_SLICE if yield_gil else 0

    # --- helpers ------------------------------------------------------------------------

    def _esc(self, text: str) -> str:
        out = self._escaped.get(text)
        if out is None:
            out = json.dumps(text)
            if len(self._escaped) < _ESCAPE_CACHE_LIMIT:
                self._escaped[text] = out
        return out

    def _thread_meta(self, tid: int, name: str) -> list[str]:
        p = self._pid
        return [
            f'{{"name":"thread_name","ph":"M","pid":{p},"tid":{tid},"args":{{"name":{self._esc(name)}}}}}',
            f'{{"name":"thread_sort_index","ph":"M","pid":{p},"tid":{tid},"args":{{"sort_index":{tid}}}}}',
        ]

    def header(self) -> list[str]:
        """Process and fixed-lane metadata, written first."""
        p = self._pid
        lines = [
            f'{{"name":"process_name","ph":"M","pid":{p},"tid":0,"args":{{"name":{self._esc(act.process_name(self.rank, self.hostname))}}}}}',
            f'{{"name":"process_sort_index","ph":"M","pid":{p},"tid":0,"args":{{"sort_index":{self.rank}}}}}',
        ]
        for tid, name in act.LANE_NAMES.items():
            lines += self._thread_meta(tid, name)
        return lines

    def _lane_for(self, name: str, start: int, out: list[str]) -> _Lane:
        lane = self._named.get(name)
        if lane is not None and lane.last_end <= start:
            return lane  # the common case: this tensor's own lane, free
        if lane is None and len(self._named) < self._max_named:
            lane = _Lane(act.FIRST_TENSOR_LANE + len(self._named), self._pid)
            self._named[name] = lane
            out += self._thread_meta(lane.tid, name)
        if lane is not None and lane.last_end <= start:
            return lane
        for shared in self._shared:
            if shared.last_end <= start:
                return shared
        if len(self._shared) < self._max_shared:
            shared = _Lane(act.FIRST_TENSOR_LANE + self._max_named + len(self._shared), self._pid)
            self._shared.append(shared)
            out += self._thread_meta(shared.tid, f"shared lane {len(self._shared) - 1}")
            return shared
        self.lanes_clamped += 1
        return min(self._shared, key=lambda lane: lane.last_end)

    # --- items ----------------------------------------------------------------------------

    def render(self, item: tuple[Any, ...]) -> list[str]:
        """JSON texts for one queued item (see the ITEM_* tags)."""
        tag = item[0]
        if tag == ITEM_COLUMNS:
            return self.render_columns(item[1], item[2], item[3], item[4])
        if tag == ITEM_CYCLE:
            return self.render_cycle(item[1], item[2])
        if tag == ITEM_INSTANT:
            _, name, t_ns, shift, args, lane, scope = item
            return [self.instant(name, t_ns + shift, args, lane=lane, scope=scope)]
        if tag == ITEM_COUNTER:
            _, name, t_ns, shift, values = item
            return [self.counter(name, t_ns + shift, values)]
        if tag == ITEM_EVENT:
            return [dumps_event(item[1])]
        if tag == ITEM_LINES:
            return list(item[1])
        raise ValueError(f"unknown timeline item tag {tag!r}")

    def instant(
        self,
        name: str,
        ts_ns: int,
        args: Mapping[str, Any] | None = None,
        *,
        lane: int = act.LANE_RUNTIME,
        scope: str = "t",
    ) -> str:
        """An instant event at timeline time ``ts_ns``; ``scope`` is ``t``, ``p`` or ``g``."""
        if scope not in ("t", "p", "g"):
            raise ValueError(f"instant scope must be 't', 'p' or 'g', not {scope!r}")
        text = f'{{"name":{self._esc(name)},"ph":"i","s":"{scope}","ts":{us(ts_ns)},"pid":{self._pid},"tid":{int(lane)}'
        if args:
            text += ',"args":' + dumps_event(dict(args))
        return text + "}"

    def counter(self, name: str, ts_ns: int, values: Mapping[str, Any]) -> str:
        """A counter sample (one track per name, one series per key of ``values``)."""
        return (
            f'{{"name":{self._esc(name)},"ph":"C","ts":{us(ts_ns)},"pid":{self._pid},"tid":0,'
            f'"args":{dumps_event(dict(values))}}}'
        )

    def render_cycle(self, record: CycleRecord, shift: int) -> Lines:
        """All events of one cycle record; ``shift`` maps local ns to timeline ns."""
        head, groups, columns = cycle_columns(record)
        return self.render_columns(head, groups, columns, shift)

    def render_columns(
        self,
        head: CycleHead,
        groups: list[GroupRow],
        columns: OpColumns,
        shift: int,
    ) -> Lines:
        """All events of one cycle in its plain form (see :func:`cycle_columns`): JSON texts,
        one or more events each (an op's events come as one text, joined by ``",\n"``);
        ``.events`` says how many."""
        out = Lines()
        p = self._pid
        cycle, step, t_start = head.cycle, head.step, head.t_start
        t_end, params, bytes_reduced = head.t_end, head.params, head.bytes_reduced
        changed = head.params_changed
        n_ops = len(columns.names)
        if self._params is None or changed or params != self._params:
            ts = us(t_start + shift)
            threshold, cycle_ms = params.fusion_threshold_bytes, params.cycle_time_ms
            cache_enabled = params.cache_enabled
            out.append(
                f'{{"name":{self._esc(act.COUNTER_FUSION_THRESHOLD)},"ph":"C","ts":{ts},"pid":{p},"tid":0,'
                f'"args":{{"value":{threshold / 1048576:.6g}}}}}'
            )
            out.append(
                f'{{"name":{self._esc(act.COUNTER_CYCLE_TIME)},"ph":"C","ts":{ts},"pid":{p},"tid":0,'
                f'"args":{{"value":{float(cycle_ms):.6g}}}}}'
            )
            if self._params is not None or changed:
                out.append(
                    f'{{"name":"{act.AUTOTUNE_PARAMS}","ph":"i","s":"p","ts":{ts},"pid":{p},"tid":{act.LANE_RUNTIME},'
                    f'"args":{{"cycle":{cycle},"fusion_threshold_bytes":{int(threshold)},'
                    f'"cycle_time_ms":{float(cycle_ms)!r},"cache_enabled":{"true" if cache_enabled else "false"}}}}}'
                )
            self._params = params
        if n_ops:
            out.append(
                f'{{"name":{self._esc(act.COUNTER_CYCLE_DURATION)},"ph":"C","ts":{us(t_start + shift)},"pid":{p},"tid":0,'
                f'"args":{{"value":{(t_end - t_start) / 1e6:.6g}}}}}'
            )
        if bytes_reduced != self._bytes_reduced:
            self._bytes_reduced = bytes_reduced
            out.append(
                f'{{"name":{self._esc(act.COUNTER_BYTES_REDUCED)},"ph":"C","ts":{us(t_start + shift)},"pid":{p},"tid":0,'
                f'"args":{{"value":{int(bytes_reduced)}}}}}'
            )
        if self.mark_cycles:
            lane = self._cycle_lane
            start = max(t_start, lane.last_end)
            end = max(t_end, start)
            lane.last_end = end
            out.append(
                f'{{"name":"{act.cycle_name(cycle)}","ph":"X","ts":{us(start + shift)},"dur":{us(end - start)},'
                f'"pid":{p},"tid":{act.LANE_CYCLES},"args":{{"step":{step},"ops":{n_ops},'
                f'"bytes_reduced":{int(bytes_reduced)}}}}}'
            )
        if n_ops:
            self._render_ops(groups, columns, t_end, shift, out)
        out.events += len(out)
        return out

    def _phases(self, group: GroupRow, op: str, neg_end: int) -> list[tuple[str, int, int]]:
        """The op's children in order, each starting no earlier than the previous ended."""
        spans: list[tuple[str, int, int]] = []
        cursor = neg_end
        backend = group.backend
        pack0, pack1 = group.t_pack_start, group.t_pack_end
        coll0, coll1 = group.t_collective_start, group.t_collective_end
        unpack0, unpack1 = group.t_unpack_start, group.t_unpack_end
        wait0, wait1 = group.t_wait_start, group.t_wait_end  # device path only
        first = wait0 or pack0 or coll0
        if first and first > cursor:
            spans.append((f'"{act.QUEUE}"', cursor, first))
            cursor = first
        for name, c_start, c_end in (
            (f'"{act.WAIT_FOR_DATA}"', wait0, wait1),
            (f'"{act.MEMCPY_IN_FUSION_BUFFER}"', pack0, pack1),
            (self._esc(act.collective_name(str(backend), op)), coll0, coll1),
            (f'"{act.MEMCPY_OUT_FUSION_BUFFER}"', unpack0, unpack1),
        ):
            if c_start:
                c_start = max(c_start, cursor)
                cursor = max(c_end, c_start)
                spans.append((name, c_start, cursor))
        return spans

    def _render_ops(
        self,
        groups: list[GroupRow],
        columns: OpColumns,
        t_end: int,
        shift: int,
        out: Lines,
    ) -> None:
        # The hot path (thousands of ops per step): straight from the columns, with no
        # object per op; everything that repeats across ops -- lane tails, per-tensor
        # args, group children, the cycle-granular timestamps -- is formatted once.
        names, kinds, t_submit = columns.names, columns.kinds, columns.t_submit
        t_negotiated, ready, ranks = columns.t_negotiated, columns.ready, columns.ranks
        cached, group_ids, t_done = columns.cached, columns.group_ids, columns.t_done
        errors = columns.errors
        esc, escaped, lanes, append = self._esc, self._escaped, self._named, out.append
        by_id = {g.group_id: g for g in groups}
        fmt = _Times(shift)  # timeline text of the local times that repeat in a cycle
        neg_names: dict[str, tuple[str, str]] = {}
        group_args: dict[int, str] = {}
        children_of: dict[tuple[int, str, int], Any] = {}
        me = self.rank
        own = (f'{{"name":"{act.READY_PREFIX}{me}","ph":"i","s":"t","ts":', f'"{me}":')
        gil_slice = self._gil_slice
        extra = 0  # events beyond one per text
        last_gid, group = None, None
        i = -1
        for name, kind, start, neg_end, gid, end, is_cached in zip(
            names, kinds, t_submit, t_negotiated, group_ids, t_done, cached, strict=True
        ):
            i += 1
            if gil_slice and i % gil_slice == gil_slice - 1:
                # Hand the GIL over: the cycle and training threads must never wait a
                # whole switch interval (5 ms) behind the timeline.
                time.sleep(0)
            op = kind[0]
            neg_end = neg_end or start
            if gid != last_gid:  # the ops of a group come together
                last_gid, group = gid, by_id.get(gid)
            if not end:
                if group is not None:
                    end = group.t_unpack_end or group.t_collective_end
                end = end or t_end
            lane = lanes.get(name)
            if lane is None or lane.last_end > start:
                lane = self._lane_for(name, start, out)
                if start < lane.last_end:  # only when the shared pool is exhausted
                    start = lane.last_end
            if neg_end < start:
                neg_end = start
            if end < neg_end:
                end = neg_end
            lane.last_end = end
            tail = lane.tail
            cached_text = "true" if is_cached else "false"
            name_text = escaped.get(name) or esc(name)
            # per-tensor args: recomputed only when the name (a shared lane), dtype, shape,
            # bytes or cached change
            key = (name, kind, is_cached)
            if lane.args_key != key or lane.args_text == "":
                self._lane_args(lane, key, name_text, cached_text)

            x = start + shift  # unique per op (its submission): not worth caching
            if x >= 1000:
                start_text = str(x)
                start_text = start_text[:-3] + "." + start_text[-3:]
            else:
                start_text = us(x)
            neg_text = fmt[neg_end]
            # NEGOTIATE_<OP>: submission until every rank is ready, with its READY marks
            ready_args, marks = self._ready_text(
                ready, i * ranks, ranks, own, (start, start_text, neg_end, neg_text), fmt, tail
            )
            if marks:
                extra += 1
            neg_name = neg_names.get(op)
            if neg_name is None:
                neg_name = neg_names[op] = (esc(act.negotiate_name(op)), esc(op))
            d = neg_end - start
            if d >= 1000:
                neg_dur = str(d)
                neg_dur = neg_dur[:-3] + "." + neg_dur[-3:]
            else:
                neg_dur = us(d)

            set_arg = f',"process_set":{int(kind[4])}' if len(kind) > 4 else ""
            # <OP>: negotiated until done, with the phases as children.
            args = lane.args_text
            if group is not None:
                more = group_args.get(gid)
                if more is None:
                    more = group_args[gid] = self._group_args(gid, group)
                args += more
            if errors and i in errors:
                args += f',"error":{json.dumps(str(errors[i]))}'
            d = end - neg_end
            if d >= 1000:
                dur = str(d)
                dur = dur[:-3] + "." + dur[-3:]
            else:
                dur = us(d)
            text = (
                f'{marks}{{"name":{neg_name[0]},"ph":"X","ts":{start_text},"dur":{neg_dur},'
                f'"args":{{"tensor":{name_text},"cached":{cached_text}{set_arg}{ready_args}}},'
                f"{tail},\n"
                f'{{"name":{neg_name[1]},"ph":"X","ts":{neg_text},"dur":{dur},'
                f'"args":{{{args}}},{tail}'
            )
            extra += 1
            if group is None:
                append(text)
                continue

            # Ops of one group share their children: rendered once per (group, negotiation).
            key2 = (gid, op, neg_end)
            children = children_of.get(key2)
            if children is None:
                children = children_of[key2] = self._children(group, op, neg_end, shift)
            extra += _with_children(text, children, end, shift, tail, append)
        out.events += extra

    def _lane_args(self, lane: _Lane, key: Any, name_text: str, cached_text: str) -> None:
        """A lane's per-tensor args (name, dtype, shape, bytes, cached, process set)."""
        esc = self._esc
        kind = key[1]
        lane.args_key = key
        dtype, shape, nbytes = kind[1:4]
        lane.args_text = (
            f'"tensor":{name_text},"dtype":{esc(str(dtype))},'
            f'"shape":[{",".join(str(int(d)) for d in shape)}],'
            f'"bytes":{int(nbytes)},"cached":{cached_text}'
        )
        if len(kind) > 4:  # an op of a process set: which one
            lane.args_text += f',"process_set":{int(kind[4])}'

    def _group_args(self, gid: int, group: GroupRow) -> str:
        """The args an op of a fusion group adds: the group, its size, buffer, backend."""
        return (
            f',"group":{int(gid)},"group_tensors":{int(group.num_tensors)},'
            f'"group_bytes":{int(group.nbytes)},'
            f'"group_buffer_bytes":{int(group.buffer_bytes)},'
            f'"backend":{self._esc(str(group.backend))}'
        )

    def _children(
        self, group: GroupRow, op: str, neg_end: int, shift: int
    ) -> tuple[list[str], int, list[tuple[str, int, int]]]:
        """``(each child's text up to its tail, the children's end, their spans)`` of the
        ops of one group negotiated at ``neg_end``: the same for all of them."""
        spans = self._phases(group, op, neg_end)
        return (
            [
                f',\n{{"name":{c_name},"ph":"X","ts":{us(c_start + shift)},"dur":{us(c_end - c_start)},'
                for c_name, c_start, c_end in spans
            ],
            spans[-1][2] if spans else neg_end,
            spans,
        )

    def _ready_text(
        self,
        ready: Any,
        base: int,
        ranks: int,
        own: tuple[str, str],
        times: tuple[int, str, int, str],
        fmt: _Times,
        tail: str,
    ) -> tuple[str, str]:
        """``(ready args, READY mark line)`` of one op's NEGOTIATE_<OP>. This rank's own
        readiness (its submission) is its one READY mark; of the others only the last one
        is named, so an op's events do not grow with the ranks. The analysis joins the
        ranks' own marks across their files. ``own``: this rank's mark prefix and args
        key; ``times``: the op's start and negotiated end, and their texts."""
        last_rank, last_t = -1, NO_TIME
        for r in range(ranks):
            t = ready[base + r]
            if t != NO_TIME and (last_t == NO_TIME or t >= last_t):
                last_rank, last_t = r, t
        if last_t == NO_TIME:
            return "", ""
        ready_args = marks = ""
        start, start_text, neg_end, neg_text = times
        me = self.rank
        own_t = ready[base + me] if me < ranks else NO_TIME
        if own_t != NO_TIME:
            t_text = start_text if own_t == start else fmt[own_t]
            ready_args = f',"ready_us":{{{own[1]}{t_text}}}'
            # (a mark before the slice stays where it is: an op held for its rank's wait
            # begins negotiating when the cycle takes it, after its submission)
            if own_t > neg_end:
                t_text = neg_text
            marks = f"{own[0]}{t_text},{tail},\n"
        ready_args += f',"last_ready_rank":{last_rank},"last_ready_us":{fmt[last_t]}'
        return ready_args, marks


def _with_children(
    text: str,
    children: tuple[list[str], int, list[tuple[str, int, int]]],
    end: int,
    shift: int,
    tail: str,
    append: Callable[[str], None],
) -> int:
    """Appends an op's text with its group's children (clamped to the op's end when it
    ended before its group); returns the number of children."""
    prefixes, children_end, spans = children
    if children_end <= end:
        if prefixes:
            text += tail.join(prefixes) + tail
        append(text)
        return len(prefixes)
    for c_name, c_start, c_end in spans:  # the op ended before its group: clamp
        c_start, c_end = min(c_start, end), min(c_end, end)
        text += f',\n{{"name":{c_name},"ph":"X","ts":{us(c_start + shift)},"dur":{us(c_end - c_start)},{tail}'
    append(text)
    return len(spans)


_group_attrs = attrgetter(*GROUP_FIELDS)
_param_attrs = attrgetter(*PARAM_FIELDS)


def head_tuple(record: CycleRecord) -> tuple[Any, ...]:
    """The cycle's :class:`CycleHead` as a plain tuple (the wire's form: a named tuple
    pickles its class by name, which tripled the cost of encoding a small cycle)."""
    return (
        record.cycle,
        record.step,
        record.t_start,
        record.t_negotiated,
        record.t_end,
        _param_attrs(record.params),
        record.bytes_reduced,
        record.params_changed,
    )


def as_head(plain: tuple[Any, ...]) -> CycleHead:
    """A :func:`head_tuple` read by name."""
    return CycleHead(*plain[:5], ParamsRow._make(plain[5]), plain[6], plain[7])


def group_tuples(record: CycleRecord) -> list[tuple[Any, ...]]:
    """The cycle's backend calls as plain :class:`GroupRow` tuples (the wire's form)."""
    return list(map(_group_attrs, record.groups))


def as_groups(plain: list[tuple[Any, ...]]) -> list[GroupRow]:
    """:func:`group_tuples` read by name."""
    make = GroupRow._make
    return [make(g) for g in plain]


def cycle_columns(record: CycleRecord) -> tuple[CycleHead, list[GroupRow], OpColumns]:
    """A cycle record in the renderer's plain form: ``(head, groups, columns)``.

    ``record.ops`` may be an ``OpBatch`` or a list of ``OpRecord``.
    """
    head, groups = as_head(head_tuple(record)), as_groups(group_tuples(record))
    ops = record.ops
    if hasattr(ops, "ready"):  # an OpBatch: its columns, flattened
        ops = ops.resolved()
        columns = OpColumns(
            ops.names,
            ops.kinds,
            ops.t_submit,
            ops.t_negotiated,
            (ready := ops.ready_rows()).ravel().tolist(),
            int(ready.shape[1]),
            list(ops.cached),
            ops.group_ids,
            ops.t_done,
            ops.errors,
        )
        return head, groups, columns
    records = list(ops)
    ranks = 1 + max((r for rec in records for r in rec.ready_times), default=-1)
    ready = [NO_TIME] * (len(records) * ranks)
    for i, rec in enumerate(records):
        for r, t in rec.ready_times.items():
            ready[i * ranks + r] = t
    columns = OpColumns(
        [r.name for r in records],
        [
            (r.op, r.dtype, tuple(r.shape), r.nbytes) + ((r.process_set,) if r.process_set else ())
            for r in records
        ],
        [r.t_submit for r in records],
        [r.t_negotiated for r in records],
        ready,
        ranks,
        [bool(r.cached) for r in records],
        [r.group_id for r in records],
        [r.t_done for r in records],
        {i: r.error for i, r in enumerate(records) if r.error is not None},
    )
    return head, groups, columns


#: Upper bound of the events one op becomes (for the writer's queue accounting): the same
#: at any world size, since an op carries only its own rank's READY mark.
EVENTS_PER_OP = 7
