"""Reading the tables of LangGraph's own SQLite saver (``checkpoints``, ``writes``) in the
same file, for :mod:`langgraph_idem_saver.import_langgraph`.

``langgraph-checkpoint-sqlite`` 3.x and 2.x share the layout but for ``writes.task_path``
(absent from databases created before it). A checkpoint row holds the whole checkpoint,
channel values included, serialized by the saver's serializer; metadata is JSON. (One
older than checkpoint format 4 keeps its ``pending_sends`` inside: copied as they are,
the graph moves them on load from ours as from LangGraph's.)
"""

from __future__ import annotations

import sqlite3
from typing import Any

from langgraph_idem_saver import import_langgraph
from langgraph_idem_saver.errors import CorruptRecordError, ImportLayoutError
from langgraph_idem_saver.import_langgraph import ImportSql, imported_writes, staged_range
from langgraph_idem_saver.import_rows import Key, Layout, SourceRow, with_writes
from langgraph_idem_saver.saver_codec import decode_checkpoint, decode_json
from langgraph_idem_saver.sqlite.host import SqliteHost

CHECKPOINT_COLUMNS = frozenset(
    {"thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "type"}
    | {"checkpoint", "metadata"}
)
WRITE_COLUMNS = frozenset(
    {"thread_id", "checkpoint_ns", "checkpoint_id", "task_id", "idx", "channel", "type", "value"}
)

SELECT_COLUMNS = "SELECT name FROM pragma_table_info(?)"

SELECT_PAGE = """
SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, metadata
FROM checkpoints {where}
ORDER BY thread_id, checkpoint_ns, checkpoint_id LIMIT ?
"""
AFTER = "WHERE (thread_id, checkpoint_ns, checkpoint_id) > (?, ?, ?)"

SQL = ImportSql.of("?", writes_table="writes", value="value")


class SqliteTables:
    """LangGraph's SQLite tables beside an :class:`AsyncSqliteSaver`'s own."""

    def __init__(self, saver: SqliteHost) -> None:
        self.saver = saver

    def target(self) -> str:
        target = self.saver._target
        return target.path if target is not None and target.path else "<db>"

    def where(self) -> str:
        return f"SQLite file {self.target()}"

    async def alayout(self) -> Layout | None:
        def read(conn: sqlite3.Connection) -> tuple[set[str], set[str]]:
            return (
                {r[0] for r in conn.execute(SELECT_COLUMNS, ("checkpoints",))},
                {r[0] for r in conn.execute(SELECT_COLUMNS, ("writes",))},
            )

        checkpoints, writes = await self.saver._run(read)
        if not checkpoints:
            return None
        missing = sorted(CHECKPOINT_COLUMNS - checkpoints) + sorted(
            f"writes.{c}" for c in WRITE_COLUMNS - writes
        )
        if missing:
            raise ImportLayoutError(
                f"{self.target()} has a `checkpoints` table that is not one LangGraph's "
                f"SQLite saver wrote (missing: {', '.join(missing)}); nothing was imported"
            )
        if "task_path" in writes:
            return Layout("langgraph-checkpoint-sqlite (writes with task_path)", True)
        return Layout("langgraph-checkpoint-sqlite 2.x (writes without task_path)", False)

    async def apage(self, layout: Layout, after: Key | None, limit: int) -> list[SourceRow]:
        def read(conn: sqlite3.Connection) -> tuple[list[Any], list[Any]]:
            if after is None:
                rows = conn.execute(SELECT_PAGE.format(where=""), (limit,)).fetchall()
            else:
                rows = conn.execute(SELECT_PAGE.format(where=AFTER), (*after, limit)).fetchall()
            if not rows:
                return [], []
            query = SQL.select_writes.format(task_path="task_path" if layout.task_path else "''")
            writes = conn.execute(query, (*rows[0][:3], *rows[-1][:3])).fetchall()
            return rows, writes

        rows, writes = await self.saver._run(read)
        return with_writes(rows, writes, self._load)

    def _load(self, row: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        thread_id, ns, checkpoint_id, _, type_, data, metadata = row
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        checkpoint = decode_checkpoint(self.saver.serde, type_, data, **where)
        meta = {} if metadata is None else decode_json(metadata, "checkpoint metadata", **where)
        if not isinstance(meta, dict):  # LangGraph reads NULL as {}, as we do
            raise CorruptRecordError(
                "checkpoint metadata",
                location=where,
                cause=TypeError(f"decoded to {type(meta).__name__}, not an object"),
            )
        return checkpoint, meta

    async def aimported(self, first: Key, last: Key) -> dict[Key, set[tuple[str, int]]]:
        def read(conn: sqlite3.Connection) -> list[Any]:
            return conn.execute(SQL.select_imported, (*first, *last)).fetchall()

        return imported_writes(await self.saver._run(read))

    async def ahas_unimported_threads(self) -> bool:
        def read(conn: sqlite3.Connection) -> bool:
            return conn.execute(import_langgraph.SELECT_UNIMPORTED_THREAD).fetchone() is not None

        return await self.saver._run(read)

    async def acount(self) -> int:
        def read(conn: sqlite3.Connection) -> int:
            return int(conn.execute(import_langgraph.COUNT_CHECKPOINTS).fetchone()[0])

        return await self.saver._run(read)

    async def apublish(self, staged: str, thread_id: str) -> None:
        def publish(conn: sqlite3.Connection) -> None:
            for statement in SQL.publish:
                conn.execute(statement, (thread_id, staged))

        await self.saver._write(publish)
        self.saver._deltas.forget([staged])

    async def adiscard_staged(self) -> None:
        low, high = staged_range()

        def discard(conn: sqlite3.Connection) -> None:
            for statement in SQL.discard_staged:
                conn.execute(statement, (low, high))

        await self.saver._write(discard)
        self.saver._deltas.forget()
