"""``Db``: one SQLite file or Postgres schema for the import tests, opened by LangGraph's own
saver (async or sync) or by ours, and read directly with SQL.

The import tests (``test_import_langgraph.py``, ``test_import_corpus.py``,
``test_import_langgraph_cli.py``) all fill a database with the official saver and open it
with ours; this is the one place that knows how each backend opens.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from pg_server import fresh_dsn


@dataclass
class Db:
    """One SQLite file / Postgres schema, opened by LangGraph's saver or ours."""

    backend: str
    where: str  # a path, or a DSN whose search_path is the schema

    @classmethod
    def for_test(cls, backend: str, request: pytest.FixtureRequest) -> Db:
        """A fresh database for this test: a file in its ``tmp_path``, or a new schema."""
        if backend == "sqlite":
            return cls(backend, str(request.getfixturevalue("tmp_path") / "agent.db"))
        return cls(backend, fresh_dsn(request.getfixturevalue("pg_server_dsn")))

    @asynccontextmanager
    async def official(self) -> AsyncIterator[Any]:
        """LangGraph's async saver, its tables set up."""
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(self.where) as saver:
                yield saver
            return
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(self.where) as saver:
            await saver.setup()
            yield saver

    @contextmanager
    def official_sync(self) -> Iterator[Any]:
        """LangGraph's sync saver, its tables set up."""
        if self.backend == "sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            with SqliteSaver.from_conn_string(self.where) as saver:
                yield saver
            return
        from langgraph.checkpoint.postgres import PostgresSaver

        with PostgresSaver.from_conn_string(self.where) as saver:
            saver.setup()
            yield saver

    def ours(self) -> AbstractAsyncContextManager[Any]:
        opened: AbstractAsyncContextManager[Any]
        if self.backend == "sqlite":
            from langgraph_idem_saver import AsyncSqliteSaver

            opened = AsyncSqliteSaver.from_conn_string(self.where)
        else:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver

            opened = AsyncPostgresSaver.from_conn_string(self.where)
        return opened

    def sql(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Run one statement directly (as a user with a SQL shell would); its rows."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.where) as conn:
                cur = conn.execute(statement.replace("%s", "?"), params)
                return cur.fetchall() if cur.description else [(cur.rowcount,)]
        import psycopg

        with psycopg.connect(self.where, autocommit=True) as pg:
            pg_cur = pg.execute(statement.encode(), params)
            return pg_cur.fetchall() if pg_cur.description else [(pg_cur.rowcount,)]

    def writes_table(self) -> str:
        return "writes" if self.backend == "sqlite" else "checkpoint_writes"

    def our_rows(self) -> dict[str, list[tuple[Any, ...]]]:
        """Everything in our checkpoint tables, in key order."""
        return {
            table: self.sql(f"SELECT * FROM {table} ORDER BY 1, 2, 3, 4")
            for table in ("idem_checkpoints", "idem_blobs", "idem_writes")
        }

    def our_threads(self) -> set[str]:
        return {r[0] for r in self.sql("SELECT DISTINCT thread_id FROM idem_checkpoints")}
