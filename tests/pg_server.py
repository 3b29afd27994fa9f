"""A real PostgreSQL server for the tests, and an isolated schema per saver.

* :func:`server_dsn` - the DSN of the server this test session uses: ``$IDEM_SAVER_PG_DSN``
  when set (any PostgreSQL >= 12 you point it at; the tests only create and drop schemas
  named ``idem_test_*`` in it), otherwise a throwaway server started once per process
  with ``pgserver`` (PostgreSQL 16 shipped in a PyPI wheel) in a temporary directory,
  stopped and deleted at exit. As root, pgserver runs the server as its own unprivileged
  ``pgserver`` user (created on first use), so nothing to do by hand there either. The
  throwaway server runs with ``fsync=off``: tests don't need durability, and it makes
  them several times faster. Its data directory is ``$TMPDIR/idem-saver-pg-*`` (every
  server the tests and notebooks start has ``idem-`` in its ``-D`` path, so a leftover
  is easy to spot: ``pgrep -af 'pginstall/bin/postgres' | grep idem-``).
* Nothing is left running: pgserver stops the server at a normal exit (also after a
  failure or Ctrl-C); a watchdog process (``process_guard.watch_postgres``) stops it when
  pytest is killed instead (SIGTERM, SIGKILL); and at exit, child processes a failed test
  left behind are ended (``process_guard.end_leftover_children``).
* :func:`throwaway_server` - another such server, for a test that must own one (restart
  it, say); watched the same way.
* :func:`fresh_dsn` / :func:`afresh_dsn` - a new empty schema on that server and a DSN
  whose ``search_path`` is that schema alone: every saver built from it sees only its own
  tables, so tests never see each other's rows (and it costs a few ms, not a
  ``CREATE DATABASE``).
* Fixtures ``pg_server_dsn`` (session) and ``pg_dsn`` (a fresh schema per test); pull
  them into a conftest with ``from pg_server import pg_dsn, pg_server_dsn``. Without a
  server to be had (no ``$IDEM_SAVER_PG_DSN``, no pgserver) they skip the test - but fail
  it under ``CI=true`` (:func:`require_postgres`), so CI never passes a Postgres test it
  did not run.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from process_guard import end_leftover_children, mark_test_run, watch_postgres

ENV_DSN = "IDEM_SAVER_PG_DSN"
SCHEMA_PREFIX = "idem_test_"

_lock = threading.Lock()
_server: Any = None
_dsn: str | None = None
_created: list[tuple[str, str]] = []  # (server dsn, schema) to drop at exit
_counter = itertools.count()


def postgres_available() -> bool:
    """Whether a server can be had: the env DSN is set, or pgserver is installed."""
    if os.environ.get(ENV_DSN):
        return True
    try:
        import pgserver  # noqa: F401
    except ImportError:
        return False
    return True


def server_dsn() -> str:
    """The DSN of the session's server (started on first call, once per process)."""
    global _server, _dsn
    with _lock:
        if _dsn is not None:
            return _dsn
        env = os.environ.get(ENV_DSN)
        if env:
            _dsn = env
            return _dsn
        _server = throwaway_server("idem-saver-pg-")
        dsn = str(_server.get_uri())
        _tune_throwaway_server(dsn)
        _dsn = dsn
        return _dsn


def throwaway_server(prefix: str) -> Any:
    """Start a pgserver server in a new ``$TMPDIR/<prefix>*`` directory (``prefix`` should
    start with ``idem-``): stopped and deleted when this process exits, however it exits."""
    import pgserver

    pgdata = tempfile.mkdtemp(prefix=prefix)
    watch_postgres(pgdata)  # before the server exists: never a moment without a watch
    return pgserver.get_server(pgdata, cleanup_mode="delete")  # type: ignore[attr-defined]


def _tune_throwaway_server(dsn: str) -> None:
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as conn:
        for setting in (
            "fsync = off",
            "synchronous_commit = off",
            "full_page_writes = off",
            "max_connections = 200",
        ):
            conn.execute(f"ALTER SYSTEM SET {setting}")
        conn.execute("SELECT pg_reload_conf()")


def _with_search_path(dsn: str, schema: str) -> str:
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c search_path={schema}".strip())


def _new_schema_name() -> str:
    return f"{SCHEMA_PREFIX}{os.getpid()}_{next(_counter)}_{uuid.uuid4().hex[:8]}"


def fresh_dsn(base: str | None = None) -> str:
    """Create an empty schema and return a DSN that sees only it (blocking)."""
    import psycopg

    base = base or server_dsn()
    schema = _new_schema_name()
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    _created.append((base, schema))
    return _with_search_path(base, schema)


async def afresh_dsn(base: str | None = None) -> str:
    """:func:`fresh_dsn` for event-loop code (the server is started in a worker thread)."""
    import asyncio

    import psycopg

    if base is None:
        base = await asyncio.to_thread(server_dsn)
    schema = _new_schema_name()
    async with await psycopg.AsyncConnection.connect(base, autocommit=True) as conn:
        await conn.execute(f'CREATE SCHEMA "{schema}"')
    _created.append((base, schema))
    return _with_search_path(base, schema)


def drop_created_schemas() -> None:
    """Drop the schemas this process created (only matters on a server we keep)."""
    if not _created or _server is not None:  # a throwaway server is deleted anyway
        _created.clear()
        return
    import psycopg

    by_server: dict[str, list[str]] = {}
    for base, schema in _created:
        by_server.setdefault(base, []).append(schema)
    _created.clear()
    for base, schemas in by_server.items():
        try:
            with psycopg.connect(base, autocommit=True) as conn:
                for schema in schemas:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        except Exception:  # best effort: never fail a test run over cleanup
            pass


atexit.register(drop_created_schemas)
atexit.register(end_leftover_children)
mark_test_run()  # the processes the tests start know whose they are


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set, as ``.ci/run`` sets it: ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_postgres() -> None:
    """Skip the test when no PostgreSQL can be had - except in CI, where that fails it:
    a CI run that cannot start a server must not turn every Postgres test green."""
    if postgres_available():
        return
    reason = f"no PostgreSQL: set {ENV_DSN} or install pgserver"
    if in_ci():
        pytest.fail(f"{reason} (CI: a Postgres test never skips)", pytrace=False)
    pytest.skip(reason)


@pytest.fixture(scope="session")
def pg_server_dsn() -> Iterator[str]:
    """The session's PostgreSQL DSN (skips the test when none can be had; fails it in
    CI). A server that cannot start fails the test anywhere."""
    require_postgres()
    yield server_dsn()
    drop_created_schemas()


@pytest.fixture
def server_tmp_dir() -> Iterator[Path]:
    """A temp dir for a test that starts PostgreSQL servers (set TMPDIR to it), outside
    pytest's ``tmp_path``: every pytest that starts chmods ``pytest-of-<user>`` back to
    0700, and as root pgserver runs the server as its own ``pgserver`` user, who must
    still reach the data directory then. Removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="idem-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def pg_dsn(pg_server_dsn: str) -> str:
    """A DSN whose search_path is a new, empty schema: one per test."""
    return fresh_dsn(pg_server_dsn)
