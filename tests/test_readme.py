"""The README documents every HVDPROF_* variable with its default, from the one registry."""

from __future__ import annotations

import pathlib
import re

from hvdprof.config import ENV_VARS, horovod_table, markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_readme_has_the_generated_env_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert markdown_table() in readme, "README env table is stale: paste `hvdprof env` into it"


def test_readme_has_the_horovod_names_table() -> None:
    readme = (ROOT / "README.md").read_text()
    assert horovod_table() in readme, "README's table of HOROVOD_* names is stale"


def test_every_variable_used_in_code_is_registered() -> None:
    registered = {v.name for v in ENV_VARS}
    used: set[str] = set()
    for path in (ROOT / "hvdprof").rglob("*.py"):
        used |= set(re.findall(r"\bHVDPROF_[A-Z0-9_]+\b", path.read_text()))
    # names that are prefixes or not variables
    used -= {"HVDPROF_"}
    missing = sorted(used - registered)
    assert not missing, f"variables used in code but not in hvdprof/config.py: {missing}"


def test_readme_names_both_commands() -> None:
    readme = (ROOT / "README.md").read_text()
    assert "bash .ci/demo" in readme and "bash .ci/run" in readme
