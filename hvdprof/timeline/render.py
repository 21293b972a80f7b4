"""Turning cycle records into Chrome trace events (in the renderer process, see below).

Layout of one rank (one Chrome process, ``pid = rank``):

* fixed lanes ``runtime`` (instants), ``cycles`` (``CYCLE <n>`` slices) and ``autotune``;
* one lane per tensor name (``thread_name`` = the name). An op draws
  ``NEGOTIATE_<OP>`` from submission to negotiation, with a ``READY rank <r>`` instant per
  rank, then ``<OP>`` until done, containing ``QUEUE``, ``MEMCPY_IN_FUSION_BUFFER``,
  ``<BACKEND>_<OP>`` and ``MEMCPY_OUT_FUSION_BUFFER``;
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
from collections.abc import Iterable, Mapping
from typing import Any

from hvdprof.runtime.records import CycleRecord, GroupRecord, OpRecord
from hvdprof.timeline import activities as act
from hvdprof.timeline.writer import dumps_event

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


def us(ns: int) -> str:
    """Nanoseconds as microseconds with exactly three decimals, without float rounding.

    Exact decimal output means ``ts + dur`` of a child never exceeds its parent's end by a
    rounding step, which would break nesting in the viewer.
    """
    if ns >= 0:
        q, r = divmod(ns, 1000)
        return f"{q}.{r:03d}"
    q, r = divmod(-ns, 1000)
    return f"-{q}.{r:03d}"


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

    def render_cycle(self, record: CycleRecord, shift: int) -> list[str]:
        """All events of one cycle; ``shift`` maps local ns to timeline ns."""
        out: list[str] = []
        p = self._pid
        params = record.params
        if self._params is None or record.params_changed or params != self._params:
            ts = us(record.t_start + shift)
            out.append(
                f'{{"name":{self._esc(act.COUNTER_FUSION_THRESHOLD)},"ph":"C","ts":{ts},"pid":{p},"tid":0,'
                f'"args":{{"value":{params.fusion_threshold_bytes / 1048576:.6g}}}}}'
            )
            out.append(
                f'{{"name":{self._esc(act.COUNTER_CYCLE_TIME)},"ph":"C","ts":{ts},"pid":{p},"tid":0,'
                f'"args":{{"value":{float(params.cycle_time_ms):.6g}}}}}'
            )
            if self._params is not None or record.params_changed:
                out.append(
                    f'{{"name":"{act.AUTOTUNE_PARAMS}","ph":"i","s":"p","ts":{ts},"pid":{p},"tid":{act.LANE_RUNTIME},'
                    f'"args":{{"cycle":{record.cycle},"fusion_threshold_bytes":{int(params.fusion_threshold_bytes)},'
                    f'"cycle_time_ms":{float(params.cycle_time_ms)!r},"cache_enabled":{"true" if params.cache_enabled else "false"}}}}}'
                )
            self._params = params
        if record.ops:
            out.append(
                f'{{"name":{self._esc(act.COUNTER_CYCLE_DURATION)},"ph":"C","ts":{us(record.t_start + shift)},"pid":{p},"tid":0,'
                f'"args":{{"value":{(record.t_end - record.t_start) / 1e6:.6g}}}}}'
            )
        if record.bytes_reduced != self._bytes_reduced:
            self._bytes_reduced = record.bytes_reduced
            out.append(
                f'{{"name":{self._esc(act.COUNTER_BYTES_REDUCED)},"ph":"C","ts":{us(record.t_start + shift)},"pid":{p},"tid":0,'
                f'"args":{{"value":{int(record.bytes_reduced)}}}}}'
            )
        if self.mark_cycles:
            lane = self._cycle_lane
            start = max(record.t_start, lane.last_end)
            end = max(record.t_end, start)
            lane.last_end = end
            out.append(
                f'{{"name":"{act.cycle_name(record.cycle)}","ph":"X","ts":{us(start + shift)},"dur":{us(end - start)},'
                f'"pid":{p},"tid":{act.LANE_CYCLES},"args":{{"step":{record.step},"ops":{len(record.ops)},'
                f'"bytes_reduced":{int(record.bytes_reduced)}}}}}'
            )
        if record.ops:
            groups = {g.group_id: g for g in record.groups}
            cache: dict[Any, Any] = {}
            render_op = self._render_op
            gil_slice = self._gil_slice
            for i, op in enumerate(record.ops):
                if gil_slice and i % gil_slice == gil_slice - 1:
                    # Hand the GIL over: the cycle and training threads must never wait a
                    # whole switch interval (5 ms) behind the timeline.
                    time.sleep(0)
                render_op(op, groups.get(op.group_id), record, shift, out, cache)
        return out

    def _phases(self, group: GroupRecord, op: str, neg_end: int) -> list[tuple[str, int, int]]:
        """The op's children in order, each starting no earlier than the previous ended."""
        spans: list[tuple[str, int, int]] = []
        cursor = neg_end
        first = group.t_pack_start or group.t_collective_start
        if first and first > cursor:
            spans.append((f'"{act.QUEUE}"', cursor, first))
            cursor = first
        for name, c_start, c_end in (
            (f'"{act.MEMCPY_IN_FUSION_BUFFER}"', group.t_pack_start, group.t_pack_end),
            (
                self._esc(act.collective_name(str(group.backend), op)),
                group.t_collective_start,
                group.t_collective_end,
            ),
            (f'"{act.MEMCPY_OUT_FUSION_BUFFER}"', group.t_unpack_start, group.t_unpack_end),
        ):
            if c_start:
                c_start = max(c_start, cursor)
                cursor = max(c_end, c_start)
                spans.append((name, c_start, cursor))
        return spans

    def _render_op(
        self,
        op: OpRecord,
        group: GroupRecord | None,
        record: CycleRecord,
        shift: int,
        out: list[str],
        cache: dict[Any, Any],
    ) -> None:
        # Hot path (thousands of ops per step, under the GIL next to training): everything
        # that repeats across ops -- lane tails, per-tensor args, group children, the
        # cycle-granular timestamps -- is formatted once and reused.
        esc = self._esc
        start = op.t_submit
        neg_end = op.t_negotiated if op.t_negotiated else start
        end = op.t_done
        if not end:
            if group is not None:
                end = group.t_unpack_end or group.t_collective_end
            end = end or record.t_end
        lane = self._lane_for(op.name, start, out)
        if start < lane.last_end:  # only when the shared pool is exhausted
            start = lane.last_end
        if neg_end < start:
            neg_end = start
        if end < neg_end:
            end = neg_end
        lane.last_end = end
        tail = lane.tail
        fmt = cache.get("fmt")
        if fmt is None:
            fmt = cache["fmt"] = {}

        def ts(ns: int) -> str:
            text = fmt.get(ns)
            if text is None:
                text = fmt[ns] = us(ns + shift)
            return text

        # per-tensor args: recomputed only when dtype/shape/bytes/cached change
        key = (op.op, op.dtype, op.shape, op.nbytes, op.cached)
        if lane.args_key != key or lane.args_text == "":
            lane.args_key = key
            name = esc(op.name)
            cached_text = "true" if op.cached else "false"
            lane.args_text = (
                f'"tensor":{name},"dtype":{esc(str(op.dtype))},'
                f'"shape":[{",".join(str(int(d)) for d in op.shape)}],'
                f'"bytes":{int(op.nbytes)},"cached":{cached_text}'
            )
        const = lane.args_text
        cached = "true" if op.cached else "false"
        name = esc(op.name)

        # NEGOTIATE_<OP>: submission until every rank is ready, with readiness marks.
        ready = op.ready_times
        ready_args = ""
        if ready:
            stamps = []
            last_rank, last_t = -1, None
            for r in sorted(ready):
                t = ready[r]
                stamps.append(f'"{r}":{ts(t)}')
                if last_t is None or t >= last_t:
                    last_rank, last_t = r, t
                clamped = start if t < start else (neg_end if t > neg_end else t)
                out.append(
                    f'{{"name":"{act.READY_PREFIX}{r}","ph":"i","s":"t","ts":{ts(clamped)},{tail}'
                )
            ready_args = f',"ready_us":{{{",".join(stamps)}}},"last_ready_rank":{last_rank}'
        neg_name = cache.get(op.op)
        if neg_name is None:
            neg_name = cache[op.op] = (esc(act.negotiate_name(op.op)), esc(op.op))
        out.append(
            f'{{"name":{neg_name[0]},"ph":"X","ts":{ts(start)},"dur":{us(neg_end - start)},'
            f'"args":{{"tensor":{name},"cached":{cached}{ready_args}}},{tail}'
        )

        # <OP>: negotiated until done, with the phases as children.
        args = const
        if group is not None:
            group_args = cache.get(group.group_id)
            if group_args is None:
                group_args = cache[group.group_id] = (
                    f',"group":{int(group.group_id)},"group_tensors":{int(group.num_tensors)},'
                    f'"group_bytes":{int(group.nbytes)},"group_buffer_bytes":{int(group.buffer_bytes)},'
                    f'"backend":{esc(str(group.backend))}'
                )
            args += group_args
        if op.error is not None:
            args += f',"error":{json.dumps(str(op.error))}'
        out.append(
            f'{{"name":{neg_name[1]},"ph":"X","ts":{ts(neg_end)},"dur":{us(end - neg_end)},'
            f'"args":{{{args}}},{tail}'
        )
        if group is None:
            return

        # Ops of one group share their children: render them once per (group, negotiation).
        key2 = (group.group_id, op.op, neg_end)
        children = cache.get(key2)
        if children is None:
            spans = self._phases(group, op.op, neg_end)
            children = cache[key2] = (
                [
                    f'{{"name":{c_name},"ph":"X","ts":{us(c_start + shift)},"dur":{us(c_end - c_start)},'
                    for c_name, c_start, c_end in spans
                ],
                spans[-1][2] if spans else neg_end,
                spans,
            )
        prefixes, children_end, spans = children
        if children_end <= end:
            for prefix in prefixes:
                out.append(prefix + tail)
            return
        for c_name, c_start, c_end in spans:  # the op ended before its group: clamp
            c_start, c_end = min(c_start, end), min(c_end, end)
            out.append(
                f'{{"name":{c_name},"ph":"X","ts":{us(c_start + shift)},"dur":{us(c_end - c_start)},{tail}'
            )


def events_per_op(size: int) -> int:
    """Upper bound of the events one op becomes (for the writer's queue accounting)."""
    return 6 + size


def lines_item(lines: Iterable[str]) -> tuple[int, list[str]]:
    """A queue item of pre-rendered lines."""
    return (ITEM_LINES, list(lines))
