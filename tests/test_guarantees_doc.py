"""``docs/guarantees.md`` names the test behind each row of its crash table: they exist.

The paragraph under the table sorts the rows by how they are tested (a real process
killed, real processes none killed, in process) and names each test as
``tests/<file>.py::<test>``. A renamed or deleted test would leave a promise in the
document that nothing checks; this test fails then.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = "Every row of this table is a test"
END = "All of them run on SQLite and PostgreSQL."


def section() -> str:
    text = (ROOT / "docs" / "guarantees.md").read_text()
    assert START in text and END in text, "the paragraph under the crash table moved"
    return text.split(START, 1)[1].split(END, 1)[0]


def named_tests(text: str) -> list[tuple[str, str]]:
    return re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", text)


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


def test_every_test_the_crash_table_names_exists() -> None:
    named = named_tests(section())
    assert len(named) >= 8, named
    missing = [
        f"{file}::{name}"
        for file, name in named
        if not (ROOT / file).exists() or name not in defined_tests(ROOT / file)
    ]
    assert missing == [], f"docs/guarantees.md names tests that do not exist: {missing}"


def test_each_kind_of_test_is_named() -> None:
    text = section()
    kinds = re.split(r"^\* \*\*", text, flags=re.M)[1:]
    assert [k.split("**", 1)[0] for k in kinds] == [
        "A real process killed",
        "Real processes, none killed",
        "In process",
    ]
    assert all(named_tests(k) for k in kinds), "every kind names its tests"
