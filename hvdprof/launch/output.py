"""Rank output, line by line: one thread per child pipe, one lock for every line written.

A thread reads whole lines of one pipe (in binary, decoded with ``errors="replace"``)
and writes each one, prefixed ``[RANK]<stream>:`` as horovodrun does, under a single
lock, so lines from different ranks never interleave mid-line.
"""

from __future__ import annotations

import contextlib
import threading
from typing import BinaryIO, TextIO

#: Longest chunk handed to the output as one line; guards memory against endless lines.
MAX_LINE_BYTES = 1 << 20
#: Every line the launcher writes itself starts with this.
LOG_PREFIX = "hvdprof run: "


class OutputSink:
    """Where rank output lines go: one lock for all, so lines never interleave.

    A broken destination (say, the launcher's stdout piped into ``head``) stops being
    written to, but the pipes from the ranks keep being drained so no rank blocks.
    """

    def __init__(self, stdout: TextIO, stderr: TextIO, prefix: bool) -> None:
        self._streams = {"stdout": stdout, "stderr": stderr}
        self._prefix = prefix
        self._lock = threading.Lock()
        self._broken: set[int] = set()

    def emit(self, rank: int, stream: str, text: str) -> None:
        """Write one line of ``rank``'s ``stream``, adding the newline a partial line lacks."""
        if not text.endswith("\n"):
            text += "\n"
        if self._prefix:
            text = f"[{rank}]<{stream}>:{text}"
        self._write(self._streams[stream], text)

    def message(self, text: str) -> None:
        """A line from the launcher itself, to the stderr destination."""
        self._write(self._streams["stderr"], LOG_PREFIX + text + "\n")

    def _write(self, dest: TextIO, text: str) -> None:
        with self._lock:
            if id(dest) in self._broken:
                return
            try:
                try:
                    dest.write(text)
                except UnicodeEncodeError:
                    encoding = getattr(dest, "encoding", None) or "ascii"
                    dest.write(text.encode(encoding, "replace").decode(encoding))
                dest.flush()
            except (OSError, ValueError):
                self._broken.add(id(dest))


def pump_lines(
    pipe: BinaryIO, rank: int, stream: str, sink: OutputSink, tee: BinaryIO | None
) -> None:
    """Copy one child pipe line by line to the sink (and raw to ``tee``) until EOF.

    ``readline`` returns a final partial line at EOF, so output without a trailing
    newline is still shown when the rank ends.
    """
    with pipe:
        for chunk in iter(lambda: pipe.readline(MAX_LINE_BYTES), b""):
            if tee is not None:
                with contextlib.suppress(OSError, ValueError):
                    tee.write(chunk)
                    tee.flush()
            sink.emit(rank, stream, chunk.decode("utf-8", errors="replace"))
    if tee is not None:
        tee.close()


def start_pumps(
    pipes: dict[str, BinaryIO | None],
    rank: int,
    sink: OutputSink,
    tees: dict[str, BinaryIO | None] | None = None,
) -> list[threading.Thread]:
    """One started :func:`pump_lines` thread per pipe (``stdout``, ``stderr``)."""
    threads = []
    for stream, pipe in pipes.items():
        assert pipe is not None
        thread = threading.Thread(
            target=pump_lines,
            args=(pipe, rank, stream, sink, (tees or {}).get(stream)),
            name=f"hvdprof-rank{rank}-{stream}",
            daemon=True,
        )
        thread.start()
        threads.append(thread)
    return threads
