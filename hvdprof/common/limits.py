"""Bounds on what one input file may cost a reader: inflated size and rank numbers.

A trace is data from elsewhere: a 2 MB ``.json.gz`` of spaces inflates to 2 GiB, and a
rank number of 2000000000 in a 400-byte Kineto file once became an array of that many
floats. Every reader (``hvdprof analyze``, ``diff``, the dashboard, the merge) inflates
gzip through :class:`Inflater`, which stops at an absolute size and at a ratio of
inflated to compressed bytes, and checks ranks against :func:`max_ranks`; what goes
past a bound is a problem naming the file, never a ``MemoryError``. The bounds are the
``read_*`` variables of :mod:`hvdprof.config`.
"""

from __future__ import annotations

import os
import zlib
from typing import Any

from hvdprof import config

#: the ratio is checked only past this many inflated bytes: a small file may compress
#: far better than a large one (a few repeated events)
RATIO_GRACE_BYTES = 32 << 20
#: inflated bytes asked of zlib per call: never more than this is produced at once
CHUNK_BYTES = 4 << 20


class InflateLimitError(ValueError):
    """Inflating a file went past a bound; the message says which, in one phrase."""


def setting(attr: str) -> Any:
    """``Config.<attr>`` from the environment now (the registry's parser and default): the
    readers run outside ``init()``, in the CLI and the dashboard. A malformed value is
    the default (the CLI's own commands report malformed variables)."""
    var = config.env_var(config.name_of(attr))
    raw = os.environ.get(var.name)
    if raw is None:
        return var.default
    try:
        return var.parse(raw)
    except ValueError:
        return var.default


def max_inflated_bytes() -> int:
    return int(setting("read_max_inflated_bytes"))


def max_inflate_ratio() -> float:
    return float(setting("read_max_inflate_ratio"))


def max_ranks() -> int:
    """Largest world size a trace may claim (ranks are 0 .. this - 1)."""
    return int(setting("read_max_ranks"))


class Inflater:
    """Streamed gzip inflation (every member of a multi-member file) within the bounds.

    ``feed(raw)`` returns the bytes ``raw`` inflates to, in pieces of at most
    :data:`CHUNK_BYTES` produced at a time (so a bomb never gets the chance to allocate
    its size), and raises :class:`InflateLimitError` as soon as the output passes the
    absolute bound or, past :data:`RATIO_GRACE_BYTES`, the ratio bound; zlib's own errors
    (corrupt data) pass through as ``zlib.error``.
    """

    def __init__(self, max_bytes: int | None = None, max_ratio: float | None = None) -> None:
        self.max_bytes = max_inflated_bytes() if max_bytes is None else max_bytes
        self.max_ratio = max_inflate_ratio() if max_ratio is None else max_ratio
        self.raw_in = 0
        self.out = 0
        self._d = zlib.decompressobj(31)

    @property
    def eof(self) -> bool:
        """The last member read so far ended with its end marker."""
        return self._d.eof

    def feed(self, raw: bytes) -> bytes:
        pieces: list[bytes] = []
        data = raw
        while True:
            piece = self._d.decompress(data, CHUNK_BYTES)
            if self._d.eof:
                rest = self._d.unused_data
                self.raw_in += len(data) - len(rest)
                self._count(pieces, piece)
                if not rest.strip(b"\0"):
                    break
                self._d = zlib.decompressobj(31)  # the next member
                data = rest
                continue
            tail = self._d.unconsumed_tail
            self.raw_in += len(data) - len(tail)
            self._count(pieces, piece)
            data = tail
            if not data and len(piece) < CHUNK_BYTES:
                break
        return b"".join(pieces)

    def _count(self, pieces: list[bytes], piece: bytes) -> None:
        if piece:
            pieces.append(piece)
        self.out += len(piece)
        if self.out > self.max_bytes:
            raise InflateLimitError(
                f"inflates to more than {self.max_bytes} bytes "
                f"({config.name_of('read_max_inflated_bytes')}): not read past that"
            )
        if self.out > RATIO_GRACE_BYTES and self.out > self.max_ratio * max(self.raw_in, 1):
            raise InflateLimitError(
                f"inflates more than {self.max_ratio:g} times its compressed size "
                f"({self.out} bytes from {self.raw_in}; "
                f"{config.name_of('read_max_inflate_ratio')}): not read past that"
            )


def inflate(raw: bytes) -> tuple[bytes, str | None]:
    """The whole of an in-memory gzip file within the bounds: ``(data, None)``, or what
    came before a cut or corrupt stream with the reason. :class:`InflateLimitError`
    when a bound is passed (nothing is returned: half a file is not what was asked)."""
    inflater = Inflater()
    pieces: list[bytes] = []
    for start in range(0, len(raw), CHUNK_BYTES):
        try:
            pieces.append(inflater.feed(raw[start : start + CHUNK_BYTES]))
        except zlib.error as exc:
            return b"".join(
                pieces
            ), f"gzip data is corrupt ({exc}); only the data before it was read"
    if not inflater.eof:
        return b"".join(pieces), "gzip stream is cut (no end marker): read what it held"
    return b"".join(pieces), None
