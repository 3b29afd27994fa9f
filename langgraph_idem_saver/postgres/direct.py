"""``PostgresSaver``'s direct path: the checkpoint calls ``graph.invoke`` makes on every
step, run on the caller's thread over the user's own sync connection or pool (see
:mod:`langgraph_idem_saver.postgres.sync_saver`).

What runs here is the async saver's own statements and decoding (a :data:`Steps` body
built by :class:`AsyncPostgresSaver`); only the connection, the transaction and the
cursor are sync, and psycopg's errors become the same typed errors through the async
saver's ``_typed_error``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg import Connection
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.postgres.connection import Steps, run_in_transaction

if TYPE_CHECKING:
    from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver

T = TypeVar("T")

# how often a call waiting for a pooled connection checks whether the saver was closed
CLOSE_POLL_SECONDS = 0.25


class DirectPath:
    """The user's ``Connection`` (one call at a time, under ``lock``, as LangGraph's
    ``PostgresSaver`` holds it) or ``ConnectionPool`` (one pooled connection per call,
    concurrently), and the calls in progress on it, which :meth:`close` waits for.

    Shared by a saver and its ``with_allowlist`` copies.
    """

    def __init__(self, conn: Connection[Any] | ConnectionPool[Any]) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self._calls = threading.Condition()
        self._running = 0
        self.closed = False

    def close(self) -> None:
        """Wait for the direct calls in progress, then refuse every later one."""
        with self._calls:
            self.closed = True
            self._calls.wait_for(lambda: self._running == 0)

    def run(self, saver: AsyncPostgresSaver, steps: Steps[T], *, tx: bool = False) -> T:
        """Run ``steps`` on a connection of ours, as ``saver._execute`` does on its async
        one: in its own transaction unless autocommit, with the same typed errors."""
        return self.call(saver, lambda conn: run_in_transaction(conn, steps, tx))

    def call(self, saver: AsyncPostgresSaver, body: Callable[[Connection[Any]], T]) -> T:
        """``body`` on a connection for one call (the user's under the lock, or a pooled
        one), psycopg's errors typed by ``saver``: what :meth:`run` and the borrowed
        saver's calls (:mod:`~langgraph_idem_saver.postgres.borrowed`) share.

        The call is counted in progress (for :meth:`close`; refused once closed) and the
        connection taken without a generator-based context manager each: every
        ``put`` and ``put_writes`` of a sync ``graph.invoke`` comes through here."""
        calls = self._calls
        with calls:
            if self.closed:
                raise ConnectionClosedError(
                    "the saver is closed (close() was called or its `with` block ended); "
                    "open a new one"
                )
            self._running += 1
        used: Connection[Any] | None = None
        try:
            conn = self.conn
            if isinstance(conn, ConnectionPool):
                with self._pooled(conn) as pooled:
                    used = pooled
                    return body(pooled)
            with self.lock:
                if conn.closed:
                    raise ConnectionClosedError(
                        "the psycopg connection given to PostgresSaver is closed; open a new "
                        "connection and create a new saver (e.g. `with PostgresSaver."
                        "from_conn_string(dsn)`), or pass a ConnectionPool, which replaces "
                        "lost connections"
                    )
                used = conn
                return body(conn)
        except (psycopg.Error, PoolClosed, UnicodeEncodeError) as exc:
            error = saver._typed_error(exc, used)
            if error is None:
                raise
            if isinstance(error, ConnectionClosedError):
                self._discard_dead_connections()
            raise error from exc
        finally:
            with calls:
                self._running -= 1
                if not self._running:
                    calls.notify_all()

    @contextmanager
    def _pooled(self, pool: ConnectionPool[Any]) -> Iterator[Connection[Any]]:
        """``pool.connection()``, waited for in slices of ``CLOSE_POLL_SECONDS`` up to the
        pool's ``timeout`` (then its ``PoolTimeout``), so that a call waiting for a
        connection (the pool exhausted, the server down) sees :meth:`close` within a
        slice and gives up, having run nothing: ``close()`` never waits out the pool's
        timeout for it."""
        deadline = time.monotonic() + pool.timeout
        while True:
            left = deadline - time.monotonic()
            held = ExitStack()
            try:  # only the wait is retried, never the call's body
                conn = held.enter_context(
                    pool.connection(timeout=max(min(left, CLOSE_POLL_SECONDS), 0.001))
                )
            except PoolTimeout:
                if self.closed:
                    raise ConnectionClosedError(
                        "the saver was closed while this call waited for a pooled "
                        "connection; nothing of the call ran"
                    ) from None
                if left <= CLOSE_POLL_SECONDS:
                    raise
                continue
            with held:
                if self.closed:  # handed over after close() began: still nothing runs
                    raise ConnectionClosedError(
                        "the saver was closed while this call waited for a pooled "
                        "connection; nothing of the call ran"
                    )
                yield conn
            return

    def _discard_dead_connections(self) -> None:
        """After a lost connection, make the pool drop its other dead idle ones (as the
        async saver does with its pool), so the next call gets a live one."""
        if isinstance(self.conn, ConnectionPool):
            with contextlib.suppress(Exception):
                self.conn.check()
