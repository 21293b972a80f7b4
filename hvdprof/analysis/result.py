"""The base of every analysis result: a typed ``msgspec.Struct`` and one function that
turns any result into JSON-safe builtins.

Why msgspec: a result's fields are its JSON, so one encoder serves every analysis (no
``to_dict()`` written by hand per class) and the published schema
(:mod:`hvdprof.analysis.schema`, ``hvdprof analyze --schema``) and the dashboard's
``/openapi.json`` are generated from the same annotations. msgspec is already what the
trace readers decode with, so it adds no dependency, and it imports in milliseconds (the
registry must not cost ``hvdprof run`` numpy at start-up).

A value shown in the JSON but derived from other fields (a share, a mean, a sentence) is a
field too, filled in ``__post_init__`` or by the analysis once its answer is complete, so
that the schema lists it with its type.
"""

from __future__ import annotations

from typing import Any

import msgspec


def _numpy_value(obj: Any) -> Any:
    """A numpy scalar or array as Python numbers (``tolist``), without importing numpy."""
    tolist = getattr(obj, "tolist", None)
    if tolist is None:
        raise NotImplementedError(f"cannot turn a {type(obj).__name__} into JSON")
    return tolist()


def to_builtins(value: Any) -> Any:
    """``value`` (a result, a list of them, a dataclass such as ``Problem``) as dicts, lists,
    strings and numbers: what ``analyze --json`` and the API write."""
    return msgspec.to_builtins(value, str_keys=True, enc_hook=_numpy_value)


class Result(msgspec.Struct):
    """An analysis's answer: its fields are its JSON."""

    def to_dict(self) -> dict[str, Any]:
        data = to_builtins(self)
        assert isinstance(data, dict)
        return data
