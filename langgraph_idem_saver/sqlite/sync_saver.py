"""``SqliteSaver``: the synchronous drop-in for ``langgraph.checkpoint.sqlite.SqliteSaver``.

For programs without an event loop (``graph.invoke`` / ``graph.stream``): the same name,
constructor (``SqliteSaver(conn)`` over a ``sqlite3.Connection``), ``from_conn_string``
(a context manager) and ``setup()`` as LangGraph's, with the tool-call ledger.

**Design: the async saver on a private loop, not a second implementation.** A
``SqliteSaver`` owns an event loop in a daemon thread and an :class:`AsyncSqliteSaver`
on it (see :mod:`langgraph_idem_saver.sync_bridge` for why). So the file format is the
async saver's by construction: a database written by ``AsyncSqliteSaver`` opens with
``SqliteSaver`` and vice versa, ledger included, and every capability (list deltas,
typed errors, ``prune``, ``copy_thread``, the ledger, migrations) is the same code.

**The direct path.** What ``graph.invoke`` calls on every step - ``get_tuple``, ``put``,
``put_writes``, ``list`` and ``get_delta_channel_history`` - does not go through the loop:
once the saver is set up, each runs the async saver's own read or write body (the same
function its ``a``-method ships to the aiosqlite worker) on the caller's thread, holding
the connection lock every function on the connection holds (``sqlite/connection.py``).
A hop to the loop and on to the worker and back costs about a millisecond per call on a
busy machine, more than the SQL; the lock costs nothing measurable when free. The rest
(the ledger, which the engine drives on the loop; ``prune``, ``copy_thread``,
``delete_thread``, ``sweep``...; the first call, which runs ``setup()``) takes the loop
path, its functions holding the same lock on the worker, so the two paths take turns on
the connection and never interleave a transaction.

Trade-off: direct writes from several threads take turns on the lock, one transaction
and one commit (one fsync with ``synchronous=FULL``) each, as LangGraph's own
``SqliteSaver`` does; on the loop path concurrent writes shared a commit (group commit).
Claims (the ledger) still go through the loop and keep their group commit and their
``synchronous=FULL`` rule.

``SqliteSaver(conn)`` runs its SQL on *your* connection, from the callers' threads and
from the aiosqlite worker thread of an ``aiosqlite.Connection`` built over it (its
connector returns ``conn``). So the connection must allow use from other threads: open
it as LangGraph's docs do, ``sqlite3.connect(path, check_same_thread=False)`` (else
:class:`ConfigError`, at once). It is yours: ``close()`` stops the saver's threads and
leaves it open. Don't run statements on it yourself while the saver is in use (a
transaction of yours would interleave with the saver's). The default legacy transaction
control and ``isolation_level=None`` both work; Python 3.12's ``autocommit=False`` keeps
a transaction open at all times, which the saver cannot work inside: :class:`ConfigError`.

``from_conn_string(path)`` opens its own connection (as ``AsyncSqliteSaver`` does: WAL,
``synchronous=FULL``, path errors named, ``check_same_thread=False``), closed with the
``with`` block. Its ``conn`` attribute is that ``sqlite3.Connection``; the saver's
threads use it in turn, holding the connection lock.

Threads: one saver may be shared by any number of threads (``graph.invoke`` from a thread
pool); their calls take turns on the one connection. ``close()`` waits for a direct call
in progress; every call after it raises
:class:`~langgraph_idem_saver.errors.ConnectionClosedError`.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager
from threading import get_ident
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
    DeltaChannelHistory,
)
from typing_extensions import Unpack

from langgraph_idem_saver.backend import CheckpointPut
from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.list_deltas import EncodedBlob
from langgraph_idem_saver.retention import SyncRetention, TTLConfig
from langgraph_idem_saver.saver_checkpoints import ListQuery, SyncCheckpointCalls, SyncPageReader
from langgraph_idem_saver.sqlite.inspect import SqliteSyncInspection
from langgraph_idem_saver.sqlite.runner import BorrowedConnection, raw_connection
from langgraph_idem_saver.sqlite.saver import AsyncSqliteSaver, SqliteOptions
from langgraph_idem_saver.sync_bridge import SyncSaverBase

__all__ = ["SqliteSaver"]

T = TypeVar("T")


class SqliteSaver(
    SyncCheckpointCalls, SyncRetention, SqliteSyncInspection, SyncSaverBase[AsyncSqliteSaver]
):
    """Sync SQLite checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a ``sqlite3.Connection`` opened with ``check_same_thread=False``.
        options: ``AsyncSqliteSaver``'s keyword arguments (``serde``, ``synchronous``,
            ``busy_timeout``, ``ttl``: retention, applied by ``sweep()``), the same defaults.
    """

    conn: sqlite3.Connection
    saver: AsyncSqliteSaver

    def __init__(self, conn: sqlite3.Connection, **options: Unpack[SqliteOptions]) -> None:
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
        options["ttl"] = TTLConfig.of(options.get("ttl"))  # refused here, before any thread

        async def open_saver(stack: AsyncExitStack) -> AsyncSqliteSaver:
            _check_usable_from_another_thread(conn)  # we are on the loop's thread
            borrowed = BorrowedConnection(conn)  # its worker thread is a daemon, as ours
            stack.push_async_callback(borrowed.close)
            return _closing_direct_first(stack, AsyncSqliteSaver(borrowed, **options))

        self._start("SqliteSaver", open_saver)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls, conn_string: str, **options: Unpack[SqliteOptions]
    ) -> Iterator[SqliteSaver]:
        """Open ``conn_string`` (a path, ``:memory:`` or a ``file:`` URI) for the block.

        Set up on open; refuses a bad path, an unwritable database or a file that is not
        SQLite at once, with the same typed errors as ``AsyncSqliteSaver.from_conn_string``.
        """

        async def open_saver(stack: AsyncExitStack) -> AsyncSqliteSaver:
            opened = await stack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(conn_string, **options)
            )
            return _closing_direct_first(stack, opened)

        saver = cls.__new__(cls)
        saver._start("SqliteSaver", open_saver)
        with saver:  # its __exit__: the block's own error is never masked by a close's
            saver.conn = raw_connection(saver.saver.conn)
            yield saver

    def setup(self) -> None:
        """Configure the connection and create or migrate the tables (idempotent; also
        runs on first use). Raises what ``AsyncSqliteSaver.setup`` raises."""
        self._call(self.saver.setup())

    # --- the direct path (see the module docstring) ------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._read(self.saver._get_tuple_body(config))

    def _direct_put(self, put: CheckpointPut) -> list[EncodedBlob]:
        saver = self.saver
        body = saver._put_body(put)
        runtime = self._runtime  # _store with _direct() inline: every put of an invoke
        if saver.is_setup and not runtime.closed and get_ident() != runtime.thread.ident:
            return saver._write_here(body)
        return self._call(saver._write(body))

    def _direct_writes(self, rows: list[tuple[Any, ...]]) -> None:
        self._store(self.saver._writes_body(rows))

    def _direct_pages(self, query: ListQuery) -> SyncPageReader:
        page_body = self.saver._list_page_bodies(query)
        return lambda after, size: self._read(page_body(after, size))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        return self._read(self.saver._delta_history_body(config, channels))

    def _direct(self) -> bool:
        """Whether this call may run on the caller's thread: the saver is set up and open,
        and the caller is not the loop's thread (refused on the loop path)."""
        runtime = self._runtime
        return (
            self.saver.is_setup
            and not runtime.closed
            and threading.get_ident() != runtime.thread.ident
        )

    def _read(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run a read body here, or on the loop (setting up first) when it cannot be."""
        if self._direct():
            return self.saver._call_here(body)
        return self._call(self.saver._run(body))

    def _store(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """Run a write body in its own committed transaction, here or on the loop."""
        if self._direct():
            return self.saver._write_here(body)
        return self._call(self.saver._write(body))


# the direct methods say what their async twins say (they run the same bodies)
for _name in ("get_tuple", "get_delta_channel_history"):  # put, list...: SyncCheckpointCalls
    getattr(SqliteSaver, _name).__doc__ = getattr(AsyncSqliteSaver, f"a{_name}").__doc__


def _closing_direct_first(stack: AsyncExitStack, saver: AsyncSqliteSaver) -> AsyncSqliteSaver:
    """Register (last, so closing runs it first) the end of ``saver``'s direct path: once
    the direct call in progress is done, before the connection closes."""
    stack.callback(saver._conn_lock.close_direct)
    return saver


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
