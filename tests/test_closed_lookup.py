"""A closed ledger or sync saver still HAS its methods; calling one raises the typed error.

Python's attribute contract: looking a name up succeeds or raises ``AttributeError``.
``hasattr``, ``getattr(obj, name, None)`` and ``isinstance`` with a runtime-checkable
protocol (``AnswerRecorder``, what ``model_record`` checks) rely on it, so a closed
``ToolLedger`` must not raise ``ConnectionClosedError`` at lookup: only the call (awaited,
or a sync method called) raises it. An unknown name stays an ``AttributeError``. Real
SQLite files and a real PostgreSQL (``pg_dsn``); nothing mocked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from psycopg_pool import ConnectionPool

from langgraph_idem_saver import SqliteSaver, ToolLedger
from langgraph_idem_saver.answer_records import AnswerRecorder
from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.ledger import Outcome, ToolCallLedger
from langgraph_idem_saver.postgres import PostgresSaver

# every forwarded ledger method (``ForwardedLedger``) and the two ToolLedger adds
LEDGER_METHODS = (
    "aclaim",
    "aclaim_step",
    "areclaim",
    "arelease",
    "aabandon",
    "aadopt",
    "aget_entry",
    "afind_orphans",
    "afind_at_position",
    "afind_step_candidates",
    "alist_entries",
    "alist_issued",
    "alist_unknown",
    "aresolve",
    "aoperator_update",
    "anote_replay",
    "arecord_answer",
    "record_outcome",
)
TOOL_LEDGER_EXTRA = ("acopy_thread", "adelete_thread")
SYNC_SAVER_EXTRA = ("get_tuple", "put", "put_writes", "list", "aget_tuple", "alist")


def closed_tool_ledger(tmp_path: Path, how: str) -> ToolLedger:
    """A ToolLedger on a real SQLite file, opened ``how`` and closed."""
    ledger = ToolLedger(str(tmp_path / f"ledger-{how}.db"))
    if how == "with":
        with ledger:
            pass
    elif how == "async with":

        async def run() -> None:
            async with ledger:
                pass

        asyncio.run(run())
    elif how == "first use":
        assert asyncio.run(ledger.aget_entry("s", "k")) is None  # opens it
        ledger.close()
    else:  # never opened
        ledger.close()
    assert ledger.closed
    return ledger


def assert_lookups_succeed(obj: object, names: tuple[str, ...]) -> None:
    for name in names:
        assert hasattr(obj, name), name
        assert getattr(obj, name, None) is not None, name
        assert callable(getattr(obj, name)), name
    assert isinstance(obj, ToolCallLedger)
    assert isinstance(obj, AnswerRecorder)  # runtime-checkable: reads the attribute
    assert not hasattr(obj, "no_such_method")
    missing = "no_such_method"
    with pytest.raises(AttributeError):
        getattr(obj, missing)
    assert getattr(obj, "no_such_method", None) is None


async def assert_ledger_calls_raise(ledger: Any) -> None:
    """Each kind of ledger method, awaited, raises the typed error."""
    with pytest.raises(ConnectionClosedError):
        await ledger.aget_entry("scope", "key")
    with pytest.raises(ConnectionClosedError):
        await ledger.alist_entries("thread")
    with pytest.raises(ConnectionClosedError):
        await ledger.alist_unknown()
    with pytest.raises(ConnectionClosedError):  # a sync method returning an awaitable
        await ledger.record_outcome(
            "scope", "key", owner="o", outcome=Outcome.completed(None, None)
        )


@pytest.mark.parametrize("how", ["with", "async with", "first use", "never opened"])
def test_a_closed_tool_ledger_has_its_methods_and_each_call_raises(
    tmp_path: Path, how: str
) -> None:
    ledger = closed_tool_ledger(tmp_path, how)
    assert_lookups_succeed(ledger, LEDGER_METHODS + TOOL_LEDGER_EXTRA)
    asyncio.run(assert_ledger_calls_raise(ledger))


def test_a_closed_tool_ledger_used_from_a_loop_raises_when_awaited(tmp_path: Path) -> None:
    """Looked up and called on a running loop (the front doors' case): the coroutine is
    made, and awaiting it raises; ``record_outcome`` from a loop that is not the ledger's
    goes through its hop and raises the same."""
    ledger = closed_tool_ledger(tmp_path, "with")

    async def run() -> None:
        pending = ledger.aget_entry("scope", "key")  # lookup and call: no error yet
        with pytest.raises(ConnectionClosedError):
            await pending
        await assert_ledger_calls_raise(ledger)

    asyncio.run(run())


def sqlite_saver(tmp_path: Path) -> AbstractContextManager[SqliteSaver]:
    return SqliteSaver.from_conn_string(str(tmp_path / "sync.db"))


def cfg(thread: str) -> RunnableConfig:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def assert_sync_saver_closed(saver: Any) -> None:
    assert saver.closed
    assert_lookups_succeed(saver, LEDGER_METHODS + SYNC_SAVER_EXTRA)
    with pytest.raises(ConnectionClosedError):
        saver.get_tuple(cfg("t"))
    with pytest.raises(ConnectionClosedError):
        list(saver.list(cfg("t")))
    with pytest.raises(ConnectionClosedError):
        asyncio.run(saver.aget_tuple(cfg("t")))
    asyncio.run(assert_ledger_calls_raise(saver))


def test_a_closed_sqlite_saver_has_its_methods_and_each_call_raises(tmp_path: Path) -> None:
    with sqlite_saver(tmp_path) as saver:
        assert saver.get_tuple(cfg("t")) is None
    assert_sync_saver_closed(saver)


PgOpener = Callable[[str], Generator[PostgresSaver, None, None]]


def pg_from_conn_string(dsn: str) -> Generator[PostgresSaver, None, None]:
    with PostgresSaver.from_conn_string(dsn) as saver:
        yield saver


def pg_over_connection(dsn: str) -> Generator[PostgresSaver, None, None]:
    with psycopg.Connection.connect(dsn, autocommit=True) as conn, PostgresSaver(conn) as saver:
        yield saver


def pg_over_pool(dsn: str) -> Generator[PostgresSaver, None, None]:
    with ConnectionPool(dsn, min_size=1, max_size=2) as pool, PostgresSaver(pool) as saver:
        yield saver


@pytest.mark.parametrize("opener", [pg_from_conn_string, pg_over_connection, pg_over_pool])
def test_a_closed_postgres_saver_has_its_methods_and_each_call_raises(
    pg_dsn: str, opener: PgOpener
) -> None:
    opened = opener(pg_dsn)
    saver = next(opened)
    try:
        saver.setup()
        assert saver.get_tuple(cfg("t")) is None
    finally:
        opened.close()  # leaves the with blocks: the saver is closed
    assert_sync_saver_closed(saver)
