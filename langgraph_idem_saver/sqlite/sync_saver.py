"""``SqliteSaver``: the synchronous drop-in for ``langgraph.checkpoint.sqlite.SqliteSaver``.

For programs without an event loop (``graph.invoke`` / ``graph.stream``): the same name,
constructor (``SqliteSaver(conn)`` over a ``sqlite3.Connection``), ``from_conn_string``
(a context manager) and ``setup()`` as LangGraph's, with the tool-call ledger.

**Design: the async saver on a private loop, not a second implementation.** A
``SqliteSaver`` owns an event loop in a daemon thread and an :class:`AsyncSqliteSaver`
on it (see :mod:`langgraph_idem_saver.sync_bridge` for why); every method hands its
work to that saver. So the file format is the async saver's by construction: a database
written by ``AsyncSqliteSaver`` opens with ``SqliteSaver`` and vice versa, ledger
included, and every capability (list deltas, group commit, typed errors, ``prune``,
``copy_thread``, the ledger, migrations) is the same code.

``SqliteSaver(conn)`` runs its SQL on *your* connection, from the aiosqlite worker thread
of an ``aiosqlite.Connection`` built over it (its connector returns ``conn``). So the
connection must allow use from another thread: open it as LangGraph's docs do,
``sqlite3.connect(path, check_same_thread=False)`` (else :class:`ConfigError`, at
once). It is yours: ``close()`` stops the saver's threads and leaves it open. Don't run
statements on it yourself while the saver is in use (a transaction of yours would
interleave with the saver's). The default legacy transaction control and
``isolation_level=None`` both work; Python 3.12's ``autocommit=False`` keeps a transaction
open at all times, which the saver cannot work inside: :class:`ConfigError`.

``from_conn_string(path)`` opens its own connection (as ``AsyncSqliteSaver`` does: WAL,
``synchronous=FULL``, path errors named), closed with the ``with`` block. Its ``conn``
attribute is that ``sqlite3.Connection``, owned by the saver's worker thread.

Threads: one saver may be shared by any number of threads (``graph.invoke`` from a thread
pool); calls are serialized on the one connection, and concurrent writes share a commit.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.retention import SyncRetention, TTLConfig
from langgraph_idem_saver.sqlite.runner import BorrowedConnection, raw_connection
from langgraph_idem_saver.sqlite.saver import AsyncSqliteSaver, Synchronous
from langgraph_idem_saver.sync_bridge import SyncSaverBase

__all__ = ["SqliteSaver"]


class SqliteSaver(SyncRetention, SyncSaverBase[AsyncSqliteSaver]):
    """Sync SQLite checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a ``sqlite3.Connection`` opened with ``check_same_thread=False``.
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default.
        synchronous: SQLite's ``synchronous`` setting, as for ``AsyncSqliteSaver``
            (``"FULL"``: every commit survives power loss).
        busy_timeout: seconds to wait for another process's write lock before raising
            :class:`~langgraph_idem_saver.errors.DatabaseLockedError`.
        ttl: retention, applied by ``sweep()`` (see ``TTLConfig``).
    """

    conn: sqlite3.Connection

    def __init__(
        self,
        conn: sqlite3.Connection,
        *,
        serde: SerializerProtocol | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(conn, sqlite3.Connection):
            raise TypeError(f"conn must be a sqlite3.Connection, got {type(conn).__name__}")
        if getattr(conn, "autocommit", None) is False:
            raise ConfigError(
                "SqliteSaver cannot use a sqlite3 connection opened with autocommit=False "
                "(it is always inside a transaction, so the saver's commits would never "
                "begin and its reads would never see other writers); open it with the "
                "default transaction control or autocommit=True"
            )
        self.conn = conn
        ttl = TTLConfig.of(ttl)

        async def open_saver(stack: AsyncExitStack) -> AsyncSqliteSaver:
            _check_usable_from_another_thread(conn)  # we are on the loop's thread
            borrowed = BorrowedConnection(conn)  # its worker thread is a daemon, as ours
            stack.push_async_callback(borrowed.close)
            return AsyncSqliteSaver(
                borrowed, serde=serde, synchronous=synchronous, busy_timeout=busy_timeout, ttl=ttl
            )

        self._start("SqliteSaver", open_saver)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        serde: SerializerProtocol | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> Iterator[SqliteSaver]:
        """Open ``conn_string`` (a path, ``:memory:`` or a ``file:`` URI) for the block.

        Set up on open; refuses a bad path, an unwritable database or a file that is not
        SQLite at once, with the same typed errors as ``AsyncSqliteSaver.from_conn_string``.
        """

        async def open_saver(stack: AsyncExitStack) -> AsyncSqliteSaver:
            return await stack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(
                    conn_string,
                    serde=serde,
                    synchronous=synchronous,
                    busy_timeout=busy_timeout,
                    ttl=ttl,
                )
            )

        saver = cls.__new__(cls)
        saver._start("SqliteSaver", open_saver)
        try:
            saver.conn = raw_connection(saver.saver.conn)
            yield saver
        finally:
            saver.close()

    def setup(self) -> None:
        """Configure the connection and create or migrate the tables (idempotent; also
        runs on first use). Raises what ``AsyncSqliteSaver.setup`` raises."""
        self._call(self.saver.setup())


def _check_usable_from_another_thread(conn: sqlite3.Connection) -> None:
    """Refuse, before anything else, a connection the saver's threads cannot use."""
    try:
        conn.execute("SELECT 1").close()
    except sqlite3.ProgrammingError as exc:
        if "same thread" in str(exc):
            raise ConfigError(
                "SqliteSaver runs its SQL on its own thread, and this sqlite3 connection "
                "may only be used by the thread that created it: open it with "
                "sqlite3.connect(path, check_same_thread=False), as LangGraph's docs do"
            ) from exc
        if "closed" in str(exc):
            raise ConnectionClosedError(f"the sqlite3 connection is closed: {exc}") from exc
        raise
