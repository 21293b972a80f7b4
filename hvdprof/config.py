"""Every ``HVDPROF_*`` environment variable, parsed once into one typed object.

Horovod scatters its configuration across C++ parsers; here the registry below is the
single source of truth: the runtime, the launcher, the table in docs/environment.md and the tests all
read names, defaults and meanings from it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from hvdprof.errors import ConfigError

KiB = 1024
MiB = 1024 * KiB


def _int_range(minimum: int | None, maximum: int | None) -> str:
    lower = f">= {minimum}" if minimum is not None else ""
    upper = f"<= {maximum}" if maximum is not None else ""
    bounds = " and ".join(b for b in (lower, upper) if b)
    return "an integer" + (f" {bounds}" if bounds else "")


def _parse_int(value: str, *, minimum: int | None = None, maximum: int | None = None) -> int:
    text = value.strip().replace("_", "")
    try:
        parsed = int(text, 0)
    except ValueError:
        raise ValueError(_int_range(minimum, maximum)) from None
    if (minimum is not None and parsed < minimum) or (maximum is not None and parsed > maximum):
        raise ValueError(_int_range(minimum, maximum))
    return parsed


def _int(minimum: int | None = None, maximum: int | None = None) -> Callable[[str], int]:
    """An integer parser with its range: every value a rank can be given is one it can use
    (2**31 in-flight buffers or a 10**30-byte fusion buffer fail deep in a rank)."""

    def parse(value: str) -> int:
        return _parse_int(value, minimum=minimum, maximum=maximum)

    parse.accepts = _int_range(minimum, maximum)  # type: ignore[attr-defined]
    return parse


def _float(
    minimum: float | None = None, exclusive: bool = False, maximum: float | None = None
) -> Callable[[str], float]:
    """A number parser with its range (finite always: 1e308 seconds overflow every
    timer and sleep that receives them)."""
    lower = f"{'>' if exclusive else '>='} {_num(minimum)}" if minimum is not None else ""
    upper = f"<= {_num(maximum)}" if maximum is not None else ""
    bound = " " + " and ".join(b for b in (lower, upper) if b) if lower or upper else ""

    def parse(value: str) -> float:
        try:
            parsed = float(value.strip())
        except ValueError:
            raise ValueError("a number" + bound) from None
        if parsed != parsed or parsed in (float("inf"), float("-inf")):
            raise ValueError("a finite number" + bound)
        if minimum is not None and (parsed < minimum or (exclusive and parsed == minimum)):
            raise ValueError("a number" + bound)
        if maximum is not None and parsed > maximum:
            raise ValueError("a number" + bound)
        return parsed

    parse.accepts = "a number" + bound  # type: ignore[attr-defined]
    return parse


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


#: bounds shared by several variables: a rank number (a 32-bit int everywhere it goes),
#: a timeout (30 days: any wait or timer takes it), a size in bytes (1 TiB)
_RANK_MAX = 2**31 - 1
_SECONDS_MAX = 30 * 24 * 3600.0
_BYTES_MAX = 1 << 40


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


def _bool(value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError("one of 1/0, true/false, yes/no, on/off")


_bool.accepts = "one of 1/0, true/false, yes/no, on/off"  # type: ignore[attr-defined]


def _str(value: str) -> str:
    return value


_str.accepts = "a string"  # type: ignore[attr-defined]


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        text = value.strip().lower()
        if text not in choices:
            raise ValueError("one of " + ", ".join(choices))
        return text

    parse.accepts = "one of " + ", ".join(choices)  # type: ignore[attr-defined]
    return parse


def _step_window(value: str) -> tuple[int, int] | None:
    """``START-END`` (inclusive, in runtime steps) or empty for no window."""
    text = value.strip()
    if not text:
        return None
    start, sep, end = text.partition("-")
    try:
        lo, hi = int(start), int(end)
    except ValueError:
        raise ValueError("START-END with integers, e.g. 100-120") from None
    if not sep or lo < 0 or hi < lo or hi > _STEP_MAX:
        raise ValueError("START-END with 0 <= START <= END, e.g. 100-120")
    return (lo, hi)


#: the last step a window may name (a step counter is a 64-bit int in the timelines)
_STEP_MAX = 2**63 - 1
_step_window.accepts = "START-END with 0 <= START <= END, e.g. 100-120"  # type: ignore[attr-defined]


@dataclass(frozen=True)
class EnvVar:
    """One documented environment variable: its name, parser, default and meaning."""

    name: str
    attr: str
    parse: Callable[[str], Any]
    default: Any
    doc: str
    default_text: str | None = None

    @property
    def accepts(self) -> str:
        return getattr(self.parse, "accepts", "a valid value")


ENV_VARS: tuple[EnvVar, ...] = (
    # --- topology, set by `hvdprof run` (or read from torchrun/MPI variables) ---
    EnvVar(
        "HVDPROF_RANK",
        "rank",
        _int(0, _RANK_MAX - 1),
        None,
        "Global rank of this process. Set by `hvdprof run`.",
        "unset (single process)",
    ),
    EnvVar(
        "HVDPROF_SIZE",
        "size",
        _int(1, _RANK_MAX),
        None,
        "Number of ranks. Set by `hvdprof run`.",
        "unset (1)",
    ),
    EnvVar(
        "HVDPROF_LOCAL_RANK",
        "local_rank",
        _int(0, _RANK_MAX - 1),
        None,
        "Rank within this host. Set by `hvdprof run`; in a job of several ranks, every rank's host name decides it.",
        "= rank",
    ),
    EnvVar(
        "HVDPROF_LOCAL_SIZE",
        "local_size",
        _int(1, _RANK_MAX),
        None,
        "Ranks on this host. Set by `hvdprof run`; in a job of several ranks, every rank's host name decides it.",
        "= size",
    ),
    EnvVar(
        "HVDPROF_CROSS_RANK",
        "cross_rank",
        _int(0, _RANK_MAX - 1),
        None,
        "Index of this host. Set by `hvdprof run`; in a job of several ranks, every rank's host name decides it.",
        "0",
    ),
    EnvVar(
        "HVDPROF_CROSS_SIZE",
        "cross_size",
        _int(1, _RANK_MAX),
        None,
        "Number of hosts. Set by `hvdprof run`; in a job of several ranks, every rank's host name decides it.",
        "1",
    ),
    EnvVar(
        "HVDPROF_CONTROLLER_ADDR",
        "controller_addr",
        _str,
        "127.0.0.1",
        "Address of the rendezvous store (hosted by rank 0).",
    ),
    EnvVar(
        "HVDPROF_CONTROLLER_PORT",
        "controller_port",
        _int(0, 65535),
        None,
        "Port of the rendezvous store. Set by `hvdprof run`; unset means a free port for a single process.",
        "unset",
    ),
    EnvVar(
        "HVDPROF_ELASTIC_STORE",
        "elastic_store",
        _str,
        "",
        "HOST:PORT of the elastic launcher's store. Set by `hvdprof run --min-np/--max-np`; "
        "when set, each init() joins the newest generation of the job that names this worker.",
    ),
    EnvVar(
        "HVDPROF_ELASTIC_WORKER",
        "elastic_worker",
        _str,
        "",
        "This worker's id in an elastic job. Set by `hvdprof run --min-np/--max-np`.",
    ),
    EnvVar(
        "HVDPROF_ELASTIC_TIMEOUT_SECONDS",
        "elastic_timeout_s",
        _float(0.001, maximum=_SECONDS_MAX),
        120.0,
        "Longest an elastic worker waits for a generation of the job that includes it.",
    ),
    EnvVar(
        "HVDPROF_START_TIMEOUT_SECONDS",
        "start_timeout_s",
        _float(0.001, maximum=_SECONDS_MAX),
        60.0,
        "How long `init` waits for every rank to join the rendezvous.",
    ),
    # --- the cycle ---
    EnvVar(
        "HVDPROF_CYCLE_TIME",
        "cycle_time_ms",
        _float(0, maximum=60_000),
        5.0,
        "Milliseconds between negotiation cycles of the background thread while the "
        "training thread computes (a thread that waits on an op is negotiated for at once). "
        "Horovod's default is 1 ms (5 ms before 0.21).",
    ),
    EnvVar(
        "HVDPROF_FUSION_THRESHOLD",
        "fusion_threshold_bytes",
        _int(0, _BYTES_MAX),
        4 * MiB,
        "Largest fusion buffer, in bytes. 0 disables fusion.",
        "4194304 (4 MiB)",
    ),
    EnvVar(
        "HVDPROF_BUCKET_BYTES",
        "bucket_bytes",
        _int(0, _BYTES_MAX),
        4 * MiB,
        "`DistributedOptimizer` reduces gradients in buckets of about this many bytes, "
        "each one flat tensor (as DDP's reducer does): a few Python steps per bucket "
        "instead of per gradient. Results are bit-identical. A gradient this large is "
        "reduced alone, under its own name. 0: one allreduce per gradient, named after "
        "its parameter (Horovod's behaviour). An optimizer built with `groups=` uses "
        "those groups instead.",
        "4194304 (4 MiB)",
    ),
    EnvVar(
        "HVDPROF_SMALL_ALLREDUCE_BYTES",
        "small_allreduce_bytes",
        _int(0, _BYTES_MAX),
        256 * KiB,
        "Allreduce buffers up to this size go over the control channel's sockets, which "
        "answer in tens of microseconds where a backend call costs a millisecond or more "
        "on busy CPUs. 0 sends everything to the backend.",
        "262144 (256 KiB)",
    ),
    EnvVar(
        "HVDPROF_MAX_INFLIGHT",
        "max_inflight",
        _int(1, 256),
        4,
        "Fusion buffers reduced concurrently: packing the next overlaps reducing the previous.",
    ),
    EnvVar(
        "HVDPROF_CACHE_CAPACITY",
        "cache_capacity",
        _int(0, 1 << 24),
        4096,
        "Entries in the response cache (tensor names negotiated on the fast path). 0 disables it.",
    ),
    EnvVar(
        "HVDPROF_BACKEND",
        "backend",
        _choice("auto", "gloo", "shm", "mpi"),
        "auto",
        "Collective backend for CPU tensors. `auto`: allreduce through shared memory when "
        "every rank is on one host (it falls back to the other engine when a rank cannot map "
        "the others' segments), everything else through MPI when an MPI launcher started the "
        "job and mpi4py is installed, else through Gloo. `gloo`: everything through Gloo. "
        "`shm`: like `auto`, but a rank that cannot use shared memory is an error at init. "
        "`mpi`: everything through MPI (mpi4py; the job started by mpirun, mpiexec or srun).",
    ),
    EnvVar(
        "HVDPROF_HOSTNAME",
        "hostname",
        _str,
        "",
        "This rank's host name, for tests and for machines whose names are not unique "
        "(local and cross ranks, shared memory and the timeline go by it). A comma-separated "
        "list is indexed by rank: `a,a,b,b` makes a two-host job on one machine.",
        "the machine's name",
    ),
    EnvVar(
        "HVDPROF_COLLECTIVE_TIMEOUT_SECONDS",
        "collective_timeout_s",
        _float(0.001, maximum=_SECONDS_MAX),
        60.0,
        "Bound on one collective: when a peer rank dies, survivors raise within about this time.",
    ),
    EnvVar(
        "HVDPROF_CONTROL_FANOUT",
        "control_fanout",
        _int(0, _RANK_MAX),
        0,
        "Topology of the control messages (each cycle's exchange, the coordinator's gather "
        "and broadcast). 0: a star, every rank talks to rank 0, which makes 2 (N-1) socket "
        "calls a cycle. k >= 1: a tree in which each rank relays for at most k others (1: "
        "a chain), so rank 0 makes 2k calls and each message crosses about log_k N hops; "
        "k >= N - 1 is the star again. Every rank must have the same value. See "
        "docs/how-it-works.md (the control plane) for when a tree pays.",
        "0 (the star)",
    ),
    EnvVar(
        "HVDPROF_STALL_CHECK_TIME_SECONDS",
        "stall_check_time_s",
        _float(0, maximum=_SECONDS_MAX),
        60.0,
        "When some ranks have submitted a tensor and others have not for this long, rank 0 "
        "asks the late ranks for their Python stack and warns, every this many seconds, "
        "where each is (in another collective: a mismatch; outside any: slow); a deadlock "
        "(every rank blocked waiting on names another blocked rank has not submitted) is "
        "an error on every rank well within it. 0 disables both checks.",
    ),
    EnvVar(
        "HVDPROF_IDLE_SLEEP_MAX_SECONDS",
        "idle_sleep_max_s",
        _float(0.001, maximum=_SECONDS_MAX),
        1.0,
        "Once a cycle finds every rank idle (between steps, or a job that stopped "
        "submitting), the ranks stop cycling and sleep on their control sockets (and likewise "
        "while they wait on a late rank's submission, waking at least every 0.25 s for the "
        "stall inspector): the first "
        "rank with work wakes the others at once, and a rank that dies ends the sleep at "
        "once. This only bounds a sleep that nothing else ends (an idle job then costs one "
        "cycle per this many seconds). Socket channels only: under MPI an idle job cycles "
        "every 10 ms.",
    ),
    EnvVar(
        "HVDPROF_WAKE_ON_SUBMIT_BYTES",
        "wake_on_submit_bytes",
        _int(-1, _BYTES_MAX),
        -1,
        "While every rank sleeps (nothing pending anywhere), a new op on CPU tensors of at "
        "most this many bytes waits in its rank's queue until a thread of that rank waits "
        "on an op or polls one (or another rank wakes the job): it then runs with the "
        "step's others once `step()` waits, instead of waking every rank mid-backward, "
        "which on cores the training uses cost more than the overlap saved (4 ms a step on "
        "a 198-tensor transformer, 2 ranks on 2 cores). A larger op wakes the job at once; "
        "so does any op on a GPU, and any op while a rank waits on a peer. -1 (auto): every "
        "CPU op waits where the job is on one host whose cores the ranks' torch threads "
        "fill (ranks x `torch.get_num_threads()` >= usable cores), else ops up to 256 KiB. "
        "0: every op wakes the job at once. A waiting op's NEGOTIATE slice on the timeline "
        "begins when the cycle takes it (its readiness mark stays at its submission); see "
        "docs/how-it-works.md.",
        "-1",
    ),
    EnvVar(
        "HVDPROF_STALL_SHUTDOWN_TIME_SECONDS",
        "stall_shutdown_time_s",
        _float(0, maximum=_SECONDS_MAX),
        0.0,
        "End the job when a stall lasts this long: under `hvdprof run` every rank prints "
        "the stall line and exits (code 1) and so does the launcher; elsewhere the late "
        "ops raise StallAbortError. 0 never ends it: a rank may be away for long on "
        "purpose (rank 0 alone evaluating or checkpointing, a first download), no single "
        "time tells slow from stuck, and the warnings already say where each rank is.",
        "0 (never)",
    ),
    EnvVar(
        "HVDPROF_CHECK_DIVERGENCE",
        "check_divergence",
        _int(0, _RANK_MAX),
        0,
        "Every N optimizer steps, `DistributedOptimizer` compares bit-exact checksums of "
        "the parameters and of the averaged gradients across ranks (one small allgather); "
        "the first step where ranks differ is reported on every rank with the first "
        "differing parameters' names, and goes on the timeline (`DIVERGENCE`). Off by "
        "default: a check costs about a full pass over the model's weights.",
        "0 (off)",
    ),
    EnvVar(
        "HVDPROF_DYNAMIC_PROCESS_SETS",
        "dynamic_process_sets",
        _bool,
        False,
        "Allow `hvd.add_process_set`/`remove_process_set` after `init()` (Horovod's "
        "`HOROVOD_DYNAMIC_PROCESS_SETS`). Off, as in Horovod: sets then come from "
        "`init(process_sets=[...])` only.",
    ),
    EnvVar(
        "HVDPROF_GC_FREEZE",
        "gc_freeze",
        _bool,
        True,
        "At init, freeze the objects that exist (torch's import-time objects) out of Python's cyclic GC: otherwise every full collection rescans them, costing tens of ms per step of small ops.",
    ),
    EnvVar(
        "HVDPROF_THREADS_DEFAULT",
        "threads_default",
        _bool,
        True,
        "`hvdprof run`: when neither `OMP_NUM_THREADS` nor `MKL_NUM_THREADS` is set, give "
        "each rank `OMP_NUM_THREADS` = max(1, cores // ranks), as torchrun does, and say so "
        "once. 0 leaves them unset, as `mpirun` and `srun` do.",
    ),
    EnvVar(
        "HVDPROF_LOG_LEVEL",
        "log_level",
        _choice("debug", "info", "warning", "error"),
        "warning",
        "Level of hvdprof's own log messages (to stderr).",
    ),
    # --- timeline ---
    EnvVar(
        "HVDPROF_TIMELINE",
        "timeline_dir",
        _str,
        "",
        "Directory for per-rank Chrome-trace timelines. Empty disables the timeline.",
        "unset (off)",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_MARK_CYCLES",
        "timeline_mark_cycles",
        _bool,
        False,
        "Add a marker for every negotiation cycle to the timeline.",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_STEPS",
        "timeline_steps",
        _step_window,
        None,
        "Record only runtime steps START-END (inclusive).",
        "unset (all)",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_SAMPLE_EVERY",
        "timeline_sample_every",
        _int(1, _RANK_MAX),
        1,
        "Record one runtime step in N.",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_GZIP",
        "timeline_gzip",
        _bool,
        False,
        "Write `.json.gz` instead of `.json`.",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_QUEUE_SIZE",
        "timeline_queue_size",
        _int(1, 1 << 30),
        200_000,
        "Events a rank holds back for its timeline writer thread, where no renderer "
        "process could start (the renderer process reads a spool on disk and never makes "
        "a rank wait or drop); beyond this, `HVDPROF_TIMELINE_WHEN_FULL` decides.",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_WHEN_FULL",
        "timeline_when_full",
        _choice("wait", "drop"),
        "wait",
        "When a rank rendering on its own thread holds `HVDPROF_TIMELINE_QUEUE_SIZE` "
        "events its writer has not taken: "
        "`wait` (lossless: the recording thread waits for room, slowing the job instead, "
        "and the renderer leaves its background priority; events are dropped only if it "
        "takes nothing for `HVDPROF_TIMELINE_STUCK_SECONDS`) or `drop` (never slow the "
        "job: drop and count). Drops are "
        "said on stderr when they start and in total at the end, and lead `hvdprof analyze`.",
    ),
    EnvVar(
        "HVDPROF_TIMELINE_STUCK_SECONDS",
        "timeline_stuck_s",
        _float(0.001, maximum=_SECONDS_MAX),
        2.0,
        "With `HVDPROF_TIMELINE_WHEN_FULL=wait`: how long the recording thread waits for a "
        "renderer that takes nothing at all (stopped, hung) before it drops instead, so a "
        "broken renderer never hangs the training.",
    ),
    EnvVar(
        "HVDPROF_CLOCK_SYNC_INTERVAL_SECONDS",
        "clock_sync_interval_s",
        _float(0, maximum=_SECONDS_MAX),
        60.0,
        "How often ranks re-estimate their clock offset to rank 0 while the timeline is on. 0: only at start.",
    ),
    EnvVar(
        "HVDPROF_CLOCK_SKEW_US",
        "clock_skew_us",
        _float(-3.6e9, maximum=3.6e9),
        0.0,
        "Testing aid: add this many microseconds to this rank's timeline clock, to prove the offset correction.",
    ),
    EnvVar(
        "HVDPROF_DISABLE_NVTX",
        "disable_nvtx",
        _bool,
        False,
        "Turn off the NVTX ranges that mirror runtime phases.",
    ),
    # --- device path (issue 28) ---
    EnvVar(
        "HVDPROF_DEVICE_PATH_ON_CPU",
        "device_path_on_cpu",
        _bool,
        False,
        "Send CPU tensors through the GPU (NCCL) code path, with a second Gloo group and "
        "host events standing in for NCCL and CUDA events: tests that path without a GPU.",
    ),
    # --- autotune ---
    EnvVar(
        "HVDPROF_AUTOTUNE",
        "autotune",
        _bool,
        False,
        "Tune cycle time, the response cache and (through Gloo) the fusion threshold live, by paired comparisons with the starting configuration.",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_LOG",
        "autotune_log",
        _str,
        "",
        "CSV file with one row per scored autotune sample.",
        "unset",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_WARM_START",
        "autotune_warm_start",
        _str,
        "",
        "An earlier autotune log whose recommendation is measured first.",
        "unset",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_WARMUP_SAMPLES",
        "autotune_warmup_samples",
        _int(0, 1_000_000),
        3,
        "Samples discarded before tuning starts (the job warming up).",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE",
        "autotune_steps_per_sample",
        _int(1, 1_000_000),
        3,
        "Runtime steps measured in each autotune window at first (scored by the median of up to 5 sub-windows); windows alternate between the incumbent and a candidate, and grow when steps are short or the job's noise needs it.",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES",
        "autotune_max_samples",
        _int(1, 10_000),
        56,
        "The round's budget: this many windows of HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE steps, each plus two discarded steps (windows grown to the job's noise leave fewer); the last 40% races the finalists against the starting configuration.",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        "autotune_gp_noise",
        _float(0, maximum=1e6),
        0.3,
        "Relative noise of one window's score assumed until measured (0.3 = about +-30%).",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_CONTINUOUS",
        "autotune_continuous",
        _bool,
        True,
        "After converging, keep watching throughput and re-open tuning when it drifts.",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_DRIFT_FRACTION",
        "autotune_drift_fraction",
        _float(0, exclusive=True, maximum=1e6),
        0.2,
        "Relative throughput change that counts as drift in continuous mode.",
    ),
    EnvVar(
        "HVDPROF_AUTOTUNE_DRIFT_SAMPLES",
        "autotune_drift_samples",
        _int(1, 1_000_000),
        5,
        "Consecutive drifted samples before tuning re-opens.",
    ),
    # --- reading traces (analyze, diff, the dashboard): what one input file may cost ---
    EnvVar(
        "HVDPROF_READ_MAX_INFLATED_BYTES",
        "read_max_inflated_bytes",
        _int(1, 1 << 50),
        4 << 30,
        "Largest size one compressed (`.gz`) trace may inflate to when read; past it the file is a listed problem (read up to there, or not at all for a Kineto trace).",
        "4294967296 (4 GiB)",
    ),
    EnvVar(
        "HVDPROF_READ_MAX_INFLATE_RATIO",
        "read_max_inflate_ratio",
        _float(1, maximum=1e9),
        100.0,
        "Largest ratio of inflated to compressed bytes of a `.gz` trace past its first 32 MiB (real traces: 10-30); past it the file is a listed problem, as above.",
    ),
    EnvVar(
        "HVDPROF_READ_MAX_RANKS",
        "read_max_ranks",
        _int(1, 1 << 24),
        16384,
        "Largest world size a trace may claim: a rank number or world size past it (or a Kineto rank past its own world size) is a listed problem and the file is read as another rank.",
    ),
    EnvVar(
        "HVDPROF_DASHBOARD_PARSE_MEMORY",
        "dashboard_parse_memory",
        _int(0, 1 << 50),
        4 << 30,
        "Bytes of memory by which the process in which the dashboard parses a run may grow (`RLIMIT_AS`, Linux); a run whose parse needs more is a notice on that run, never an error of the server. 0: parse in the server's own process, unlimited.",
        "4294967296 (4 GiB)",
    ),
    # --- plug-ins (analyze, diff, the dashboard): see docs/analysis.md ---
    EnvVar(
        "HVDPROF_ANALYSES",
        "analysis_plugins",
        _str,
        "",
        "Analyses added as plug-ins: comma-separated module names importable on `PYTHONPATH`, each declaring `ANALYSIS = Analysis(...)` (besides installed packages' entry points, group `hvdprof.analyses`). They come after the built-in analyses in `analyze`, its JSON, the API and the page.",
    ),
    EnvVar(
        "HVDPROF_FORMATS",
        "format_plugins",
        _str,
        "",
        "Trace formats added as plug-ins: comma-separated module names, each declaring `FORMAT = <a TraceFormat>` (besides entry points, group `hvdprof.formats`); asked after the built-in formats.",
    ),
)

_BY_NAME = {var.name: var for var in ENV_VARS}
_BY_ATTR = {var.attr: var for var in ENV_VARS}


def name_of(attr: str) -> str:
    """The ``HVDPROF_*`` variable that sets ``Config.<attr>``: code names variables
    through this (KeyError for an unknown attribute), so the registry above is the one
    place that spells them."""
    return _BY_ATTR[attr].name


#: ``HOROVOD_TIMELINE`` value: record nothing until ``start_timeline`` (Horovod's word)
HOROVOD_TIMELINE_DYNAMIC = "DYNAMIC"


def horovod_timeline_paths(value: str) -> tuple[str, str]:
    """(directory, file) for Horovod's ``HOROVOD_TIMELINE``, which names one file.

    Every rank writes its own file, so the ranks' directory goes beside it:
    ``/tmp/timeline.json`` -> ``/tmp/timeline.ranks/``. The file itself is rank 0's trace
    (a link to it) while the job runs, and ``hvdprof run`` replaces it with the merged
    trace of every rank when the job ends: a file that opens in Perfetto, as Horovod's.
    An existing directory is used as it is (no file).

    As in Horovod, an empty value means no timeline, and ``DYNAMIC`` means none until
    ``hvd.start_timeline(path)``: both give ``("", "")``.
    """
    if not value.strip() or value == HOROVOD_TIMELINE_DYNAMIC:
        return "", ""
    if os.path.isdir(value):
        return value, ""
    stem = value[: -len(".json")] if value.endswith(".json") else value
    return stem + ".ranks", value


def _horovod_log_level(value: str) -> str:
    levels = {"trace": "debug", "debug": "debug", "info": "info", "warning": "warning"}
    return levels.get(value.strip().lower(), "error")  # error, fatal


def _horovod_cpu_operations(value: str) -> str:
    if value.strip().lower() not in ("gloo", "mpi"):
        raise ValueError(f"HOROVOD_CPU_OPERATIONS={value!r}: hvdprof has gloo and mpi")
    return value.strip().lower()


def _horovod_disable(value: str) -> str:
    return "0" if _bool(value) else ""


#: Horovod's variables that hvdprof honours: (Horovod's name, ours, value translation).
#: Ours wins when both are set.
HOROVOD_NAMES: tuple[tuple[str, str, Callable[[str], str] | None], ...] = (
    ("HOROVOD_TIMELINE", "HVDPROF_TIMELINE", lambda v: horovod_timeline_paths(v)[0]),
    ("HOROVOD_TIMELINE_MARK_CYCLES", "HVDPROF_TIMELINE_MARK_CYCLES", None),
    ("HOROVOD_AUTOTUNE", "HVDPROF_AUTOTUNE", None),
    ("HOROVOD_AUTOTUNE_LOG", "HVDPROF_AUTOTUNE_LOG", None),
    ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "HVDPROF_AUTOTUNE_WARMUP_SAMPLES", None),
    ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "HVDPROF_AUTOTUNE_STEPS_PER_SAMPLE", None),
    ("HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "HVDPROF_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", None),
    (
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        "HVDPROF_AUTOTUNE_GAUSSIAN_PROCESS_NOISE",
        None,
    ),
    ("HOROVOD_FUSION_THRESHOLD", "HVDPROF_FUSION_THRESHOLD", None),
    ("HOROVOD_DYNAMIC_PROCESS_SETS", "HVDPROF_DYNAMIC_PROCESS_SETS", None),
    ("HOROVOD_CYCLE_TIME", "HVDPROF_CYCLE_TIME", None),
    ("HOROVOD_CACHE_CAPACITY", "HVDPROF_CACHE_CAPACITY", None),
    ("HOROVOD_STALL_CHECK_TIME_SECONDS", "HVDPROF_STALL_CHECK_TIME_SECONDS", None),
    ("HOROVOD_STALL_CHECK_DISABLE", "HVDPROF_STALL_CHECK_TIME_SECONDS", _horovod_disable),
    ("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "HVDPROF_STALL_SHUTDOWN_TIME_SECONDS", None),
    ("HOROVOD_LOG_LEVEL", "HVDPROF_LOG_LEVEL", _horovod_log_level),
    ("HOROVOD_CPU_OPERATIONS", "HVDPROF_BACKEND", _horovod_cpu_operations),
)


def horovod_settings(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """``{HVDPROF name: (value, Horovod name)}`` for the Horovod variables set in
    ``environ`` whose HVDPROF counterpart is not set (ours wins). A value Horovod would
    take but hvdprof cannot is a ConfigError naming both variables."""
    out: dict[str, tuple[str, str]] = {}
    for horovod, ours, translate in HOROVOD_NAMES:
        raw = environ.get(horovod)
        if raw is None or ours in environ or ours in out:
            continue
        try:
            value = translate(raw) if translate is not None else raw
        except ValueError as exc:
            raise ConfigError(f"{horovod}={raw!r} cannot be honoured: {exc}") from None
        if value != "":
            out[ours] = (value, horovod)
    return out


def horovod_table() -> str:
    """The table of the Horovod variables hvdprof honours (docs/running.md)."""
    rows = ["| Horovod's variable | sets | note |", "|---|---|---|"]
    notes = {
        "HOROVOD_TIMELINE": "a file: the ranks' directory goes beside it "
        "(`t.json` -> `t.ranks/`); the file is rank 0's trace, then the merged one. "
        "Empty: off; `DYNAMIC`: off until `hvd.start_timeline(path)`; a path that cannot "
        "be written: one warning, and the job trains without a timeline",
        "HOROVOD_STALL_CHECK_DISABLE": "1 sets the check time to 0 (off)",
        "HOROVOD_LOG_LEVEL": "trace/debug -> debug, fatal -> error",
        "HOROVOD_CPU_OPERATIONS": "gloo or mpi (ccl is refused)",
    }
    for horovod, ours, _ in HOROVOD_NAMES:
        rows.append(f"| `{horovod}` | `{ours}` | {notes.get(horovod, 'same value')} |")
    return "\n".join(rows)


@dataclass(frozen=True)
class Config:
    """The whole configuration, read once at ``init`` and handed to every component."""

    rank: int | None = None
    size: int | None = None
    local_rank: int | None = None
    local_size: int | None = None
    cross_rank: int | None = None
    cross_size: int | None = None
    controller_addr: str = "127.0.0.1"
    controller_port: int | None = None
    elastic_store: str = ""
    elastic_worker: str = ""
    elastic_timeout_s: float = 120.0
    start_timeout_s: float = 60.0
    cycle_time_ms: float = 5.0
    fusion_threshold_bytes: int = 4 * MiB
    small_allreduce_bytes: int = 256 * KiB
    bucket_bytes: int = 4 * MiB
    max_inflight: int = 4
    cache_capacity: int = 4096
    backend: str = "auto"
    hostname: str = ""
    collective_timeout_s: float = 60.0
    control_fanout: int = 0
    stall_check_time_s: float = 60.0
    stall_shutdown_time_s: float = 0.0
    idle_sleep_max_s: float = 1.0
    wake_on_submit_bytes: int = -1
    dynamic_process_sets: bool = False
    gc_freeze: bool = True
    threads_default: bool = True
    log_level: str = "warning"
    timeline_dir: str = ""
    timeline_mark_cycles: bool = False
    timeline_steps: tuple[int, int] | None = None
    timeline_sample_every: int = 1
    timeline_gzip: bool = False
    timeline_queue_size: int = 200_000
    timeline_when_full: str = "wait"
    timeline_stuck_s: float = 2.0
    clock_sync_interval_s: float = 60.0
    clock_skew_us: float = 0.0
    disable_nvtx: bool = False
    device_path_on_cpu: bool = False
    check_divergence: int = 0
    autotune: bool = False
    autotune_log: str = ""
    autotune_warm_start: str = ""
    autotune_warmup_samples: int = 3
    autotune_steps_per_sample: int = 3
    autotune_max_samples: int = 56
    autotune_gp_noise: float = 0.3
    autotune_continuous: bool = True
    autotune_drift_fraction: float = 0.2
    autotune_drift_samples: int = 5
    read_max_inflated_bytes: int = 4 << 30
    read_max_inflate_ratio: float = 100.0
    read_max_ranks: int = 16384
    dashboard_parse_memory: int = 4 << 30
    analysis_plugins: str = ""
    format_plugins: str = ""
    #: names of the HVDPROF_* variables present in the environment (the autotuner
    #: leaves these out of its search).
    explicitly_set: frozenset[str] = field(default_factory=frozenset)
    #: the file ``HOROVOD_TIMELINE`` named (rank 0 links it to its trace), else ""
    horovod_timeline_file: str = ""
    #: ``HOROVOD_TIMELINE``'s value when it set ``timeline_dir``, else "": a timeline
    #: that cannot be written is then a warning and the job trains on, as in Horovod
    horovod_timeline: str = ""

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Config:
        """Parse every ``HVDPROF_*`` variable; a malformed one is a ConfigError naming it."""
        env = os.environ if environ is None else environ
        horovod = horovod_settings(env)
        if horovod:
            env = {**env, **{name: value for name, (value, _) in horovod.items()}}
        values: dict[str, Any] = {}
        present = []
        for var in ENV_VARS:
            raw = env.get(var.name)
            if raw is None:
                continue
            present.append(var.name)
            try:
                values[var.attr] = var.parse(raw)
            except ValueError as exc:
                given = (
                    f"{horovod[var.name][1]} (as {var.name})" if var.name in horovod else var.name
                )
                raise ConfigError(
                    f"{given}={raw!r} is malformed: it accepts {exc}. ({var.doc})"
                ) from None
        unknown = sorted(k for k in env if k.startswith("HVDPROF_") and k not in _BY_NAME)
        if unknown:
            import logging

            logging.getLogger("hvdprof").warning(
                "ignoring unknown environment variable(s): %s", ", ".join(unknown)
            )
        timeline_file = horovod_timeline = ""
        if "HVDPROF_TIMELINE" in horovod:
            horovod_timeline = env.get("HOROVOD_TIMELINE", "")
            timeline_file = horovod_timeline_paths(horovod_timeline)[1]
        return cls(
            **values,
            explicitly_set=frozenset(present),
            horovod_timeline_file=timeline_file,
            horovod_timeline=horovod_timeline,
        )

    def replace(self, **changes: Any) -> Config:
        return dataclasses.replace(self, **changes)


def timeline_path_problem(path: str) -> str | None:
    """Why ``path`` cannot be the timeline directory (one phrase), or None when it can.

    Every rank writes ``rank.<r>.json`` and its manifest into the directory, so a path
    that is a file (Horovod's ``HOROVOD_TIMELINE`` names a file) cannot work. Checked by
    ``hvdprof run`` before any rank starts, and by every rank when it opens the timeline.
    """
    if not path:
        return None
    target = os.path.abspath(path)
    if os.path.exists(target) and not os.path.isdir(target):
        return (
            f"the timeline path {path!r} is a file; it must be a directory "
            "(every rank writes rank.<r>.json into it)"
        )
    parent = os.path.dirname(target)
    while parent and not os.path.exists(parent) and parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
    if os.path.exists(parent) and not os.path.isdir(parent):
        return f"the timeline directory {path!r} cannot be created: {parent!r} is a file"
    return None


def env_var(name: str) -> EnvVar:
    """The registry entry for ``name`` (KeyError for a name we do not define)."""
    return _BY_NAME[name]


def markdown_table() -> str:
    """The table of environment variables in docs/environment.md, generated from the registry."""
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for var in ENV_VARS:
        default = var.default_text if var.default_text is not None else _default_text(var.default)
        rows.append(f"| `{var.name}` | {default} | {var.doc} |")
    return "\n".join(rows)


def _default_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if value is None or value == "":
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)
