"""A started rank and what its end means: the process-level facts every launcher shares.

Each rank runs in its own session (``start_new_session=True``), so that stopping a rank
signals its whole process group and takes down grandchildren such as data-loader workers
too, and so that a Ctrl+C in the terminal reaches only the launcher, which then decides
how to stop the ranks. Exit codes follow the shell's conventions (those of ``timeout(1)``
and ``sh``), so a script around ``hvdprof run`` reads them as it would any command's.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import BinaryIO

from hvdprof.launch.output import OutputSink, start_pumps

#: Address of the rendezvous store; ranks are local, so it is always the loopback.
CONTROLLER_ADDR = "127.0.0.1"
#: Seconds a rank gets to exit after each stop signal before the next, harsher one.
GRACE_SECONDS = 3.0
#: How often the main thread checks the ranks, the clock and pending signals.
POLL_SECONDS = 0.05

#: Exit codes with a conventional meaning (those of ``timeout(1)`` and the shell).
EXIT_TIMEOUT = 124
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127


def find_free_port(host: str = CONTROLLER_ADDR) -> int:
    """A TCP port that is free right now, for rank 0's rendezvous store.

    The socket is closed before returning: rank 0 must be able to bind the port itself,
    so the launcher must not hold it while the ranks run. The window in which another
    program could grab it is tiny, and rank 0 reports a clear error if that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def exit_code_of(returncode: int) -> int:
    """Map a ``Popen.returncode`` to a shell-style exit code (signal N becomes 128+N)."""
    return 128 - returncode if returncode < 0 else returncode


def describe_returncode(returncode: int) -> str:
    """Human wording of a ``Popen.returncode``: ``code 3`` or ``signal SIGKILL (-9)``."""
    if returncode >= 0:
        return f"code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"signal {name} ({returncode})"


def check_command(program: str, path: str | None) -> tuple[int, str] | None:
    """``(exit code, message)`` when ``program`` cannot be started, else ``None``.

    Checked once, before any rank starts, so a typo is reported once instead of N times,
    with the shell's exit codes (127: not found, 126: not executable).
    """
    if os.sep in program:
        if not os.path.exists(program):
            return EXIT_NOT_FOUND, f"command not found: {program}"
        if os.path.isdir(program) or not os.access(program, os.X_OK):
            return EXIT_NOT_EXECUTABLE, f"command is not executable: {program}"
        return None
    if shutil.which(program, path=path if path is not None else os.defpath) is None:
        return EXIT_NOT_FOUND, f"command not found: {program}"
    return None


@dataclass(eq=False)
class RankProcess:
    """One started rank: its process and the threads draining its output."""

    rank: int
    proc: subprocess.Popen[bytes]
    pumps: list[threading.Thread] = field(default_factory=list)

    @property
    def returncode(self) -> int | None:
        return self.proc.poll()

    def signal_group(self, signum: int) -> bool:
        """Signal the rank's whole process group; False when the group is already gone."""
        try:
            os.killpg(self.proc.pid, signum)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    def group_alive(self) -> bool:
        """Whether any process (the rank or a grandchild) is left in the rank's group."""
        return self.signal_group(0)

    def join_output(self, deadline: float) -> None:
        for thread in self.pumps:
            thread.join(max(0.0, deadline - time.monotonic()))


def spawn_rank(
    command: Sequence[str],
    env: Mapping[str, str],
    rank: int,
    sink: OutputSink,
    tees: dict[str, BinaryIO | None] | None = None,
) -> RankProcess:
    """Start ``command`` in a session of its own, its output pumped line by line to
    ``sink`` as ``rank``'s (and raw to ``tees``); raises OSError when it cannot start."""
    proc = subprocess.Popen(
        list(command),
        env=dict(env),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    pipes: dict[str, BinaryIO | None] = {"stdout": proc.stdout, "stderr": proc.stderr}
    return RankProcess(rank, proc, start_pumps(pipes, rank, sink, tees))
