"""One rank of a Ray job: the actor that runs the user's functions.

The same class serves ``RayExecutor`` and ``ElasticRayExecutor`` (and is Horovod's
``BaseHorovodWorker``: ``hostname()``, ``env_vars()``, ``update_env_vars()``,
``execute(fn)``). The driver sets the rank's variables with ``update_env_vars`` before
any function runs, so ``hvd.init()`` inside the function finds them in ``os.environ``
as it would under ``hvdprof run``; nothing here starts the runtime itself.

A timeline is recorded into a directory on the actor's own node (the driver's may not
be reachable from it) and shipped back to the driver by :meth:`collect_timeline`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hvdprof.config import name_of
from hvdprof.ray import exit_notes, ray_logger
from hvdprof.ray.layout import WorkerPlace

#: Horovod's timeline variable names a file on the driver; the workers record elsewhere
_HOROVOD_TIMELINE = "HOROVOD_TIMELINE"


class RayWorker:
    """A rank's actor: runs functions, reports where it is, ships its timeline."""

    def __init__(self) -> None:
        self.executable: Any = None
        self._staging: str | None = None
        exit_notes.forget(os.getpid())  # (a note left by an earlier process of this pid)

    # -- where it runs --------------------------------------------------------------
    def hostname(self) -> str:
        return socket.gethostname()

    def place(self) -> WorkerPlace:
        """Node, address, process and GPUs of this actor (for the rank layout)."""
        import ray

        context = ray.get_runtime_context()
        try:
            actor_id = context.get_actor_id() or ""
        except Exception:  # outside an actor (a plain instance in a test)
            actor_id = ""
        return WorkerPlace(
            hostname=socket.gethostname(),
            node_id=context.get_node_id(),
            node_ip=ray.util.get_node_ip_address(),
            pid=os.getpid(),
            actor_id=actor_id,
            gpu_ids=tuple(str(g) for g in ray.get_gpu_ids()),
        )

    def free_port(self) -> int:
        """A port free on this node now, for rank 0's rendezvous store."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            return int(s.getsockname()[1])

    # -- environment ----------------------------------------------------------------
    def update_env_vars(self, env_vars: Mapping[str, object]) -> None:
        os.environ.update({str(k): str(v) for k, v in env_vars.items()})

    def env_vars(self) -> dict[str, str]:
        return dict(os.environ)

    # -- running the user's code ----------------------------------------------------
    def start_executable(
        self,
        executable_cls: type | None = None,
        executable_args: list[Any] | tuple[Any, ...] | None = None,
        executable_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        if executable_cls is not None:
            self.executable = executable_cls(*(executable_args or ()), **(executable_kwargs or {}))

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """``fn(executable)`` when ``start`` made one, else ``fn(self)`` (Horovod's rule)."""
        return _noting_exits(fn, self.executable if self.executable is not None else self)

    def run(
        self,
        fn: Callable[..., Any],
        args: list[Any] | tuple[Any, ...] | None = None,
        kwargs: Mapping[str, Any] | None = None,
    ) -> Any:
        return _noting_exits(fn, *(args or ()), **(kwargs or {}))

    def set_queue(self, queue: Any) -> None:
        """Where :func:`hvdprof.ray.ray_logger.log` sends values (Horovod's name)."""
        ray_logger.configure(queue)

    # -- timeline -------------------------------------------------------------------
    def stage_timeline(self) -> str:
        """Record this rank's timeline into a fresh directory on this node."""
        self._staging = tempfile.mkdtemp(prefix="hvdprof-ray-timeline-")
        os.environ[name_of("timeline_dir")] = self._staging
        os.environ.pop(_HOROVOD_TIMELINE, None)
        return self._staging

    def collect_timeline(self) -> dict[str, bytes]:
        """Stop the runtime (which closes the timeline) and hand back every file it wrote,
        by path relative to the timeline directory; the local copy is removed."""
        from hvdprof.runtime import runtime

        if runtime.current() is not None:
            with contextlib.suppress(Exception):  # a failed job still has a timeline
                runtime.shutdown()
        staging, self._staging = self._staging, None
        if staging is None:
            return {}
        files = {
            str(path.relative_to(staging)): path.read_bytes()
            for path in sorted(Path(staging).rglob("*"))
            if path.is_file()
        }
        shutil.rmtree(staging, ignore_errors=True)
        return files

    def shutdown_runtime(self) -> None:
        from hvdprof.runtime import runtime

        if runtime.current() is not None:
            with contextlib.suppress(Exception):
                runtime.shutdown()


def _noting_exits(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``, noting an ``os._exit(n)`` or ``sys.exit(n)`` it makes (Ray
    tells the driver only "connection error code 2"; see :mod:`hvdprof.ray.exit_notes`)."""
    real_exit = os._exit

    def noted_exit(code: int) -> None:
        exit_notes.write(f"os._exit({code!r})")
        real_exit(code)

    os._exit = noted_exit  # type: ignore[assignment]
    try:
        return fn(*args, **kwargs)
    except SystemExit as exc:
        exit_notes.write(f"sys.exit({exc.code!r})")
        raise
    finally:
        os._exit = real_exit


#: Horovod's name for the worker actor class
BaseHorovodWorker = RayWorker
