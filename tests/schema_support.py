"""A command's JSON checked against the published schema (``docs/analysis-schema.json``,
which ``test_analysis_registry`` keeps equal to the generated one): every key present,
typed as declared, and none that the result types do not declare."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hvdprof.analysis.schema import command_schema

PUBLISHED = Path(__file__).resolve().parent.parent / "docs" / "analysis-schema.json"


def output_errors(command: str, data: Any) -> list[str]:
    """What is wrong with ``data`` as ``hvdprof COMMAND --json``'s output (``diff``,
    ``ab``, ``history``): one line per error, the JSON path first."""
    import jsonschema  # a dev dependency (pyproject.toml)

    schema = command_schema(command, json.loads(PUBLISHED.read_text()))
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{list(e.path)}: {e.message}" for e in validator.iter_errors(data)]


def assert_valid_output(command: str, data: Any) -> None:
    errors = output_errors(command, data)
    assert not errors, (command, errors[:5])
