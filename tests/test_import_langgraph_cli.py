"""``idem-saver import-langgraph``: the command line over ``aimport_langgraph``.

The database as ``setup()``'s warning names it (an argument) or with ``--db``; the JSON
report; progress on stderr (a JSON line of counts per batch with ``--json``, a bar on a
terminal). The databases are filled by LangGraph's own savers, as in
``test_import_langgraph.py``, whose fixtures these tests share.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from import_db import Db
from test_import_langgraph import THREADS, filled


@pytest.fixture
def db(backend: str, request: pytest.FixtureRequest) -> Db:
    return Db.for_test(backend, request)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    from langgraph_idem_saver.cli import main

    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_the_import_command_imports_once_and_the_threads_show(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    theirs = asyncio.run(filled(db))
    code, out, err = run_cli(capsys, "import-langgraph", "--db", db.where, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["checkpoints_imported"] == report["checkpoints_found"] == len(theirs)
    assert report["changed"] is True and report["verified"] == len(theirs)
    code, out, err = run_cli(capsys, "threads", "--db", db.where, "--json")
    assert code == 0, err
    assert {t["thread_id"] for t in json.loads(out)["threads"]} == set(THREADS)
    code, out, err = run_cli(capsys, "import-langgraph", "--db", db.where)  # again: a no-op
    assert code == 0, err
    assert "nothing new: every checkpoint was already imported" in out


def test_the_import_command_refuses_a_missing_file_and_a_bad_batch_size(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nope.db"
    code, _, err = run_cli(capsys, "import-langgraph", "--db", str(missing))
    assert code == 2 and "no such database file" in err and not missing.exists()
    code, _, err = run_cli(capsys, "import-langgraph", "--db", str(missing), "--batch-size", "0")
    assert code == 2 and "--batch-size must be >= 1" in err


def test_the_import_command_takes_the_database_as_the_warning_names_it(
    db: Db, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idem-saver import-langgraph <path>`` (as setup()'s warning says), ``--db`` (as
    every other command), or both when they agree; with --json, a line of counts per
    batch on stderr, stdout keeping the one report."""
    theirs = asyncio.run(filled(db))
    code, out, err = run_cli(capsys, "import-langgraph", db.where, "--json", "--batch-size", "4")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["checkpoints_imported"] == len(theirs)
    assert set(doc) == {  # as the CLI's docstring lists them
        *("source", "checkpoints_total", "checkpoints_found", "checkpoints_imported"),
        *("checkpoints_present", "threads_found", "threads_imported", "values_written"),
        *("writes_imported", "verified", "batches", "seconds", "changed"),
    }
    lines = [json.loads(line)["progress"] for line in err.splitlines()]
    batches = -(-len(theirs) // 4)
    # one line per batch, and one when the last thread is in
    assert [p["batches"] for p in lines] == [*range(1, batches + 1), batches]
    assert [p["checkpoints_found"] for p in lines[:-1]] == [
        min(4 * (i + 1), len(theirs)) for i in range(batches)
    ]
    assert {p["checkpoints_total"] for p in lines} == {len(theirs)}
    assert [p["threads_imported"] for p in lines[-2:]] == [len(THREADS) - 1, len(THREADS)]
    assert set(lines[0]) == {
        *("checkpoints_total", "checkpoints_found", "checkpoints_imported"),
        *("checkpoints_present", "threads_imported", "batches"),
    }
    code, out, err = run_cli(capsys, "import-langgraph", db.where, "--db", db.where)
    assert code == 0 and "nothing new" in out, err
    code, _, err = run_cli(capsys, "import-langgraph", db.where, "--db", db.where + "x")
    assert code == 2 and "two databases given" in err


@pytest.mark.parametrize("backend", ["sqlite"])
def test_the_import_command_shows_a_bar_on_a_terminal(db: Db) -> None:
    """On a terminal (stderr a tty) the import draws a progress bar there."""
    import os
    import pty

    asyncio.run(filled(db))
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "langgraph_idem_saver", "import-langgraph", db.where],
            stdout=subprocess.PIPE,
            stderr=follower,
            text=True,
            timeout=120,
            env={**os.environ, "COLUMNS": "100", "TERM": "xterm"},
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert proc.returncode == 0, drawn
    assert b"importing checkpoints" in drawn
    assert "imported of 3" in proc.stdout
