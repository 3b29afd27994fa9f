"""The read side of :class:`AsyncPostgresSaver` that tools need beyond the checkpoint API.

The same methods as ``sqlite/inspect.py`` (threads with their counts, a namespace's
history, prefix lookups, table counts and size, the raw delete of ``idem-saver prune
--before``), public on the saver through :class:`PostgresInspection`, so the CLI holds
no SQL. Everything runs through the saver's ``_run`` (its connection or pool, typed
errors); the delete takes the threads' advisory locks first, as every saver delete does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from psycopg import AsyncConnection, AsyncCursor, Connection
from psycopg.rows import TupleRow, tuple_row

from langgraph_idem_saver import inspect_types
from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.forwarding import blocking, hopping
from langgraph_idem_saver.postgres import sql
from langgraph_idem_saver.postgres.blob_gc import acollect_blobs
from langgraph_idem_saver.postgres.host import PostgresHost

Cursor = AsyncCursor[TupleRow]

IS_IDEM_DATABASE = "SELECT to_regclass('idem_saver_migrations') IS NOT NULL"
THREAD_SUMMARIES = (
    """
WITH t AS (
    SELECT thread_id,
           COUNT(*) FILTER (WHERE checkpoint_ns = '') AS root,
           COUNT(*) FILTER (WHERE checkpoint_ns <> '') AS sub,
           MAX(checkpoint_id) FILTER (WHERE checkpoint_ns = '') AS head
    FROM idem_checkpoints GROUP BY thread_id
)
"""
    + inspect_types.THREAD_HEADS_SQL
)
LEDGER_PER_THREAD = "SELECT thread_id, COUNT(*) FROM idem_tool_calls GROUP BY thread_id"
THREAD_EXISTS = (
    "SELECT EXISTS (SELECT 1 FROM idem_checkpoints WHERE thread_id = %(t)s) "
    "OR EXISTS (SELECT 1 FROM idem_tool_calls WHERE thread_id = %(t)s)"
)
COUNT_NAMESPACE = (
    "SELECT COUNT(*) FROM idem_checkpoints WHERE thread_id = %(t)s AND checkpoint_ns = %(ns)s"
)
HISTORY = """
SELECT c.checkpoint_id, c.parent_checkpoint_id, COALESCE(c.metadata_exact, c.metadata::text),
    (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = c.thread_id
       AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)
FROM idem_checkpoints AS c WHERE c.thread_id = %(t)s AND c.checkpoint_ns = %(ns)s
ORDER BY c.checkpoint_id DESC LIMIT %(limit)s
"""
CHECKPOINT_IDS_WITH_PREFIX = (
    "SELECT checkpoint_id FROM idem_checkpoints WHERE thread_id = %(t)s "
    "AND checkpoint_ns = %(ns)s AND left(checkpoint_id, %(n)s) = %(prefix)s "
    "ORDER BY checkpoint_id LIMIT %(limit)s"
)
ENTRY_KEYS = "SELECT scope, key FROM idem_tool_calls WHERE left(key, %(n)s) = %(prefix)s"
ENTRY_KEYS_WITH_PREFIX = f"{ENTRY_KEYS} ORDER BY seq LIMIT %(limit)s"
ENTRY_KEYS_OF_THREAD_WITH_PREFIX = (
    f"{ENTRY_KEYS} AND thread_id = %(t)s ORDER BY seq LIMIT %(limit)s"
)
CHECKPOINT_NODES = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
       COALESCE(c.metadata_exact, c.metadata::text), COALESCE(w.n, 0)
FROM idem_checkpoints AS c LEFT JOIN (
    SELECT thread_id, checkpoint_ns, checkpoint_id, COUNT(*) AS n FROM idem_writes
    GROUP BY thread_id, checkpoint_ns, checkpoint_id
) AS w USING (thread_id, checkpoint_ns, checkpoint_id)
"""
CHECKPOINT_NODES_OF_THREADS = CHECKPOINT_NODES + " WHERE c.thread_id = ANY(%(threads)s)"
_KEYS = (
    "(thread_id, checkpoint_ns, checkpoint_id) IN (SELECT * FROM unnest("
    "%(t)s::text[], %(ns)s::text[], %(id)s::text[]))"
)
DELETE_WRITES_OF = f"DELETE FROM idem_writes WHERE {_KEYS}"
DELETE_CHECKPOINTS = f"DELETE FROM idem_checkpoints WHERE {_KEYS}"
TABLE_COUNTS = f"""
SELECT {inspect_types.TABLE_COUNTS_COLUMNS},
       (SELECT SUM(pg_total_relation_size(to_regclass(t))) FROM unnest(ARRAY[
           'idem_checkpoints', 'idem_blobs', 'idem_writes', 'idem_tool_calls',
           'idem_saver_migrations']) AS t)
"""


async def _fetch(host: PostgresHost, query: str, params: dict[str, Any] | None = None) -> list[Any]:
    async def read(cur: Cursor) -> list[Any]:
        await cur.execute(query, params)
        return await cur.fetchall()

    return await host._run(read)


class PostgresInspection:
    """Read-side methods of :class:`AsyncPostgresSaver` (see the module docstring)."""

    @staticmethod
    async def ais_idem_database(conn: AsyncConnection[Any]) -> bool:
        """Whether our tables are on ``conn``'s search path, read before a saver's
        ``setup()`` (which would create them): how a tool tells our database (or schema)
        from another without changing it, in a read-only session too."""
        async with conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(IS_IDEM_DATABASE)
            row = await cur.fetchone()
        return bool(row and row[0])

    async def athread_summaries(self: PostgresHost) -> list[inspect_types.ThreadSummary]:
        """Every thread (also those with ledger entries only), with its counts and the
        state of its latest root checkpoint; decodes nothing else."""
        rows = []
        for thread_id, root, sub, head, type_, data, *flags in await _fetch(self, THREAD_SUMMARIES):
            try:  # a compressed head is inflated; one that cannot be reads as unknown
                type_, data = self._unpack(type_, data, "checkpoint") if type_ else (None, None)
            except CorruptRecordError:
                type_, data = None, None
            rows.append((thread_id, root, sub, head, type_, data, *flags))
        ledger = dict(await _fetch(self, LEDGER_PER_THREAD))
        return inspect_types.thread_summaries(self.serde, rows, ledger)

    async def athread_exists(self: PostgresHost, thread_id: str) -> bool:
        """Whether the thread has a checkpoint or a ledger entry."""
        [(found,)] = await _fetch(
            self, THREAD_EXISTS, {"t": inspect_types.checked_text(thread_id, "thread_id")}
        )
        return bool(found)

    async def acheckpoint_history(
        self: PostgresHost, thread_id: str, checkpoint_ns: str = "", limit: int | None = None
    ) -> inspect_types.CheckpointHistory:
        """One namespace's checkpoints, newest first (at most ``limit``), and their total."""
        params: dict[str, Any] = {
            "t": inspect_types.checked_text(thread_id, "thread_id"),
            "ns": inspect_types.checked_text(checkpoint_ns, "checkpoint_ns"),
            "limit": inspect_types.checked_limit(limit),
        }
        [(total,)] = await _fetch(self, COUNT_NAMESPACE, params)
        rows = await _fetch(self, HISTORY, params)
        return inspect_types.CheckpointHistory(
            int(total),
            [
                inspect_types.CheckpointRow(
                    r[0], r[1], inspect_types.parse_metadata(r[2]), int(r[3])
                )
                for r in rows
            ],
        )

    async def acheckpoint_ids_with_prefix(
        self: PostgresHost, thread_id: str, checkpoint_ns: str, prefix: str, *, limit: int = 10
    ) -> list[str]:
        """Checkpoint ids of one namespace that start with ``prefix`` (sorted)."""
        params = {
            "t": inspect_types.checked_text(thread_id, "thread_id"),
            "ns": inspect_types.checked_text(checkpoint_ns, "checkpoint_ns"),
            "n": len(prefix),
            "prefix": inspect_types.checked_text(prefix, "prefix"),
            "limit": inspect_types.checked_limit(limit),
        }
        return [r[0] for r in await _fetch(self, CHECKPOINT_IDS_WITH_PREFIX, params)]

    async def aentry_keys_with_prefix(
        self: PostgresHost, prefix: str, thread_id: str | None = None, *, limit: int = 10
    ) -> list[tuple[str, str]]:
        """``(scope, key)`` of ledger entries whose key starts with ``prefix`` (in one
        thread, or any), oldest first."""
        params: dict[str, Any] = {
            "n": len(prefix),
            "prefix": inspect_types.checked_text(prefix, "prefix"),
            "limit": inspect_types.checked_limit(limit),
        }
        query = ENTRY_KEYS_WITH_PREFIX
        if thread_id is not None:
            params["t"] = inspect_types.checked_text(thread_id, "thread_id")
            query = ENTRY_KEYS_OF_THREAD_WITH_PREFIX
        return [(r[0], r[1]) for r in await _fetch(self, query, params)]

    async def acheckpoint_nodes(
        self: PostgresHost, thread_ids: Sequence[str] | None = None
    ) -> list[inspect_types.CheckpointNode]:
        """Every checkpoint of these threads (or all) with its parent, metadata and
        pending-write count: what planning a prune needs, no value decoded."""
        if thread_ids is None:
            rows = await _fetch(self, CHECKPOINT_NODES)
        else:
            threads = [inspect_types.checked_text(t, "thread_id") for t in thread_ids]
            rows = await _fetch(self, CHECKPOINT_NODES_OF_THREADS, {"threads": threads})
        return [inspect_types.CheckpointNode(r[0], r[1], r[2], r[3], r[4], int(r[5])) for r in rows]

    async def adelete_checkpoints(
        self: PostgresHost, keys: Sequence[tuple[str, str, str]]
    ) -> inspect_types.DeletedCounts:
        """Delete these checkpoints with their pending writes, and the blobs no remaining
        checkpoint needs; ledger entries stay. One transaction, under the threads' locks
        (``sql.THREAD_LOCK_SPACE``): an ``aput`` writing a delta meanwhile keeps its base.

        What ``idem-saver prune --before`` applies; the saver's retention methods are
        the way to prune from code.
        """
        rows = inspect_types.checked_keys(keys)
        if not rows:
            return inspect_types.DeletedCounts(0, 0, 0)
        params = {
            "t": [k[0] for k in rows],
            "ns": [k[1] for k in rows],
            "id": [k[2] for k in rows],
            "threads": sorted({k[0] for k in rows}),
        }

        async def delete(cur: Cursor) -> inspect_types.DeletedCounts:
            await cur.execute(sql.LOCK_THREADS, params, prepare=False)
            await cur.execute(DELETE_WRITES_OF, params)
            writes = cur.rowcount
            await cur.execute(DELETE_CHECKPOINTS, params)
            checkpoints = cur.rowcount
            blobs = await acollect_blobs(cur, params["threads"])
            return inspect_types.DeletedCounts(checkpoints, writes, blobs)

        deleted = await self._run(delete, tx=True)
        self._deltas.forget(params["threads"])
        return deleted

    async def astorage_counts(self: PostgresHost) -> inspect_types.StorageCounts:
        """Rows of each table, schema version, bytes on disk (the tables with their
        indexes and TOAST)."""
        [(*counts, version, size)] = await _fetch(self, TABLE_COUNTS)
        threads, checkpoints, blobs, writes, entries = (int(n) for n in counts)
        return inspect_types.StorageCounts(
            threads,
            checkpoints,
            blobs,
            writes,
            entries,
            version,
            None if size is None else int(size),
        )


class PostgresSyncInspection:
    """The sync saver's read-side helpers: ``PostgresInspection``'s methods, each sync
    (``thread_summaries``) and async (``athread_summaries``), run by the async saver on its
    private loop (:mod:`~langgraph_idem_saver.forwarding`), so the answers are its own."""

    thread_summaries = blocking(PostgresInspection.athread_summaries)
    athread_summaries = hopping(PostgresInspection.athread_summaries)
    thread_exists = blocking(PostgresInspection.athread_exists)
    athread_exists = hopping(PostgresInspection.athread_exists)
    checkpoint_history = blocking(PostgresInspection.acheckpoint_history)
    acheckpoint_history = hopping(PostgresInspection.acheckpoint_history)
    checkpoint_ids_with_prefix = blocking(PostgresInspection.acheckpoint_ids_with_prefix)
    acheckpoint_ids_with_prefix = hopping(PostgresInspection.acheckpoint_ids_with_prefix)
    entry_keys_with_prefix = blocking(PostgresInspection.aentry_keys_with_prefix)
    aentry_keys_with_prefix = hopping(PostgresInspection.aentry_keys_with_prefix)
    checkpoint_nodes = blocking(PostgresInspection.acheckpoint_nodes)
    acheckpoint_nodes = hopping(PostgresInspection.acheckpoint_nodes)
    delete_checkpoints = blocking(PostgresInspection.adelete_checkpoints)
    adelete_checkpoints = hopping(PostgresInspection.adelete_checkpoints)
    storage_counts = blocking(PostgresInspection.astorage_counts)
    astorage_counts = hopping(PostgresInspection.astorage_counts)

    @staticmethod
    def is_idem_database(conn: Connection[Any]) -> bool:
        """Whether our tables are on ``conn``'s search path, read before ``setup()``
        (which would create them); in a read-only session too."""
        with conn.cursor(row_factory=tuple_row) as cur:
            cur.execute(IS_IDEM_DATABASE)
            row = cur.fetchone()
        return bool(row and row[0])


__all__ = ["PostgresInspection", "PostgresSyncInspection"]
