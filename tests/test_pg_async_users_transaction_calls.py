"""``AsyncPostgresSaver(conn)`` with a transaction of the user's open on ``conn``, call by
call (the decisions in the class docstring; the ledger's refusal is
``test_pg_async_users_transaction.py``):

* ``setup()`` joins it, but the saver does not count itself set up: after the user's
  rollback took the tables with it, the next call creates them again and works (it
  raised psycopg's ``UndefinedTable`` when the saver trusted a rolled-back setup);
  after a commit, a setup outside it is remembered;
* maintenance (``adelete_thread``, ``adelete_for_runs``, ``acopy_thread``, ``aprune``)
  joins it: seen inside it, all undone by a rollback (read back afterwards, and the
  thread written to again and read back whole), kept by a commit;
* a transaction of the user's that failed makes a checkpoint call and a ledger call
  raise ``ConfigError``, not psycopg's ``InFailedSqlTransaction``; after the rollback both
  work.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from psycopg import AsyncConnection
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tool_node_helpers import intent_for

from langgraph_idem_saver import AsyncPostgresSaver, ConfigError, DatabaseLockedError


class _Rollback(Exception):
    """Ends the user's transaction with a rollback."""


def config(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def tables(dsn: str) -> set[str]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchall()
    return {r[0] for r in rows}


async def put(saver: AsyncPostgresSaver, thread: str, value: str, step: int) -> RunnableConfig:
    checkpoint = create_checkpoint(empty_checkpoint(), None, step)
    checkpoint["channel_values"] = {"v": value}
    checkpoint["channel_versions"] = {"v": f"{step:032}.0"}
    metadata: Any = {"step": step, "source": "loop", "run_id": f"run-{thread}"}
    return await saver.aput(config(thread), checkpoint, metadata, {"v": f"{step:032}.0"})


async def value(saver: AsyncPostgresSaver, thread: str) -> str | None:
    found = await saver.aget_tuple(config(thread))
    return None if found is None else found.checkpoint["channel_values"].get("v")


@asynccontextmanager
async def user_connection(dsn: str) -> AsyncIterator[AsyncConnection[Any]]:
    async with await AsyncConnection.connect(dsn, autocommit=True) as conn:
        yield conn


async def test_setup_inside_the_users_rolled_back_transaction_is_not_trusted(
    pg_dsn: str,
) -> None:
    async with user_connection(pg_dsn) as conn:
        saver = AsyncPostgresSaver(conn)
        with pytest.raises(_Rollback):
            async with conn.transaction():
                await saver.setup()  # joins the user's transaction
                await put(saver, "a", "inside", 1)  # works inside it (joined too)
                assert await value(saver, "a") == "inside"
                raise _Rollback
        assert "idem_checkpoints" not in tables(pg_dsn)  # gone with the rollback
        await put(saver, "a", "after", 2)  # creates the tables again, then writes
        assert saver.is_setup
        assert await value(saver, "a") == "after"
    assert "idem_checkpoints" in tables(pg_dsn)


async def test_setup_inside_the_users_committed_transaction_then_outside(pg_dsn: str) -> None:
    async with user_connection(pg_dsn) as conn:
        saver = AsyncPostgresSaver(conn)
        async with conn.transaction():
            await saver.setup()
        assert not saver.is_setup and "idem_checkpoints" in tables(pg_dsn)
        await saver.setup()  # outside: remembered
        assert saver.is_setup


Maintenance = Callable[[AsyncPostgresSaver], Awaitable[None]]
MAINTENANCE: dict[str, Maintenance] = {
    "adelete_thread": lambda s: s.adelete_thread("a"),
    "adelete_for_runs": lambda s: s.adelete_for_runs(["run-a"]),
    "aprune": lambda s: s.aprune(["a"], strategy="delete"),
    "acopy_thread": lambda s: s.acopy_thread("a", "b"),
}


async def states(saver: AsyncPostgresSaver) -> tuple[str | None, str | None]:
    return await value(saver, "a"), await value(saver, "b")


@pytest.mark.parametrize("name", sorted(MAINTENANCE))
async def test_maintenance_joins_the_users_transaction(pg_dsn: str, name: str) -> None:
    before = ("two", None)
    after = ("two", "two") if name == "acopy_thread" else (None, None)
    async with user_connection(pg_dsn) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        await put(saver, "a", "one", 1)
        await put(saver, "a", "two", 2)
        with pytest.raises(_Rollback):
            async with conn.transaction():
                await MAINTENANCE[name](saver)
                assert await states(saver) == after  # joined: seen inside it
                raise _Rollback
        assert await states(saver) == before  # undone with it
        assert len([t async for t in saver.alist(config("a"))]) == 2
        await put(saver, "a", "three", 3)  # written to again, read back whole
        assert await value(saver, "a") == "three"
        async with conn.transaction():
            await MAINTENANCE[name](saver)
        expected = ("three", "three") if name == "acopy_thread" else (None, None)
        assert await states(saver) == expected  # committed with it


async def test_a_failed_users_transaction_gives_config_error(pg_dsn: str) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    async with user_connection(pg_dsn) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        with pytest.raises(_Rollback):
            async with conn.transaction():
                with pytest.raises(psycopg.errors.DivisionByZero):
                    await conn.execute("SELECT 1 / 0")
                with pytest.raises(ConfigError, match="has failed"):
                    await saver.aget_tuple(config("a"))
                with pytest.raises(ConfigError, match="transaction of yours open"):
                    await saver.aclaim([intent], owner="o", lease_seconds=60)
                raise _Rollback
        assert await saver.aget_tuple(config("a")) is None
        [claim] = await saver.aclaim([intent], owner="o", lease_seconds=60)
        assert claim.claimed


async def test_a_lock_timeout_inside_the_users_transaction_says_to_roll_it_back(
    pg_dsn: str,
) -> None:
    """A checkpoint write joining the user's transaction and refused on ``lock_timeout``
    is ``DatabaseLockedError`` saying the user's transaction is aborted and must be
    rolled back before a retry - not "its transaction was rolled back: retry it", which a
    retry inside it would contradict (``ConfigError``: it has failed). Outside it, the
    same refusal says "retry it", and a retry works."""
    options = conninfo_to_dict(pg_dsn).get("options") or ""  # it sets the test's schema
    dsn = make_conninfo(pg_dsn, options=f"{options} -c lock_timeout=200ms")
    async with user_connection(dsn) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        async with await AsyncConnection.connect(pg_dsn) as other:
            await other.execute("LOCK TABLE idem_checkpoints IN EXCLUSIVE MODE")
            with pytest.raises(_Rollback):
                async with conn.transaction():
                    with pytest.raises(DatabaseLockedError, match="roll your transaction back"):
                        await put(saver, "a", "inside", 1)
                    with pytest.raises(ConfigError, match="has failed"):  # as the error said
                        await put(saver, "a", "inside", 1)
                    raise _Rollback
            with pytest.raises(DatabaseLockedError, match=r"was rolled back.*: retry it$"):
                await put(saver, "a", "outside", 1)
            await other.rollback()
        await put(saver, "a", "outside", 1)
        assert await value(saver, "a") == "outside"


async def test_setup_inside_the_users_transaction_holds_no_other_savers_setup_back(
    pg_dsn: str,
) -> None:
    """``setup()`` inside a transaction of the user's on a schema already current takes
    no migration lock: that lock (``pg_advisory_xact_lock``) would be held until the user
    ends their transaction, and every other saver's ``setup()`` - a worker starting -
    would wait for it (here: refused on its ``lock_timeout``)."""
    options = conninfo_to_dict(pg_dsn).get("options") or ""
    impatient = make_conninfo(pg_dsn, options=f"{options} -c lock_timeout=500ms")
    async with user_connection(pg_dsn) as conn:
        await AsyncPostgresSaver(conn).setup()  # the schema is current
        saver = AsyncPostgresSaver(conn)
        async with conn.transaction():
            await saver.setup()  # inside the user's transaction, still open below
            async with user_connection(impatient) as other_conn:
                other = AsyncPostgresSaver(other_conn)
                await other.setup()  # a worker starting meanwhile
                assert other.is_setup
