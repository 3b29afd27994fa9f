"""README, Retention: "``ttl=`` on all four savers and their ``from_conn_string``, applied by
``asweep()`` / ``sweep()``" (``tests/test_retention.py`` covers ``from_conn_string``; this
file the constructors, over a connection of the user's, on real SQLite and PostgreSQL).

Each saver, built with ``ttl=``, sweeps a thread idle past it with no ``ttl`` passed to
the sweep, and keeps a fresh one."""

from __future__ import annotations

import random
import sqlite3
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiosqlite
import psycopg
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import UUID
from psycopg.rows import dict_row

from langgraph_idem_saver import (
    AsyncPostgresSaver,
    AsyncSqliteSaver,
    PostgresSaver,
    SqliteSaver,
    TTLConfig,
)

TTL = TTLConfig(after=timedelta(days=30))
DAY = 86_400.0
NOW = time.time()
KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


def made_at(ts: float) -> str:
    """A LangGraph checkpoint id (UUIDv6) made at ``ts``."""
    ticks = int(ts * 1e7) + 0x01B21DD213814000  # 100 ns ticks since 1582-10-15
    value = ((ticks >> 12) << 80) | ((ticks & 0xFFF) << 64) | random.getrandbits(62)
    return str(UUID(int=value, version=6))


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def checkpoint_at(ts: float) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = made_at(ts)
    return checkpoint


async def sweeps_the_idle_thread_async(saver: Any) -> None:
    assert saver.ttl == TTL
    await saver.aput(cfg("old"), checkpoint_at(NOW - 40 * DAY), {}, {})
    await saver.aput(cfg("new"), checkpoint_at(NOW - DAY), {}, {})
    assert (await saver.asweep(NOW)).threads_deleted == 1
    assert await saver.aget_tuple(cfg("old")) is None
    assert await saver.aget_tuple(cfg("new")) is not None


def sweeps_the_idle_thread(saver: Any) -> None:
    assert saver.ttl == TTL
    saver.put(cfg("old"), checkpoint_at(NOW - 40 * DAY), {}, {})
    saver.put(cfg("new"), checkpoint_at(NOW - DAY), {}, {})
    assert saver.sweep(NOW).threads_deleted == 1
    assert saver.get_tuple(cfg("old")) is None and saver.get_tuple(cfg("new")) is not None


async def test_async_sqlite_saver_takes_ttl(tmp_path: Path) -> None:
    async with aiosqlite.connect(tmp_path / "a.db") as conn:
        saver = AsyncSqliteSaver(conn, ttl=TTL)
        await saver.setup()
        await sweeps_the_idle_thread_async(saver)


def test_sqlite_saver_takes_ttl(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "s.db", check_same_thread=False)
    try:
        with SqliteSaver(conn, ttl=TTL) as saver:
            saver.setup()
            sweeps_the_idle_thread(saver)
    finally:
        conn.close()


async def test_async_postgres_saver_takes_ttl(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, **KWARGS) as conn:
        saver = AsyncPostgresSaver(conn, ttl=TTL)
        await saver.setup()
        await sweeps_the_idle_thread_async(saver)


def test_postgres_saver_takes_ttl(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, **KWARGS) as conn, PostgresSaver(conn, ttl=TTL) as saver:
        saver.setup()
        sweeps_the_idle_thread(saver)
