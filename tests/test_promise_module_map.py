"""``docs/architecture.md``'s module map names every module of the package (the preamble's
rule: read the map first). A module is named by its path in backticks (`` `engine/core.py` ``),
by the basename list of the shared ``sqlite/``, ``postgres/`` row, or under the ``cli/``
row; packages' ``__init__.py`` need no row. A new module without a row fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "langgraph_idem_saver"


def module_map() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return text.split("## Modules", 1)[1].split("\n## ", 1)[0]


def named(section: str) -> tuple[set[str], set[str], bool]:
    """Paths named in backticks; basenames of the shared backend row; whether ``cli/``
    has its row."""
    paths = set(re.findall(r"`([\w/]+\.py)`", section))
    shared = next(
        (line for line in section.splitlines() if line.startswith("| `sqlite/`, `postgres/` |")),
        "",
    )
    basenames = set(re.findall(r"`(\w+\.py)`", shared))
    return paths, basenames, "| `cli/` |" in section


def test_every_module_has_a_row_in_the_module_map() -> None:
    paths, basenames, cli_row = named(module_map())
    assert basenames, "the shared sqlite/, postgres/ row moved"
    missing = []
    for file in sorted(PACKAGE.rglob("*.py")):
        rel = file.relative_to(PACKAGE).as_posix()
        if file.name == "__init__.py":
            continue
        if rel in paths or (rel.startswith("cli/") and cli_row):
            continue
        backend, _, name = rel.partition("/")
        if backend in ("sqlite", "postgres") and name in basenames:
            continue
        missing.append(rel)
    assert missing == [], f"docs/architecture.md's module map names no row for {missing}"


def test_every_path_the_map_names_exists() -> None:
    """A path in the map is a module (under its package directory, or a file named so in
    one of its sub-packages, as the grouped rows list them) or a file of the repository."""
    paths, basenames, _ = named(module_map())
    everywhere = {f.name for f in PACKAGE.rglob("*.py")}
    gone = [
        p
        for p in sorted(paths | basenames)
        if not (PACKAGE / p).exists() and not (ROOT / p).exists() and p not in everywhere
    ]
    assert gone == [], f"docs/architecture.md's module map names modules that are gone: {gone}"
