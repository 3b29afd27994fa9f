"""``idem-saver --help``, ``--version`` and a usage error answer without importing the
savers, the engine or LangGraph's graph modules (the commands and the database layer are
imported when a command runs): the package docstring's "the ``idem-saver`` command line
stays fast". Each case runs in a fresh interpreter, so nothing a test imported before counts.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = (
    "langgraph_idem_saver.cli.database",
    "langgraph_idem_saver.cli.commands",
    "langgraph_idem_saver.sqlite",
    "langgraph_idem_saver.engine",
    "langgraph.graph",
    "aiosqlite",
    "psycopg",
)

PROBE = """
import json, sys
from langgraph_idem_saver.cli import main
code = main(sys.argv[1:])
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def run_cli(*args: str) -> tuple[int, set[str], str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *args], capture_output=True, text=True, timeout=120
    )
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return int(report["code"]), set(report["modules"]), done.stdout


@pytest.mark.parametrize(
    ("args", "code"),
    [(("--help",), 0), (("threads", "--help"), 0), (("--version",), 0), ((), 0)],
)
def test_help_and_version_import_no_saver(args: tuple[str, ...], code: int) -> None:
    got, modules, out = run_cli(*args)
    assert got == code
    assert out  # it did print the help or the version
    assert not [m for m in HEAVY if m in modules]


def test_a_usage_error_imports_no_saver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IDEM_SAVER_DB", raising=False)
    got, modules, _ = run_cli("threads")  # no database given: exit 2 before any import
    assert got == 2
    assert not [m for m in HEAVY if m in modules]


def test_a_command_still_imports_what_it_runs(tmp_path: object) -> None:
    """The control: a command that runs does load the layer the others above leave out,
    so the checks above can see an import."""
    got, modules, _ = run_cli("--db", str(tmp_path) + "/missing.sqlite", "threads")
    assert got == 1  # a missing file is refused
    assert "langgraph_idem_saver.cli.database" in modules
    assert "langgraph_idem_saver.cli.commands" in modules


def test_the_lazy_names_are_the_modules_own() -> None:
    import langgraph_idem_saver.cli as cli
    from langgraph_idem_saver.cli import database, values

    assert cli.is_postgres_target is database.is_postgres_target
    assert cli.redact_dsn is database.redact_dsn
    assert cli.diff_messages is values.diff_messages
    assert cli.head_status is values.head_status
    with pytest.raises(AttributeError):
        cli.no_such_name  # noqa: B018
