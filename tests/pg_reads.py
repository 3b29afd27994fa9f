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
