"""Where a rank's threads are: its main thread's stack for the stall line, and every
thread's stack printed on SIGUSR1.

Both read the frames of the running threads (``sys._current_frames``) from another
thread or from the signal handler: nothing stops the user's thread, which goes on the
moment the handler returns (a frame walk and a few hundred bytes of text).

On SIGUSR1 the rank prints every thread's stack to its stderr, each line prefixed with
``hvdprof rank N:``, in one ``os.write`` (so another rank's dump, or this rank's own
logging, cannot land in the middle of it), ending with an ``end of stacks`` line; and it
puts a ``STACKS`` instant on its timeline. ``hvdprof run`` starts its ranks with SIGUSR1
ignored, so a SIGUSR1 forwarded before the handler is installed is dropped rather than
killing the rank (SIGUSR1's default action); the handler is installed as soon as
``hvdprof.torch`` is imported under ``hvdprof run``, and by ``init()`` in any case.

``hvdprof stacks PID`` signals only a process that is an hvdprof job and handles SIGUSR1
now (``hvdprof/launch/stack_target.py``): SIGUSR1 ends any other. A rank that installs the
handler leaves a marker for it (``$TMPDIR/hvdprof-<uid>/stacks/<pid>``, holding the
process's start time, so a reused pid is not taken for it; removed at exit), which is
how a rank started by mpirun, torchrun or srun is recognised; this module also reads
``/proc`` for the signal's disposition in another process.

A marker is a claim that a process survives SIGUSR1, so it is written and believed only
where no other user can put one: both folders and the file must belong to the user (and,
when read, to the user asking), be what they seem (no symbolic links) and be writable by
no one else. Another user can create ``/tmp/hvdprof-<uid>`` before us, or point
``TMPDIR`` at a folder of theirs; its markers are then neither written nor read.
"""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import stat
import sys
import sysconfig
import threading
import traceback
from types import FrameType
from typing import Any

from hvdprof.config import name_of

#: (function, file, line), innermost first
Frame = tuple[str, str, int]

_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
#: where the frames of a wait come from, not the user's code: ours, torch's (an autograd
#: Function's apply) and the standard library's (time.sleep is C: no frame; os.path is)
_LIBRARY_DIRS = tuple(
    {
        _PACKAGE_DIR,
        *(
            os.path.join(p, "") if name != "torch" else os.path.join(p, "torch", "")
            for name, p in (
                ("stdlib", sysconfig.get_paths().get("stdlib", "")),
                ("torch", sysconfig.get_paths().get("purelib", "")),
                ("torch", sysconfig.get_paths().get("platlib", "")),
            )
            if p
        ),
    }
)
END_MARKER = "end of stacks"

#: the rank named in the dumps' prefix (set at install, then by init)
_rank: int | None = None
#: (name, args) of dumps taken, for the cycle thread to put on the timeline: the handler
#: itself takes no lock a thread it interrupted might hold
pending_instants: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()


def frames_of(frame: FrameType | None, limit: int = 64) -> list[Frame]:
    """The stack from ``frame`` outwards, innermost first."""
    out: list[Frame] = []
    while frame is not None and len(out) < limit:
        code = frame.f_code
        out.append((code.co_name, code.co_filename, frame.f_lineno or 0))
        frame = frame.f_back
    return out


def _library(path: str) -> bool:
    return path.startswith(_LIBRARY_DIRS) or path.startswith("<frozen ")


def user_frames(frames: list[Frame]) -> list[Frame]:
    """``frames`` without the innermost run of library frames (hvdprof's, torch's, the
    standard library's): a rank waiting in ``hvd.allreduce`` is shown at the user's line
    that called it. All of them when no frame is the user's."""
    i = 0
    while i < len(frames) and _library(frames[i][1]):
        i += 1
    return frames[i:] if i < len(frames) else frames


def where(frames: list[Frame], depth: int = 3) -> str:
    """``load_batch (train.py:4) <- <module> (train.py:8)``: the innermost user frames."""
    shown = user_frames(frames)[:depth]
    if not shown:
        return "an unknown place (no Python frame)"
    return " <- ".join(f"{fn} ({os.path.basename(path)}:{line})" for fn, path, line in shown)


def format_dump(rank: int | None, main_frame: FrameType | None, reason: str) -> str:
    """Every thread's stack, outermost frame first as in a traceback, each line prefixed.

    ``main_frame``: the main thread's frame to show (the one a signal interrupted, so the
    handler's own frames are not in the dump); other threads come from
    ``sys._current_frames``.
    """
    who = f"hvdprof rank {rank}" if rank is not None else f"hvdprof pid {os.getpid()}"
    prefix = who + ": "
    lines = [f"{prefix}Python stacks ({reason}, pid {os.getpid()})"]
    main = threading.main_thread()
    # not threading.enumerate(): it takes a lock the interrupted thread may hold (a
    # Thread.start() in progress), and a signal handler must never wait on its own thread
    names = {ident: t.name for ident, t in dict(getattr(threading, "_active", {})).items()}
    current = sys._current_frames()
    try:
        idents = [main.ident, *sorted(i for i in current if i != main.ident)]
        for ident in idents:
            frame = main_frame if ident == main.ident else current.get(ident)
            if frame is None:
                continue
            lines.append(f"{prefix}thread {names.get(ident, '?')!s} ({ident}):")
            summary = traceback.StackSummary.extract(traceback.walk_stack(frame), limit=64)
            summary.reverse()
            for entry in summary.format():
                lines.extend(prefix + part for part in entry.rstrip("\n").split("\n"))
    finally:
        del current, main_frame
    lines.append(f"{prefix}{END_MARKER}")
    return "\n".join(lines) + "\n"


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until everything is written (a pipe may take less than asked)."""
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return  # stderr is gone: nothing to tell
        view = view[n:]


def _on_signal(signum: int, frame: FrameType | None) -> None:
    text = format_dump(_rank, frame, signal.Signals(signum).name)
    del frame
    write_all(2, text.encode("utf-8", errors="replace"))
    pending_instants.append(("STACKS", {"reason": signal.Signals(signum).name, "stacks": text}))


def install(rank: int | None) -> bool:
    """Print the stacks on SIGUSR1 (main thread only; a handler of the user's is kept)."""
    global _rank
    if rank is not None:
        _rank = rank
    if not hasattr(signal, "SIGUSR1"):
        return False
    if threading.current_thread() is not threading.main_thread():
        return False
    current = signal.getsignal(signal.SIGUSR1)
    if current is _on_signal:
        return True
    if current not in (signal.SIG_DFL, signal.SIG_IGN, None):
        return False
    signal.signal(signal.SIGUSR1, _on_signal)
    _register()
    return True


def install_under_launcher() -> None:
    """At import, under ``hvdprof run`` (HVDPROF_RANK set): as early as possible."""
    raw = os.environ.get(name_of("rank"), "")
    if raw.isdigit():
        install(int(raw))


# ------------------------------------------------------------- who handles SIGUSR1
_registered: int | None = None  # the pid whose marker this process wrote


def marker_dir(uid: int, tmpdir: str | None = None) -> str:
    """Where the processes of user ``uid`` that handle SIGUSR1 for hvdprof leave a marker."""
    base = tmpdir or os.environ.get("TMPDIR") or "/tmp"
    return os.path.join(base, f"hvdprof-{uid}", "stacks")


def start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/PID/stat``, field 22):
    with the pid, it names one process for good. None without /proc or the process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()  # the name in () may hold anything
    return fields[19] if len(fields) > 19 else None


def _private(info: os.stat_result, uid: int, directory: bool) -> bool:
    """Owned by ``uid``, of the kind expected, and writable by no one else."""
    kind = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    return kind and info.st_uid == uid and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def _open_private_dir(uid: int, tmpdir: str | None = None) -> int | None:
    """A descriptor of ``marker_dir(uid, tmpdir)`` when it and its parent are ``uid``'s
    own private folders (opened one level at a time, never through a link: a folder
    swapped after the check is not the one read); None otherwise."""
    base = os.path.dirname(marker_dir(uid, tmpdir))
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0)
    fds: list[int] = []
    try:
        fds.append(os.open(base, flags))
        if not _private(os.fstat(fds[-1]), uid, directory=True):
            return None
        fds.append(os.open("stacks", flags, dir_fd=fds[-1]))
        if not _private(os.fstat(fds[-1]), uid, directory=True):
            return None
        return fds.pop()
    except OSError:
        return None
    finally:
        for fd in fds:
            os.close(fd)


def _register() -> None:
    """Leave this process's marker (best effort: no marker means only that ``hvdprof
    stacks`` recognises the process by its environment or command line alone)."""
    global _registered
    pid = os.getpid()
    getuid = getattr(os, "getuid", None)
    if _registered == pid or getuid is None:
        return
    started = start_time(pid)
    if started is None:
        return
    uid = getuid()
    directory = marker_dir(uid)
    path = os.path.join(directory, str(pid))
    try:  # each level 0o700 (makedirs gives only the last its mode: a umask of 002 ...)
        os.makedirs(os.path.dirname(directory), mode=0o700, exist_ok=True)
        os.makedirs(directory, mode=0o700, exist_ok=True)
    except OSError:
        return
    fd = _open_private_dir(uid)
    if fd is None:
        return  # someone else's folder, or one others may write: leave no file there
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0)
        out = os.open(str(pid), flags, 0o600, dir_fd=fd)
        with os.fdopen(out, "w") as f:
            f.write(started)
    except OSError:
        return
    finally:
        os.close(fd)
    _registered = pid
    _prune(directory)
    import atexit

    atexit.register(_unregister, pid, path)


def _prune(directory: str, most: int = 1000) -> None:
    """Remove the markers of processes that are gone (a SIGKILLed rank leaves its own)."""
    with contextlib.suppress(OSError):
        for entry in os.listdir(directory)[:most]:
            if not entry.isdigit():
                continue
            path = os.path.join(directory, entry)
            try:
                with open(path) as f:
                    alive = f.read(64).strip() == start_time(int(entry))
            except (OSError, UnicodeDecodeError):
                continue
            if not alive:
                with contextlib.suppress(OSError):
                    os.remove(path)


def _unregister(pid: int, path: str) -> None:
    if os.getpid() == pid:  # (a forked child runs its parent's atexit too)
        with contextlib.suppress(OSError):
            os.remove(path)


def registered(pid: int, uid: int, tmpdirs: list[str]) -> bool:
    """Whether process ``pid`` of user ``uid`` left its marker in one of ``tmpdirs``.

    Believed only when ``uid`` is the caller's own (a marker is trusted from no one
    else) and the folders and the file are private to it (:func:`_open_private_dir`)."""
    getuid = getattr(os, "getuid", None)
    if getuid is None or uid != getuid():
        return False
    started = start_time(pid)
    if started is None:
        return False
    for tmpdir in dict.fromkeys(tmpdirs):
        fd = _open_private_dir(uid, tmpdir)
        if fd is None:
            continue
        try:
            flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)  # (a FIFO)
            marker = os.open(str(pid), flags, dir_fd=fd)
            with os.fdopen(marker, "rb") as f:
                mine = _private(os.fstat(f.fileno()), uid, directory=False)
                if mine and f.read(64).decode("ascii", "replace").strip() == started:
                    return True
        except OSError:
            continue
        finally:
            os.close(fd)
    return False


def stack_signal_disposition(pid: int) -> str | None:
    """SIGUSR1 in process ``pid``: ``caught`` (a handler), ``ignored`` or ``default``
    (it would end the process), from ``/proc/PID/status``; None when that cannot be read."""
    if not hasattr(signal, "SIGUSR1"):
        return None
    bit = 1 << (signal.SIGUSR1 - 1)
    masks: dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for raw in f:
                key, _, value = raw.decode("ascii", "replace").partition(":")
                if key in ("SigIgn", "SigCgt"):
                    masks[key] = int(value.strip(), 16)
    except (OSError, ValueError):
        return None
    if len(masks) < 2:
        return None
    if masks["SigCgt"] & bit:
        return "caught"
    return "ignored" if masks["SigIgn"] & bit else "default"


def handles_stack_signal(pid: int) -> bool | None:
    """Whether process ``pid`` has a SIGUSR1 handler now; None when it cannot be told."""
    state = stack_signal_disposition(pid)
    return None if state is None else state == "caught"
