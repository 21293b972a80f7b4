"""Trace text that starts with a byte-order mark, made into the UTF-8 the parsers read.

JSON parsers (orjson, msgspec) refuse a byte-order mark, yet editors on Windows and
PowerShell's ``Out-File`` write one: a UTF-8 mark, or the whole file in UTF-16. Such a
trace is still the trace its author saved, so the readers take it (the mark says the
encoding; no guessing without one). A file with no mark is left as it is.
"""

from __future__ import annotations

import codecs

#: marks, longest first (UTF-32-LE's starts with UTF-16-LE's)
_MARKS = (
    (codecs.BOM_UTF32_LE, "utf-32-le", "UTF-32"),
    (codecs.BOM_UTF32_BE, "utf-32-be", "UTF-32"),
    (codecs.BOM_UTF8, "utf-8", "UTF-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le", "UTF-16"),
    (codecs.BOM_UTF16_BE, "utf-16-be", "UTF-16"),
)


def _mark_of(data: bytes) -> tuple[bytes, str, str] | None:
    for mark, codec, name in _MARKS:
        if data.startswith(mark):
            return mark, codec, name
    return None


def encoding_of(data: bytes) -> str | None:
    """The encoding a file's byte-order mark names (``"UTF-16"``), or None for no mark."""
    found = _mark_of(data)
    return None if found is None else found[2]


def as_utf8(data: bytes) -> bytes:
    """The whole text as UTF-8 without its mark (characters that do not decode become
    U+FFFD, as the readers do for invalid UTF-8); ``data`` itself when it has no mark."""
    found = _mark_of(data)
    if found is None:
        return data
    mark, codec, _ = found
    if codec == "utf-8":
        return data[len(mark) :]
    return data[len(mark) :].decode(codec, errors="replace").encode("utf-8")


def head_as_utf8(head: bytes) -> bytes:
    """The first bytes of a file as UTF-8 without its mark, for sniffing (a character
    cut at the end of the head is dropped, not replaced)."""
    found = _mark_of(head)
    if found is None:
        return head
    mark, codec, _ = found
    body = head[len(mark) :]
    if codec == "utf-8":
        return body
    return body.decode(codec, errors="ignore").encode("utf-8")
