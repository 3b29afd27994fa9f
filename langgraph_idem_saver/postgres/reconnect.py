"""The connection a ``from_conn_string`` saver owns, reopened after a server restart.

A saver built on the user's ``AsyncConnection`` cannot replace it (the user holds it, and
may hold a transaction on it): after a restart its calls raise
:class:`ConnectionClosedError` until the user builds a new one. A saver made by
``AsyncPostgresSaver.from_conn_string`` owns its connection, so it opens a new one
instead - in the call that finds the old one lost, under the saver's lock (no call is on
the connection then) - and the block's end closes whichever is open.
"""

from __future__ import annotations

import contextlib
from contextlib import AsyncExitStack
from typing import Any

import psycopg
from psycopg import AsyncConnection, AsyncPipeline
from psycopg.rows import dict_row

from langgraph_idem_saver.errors import ConfigError


class OwnedConnection:
    """Opens (and reopens) the connection of a ``from_conn_string`` saver: autocommit,
    prepared statements, ``dict_row`` (LangGraph's saver's settings), in pipeline mode
    when asked; :meth:`aclose` closes the last one."""

    def __init__(self, conn_string: str, *, pipeline: bool) -> None:
        self.conn_string = conn_string
        self.pipeline = pipeline
        self.reopened = 0  # how many times a lost connection was replaced
        self._stack = AsyncExitStack()

    async def open(self) -> tuple[AsyncConnection[Any], AsyncPipeline | None]:
        """A new connection (and its pipeline): ``ConnectionClosedError`` when the server
        cannot be reached, ``ConfigError`` for a malformed DSN."""
        from langgraph_idem_saver.postgres.connection import connect_error

        try:
            conn = await AsyncConnection.connect(
                self.conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
        except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
            error = connect_error(exc, self.conn_string)
            raise error from (None if isinstance(error, ConfigError) else exc)
        stack = AsyncExitStack()
        await stack.enter_async_context(conn)
        pipe = await stack.enter_async_context(conn.pipeline()) if self.pipeline else None
        self._stack = stack
        return conn, pipe

    async def reopen(self) -> tuple[AsyncConnection[Any], AsyncPipeline | None]:
        """Close the lost connection and open a new one (the caller holds the lock)."""
        old = self._stack
        with contextlib.suppress(Exception):  # it is dead: closing it can only fail
            await old.aclose()
        found = await self.open()
        self.reopened += 1
        return found

    async def aclose(self) -> None:
        await self._stack.aclose()
