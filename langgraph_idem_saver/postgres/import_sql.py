"""Reading the tables of LangGraph's own Postgres saver (``checkpoints``,
``checkpoint_blobs``, ``checkpoint_writes``) on the saver's ``search_path``, for
:mod:`langgraph_idem_saver.import_langgraph`.

``langgraph-checkpoint-postgres`` 3.x and 2.x share the layout but for
``checkpoint_writes.task_path`` (added by a migration; absent before it). A checkpoint
row is JSONB with primitive channel values inline; the others are rows of
``checkpoint_blobs`` keyed by the checkpoint's ``channel_versions`` (a blob wins over an
inline marker), read as LangGraph's own ``SELECT_SQL`` reads them.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.serde.types import TASKS
from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from langgraph_idem_saver import import_langgraph
from langgraph_idem_saver.errors import CorruptRecordError, ImportLayoutError
from langgraph_idem_saver.import_langgraph import ImportSql, imported_writes, staged_range
from langgraph_idem_saver.import_rows import Key, Layout, SourceRow, with_writes
from langgraph_idem_saver.postgres.host import PostgresHost
from langgraph_idem_saver.saver_codec import decode_typed

Cursor = AsyncCursor[TupleRow]

NEEDED: dict[str, frozenset[str]] = {
    "checkpoints": frozenset(
        {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id"}
        | {"checkpoint", "metadata"}
    ),
    "checkpoint_blobs": frozenset(
        {"thread_id", "checkpoint_ns", "channel", "version", "type", "blob"}
    ),
    "checkpoint_writes": frozenset(
        {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel"}
        | {"type", "blob"}
    ),
}
JSONB_COLUMNS = (("checkpoints", "checkpoint"), ("checkpoints", "metadata"))

SELECT_COLUMNS = """
SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), current_schema()
FROM pg_attribute AS a JOIN pg_class AS c ON c.oid = a.attrelid
WHERE a.attrelid IN (
    to_regclass('checkpoints'), to_regclass('checkpoint_blobs'),
    to_regclass('checkpoint_writes')
) AND a.attnum > 0 AND NOT a.attisdropped
"""

SELECT_PAGE = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
    c.checkpoint, c.metadata,
    (
        SELECT array_agg(array[bl.channel::bytea, bl.type::bytea, bl.blob])
        FROM jsonb_each_text(c.checkpoint -> 'channel_versions') AS v
        JOIN checkpoint_blobs AS bl
            ON bl.thread_id = c.thread_id
            AND bl.checkpoint_ns = c.checkpoint_ns
            AND bl.channel = v.key
            AND bl.version = v.value
    ),
    CASE WHEN (c.checkpoint ->> 'v')::int < 4 AND c.parent_checkpoint_id IS NOT NULL THEN (
        SELECT array_agg(array[w.type::bytea, w.blob] ORDER BY {task_path}w.task_id, w.idx)
        FROM checkpoint_writes AS w
        WHERE w.thread_id = c.thread_id
            AND w.checkpoint_id = c.parent_checkpoint_id
            AND w.channel = '__pregel_tasks'
    ) END
FROM checkpoints AS c {where}
ORDER BY c.thread_id, c.checkpoint_ns, c.checkpoint_id LIMIT %s
"""
AFTER = "WHERE (c.thread_id, c.checkpoint_ns, c.checkpoint_id) > (%s, %s, %s)"

SQL = ImportSql.of("%s", writes_table="checkpoint_writes", value="blob")


class PostgresTables:
    """LangGraph's Postgres tables beside an :class:`AsyncPostgresSaver`'s own."""

    def __init__(self, saver: PostgresHost) -> None:
        self.saver = saver
        self.schema = "the saver's search_path"

    def target(self) -> str:
        return "<dsn>"  # never the DSN itself: it may hold a password

    def where(self) -> str:
        return f"PostgreSQL schema {self.schema}"

    async def alayout(self) -> Layout | None:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(SELECT_COLUMNS)
            return await cur.fetchall()

        columns: dict[str, dict[str, str]] = {}
        for table, column, type_, schema in await self.saver._run(read):
            columns.setdefault(table, {})[column] = type_
            self.schema = schema
        if "checkpoints" not in columns:
            return None
        missing = [
            f"{table}.{column}"
            for table, needed in NEEDED.items()
            for column in sorted(needed - set(columns.get(table, {})))
        ] + [
            f"{table}.{column} as jsonb"
            for table, column in JSONB_COLUMNS
            if columns["checkpoints"].get(column, "jsonb") != "jsonb"
        ]
        if missing:
            raise ImportLayoutError(
                f"{self.where()} has a `checkpoints` table that is not one LangGraph's "
                f"Postgres saver wrote (missing: {', '.join(missing)}); nothing was imported"
            )
        if "task_path" in columns["checkpoint_writes"]:
            return Layout("langgraph-checkpoint-postgres (writes with task_path)", True)
        return Layout("langgraph-checkpoint-postgres 2.x (writes without task_path)", False)

    async def apage(self, layout: Layout, after: Key | None, limit: int) -> list[SourceRow]:
        async def read(cur: Cursor) -> tuple[list[TupleRow], list[TupleRow]]:
            order = "w.task_path, " if layout.task_path else ""
            if after is None:
                await cur.execute(SELECT_PAGE.format(where="", task_path=order), (limit,))
            else:
                page = SELECT_PAGE.format(where=AFTER, task_path=order)
                await cur.execute(page, (*after, limit))
            rows = await cur.fetchall()
            if not rows:
                return [], []
            task_path = "task_path" if layout.task_path else "''::text"
            await cur.execute(
                SQL.select_writes.format(task_path=task_path), (*rows[0][:3], *rows[-1][:3])
            )
            return rows, await cur.fetchall()

        rows, writes = await self.saver._run(read, tx=True)
        return with_writes(rows, writes, self._load)

    def _load(self, row: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        thread_id, ns, checkpoint_id, _, checkpoint, metadata, blobs, sends = row
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        if not isinstance(checkpoint, dict) or "id" not in checkpoint:
            raise CorruptRecordError(
                "checkpoint",
                location=where,
                cause=TypeError(f"holds {type(checkpoint).__name__}, not a checkpoint object"),
            )
        values = dict(checkpoint.get("channel_values") or {})
        for channel, type_, blob in blobs or []:
            name, kind = bytes(channel).decode(), bytes(type_).decode()
            if kind != "empty":
                values[name] = decode_typed(
                    self.saver.serde, kind, blob, "channel value", channel=name, **where
                )
        if sends:  # a checkpoint older than format 4: its parent's sends, as LangGraph
            # reads them (its _migrate_pending_sends)
            values[TASKS] = [
                decode_typed(self.saver.serde, bytes(t).decode(), b, "send", **where)
                for t, b in sends
            ]
            versions = dict(checkpoint["channel_versions"])
            versions[TASKS] = (
                max(versions.values()) if versions else self.saver.get_next_version(None, None)
            )
            checkpoint = {**checkpoint, "channel_versions": versions}
        if not isinstance(metadata, dict):
            raise CorruptRecordError(
                "checkpoint metadata",
                location=where,
                cause=TypeError(f"holds {type(metadata).__name__}, not an object"),
            )
        checkpoint = {**checkpoint, "channel_values": values}
        return checkpoint, metadata

    async def aimported(self, first: Key, last: Key) -> dict[Key, set[tuple[str, int]]]:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(SQL.select_imported, (*first, *last))
            return await cur.fetchall()

        return imported_writes(await self.saver._run(read))

    async def ahas_unimported_threads(self) -> bool:
        async def read(cur: Cursor) -> bool:
            await cur.execute(import_langgraph.SELECT_UNIMPORTED_THREAD)
            return await cur.fetchone() is not None

        return await self.saver._run(read)

    async def acount(self) -> int:
        async def read(cur: Cursor) -> int:
            await cur.execute(import_langgraph.COUNT_CHECKPOINTS)
            row = await cur.fetchone()
            return int(row[0]) if row else 0

        return await self.saver._run(read)

    async def apublish(self, staged: str, thread_id: str) -> None:
        async def publish(cur: Cursor) -> None:
            for statement in SQL.publish:
                await cur.execute(statement, (thread_id, staged))

        await self.saver._run(publish, tx=True)
        self.saver._deltas.forget([staged])

    async def adiscard_staged(self) -> None:
        async def discard(cur: Cursor) -> None:
            for statement in SQL.discard_staged:
                await cur.execute(statement, staged_range())

        await self.saver._run(discard, tx=True)
        self.saver._deltas.forget()
