"""README: ``AsyncSqliteSaver(..., busy_timeout=5.0)`` - "seconds a write waits for another
process's write lock before ``DatabaseLockedError``, nothing written".

Another connection (another process, to SQLite) holds the write lock with ``BEGIN
IMMEDIATE``; a checkpoint write and a ledger claim each wait about ``busy_timeout``, raise
the typed error, and leave nothing once the lock is gone; a write that the lock is
released for in time succeeds (the wait is a wait, not a refusal). Real SQLite file."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from pathlib import Path

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from pg_blocking import charge_intent

from langgraph_idem_saver import AsyncSqliteSaver, DatabaseLockedError

BUSY = 0.3


def config(thread: str) -> dict[str, dict[str, str]]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


async def test_a_write_waits_busy_timeout_then_raises_having_written_nothing(
    tmp_path: Path,
) -> None:
    db = tmp_path / "busy.db"
    async with AsyncSqliteSaver.from_conn_string(str(db), busy_timeout=BUSY) as saver:
        await saver.setup()
        holder = sqlite3.connect(db, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the write lock, held by another connection
        try:
            started = time.monotonic()
            with pytest.raises(DatabaseLockedError, match="nothing was written"):
                await saver.aput(config("t"), empty_checkpoint(), {}, {})
            waited = time.monotonic() - started
            with pytest.raises(DatabaseLockedError):
                await saver.aclaim([charge_intent("k")], owner="me", lease_seconds=60)
        finally:
            holder.rollback()
            holder.close()
        assert waited >= BUSY * 0.9, f"it gave up after {waited:.3f} s, not busy_timeout"
        assert await saver.aget_tuple(config("t")) is None
        assert await saver.aget_entry("t", "k") is None


async def test_a_lock_released_within_busy_timeout_is_waited_for(tmp_path: Path) -> None:
    db = tmp_path / "wait.db"
    async with AsyncSqliteSaver.from_conn_string(str(db), busy_timeout=5.0) as saver:
        await saver.setup()
        holder = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")
        loop = asyncio.get_running_loop()
        loop.call_later(0.2, holder.rollback)
        try:
            stored = await saver.aput(config("t"), empty_checkpoint(), {}, {})
        finally:
            holder.close()
        assert await saver.aget_tuple(stored) is not None
