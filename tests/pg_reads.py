"""What PostgreSQL read of one table while a block ran: the plan tests' measure.

Counted from the server's own statistics (scans and rows, whatever the plan and wherever
a statement runs, inside a function too), flushed around the block: a backend reports
its counts when it is idle, at most once a second unless asked, and since PostgreSQL 15
``pg_stat_xact_*`` may include an earlier transaction's. The table is this schema's
(``regclass`` resolves it through the connection's ``search_path``): every test has a
schema of its own, with tables of the same names.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg


async def flushed_reads(conn: psycopg.AsyncConnection[Any], table: str) -> tuple[int, ...]:
    """(sequential scans, rows they read, index scans, rows fetched by index) of
    ``table`` so far, counting every statement ``conn`` sent."""
    await conn.execute("SELECT pg_stat_force_next_flush()", prepare=False)
    await conn.execute("SET stats_fetch_consistency = none", prepare=False)
    cur = await conn.execute(
        "SELECT seq_scan, seq_tup_read, idx_scan, idx_tup_fetch FROM pg_stat_user_tables "
        "WHERE relid = %s::regclass",
        (table,),
        prepare=False,
    )
    row = await cur.fetchone()
    assert row is not None
    return tuple(int(v or 0) for v in row)


@contextlib.asynccontextmanager
async def table_reads(conn: psycopg.AsyncConnection[Any], table: str) -> AsyncIterator[list[int]]:
    """Yields a list that holds, after the block, [sequential scans, rows they read,
    index scans, rows fetched by index] of ``table`` during the block. The block must
    not leave a transaction open on ``conn`` (statistics are reported when it is idle)."""
    counts: list[int] = []
    before = await flushed_reads(conn, table)
    yield counts
    after = await flushed_reads(conn, table)
    counts.extend(a - b for a, b in zip(after, before, strict=True))


TABLES = ("idem_checkpoints", "idem_blobs", "idem_writes", "idem_tool_calls")


@contextlib.asynccontextmanager
async def plans_cached_on_empty_tables(
    dsn: str, plans: str = "force_generic_plan"
) -> AsyncIterator[tuple[psycopg.AsyncConnection[Any], Any]]:
    """A saver on a connection that prepares every statement (``prepare_threshold=0``,
    as LangGraph's savers open theirs), set up, its tables empty and analyzed as such,
    and ``plan_cache_mode`` set to ``plans``. ``force_generic_plan`` is what PostgreSQL
    does by itself after five executions whenever the generic plan looks no dearer than
    the custom ones: forced, so a test does not depend on that estimate, and every plan
    is built once, on the small tables."""
    from langgraph_idem_saver.postgres import AsyncPostgresSaver

    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0
    ) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        await conn.execute(f"VACUUM ANALYZE {', '.join(TABLES)}")
        await conn.execute(f"SET plan_cache_mode = {plans}")
        yield conn, saver


async def scans_during(
    conn: psycopg.AsyncConnection[Any], action: Any, tables: tuple[str, ...] = TABLES
) -> dict[str, tuple[int, int]]:
    """Awaits ``action()``; per table, (sequential scans, rows they read) meanwhile."""
    before = {t: await flushed_reads(conn, t) for t in tables}
    await action()
    after = {t: await flushed_reads(conn, t) for t in tables}
    return {t: (after[t][0] - before[t][0], after[t][1] - before[t][1]) for t in tables}
