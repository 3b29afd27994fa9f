"""The README's command-line section, taken at its word: its table names every command
there is, and "every command but ``demo`` takes ``--json``" (``demo`` refuses it before it
runs anything)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest

from langgraph_idem_saver.cli import main
from langgraph_idem_saver.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]


def commands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def readme_commands() -> set[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Command line", 1)[1].split("\n### ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    first_cells = [re.split(r"(?<!\\)\|", row)[1] for row in rows]  # (not an escaped \|)
    return {name for cell in first_cells for name in re.findall(r"`([a-z][a-z-]*)\b", cell)}


def test_the_readme_table_names_every_command() -> None:
    assert readme_commands() == set(commands())


@pytest.mark.parametrize("name", sorted(set(commands()) - {"demo"}))
def test_every_command_but_demo_takes_json(name: str) -> None:
    sub = commands()[name]
    assert "[--json]" in sub.format_usage(), sub.format_usage()


def test_demo_refuses_json_before_running_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--json"])
    assert exited.value.code == 2
    assert list(tmp_path.iterdir()) == []  # no idem-demo.db made


@pytest.mark.parametrize(
    "argv", [["--db", "mine.db", "demo"], ["--json", "demo"], ["--db", "mine.db", "--json", "demo"]]
)
def test_options_before_demo_are_refused_naming_its_own_form(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """The demo overwrites its database, so a ``--db`` meant for the other commands (or
    ``$IDEM_SAVER_DB``) never reaches it: usage error, nothing created or overwritten."""
    monkeypatch.chdir(tmp_path)
    mine = tmp_path / "mine.db"
    mine.write_bytes(b"the user's data")
    monkeypatch.setenv("IDEM_SAVER_DB", str(mine))
    assert main(argv) == 2
    assert "idem-saver demo [--db PATH]" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.db"]
    assert mine.read_bytes() == b"the user's data"


def test_the_read_side_helpers_the_readme_lists_are_on_both_async_savers() -> None:
    """ "public methods of both async savers": each name the paragraph lists, on each."""
    from langgraph_idem_saver import AsyncPostgresSaver, AsyncSqliteSaver

    text = (ROOT / "README.md").read_text()
    paragraph = text.split("The command line holds no SQL", 1)[1].split("\n\n", 1)[0]
    names = set(re.findall(r"`(a[a-z_]+)\(?", paragraph))
    assert len(names) >= 8, names
    for saver in (AsyncSqliteSaver, AsyncPostgresSaver):
        assert [n for n in sorted(names) if not callable(getattr(saver, n, None))] == [], saver
