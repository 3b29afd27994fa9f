"""Listing the issued calls (``alist_issued``: the ``pending`` and ``state`` commands,
``alist_unknown``, the telemetry gauge of unknown outcomes) reads SQLite's partial index
of issued rows, also on a database that was never analyzed - not the whole ledger - and
still answers oldest first on both backends."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from tool_node_helpers import intent_for

from langgraph_idem_saver import CallStatus, Outcome
from langgraph_idem_saver.ledger_queries import LedgerSql
from langgraph_idem_saver.postgres import AsyncPostgresSaver
from langgraph_idem_saver.sqlite import AsyncSqliteSaver, sql


def plan(conn: sqlite3.Connection, query: str) -> str:
    return " / ".join(row[3] for row in conn.execute(f"EXPLAIN QUERY PLAN {query}"))


async def test_sqlite_reads_the_issued_index_without_statistics(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await saver.setup()
    conn = sqlite3.connect(path)
    try:
        stats = "SELECT name FROM sqlite_master WHERE name = 'sqlite_stat1'"
        assert conn.execute(stats).fetchall() == []  # never analyzed
        shipped = plan(conn, LedgerSql(sql).SELECT_ISSUED)
        # the control: the same read ordered by the bare rowid scans the table
        bare = LedgerSql(sql).SELECT_ISSUED.replace("ORDER BY +rowid", "ORDER BY rowid")
        assert bare != LedgerSql(sql).SELECT_ISSUED
    finally:
        conn.close()
    assert "USING INDEX idem_tool_calls_issued" in shipped
    conn = sqlite3.connect(path)
    try:
        assert plan(conn, bare) == "SCAN idem_tool_calls"
    finally:
        conn.close()


async def issued_in_order(saver: Any) -> None:
    await saver.setup()
    calls = [{"name": "charge", "args": {"n": i}, "id": f"c{i}"} for i in range(6)]
    intents = [intent_for(f"t{i % 2}", call) for i, call in enumerate(calls)]
    entries = []
    for intent in intents:
        [outcome] = await saver.aclaim([intent], owner="me", lease_seconds=60)
        entries.append(outcome.entry)
    # finish every other one: the rest stay issued
    for entry in entries[::2]:
        result_type, data = saver.serde.dumps_typed("ok")
        await saver.record_outcome(
            entry.scope, entry.key, owner="me", outcome=Outcome.completed(result_type, data)
        )
    issued = await saver.alist_issued()
    assert [e.key for e in issued] == [e.key for e in entries[1::2]]
    assert {e.status for e in issued} == {CallStatus.ISSUED}


async def test_sqlite_issued_oldest_first(tmp_path: Path) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite")) as saver:
        await issued_in_order(saver)


async def test_postgres_issued_oldest_first(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await issued_in_order(saver)
