"""Edges of ``PostgresSaver(conn)`` / ``PostgresSaver(pool)`` running the ledger on the
user's own connections (``postgres/borrowed.py``):

* a transaction of the user's open on an *autocommit* connection (``conn.transaction()``,
  or ``BEGIN``, or one failed inside) is refused with ``ConfigError``, as on a
  non-autocommit one: a claim run inside it would be committed only with it, and gone
  with its rollback - the tool run, nothing remembering it;
* a ``NullConnectionPool`` (``max_size`` 0: no limit) works, ledger included;
* the typed errors of the ledger on a pool: no connection within the pool's timeout, a
  NUL character in a text column;
* the saver's worker threads (a pool's ledger calls) stop at ``close()`` and when a saver
  never closed is collected, and a program that never closes its pool saver still exits.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool, NullConnectionPool
from tool_node_helpers import Counter, ai_calls, cfg, intent_for, scripted_model, tool_messages

from langgraph_idem_saver import (
    CallStatus,
    ConfigError,
    ConnectionClosedError,
    IdempotentToolNode,
    SerializationError,
)
from langgraph_idem_saver.postgres import PostgresSaver

KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


def one_call_agent(saver: PostgresSaver, fx: Counter) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer."""
        fx.bump(amount)
        return f"charged {amount}"

    model = scripted_model(ai_calls(("charge", {"amount": 5}, "k1")), AIMessage("ok", id="ai-ok"))
    return create_react_agent(model, IdempotentToolNode([charge]), checkpointer=saver)


def open_transaction(conn: psycopg.Connection[Any], how: str) -> None:
    """Leave a transaction of the user's open on ``conn`` (autocommit): in progress, or
    failed."""
    conn.execute("BEGIN")
    if how == "failed":
        with pytest.raises(psycopg.errors.DivisionByZero):
            conn.execute("SELECT 1 / 0")


@pytest.mark.parametrize("how", ["open", "failed"])
def test_a_transaction_open_on_an_autocommit_connection_is_refused(pg_dsn: str, how: str) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        psycopg.connect(pg_dsn, **KWARGS) as conn,
        PostgresSaver(conn) as saver,
        psycopg.connect(pg_dsn, autocommit=True) as other,
    ):
        saver.setup()
        open_transaction(conn, how)
        with pytest.raises(ConfigError, match="transaction of yours open"):
            asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        conn.rollback()
        # the same claim once the user's transaction is over: committed before it returns
        [claim] = asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        assert claim.claimed
        assert other.execute("SELECT owner FROM idem_tool_calls").fetchall() == [("a",)]


def test_a_graph_run_inside_the_users_transaction_runs_no_tool(pg_dsn: str) -> None:
    """``graph.invoke`` inside ``with conn.transaction():`` on the saver's autocommit
    connection: the claim is refused before the tool runs (joined, it would vanish with
    the rollback below while the tool's effect stays)."""
    fx = Counter()
    with psycopg.connect(pg_dsn, **KWARGS) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        agent = one_call_agent(saver, fx)
        with (
            pytest.raises(ConfigError, match="transaction of yours open"),
            conn.transaction(force_rollback=True),
        ):
            agent.invoke({"messages": [("user", "pay")]}, cfg("t"))
        assert fx.calls == []
        out = one_call_agent(saver, fx).invoke({"messages": [("user", "pay")]}, cfg("t2"))
        assert tool_messages(out)[-1].content == "charged 5" and fx.calls == [5]


def test_a_null_connection_pool(pg_dsn: str) -> None:
    """A ``NullConnectionPool`` (its default ``max_size`` 0 means no limit): the saver
    takes it, as LangGraph's does, and its ledger runs on it."""
    fx = Counter()
    with NullConnectionPool(pg_dsn, kwargs=KWARGS) as pool, PostgresSaver(pool) as saver:
        assert pool.max_size == 0
        saver.setup()
        out = one_call_agent(saver, fx).invoke({"messages": [("user", "pay")]}, cfg("t"))
        assert tool_messages(out)[-1].content == "charged 5"
        [entry] = [e for e in asyncio.run(saver.alist_entries("t")) if e.tool_name != "__model__"]
    assert entry.status is CallStatus.COMPLETED and fx.calls == [5]


def test_a_program_that_never_closes_its_pool_saver_exits(pg_dsn: str) -> None:
    script = f"""
import asyncio
from psycopg_pool import ConnectionPool
from langgraph_idem_saver.postgres import PostgresSaver
from tool_node_helpers import intent_for
kwargs = {{"autocommit": True}}
pool = ConnectionPool({pg_dsn!r}, kwargs=kwargs, min_size=1, max_size=3, open=True)
saver = PostgresSaver(pool)
calls = [{{"name": "charge", "args": {{"n": n}}, "id": f"c{{n}}"}} for n in range(3)]
intents = [intent_for("t", call) for call in calls]

async def claims():
    # three at once: the saver's worker threads all busy once
    return await asyncio.gather(*(saver.aclaim([i], owner="a", lease_seconds=60) for i in intents))

print(sum(c.claimed for [c] in asyncio.run(claims())))
"""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,  # tool_node_helpers importable
    )
    assert done.returncode == 0 and done.stdout.strip() == "3", done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


# --- typed errors on a pool ---------------------------------------------------------------


def test_no_pooled_connection_within_the_pools_timeout_is_connection_closed(pg_dsn: str) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=1, timeout=0.3) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        with (
            pool.connection(),  # the pool exhausted for longer than its timeout
            pytest.raises(ConnectionClosedError, match="pool's timeout"),
        ):
            asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        [claim] = asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        assert claim.claimed


@pytest.mark.parametrize("how", ["conn", "pool"])
def test_a_nul_in_a_ledger_text_is_a_serialization_error(pg_dsn: str, how: str) -> None:
    intent = intent_for("t\x00x", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        psycopg.connect(pg_dsn, **KWARGS)
        if how == "conn"
        else ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=2) as users,
        PostgresSaver(users) as saver,
    ):
        saver.setup()
        with pytest.raises(SerializationError, match="NUL"):
            asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))


# --- the saver's worker threads -----------------------------------------------------------


def ledger_workers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("PostgresSaver-ledger")]


def claim_three_at_once(saver: PostgresSaver) -> None:
    """Three claims at once on the saver's loop: worker threads started for them."""
    calls = [{"name": "charge", "args": {"n": n}, "id": f"c{n}"} for n in range(3)]

    async def claims() -> None:
        intents = [intent_for("t", call) for call in calls]
        aclaim = saver.saver.aclaim
        done = await asyncio.gather(*(aclaim([i], owner="a", lease_seconds=60) for i in intents))
        assert [c.claimed for [c] in done] == [True] * 3

    saver._call(claims())


def wait_for_no_workers() -> None:
    deadline = time.monotonic() + 10
    while ledger_workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ledger_workers() == []


def test_the_worker_threads_stop_at_close(pg_dsn: str) -> None:
    assert ledger_workers() == []
    with ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=3) as pool:
        with PostgresSaver(pool) as saver:
            saver.setup()
            claim_three_at_once(saver)
            assert ledger_workers() != []
        assert ledger_workers() == []  # close() joined them


def test_the_worker_threads_stop_when_a_saver_never_closed_is_collected(pg_dsn: str) -> None:
    assert ledger_workers() == []
    with ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=3) as pool:
        saver = PostgresSaver(pool)
        saver.setup()
        claim_three_at_once(saver)
        assert ledger_workers() != []
        del saver
        gc.collect()
        wait_for_no_workers()
