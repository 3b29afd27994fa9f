"""``PostgresSaver(conn)`` / ``PostgresSaver(pool)`` hold no session of their own after a
call returns, so a database can be dropped once the user's connection or pool is closed -
without closing the saver - as LangGraph's own saver tests do (``CREATE DATABASE``, use the
saver, close the pool, ``DROP DATABASE``).

Every kind of call is made: the direct path (``put``, ``put_writes``, ``get_tuple``,
``list``), and the loop path (``setup()``, the ledger - a claim and its outcome -,
maintenance), whose statements run on the user's connection or pool too. The control: a
session left open on the database makes the same ``DROP DATABASE`` fail (``ObjectInUse``),
so the test can see one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from tool_node_helpers import intent_for

from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, Outcome
from langgraph_idem_saver.postgres import PostgresSaver


@pytest.fixture
def database(pg_server_dsn: str) -> Iterator[tuple[str, str]]:
    """A database of its own: (its name, a DSN to it); dropped at the end if still there."""
    name = f"idem_drop_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name, make_conninfo(pg_server_dsn, dbname=name)
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def use(saver: PostgresSaver) -> None:
    """Every kind of call, direct and on the saver's loop."""
    saver.setup()
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    stored = saver.put(config, empty_checkpoint(), {"source": "input"}, {})
    saver.put_writes(stored, [("x", 1)], "task-1")
    assert saver.get_tuple(stored) is not None
    assert len(list(saver.list(None))) == 1
    # the ledger, as the front doors drive it (from any event loop: it hops to the saver's)
    intent = intent_for("t", {"name": "charge", "args": {"amount": 3}, "id": "c1"})
    [claim] = asyncio.run(saver.aclaim([intent], owner="worker", lease_seconds=30))
    assert claim.claimed

    async def finish() -> LedgerEntry | None:
        outcome = Outcome.completed(None, None)
        await saver.record_outcome(intent.scope, intent.key, owner="worker", outcome=outcome)
        return await saver.aget_entry(intent.scope, intent.key)

    entry = asyncio.run(finish())
    assert entry is not None and entry.status is CallStatus.COMPLETED
    saver.copy_thread("t", "t2")
    saver.delete_thread("t2")


def drop(server_dsn: str, name: str) -> None:
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE "{name}"')


def test_on_a_users_connection(pg_server_dsn: str, database: tuple[str, str]) -> None:
    name, dsn = database
    conn = psycopg.connect(dsn, autocommit=True, prepare_threshold=0, row_factory=dict_row)
    try:
        saver = PostgresSaver(conn)
        use(saver)
    finally:
        conn.close()  # the user's object closed; the saver never is
    drop(pg_server_dsn, name)


def test_on_a_users_pool(pg_server_dsn: str, database: tuple[str, str]) -> None:
    name, dsn = database
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(dsn, max_size=4, kwargs=kwargs) as pool:
        saver = PostgresSaver(pool)
        use(saver)
    drop(pg_server_dsn, name)


def test_the_control_a_session_left_open_blocks_the_drop(
    pg_server_dsn: str, database: tuple[str, str]
) -> None:
    name, dsn = database
    with psycopg.connect(dsn, autocommit=True), pytest.raises(psycopg.errors.ObjectInUse):
        drop(pg_server_dsn, name)


@pytest.mark.parametrize("how", ["conn", "pool"])
def test_keep_session_is_accepted_and_holds_nothing(
    pg_server_dsn: str, database: tuple[str, str], how: str
) -> None:
    """``keep_session=True`` is kept for compatibility and does nothing (the ledger runs on
    the user's connection or pool: there is no session of the saver's to keep): the drop
    works once the user's object is closed, the saver still open."""
    name, dsn = database
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    if how == "conn":
        users: Any = psycopg.connect(dsn, **kwargs)
    else:
        users = ConnectionPool(dsn, max_size=4, kwargs=kwargs, open=True)
    saver = PostgresSaver(users, keep_session=True)
    try:
        use(saver)
        users.close()
        drop(pg_server_dsn, name)
    finally:
        users.close()
        saver.close()
