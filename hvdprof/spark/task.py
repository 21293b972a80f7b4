"""One rank of a Spark job: what runs inside its Spark task, in the executor's Python worker.

The task reports where it runs to the driver, waits for its rank and environment, runs
the user's function with them in ``os.environ`` (so ``hvd.init()`` finds them as under
``hvdprof run``) and its ``sys.stdout``/``sys.stderr`` sent to the driver line by line,
then stops hvdprof's runtime (which closes the rank's timeline), ships the timeline and
says how the function ended. Spark reuses its Python workers: the worker's environment
and streams are put back as they were, so the next task finds nothing of this one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import socket
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from hvdprof.cluster.failures import first_line
from hvdprof.config import name_of
from hvdprof.errors import HvdprofInternalError
from hvdprof.spark.messages import Assignment, Outcome, Output, Register, TimelineFiles
from hvdprof.spark.place import TaskPlace, executor_id_from_environment
from hvdprof.spark.timeline_files import as_fresh_process

#: Horovod's timeline variable names a file on the driver; the ranks record elsewhere
_HOROVOD_TIMELINE = "HOROVOD_TIMELINE"


class _Channel:
    """The task's connection to the driver; sends from any thread, one at a time."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self._lock = threading.Lock()

    def send(self, message: object) -> None:
        with self._lock:
            self.conn.send(message)


class _LineForwarder(io.TextIOBase):
    """A text stream whose complete lines go to the driver as ``Output`` messages."""

    def __init__(self, channel: _Channel, stream: str) -> None:
        super().__init__()
        self._channel = channel
        self._stream = stream
        self._partial = ""
        self._lock = threading.Lock()

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        with self._lock:
            self._partial += text
            *lines, self._partial = self._partial.split("\n")
        for line in lines:
            self._send(line + "\n")
        return len(text)

    def flush(self) -> None:
        with self._lock:
            rest, self._partial = self._partial, ""
        if rest:
            self._send(rest)

    def _send(self, text: str) -> None:
        with contextlib.suppress(OSError, ValueError):  # the driver has gone: drop output
            self._channel.send(Output(self._stream, text))


def _place(partition: int) -> TaskPlace:
    from pyspark import BarrierTaskContext

    ctx = BarrierTaskContext.get()
    infos = ctx.getTaskInfos()
    return TaskPlace(
        hostname=socket.gethostname(),
        address="",  # filled in from the connection to the driver
        pid=os.getpid(),
        partition=partition,
        attempt=ctx.attemptNumber(),
        stage_id=ctx.stageId(),
        task_attempt_id=ctx.taskAttemptId(),
        executor_id=executor_id_from_environment(os.environ),
        executor_address=infos[partition].address if partition < len(infos) else "",
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def _local_address(conn: Connection) -> str:
    """The address of this host on the route to the driver: the other ranks can reach
    rank 0's store there as they reach the driver."""
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return str(sock.getsockname()[0])


@contextlib.contextmanager
def _environment(env: Mapping[str, str], staging: str) -> Iterator[None]:
    saved = dict(os.environ)
    os.environ.update(env)
    if staging:
        os.environ[name_of("timeline_dir")] = staging
        os.environ.pop(_HOROVOD_TIMELINE, None)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def _forwarded_streams(channel: _Channel) -> Iterator[None]:
    saved = sys.stdout, sys.stderr
    out, err = _LineForwarder(channel, "stdout"), _LineForwarder(channel, "stderr")
    sys.stdout, sys.stderr = out, err
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        out.flush()
        err.flush()


def _stop_runtime() -> None:
    """Stop hvdprof's runtime if the function started one (it closes the timeline)."""
    runtime = sys.modules.get("hvdprof.runtime.runtime")
    if runtime is not None and runtime.current() is not None:
        with contextlib.suppress(Exception):  # a failed job still has a timeline
            runtime.shutdown()


def _collect(staging: str) -> dict[str, bytes]:
    import shutil

    if not staging:
        return {}
    root = Path(staging)
    files = {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }
    shutil.rmtree(root, ignore_errors=True)
    return as_fresh_process(files)


def run_rank(
    partition: int,
    driver_address: tuple[str, int],
    authkey: bytes,
    fn: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    want_timeline: bool,
    start_timeout_s: float,
) -> tuple[int, Any]:
    """Run the user's function as one rank; ``(rank, result)``. Raises what the function
    raised, so Spark fails the task (and the barrier stage) as Horovod's users expect."""
    place = _place(partition)
    staging = tempfile.mkdtemp(prefix="hvdprof-spark-timeline-") if want_timeline else ""
    conn = Client(driver_address, authkey=authkey)
    channel = _Channel(conn)
    try:
        place = dataclasses.replace(place, address=_local_address(conn))
        channel.send(Register(place, _free_port(), staging))
        if not conn.poll(start_timeout_s):
            raise TimeoutError(
                f"task {partition}: the driver did not assign a rank within {start_timeout_s:g}s"
            )
        assignment = conn.recv()
        assert isinstance(assignment, Assignment), type(assignment)
        error: BaseException | None = None
        result: Any = None
        with _environment(assignment.env, staging):
            with _forwarded_streams(channel):
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:  # reported to the driver, then re-raised
                    error = exc
            _stop_runtime()
        channel.send(TimelineFiles(_collect(staging)))
        if error is None:
            channel.send(Outcome(True))
            return assignment.rank, result
        reason = f"{type(error).__name__}: {first_line(error)}"
        channel.send(Outcome(False, reason, isinstance(error, HvdprofInternalError)))
        raise error
    finally:
        with contextlib.suppress(OSError):
            conn.close()
