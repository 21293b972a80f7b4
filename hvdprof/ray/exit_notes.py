"""How a worker's process ended when the user's own code ended it (``os._exit(3)``,
``sys.exit(3)``), for the driver's failure line.

Ray knows only that the actor's connection closed: its message for ``os._exit(3)`` is
"Worker unexpectedly exits with a connection error code 2. End of file", a code that is
Ray's socket error, not the process's. The process's real status goes to the raylet,
its parent, which does not pass it on. So the worker notes the call itself, while the
user's function runs, in a file named by its pid; the driver reads it when Ray says the
actor died (on the driver's node; elsewhere with a zero-CPU task pinned to that node)
and says "exited with os._exit(3)". A process killed by a signal or crashing in C
leaves no note, and Ray's own words are used.

The notes live in ``$TMPDIR/hvdprof-ray-<uid>/``, created 0700; a directory or note not
owned by this user, or writable by others, is not trusted (another user could plant
one) and is never written through.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def _directory() -> str:
    return os.path.join(tempfile.gettempdir(), f"hvdprof-ray-{os.getuid()}")


def _trusted(info: os.stat_result, kind: int) -> bool:
    return (
        stat.S_IFMT(info.st_mode) == kind
        and info.st_uid == os.getuid()
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


def _note_path(pid: int) -> str | None:
    """The note of ``pid``, in the directory when it is this user's alone (else None)."""
    directory = _directory()
    with contextlib.suppress(FileExistsError):
        os.mkdir(directory, 0o700)
    try:
        if not _trusted(os.lstat(directory), stat.S_IFDIR):
            return None
    except OSError:
        return None
    return os.path.join(directory, f"exit.{pid}")


def write(how: str) -> None:
    """Note that this process is ending by ``how`` (``"os._exit(3)"``); never raises."""
    try:
        path = _note_path(os.getpid())
        if path is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(how[:200])
    except Exception:  # the process is ending; a note is a courtesy
        pass


def forget(pid: int) -> None:
    """Remove ``pid``'s note (a new process of a reused pid must not inherit one)."""
    with contextlib.suppress(OSError, TypeError):
        path = _note_path(pid)
        if path is not None:
            os.unlink(path)


def read(pid: int) -> str | None:
    """How process ``pid`` of this node said it was ending, once (the note is removed);
    None when it left no trusted note."""
    path = _note_path(pid)
    if path is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not _trusted(os.fstat(fd), stat.S_IFREG):
            return None
        text = os.read(fd, 400).decode("utf-8", "replace").strip()
    finally:
        os.close(fd)
        forget(pid)
    return text or None


def read_on_node(node_id: str, pid: int, timeout_s: float = 10.0) -> str | None:
    """:func:`read` on the node ``node_id`` (here, or by a zero-CPU task pinned there);
    None when it cannot be asked within ``timeout_s``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    with contextlib.suppress(Exception):
        if ray.get_runtime_context().get_node_id() == node_id:
            return read(pid)
        task = ray.remote(num_cpus=0)(read).options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)
        )
        return ray.get(task.remote(pid), timeout=timeout_s)
    return None
