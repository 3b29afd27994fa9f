"""Promises of ``docs/guarantees.md`` ("Locks and timeouts lose nothing either") that
``tests/test_pg_contention.py`` leaves to the code: each sentence below is shown here.

* "one past ``statement_timeout`` (or cancelled by ``pg_cancel_backend``)
  ``StatementTimeoutError`` (a ``TimeoutError``) ... a claim ... refused so wrote nothing":
  an operator cancels the saver's backend while its claim waits on another session's lock;
* "a release or an abandon refused so is run again before the next statement": the
  abandon (a tool that raised: its lease ended, its error kept), refused on
  ``lock_timeout``, has ended the lease by the saver's next read;
* "an outcome refused so is retried ..., then kept and written before the saver's next
  statement, the node raising the same typed error saying so": a real
  ``IdempotentToolNode`` step whose outcome meets a lock held past the retries raises
  ``DatabaseLockedError`` ("kept by the saver"), the tool ran once, the next statement
  writes the outcome, and the resumed run replays it (``lock_timeout`` and
  ``statement_timeout``: the README says it of ``StatementTimeoutError`` too).

Real PostgreSQL, another session holding ``LOCK TABLE ... IN EXCLUSIVE MODE``.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from pg_blocking import charge_intent, table_locked, with_setting
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from tool_node_helpers import Counter, ai_calls, cfg, scripted_model, tool_messages

from langgraph_idem_saver import (
    AsyncPostgresSaver,
    DatabaseLockedError,
    IdempotentToolNode,
    StatementTimeoutError,
)
from langgraph_idem_saver.ledger import CallStatus

OWNER = "host:1:promise"
KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
TIMEOUTS = {"lock_timeout": DatabaseLockedError, "statement_timeout": StatementTimeoutError}


def waiting_backend(dsn: str, application_name: str) -> int:
    """The pid of the backend named ``application_name`` once it waits on a lock."""
    query = (
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND application_name = %s"
    )
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while (row := conn.execute(query, (application_name,)).fetchone()) is None:
            assert time.monotonic() < deadline, "the saver's claim never waited on the lock"
            time.sleep(0.01)
    return int(row[0])


def count(dsn: str, where: str = "") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM idem_tool_calls {where}").fetchone()
    assert row is not None
    return int(row[0])


async def test_an_operators_pg_cancel_backend_is_a_statement_timeout_writing_nothing(
    pg_dsn: str,
) -> None:
    name = f"promise-cancel-{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(pg_dsn, application_name=name)  # no timeout set: it would wait
    async with AsyncConnectionPool(dsn, min_size=1, max_size=1, kwargs=KWARGS) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        with table_locked(pg_dsn, "idem_tool_calls"):
            claiming = asyncio.create_task(
                saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=60)
            )
            pid = await asyncio.to_thread(waiting_backend, pg_dsn, name)
            with psycopg.connect(pg_dsn, autocommit=True) as operator:
                assert operator.execute("SELECT pg_cancel_backend(%s)", (pid,)).fetchone() == (
                    True,
                )
            with pytest.raises(StatementTimeoutError, match="pg_cancel_backend") as raised:
                await asyncio.wait_for(claiming, 10)
        assert isinstance(raised.value, TimeoutError)
        assert isinstance(raised.value.__cause__, psycopg.errors.QueryCanceled)
        assert count(pg_dsn) == 0  # nothing written
        [again] = await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=60)
        assert again.claimed  # the connection is still good: retry it


async def test_an_abandon_refused_on_a_lock_is_run_again_before_the_next_statement(
    pg_dsn: str,
) -> None:
    dsn = with_setting(pg_dsn, "lock_timeout", "100ms")
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=KWARGS) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        [claim] = await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        assert claim.claimed
        with table_locked(pg_dsn, "idem_tool_calls"), pytest.raises(DatabaseLockedError):
            await saver.aabandon("t", "k", owner=OWNER, error="the tool raised")
        # the control: the lock held, the abandon wrote nothing (the lease still runs)
        assert count(pg_dsn, f"WHERE lease_expires_at > {time.time() + 200}") == 1
        entry = await saver.aget_entry("t", "k")  # the abandon runs again first
    assert entry is not None and entry.status is CallStatus.ISSUED
    assert entry.lease_expires_at <= time.time()  # its lease ended: asked at once
    assert "the tool raised" in (entry.error or "")


@pytest.mark.parametrize("setting", sorted(TIMEOUTS))
async def test_a_nodes_outcome_refused_past_its_retries_raises_the_typed_error_and_is_kept(
    pg_dsn: str, setting: str
) -> None:
    fx = Counter()
    other: psycopg.Connection[Any] = psycopg.connect(pg_dsn)
    released = threading.Event()

    def release() -> None:
        other.rollback()
        released.set()

    @tool
    def charge(amount: int) -> str:
        """Charge; another session locks the ledger's table for longer than the retries."""
        other.execute("LOCK TABLE idem_tool_calls IN EXCLUSIVE MODE")
        threading.Timer(1.0, release).start()
        fx.bump(amount)
        return f"charged {amount}"

    dsn = with_setting(pg_dsn, setting, "100ms")
    model = scripted_model(ai_calls(("charge", {"amount": 5}, "k1")), AIMessage("ok", id="ai-ok"))
    try:
        async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=KWARGS) as pool:
            saver = AsyncPostgresSaver(pool)
            await saver.setup()
            saver.outcome_retry_seconds = 0.3
            graph = create_react_agent(model, IdempotentToolNode([charge]), checkpointer=saver)
            with pytest.raises(TIMEOUTS[setting], match="kept by the saver"):
                await graph.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
            assert count(pg_dsn, "WHERE status = 'issued'") == 1  # not written yet
            assert await asyncio.to_thread(released.wait, 10)
            out = await graph.ainvoke(None, cfg("t"))  # its first statement writes it
            assert tool_messages(out)[-1].content == "charged 5"
            [entry] = await saver.alist_entries("t")
            assert entry.status is CallStatus.COMPLETED and entry.replays == 1
    finally:
        other.close()
    assert fx.calls == [5]  # run once: replayed, not run again
