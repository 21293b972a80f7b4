"""What every table of ``hvdprof analyze`` (and ``diff``, ``ab``) is printed with: cells
made safe to print, columns that wrap rather than cut, and the number formats the
analyses' own tables share.

Each analysis prints its own table (its module's printer, named by its ``ANALYSIS``); this
module sits below them all and imports nothing heavy: the CLI imports it to register its
commands, which must cost every other ``hvdprof`` command nothing.
"""

from __future__ import annotations

import re
from typing import Any

#: Names of ops and tensors shown per stall or divergence (the JSON has them all).
NAMES_SHOWN = 3

#: characters a terminal acts on (escape sequences, bell, backspace ...), tab and newline
#: aside
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` safe to print: control characters (a directory named with an escape
    sequence) written as ``\\x1b``, and a file name's undecodable bytes as ``\\xff``."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def fitted(table: Any) -> Any:
    """``table`` with no header or cell cut to an ellipsis ("backe..."): each column at
    least as wide as the longest word in it (header and cells wrap between words) and
    no wider than its longest line, so a narrow terminal wraps rather than truncates."""
    for column in table.columns:
        header = str(column.header)
        lines = [line for cell in column.cells for line in str(cell).splitlines()]
        words = [w for text in (header, *lines) for w in text.split()] or [""]
        column.min_width = max(len(w) for w in words)  # wrap between words, never cut
        column.max_width = max(len(header), *map(len, lines), 1)
        column.overflow = "fold"
    return table


def ms(x: float) -> str:
    """Milliseconds as every table writes them: ``1,234.57``."""
    return f"{x:,.2f}"


def size(n: float) -> str:
    """A byte count in the largest binary unit it reaches: ``1.5 MiB``, ``512 B``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{int(n)} B"


def size_range(low: float) -> str:
    """A message-size bin [low, 2 low) compactly: "8-16 B", "16-32 KiB", "512 B-1 KiB"."""
    a, b = size(low).split(), size(2 * low).split()
    if a[1] == b[1]:
        return f"{a[0]}-{b[0]} {a[1]}"
    return f"{a[0]} {a[1]}-{b[0]} {b[1]}"


def some_names(names: list[str], total: int) -> str:
    """The first :data:`NAMES_SHOWN` of ``total`` names, and how many more there are."""
    shown = ", ".join(names[:NAMES_SHOWN])
    more = total - min(len(names), NAMES_SHOWN)
    return shown + (f" and {more} more" if more > 0 else "")
