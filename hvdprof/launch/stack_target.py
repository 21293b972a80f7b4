"""Which process ``hvdprof stacks PID`` may send SIGUSR1 to.

SIGUSR1's default action ends a process, and ``os.kill`` takes 0 and negative numbers
for process groups (``-1``: every process the caller may signal). So ``stacks`` takes one
positive pid within the platform's range and signals it only when the process is an
hvdprof job that handles SIGUSR1 at that moment:

* identity, any of: the ``hvdprof run`` launcher (its command line: ``hvdprof run`` or
  ``python -m hvdprof run``); a rank started by an hvdprof launcher (its environment holds
  ``HVDPROF_RANK`` or ``HVDPROF_ELASTIC_WORKER``, set by the launcher at exec); a process
  that installed hvdprof's stack handler, e.g. a rank started by mpirun, torchrun or srun
  after ``hvd.init()`` (the marker of ``hvdprof/runtime/stacks.py``);
* and safety: ``/proc/PID/status`` shows a SIGUSR1 handler (a rank still importing
  ignores the signal, and a launcher in its first milliseconds has no handler yet).

Everything here reads Linux's ``/proc``; without it nothing is signalled.
"""

from __future__ import annotations

import os

from hvdprof.config import name_of
from hvdprof.runtime import stacks

#: pid_t is a 32-bit int where /proc/sys/kernel/pid_max cannot be read
_PID_T_MAX = 2**31 - 1


def pid_max() -> int:
    """The largest pid this machine hands out."""
    try:
        with open("/proc/sys/kernel/pid_max") as f:
            return max(1, min(int(f.read().strip()), _PID_T_MAX))
    except (OSError, ValueError):
        return _PID_T_MAX


def parse_pid(text: str) -> tuple[int | None, str]:
    """(pid, "") for a positive pid in range, else (None, why not)."""
    top = pid_max()
    raw = text.strip()
    if not raw.isdecimal() or not raw.isascii():
        why = "0 and negative numbers name process groups, " if raw.startswith("-") else ""
        return None, f"expected a process id from 1 to {top}, got {text!r} ({why}not signalled)"
    pid = int(raw)
    if not 1 <= pid <= top:
        why = "0 names a process group, " if pid == 0 else ""
        return None, f"expected a process id from 1 to {top}, got {text!r} ({why}not signalled)"
    return pid, ""


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _argv(pid: int) -> list[str]:
    raw = _read(f"/proc/{pid}/cmdline") or b""
    return [a.decode("utf-8", "replace") for a in raw.split(b"\0") if a]


def _environ(pid: int) -> dict[str, str] | None:
    raw = _read(f"/proc/{pid}/environ")
    if raw is None:
        return None
    env: dict[str, str] = {}
    for entry in raw.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep:
            env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
    return env


def _uid(pid: int) -> int | None:
    for line in (_read(f"/proc/{pid}/status") or b"").splitlines():
        if line.startswith(b"Uid:"):
            fields = line.split()
            return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
    return None


#: the options of ``python`` that take a value (``python -X dev -m hvdprof run``)
_PYTHON_OPTIONS_WITH_VALUE = ("-W", "-X", "-Q")


def is_launcher_command(argv: list[str]) -> bool:
    """``python .../hvdprof run ...`` (the console script) or ``python [options] -m
    hvdprof run ...``: the interpreter first, then its options, then the script or the
    module, then ``run``, and nothing else (``python train.py hvdprof run`` is a
    training script with odd arguments, not the launcher)."""
    if not argv or not os.path.basename(argv[0]).startswith("python"):
        return False
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        if argv[i] in ("-c", "-"):
            return False  # a program given inline or on stdin: its own argv follows
        i += 2 if argv[i] in _PYTHON_OPTIONS_WITH_VALUE else 1
    rest = argv[i:]
    if rest[:3] == ["-m", "hvdprof", "run"]:
        return True
    return len(rest) >= 2 and os.path.basename(rest[0]) == "hvdprof" and rest[1] == "run"


def _shown(argv: list[str]) -> str:
    text = " ".join(argv) or "?"
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 60 else text[:57] + "..."


def identify(pid: int) -> str | None:
    """What hvdprof process ``pid`` is (``the hvdprof run launcher``, ``rank 3``, ...),
    or None when it is none."""
    argv = _argv(pid)
    if is_launcher_command(argv):
        return "the `hvdprof run` launcher"
    env = _environ(pid)
    if env is not None:
        rank = env.get(name_of("rank"), "")
        if rank.isdigit():
            return f"rank {rank} of an hvdprof job"
        if env.get(name_of("elastic_worker")):
            return "a worker of an elastic hvdprof job"
    uid = _uid(pid)
    if uid is not None:
        tmpdirs = [os.environ.get("TMPDIR") or "/tmp", (env or {}).get("TMPDIR") or "/tmp"]
        if stacks.registered(pid, uid, tmpdirs):
            return "an hvdprof rank"
    return None


def refusal(pid: int) -> str | None:
    """Why ``hvdprof stacks`` must not signal ``pid`` (one line), or None when it may."""
    if not os.path.isdir("/proc/self"):
        return (
            f"cannot check that process {pid} is an hvdprof job on this platform (no /proc); "
            "not signalled"
        )
    if not os.path.exists(f"/proc/{pid}"):
        return f"no process {pid}"
    what = identify(pid)
    if what is None:
        return (
            f"process {pid} ({_shown(_argv(pid))}) is not an hvdprof job (neither "
            "`hvdprof run` nor a rank that called hvd.init()); not signalled (SIGUSR1 "
            "ends a process that does not handle it)"
        )
    state = stacks.stack_signal_disposition(pid)
    if state == "caught":
        return None
    if state is None:
        if not os.path.exists(f"/proc/{pid}"):
            return f"no process {pid}"
        return f"cannot read process {pid}'s signal handlers; not signalled"
    return (
        f"process {pid} is {what} that is still starting (no stack handler yet, SIGUSR1 "
        f"{'ignored' if state == 'ignored' else 'would end it'}); not signalled: try again "
        "in a moment"
    )
