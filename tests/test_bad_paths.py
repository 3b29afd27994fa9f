"""Bad database paths: each refused with a typed error that names the path, nothing created
or written.

SQLite: a missing directory, a directory given as the path, a read-only file, a read-only
directory, a connection opened read-only, a file that is not SQLite. Postgres: a malformed
DSN, a missing database, a closed port, a read-only session. And the package's import
surface without the ``postgres`` extra.

Read-only files and directories are tested for real: root ignores file permissions, so
those cases run in a child process that obeys them (``tests/unprivileged.py``: root without
its permission-override capabilities) and first check that the OS refuses it the write.
A ``mode=ro`` connection is read-only even for root, so the first-write cases also run
in-process.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from tool_node_helpers import cfg, intent_for
from unprivileged import (
    REPO_ROOT,
    listing,
    make_writable_again,
    os_refuses_write,
    run_unprivileged,
)

import langgraph_idem_saver
from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    IdemSaverError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
)
from langgraph_idem_saver.sqlite import sql

SEED = "seed"


async def aseed_db(path: Path) -> str:
    """A database with one checkpoint in thread ``seed``; returns its id. Closed cleanly, so
    no ``-wal``/``-shm`` file is left beside it."""
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        stored = await saver.aput(cfg(SEED), empty_checkpoint(), {"step": 0}, {})
    assert [p.name for p in path.parent.iterdir() if p.name.startswith(path.name)] == [path.name]
    return str(stored["configurable"]["checkpoint_id"])


def seed_db(path: Path) -> str:
    """:func:`aseed_db` for tests without an event loop."""
    return asyncio.run(aseed_db(path))


def rows(path: Path) -> list[Any]:
    """Every checkpoint and ledger row, read as root, for "nothing was written" checks."""
    with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
        return [
            *db.execute("SELECT thread_id, checkpoint_id FROM idem_checkpoints ORDER BY 1, 2"),
            *db.execute("SELECT scope, key, status FROM idem_tool_calls ORDER BY 1, 2"),
        ]


# --- a missing directory, a directory as the path ------------------------------------------


async def test_missing_directory_is_a_config_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "no" / "such" / "dir" / "agent.db"
    for conn_string in (str(path), f"file:{path}?mode=rwc"):
        with pytest.raises(ConfigError) as info:
            async with AsyncSqliteSaver.from_conn_string(conn_string):
                pass
        message = str(info.value)
        assert str(path) in message and "does not exist" in message
        assert str(tmp_path / "no") in message  # the first missing directory
    assert list(tmp_path.iterdir()) == []  # nothing created


async def test_directory_as_path_is_a_config_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="is a directory") as info:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path)):
            pass
    assert str(tmp_path) in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, IdemSaverError)
    assert list(tmp_path.iterdir()) == []


async def test_bad_path_through_a_hand_made_connection_and_the_sync_bridge(
    tmp_path: Path,
) -> None:
    """``AsyncSqliteSaver(aiosqlite.connect(...))`` sets up on first use - async or through
    the synchronous methods LangGraph calls from a worker thread - with the same error."""
    path = tmp_path / "missing" / "agent.db"
    saver = AsyncSqliteSaver(aiosqlite.connect(path))
    with pytest.raises(ConfigError, match="does not exist") as info:
        await saver.aput(cfg(), empty_checkpoint(), {}, {})
    assert str(path) in str(info.value)

    saver = AsyncSqliteSaver(aiosqlite.connect(tmp_path))
    with pytest.raises(ConfigError, match="is a directory") as info:
        await asyncio.to_thread(saver.put, cfg(), empty_checkpoint(), {}, {})
    assert str(tmp_path) in str(info.value)
    assert list(tmp_path.iterdir()) == []


async def test_not_a_database_is_the_only_not_a_database_error(tmp_path: Path) -> None:
    junk = tmp_path / "notes.db"
    junk.write_bytes(b"hello, I am not a database\n" * 200)
    before = junk.read_bytes()
    with pytest.raises(NotADatabaseError) as info:
        async with AsyncSqliteSaver.from_conn_string(str(junk)):
            pass
    assert str(junk) in str(info.value) and "not a SQLite database" in str(info.value)
    assert not isinstance(info.value, PermissionError)
    assert junk.read_bytes() == before


# --- read-only connections (mode=ro stops root too: in-process) ----------------------------


async def test_mode_ro_connection_reads_and_every_write_raises_typed(tmp_path: Path) -> None:
    path = tmp_path / "agent.db"
    seed = await aseed_db(path)
    before = rows(path)
    uri = f"file:{path}?mode=ro"
    async with AsyncSqliteSaver.from_conn_string(uri) as saver:
        tup = await saver.aget_tuple(cfg(SEED))
        assert tup is not None and tup.checkpoint["id"] == seed
        call = {"name": "charge", "args": {"invoice": "inv-1"}, "id": "call_1"}
        at_seed = {"configurable": {**cfg(SEED)["configurable"], "checkpoint_id": seed}}
        writes = [
            saver.aput(cfg(), empty_checkpoint(), {}, {}),
            saver.aput_writes(at_seed, [("a", 1)], "task-1"),
            saver.aclaim([intent_for("t", call)], owner="me", lease_seconds=60),
            asyncio.to_thread(saver.put, cfg(), empty_checkpoint(), {}, {}),
        ]
        for write in writes:
            with pytest.raises(ReadOnlyDatabaseError) as info:
                await write
            assert str(path) in str(info.value) and "nothing was written" in str(info.value)
            assert "opened read-only" in str(info.value) and info.value.path == str(path)
            assert isinstance(info.value, PermissionError)
        # writes grouped into one commit fail together, typed, and leave nothing behind
        results = await asyncio.gather(
            *(saver.aput(cfg(f"g{i}"), empty_checkpoint(), {}, {}) for i in range(3)),
            return_exceptions=True,
        )
        assert [type(r) for r in results] == [ReadOnlyDatabaseError] * 3
        # still readable after the refused writes
        tup = await saver.aget_tuple(cfg(SEED))
        assert tup is not None and tup.checkpoint["id"] == seed
    assert rows(path) == before


async def test_hand_made_read_only_connection_is_recognised(tmp_path: Path) -> None:
    """A saver built on the user's own ``mode=ro`` connection opens (its intent is read
    from the connection) and refuses writes, typed."""
    path = tmp_path / "agent.db"
    await aseed_db(path)
    conn = aiosqlite.connect(f"file:{path}?mode=ro", uri=True)
    try:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        assert await saver.aget_tuple(cfg(SEED)) is not None
        with pytest.raises(ReadOnlyDatabaseError, match="opened read-only"):
            await saver.aput(cfg(), empty_checkpoint(), {}, {})
    finally:
        await conn.close()


async def test_read_only_connection_to_an_old_schema_says_it_needs_an_upgrade(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    latest = len(sql.MIGRATIONS) - 1
    with sqlite3.connect(path) as db:  # the schema as the release before this one left it
        for version in range(latest):
            db.executescript(sql.MIGRATIONS[version])
            db.execute(sql.INSERT_MIGRATION, (version,))
    db.close()
    before = path.read_bytes()
    with pytest.raises(ReadOnlyDatabaseError) as info:
        async with AsyncSqliteSaver.from_conn_string(f"file:{path}?mode=ro"):
            pass
    message = str(info.value)
    assert str(path) in message and f"schema version {latest - 1}" in message
    assert "upgrad" in message and "nothing was written" in message
    assert path.read_bytes() == before


# --- read-only files and directories, in a child that obeys permissions -------------------

CHILD = r"""
import asyncio, json, os, sys, threading, traceback
from langgraph.checkpoint.base import empty_checkpoint
from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.sqlite import AsyncSqliteSaver as _loaded  # the lazy import, done

cfg = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def case(conn_string, action):
    report = {"opened": False, "read": None, "wrote": False, "error": None}

    async def main():
        async with AsyncSqliteSaver.from_conn_string(conn_string) as saver:
            report["opened"] = True
            tup = await saver.aget_tuple({"configurable": {"thread_id": "seed"}})
            report["read"] = None if tup is None else tup.checkpoint["id"]
            if action == "put":
                await saver.aput(cfg, empty_checkpoint(), {}, {})
            elif action == "sync_put":
                await asyncio.to_thread(saver.put, cfg, empty_checkpoint(), {}, {})
            report["wrote"] = action != "read"

    try:
        asyncio.run(main())
    except Exception as exc:
        report["error"] = [c.__name__ for c in type(exc).__mro__]
        report["message"] = str(exc)
        report["path"] = getattr(exc, "path", None)
    print(json.dumps(report))


# one process per case, forked once the imports are done (no thread yet, nothing open):
# each case starts as fresh as a new interpreter would, without paying its imports again
for conn_string, action in json.loads(sys.argv[1]):
    assert threading.active_count() == 1, threading.enumerate()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            case(conn_string, action)
            code = 0
        except BaseException:
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        sys.exit(f"the case {conn_string} {action} failed")
"""


def children(cases: list[tuple[str, str]]) -> list[dict[str, Any]]:
    """Open each ``(conn_string, action)`` with the saver in a child process that obeys
    permissions (one process per case), read the seed, then ``action`` (``put``,
    ``sync_put`` or ``read``); what happened in each, as a dict."""
    proc = run_unprivileged(["python", "-c", CHILD, json.dumps(cases)])
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    reports = [json.loads(line) for line in proc.stdout.strip().splitlines()]
    assert len(reports) == len(cases), proc.stdout
    return reports


@pytest.fixture
def home(tmp_path: Path) -> Iterator[Path]:
    """A writable directory, given back writable for pytest to clean up."""
    yield tmp_path
    make_writable_again(tmp_path)


def test_read_only_file_refused_at_open_naming_it(home: Path) -> None:
    path = home / "agent.db"
    seed = seed_db(path)
    path.chmod(0o444)
    assert os_refuses_write(path)  # the OS really refuses this user the write
    before = listing(home)

    for report in children([(str(path), action) for action in ("put", "sync_put", "read")]):
        assert report["opened"] is False  # refused at open, before any read or write
        assert report["error"][:2] == ["ReadOnlyDatabaseError", "DatabasePermissionError"]
        assert "PermissionError" in report["error"]
        assert report["path"] == str(path) and str(path) in report["message"]
        assert "read-only" in report["message"] and "mode=ro" in report["message"]
    assert listing(home) == before  # not even a -wal/-shm was created

    # opened read-only on purpose: reads work, the write is refused on first use
    [report] = children([(f"file:{path}?mode=ro", "put")])
    assert report["opened"] is True and report["read"] == seed and report["wrote"] is False
    assert report["error"][0] == "ReadOnlyDatabaseError"
    assert str(path) in report["message"] and "nothing was written" in report["message"]
    assert listing(home)[path.name] == before[path.name]


def test_read_only_directory_refused_at_open_naming_it(home: Path) -> None:
    directory = home / "ro"
    directory.mkdir()
    path = directory / "agent.db"
    seed = seed_db(path)
    directory.chmod(0o555)
    assert os_refuses_write(directory)
    assert not os_refuses_write(path)  # the file itself is writable: the directory is not
    before = listing(directory)

    new = directory / "new.db"
    *wal, created, ro, immutable = children(
        [
            (str(path), "put"),
            (str(path), "sync_put"),
            (str(new), "put"),
            (f"file:{path}?mode=ro", "read"),
            (f"file:{path}?immutable=1", "put"),
        ]
    )
    # an existing WAL database: SQLite could not create its -wal/-shm files
    for report in wal:
        assert report["opened"] is False
        assert report["error"][0] == "ReadOnlyDatabaseError", report
        assert report["path"] == str(path)
        assert f"directory {directory} is not writable" in report["message"]
        assert "agent.db-wal" in report["message"] and "immutable=1" in report["message"]

    # a new database there cannot be created
    report = created
    assert report["error"][0] == "ReadOnlyDatabaseError" and report["path"] == str(new)
    assert "cannot create" in report["message"] and str(directory) in report["message"]

    # mode=ro cannot read a WAL database there either, and says what can
    report = ro
    assert report["opened"] is False and report["error"][0] == "ReadOnlyDatabaseError"
    assert "immutable=1" in report["message"] and str(path) in report["message"]

    # immutable=1 reads it; writes are refused, typed
    report = immutable
    assert report["opened"] is True and report["read"] == seed
    assert report["error"][0] == "ReadOnlyDatabaseError" and report["wrote"] is False
    assert listing(directory) == before


# --- PostgreSQL ----------------------------------------------------------------------------


async def test_postgres_bad_targets_are_typed(pg_server_dsn: str) -> None:
    from psycopg.conninfo import make_conninfo

    from langgraph_idem_saver.postgres import AsyncPostgresSaver

    with pytest.raises(ConfigError, match="bad PostgreSQL connection string") as info:
        async with AsyncPostgresSaver.from_conn_string("postgresql://u:secret@[::1"):
            pass
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="bogus_option"):
        async with AsyncPostgresSaver.from_conn_string("bogus_option=1 dbname=x"):
            pass

    missing = make_conninfo(pg_server_dsn, dbname="idem_no_such_database")
    with pytest.raises(ConnectionClosedError, match="idem_no_such_database") as closed:
        async with AsyncPostgresSaver.from_conn_string(missing):
            pass
    assert "does not exist" in str(closed.value)

    with pytest.raises(ConnectionClosedError, match="port 1 failed"):
        async with AsyncPostgresSaver.from_conn_string("postgresql://u@127.0.0.1:1/x"):
            pass


async def test_postgres_read_only_session_refuses_writes_typed(pg_dsn: str) -> None:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    from langgraph_idem_saver.postgres import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        stored = await saver.aput(cfg(SEED), empty_checkpoint(), {"step": 0}, {})
    options = str(conninfo_to_dict(pg_dsn).get("options") or "")
    read_only = make_conninfo(pg_dsn, options=f"{options} -c default_transaction_read_only=on")
    async with AsyncPostgresSaver.from_conn_string(read_only) as saver:
        tup = await saver.aget_tuple(cfg(SEED))
        assert tup is not None and tup.config == stored
        for write in (
            saver.aput(cfg(), empty_checkpoint(), {}, {}),
            asyncio.to_thread(saver.put, cfg(), empty_checkpoint(), {}, {}),
        ):
            with pytest.raises(ReadOnlyDatabaseError) as info:
                await write
            assert "read-only" in str(info.value) and "nothing was written" in str(info.value)
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        assert [t.config async for t in saver.alist(None)] == [stored]


# --- the import surface --------------------------------------------------------------------


def without(blocked: tuple[str, ...], name: str) -> str:
    """A program that imports the package as if the ``blocked`` modules were not installed
    (its extra left out) and prints what ``import *`` gave, the error importing ``name``
    raised, and ``dir()`` of the package, as JSON."""
    return f"""
import json, sys
for blocked in {blocked!r}:
    sys.modules[blocked] = None
namespace = {{}}
exec("from langgraph_idem_saver import *", namespace)
report = {{"star": sorted(k for k in namespace if not k.startswith("__"))}}
try:
    from langgraph_idem_saver import {name}
except ImportError as exc:
    report["error"] = [type(exc).__name__, str(exc)]
import langgraph_idem_saver
report["dir"] = dir(langgraph_idem_saver)
print(json.dumps(report))
"""


NO_POSTGRES = without(("psycopg", "psycopg_pool"), "AsyncPostgresSaver")


def run_report(code: str) -> dict[str, Any]:
    """Run ``code`` in a fresh interpreter; what it printed, as JSON."""
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def test_star_import_without_the_postgres_extra() -> None:
    report = run_report(NO_POSTGRES)
    assert "AsyncSqliteSaver" in report["star"] and "IdempotentToolNode" in report["star"]
    assert "AsyncPostgresSaver" not in report["star"]
    kind, message = report["error"]
    assert kind == "ImportError"
    assert "pip install 'langgraph-idem-saver[postgres]'" in message
    assert "AsyncPostgresSaver" in message and "psycopg" in message
    assert "AsyncPostgresSaver" in report["dir"]  # still discoverable


def test_dir_lists_the_lazily_loaded_names() -> None:
    code = (
        "import json, langgraph_idem_saver as m; "
        "print(json.dumps([sorted(vars(m)), dir(m), sorted(m.__all__)]))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert proc.returncode == 0, proc.stderr
    loaded, listed, exported = json.loads(proc.stdout)
    assert "AsyncSqliteSaver" not in loaded  # lazy: not imported yet...
    assert "AsyncSqliteSaver" in listed and "IdempotentToolNode" in listed  # ...yet listed
    assert set(exported) <= set(listed)
    assert listed == sorted(listed)
    assert set(dir(langgraph_idem_saver)) >= set(langgraph_idem_saver.__all__)
    for name in langgraph_idem_saver.__all__:
        assert getattr(langgraph_idem_saver, name) is not None


def test_every_bad_path_error_is_exported() -> None:
    for name in ("ReadOnlyDatabaseError", "DatabasePermissionError", "ConfigError"):
        assert name in langgraph_idem_saver.__all__
        assert issubclass(getattr(langgraph_idem_saver, name), IdemSaverError)
    assert issubclass(ReadOnlyDatabaseError, PermissionError)
    assert not issubclass(NotADatabaseError, PermissionError)


NO_LANGCHAIN = without(("langchain",), "IdempotencyMiddleware")


def test_star_import_without_the_agents_extra() -> None:
    report = run_report(NO_LANGCHAIN)
    assert "IdempotentToolNode" in report["star"] and "idempotent_task" in report["star"]
    assert "IdempotencyMiddleware" not in report["star"]
    kind, message = report["error"]
    assert kind == "ImportError" and "pip install 'langgraph-idem-saver[agents]'" in message
