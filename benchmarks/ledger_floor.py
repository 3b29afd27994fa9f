"""The ledger's floor: what the protocol's writes cost when sent by hand.

A step's ledger needs, by ``docs/guarantees.md``, two commits: the claims of its calls
(with the adoption read before them) committed and synced before any tool runs, and
their outcomes committed before the node returns (not synced by themselves). Here those
writes are made with the saver's own statements, on its own tables, with the same driver
and settings, one round trip per transaction and no Python of ours around them (every
parameter is built before the clock starts). What the ``ledger`` column of a tool-step
row adds beyond this floor is the engine, the saver's code and the event loop: the part
a faster implementation could remove. The floor itself only a different protocol could.

SQLite: a ``sqlite3`` connection driven from one worker thread, as aiosqlite drives
its own (one hop to the thread and back per transaction); the claim committed with
``synchronous=FULL``, the outcomes with ``NORMAL`` (as the saver commits them).
Postgres: one psycopg connection with ``POOL_KWARGS``; the claim is the saver's
``CLAIM_STEP_UNLESS_FOUND`` statement, the outcomes ``FINISH_STEP_KEYS`` (one:
``FINISH_ONE_KEY``), each one autocommit round trip.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import statistics
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from langgraph_idem_saver import AsyncPostgresSaver, AsyncSqliteSaver
from langgraph_idem_saver.backend import step_params
from langgraph_idem_saver.ledger import StepLookup
from langgraph_idem_saver.postgres import ledger_sql as pg_ledger
from langgraph_idem_saver.postgres.ledger_rows import claim_rows, finish_rows
from langgraph_idem_saver.sqlite import sql as sqlite_sql

OWNER = "bench-host:1:0123abcd-0123456789ab"
# the tool-step rows (``bench.tool_step``) and their calls a step
TOOL_STEP_CALLS = {"tool_step_1": 1, "tool_step_50": 50}
RESULT = b"\x84" + b"r" * 199  # a serialized ToolMessage is ~200 bytes


def _hex(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def step_rows(calls: int) -> tuple[list[tuple[Any, ...]], StepLookup]:
    """One fresh step's intent rows (``INTENT_COLUMNS`` order, as the engine builds them)
    and its adoption look-up."""
    thread = uuid.uuid4().hex
    scope, position = f"thread:{thread}", _hex(thread, "position")
    rows = [
        (
            scope,
            _hex(thread, i),
            thread,
            "tools",
            "noop",
            _hex("args", i),
            json.dumps({"i": i}).encode(),
            f"call_{thread[:8]}_{i}",
            str(uuid.uuid4()),
            position,
            str(uuid.uuid4()),
            i,
        )
        for i in range(calls)
    ]
    lookup = StepLookup(scope, "tools", [(r[4], r[5]) for r in rows], [(position, "noop")])
    return rows, lookup


def outcome_params(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The outcomes of ``rows``: ``completed`` with a result, as ``_finish_soon`` takes them."""
    return [("completed", "msgpack", RESULT, None, time.time(), r[0], r[1], OWNER) for r in rows]


async def sqlite_floor_us(path: str, calls: int, reps: int) -> float:
    """Median µs of a step's claim (adoption read + inserts, synced) and outcomes."""
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()  # the saver's tables and indexes
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")

    def claim(rows: list[tuple[Any, ...]], lookup: StepLookup, now: float) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(sqlite_sql.SELECT_STEP_CANDIDATES, step_params(lookup)).fetchall()
        conn.executemany(sqlite_sql.INSERT_ISSUED, [(*r, OWNER, now, now + 300) for r in rows])
        conn.execute("COMMIT")

    def finish(outcomes: list[tuple[Any, ...]]) -> None:
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sqlite_sql.FINISH_ENTRY, outcomes)
        conn.execute("COMMIT")
        conn.execute("PRAGMA synchronous=FULL")

    steps = [step_rows(calls) for _ in range(reps)]
    outcomes = [outcome_params(rows) for rows, _ in steps]
    loop = asyncio.get_running_loop()
    ts = []
    with ThreadPoolExecutor(1) as worker:
        try:
            for (rows, lookup), done in zip(steps, outcomes, strict=True):
                t0 = time.perf_counter_ns()
                await loop.run_in_executor(worker, claim, rows, lookup, time.time())
                await loop.run_in_executor(worker, finish, done)
                ts.append(time.perf_counter_ns() - t0)
        finally:
            conn.close()
    return statistics.median(ts[reps // 10 :]) / 1000.0


async def postgres_floor_us(dsn: str, calls: int, reps: int, kwargs: dict[str, Any]) -> float:
    """Median µs of a step's claim statement and outcome statement, sent by hand."""
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
    now = time.time()
    params = []
    for _ in range(reps):
        rows, lookup = step_rows(calls)
        scope, agent_path, signatures, _, spots = step_params(lookup)
        claim = {"owner": OWNER, "now": now, "lease": now + 300, "rows": claim_rows(rows)}
        claim |= {"scope": scope, "agent_path": agent_path}
        claim |= {"signatures": signatures, "spots": spots, "inert": list(lookup.inert)}
        done = outcome_params(rows)
        params.append((claim, done[0] if calls == 1 else (finish_rows(done),)))
    finish = pg_ledger.FINISH_ONE_KEY if calls == 1 else pg_ledger.FINISH_STEP_KEYS
    ts = []
    async with await psycopg.AsyncConnection.connect(dsn, **kwargs) as conn:
        for claim, outcome in params:
            t0 = time.perf_counter_ns()
            await (await conn.execute(pg_ledger.CLAIM_STEP_UNLESS_FOUND, claim)).fetchall()
            await (await conn.execute(finish, outcome)).fetchall()
            ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts[reps // 10 :]) / 1000.0


def ratio_at_floor(
    official_us: float, ours_stock_us: float, floor_step_us: float, calls: int
) -> float:
    """The ratio official / ours a tool-step row would have with a ledger costing only its
    floor: our saver with the stock node, plus the floor's share a call."""
    return official_us / (ours_stock_us + floor_step_us / calls)
