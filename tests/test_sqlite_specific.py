"""SQLite-only behaviour: query plans that keep reads flat, durability settings per write."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_idem_saver import AsyncSqliteSaver, StorageFullError
from langgraph_idem_saver.ledger import CallIntent, Outcome
from langgraph_idem_saver.owners import make_owner
from langgraph_idem_saver.sqlite import sql


def plan_of(db: Path, query: str, params: tuple[Any, ...]) -> str:
    with sqlite3.connect(db) as conn:
        return "\n".join(row[-1] for row in conn.execute("EXPLAIN QUERY PLAN " + query, params))


async def test_channel_values_are_probed_by_primary_key_not_scanned(tmp_path: Path) -> None:
    """The blob lookup of one checkpoint must not visit the thread's other blobs; with a
    plain JOIN SQLite chose to scan them all (reads then grew 67x over 5,000 checkpoints)."""
    db = tmp_path / "plan.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        version = None
        for i in range(300):
            checkpoint = empty_checkpoint()
            version = saver.get_next_version(version, None)
            checkpoint["channel_values"] = {"messages": [f"m{i}"], "step": i}
            checkpoint["channel_versions"] = {"messages": version, "step": version}
            config = await saver.aput(
                config, checkpoint, {"step": i}, {"messages": version, "step": version}
            )
    with sqlite3.connect(db) as conn:
        (versions,) = conn.execute(
            "SELECT channel_versions FROM idem_checkpoints ORDER BY checkpoint_id DESC LIMIT 1"
        ).fetchone()
    plan = plan_of(db, sql.SELECT_BLOBS_FOR_VERSIONS, (versions, "t", ""))
    # the whole primary key is used for each probe; a prefix (thread_id, checkpoint_ns)
    # means "walk every blob of the thread", which is the plan a plain JOIN got
    assert "channel=? AND version=?" in plan, plan
    latest = plan_of(db, sql.SELECT_LATEST_CHECKPOINT, ("t", ""))
    assert "SEARCH idem_checkpoints USING" in latest and "TEMP B-TREE" not in latest, latest


def statements_of(saver: AsyncSqliteSaver) -> tuple[list[str], Any]:
    seen: list[str] = []

    def install() -> None:
        saver.conn._conn.set_trace_callback(seen.append)

    return seen, install


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_claims_are_always_synced_outcomes_never_alone_checkpoints_as_set(
    tmp_path: Path, synchronous: Any
) -> None:
    """A claim's transaction is committed with FULL whatever the setting; one of outcomes
    alone with NORMAL (the next synced commit, the step's checkpoint write, carries it to
    disk: docs/guarantees.md); checkpoint writes with the setting. The connection is left
    at its setting after each."""
    async with AsyncSqliteSaver.from_conn_string(
        str(tmp_path / "s.db"), synchronous=synchronous
    ) as saver:
        seen, install = statements_of(saver)
        await saver.conn._execute(install)

        def level() -> int:
            return int(saver.conn._conn.execute("PRAGMA synchronous").fetchone()[0])

        assert await saver.conn._execute(level) == {"FULL": 2, "NORMAL": 1}[synchronous]
        intent = CallIntent("t", "k", "t", "", "charge", "h", b"{}", "call_1")
        seen.clear()
        owner = make_owner()
        await saver.aclaim([intent], owner=owner, lease_seconds=60)
        claim_statements = list(seen)
        seen.clear()
        checkpoint = empty_checkpoint()
        await saver.aput(
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, {}, {}
        )
        put_statements = list(seen)
        seen.clear()
        await saver.record_outcome("t", "k", owner=owner, outcome=Outcome.completed(None, None))
        finish_statements = list(seen)
        assert await saver.conn._execute(level) == {"FULL": 2, "NORMAL": 1}[synchronous]

    synced, unsynced = "PRAGMA synchronous = FULL", "PRAGMA synchronous = NORMAL"
    if synchronous == "NORMAL":
        assert claim_statements[0] == synced, "the claim is committed with FULL"
        assert claim_statements[-1] == unsynced
        assert not any(s.startswith("PRAGMA") for s in finish_statements), "already NORMAL"
    else:
        assert synced not in claim_statements, "already FULL: no extra statements"
        assert finish_statements[0] == unsynced, "outcomes alone are committed with NORMAL"
        assert finish_statements[-1] == synced
        assert finish_statements.index("COMMIT") < len(finish_statements) - 1
    assert not any(s.startswith("PRAGMA") for s in put_statements), "checkpoints: as configured"


async def test_outcomes_sharing_a_transaction_with_a_checkpoint_write_are_synced(
    tmp_path: Path,
) -> None:
    """Writes submitted together share one transaction (the group commit), committed as
    its most demanding write needs: an outcome alone goes unsynced under FULL, an outcome
    beside a checkpoint write is synced with it."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        await saver.setup()
        seen, install = statements_of(saver)
        await saver.conn._execute(install)
        seen.clear()
        await saver._write(lambda conn: None, outcome=True)
        assert seen[0] == "PRAGMA synchronous = NORMAL"
        seen.clear()
        await asyncio.gather(
            saver._write(lambda conn: None, outcome=True), saver._write(lambda conn: None)
        )
        assert seen.count("COMMIT") == 1, "one transaction for both"
        assert not any(s.startswith("PRAGMA") for s in seen), seen


async def test_one_statement_writes_share_a_transaction_without_savepoints(
    tmp_path: Path,
) -> None:
    """Outcomes of calls that finish together are one ``UPDATE`` each in one transaction,
    with no savepoint between them: a failing one is undone by SQLite alone and reported
    to its caller only; one that ends the whole transaction fails every write with it."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        await saver.setup()
        await saver._write(lambda c: c.execute("CREATE TABLE t (v INTEGER UNIQUE)"))
        seen, install = statements_of(saver)
        await saver.conn._execute(install)

        def insert(v: int) -> Callable[[sqlite3.Connection], int]:
            return lambda c: c.execute("INSERT INTO t VALUES (?)", (v,)).rowcount

        seen.clear()
        results = await asyncio.gather(
            saver._write(insert(1), outcome=True, one_statement=True),
            saver._write(insert(1), outcome=True, one_statement=True),  # UNIQUE: refused
            saver._write(insert(2), outcome=True, one_statement=True),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[2] == 1
        assert isinstance(results[1], sqlite3.IntegrityError)
        assert seen.count("COMMIT") == 1 and not any("SAVEPOINT" in s for s in seen), seen

        def ends_the_transaction(c: sqlite3.Connection) -> None:
            c.rollback()  # as SQLite does itself on a full disk or an I/O error
            raise sqlite3.OperationalError("database or disk is full")

        results = await asyncio.gather(
            saver._write(insert(3), outcome=True, one_statement=True),
            saver._write(ends_the_transaction, outcome=True, one_statement=True),
            saver._write(insert(4), outcome=True, one_statement=True),
            return_exceptions=True,
        )
        assert all(isinstance(r, StorageFullError) for r in results), results
        stored = await saver._run(lambda c: c.execute("SELECT v FROM t ORDER BY v").fetchall())
        assert stored == [(1,), (2,)], "nothing of the failed transaction was kept"


async def test_opening_a_current_database_needs_no_write_lock(tmp_path: Path) -> None:
    """Another process holding the write lock must not stop a saver from opening and
    reading; only writes wait (busy_timeout) and then fail with DatabaseLockedError."""
    from langgraph_idem_saver import DatabaseLockedError

    db = tmp_path / "busy.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:  # creates the schema
        stored = await saver.aput(
            {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, empty_checkpoint(), {}, {}
        )
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        async with AsyncSqliteSaver.from_conn_string(str(db), busy_timeout=0.2) as saver:
            assert await saver.aget_tuple(stored) is not None
            with pytest.raises(DatabaseLockedError):
                await saver.aput(
                    {"configurable": {"thread_id": "t2", "checkpoint_ns": ""}},
                    empty_checkpoint(),
                    {},
                    {},
                )
    finally:
        holder.rollback()
        holder.close()


async def test_the_ledgers_per_step_reads_probe_indexes_never_scan_the_ledger(
    tmp_path: Path,
) -> None:
    """Every statement a tools step runs on the ledger (the adoption read, the read of
    refused or finished entries, claims, outcomes) finds its rows through an index: with
    ``(scope, key) IN (...)`` SQLite scanned the whole ledger (1.6-2.5 ms a step at 10k
    rows, growing with every step ever run). A lookup by ``run_id`` (no index) is the
    control: the check sees a scan when there is one."""
    db = tmp_path / "ledger.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        intents = [
            CallIntent("t", f"k{i}", "t", "tools", "send", f"h{i}", b"{}", f"c{i}")
            for i in range(3)
        ]
        await saver.aclaim(intents, owner=make_owner(), lease_seconds=60)
    sigs = '[["send", "h1"], ["send", "h2"]]'
    spots = '[["p", "send"]]'
    plans = {
        "SELECT_STEP_CANDIDATES": plan_of(
            db, sql.SELECT_STEP_CANDIDATES, ("t", "tools", sigs, "t", spots)
        ),
        "select_entries_by_keys": plan_of(
            db, sql.select_entries_by_keys(2), ("t", "k0", "t", "k1")
        ),
    }
    for name in (
        "SELECT_ENTRY",
        "FINISH_ENTRY",
        "SELECT_SLOT_HOLDER",
        "ADOPT_ENTRY",
        "RELEASE_ENTRY",
    ):
        query = getattr(sql, name)
        plans[name] = plan_of(db, query, ("x",) * query.count("?"))
    for name, plan in plans.items():
        assert "SCAN idem_tool_calls" not in plan and "SCAN t" not in plan, (name, plan)
        assert "SEARCH" in plan, (name, plan)
    step = plans["SELECT_STEP_CANDIDATES"]
    assert "INTEGER PRIMARY KEY (rowid=?)" in step
    assert "(scope=? AND agent_path=? AND tool_name=? AND args_hash=?)" in step
    assert "(scope=? AND position=? AND tool_name=?)" in step  # not every position
    by_run = "SELECT key FROM idem_tool_calls WHERE run_id = ?"
    assert "SCAN idem_tool_calls" in plan_of(db, by_run, ("r",))
