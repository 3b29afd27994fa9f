"""The async saver behind ``PostgresSaver(conn)`` / ``PostgresSaver(pool)``: it holds no
connection of its own between calls.

LangGraph's sync ``PostgresSaver`` runs everything on the connection or pool it is given,
so a program (or LangGraph's own saver tests) can close that connection or pool and then
``DROP DATABASE`` without closing the saver. Ours runs what does not take the direct path
- ``setup()``, the ledger, maintenance - on the saver's own async session (see
:mod:`langgraph_idem_saver.postgres.sync_saver`); held open, that session blocked the
``DROP DATABASE`` (``ObjectInUse``) until the saver was closed or collected.

So over a user's connection or pool, the async saver connects when a call needs it and
closes that connection before the call returns: with the user's ``Connection``, one call
at a time (one session of ours at most, as before); with a ``ConnectionPool``, one
connection per call in progress. The cost is a connect per such call - a new server
process each time - paid by the ledger's calls and maintenance, never by
``graph.invoke``'s per-step checkpoint calls (those run on the user's own connection or
pool). Measured 2026-11-27 at commit 3752985 on the tests' PostgreSQL 16 over a Unix
socket, on a 2-core machine under load (load average 9-14, so noisy): a bare connect and
close 2.2-5.2 ms; one ledger claim and its outcome 28-39 ms on demand against 2.7-3.3 ms
with a kept session. Over TLS to a remote server a connect costs more. So
``PostgresSaver(..., keep_session=True)`` keeps one session (or an async pool) until
``close()``, as ``from_conn_string`` does for its block (the connections it opens are its
own, and close with the block): the fast path, when nothing needs to drop the database
behind an open saver.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver
from langgraph_idem_saver.retention import TTLConfig

Connect = Callable[[], Awaitable[AsyncConnection[Any]]]


class OnDemandPostgresSaver(AsyncPostgresSaver):
    """An :class:`AsyncPostgresSaver` that opens a connection for each call and closes it
    before the call returns (see the module docstring).

    ``conn`` is a pool that is never opened, standing for "connections come and go": the
    saver's error handling then reads a lost connection as one the next call replaces,
    which it is.
    """

    def __init__(
        self,
        connect: Connect,
        *,
        one_at_a_time: bool,
        serde: SerializerProtocol | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(AsyncConnectionPool("", open=False), serde=serde, ttl=ttl)
        self._connect = connect
        self._one_at_a_time = one_at_a_time

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection of its own for one call, closed when the call ends."""
        if self._one_at_a_time:
            async with self.lock, self._opened() as conn:
                yield conn
            return
        async with self._opened() as conn:
            yield conn

    @asynccontextmanager
    async def _opened(self) -> AsyncIterator[AsyncConnection[Any]]:
        conn = await self._connect()
        try:
            yield conn
        except psycopg.Error as exc:
            # typed here, before closing: the typing reads the connection's state (a
            # closed one would read as lost)
            error = self._typed_error(exc, conn)
            if error is None:
                raise
            raise error from exc
        finally:
            await conn.close()

    def _reconnects(self) -> bool:
        """A lost connection is always replaced: every call connects anew."""
        return True

    async def _discard_dead_connections(self) -> None:
        """Nothing is kept, so nothing dead is either."""


async def connect(conninfo: str, **kwargs: Any) -> AsyncConnection[Any]:
    """An async connection, or :class:`ConnectionClosedError` when none can be had."""
    try:
        return await AsyncConnection.connect(conninfo, **kwargs)
    except psycopg.OperationalError as exc:
        raise ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}") from exc
