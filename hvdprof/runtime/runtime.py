"""The process-wide runtime: rendezvous, process groups, the cycle, and the submit API.

Front ends (``hvdprof.torch``) call ``submit`` with tensors and get a ``Handle``; nothing
else crosses from the user's thread to the cycle thread.
"""

from __future__ import annotations

import atexit
import contextlib
import datetime
import gc
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from hvdprof.common import activities as act
from hvdprof.common import timebase
from hvdprof.common.records import TunableParams
from hvdprof.config import Config
from hvdprof.errors import ConfigError, HvdprofError, NotInitializedError
from hvdprof.runtime import environment, handles, stacks
from hvdprof.runtime.backends.gloo import GlooBackend
from hvdprof.runtime.backends.shm import (
    SHM_DIR,
    SharedMemoryAllreduce,
    SharedMemoryUnavailable,
)
from hvdprof.runtime.backends.star import StarAllreduce
from hvdprof.runtime.control import ControlChannel
from hvdprof.runtime.cycle import CycleLoop
from hvdprof.runtime.device_path import open_device_path
from hvdprof.runtime.executor import Executor
from hvdprof.runtime.handles import Handle
from hvdprof.runtime.process_sets import ProcessSetTable
from hvdprof.runtime.requests import OpType, ReduceOp, Request, Signature
from hvdprof.runtime.threads import cores_filled, per_rank_threads

log = logging.getLogger("hvdprof")

#: exit code of every rank when HVDPROF_STALL_SHUTDOWN_TIME_SECONDS ends a job under
#: ``hvdprof run`` (the launcher exits with it)
STALL_EXIT_CODE = 1


@dataclass(frozen=True)
class Topology:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int


def resolve_topology(config: Config, environ: Any = None) -> Topology:
    """Ranks from ``hvdprof run``, else MPI, torchrun or Slurm (``environment.detect``),
    else a single process. ``Runtime`` then takes local and cross ranks from host names."""
    env = os.environ if environ is None else environ
    launch = environment.detect(env)
    rank = config.rank if config.rank is not None else launch.rank
    size = config.size if config.size is not None else launch.size
    if rank is None and size is None:
        rank, size = 0, 1
    if rank is None or size is None:
        raise ConfigError(
            "HVDPROF_RANK and HVDPROF_SIZE must be set together (start the job with `hvdprof run -np N`)"
        )
    if not 0 <= rank < size:
        raise ConfigError(f"HVDPROF_RANK={rank} is out of range for HVDPROF_SIZE={size}")
    local_rank = config.local_rank if config.local_rank is not None else launch.local_rank
    local_size = config.local_size if config.local_size is not None else launch.local_size
    local_rank = rank if local_rank is None else local_rank
    local_size = size if local_size is None else local_size
    cross_size = (
        config.cross_size if config.cross_size is not None else max(1, size // max(local_size, 1))
    )
    cross_rank = config.cross_rank if config.cross_rank is not None else rank // max(local_size, 1)
    return Topology(rank, size, local_rank, local_size, cross_rank, cross_size)


class NameAllocator:
    """Stable names for unnamed ops, so tracks and cache entries do not grow without bound.

    A name is the lowest slot free for that op kind; a slot is freed when the user
    synchronizes the handle. Both happen in program order on the user's thread, which is
    the same on every rank, so every rank picks the same names.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._used: dict[str, set[int]] = {}

    def allocate(self, kind: str) -> tuple[str, Any]:
        with self._lock:
            used = self._used.setdefault(kind, set())
            slot = 0
            while slot in used:
                slot += 1
            used.add(slot)

        def release() -> None:
            with self._lock:
                used.discard(slot)

        return f"{kind}.noname.{slot}", release


class Runtime:
    def __init__(self, config: Config) -> None:
        self.launch = environment.detect()
        config = environment.with_launcher_rendezvous(config, self.launch)
        self.config = config
        self.topology = resolve_topology(config)
        t = self.topology
        self.rank, self.size = t.rank, t.size
        stacks.install(self.rank)  # SIGUSR1 prints the stacks (before the rendezvous waits)
        self.host_name = environment.host_name(self.rank, config.hostname)
        self.data_engine = environment.data_backend(
            config.backend, self.launch, environment.mpi4py_installed()
        )
        self._names = NameAllocator()
        #: name -> its request, for every op submitted and not completed. A dict rather
        #: than a set under a lock: ``setdefault`` checks and claims a name in one atomic
        #: step, with no lock on the per-op path (a lock took 0.25 us of ~2 us per op)
        self._inflight: dict[str, Request] = {}
        self._retire = self._completed  # one bound method, not one per op
        self._store, self.control, self._data_pg = self._rendezvous()
        config = self.config  # (the MPI rendezvous may have chosen the store's port)
        t = self.topology  # (local and cross ranks now come from every rank's host name)
        if self.data_engine == "mpi":
            self.backend = self._data_pg
        else:
            self.backend = GlooBackend(self._data_pg, self.rank, self.size)
        self.executor = Executor(self.backend, self.rank, self.size)
        self.executor.retire = self._completed_batch
        # --- device path (issue 28): CUDA tensors through NCCL, on the same store
        self.device_path = open_device_path(
            config, self._store, self.rank, self.size, t.local_rank, self._gloo_group
        )
        self.executor.device = self.device_path
        # --- end device path
        if config.small_allreduce_bytes > 0 and self.size > 1:
            self.executor.small = StarAllreduce(self.control)
            self.executor.small_bytes = config.small_allreduce_bytes
        self.shm = self._open_shared_memory()
        self.executor.shm = self.shm
        #: what the timeline's manifest records about this job
        self.job: dict[str, object] = dict(
            launcher=self.launch.launcher,
            backend=self.data_engine,
            shared_memory=self.shm is not None,
            host=self.host_name,
            negotiates_on_wait=True,
        )
        params = TunableParams(
            fusion_threshold_bytes=config.fusion_threshold_bytes,
            cycle_time_ms=config.cycle_time_ms,
            cache_enabled=config.cache_capacity > 0,
        )
        self.cycle = CycleLoop(
            config,
            self.rank,
            self.size,
            self.control,
            self.executor,
            params,
        )
        self.process_sets = ProcessSetTable(self.size)
        self.cycle.sets = self.process_sets
        if self.cycle.coordinator is not None:
            self.cycle.coordinator.sets = self.process_sets
        self._set_groups: dict[int, Any] = {}  # set id -> its process group (members only)
        self.cycle.thread_share = per_rank_threads(t.local_size)
        if self.launch.launcher == environment.HVDPROF:
            self.cycle.stall_exit_code = STALL_EXIT_CODE
        if type(self.control).__name__ == "MpiControlChannel":  # MPI calls have no timeout
            self.cycle.on_fatal = _abort_mpi_job
        self.started_at = time.time()
        timebase.set_skew_us(config.clock_skew_us)
        self.timeline: Any = None
        self._setup_observers()
        self.wake_limit = wake_limit(config.wake_on_submit_bytes, t.local_size, hosts=t.cross_size)
        self.cycle.holds_ops = self.wake_limit != 0
        handles.on_block = self.nudge
        self.cycle.start()

    def _setup_observers(self) -> None:
        """Timeline and autotuner hang off the cycle; neither costs anything when off."""
        cfg = self.config
        from hvdprof.timeline.nvtx_ranges import PhaseRanges
        from hvdprof.timeline.session import TimelineSession

        self.timeline = TimelineSession(self)
        self.cycle.on_clock_samples = self.timeline.update_clock
        self.cycle.on_instant = self.timeline.add_instant
        phases = PhaseRanges.from_config(cfg)
        self.cycle.nvtx = phases
        self.executor.nvtx = phases
        if cfg.timeline_dir:
            self.sync_clock()
            self.timeline.open(cfg.timeline_dir, cfg.timeline_mark_cycles)
        self.autotuner: Any = None
        if cfg.autotune and self.rank == 0:
            from hvdprof.autotune.controller import AutotuneController

            self.autotuner = AutotuneController(
                cfg, self.cycle.params, self.rank, shared_memory=self.shm is not None
            )
            self.autotuner.on_sample = self.timeline.add_autotune_sample
            # First of the observers, ahead of any timeline sink (opened above, or later by
            # start_timeline): the cycle closes them in order, and the tuner's close lets
            # its worker hand every sample in hand to the timeline before the sink closes.
            # Closed after the sink, the samples of the job's last window or two reached
            # the log but not the timeline.
            self.cycle.observers.insert(0, self.autotuner)
            self.cycle.proposer = self.autotuner
            self.autotuner.on_proposal = self.cycle.wake.set

    # ---------------------------------------------------------------- set-up
    def _open_shared_memory(self) -> SharedMemoryAllreduce | None:
        """Allreduce through shared memory when every rank can map every rank's segment."""
        cfg = self.config
        if self.size == 1 or cfg.backend in ("gloo", "mpi"):
            return None
        if self.topology.cross_size > 1:  # segments are per host: none across hosts
            if cfg.backend == "shm":
                raise ConfigError(
                    f"hvdprof rank {self.rank}: HVDPROF_BACKEND=shm needs every rank on one "
                    f"host, but the ranks span {self.topology.cross_size} hosts: use "
                    "HVDPROF_BACKEND=auto (or mpi, gloo)"
                )
            return None
        try:
            return SharedMemoryAllreduce.open(self.control, cfg.fusion_threshold_bytes)
        except SharedMemoryUnavailable as exc:
            if cfg.backend == "shm":
                raise ConfigError(
                    f"HVDPROF_BACKEND=shm needs every rank on one host, with a writable "
                    f"{SHM_DIR}: {exc}"
                ) from None
            log.info("hvdprof: allreduce through Gloo, shared memory is not usable: %s", exc)
            return None

    def _rendezvous(self) -> tuple[Any, Any, Any]:
        if self.data_engine == "mpi" or (
            self.launch.is_mpi and self.size > 1 and environment.mpi4py_installed()
        ):
            return self._rendezvous_mpi()
        cfg = self.config
        port = cfg.controller_port
        if port is None:
            if self.size > 1:
                raise ConfigError(
                    "HVDPROF_CONTROLLER_PORT is not set for a multi-rank job: "
                    + environment.missing_rendezvous_hint(self.launch)
                )
            port = environment.free_port(True)
        try:
            root, generation = _rendezvous_store(cfg, port, self.rank, self.size)
        except Exception as exc:
            raise HvdprofError(
                f"hvdprof rank {self.rank}: rendezvous at {cfg.controller_addr}:{port} failed "
                f"within HVDPROF_START_TIMEOUT_SECONDS={cfg.start_timeout_s:g}: {_first_line(exc)}"
            ) from None
        # Every key of this incarnation lives under its own prefix: a rank whose previous
        # incarnation left addresses in the store can never read (and connect to) them.
        store = dist.PrefixStore(f"hvdprof/{self.launch.namespace}init{generation}/", root)
        op_timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
        try:
            self.set_hosts(environment.exchange_hosts(store, self.rank, self.size, self.host_name))
            control = ControlChannel.connect(
                self.rank,
                self.size,
                store,
                self._host(),
                cfg.start_timeout_s,
                cfg.collective_timeout_s,
                cfg.control_fanout,
            )
            data = self._gloo_group(store, "hvdprof/data/", op_timeout)
        except Exception as exc:
            raise HvdprofError(
                f"hvdprof rank {self.rank}: connecting to the other ranks failed: {_first_line(exc)}"
            ) from None
        return store, control, data

    def _rendezvous_mpi(self) -> tuple[Any, Any, Any]:
        """(store, control, data) for a job MPI started: control over MPI, and the data on
        MPI too (``HVDPROF_BACKEND=mpi``, or ``auto``) or on Gloo, whose store rank 0 opens
        on a port it announces over MPI, so no port needs to be configured either way."""
        from hvdprof.runtime.backends import mpi

        cfg = self.config
        if self.data_engine == "mpi":
            environment.check_mpi_launch(self.launch, self.size)
        control_comm, data_comm = mpi.open_world(self.rank, self.size, self.launch.launcher)
        self.set_hosts(control_comm.allgather(self.host_name))
        if self.data_engine == "mpi":
            return None, mpi.MpiControlChannel(control_comm), mpi.MpiBackend(data_comm)
        data_comm.Free()
        if cfg.controller_port is None:
            choice = None
            if self.rank == 0:
                local = self.topology.cross_size == 1
                host = "127.0.0.1" if local else socket.gethostname()
                choice = (host, environment.free_port(local))
            addr, port = control_comm.bcast(choice, root=0)
            cfg = self.config = cfg.replace(controller_addr=addr, controller_port=port)
        control = mpi.MpiControlChannel(control_comm)
        try:
            root, generation = _rendezvous_store(cfg, cfg.controller_port, self.rank, self.size)
            store = dist.PrefixStore(f"hvdprof/init{generation}/", root)
            timeout = datetime.timedelta(seconds=cfg.collective_timeout_s)
            data = self._gloo_group(store, "hvdprof/data/", timeout)
        except Exception as exc:
            raise HvdprofError(
                f"hvdprof rank {self.rank}: the Gloo rendezvous at {cfg.controller_addr}:"
                f"{cfg.controller_port} failed: {_first_line(exc)}"
            ) from None
        return store, control, data

    def set_hosts(self, hosts: list[str]) -> None:
        """Local and cross ranks from every rank's host name (whatever the launcher said)."""
        if self.size > 1:
            self.topology = Topology(
                self.rank, self.size, *environment.host_topology(hosts, self.rank)
            )

    def _host(self) -> str:
        """This rank's address for the others: loopback when the job is on one machine."""
        return "127.0.0.1" if self.topology.cross_size == 1 else socket.gethostname()

    def _gloo_group(
        self,
        store: Any,
        prefix: str,
        timeout: datetime.timedelta,
        rank: int | None = None,
        size: int | None = None,
    ) -> Any:
        options = dist.ProcessGroupGloo._Options()
        options._timeout = timeout
        options._devices = [dist.ProcessGroupGloo.create_device(hostname=self._host())]
        options._threads = max(2, self.config.max_inflight)
        return dist.ProcessGroupGloo(
            dist.PrefixStore(prefix, store),
            self.rank if rank is None else rank,
            self.size if size is None else size,
            options,
        )

    # ---------------------------------------------------------------- process sets
    def add_process_set(self, members: tuple[int, ...]) -> int:
        """Register a set on every rank (collective: every rank calls it, in one order)."""
        result: list[int] = []

        def command() -> None:
            set_id = self.process_sets.add(members)
            try:
                self._open_set(set_id, members)
            except BaseException:
                self.process_sets.remove(set_id)
                raise
            result.append(set_id)

        self.run_collectively(command)
        return result[0]

    def remove_process_set(self, set_id: int) -> bool:
        """Unregister a set on every rank (collective); False for the global or an unknown one."""
        result: list[bool] = []

        def command() -> None:
            removed = self.process_sets.remove(set_id)
            executor = self.executor.subsets.pop(set_id, None)
            group = self._set_groups.pop(set_id, None)
            if executor is not None:
                executor.backend.close()
            if group is not None:
                with contextlib.suppress(Exception):
                    group.shutdown()
            result.append(removed)

        self.run_collectively(command)
        return result[0]

    def _open_set(self, set_id: int, members: tuple[int, ...]) -> None:
        """The set's own group, on the cycle thread of every rank at the same cycle: an
        MPI communicator split from the job's (collective over every rank), or a Gloo
        group of the members alone, under keys no other set uses."""
        member = self.rank in members
        backend: Any = None
        if self.data_engine == "mpi":
            backend = self.backend.split(member)
        elif member:
            timeout = datetime.timedelta(seconds=self.config.collective_timeout_s)
            prefix = f"hvdprof/set{set_id}.{self.process_sets.serial}/"
            group = self._gloo_group(
                self._store, prefix, timeout, members.index(self.rank), len(members)
            )
            self._set_groups[set_id] = group
            backend = GlooBackend(group, members.index(self.rank), len(members))
        if backend is None:
            return
        executor = Executor(backend, members.index(self.rank), len(members))
        executor.retire = self._completed_batch
        executor.nvtx = self.executor.nvtx
        executor.rank_of = {r: i for i, r in enumerate(members)}
        self.executor.subsets[set_id] = executor

    def sync_clock(self) -> None:
        """Ping-pong with rank 0 (collective: every rank at the same point)."""
        samples = self.control.clock_samples(timebase.now_ns)
        if self.timeline is not None:
            self.timeline.update_clock(samples)

    # ---------------------------------------------------------------- submit
    def check_usable(self) -> None:
        failure = self.cycle.failure
        if failure is not None:
            raise failure
        if self.cycle.shutdown_requested:
            raise NotInitializedError("hvdprof has been shut down; call hvdprof.torch.init() first")

    def submit(
        self,
        name: str | None,
        kind: str,
        signature: Signature,
        tensor: Any,
        output: Any,
        splits: tuple[int, ...] | None = None,
    ) -> Handle:
        """Queue one op for the cycle thread. ``kind`` prefixes a generated name."""
        cycle = self.cycle
        if cycle.failure is not None or cycle.shutdown_requested:
            self.check_usable()
        release = None
        if name is None:
            if signature.process_set:  # each set names its own ops, in its own order
                kind = f"{kind}.set{signature.process_set}"
            name, release = self._names.allocate(kind)
        req = Request(
            name, signature, tensor, output, timebase.now_ns(), splits, release, self._retire
        )
        if self._inflight.setdefault(name, req) is not req:
            if release is not None:
                release()
            raise ValueError(
                f"hvdprof rank {self.rank}: an op named {name!r} is already in flight; "
                "names must be unique among ops that have not completed"
            )
        if handles.note_waits and handles.waits_since_submit:  # after a wait that blocked
            waited = handles.waits_since_submit.pop(threading.get_ident(), None)
            if waited is not None:
                self.timeline.add_waited(waited[1], waited[0])
        device = self.device_path
        if device is not None and tensor is not None and device.routes(signature.device):
            req.stream_event = device.ready_event(tensor)
        cycle.queue.append(req)
        # (after the append: a cycle thread about to sleep sees the op or we see its flag)
        if not cycle.wake.is_set():
            if cycle.asleep_idle and len(cycle.queue) <= WAIT_AT_MOST_OPS and self._may_wait(req):
                cycle.held = True  # its negotiation begins when the cycle takes it
            else:
                cycle.wake.set()
        if cycle.failure is not None:  # lost the race with a failing cycle: fail it here
            req.fail(cycle.failure)
        return req

    def _may_wait(self, req: Request) -> bool:
        """Whether an op submitted while every rank sleeps may stay queued until a thread
        of this rank waits (``HVDPROF_WAKE_ON_SUBMIT_BYTES``): small, and on the CPU."""
        limit = self.wake_limit
        if not limit or req.signature.device != "cpu":
            return False
        t = req.tensor
        return t is None or t.numel() * t.element_size() <= limit

    def nudge(self) -> None:
        """A thread of this rank waits on an op (or polls one not done): run the cycle now.

        Ops submitted while every rank slept may still be queued
        (``HVDPROF_WAKE_ON_SUBMIT_BYTES``): this wakes the job for them, and a cycle that
        paces ends its pause."""
        cycle = self.cycle
        cycle.urgent.set()
        if cycle.asleep_idle and not cycle.wake.is_set():
            cycle.wake.set()

    def timeline_switched(self, on: bool) -> None:
        """While a timeline records, waits note when the training thread got control back
        (see ``handles.note_waits``); called by the timeline session as it opens and closes."""
        handles.waits_since_submit.clear()
        handles.note_waits = on

    def is_in_flight(self, name: str) -> bool:
        return name in self._inflight

    def _completed(self, name: str) -> None:
        self._inflight.pop(name, None)

    def _completed_batch(self, names: list[str]) -> None:
        pop = self._inflight.pop
        for name in names:
            pop(name, None)

    def join(self) -> int:
        self.check_usable()
        handle = Handle("join")
        self.cycle.join_handle = handle
        self.cycle.wake.set()
        return handle.wait()

    def run_collectively(self, command: Any) -> None:
        """Run ``command()`` on the cycle thread at the same cycle on every rank.

        Every rank must call this (in the same order); the command runs once all have.
        """
        self.check_usable()
        done = threading.Event()
        error: list[BaseException] = []

        def wrapped() -> None:
            try:
                command()
            except BaseException as exc:
                error.append(exc)
            finally:
                done.set()

        self.cycle.commands.append(wrapped)
        self.cycle.wake.set()
        while not done.wait(0.5):
            if self.cycle.failure is not None:
                raise self.cycle.failure
        if error:
            raise error[0]

    # ---------------------------------------------------------------- shutdown
    def shutdown(self) -> None:
        cycle = self.cycle
        if len(self.process_sets.ids()) > 1 and cycle.failure is None and cycle.thread.is_alive():
            # With process sets, one set may finish before another: the control exchange
            # needs every rank, so a rank whose sets are done waits here (cycling) for the
            # others' shutdown rather than ending their sets' pending ops.
            with contextlib.suppress(Exception):
                barrier = Signature(OpType.BARRIER, "none", (), ReduceOp.SUM, -1, 1.0, 1.0, "cpu")
                self.submit(act.SHUTDOWN_BARRIER, "barrier", barrier, None, None).wait()
        if cycle.thread.is_alive():
            cycle.shutdown_requested = True
            cycle.wake.set()
            cycle.urgent.set()  # ends a busy cycle's sleep too (a 30 s HVDPROF_CYCLE_TIME)
            cycle.thread.join(timeout=self.config.collective_timeout_s + 5)
        cycle.shutdown_requested = True
        if handles.on_block == self.nudge:
            handles.on_block = None
        for executor in self.executor.subsets.values():
            with contextlib.suppress(Exception):
                executor.backend.close()
        for group in self._set_groups.values():
            with contextlib.suppress(Exception):
                group.shutdown()
        self.executor.subsets.clear()
        self._set_groups.clear()
        with contextlib.suppress(Exception):  # best effort: the peers may be gone
            self._data_pg.shutdown()
        if self.device_path is not None:  # device path (issue 28)
            with contextlib.suppress(Exception):
                self.device_path.backend.pg.shutdown()
            self.device_path.close()
            self.device_path.backend.pg = None
        self.control.close()
        if self.shm is not None:
            self.shm.close()
        # Drop every reference to the process group and the rendezvous store now, so a
        # later init() can bind the same port (reference cycles would keep them alive).
        self.backend.pg = None
        self._data_pg = None
        self._store = None
        tuner = getattr(self, "autotuner", None)
        if tuner is not None:  # closed by the cycle already, unless that hung
            tuner.close()  # its last samples reach the timeline before the timeline closes
        if self.timeline is not None:
            self.timeline.close()

    def stats(self) -> dict[str, Any]:
        """Counters for tests, benchmarks and the dashboard."""
        out = dict(self.cycle.counters)
        out.update(
            fused_groups=self.executor.fused_groups,
            fused_tensors=self.executor.fused_tensors,
            backend_calls=self.executor.backend_calls,
            small_allreduces=self.executor.small_calls,
            shm_allreduces=self.executor.shm_calls,
            steps=self.cycle.steps.step,
            cache_entries=len(self.cycle.cache),
        )
        # the cycle thread's own CPU by stage, in microseconds (its cost to the training)
        for stage, ns in self.cycle.cpu_ns.items():
            out[f"cycle_cpu_{stage}_us"] = ns / 1000
        return out


#: (address, port, rank, size) -> the TCPStore this process keeps for that job, and how
#: many times ``init()`` has used it. The store outlives ``shutdown()``: Horovod's own tests
#: call ``barrier(); shutdown()`` then ``init()`` in a loop, and when rank 0 re-created its
#: store on the same port, a fast peer could reach the old store, read the address of the
#: old control channel and fail with "Connection refused". With one store per process and
#: one key prefix per incarnation, the k-th ``init()`` of every rank meets under
#: ``hvdprof/init<k>/``, and rank 0 binds the port once.
_stores: dict[tuple[str, int, int, int], list[Any]] = {}


def _rendezvous_store(cfg: Config, port: int, rank: int, size: int) -> tuple[Any, int]:
    """The job's store (created on the first ``init()``) and this incarnation's number."""
    if cfg.elastic_store:  # elastic: the launcher's store, one prefix per generation
        from hvdprof.runtime import elastic

        return elastic.generation_store()
    key = (cfg.controller_addr, port, rank, size)
    entry = _stores.get(key) if cfg.controller_port is not None else None
    if entry is None:
        store = dist.TCPStore(
            cfg.controller_addr,
            port,
            size,
            rank == 0 and not environment.detect().agent_store,  # torchrun's agent serves one
            timeout=datetime.timedelta(seconds=cfg.start_timeout_s),
            wait_for_workers=True,
        )
        entry = [store, 0]
        if cfg.controller_port is not None:  # (a single process picks a new port each time)
            _stores[key] = entry
    else:
        entry[0].set_timeout(datetime.timedelta(seconds=cfg.start_timeout_s))
    entry[1] += 1
    return entry[0], entry[1]


def _abort_mpi_job(error: BaseException) -> None:
    """This rank's cycle thread died: say why, then ``MPI_Abort``. The other ranks are
    blocked in an MPI call this rank will never join, which has no timeout; the abort is
    what makes the launcher end the job instead of leaving it hung."""
    from hvdprof.runtime.backends.mpi import import_mpi

    stacks.write_all(
        2,
        f"hvdprof: error: {error}\nhvdprof: ending the job with MPI_Abort: the other ranks "
        "wait in MPI calls this rank will not join\n".encode(errors="replace"),
    )
    import_mpi().COMM_WORLD.Abort(1)


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__


# -------------------------------------------------------------------- the singleton
_lock = threading.Lock()
_runtime: Runtime | None = None
#: runtimes started in this process (``init()`` after ``shutdown()`` starts another)
_incarnations = 0
#: subfolder of the timeline directory for the k-th incarnation (k >= 2)
INCARNATION_DIR = "incarnation.{}"


def _per_incarnation_outputs(cfg: Config, incarnation: int) -> Config:
    """The second and later ``init()`` of a process record into ``DIR/incarnation.<k>/``.

    Each incarnation numbers its ranks and ops afresh, so writing into the same directory
    replaced the last one's files: 50 init()/shutdown() rounds left 1 allreduce of 50 on
    the timeline. The first incarnation keeps ``DIR`` itself (the usual single-init job
    sees no change), and ``hvdprof analyze DIR`` names the later ones. Every rank counts
    its own init() calls; ranks that init together get the same number.
    """
    if incarnation < 2 or not cfg.timeline_dir:
        return cfg
    return cfg.replace(
        timeline_dir=os.path.join(cfg.timeline_dir, INCARNATION_DIR.format(incarnation))
    )


def init(config: Config | None = None) -> Runtime:
    """Start the runtime once per process; later calls return the running one.

    Also the one that ended because a peer shut down or failed (its ops raise that
    error), as Horovod's init() is a no-op until shutdown(): a rank that finished its
    work and exited must not turn another rank's idempotent init() into a rendezvous
    that waits for it until the start timeout. Only shutdown() allows a new runtime.
    """
    global _runtime
    with _lock:
        if _runtime is not None and (
            _runtime.cycle.thread.is_alive() or _runtime.cycle.failure is not None
        ):
            return _runtime
        cfg = config or Config.from_env()
        if cfg.elastic_store:  # rank and size come from the generation this worker joins
            from hvdprof.runtime import elastic

            cfg = elastic.join(cfg)  # (each generation has its own timeline already)
        else:
            global _incarnations
            _incarnations += 1
            cfg = _per_incarnation_outputs(cfg, _incarnations)
        logging.getLogger("hvdprof").setLevel(cfg.log_level.upper())
        if not logging.getLogger("hvdprof").handlers:
            handler = logging.StreamHandler()
            handler.setFormatter(logging.Formatter("%(message)s"))
            logging.getLogger("hvdprof").addHandler(handler)
        _runtime = Runtime(cfg)
        # atexit runs handlers last-registered first. The timeline's writers registered
        # theirs when Runtime() imported them, after this module's; re-registering puts the
        # runtime's shutdown first again, so the cycle stops before the sinks close and its
        # last cycles are written rather than counted as dropped after the close.
        atexit.unregister(_shutdown_at_exit)
        atexit.register(_shutdown_at_exit)
        if cfg.gc_freeze:
            # Everything alive now (torch's import-time objects, the user's modules) would
            # be rescanned by every full cyclic collection, which the many small objects
            # of a step of small ops trigger every few steps: freezing them cut the submit
            # path from ~47 to ~6 us of CPU per op. Refcounting still frees them.
            gc.freeze()
        return _runtime


#: Queued ops past this many wake the job whatever their size: a burst of submissions
#: (Horovod's one op per gradient, thousands of small tensors) keeps the behaviour it was
#: measured with, the wake-up's hops and the burst's wait (``_let_burst_finish``) under
#: way while the burst goes on. (2,000 small tensors, every op of the burst held until
#: the wait instead, four launches each taking turns: hvdprof / one flat Gloo call 5.6-7.0
#: against 4.6-5.5 with this rule.)
WAIT_AT_MOST_OPS = 64
#: ``HVDPROF_WAKE_ON_SUBMIT_BYTES`` where the training's threads leave cores to spare
WAKE_ON_SUBMIT_SPARE_CORES = 256 * 1024


def wake_limit(setting: int, local_size: int, cores: int | None = None, hosts: int = 1) -> int:
    """The largest op that may wait for its rank's wait (see ``Runtime.submit``): the
    setting, or for -1 every op where the job is on one host whose cores the ranks' torch
    threads fill (a reduction there is copying on those same cores: overlap would only
    take CPU from the training), else ops up to 256 KiB (spare cores, or a network
    between the hosts whose transfers overlap the compute after them)."""
    if setting >= 0:
        return setting
    import torch

    if hosts <= 1 and cores_filled(local_size, torch.get_num_threads(), cores):
        return 1 << 62
    return WAKE_ON_SUBMIT_SPARE_CORES


def get() -> Runtime:
    runtime = _runtime
    if runtime is None or (runtime.cycle.shutdown_requested and runtime.cycle.failure is None):
        raise NotInitializedError(
            "hvdprof has not been initialized; call hvdprof.torch.init() first"
        )
    return runtime


def current() -> Runtime | None:
    return _runtime


def shutdown() -> None:
    global _runtime
    with _lock:
        runtime, _runtime = _runtime, None
    if runtime is not None:
        runtime.shutdown()
        del runtime
        gc.collect()


def _shutdown_at_exit() -> None:
    with contextlib.suppress(Exception):  # never turn a clean exit into a traceback
        shutdown()


atexit.register(_shutdown_at_exit)
__all__ = ["NameAllocator", "OpType", "Runtime", "Topology", "current", "get", "init", "shutdown"]
