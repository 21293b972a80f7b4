// hvdprof dashboard page: a client of the JSON API (/docs) and nothing more.
// Every number drawn here comes from an /api/* response (or, in a report written by
// `hvdprof report`, from the same responses embedded in the file); nothing is computed
// beyond unit conversion for display.
"use strict";

(function () {
  const EMBEDDED = window.hvdprofEmbedded || null; // set in a self-contained report
  const params = new URLSearchParams(window.location.search);
  const TOKEN = params.get("token");
  const PHASE_COLORS = {
    negotiate: "#f4a261", op: "#cbd5e1", queue: "#a3b1c6", memcpy_in: "#2a9d8f",
    collective: "#3a6ea5", memcpy_out: "#8ecae6", other: "#b8b8b8", cycle: "#e9c46a",
    autotune: "#9d4edd", aggregated: "#64748b",
  };
  const STALL_COLOR = "#dc2626";
  // GPU events in stream lanes (hvdprof.analysis.gpu_lanes): HTA's kinds.
  const GPU_COLORS = { gpu_computation: "#22a06b", gpu_communication: "#b45309", gpu_memory: "#0ea5e9", gpu_other: "#a8a29e" };
  const GPU_LABELS = { gpu_computation: "compute kernel", gpu_communication: "communication kernel (NCCL)", gpu_memory: "memcpy / memset", gpu_other: "other GPU work" };
  const phaseColor = (p) => PHASE_COLORS[p] || GPU_COLORS[p] || "#888";
  const phaseLabel = (p) => GPU_LABELS[p] || p;
  // The breakdown's categories (hvdprof.analysis.phases); idle is compute, drawn quiet.
  const CATEGORY_COLORS = { idle: "#e5e7eb" };
  const state = {
    runs: [], run: null, info: null, expand: "", laneKind: "tensor", view: null, version: 0,
    timelineRequest: 0, lanes: [], live: false, updates: 0, offline: false,
    processSets: [], set: "", gpuRanks: [],
    // rank filters (null: every rank): the timeline's rows and the wait heatmap's rows
    timelineRanks: null, timelineAuto: false, heatmapRanks: null,
  };
  window.HVD_STATE = state; // for the browser tests and the curious

  // ------------------------------------------------------------------ data access
  function apiUrl(path, query) {
    const q = new URLSearchParams();
    for (const [k, v] of Object.entries(query || {})) {
      if (v !== null && v !== undefined && v !== "") q.set(k, v);
    }
    if (TOKEN) q.set("token", TOKEN);
    const s = q.toString();
    return path + (s ? "?" + s : "");
  }

  function embeddedKey(path, query) {
    const q = Object.entries(query || {})
      .filter(([k, v]) => v !== null && v !== undefined && v !== "" && !["t0_us", "t1_us", "max_items"].includes(k))
      .sort(([a], [b]) => (a < b ? -1 : 1))
      .map(([k, v]) => k + "=" + v).join("&");
    return path + (q ? "?" + q : "");
  }

  async function api(path, query) {
    if (EMBEDDED) {
      const hit = EMBEDDED[embeddedKey(path, query)];
      if (hit === undefined) throw new Error("not included in this report: " + embeddedKey(path, query));
      return hit;
    }
    let response;
    try {
      response = await fetch(apiUrl(path, query));
    } catch (err) { // no answer at all: the server stopped (or the network went)
      const gone = new Error("the dashboard server is not answering");
      gone.offline = true;
      throw gone;
    }
    if (state.offline) { state.offline = false; setNotices("server", []); }
    let body = null;
    try { body = await response.json(); } catch (e) { body = null; }
    if (!response.ok) {
      throw new Error((body && body.detail ? (typeof body.detail === "string" ? body.detail : JSON.stringify(body.detail)) : response.statusText) + " (HTTP " + response.status + ")");
    }
    return body;
  }

  // ------------------------------------------------------------------ helpers
  const $ = (id) => document.getElementById(id);
  function text(el, s) { el.textContent = s == null ? "" : String(s); }
  function fmtBytes(b) {
    if (b == null || b < 0) return "?";
    const u = ["B", "KiB", "MiB", "GiB"]; let i = 0; let v = Number(b);
    while (v >= 1024 && i < u.length - 1) { v /= 1024; i++; }
    return (i ? v.toFixed(1) : v.toFixed(0)) + " " + u[i];
  }
  function fmtUs(us) {
    if (us == null) return "?";
    if (Math.abs(us) >= 1e6) return (us / 1e6).toFixed(2) + " s";
    if (Math.abs(us) >= 1e3) return (us / 1e3).toFixed(2) + " ms";
    return Number(us).toFixed(1) + " us";
  }
  // Plotly.react, after removing an empty() notice and giving the box its CSS height back.
  function draw(el, traces, layout, config) {
    // a chart that sets its own height gets a box that tall (nothing spills onto the next line)
    if (el.id !== "timeline") el.style.height = layout.height ? layout.height + "px" : "";
    el.querySelectorAll(":scope > .empty").forEach((n) => n.remove());
    const drawing = Plotly.react(el, traces, clearOfToolbar(layout), config);
    el._drawn = (el._drawn || 0) + 1;
    el._drawing = drawing;
    const mine = el._drawn;
    drawing.then(() => { if (el._drawn === mine) el._drawing = null; }, () => {});
  }
  // Plotly's tool bar (the modebar) appears over a chart's top right on hover, in a band
  // TOOLBAR_PX high: a chart's title goes below that band, left-aligned above the plot
  // (centred in the band, a long title ran under the tool bar).
  const TOOLBAR_PX = 30;
  function clearOfToolbar(layout) {
    const title = layout.title;
    if (!title || !title.text) return layout;
    const lines = 1 + (String(title.text).match(/<br>/g) || []).length;
    const size = (title.font && title.font.size) || 12;
    const margin = layout.margin || {};
    return Object.assign({}, layout, {
      title: Object.assign({}, title, { x: 0, xref: "paper", xanchor: "left", y: 1, yref: "paper", yanchor: "bottom", pad: { b: 6 } }),
      margin: Object.assign({}, margin, { t: Math.max(margin.t || 0, TOOLBAR_PX + Math.ceil(lines * size * 1.4) + 8) }),
    });
  }
  // An axis with a visible title (plotly.js 3+ ignores a plain-string title).
  // automargin and a standoff: the title is placed beyond the tick labels, never on them.
  function axis(title, extra) { return Object.assign({ title: { text: title, standoff: 10 }, automargin: true }, extra || {}); }
  // A log axis labelled at a handful of round values instead of every 2 and 5.
  // values: the data on that axis; ticks go at 1-2-5 steps (or decades when those crowd).
  function logAxis(title, values, extra) {
    const ticks = logTicks(values || []);
    const base = ticks ? { tickvals: ticks, tickformat: ".3~g" } : { nticks: 6, tickformat: ".3~g" };
    return axis(title, Object.assign({ type: "log" }, base, extra || {}));
  }
  function logTicks(values) {
    const v = values.filter((x) => x > 0 && Number.isFinite(x));
    if (!v.length) return null;
    const lo = Math.min(...v), hi = Math.max(...v);
    const decades = [];
    for (let k = Math.floor(Math.log10(lo)); k <= Math.ceil(Math.log10(hi)); k++) decades.push(Math.pow(10, k));
    const within = (x) => x >= lo / 1.5 && x <= hi * 1.5;
    const steps = decades.flatMap((d) => [d, 2 * d, 5 * d]).filter(within);
    const tens = decades.filter(within);
    if (steps.length <= 8 && steps.length >= 2) return steps;
    return tens.length >= 2 ? tens : null;
  }
  // A chart still drawing (Plotly redraws once more for its automatic margins) is purged
  // when that is done: purged halfway, its next step would find no layout and throw. A
  // draw after this call wins.
  function empty(el, message) {
    el._drawn = (el._drawn || 0) + 1;
    const mine = el._drawn;
    const clear = () => {
      if (el._drawn !== mine) return;
      el._drawing = null;
      Plotly.purge(el);
      el.innerHTML = "";
      el.style.height = "auto";
      const p = document.createElement("p");
      p.className = "empty";
      p.textContent = message;
      el.appendChild(p);
    };
    if (el._drawing) el._drawing.then(clear, clear); else clear();
  }
  // Rows of a to_dict() table: a list of objects, or {column: [values]} turned into one.
  function rows(x) {
    if (!x) return [];
    if (Array.isArray(x)) return x;
    if (typeof x === "object") {
      const keys = Object.keys(x);
      const n = keys.length ? (Array.isArray(x[keys[0]]) ? x[keys[0]].length : 0) : 0;
      const out = [];
      for (let i = 0; i < n; i++) {
        const r = {};
        for (const k of keys) r[k] = Array.isArray(x[k]) ? x[k][i] : x[k];
        out.push(r);
      }
      return out;
    }
    return [];
  }
  function pick(obj, names, fallback) {
    for (const n of names) if (obj && obj[n] !== undefined && obj[n] !== null) return obj[n];
    return fallback;
  }
  // ------------------------------------------------------------------ many ranks
  // Above MANY_RANKS a chart per rank turns into slivers and a legend that covers it: the
  // charts then show the spread across ranks (median, p90, worst) with the outliers named,
  // and the per-rank views (timeline rows, wait heatmap) take a rank filter.
  const MANY_RANKS = 16;
  const LEGEND_MAX = 10; // no legend on the page lists more entries than this
  // "0-7, 12" from [0, 1, ..., 7, 12]: consecutive ranks as ranges.
  function rankList(ranks) {
    const r = [...new Set(ranks.map(Number))].sort((a, b) => a - b);
    const parts = [];
    for (let i = 0; i < r.length; i++) {
      let j = i;
      while (j + 1 < r.length && r[j + 1] === r[j] + 1) j++;
      parts.push(j > i + 1 ? r[i] + "-" + r[j] : j === i + 1 ? r[i] + ", " + r[j] : String(r[i]));
      i = j;
    }
    return parts.join(", ");
  }
  const ranksWord = (ranks) => (ranks.length === 1 ? "rank " : "ranks ") + rankList(ranks);
  // "0-7,12" (what a user types) to [0, ..., 7, 12]; null when it does not read as ranks.
  function parseRanks(s) {
    const out = new Set();
    for (const part of String(s || "").split(/[\s,;]+/).filter(Boolean)) {
      const m = /^(\d+)(?:-(\d+))?$/.exec(part);
      if (!m) return null;
      const a = Number(m[1]), b = m[2] === undefined ? a : Number(m[2]);
      if (b < a || b - a > 100000) return null;
      for (let k = a; k <= b; k++) out.add(k);
    }
    return out.size ? [...out].sort((x, y) => x - y) : null;
  }
  function quantile(sorted, q) {
    if (!sorted.length) return null;
    return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil(q * sorted.length) - 1))];
  }
  // The spread of one number across ranks: median, p90, the worst (highest, or lowest when
  // low is bad) and the ranks at the worst. pairs: [[rank, value], ...].
  function spread(pairs, lowIsBad) {
    pairs = pairs.filter((p) => p[1] !== null && p[1] !== undefined);
    if (!pairs.length) return { median: null, p90: null, worst: null, worstRanks: [] };
    const v = pairs.map((p) => p[1]).sort((a, b) => a - b);
    const worst = lowIsBad ? v[0] : v[v.length - 1];
    return {
      median: quantile(v, 0.5), p90: lowIsBad ? quantile(v, 0.1) : quantile(v, 0.9), worst: worst,
      worstRanks: pairs.filter((p) => p[1] === worst).map((p) => p[0]),
    };
  }
  // Ranks whose value stands apart from the rest (robust: distance from the median beyond
  // three scaled median absolute deviations and beyond 10% of the median), furthest first.
  function standingOut(pairs, limit) {
    if (pairs.length < 3) return [];
    const v = pairs.map((p) => p[1]).sort((a, b) => a - b);
    const med = quantile(v, 0.5);
    const mad = quantile(v.map((x) => Math.abs(x - med)).sort((a, b) => a - b), 0.5);
    const bar = Math.max(3 * 1.4826 * mad, 0.1 * Math.abs(med), 1e-9);
    return pairs.filter((p) => Math.abs(p[1] - med) > bar)
      .sort((a, b) => Math.abs(b[1] - med) - Math.abs(a[1] - med))
      .slice(0, limit || 8).map((p) => p[0]);
  }
  // Ranks whose series are the same, as one group each: [{ranks, item}], in rank order.
  function sameSeries(items, keyOf) {
    const groups = new Map();
    for (const it of items) {
      const key = keyOf(it);
      if (!groups.has(key)) groups.set(key, { ranks: [], item: it });
      groups.get(key).ranks.push(it.rank);
    }
    return [...groups.values()];
  }
  const manyRanks = (n) => n > MANY_RANKS;
  // Ranks the page calls outliers: those the straggler analysis names, then those that
  // stand out in the breakdown (wait, collective time, wall time) or the GPU report.
  function outlierRanks() {
    const out = culpritRanks(jobStragglers);
    const add = (r) => { if (r !== null && r !== undefined && !out.includes(Number(r))) out.push(Number(r)); };
    const b = (breakdownData && breakdownData.ranks) || [];
    for (const cat of ["negotiate", "collective"]) {
      standingOut(b.map((r) => [r.rank, (r.total_ms || {})[cat] || 0]), 4).forEach(add);
    }
    standingOut(b.map((r) => [r.rank, r.wall_ms || 0]), 4).forEach(add);
    if (gpuData) add(gpuData.stands_out);
    return out;
  }

  const baseLayout = () => ({
    // legend below the x axis title (yanchor top, far enough down not to overlap it)
    margin: { l: 60, r: 16, t: 24, b: 90 }, font: { size: 12 },
    paper_bgcolor: "rgba(0,0,0,0)", plot_bgcolor: "#fff", legend: { orientation: "h", y: -0.3, yanchor: "top" },
  });
  // the tool bar keeps the buttons a reader uses (save, zoom, pan, reset): a narrow bar
  // covers less of a chart's top right (the mouse wheel zooms the timeline)
  const plotConfig = {
    displaylogo: false, responsive: true,
    modeBarButtonsToRemove: ["select2d", "lasso2d", "zoomIn2d", "zoomOut2d", "autoScale2d"],
  };

  const noticeSet = new Map();
  function setNotices(source, list) {
    noticeSet.set(source, (list || []).filter(Boolean));
    const box = $("notices");
    box.innerHTML = "";
    const seen = new Set();
    for (const items of noticeSet.values()) {
      for (const n of items) {
        if (seen.has(n)) continue;
        seen.add(n);
        const div = document.createElement("div");
        div.className = "notice";
        div.textContent = n;
        box.appendChild(div);
      }
    }
  }

  // The server went away (a finished `hvdprof run --dashboard`, a stopped `hvdprof
  // dashboard`): keep every chart as it was and say so once, instead of blanking them.
  // True when err was that, so the caller keeps what it shows.
  function keptOffline(err) {
    if (!err || !err.offline) return false;
    if (!state.offline) {
      state.offline = true;
      setNotices("server", ["the dashboard server is not answering (stopped?): the page keeps the last data it received"]);
    }
    return true;
  }

  // ------------------------------------------------------------------ timeline
  function runT0() { return state.info && state.info.t0_us != null ? state.info.t0_us : 0; }

  async function loadTimeline() {
    if (!state.run) return;
    const ticket = ++state.timelineRequest;
    const el = $("timeline");
    const width = Math.max(400, el.clientWidth || 1000);
    // single slices up to about one per pixel column: more would be slivers, each drawn a
    // pixel or two wide (Plotly keeps a thin bar visible), so their colours would overstate
    // short phases; bins are drawn to the pixel (binnedBars)
    const query = {
      run: state.run, expand_rank: state.expand, lanes: state.expand !== "" ? state.laneKind : "",
      max_items: Math.min(20000, width),
    };
    if (state.view) { query.t0_us = state.view[0]; query.t1_us = state.view[1]; }
    const wanted = timelineRows();
    if (wanted && !wanted.length) {
      empty(el, "none of the ranks chosen (" + rankList(state.timelineRanks) + ") is in process set " + chosenSet().process_set);
      return;
    }
    if (wanted && !EMBEDDED) query.ranks = wanted.join(",");
    let body;
    try {
      body = await api("api/timeline", query);
    } catch (err) {
      if (keptOffline(err)) return;
      if (ticket === state.timelineRequest) empty(el, "timeline unavailable: " + err.message);
      return;
    }
    if (ticket !== state.timelineRequest) return; // a newer query already went out
    setNotices("timeline", body.notices);
    drawTimeline(body.data);
  }

  // The ranks whose rows the timeline asks for: the process set's, narrowed by the rank
  // filter; null for every rank.
  function timelineRows() {
    const chosen = chosenSet();
    const only = state.timelineRanks;
    if (!chosen) return only;
    return only ? chosen.members.filter((r) => only.includes(r)) : chosen.members;
  }
  function sayTimelineRows() {
    const all = (state.info && state.info.ranks) || [];
    const only = state.timelineRanks;
    text($("timeline-ranks-said"), !only ? "all " + all.length + " ranks"
      : only.length + " of " + all.length + " ranks" + (state.timelineAuto ? ": the outliers and one rank for comparison" : "") +
        " \u00b7 type ranks (0-7,12) to see others");
  }

  // Stalls (hvdprof.analysis.stall_report): a red band on the timeline from when the late
  // rank was first waited for to when it came, and a red mark on its lane.
  function drawStalls(data) {
    state.stalls = (data && data.stalls) || [];
    if (state.lastTimeline) drawTimeline(state.lastTimeline);
  }

  function stallMarks(laneRank, categories, t0) {
    const shapes = [], marks = { x: [], y: [], text: [] };
    for (const s of state.stalls || []) {
      const x0 = (s.start_us - t0) / 1000, x1 = (s.end_us - t0) / 1000;
      shapes.push({ type: "rect", xref: "x", yref: "paper", x0: x0, x1: x1, y0: 0, y1: 1,
        fillcolor: STALL_COLOR, opacity: 0.12, line: { width: 1, color: STALL_COLOR }, layer: "below" });
      for (const rank of s.missing) {
        let lane = categories[0];
        for (const [row, r] of laneRank) if (r === rank) { lane = row; break; }
        marks.x.push(x0);
        marks.y.push(lane);
        marks.text.push("<b>stall</b>: " + s.sentence + "<br>" + (s.line || ""));
      }
    }
    return { shapes: shapes, marks: marks };
  }

  // ------------------------------------------------------------------ binned timeline
  // Plotly draws a bar narrower than 2 px as at least one whole pixel (it widens it to the
  // pixels it touches, so that it stays visible). A bin's phases drawn side by side as
  // bars of their own were mostly such slivers: a 0.01 ms copy took a pixel or two of a
  // 0.4 ms bin, the later trace painted over the earlier one, and a phase with 1% of the
  // time took half of a row's pixels, more the narrower the window. So a binned row is
  // drawn in whole screen pixels instead: each pixel column gets the time each phase
  // spent in it (its bins' phases laid out side by side, the rest of a bin blank), then
  // one colour by error diffusion (the phase owed the most pixels so far), so that the
  // pixels of each colour in a row are its time within a pixel or so per phase, at every
  // width and zoom. Runs of one colour are then drawn as one bar, on pixel edges.

  // The time axis as drawn: the window (µs), and its whole screen pixels (the plot area's
  // left edge on the page, its width). Before the first draw the plot area is estimated;
  // drawTimeline redraws once when Plotly placed it elsewhere.
  function timelinePixels(el, data) {
    const range = state.view ? state.view.slice() : [data.t0_us, data.t1_us];
    const xa = el._fullLayout && el._fullLayout.xaxis;
    const box = el.getBoundingClientRect();
    const offset = xa && xa._length > 0 ? xa._offset : 150;
    const length = xa && xa._length > 0 ? xa._length : Math.max((el.clientWidth || 1000) - 150 - 16, 100);
    return { range, left: box.left + offset, length };
  }
  function samePixels(a, b) {
    return !!a && !!b && a.length === b.length && Math.abs(a.left - b.left) < 0.01 &&
      a.range[0] === b.range[0] && a.range[1] === b.range[1];
  }

  // Per row: its bins' phases laid out in whole pixel columns and a colour per column.
  // Returns the column edges' times and, per row, each column's time per class and class.
  function ditherRows(items, phaseUs, classes, geometry, keptRows) {
    const [r0, r1] = geometry.range;
    const usPerPx = (r1 - r0) / geometry.length;
    const first = Math.ceil(geometry.left - 1e-6); // the first whole pixel on the page
    const n = Math.max(0, Math.floor(geometry.left + geometry.length + 1e-6) - first);
    const edge = (i) => r0 + (first + i - geometry.left) * usPerPx;
    const k = classes.length; // the last class is the blank (no slice)
    const perRow = new Map();
    const add = (times, a, b, c) => {
      if (!(b > a)) return;
      const i0 = Math.max(0, Math.floor((a - edge(0)) / usPerPx));
      const i1 = Math.min(n - 1, Math.floor((b - edge(0)) / usPerPx));
      for (let i = i0; i <= i1; i++) {
        const over = Math.min(b, edge(i + 1)) - Math.max(a, edge(i));
        if (over > 0) times[i * k + c] += over;
      }
    };
    const keys = Object.keys(phaseUs);
    items.forEach((it, j) => {
      if (keptRows && !keptRows.has(it.row)) return;
      if (!perRow.has(it.row)) perRow.set(it.row, new Float64Array(n * k));
      const times = perRow.get(it.row);
      let at = it.start_us;
      for (const p of keys) {
        const us = phaseUs[p][j] || 0;
        if (us > 0) { add(times, at, at + us, classes.indexOf(p)); at += us; }
      }
    });
    const out = new Map();
    for (const [row, times] of perRow) {
      const colour = new Int32Array(n);
      const owed = new Float64Array(k);
      for (let i = 0; i < n; i++) {
        let busy = 0;
        for (let c = 0; c < k - 1; c++) busy += times[i * k + c];
        times[i * k + k - 1] = Math.max(usPerPx - busy, 0);
        const total = Math.max(busy, usPerPx);
        let pick = 0;
        for (let c = 0; c < k; c++) {
          owed[c] += times[i * k + c] / total;
          if (owed[c] > owed[pick]) pick = c;
        }
        owed[pick] -= 1;
        colour[i] = pick;
      }
      out.set(row, { times, colour });
    }
    return { rows: out, n, k, edge, usPerPx };
  }

  // The binned rows as bars: one per run of a colour, its hover the time per phase in it.
  function binnedBars(data, items, keptRows, lanes, geometry, group) {
    const phaseUs = (data.buckets || {}).phase_us || {};
    const classes = [...Object.keys(phaseUs), "idle"];
    const drawn = ditherRows(items, phaseUs, classes, geometry, keptRows);
    const { n, k, edge } = drawn;
    // a 1 px bar just inside its pixel: Plotly rounds a bar under 2 px outwards to whole
    // pixels (and draws a wider one where it says, edges on pixel edges: no blending)
    const nudge = (px) => (px < 2 ? 0.01 * drawn.usPerPx : 0);
    for (const [row, { times, colour }] of drawn.rows) {
      const lane = lanes.laneLabel.has(row) ? lanes.laneLabel.get(row) : String(row);
      const rank = lanes.laneRank.has(row) ? lanes.laneRank.get(row) : null;
      // a GPU stream's blank is the stream idle; a rank's is its compute (no collective)
      const gpuRow = lanes.laneStream.has(row);
      const idleWords = gpuRow ? "idle (nothing on this stream)" : "no slice (compute)";
      for (let i = 0; i < n;) {
        let j = i + 1;
        while (j < n && colour[j] === colour[i]) j++;
        const c = colour[i];
        if (c !== k - 1) {
          const sums = new Float64Array(k);
          for (let x = i; x < j; x++) for (let q = 0; q < k; q++) sums[q] += times[x * k + q];
          const a = edge(i), b = edge(j);
          const lines = ["<b>" + fmtUs(a - lanes.t0) + " + " + fmtUs(b - a) + "</b>: drawn as " + phaseLabel(classes[c])];
          const parts = classes.map((p, q) => [p, sums[q]]).filter(([, us]) => us > 0).sort((x, y) => y[1] - x[1]);
          for (const [p, us] of parts) lines.push((p === "idle" ? idleWords : phaseLabel(p)) + ": " + fmtUs(us));
          lines.push("zoom in to see each " + (gpuRow ? "kernel" : "slice"));
          const g = group(classes[c]);
          g.y.push(lane); const d = nudge(j - i);
          g.base.push((a + d - lanes.t0) / 1000); g.x.push((b - a - 2 * d) / 1000);
          g.custom.push(rank); g.text.push(lines.join("<br>"));
        }
        i = j;
      }
    }
  }

  function drawTimeline(data) {
    state.lastTimeline = data;
    const el = $("timeline");
    if (!data) { empty(el, "no events to show yet"); return; }
    // timeline_window().to_dict(): rows (one per rank, or per tensor or per phase of the
    // expanded rank) and either slices or, when too many for the screen, buckets (columns
    // of lists).
    // a report holds every rank's rows: the rank filter applies here instead of in the query
    const wanted = EMBEDDED ? timelineRows() : null;
    const lanes = (data.rows || []).filter((l) => !wanted || l.rank == null || wanted.includes(l.rank));
    const keptRows = wanted ? new Set(lanes.map((l) => l.row)) : null;
    const items = rows(data.aggregated ? data.buckets : data.slices);
    if (!items.length && !state.view) {
      state.lanes = lanes.map((l) => l.label);
      text($("timeline-status"), "");
      empty(el, "no events recorded yet" + (lanes.length ? " (" + lanes.map((l) => l.label).join(", ") + ")" : "") +
        ": the page updates by itself while a job writes");
      return;
    }
    const t0 = runT0();
    const geometry = data.aggregated ? timelinePixels(el, data) : null;
    const traces = timelineBars(data, items, lanes, keptRows, t0, geometry);
    const categories = lanes.map((l) => l.label);
    // Every lane keeps its row, also one with nothing in this window (Plotly would drop it):
    // an invisible point per lane, and the empty ones named in the status line.
    const filled = new Set(items.map((it) => it.row).filter((r) => !keptRows || keptRows.has(r)));
    const emptyLanes = lanes.filter((l) => !filled.has(l.row)).map((l) => l.label);
    if (categories.length) {
      traces.push({
        type: "scatter", mode: "markers", y: categories, x: categories.map(() => (data.t0_us - t0) / 1000),
        marker: { opacity: 0 }, hoverinfo: "skip", showlegend: false, name: "lanes",
      });
    }
    const labelRank = new Map();
    for (const lane of lanes) if (!labelRank.has(lane.label)) labelRank.set(lane.label, lane.rank);
    const stalls = stallMarks(labelRank, categories, t0);
    if (stalls.marks.x.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "stall", x: stalls.marks.x, y: stalls.marks.y,
        hovertext: stalls.marks.text, hoverinfo: "text",
        marker: { symbol: "x", size: 14, color: STALL_COLOR, line: { width: 2, color: STALL_COLOR } },
      });
    }
    el.dataset.stalls = String((state.stalls || []).length);
    state.lanes = categories;
    state.laneKinds = data.lanes || (data.expand_rank == null ? "rank" : "tensor");
    el.dataset.lanes = String(categories.length);
    el.dataset.items = String(items.length);
    el.dataset.laneKind = state.laneKinds;
    const layout = timelineLayout(data, categories, stalls.shapes);
    el.style.height = layout.height + "px";
    if (geometry) layout.xaxis.range = geometry.range.map((us) => (us - t0) / 1000);
    else if (state.view) layout.xaxis.range = [(state.view[0] - t0) / 1000, (state.view[1] - t0) / 1000];
    else layout.xaxis.autorange = true;
    // the mouse wheel zooms the time axis (the lanes stay fixed)
    draw(el, traces, layout, Object.assign({}, plotConfig, { scrollZoom: true }));
    // binned: drawn for the pixels Plotly gave the plot area (estimated before the first
    // draw, changed by a resize or longer row labels); once more if they moved
    state.timelinePixels = geometry;
    if (geometry && !samePixels(geometry, timelinePixels(el, data)) && !state.redrawingBins) {
      state.redrawingBins = true;
      try { drawTimeline(data); } finally { state.redrawingBins = false; }
      return;
    }
    el.dataset.binned = data.aggregated ? "1" : "0";
    state.timelineShapes = stalls.shapes;
    text($("timeline-status"), timelineStatus(data, items, emptyLanes));
    sayTimelineRows();
    if (!el.dataset.bound) {
      el.dataset.bound = "1";
      el.on("plotly_relayout", onRelayout);
      el.on("plotly_click", onTimelineClick);
      el.on("plotly_hover", onTimelineHover);
      el.on("plotly_unhover", () => showLaunchLink(null));
    }
  }

  // The timeline's bars, one trace per phase (enclosing op slices first, so the phases
  // inside them are drawn on top), and the kernel launches on the CPU lane; each bar's
  // launch link in state.launchLinks.
  function timelineBars(data, items, lanes, keptRows, t0, geometry) {
    const laneLabel = new Map();
    const laneRank = new Map();
    const laneStream = new Map();
    lanes.forEach((lane) => {
      laneLabel.set(lane.row, lane.label); laneRank.set(lane.row, lane.rank);
      if (lane.stream !== null && lane.stream !== undefined) laneStream.set(lane.row, lane.stream);
    });
    const cpuLane = lanes.find((l) => l.role === "cpu");
    const launches = { x: [], y: [], text: [] }; // kernel launches, drawn on the CPU lane
    const byPhase = new Map();
    const group = (phase) => {
      if (!byPhase.has(phase)) byPhase.set(phase, { y: [], base: [], x: [], text: [], custom: [], link: [] });
      return byPhase.get(phase);
    };
    // Binned (zoomed out): each bin is drawn as its phases' shares of it, pixel by pixel,
    // so the pixels drawn in a colour are the time the row spent in that phase (what the
    // breakdown counts); time with no slice stays blank (binnedBars).
    if (data.aggregated) binnedBars(data, items, keptRows, { laneLabel, laneRank, laneStream, t0 }, geometry, group);
    items.forEach((it) => {
      if (data.aggregated) return;
      if (keptRows && !keptRows.has(it.row)) return;
      const phase = it.phase || "other";
      const lane = laneLabel.has(it.row) ? laneLabel.get(it.row) : String(it.row);
      const rank = laneRank.has(it.row) ? laneRank.get(it.row) : null;
      const g = group(phase);
      g.y.push(lane);
      g.base.push((it.start_us - t0) / 1000);
      g.x.push(Math.max(it.dur_us, 0) / 1000);
      g.custom.push(rank);
      if (it.kind) { // a GPU event of a stream lane
        const hover = kernelHover(it, t0);
        g.text.push(hover);
        g.link.push(it.launch_us != null && cpuLane ? [(it.launch_us - t0) / 1000, (it.start_us - t0) / 1000, lane] : null);
        if (it.launch_us != null && cpuLane) {
          launches.x.push((it.launch_us - t0) / 1000); launches.y.push(cpuLane.label);
          launches.text.push("<b>launch</b> of " + (it.short_name || it.name) + "<br>on stream " + it.stream + ", started " + fmtUs(it.launch_delay_us) + " later");
        }
        return;
      }
      g.link.push(null);
      g.text.push(sliceHover(it, phase));
    });
    const traces = [];
    // enclosing op slices first, so the phases inside them are drawn on top
    const order = (p) => (p === "op" ? -1 : Object.keys(PHASE_COLORS).indexOf(p));
    const links = [];
    for (const [phase, g] of [...byPhase].sort((x, y) => order(x[0]) - order(y[0]))) {
      traces.push({
        type: "bar", orientation: "h", name: phaseLabel(phase), y: g.y, base: g.base, x: g.x,
        customdata: g.custom, hovertext: g.text, hoverinfo: "text",
        marker: { color: phaseColor(phase), line: { width: 0 } },
      });
      links.push(g.link);
    }
    state.launchLinks = links; // per bar trace, per bar: [launch ms, start ms, lane] or null
    if (launches.x.length) {
      traces.push({
        type: "scatter", mode: "markers", name: "kernel launch (CPU)", x: launches.x, y: launches.y,
        hovertext: launches.text, hoverinfo: "text",
        marker: { symbol: "line-ns-open", size: 7, color: "rgba(51,65,85,0.45)", line: { width: 1, color: "rgba(51,65,85,0.45)" } },
      });
    }
    return traces;
  }

  // A collective slice's hover: its name and length, tensor, size, fusion group, backend.
  function sliceHover(it, phase) {
    const lines = [];
    lines.push("<b>" + (it.name || phase) + "</b>  " + fmtUs(it.dur_us));
    if (it.tensor) lines.push("tensor: " + it.tensor);
    if (it.bytes != null && it.bytes >= 0) lines.push("bytes: " + fmtBytes(it.bytes));
    if (it.group != null && it.group >= 0) {
      lines.push("fusion group: " + it.group + (it.group_tensors ? " (" + it.group_tensors + " tensors)" : ""));
    }
    if (it.backend) lines.push("backend: " + it.backend);
    if (it.dtype) lines.push("dtype: " + it.dtype);
    return lines.join("<br>");
  }

  // The timeline's layout: one category row per lane (thinner ones when there are many),
  // the legend top left, the stalls as shapes.
  function timelineLayout(data, categories, shapes) {
    const expanded = data.expand_rank != null;
    const laneWords = { phase: ": phase lanes", stream: ": CPU and GPU streams", tensor: ": tensor lanes" };
    const laneTitle = !expanded ? "" : "rank " + data.expand_rank + (laneWords[state.laneKinds] || ": tensor lanes");
    return Object.assign(baseLayout(), {
      barmode: "overlay", bargap: 0.25, showlegend: true,
      margin: { l: 150, r: 16, t: 30, b: 44 },
      xaxis: axis("ms since the run started (aligned clock: rank 0's)", { zeroline: false }),
      yaxis: axis(laneTitle, { type: "category", categoryorder: "array", categoryarray: categories.slice().reverse(), automargin: true, fixedrange: true }),
      // top left: the top right is where Plotly's tool bar appears
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom", title: { text: state.laneKinds === "stream" ? "kind: " : "phase: " } },
      uirevision: state.run + "|" + state.expand + "|" + state.laneKind,
      // many rows: thinner ones, so 64 ranks fit a screen or two
      height: Math.max(260, 90 + (categories.length > MANY_RANKS ? 18 : 34) * Math.max(categories.length, 2)),
      shapes: shapes,
    });
  }

  // The line under the timeline: what is drawn (slices or bins), over what span, and the
  // lanes with nothing in this window.
  function timelineStatus(data, items, emptyLanes) {
    const bin = items.length ? items[0].dur_us : 0;
    const agg = !data.aggregated ? "" : " \u00b7 binned: " + data.total + (state.laneKinds === "stream" ? " slices and GPU events" : " slices") + " cut into time bins of " + fmtUs(bin) +
      ", each drawn as its phases' shares of it (blank: no slice, i.e. compute)" +
      (EMBEDDED ? "; this offline report holds the bins only (zooming magnifies them): `hvdprof dashboard` shows single slices" : ": zoom in for single slices");
    const span = state.view ? state.view : [data.t0_us, data.t1_us];
    const sample = state.selectedSample != null && state.view ? " \u00b7 the window autotune sample " + state.selectedSample + " ran in" : "";
    const none = emptyLanes.length ? " \u00b7 nothing recorded in this window for: " + emptyLanes.join(", ") : "";
    const what = state.laneKinds === "stream" ? " slices and GPU events" : " slices";
    return (data.aggregated ? items.length + " bins" : items.length + what) + " in " + fmtUs(span[1] - span[0]) + agg + sample + none;
  }

  // A GPU event's hover: what it is, where it ran, and when and where the CPU launched it.
  function kernelHover(it, t0) {
    const lines = ["<b>" + (it.short_name || it.name) + "</b>  " + fmtUs(it.dur_us)];
    const full = String(it.name || "");
    if (full && full !== it.short_name) {
      for (let k = 0; k < full.length && k < 900; k += 100) lines.push("<span style='font-size:10px'>" + escapeHtml(full.slice(k, k + 100)) + "</span>");
      if (full.length > 900) lines.push("<span style='font-size:10px'>\u2026</span>");
    }
    lines.push(it.kind + " on stream " + it.stream + ", starts at " + fmtUs(it.start_us - t0));
    if (it.bytes != null && it.bytes >= 0) {
      lines.push("bytes: " + fmtBytes(it.bytes) + (it.dur_us > 0 ? " (" + (it.bytes / it.dur_us / 1000).toPrecision(3) + " GB/s)" : ""));
    }
    if (it.launch_us != null) {
      lines.push("launched on the CPU at " + fmtUs(it.launch_us - t0) + (it.launched_in ? " in " + it.launched_in : " (outside any collective op)") +
        ": " + fmtUs(it.launch_delay_us) + " from launch to start");
    } else {
      lines.push("launch not recorded (no CPU call with its correlation id)");
    }
    return lines.join("<br>");
  }
  // (no "<" then "/" in this file: a report embeds it in a script element and escapes those)
  function escapeHtml(s) { return s.replace(/&/g, "&amp;").replace(/[<]/g, "&lt;").replace(/>/g, "&gt;"); }

  // On hover of a GPU event: a line from its launch on the CPU lane to its start.
  function onTimelineHover(ev) {
    const p = ev && ev.points && ev.points[0];
    const links = state.launchLinks || [];
    const link = p && links[p.curveNumber] ? links[p.curveNumber][p.pointIndex] : null;
    showLaunchLink(link || null);
  }
  function showLaunchLink(link) {
    const el = $("timeline");
    if (!el.layout || (!link && !state.linkShown)) return;
    const cats = (el.layout.yaxis && el.layout.yaxis.categoryarray) || [];
    const cpu = (state.lastTimeline && (state.lastTimeline.rows || []).find((l) => l.role === "cpu")) || null;
    const shapes = (state.timelineShapes || []).slice();
    if (link && cpu) {
      const y0 = cats.indexOf(cpu.label), y1 = cats.indexOf(link[2]);
      if (y0 >= 0 && y1 >= 0) {
        shapes.push({ type: "line", xref: "x", yref: "y", x0: link[0], x1: link[1], y0: y0, y1: y1,
          line: { color: "#111827", width: 1.5, dash: "dot" } });
        shapes.push({ type: "circle", xref: "x", yref: "y", xsizemode: "pixel", ysizemode: "pixel",
          xanchor: link[0], yanchor: y0, x0: -4, x1: 4, y0: -4, y1: 4, fillcolor: "#111827", line: { width: 0 } });
      }
    }
    state.linkShown = !!link;
    el.dataset.launchLink = link ? "1" : "0";
    Plotly.relayout(el, { shapes: shapes });
  }

  let relayoutTimer = null;
  function onRelayout(ev) {
    let view = state.view;
    if (ev.autosize && state.lastTimeline && state.lastTimeline.aggregated) {
      // resized: a binned row is drawn in whole pixels, so draw it again for the new ones
      clearTimeout(relayoutTimer);
      relayoutTimer = setTimeout(() => drawTimeline(state.lastTimeline), 120);
      return;
    }
    if (ev["xaxis.autorange"]) view = null;
    else if (ev["xaxis.range[0]"] !== undefined) view = [ev["xaxis.range[0]"], ev["xaxis.range[1]"]];
    else if (ev["xaxis.range"]) view = ev["xaxis.range"];
    else return;
    const t0 = runT0();
    state.view = view ? [t0 + view[0] * 1000, t0 + view[1] * 1000] : null;
    state.selectedSample = null;
    clearTimeout(relayoutTimer);
    relayoutTimer = setTimeout(loadTimeline, 120);
  }

  function onTimelineClick(ev) {
    if (state.expand !== "" || !ev.points || !ev.points.length) return;
    const rank = ev.points[0].customdata;
    if (rank === null || rank === undefined) return;
    state.expand = String(rank);
    state.laneKind = "tensor";
    $("expand-select").value = String(rank);
    loadTimeline();
  }

  function showWindow(t0us, t1us) {
    state.view = [t0us, t1us];
    loadTimeline();
    $("timeline-card").scrollIntoView({ behavior: "smooth" });
  }

  // ------------------------------------------------------------------ sections
  async function loadSection(name, draw) {
    try {
      const body = await api("api/analysis/" + name, { run: state.run });
      setNotices(name, body.notices);
      draw(body.data);
    } catch (err) {
      if (keptOffline(err)) return;
      setNotices(name, [name + " unavailable: " + err.message]);
    }
  }

  function drawVerdicts(data) {
    const box = $("verdicts");
    box.innerHTML = "";
    const verdicts = (data && data.verdicts) || [];
    if (!verdicts.length) return;
    const h = document.createElement("h2");
    h.textContent = "What the analysis found";
    box.appendChild(h);
    const ul = document.createElement("ul");
    for (const v of verdicts) { const li = document.createElement("li"); li.textContent = v; ul.appendChild(li); }
    box.appendChild(ul);
  }

  let breakdownData = null;
  function drawBreakdown(data) {
    breakdownData = data;
    const el = $("breakdown");
    text($("breakdown-verdict"), data && data.verdict);
    const ranks = (data && data.ranks) || [];
    if (!ranks.length) { empty(el, "no time breakdown for this run"); drawWaitHeatmap(null); return; }
    const labels = data.labels || {};
    text($("breakdown-note"), "");
    if (manyRanks(ranks.length)) {
      drawBreakdownSpread(el, data, ranks);
      drawWaitHeatmap(data);
      drawUserPhases(data && data.user_phases);
      return;
    }
    const traces = (data.categories || []).map((cat) => ({
      type: "bar", name: labels[cat] || cat,
      x: ranks.map((r) => "rank " + r.rank),
      y: ranks.map((r) => (r.total_ms || {})[cat] || 0),
      marker: { color: CATEGORY_COLORS[cat] || PHASE_COLORS[cat] },
      hovertemplate: "%{x}: %{y:.1f} ms<extra>" + (labels[cat] || cat) + "</extra>",
    }));
    draw(el, traces, Object.assign(baseLayout(), {
      barmode: "stack", yaxis: axis("ms over the whole run"), legend: { orientation: "h", y: -0.15, font: { size: 11 } },
      margin: { l: 60, r: 16, t: 10, b: 30 }, height: 360,
    }), plotConfig);
    drawWaitHeatmap(data);
    drawUserPhases(data && data.user_phases);
  }

  // Many ranks: per phase, the spread across ranks (median, p90, the most) as horizontal
  // bars, the ranks at the most in the hover, and the ranks that stand out under the chart.
  const SPREAD_COLORS = { median: "#94a3b8", p90: "#475569", most: "#b45309" };
  function drawBreakdownSpread(el, data, ranks) {
    const labels = data.labels || {};
    const cats = data.categories || [];
    const short = (cat) => String(labels[cat] || cat).split(" (")[0];
    const y = cats.map(short);
    const per = cats.map((cat) => spread(ranks.map((r) => [r.rank, (r.total_ms || {})[cat] || 0])));
    const bar = (name, key, color, extra) => ({
      type: "bar", orientation: "h", name: name, y: y, x: per.map((s) => s[key]), marker: { color: color },
      customdata: per.map((s) => ranksWord(s.worstRanks)),
      hovertemplate: extra || ("%{y}: " + name + " %{x:.1f} ms<extra></extra>"),
    });
    draw(el, [
      bar("median rank", "median", SPREAD_COLORS.median),
      bar("p90", "p90", SPREAD_COLORS.p90),
      bar("the most", "worst", SPREAD_COLORS.most, "%{y}: the most, %{x:.1f} ms, on %{customdata}<extra></extra>"),
    ], Object.assign(baseLayout(), {
      barmode: "group", xaxis: axis("ms over the whole run, across " + ranks.length + " ranks"),
      yaxis: { automargin: true, autorange: "reversed", type: "category", ticksuffix: " " },
      legend: { orientation: "h", x: 0, xanchor: "left", y: 1, yanchor: "bottom", font: { size: 11 } },
      margin: { l: 10, r: 16, t: 30, b: 44 }, height: 360,
    }), plotConfig);
    const notes = [];
    cats.forEach((cat, i) => {
      const pairs = ranks.map((r) => [r.rank, (r.total_ms || {})[cat] || 0]);
      const out = standingOut(pairs, 4);
      if (!out.length || notes.length >= 3) return;
      const value = new Map(pairs);
      notes.push(short(cat) + ": " + out.map((r) => "rank " + r + " (" + value.get(r).toFixed(1) + " ms)").join(", ") +
        " against a median of " + per[i].median.toFixed(1) + " ms");
    });
    text($("breakdown-note"), ranks.length + " ranks: the spread across them per phase (hover the most for its ranks)" +
      (notes.length ? " \u00b7 stand out: " + notes.join("; ") : " \u00b7 no rank stands out"));
  }

  // The same steps in the user's own words: one bar per range and rank (the median and the
  // most beyond 10 ranks, so the legend stays short), the rank the analysis names marked.
  function drawUserPhases(p) {
    const box = $("breakdown-user-box");
    const ranks = (p && p.ranks) || [];
    box.hidden = !ranks.length;
    if (!ranks.length) return;
    text($("breakdown-user-verdict"), p.verdict);
    const names = (p.names || []).concat([p.outside]);
    const out = p.outlier ? p.outlier.rank : null;
    const bar = (name, values, color) => Object.assign({
      type: "bar", orientation: "h", name: name, y: names, x: values,
      hovertemplate: "%{y}: %{x:.2f} ms per step<extra>" + name + "</extra>",
    }, color ? { marker: { color: color } } : {});
    let traces;
    if (ranks.length <= 10) {
      traces = ranks.map((r) => bar("rank " + r.rank + (r.rank === out ? " \u25c0" : ""),
        names.map((n) => (r.mean_ms || {})[n] || 0)));
    } else {
      const col = (n) => ranks.map((r) => (r.mean_ms || {})[n] || 0).sort((a, b) => a - b);
      traces = [
        bar("median rank", names.map((n) => { const c = col(n); return c[Math.floor(c.length / 2)]; }), "#94a3b8"),
        bar("the most", names.map((n) => { const c = col(n); return c[c.length - 1]; }), "#b45309"),
      ];
    }
    draw($("breakdown-user"), traces, Object.assign(baseLayout(), {
      barmode: "group", xaxis: axis("mean ms per step"), yaxis: { automargin: true, autorange: "reversed" },
      legend: { orientation: "h", y: -0.25, font: { size: 11 } },
      margin: { l: 10, r: 16, t: 10, b: 40 }, height: Math.max(220, 36 * names.length * Math.min(ranks.length, 3) / 2 + 90),
    }), plotConfig);
  }

  // The rank the straggler analysis names (hvdprof.analysis.stragglers' result), or null.
  // The one place the page reads that field: follow a rename here.
  function stragglerRank(result) {
    const r = result ? result.straggler : null;
    return r === undefined || r === null ? null : Number(r);
  }
  // Every rank the analysis names (several culprits: a slow host), the top one first.
  function culpritRanks(result) {
    const named = (result && result.culprits) || [];
    const top = stragglerRank(result);
    return named.length ? named.map(Number) : (top === null ? [] : [top]);
  }
  let stragglersData = null;

  // Stragglers: the breakdown's per-step negotiation wait of each rank, as a heatmap. Dark
  // is a rank that waited (the victim); the rank it waited for is marked on its row.
  function drawWaitHeatmap(data) {
    const el = $("stragglers");
    const chosen = chosenSet();
    const only = state.heatmapRanks;
    const ranks = ((data && data.ranks) || []).filter((r) => (!chosen || chosen.members.includes(r.rank)) && (!only || only.includes(r.rank)));
    const z = ranks.map((r) => ((r.per_step_ms || {}).negotiate) || []);
    // Ranks of the run with no row here (a Horovod timeline is written by rank 0 alone).
    const shown = new Set(ranks.filter((r, i) => z[i].length).map((r) => r.rank));
    const missing = ((state.info && state.info.ranks) || []).filter((r) => !shown.has(r) && (!chosen || chosen.members.includes(r)) && (!only || only.includes(r)));
    const culprit = stragglerRank(stragglersData);
    const notes = [];
    if (missing.length && shown.size) notes.push("no negotiation wait recorded for rank " + missing.join(", ") + " (its timeline has no negotiation slices)");
    if (culprit !== null && !shown.has(culprit)) notes.push("rank " + culprit + " is the straggler (not drawn: no row here" + (only ? " or not among the ranks chosen" : "") + ")");
    text($("stragglers-note"), notes.join(" \u00b7 "));
    // The analysis compared no arrivals (torch.profiler traces without readiness marks, a
    // single rank's timeline): a heatmap of waits would claim what it could not tell.
    if (stragglersData && !stragglersData.ops_with_marks && culprit === null) {
      text($("stragglers-note"), "");
      empty(el, "no wait heatmap: arrivals cannot be compared in this run (see the verdict above)");
      el.dataset.heatmap = "0";
      return;
    }
    if (!ranks.length || !z.some((row) => row.length)) { empty(el, "no negotiation waits recorded in this timeline"); return; }
    el.dataset.heatmap = "1";
    const steps = Math.max(...z.map((row) => row.length));
    const named = new Set(culpritRanks(stragglersData));
    const label = (rank) => "rank " + rank + (named.has(rank) ? " \u25c0 straggler" : "");
    const y = ranks.map((r) => label(r.rank));
    // Many rows: each row thinner, the box taller, and a label on every k-th row plus the
    // outliers' rows (a label on each of 64 rows would overprint its neighbours).
    const many = ranks.length > MANY_RANKS;
    const rowPx = many ? 13 : 0;
    const height = many ? 70 + rowPx * ranks.length : 340;
    let ticks = {};
    if (many) {
      const marked = new Set([...named, ...outlierRanks()]);
      const every = Math.max(1, Math.ceil(16 / rowPx));
      const forced = ranks.map((r, i) => (marked.has(r.rank) ? i : -1)).filter((i) => i >= 0);
      const keep = ranks.map((r, i) => i).filter((i) => forced.includes(i) ||
        (i % every === 0 && forced.every((f) => Math.abs(f - i) * rowPx >= 16)));
      ticks = { tickmode: "array", tickvals: keep.map((i) => y[i]), ticktext: keep.map((i) => y[i]), tickfont: { size: 11 } };
      notes.unshift(ranks.length + " rows: a label on every " + (every === 2 ? "2nd" : every + "th") + " row and on the outliers' (" +
        rankList([...marked].filter((r) => ranks.some((x) => x.rank === r))) + "); hover a row for its rank; narrow the rows above");
      text($("stragglers-note"), notes.join(" \u00b7 "));
    }
    const shapes = [];
    const annotations = [];
    const row = ranks.findIndex((r) => r.rank === culprit);
    if (row >= 0) {
      // a box around the straggler's row: the others' dark rows are waiting for it
      // (with many thin rows, its words would hide the row: the note under the chart says it)
      if (many) notes.push("boxed: rank " + culprit + ", the straggler (the others waited for it)");
      if (many) text($("stragglers-note"), notes.join(" \u00b7 "));
      shapes.push({ type: "rect", xref: "paper", x0: 0, x1: 1, yref: "y", y0: row - 0.5, y1: row + 0.5,
        line: { color: "#1d4ed8", width: 3 }, fillcolor: "rgba(0,0,0,0)" });
      if (!many) annotations.push({ xref: "paper", x: 0.5, yref: "y", y: row, text: "straggler: the others waited for this rank",
        showarrow: false, font: { color: "#1d4ed8", size: 12 }, bgcolor: "rgba(255,255,255,0.85)" });
    }
    draw(el, [{
      type: "heatmap", z: z, x: Array.from({ length: steps }, (_, i) => i), y: y,
      colorscale: [[0, "#fff7ec"], [0.5, "#fc8d59"], [1, "#7f0000"]], colorbar: { title: { text: "waited (ms)", side: "right" } },
      zmin: 0, zmax: colourCap(z),
      hovertemplate: "%{y}, step %{x}: waited %{z:.2f} ms for the others<extra></extra>",
    }], Object.assign(baseLayout(), {
      // whole steps only (two steps would otherwise tick at -0.5, 0, 0.5)
      xaxis: axis("training step", { tickmode: "linear", tick0: 0, dtick: Math.max(1, Math.ceil(steps / 12)), tickformat: "d" }),
      yaxis: Object.assign({ autorange: "reversed", type: "category", automargin: true }, ticks),
      // the colour bar's top clear of the tool bar's band
      height: height, margin: { l: 60, r: 16, t: TOOLBAR_PX, b: 44 }, shapes: shapes, annotations: annotations,
    }), plotConfig);
  }

  // Colour scale top: the 95th percentile, so one slow first step does not wash out the rest.
  function colourCap(z) {
    const all = z.flat().filter((v) => v != null).sort((a, b) => a - b);
    return all.length ? Math.max(all[Math.floor(0.95 * (all.length - 1))], 1e-3) : 1;
  }

  function drawStragglers(data) {
    jobStragglers = data;
    const chosen = chosenSet();
    stragglersData = chosen ? chosen.stragglers : data;
    text($("straggler-verdict"), chosen
      ? "Process set " + chosen.process_set + " (ranks " + chosen.members.join(", ") + "): " + (stragglersData.verdict || "")
      : data && data.verdict);
    drawWaitHeatmap(breakdownData); // mark the straggler's row (the breakdown may be drawn first)
  }
  let jobStragglers = null;

  // Process sets (hvdprof.analysis.process_sets): each set's members and its straggler,
  // judged among its members. Choosing one narrows the timeline's rows and the straggler
  // card to its ranks.
  function chosenSet() {
    return state.processSets.find((s) => String(s.process_set) === state.set) || null;
  }
  function drawProcessSets(data) {
    state.processSets = (data && data.sets) || [];
    if (state.set && !chosenSet()) state.set = "";
    const options = [["", "all ranks"]].concat(state.processSets.map((s) =>
      [String(s.process_set), "set " + s.process_set + ": ranks " + s.members.join(", ")]));
    fillSelect($("set-select"), options, state.set);
    $("set-filter").hidden = !state.processSets.length;
  }
  function setFilter(value) {
    state.set = value;
    drawStragglers(jobStragglers);
    loadTimeline();
  }

  function drawFusion(data) {
    const el = $("fusion");
    text($("fusion-verdict"), data && data.verdict);
    const ranks = (data && data.ranks) || [];
    if (!ranks.length) { empty(el, "no fused operations recorded"); return; }
    const fill = (r) => (100 * (r.fill_mean || 0)).toFixed(1) + "%";
    const sizes = [...new Set(ranks.flatMap((r) => Object.keys(r.group_size_histogram || {}).map(Number)))].sort((a, b) => a - b);
    const sized = rankSeries(ranks, sizes, (r, k) => (r.group_size_histogram || {})[String(k)] || 0, {
      key: fill, name: (rs, r) => ranksWord(rs) + " (fill " + fill(r) + ")", hover: "%{y} collectives of %{x} tensors",
    });
    const threshold = "the " + fmtBytes(data.threshold_bytes) + " threshold";
    draw(el, sized.traces, Object.assign(baseLayout(), {
      barmode: "group", showlegend: true, xaxis: axis("tensors fused into one collective", { type: "category" }),
      yaxis: axis("number of collectives"),
      title: { text: sized.spread
        ? "across " + ranks.length + " ranks (" + sized.groups + " different): collectives per size"
        : "fill (legend) = a fused collective's bytes / " + threshold + ", on average", font: { size: 11 } },
    }), plotConfig);
    // what the legend cannot say: how the fill and the group sizes spread, who stands out
    const notes = [];
    if (sized.spread || ranks.length > MANY_RANKS) {
      const f = spread(ranks.map((r) => [r.rank, r.fill_mean || 0]), true);
      notes.push("fill (bytes / " + threshold + "): median " + (100 * f.median).toFixed(1) + "%, lowest " +
        (100 * f.worst).toFixed(1) + "% on " + ranksWord(f.worstRanks));
    }
    if (ranks.length > MANY_RANKS) {
      const fillOut = standingOut(ranks.map((r) => [r.rank, r.fill_mean || 0]), 5);
      const perOp = standingOut(ranks.map((r) => [r.rank, r.tensors_per_fused_op || 0]), 5);
      const out = [...new Set([...fillOut, ...perOp])];
      notes.push(out.length ? "stand out: " + out.map((k) => { const r = ranks.find((x) => x.rank === k);
        return "rank " + k + " (fill " + fill(r) + ", " + (r.tensors_per_fused_op || 0).toFixed(1) + " tensors a collective)"; }).join(", ")
        : "no rank stands out");
    }
    text($("fusion-note"), notes.join(" \u00b7 "));
    // how full each fused collective's buffer was: all low means a threshold larger than
    // the job needs; all near 100% means the threshold is what splits the groups
    const fillEl = $("fusion-fill");
    text($("fusion-fill-note"), "");
    const bands = Object.keys(ranks[0].fill_histogram || {});
    const fusedAny = ranks.some((r) => Object.values(r.fill_histogram || {}).some((n) => n > 0));
    if (!bands.length || !fusedAny || !data.threshold_bytes) {
      empty(fillEl, data.threshold_bytes ? "no fused collectives to show the fill of" : "fusion threshold not recorded: no fill");
      return;
    }
    // up to 8 ranks one bar per rank, as always; beyond, identical ranks merged
    const filled = rankSeries(ranks, bands, (r, b) => (r.fill_histogram || {})[b] || 0, {
      keep: ranks.length <= 8, name: (rs) => ranksWord(rs), hover: "%{y} fused collectives filled the buffer %{x}",
    });
    draw(fillEl, filled.traces, Object.assign(baseLayout(), {
      barmode: "group", showlegend: true,
      xaxis: axis("buffer fill: a fused collective's bytes / " + threshold, { type: "category" }),
      yaxis: axis("fused collectives"),
    }), plotConfig);
    if (filled.spread) text($("fusion-fill-note"), ranks.length + " ranks in " + filled.groups + " different fills: the spread per band (hover the most for its ranks)");
  }

  // Bars per rank for a chart of x categories: ranks with identical series merged into one
  // ("ranks 0-7"), and beyond what a legend can hold, the spread across ranks per x
  // (median, p90, the most, with the ranks at the most in the hover). o.keep: one trace per
  // rank, unmerged (the small-run charts); o.key: more of a rank that must match to merge.
  function rankSeries(items, xs, valueOf, o) {
    const keyOf = (it) => JSON.stringify(xs.map((x) => valueOf(it, x))) + "|" + (o.key ? o.key(it) : "");
    const groups = o.keep ? items.map((it) => ({ ranks: [it.rank], item: it })) : sameSeries(items, keyOf);
    if (o.keep || groups.length <= LEGEND_MAX) {
      return { spread: false, groups: groups.length, traces: groups.map((g) => ({
        type: "bar", name: o.name(g.ranks, g.item), x: xs, y: xs.map((x) => valueOf(g.item, x)),
        hovertemplate: o.hover + "<extra>" + ranksWord(g.ranks) + "</extra>",
      })) };
    }
    const per = xs.map((x) => spread(items.map((it) => [it.rank, valueOf(it, x)])));
    const traces = [["median rank", "median"], ["p90", "p90"], ["the most", "worst"]].map(([name, key]) => ({
      type: "bar", name: name, x: xs, y: per.map((s) => s[key]),
      marker: { color: SPREAD_COLORS[key === "worst" ? "most" : key] },
      customdata: per.map((s) => ranksWord(s.worstRanks)),
      hovertemplate: o.hover + "<extra>" + name + (key === "worst" ? ": %{customdata}" : "") + "</extra>",
    }));
    return { spread: true, groups: groups.length, traces: traces };
  }

  function drawBandwidth(data) {
    const el = $("bandwidth");
    text($("bandwidth-verdict"), data && data.verdict);
    const bins = (data && data.bins) || [];
    if (!bins.length) { empty(el, "no collectives with known sizes"); return; }
    const ops = [...new Set(bins.map((b) => b.op))];
    const traces = ops.map((op) => {
      const mine = bins.filter((b) => b.op === op);
      return {
        type: "scatter", mode: "lines+markers", name: op.toLowerCase(),
        x: mine.map((b) => b.median_bytes), y: mine.map((b) => b.busbw_gbps),
        text: mine.map((b) => b.count + " calls, median " + b.median_ms.toFixed(3) + " ms"),
        hovertemplate: "%{x:.3s}B: %{y:.3g} GB/s<br>%{text}<extra>" + op.toLowerCase() + "</extra>",
      };
    });
    draw(el, traces, Object.assign(baseLayout(), {
      xaxis: logAxis("message size (bytes)", bins.map((b) => b.median_bytes), { tickformat: ".2~s" }),
      // GB/s, the unit of the verdict above the chart
      yaxis: logAxis("bus bandwidth (GB/s)", bins.map((b) => b.busbw_gbps)),
    }), plotConfig);
  }

  // GPU (hvdprof.analysis.device.gpu_report): HTA's shares per rank as stacked bars, the
  // rank that stands out, kernel time per name, memcpy bandwidth. Absent without a GPU.
  let gpuData = null;
  function drawGpu(data) {
    gpuData = data;
    let ranks = (data && data.ranks) || [];
    state.gpuRanks = ranks.map((r) => r.rank);
    fillLaneOptions();
    const card = $("gpu-card");
    card.hidden = !ranks.length;
    if (!ranks.length) return;
    text($("gpu-verdict"), data.stands_out_text || data.verdict);
    const out = data.stands_out;
    const all = ranks;
    // many ranks: the bars and the table hold representative ranks (median, p90 and the
    // most idle, the one that stands out), each a real rank, named on its bar
    const picked = manyRanks(all.length) ? gpuPicks(all, out) : null;
    if (picked) ranks = picked.map((p) => p.rank);
    const xs = picked ? picked.map((p) => p.label + ": rank " + p.rank.rank + (p.rank.rank === out ? " \u25c0" : ""))
      : ranks.map((r) => "rank " + r.rank + (r.rank === out ? " \u25c0" : ""));
    const pct = (v) => (100 * (v || 0)).toFixed(2) + "%";
    // each share read by its name (tests/test_web_contract.py checks every key read)
    const shares = [
      [(r) => r.compute_share, "compute", GPU_COLORS.gpu_computation],
      [(r) => r.non_compute_share, "non-compute (communication, memory, other)", GPU_COLORS.gpu_communication],
      [(r) => r.idle_share, "idle", "#d1d5db"],
    ];
    const traces = shares.map(([share, name, color]) => ({
      type: "bar", name: name, x: xs, y: ranks.map((r) => 100 * share(r)),
      text: ranks.map((r) => pct(share(r))), textposition: "inside", insidetextanchor: "middle",
      marker: { color: color }, hovertemplate: "%{x}: %{y:.2f}% of the GPU span<extra>" + name + "</extra>",
    }));
    // the overlap has another denominator (communication time): its own panel on the right
    traces.push({
      type: "bar", name: "comm overlapped by compute", x: xs, y: ranks.map((r) => 100 * r.comm_comp_overlap_share),
      text: ranks.map((r) => pct(r.comm_comp_overlap_share)), textposition: "outside", cliponaxis: false,
      xaxis: "x2", yaxis: "y2", marker: { color: "#475569" }, showlegend: false,
      hovertemplate: "%{x}: %{y:.2f}% of its communication kernel time overlaps compute kernels<extra>overlap</extra>",
    });
    draw($("gpu-shares"), traces, Object.assign(baseLayout(), {
      barmode: "stack",
      xaxis: { type: "category", domain: [0, 0.64], title: { text: "share of the GPU kernel span", font: { size: 11 } } },
      yaxis: axis("%", { range: [0, 100] }),
      xaxis2: { type: "category", domain: [0.74, 1], anchor: "y2", tickangle: 0, tickfont: { size: 10 }, title: { text: "comm overlapped<br>by compute", font: { size: 11 } } },
      yaxis2: { range: [0, 100], anchor: "x2", showticklabels: false },
      legend: { orientation: "h", y: -0.22, yanchor: "top", font: { size: 11 } },
      margin: { l: 45, r: 10, t: 14, b: 10 }, height: 380, bargap: 0.4,
    }), plotConfig);
    // the shares as numbers (what HTA prints), the standing-out rank marked
    const table = $("gpu-shares-table");
    table.innerHTML = "";
    const head = table.createTHead().insertRow();
    for (const h of ["rank", "idle", "compute", "non-compute", "comm overlap", "events"]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    const body = table.createTBody();
    for (const r of ranks) {
      const tr = body.insertRow();
      tr.dataset.rank = String(r.rank);
      if (r.rank === out) tr.className = "stands-out";
      for (const v of [String(r.rank) + (r.rank === out ? " \u25c0" : ""), pct(r.idle_share), pct(r.compute_share), pct(r.non_compute_share), pct(r.comm_comp_overlap_share), String(r.kernels)]) {
        tr.insertCell().textContent = v;
      }
    }
    const select = $("gpu-kernel-rank");
    const keep = select.value;
    fillSelect(select, all.map((r) => [String(r.rank), "rank " + r.rank]), all.some((r) => String(r.rank) === keep) ? keep : String(out != null ? out : all[0].rank));
    drawGpuKernels();
    drawMemcpy(all);
    let counted = all.map((r) => "rank " + r.rank + ": " + r.kernels).join(", ");
    if (picked) {
      const k = spread(all.map((r) => [r.rank, r.kernels]), true);
      const most = spread(all.map((r) => [r.rank, r.kernels]));
      counted = "per rank: median " + k.median + ", fewest " + k.worst + " on " + ranksWord(k.worstRanks) + ", most " + most.worst + " on " + ranksWord(most.worstRanks) +
        "; the table and bars show " + picked.length + " of " + all.length + " ranks";
    }
    text($("gpu-note"), "Shares over the GPU events HTA counts (" + counted +
      "; with two or more profiler steps the last one is left out). " + (data.note || ""));
  }

  // Representative ranks of a many-rank GPU report, by idle share: the median, the p90, the
  // most idle, and the one the report says stands out. [{label, rank}], no rank twice.
  function gpuPicks(ranks, out) {
    const byIdle = ranks.slice().sort((a, b) => a.idle_share - b.idle_share);
    const at = (q) => byIdle[Math.min(byIdle.length - 1, Math.max(0, Math.ceil(q * byIdle.length) - 1))];
    const picks = [];
    const add = (label, r) => { if (r && !picks.some((p) => p.rank.rank === r.rank)) picks.push({ label: label, rank: r }); };
    add("median", at(0.5));
    add("p90 idle", at(0.9));
    add("most idle", byIdle[byIdle.length - 1]);
    add("least idle", byIdle[0]);
    add("stands out", ranks.find((r) => r.rank === out));
    return picks;
  }

  const KIND_WORDS = { computation: "compute", communication: "comm" };
  function drawGpuKernels() {
    const ranks = (gpuData && gpuData.ranks) || [];
    const r = ranks.find((x) => String(x.rank) === $("gpu-kernel-rank").value) || ranks[0];
    const table = $("gpu-kernels");
    table.innerHTML = "";
    if (!r) return;
    const head = table.createTHead().insertRow();
    for (const h of ["kernel", "kind", "count", "ms", "of busy"]) {
      const th = document.createElement("th"); th.textContent = h; head.appendChild(th);
    }
    const body = table.createTBody();
    for (const k of r.top_kernels || []) {
      const tr = body.insertRow();
      const name = tr.insertCell();
      name.textContent = k.short_name; name.title = k.name; name.className = "kernel-name";
      const kind = tr.insertCell();
      const dot = document.createElement("span");
      dot.className = "dot"; dot.style.background = GPU_COLORS["gpu_" + k.kind] || "#888";
      kind.appendChild(dot); kind.appendChild(document.createTextNode(KIND_WORDS[k.kind] || k.kind));
      kind.title = k.kind + " (HTA's kind)";
      tr.insertCell().textContent = String(k.count);
      tr.insertCell().textContent = k.total_ms.toFixed(2);
      tr.insertCell().textContent = (100 * k.busy_share).toFixed(1) + "%";
    }
    text($("gpu-kernels-note"), "top " + (r.top_kernels || []).length + " of " + r.kernel_names + " kernel names by GPU time; share of the rank's GPU busy time (" +
      fmtUs(1000 * r.busy_ms) + "); hover a name for the whole of it");
  }

  function drawMemcpy(ranks) {
    const el = $("gpu-memcpy");
    const kinds = [...new Set(ranks.flatMap((r) => (r.memcpy || []).map((c) => c.copy_kind)))].sort();
    if (!kinds.length) { empty(el, "no memcpy with a recorded size"); return; }
    const gbps = (r, k) => { const c = (r.memcpy || []).find((x) => x.copy_kind === k); return c ? c.gbps : null; };
    if (ranks.length > LEGEND_MAX) {
      // too many ranks for a legend: identical ones merged, or the spread across ranks
      const series = rankSeries(ranks, kinds, gbps, { name: (rs) => ranksWord(rs), hover: "%{x}: %{y:.3g} GB/s" });
      const all = ranks.flatMap((r) => (r.memcpy || []).map((c) => c.gbps));
      draw(el, series.traces, Object.assign(baseLayout(), {
        barmode: "group", title: { text: "memcpy bandwidth per copy kind" + (series.spread ? ", across " + ranks.length + " ranks" : ""), font: { size: 12 } },
        xaxis: axis("copy kind", { type: "category" }), yaxis: logAxis("GB/s (bytes / duration)", all, { tickformat: ",.2~r" }),
        legend: { orientation: "h", y: -0.25, yanchor: "top" }, margin: { l: 55, r: 10, t: 30, b: 10 }, height: 400,
      }), plotConfig);
      return;
    }
    const traces = ranks.map((r) => {
      const by = new Map((r.memcpy || []).map((c) => [c.copy_kind, c]));
      return {
        type: "bar", name: "rank " + r.rank, x: kinds, y: kinds.map((k) => (by.get(k) ? by.get(k).gbps : null)),
        text: kinds.map((k) => (by.get(k) ? by.get(k).count + " copies, " + fmtBytes(by.get(k).bytes) + " in " + by.get(k).total_ms.toFixed(3) + " ms" : "")),
        hovertemplate: "%{x}: %{y:.3g} GB/s<br>%{text}<extra>rank " + r.rank + "</extra>", textposition: "none",
      };
    });
    const all = ranks.flatMap((r) => (r.memcpy || []).map((c) => c.gbps));
    draw(el, traces, Object.assign(baseLayout(), {
      barmode: "group", title: { text: "memcpy bandwidth per copy kind", font: { size: 12 } },
      xaxis: axis("copy kind", { type: "category" }), yaxis: logAxis("GB/s (bytes / duration)", all, { tickformat: ",.2~r" }),
      legend: { orientation: "h", y: -0.25, yanchor: "top" }, margin: { l: 55, r: 10, t: 30, b: 10 }, height: 400,
    }), plotConfig);
  }

  let autotuneSamples = [];
  function drawAutotune(data) {
    const samples = (data && data.samples) || [];
    autotuneSamples = samples;
    text($("autotune-summary"), data && data.verdict);
    const scoreEl = $("autotune-score"), paramEl = $("autotune-params");
    if (!samples.length) {
      empty(scoreEl, "no autotune samples in this run (run with --autotune)");
      empty(paramEl, "the parameters each sample tried appear here");
      return;
    }
    const idx = samples.map((s) => s.index);
    const score = samples.map((s) => s.score_mb_per_s);
    const roleWords = { incumbent: "incumbent window", candidate: "candidate window", watch: "re-measure (watching for drift)" };
    const hover = samples.map((s) =>
      "threshold " + fmtBytes(s.fusion_threshold_bytes) + ", cycle " + s.cycle_time_ms + " ms, cache " +
      (s.cache_enabled ? "on" : "off") + "<br>steps " + s.first_step + "-" + s.last_step + " (" + s.phase + ")" +
      (s.role ? "<br>" + (roleWords[s.role] || s.role) : "") +
      (s.ratio_to_default != null ? "<br>tuner's paired estimate: " + s.ratio_to_default.toFixed(3) + "x the default" : ""));
    // The tuner's recommendation (recorded by the tuner; in older traces, the last sample
    // it marked best), ringed on the last window that ran it. No best-so-far line: a
    // running maximum of single windows follows the noise, not the tuner.
    const ringed = data.recommended;
    const chosen = ringed != null && samples[ringed] ? [samples[ringed]] : [];
    const rec = data.recommendation;
    const ringName = rec ? (rec.kept_default ? "kept: the default (tuner's decision)" : "tuner's recommendation") : "tuner's recommendation (marked best)";
    const roleColor = { incumbent: "#64748b", candidate: PHASE_COLORS.autotune, watch: "#1a7f37" };
    const traces = [
      // trace 0 holds every sample, in order (the click handler relies on it)
      { type: "scatter", mode: "markers", name: data.paired ? "window (grey: incumbent, purple: candidate)" : "sample", x: idx, y: score, text: hover,
        hovertemplate: "sample %{x}: %{y:.2f} MB/s<br>%{text}<extra>click: show on the timeline</extra>",
        marker: { size: 9, color: samples.map((s) => roleColor[s.role] || PHASE_COLORS.autotune) } },
    ];
    if (data.paired) {
      // the tuner's incumbent: the windows it measured the incumbent in, joined (each
      // candidate window between two of them is compared with both)
      const inc = samples.filter((s) => s.role === "incumbent");
      traces.push({ type: "scatter", mode: "lines", name: "tuner's incumbent (its windows)", x: inc.map((s) => s.index),
        y: inc.map((s) => s.score_mb_per_s), hoverinfo: "skip", line: { color: "#64748b", width: 1.5, dash: "dot" } });
    }
    traces.push({ type: "scatter", mode: "markers", name: ringName, x: chosen.map((s) => s.index),
      y: chosen.map((s) => s.score_mb_per_s), hoverinfo: "skip",
      marker: { size: 15, color: "rgba(0,0,0,0)", line: { color: "#1a7f37", width: 2.5 } } });
    draw(scoreEl, traces, Object.assign(baseLayout(), {
      title: { text: "score per sample (click one)", font: { size: 12 } }, xaxis: axis("sample #"),
      yaxis: axis("score: MB/s reduced"), margin: { l: 55, r: 10, t: 30, b: 90 },
    }), plotConfig);
    draw(paramEl, [
      { type: "scatter", mode: "lines+markers", name: "fusion threshold (MiB)", x: idx, y: samples.map((s) => s.fusion_threshold_bytes / 1048576) },
      { type: "scatter", mode: "lines+markers", name: "cycle time (ms)", x: idx, y: samples.map((s) => s.cycle_time_ms), yaxis: "y2" },
    ], Object.assign(baseLayout(), {
      title: { text: "parameter trajectory", font: { size: 12 } }, xaxis: axis("sample #"),
      yaxis: logAxis("fusion threshold (MiB)", samples.map((s) => s.fusion_threshold_bytes / 1048576)),
      yaxis2: logAxis("cycle time (ms)", samples.map((s) => s.cycle_time_ms), { overlaying: "y", side: "right" }),
      margin: { l: 55, r: 50, t: 30, b: 90 },
    }), plotConfig);
    if (!scoreEl.dataset.bound) {
      scoreEl.dataset.bound = "1";
      scoreEl.on("plotly_click", (ev) => {
        const point = ev.points.find((p) => p.curveNumber === 0);
        if (!point) return;
        const s = autotuneSamples[point.pointIndex];
        if (s && s.t1_us > s.t0_us) { state.selectedSample = s.index; showWindow(s.t0_us, s.t1_us); }
      });
    }
  }

  function drawSurface(data) {
    const el = $("autotune-surface");
    if (!data || !data.z || !data.z.length) { empty(el, (data && data.reason) || "no surrogate surface"); return; }
    // Over the range the samples searched only. A flat model (its whole predicted range
    // within one window's noise) is drawn at the noise's contrast, not stretched to full
    // colour over differences no measurement could tell apart.
    const all = data.z.flat();
    const lo = Math.min(...all), hi = Math.max(...all);
    const flat = !!data.flat;
    const mid = Math.sqrt(lo * hi);
    const noise = data.noise_log || 0;
    const span = flat ? { zmin: mid * Math.exp(-2 * noise), zmax: mid * Math.exp(2 * noise) } : {};
    const traces = [Object.assign({
      type: "contour", x: data.x, y: data.y, z: data.z, colorscale: "Viridis",
      colorbar: { title: { text: "MB/s", side: "right" } }, contours: { coloring: "heatmap" },
      hovertemplate: "threshold %{x:.3s}B, cycle %{y:.2f} ms: %{z:.2f} MB/s<extra>surrogate</extra>",
    }, span)];
    const pts = data.samples || [];
    traces.push({
      type: "scatter", mode: "markers", name: "samples", x: pts.map((s) => s.fusion_threshold_bytes),
      y: pts.map((s) => s.cycle_time_ms), text: pts.map((s) => s.score_mb_per_s.toFixed(2) + " MB/s"),
      hovertemplate: "sample: %{text}<extra></extra>", marker: { color: "#fff", line: { color: "#000", width: 1 }, size: 7 },
    });
    const pct = (x) => (100 * (Math.exp(x) - 1)).toFixed(1) + "%";
    const title = flat
      ? "flat: the model's range (" + pct(data.range_log) + ") is within the noise (\u00b1" + pct(noise) + " a window)"
      : "the tuner's model over the searched range: predicted MB/s";
    el.dataset.flat = flat ? "1" : "0";
    draw(el, traces, Object.assign(baseLayout(), {
      title: { text: title, font: { size: 12 } }, showlegend: false,
      xaxis: logAxis("fusion threshold (bytes)", data.x, { tickformat: ".2~s" }), yaxis: logAxis("cycle time (ms)", data.y),
      margin: { l: 55, r: 10, t: 30, b: 44 },
    }), plotConfig);
  }

  async function compareRuns() {
    const a = $("compare-a").value, b = $("compare-b").value;
    const el = $("compare");
    if (!a || !b) { empty(el, "choose two runs"); return; }
    try {
      const body = await api("api/compare", { a: a, b: b });
      setNotices("compare", body.notices);
      drawCompare(body.data, body.a || a, body.b || b);
    } catch (err) { if (!keptOffline(err)) empty(el, "comparison unavailable: " + err.message); }
  }

  function drawCompare(data, a, b) {
    const el = $("compare");
    el.dataset.drawn = "1";
    text($("compare-verdicts"), data && data.verdict);
    const rowsAll = (data && data.rows) || [];
    const phases = rowsAll.filter((r) => r.kind === "phase");
    const shown = phases.length ? phases : rowsAll.slice(0, 12);
    if (!shown.length) { empty(el, "nothing to compare"); return; }
    const keys = shown.map((r) => (phases.length ? r.key : r.kind + ": " + r.key));
    // runs by their id in the run list (data.a/b are full paths, too long for a legend)
    draw(el, [
      { type: "bar", name: "baseline: " + a, x: keys, y: shown.map((r) => r.a_ms),
        hovertemplate: "%{x}: %{y:.2f} ms per step<extra>baseline</extra>" },
      { type: "bar", name: "compared: " + b, x: keys, y: shown.map((r) => r.b_ms),
        hovertemplate: "%{x}: %{y:.2f} ms per step<extra>compared</extra>" },
    ], Object.assign(baseLayout(), {
      barmode: "group", yaxis: axis("ms per step"), xaxis: axis(phases.length ? "phase" : ""),
      title: { text: "time per step: " + (data.step_ms_a || 0).toFixed(2) + " ms (baseline) vs " + (data.step_ms_b || 0).toFixed(2) + " ms (compared)", font: { size: 12 } },
    }), plotConfig);
  }

  // ------------------------------------------------------------------ rank filters
  // The outliers (outlierRanks) and the first rank that is not one, to compare them with.
  function outliersCompared() {
    const all = (state.info && state.info.ranks) || [];
    const out = outlierRanks().filter((r) => all.includes(r)).slice(0, 12);
    const typical = all.find((r) => !out.includes(r));
    return (typical === undefined ? out : out.concat([typical])).sort((a, b) => a - b);
  }
  function showRankFilter(prefix, list) {
    const input = $(prefix + "-ranks");
    input.value = list ? rankList(list).replace(/ /g, "") : "";
    input.classList.remove("bad");
    input.title = "";
  }
  // A rank filter: an input of ranks ("0-7,12"; empty for all), "the outliers", "all ranks".
  function bindRankFilter(prefix, apply) {
    const input = $(prefix + "-ranks");
    const set = (list, auto) => { showRankFilter(prefix, list); apply(list, !!auto); };
    input.addEventListener("change", () => {
      const typed = input.value.trim();
      if (!typed || typed === "all") { set(null); return; }
      const all = (state.info && state.info.ranks) || [];
      const list = (parseRanks(typed) || []).filter((r) => all.includes(r));
      if (!list.length) {
        input.classList.add("bad");
        input.title = "no rank of this run in " + JSON.stringify(typed) + ": type ranks like 0-7,12 (ranks " + rankList(all) + ")";
        return;
      }
      set(list);
    });
    $(prefix + "-outliers").addEventListener("click", () => set(outliersCompared(), true));
    $(prefix + "-all").addEventListener("click", () => set(null));
  }
  function showRankFilters() {
    const n = ((state.info && state.info.ranks) || []).length;
    $("timeline-ranks-box").hidden = n <= 8;
    $("stragglers-ranks-box").hidden = n <= 8;
  }

  // ------------------------------------------------------------------ run selection
  function fillSelect(el, options, value) {
    el.innerHTML = "";
    for (const [v, label] of options) {
      const o = document.createElement("option"); o.value = v; o.textContent = label; el.appendChild(o);
    }
    if (value !== undefined) el.value = value;
  }

  async function loadRuns() {
    try {
      const body = await api("api/runs");
      state.runs = body.runs || [];
      setNotices("runs", body.notices);
    } catch (err) {
      if (keptOffline(err)) return;
      setNotices("runs", ["cannot list runs: " + err.message]);
      return;
    }
    const options = state.runs.map((r) => [r.id, r.id === "." ? "(this directory)" : r.id]);
    if (!state.run || !state.runs.some((r) => r.id === state.run)) {
      state.run = state.runs.length ? (params.get("run") && state.runs.some((r) => r.id === params.get("run")) ? params.get("run") : state.runs[0].id) : null;
    }
    fillSelect($("run-select"), options, state.run || undefined);
    fillSelect($("compare-a"), options, state.runs[0] ? state.runs[0].id : undefined);
    fillSelect($("compare-b"), options, state.runs[1] ? state.runs[1].id : state.runs[0] ? state.runs[0].id : undefined);
    $("compare-card").hidden = state.runs.length < 2;
    if (!$("compare").dataset.drawn) empty($("compare"), "choose a baseline and a run to compare, then press compare");
  }

  async function loadInfo() {
    const info = await api("api/run", { run: state.run });
    state.info = info;
    state.version = info.version;
    setNotices("run", info.notices);
    const hosts = [...new Set(Object.values(info.hosts || {}))];
    text($("run-meta"), info.format + " timeline \u00b7 " + info.ranks.length + " ranks" +
      (hosts.length ? " on " + hosts.join(", ") : "") + " \u00b7 " + info.tensors + " tensors" +
      (info.t1_us != null && info.t0_us != null ? " \u00b7 " + fmtUs(info.t1_us - info.t0_us) : "") +
      (info.complete ? "" : " \u00b7 still being written") + " \u00b7 v" + info.version);
    showLive();
    showRankFilters();
    fillLaneOptions();
    const list = $("problems");
    list.innerHTML = "";
    // a file still being written ends in a half-written event: the run's notice says so,
    // and it is listed as a problem only once the run is finished (then it was cut)
    const problems = (info.problems || []).filter((p) => info.complete || !p.partial_tail);
    for (const p of problems) {
      const li = document.createElement("li");
      li.textContent = p.file + (p.where ? " (" + p.where + ")" : "") + ": " + p.reason;
      list.appendChild(li);
    }
    $("problems-card").hidden = !problems.length;
  }

  // The lanes control: per rank its tensor and phase lanes, and its GPU streams when the
  // run has GPU activity on that rank (the gpu section says which).
  function fillLaneOptions() {
    const laneOptions = [["", "one row per rank"]];
    const gpu = new Set(state.gpuRanks || []);
    for (const r of (state.info && state.info.ranks) || []) {
      laneOptions.push([String(r), "rank " + r + ": tensor lanes"], [r + ":phase", "rank " + r + ": phase lanes"]);
      if (gpu.has(r) && (!EMBEDDED || EMBEDDED[embeddedKey("api/timeline", { expand_rank: r, lanes: "stream", run: state.run })] !== undefined)) {
        laneOptions.push([r + ":stream", "rank " + r + ": GPU streams"]);
      }
    }
    fillSelect($("expand-select"), laneOptions, expandValue());
  }

  // The sections drawn by a drawer of their own; every other analysis the API lists
  // (GET api/analysis: a plug-in's, one added later) gets a generic card from its result.
  const DRAWERS = {
    report: drawVerdicts, breakdown: drawBreakdown, stragglers: drawStragglers,
    fusion: drawFusion, bandwidth: drawBandwidth, autotune: drawAutotune,
    surrogate: drawSurface, stalls: drawStalls, process_sets: drawProcessSets, gpu: drawGpu,
  };

  async function analysisIndex() {
    try {
      const listed = await api("api/analysis", {});
      setNotices("analyses", []);
      return Array.isArray(listed) ? listed : [];
    } catch (err) {
      if (!keptOffline(err)) setNotices("analyses", ["the list of analyses is unavailable: " + err.message]);
      return [];
    }
  }

  async function loadSections() {
    const runId = state.run;
    const others = analysisIndex().then((listed) => Promise.all(listed
      .filter((a) => !Object.hasOwn(DRAWERS, a.name) && state.run === runId)
      .map((a) => loadSection(a.name, (data) => drawGeneric(a, data)))));
    await Promise.all([
      ...Object.entries(DRAWERS).map(([name, drawer]) => loadSection(name, drawer)),
      others,
    ]);
    if (state.set) drawStragglers(jobStragglers); // the sets may arrive after the card
  }

  // ------------------------------------------------------------------ generic sections
  // An analysis's typed result (its /openapi.json model) drawn as it is: its verdict
  // sentences, a table of its single values, and a table per list of records.
  function genericCard(entry) {
    const id = "analysis-" + entry.name;
    let card = $(id);
    if (!card) {
      card = document.createElement("section");
      card.className = "card wide generic";
      card.id = id;
      card.dataset.analysis = entry.name;
      $("compare-card").before(card);
    }
    card.innerHTML = "";
    const h = document.createElement("h2");
    h.textContent = entry.name.replace(/_/g, " ").replace(/^./, (c) => c.toUpperCase());
    const hint = document.createElement("p");
    hint.className = "hint";
    hint.textContent = entry.summary;
    card.append(h, hint);
    return card;
  }

  // A result with no verdict and only empty values (divergence on a run that checked
  // nothing) has nothing to say: no card, rather than a table of dashes on every run.
  const blank = (v) => v === null || v === undefined || v === 0 || v === false || v === ""
    || (Array.isArray(v) && v.every(blank)) || (typeof v === "object" && !Array.isArray(v) && Object.values(v).every(blank));

  function drawGeneric(entry, data) {
    const said = data == null ? [] : Array.isArray(data.verdicts) ? data.verdicts : (data.verdict ? [data.verdict] : []);
    if (!said.length && blank(data)) { const old = $("analysis-" + entry.name); if (old) old.remove(); return; }
    const card = genericCard(entry);
    for (const v of said) { const p = document.createElement("p"); p.className = "verdict"; p.textContent = v; card.appendChild(p); }
    const fields = Object.entries(data).filter(([k]) => k !== "verdict" && k !== "verdicts");
    const single = fields.filter(([, v]) => !isRecords(v));
    if (single.length) card.appendChild(genericTable(["", "value"], single.map(([k, v]) => [k, shown(v)])));
    for (const [key, list] of fields.filter(([, v]) => isRecords(v))) {
      const h = document.createElement("h3");
      h.textContent = key.replace(/_/g, " ");
      const columns = [...new Set(list.flatMap((r) => Object.keys(r)))];
      card.append(h, genericTable(columns, list.slice(0, GENERIC_ROWS).map((r) => columns.map((c) => shown(r[c])))));
      if (list.length > GENERIC_ROWS) { const p = document.createElement("p"); p.className = "hint"; p.textContent = "... and " + (list.length - GENERIC_ROWS) + " more (see the API)"; card.appendChild(p); }
    }
  }

  const GENERIC_ROWS = 50;
  const isRecords = (v) => Array.isArray(v) && v.length > 0 && v.every((r) => r && typeof r === "object" && !Array.isArray(r));
  function shown(v) {
    if (v === null || v === undefined) return "-";
    if (typeof v === "number") {
      if (Number.isInteger(v) || Math.abs(v) >= 1000) return v.toLocaleString("en-US", { maximumFractionDigits: 1 });
      return String(Number(v.toPrecision(4)));
    }
    if (typeof v === "object") { const s = JSON.stringify(v); return s.length > 120 ? s.slice(0, 117) + "..." : s; }
    return String(v);
  }

  function genericTable(columns, body) {
    const table = document.createElement("table");
    table.className = "numbers generic-table";
    const head = table.insertRow();
    for (const c of columns) { const th = document.createElement("th"); th.textContent = c; head.appendChild(th); }
    for (const cells of body) { const tr = table.insertRow(); for (const c of cells) tr.insertCell().textContent = c; }
    return table;
  }

  // Nothing of another run may stay on screen under this run's name.
  function clearRun(message) {
    $("gpu-card").hidden = true;
    $("breakdown-user-box").hidden = true;
    for (const id of ["timeline", "breakdown", "stragglers", "fusion", "fusion-fill", "bandwidth", "autotune-score", "autotune-params", "autotune-surface"]) {
      empty($(id), message);
    }
    for (const id of ["breakdown-verdict", "straggler-verdict", "fusion-verdict", "breakdown-note", "fusion-note", "fusion-fill-note", "timeline-ranks-said", "bandwidth-verdict", "autotune-summary", "stragglers-note", "timeline-status", "run-meta"]) {
      text($(id), "");
    }
    $("verdicts").innerHTML = "";
    for (const card of document.querySelectorAll("section.generic")) card.remove();
    $("problems-card").hidden = true;
    for (const source of [...noticeSet.keys()]) if (source !== "runs") noticeSet.delete(source);
    state.info = null;
    state.lanes = [];
  }

  async function selectRun(runId) {
    state.run = runId; state.view = null; state.expand = ""; state.laneKind = "tensor";
    state.set = ""; state.processSets = []; $("set-filter").hidden = true;
    state.gpuRanks = []; $("gpu-card").hidden = true;
    state.timelineRanks = null; state.timelineAuto = false; state.heatmapRanks = null;
    showRankFilter("timeline", null); showRankFilter("stragglers", null);
    if (!runId) {
      clearRun("no run to show yet");
      empty($("timeline"), "no runs under this directory yet: this page updates by itself when a job starts writing one");
      document.body.dataset.ready = "1";
      return;
    }
    try {
      await loadInfo();
    } catch (err) {
      if (keptOffline(err)) { document.body.dataset.ready = "1"; return; }
      clearRun("this run cannot be shown (see the notice above)");
      setNotices("run", ["run " + runId + " cannot be shown: " + err.message]);
      document.body.dataset.ready = "1";
      return;
    }
    if (manyRanks(state.info.ranks.length)) {
      // many ranks: the timeline opens on the outliers' rows, known once the analyses are in
      await loadSections();
      if (state.run !== runId) return;
      state.timelineRanks = outliersCompared();
      state.timelineAuto = true;
      showRankFilter("timeline", state.timelineRanks);
      await loadTimeline();
    } else {
      await Promise.all([loadTimeline(), loadSections()]);
    }
    document.body.dataset.ready = "1";
  }

  // The lanes control: "" (a row per rank), "R" (rank R's tensor lanes), "R:phase".
  function expandValue() {
    if (state.expand === "") return "";
    return state.laneKind === "tensor" ? state.expand : state.expand + ":" + state.laneKind;
  }
  function setExpand(value) {
    const [rank, kind] = String(value || "").split(":");
    state.expand = rank || "";
    state.laneKind = kind === "phase" || kind === "stream" ? kind : "tensor";
    loadTimeline();
  }

  // ------------------------------------------------------------------ live updates
  let sectionsTimer = null;
  function onChanged(event) {
    if (event.run !== state.run) return;
    state.updates += 1;
    loadInfo().then(loadTimeline).catch(() => {});
    if (!sectionsTimer) sectionsTimer = setTimeout(() => { sectionsTimer = null; loadSections(); }, 1000);
  }

  // Connected: "live" while the run is still being written, "watching" once every file
  // is closed (a finished run: nothing arrives unless a job writes to it again).
  function showLive() {
    if (!state.live) return;
    const done = state.info && state.info.complete;
    text($("live-text"), done ? "watching" : "live");
    $("live").title = done
      ? "the run is finished; the page still updates by itself if a job writes to it again"
      : "updates by itself while the job writes";
  }

  function connectLive() {
    if (EMBEDDED || !window.EventSource) {
      text($("live-text"), EMBEDDED ? "report (offline)" : "no live updates");
      return;
    }
    const source = new EventSource(apiUrl("api/events"));
    let dropped = false;
    source.addEventListener("hello", () => {
      $("live").classList.add("on"); state.live = true; showLive();
      // back after a drop (the server restarted): catch up on what changed meanwhile
      if (dropped && state.run) { dropped = false; loadRuns().then(() => onChanged({ run: state.run })); }
    });
    source.addEventListener("changed", (e) => onChanged(JSON.parse(e.data)));
    source.addEventListener("runs", async () => {
      const had = state.run;
      await loadRuns();
      if (!had && state.run) selectRun(state.run);
    });
    source.onerror = () => {
      dropped = true;
      $("live").classList.remove("on"); state.live = false;
      text($("live-text"), "server not answering: showing the last data");
    };
  }

  // ------------------------------------------------------------------ start
  document.addEventListener("DOMContentLoaded", async () => {
    if (TOKEN) $("docs-link").href = "docs?token=" + encodeURIComponent(TOKEN);
    if (EMBEDDED) $("docs-link").hidden = true;
    $("run-select").addEventListener("change", (e) => selectRun(e.target.value));
    $("expand-select").addEventListener("change", (e) => setExpand(e.target.value));
    $("set-select").addEventListener("change", (e) => setFilter(e.target.value));
    $("reset-zoom").addEventListener("click", () => { state.view = null; state.selectedSample = null; loadTimeline(); });
    $("compare-go").addEventListener("click", compareRuns);
    $("gpu-kernel-rank").addEventListener("change", drawGpuKernels);
    bindRankFilter("timeline", (list, auto) => { state.timelineRanks = list; state.timelineAuto = auto; loadTimeline(); });
    bindRankFilter("stragglers", (list) => { state.heatmapRanks = list; drawWaitHeatmap(breakdownData); });
    connectLive();
    await loadRuns();
    await selectRun(state.run);
  });
})();
