"""Holding our saver's statements on a PostgreSQL lock, for the tests that kill a backend
or a server while a statement waits (``test_postgres_specific.py``, ``test_faults.py``,
``test_db_restart.py``).

A statement waiting on a row lock is a statement in flight at a moment the test chooses:
terminating its backend then is the "connection lost mid-call" the saver must survive.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg_pool import AsyncConnectionPool

from langgraph_idem_saver.ledger import CallIntent


async def admin(dsn: str) -> psycopg.AsyncConnection[Any]:
    """A connection of the test's own, outside any saver (autocommit)."""
    return await psycopg.AsyncConnection.connect(dsn, autocommit=True)


async def wait_until_blocked(dsn: str, n: int = 1) -> None:
    """Return once ``n`` backends of this database wait on a lock (10 s at most)."""
    async with await admin(dsn) as conn:
        for _ in range(500):
            cur = await conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database()"
            )
            row = await cur.fetchone()
            if row and row[0] >= n:
                return
            await asyncio.sleep(0.02)
    raise AssertionError("the saver's statement never blocked")


@asynccontextmanager
async def named_pool(dsn: str, name: str, size: int) -> AsyncIterator[AsyncConnectionPool]:
    """An open pool of ``size`` autocommit connections, every one of them ready, whose
    backends ``pg_stat_activity`` shows under ``application_name`` ``name``."""
    kwargs = {"autocommit": True, "application_name": name}
    async with AsyncConnectionPool(
        dsn, min_size=size, max_size=size, kwargs=kwargs, open=False
    ) as pool:
        await pool.wait()
        yield pool


def charge_intent(key: str) -> CallIntent:
    """A ``charge`` call of thread ``t`` under ``key``, as the ledger is asked to claim it."""
    return CallIntent(
        scope="t",
        key=key,
        thread_id="t",
        agent_path="tools",
        tool_name="charge",
        args_hash="h",
        args=b'{"amount":1}',
        tool_call_id=f"call-{key}",
    )


def with_setting(dsn: str, name: str, value: str) -> str:
    """``dsn`` with ``-c name=value`` added to its ``options``, as a user would set it
    (``lock_timeout``, ``statement_timeout``)."""
    options = conninfo_to_dict(dsn).get("options") or ""
    return make_conninfo(dsn, options=f"{options} -c {name}={value}".strip())


@contextmanager
def table_locked(dsn: str, table: str) -> Iterator[psycopg.Connection[Any]]:
    """Another session holding ``table`` in EXCLUSIVE mode (reads pass, writes wait) until
    the block ends, then rolling back."""
    with psycopg.connect(dsn) as other:
        other.execute(f"LOCK TABLE {table} IN EXCLUSIVE MODE")
        try:
            yield other
        finally:
            other.rollback()
