"""The read side of :class:`AsyncSqliteSaver` that tools need beyond the checkpoint API.

Threads with their counts, a namespace's history, prefix lookups, table counts and size,
and the one raw delete ``idem-saver prune --before`` uses: each a public method of the
saver (through :class:`SqliteInspection`, which it inherits), so the CLI holds no SQL.
Everything runs on the saver's own connection through its ``_run``/``_write``, so
errors are the saver's typed ones and deletes share its write transaction.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite

from langgraph_idem_saver.forwarding import blocking, hopping
from langgraph_idem_saver.inspect_types import (
    TABLE_COUNTS_COLUMNS,
    THREAD_HEADS_SQL,
    CheckpointHistory,
    CheckpointNode,
    CheckpointRow,
    DeletedCounts,
    StorageCounts,
    ThreadSummary,
    checked_keys,
    checked_limit,
    checked_text,
    parse_metadata,
    thread_summaries,
)
from langgraph_idem_saver.sqlite.blob_gc import collect_blobs
from langgraph_idem_saver.sqlite.host import SqliteHost

IS_IDEM_DATABASE = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idem_saver_migrations'"
)
THREAD_SUMMARIES = (
    """
WITH t AS (
    SELECT thread_id, SUM(checkpoint_ns = '') AS root, SUM(checkpoint_ns <> '') AS sub,
           MAX(CASE WHEN checkpoint_ns = '' THEN checkpoint_id END) AS head
    FROM idem_checkpoints GROUP BY thread_id
)
"""
    + THREAD_HEADS_SQL
)
LEDGER_PER_THREAD = "SELECT thread_id, COUNT(*) FROM idem_tool_calls GROUP BY thread_id"
THREAD_EXISTS = (
    "SELECT EXISTS (SELECT 1 FROM idem_checkpoints WHERE thread_id = ?1) "
    "OR EXISTS (SELECT 1 FROM idem_tool_calls WHERE thread_id = ?1)"
)
COUNT_NAMESPACE = "SELECT COUNT(*) FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?"
HISTORY = """
SELECT c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
    (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = c.thread_id
       AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)
FROM idem_checkpoints AS c WHERE c.thread_id = ? AND c.checkpoint_ns = ?
ORDER BY c.checkpoint_id DESC LIMIT ?
"""
CHECKPOINT_IDS_WITH_PREFIX = (
    "SELECT checkpoint_id FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
    "AND substr(checkpoint_id, 1, ?) = ? ORDER BY checkpoint_id LIMIT ?"
)
ENTRY_KEYS_WITH_PREFIX = (
    "SELECT scope, key FROM idem_tool_calls WHERE substr(key, 1, ?1) = ?2 "
    "AND (?3 IS NULL OR thread_id = ?3) ORDER BY rowid LIMIT ?4"
)
CHECKPOINT_NODES = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
       c.metadata, COALESCE(w.n, 0)
FROM idem_checkpoints AS c LEFT JOIN (
    SELECT thread_id, checkpoint_ns, checkpoint_id, COUNT(*) AS n FROM idem_writes
    GROUP BY thread_id, checkpoint_ns, checkpoint_id
) AS w USING (thread_id, checkpoint_ns, checkpoint_id)
WHERE ?1 IS NULL OR c.thread_id IN (SELECT value FROM json_each(?1))
"""
DELETE_WRITES_OF = (
    "DELETE FROM idem_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
DELETE_CHECKPOINT = (
    "DELETE FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
COUNT_BLOBS_OF_THREAD = "SELECT COUNT(*) FROM idem_blobs WHERE thread_id = ?"
TABLE_COUNTS = f"SELECT {TABLE_COUNTS_COLUMNS}"


class SqliteInspection:
    """Read-side methods of :class:`AsyncSqliteSaver` (see the module docstring)."""

    @staticmethod
    async def ais_idem_database(conn: aiosqlite.Connection) -> bool:
        """Whether ``conn``'s database holds our tables, read before a saver's ``setup()``
        (which would create them): how a tool tells our file from another SQLite file
        without changing either. ``sqlite3`` errors propagate, so a caller opening
        read-only can tell "cannot read it this way" from "not ours"."""
        async with conn.execute(IS_IDEM_DATABASE) as cur:
            return await cur.fetchone() is not None

    async def athread_summaries(self: SqliteHost) -> list[ThreadSummary]:
        """Every thread (also those with ledger entries only), with its counts and the
        state of its latest root checkpoint; decodes nothing else."""

        def read(conn: sqlite3.Connection) -> tuple[list[Any], dict[str, int]]:
            rows = conn.execute(THREAD_SUMMARIES).fetchall()
            return rows, dict(conn.execute(LEDGER_PER_THREAD).fetchall())

        rows, ledger = await self._run(read)
        return thread_summaries(self.serde, rows, ledger)

    async def athread_exists(self: SqliteHost, thread_id: str) -> bool:
        """Whether the thread has a checkpoint or a ledger entry."""
        params = (checked_text(thread_id, "thread_id"),)
        row = await self._run(lambda c: c.execute(THREAD_EXISTS, params).fetchone())
        return bool(row[0])

    async def acheckpoint_history(
        self: SqliteHost, thread_id: str, checkpoint_ns: str = "", limit: int | None = None
    ) -> CheckpointHistory:
        """One namespace's checkpoints, newest first (at most ``limit``), and their total."""
        where = (checked_text(thread_id, "thread_id"), checked_text(checkpoint_ns, "checkpoint_ns"))
        n = checked_limit(limit)

        def read(conn: sqlite3.Connection) -> tuple[int, list[Any]]:
            total = conn.execute(COUNT_NAMESPACE, where).fetchone()[0]
            return total, conn.execute(HISTORY, (*where, -1 if n is None else n)).fetchall()

        total, rows = await self._run(read)
        return CheckpointHistory(
            int(total), [CheckpointRow(r[0], r[1], parse_metadata(r[2]), int(r[3])) for r in rows]
        )

    async def acheckpoint_ids_with_prefix(
        self: SqliteHost, thread_id: str, checkpoint_ns: str, prefix: str, *, limit: int = 10
    ) -> list[str]:
        """Checkpoint ids of one namespace that start with ``prefix`` (sorted)."""
        params = (
            checked_text(thread_id, "thread_id"),
            checked_text(checkpoint_ns, "checkpoint_ns"),
            len(prefix),
            checked_text(prefix, "prefix"),
            checked_limit(limit),
        )
        rows = await self._run(lambda c: c.execute(CHECKPOINT_IDS_WITH_PREFIX, params).fetchall())
        return [r[0] for r in rows]

    async def aentry_keys_with_prefix(
        self: SqliteHost, prefix: str, thread_id: str | None = None, *, limit: int = 10
    ) -> list[tuple[str, str]]:
        """``(scope, key)`` of ledger entries whose key starts with ``prefix`` (in one
        thread, or any), oldest first."""
        thread = None if thread_id is None else checked_text(thread_id, "thread_id")
        params = (len(prefix), checked_text(prefix, "prefix"), thread, checked_limit(limit))
        rows = await self._run(lambda c: c.execute(ENTRY_KEYS_WITH_PREFIX, params).fetchall())
        return [(r[0], r[1]) for r in rows]

    async def acheckpoint_nodes(
        self: SqliteHost, thread_ids: Sequence[str] | None = None
    ) -> list[CheckpointNode]:
        """Every checkpoint of these threads (or all) with its parent, metadata and
        pending-write count: what planning a prune needs, no value decoded."""
        threads = None
        if thread_ids is not None:
            threads = json.dumps([checked_text(t, "thread_id") for t in thread_ids])
        rows = await self._run(lambda c: c.execute(CHECKPOINT_NODES, (threads,)).fetchall())
        return [CheckpointNode(*r) for r in rows]

    async def adelete_checkpoints(
        self: SqliteHost, keys: Sequence[tuple[str, str, str]]
    ) -> DeletedCounts:
        """Delete these checkpoints with their pending writes, and the blobs no remaining
        checkpoint needs; ledger entries stay. One write transaction.

        What ``idem-saver prune --before`` applies; the saver's retention methods are
        the way to prune from code.
        """
        rows = checked_keys(keys)
        threads = sorted({k[0] for k in rows})

        def delete(conn: sqlite3.Connection) -> DeletedCounts:
            writes = conn.executemany(DELETE_WRITES_OF, rows).rowcount
            checkpoints = conn.executemany(DELETE_CHECKPOINT, rows).rowcount
            blobs = 0
            for thread_id in threads:
                before = conn.execute(COUNT_BLOBS_OF_THREAD, (thread_id,)).fetchone()[0]
                collect_blobs(conn, thread_id)
                blobs += before - conn.execute(COUNT_BLOBS_OF_THREAD, (thread_id,)).fetchone()[0]
            return DeletedCounts(checkpoints, writes, blobs)

        if not rows:
            return DeletedCounts(0, 0, 0)
        deleted = await self._write(delete)
        self._deltas.forget(threads)
        return deleted

    async def astorage_counts(self: SqliteHost) -> StorageCounts:
        """Rows of each table, schema version, bytes on disk (the file and its ``-wal``;
        None for an in-memory database)."""
        threads, checkpoints, blobs, writes, entries, version = await self._run(
            lambda conn: conn.execute(TABLE_COUNTS).fetchone()
        )
        path = self._target.path if self._target is not None else None
        size = None
        if path is not None:
            files = (Path(path), Path(f"{path}-wal"))
            size = sum(p.stat().st_size for p in files if p.exists())
        return StorageCounts(threads, checkpoints, blobs, writes, entries, version, size)


class SqliteSyncInspection:
    """The sync saver's read-side helpers: ``SqliteInspection``'s methods, each sync
    (``thread_summaries``) and async (``athread_summaries``), run by the async saver on its
    private loop (:mod:`~langgraph_idem_saver.forwarding`), so the answers are its own."""

    thread_summaries = blocking(SqliteInspection.athread_summaries)
    athread_summaries = hopping(SqliteInspection.athread_summaries)
    thread_exists = blocking(SqliteInspection.athread_exists)
    athread_exists = hopping(SqliteInspection.athread_exists)
    checkpoint_history = blocking(SqliteInspection.acheckpoint_history)
    acheckpoint_history = hopping(SqliteInspection.acheckpoint_history)
    checkpoint_ids_with_prefix = blocking(SqliteInspection.acheckpoint_ids_with_prefix)
    acheckpoint_ids_with_prefix = hopping(SqliteInspection.acheckpoint_ids_with_prefix)
    entry_keys_with_prefix = blocking(SqliteInspection.aentry_keys_with_prefix)
    aentry_keys_with_prefix = hopping(SqliteInspection.aentry_keys_with_prefix)
    checkpoint_nodes = blocking(SqliteInspection.acheckpoint_nodes)
    acheckpoint_nodes = hopping(SqliteInspection.acheckpoint_nodes)
    delete_checkpoints = blocking(SqliteInspection.adelete_checkpoints)
    adelete_checkpoints = hopping(SqliteInspection.adelete_checkpoints)
    storage_counts = blocking(SqliteInspection.astorage_counts)
    astorage_counts = hopping(SqliteInspection.astorage_counts)

    @staticmethod
    def is_idem_database(conn: sqlite3.Connection) -> bool:
        """Whether ``conn``'s database holds our tables, read before ``setup()`` (which
        would create them); ``sqlite3`` errors propagate, as ``ais_idem_database``'s."""
        return conn.execute(IS_IDEM_DATABASE).fetchone() is not None


__all__ = ["SqliteInspection", "SqliteSyncInspection"]
