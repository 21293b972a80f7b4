"""The README is short and points at docs/; docs/ documents every HVDPROF_* variable with
its default, from the one registry, and every link between them resolves."""

from __future__ import annotations

import pathlib
import re

from hvdprof.config import ENV_VARS, horovod_table, markdown_table

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
#: A newcomer reads the README in five minutes: what it is, the two commands, an example,
#: where each feature is documented. Reference lives in docs/.
MAX_README_LINES = 250


def test_env_table_in_docs_is_the_generated_one() -> None:
    text = (DOCS / "environment.md").read_text()
    assert markdown_table() in text, "docs/environment.md is stale: paste `hvdprof env` into it"


def test_horovod_names_table_in_docs_is_the_generated_one() -> None:
    text = (DOCS / "running.md").read_text()
    assert horovod_table() in text, "docs/running.md's table of HOROVOD_* names is stale"


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


def test_readme_is_short_and_links_every_doc() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= MAX_README_LINES
    linked = set(re.findall(r"\]\((docs/[^)#]+)", readme))
    docs = {f"docs/{p.name}" for p in DOCS.glob("*.md")}
    assert docs, "no docs/"
    assert docs <= linked, f"docs the README does not link: {sorted(docs - linked)}"


def test_relative_links_resolve() -> None:
    broken = []
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # not code blocks
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path = target.split("#", 1)[0]
            if path and not (page.parent / path).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, "links to nothing:\n" + "\n".join(broken)


def test_every_variable_is_documented_once() -> None:
    # one row per variable in one place: the generated table, not copies that drift
    rows: dict[str, list[str]] = {}
    for page in [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]:
        for name in re.findall(r"^\| `(HVDPROF_[A-Z0-9_]+)` \|", page.read_text(), re.M):
            rows.setdefault(name, []).append(page.name)
    twice = {k: v for k, v in rows.items() if len(v) > 1}
    assert not twice, f"variables with a table row in several places: {twice}"
    assert set(rows) == {v.name for v in ENV_VARS}
