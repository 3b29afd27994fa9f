"""aiosqlite's worker thread, driven the way the SQLite saver needs: the one module that
touches aiosqlite's private API.

Why private API: every saver call ships *one* function to aiosqlite's worker thread, which
runs all its SQL on the ``sqlite3.Connection`` there (a whole transaction, the commit, and
for reads the decoding) - one hand-off of 100-300 µs instead of one per statement, and
each call serialized by the worker's queue without an asyncio lock. aiosqlite's public API
offers only one statement per hand-off (``execute``, ``executemany``...), and a
transaction spread over several hand-offs could interleave with another coroutine's
statements on the same connection. We must also accept the ``aiosqlite.Connection`` a
user passes in (the constructor is LangGraph's), so running our own thread is no way out.

What we use, all here: ``Connection._execute(fn)`` (queue ``fn`` on the worker),
``_conn`` (the ``sqlite3.Connection``), ``_connection``/``_thread``/``_running`` (is the
worker up, was it closed), the ``(connector, iter_chunk_size)`` constructor and
``stop()`` (a connection over a ``sqlite3.Connection`` the caller owns), and the
arguments ``aiosqlite.connect`` closed over in ``_connector`` (which file it opens).
aiosqlite is pinned below the next minor release; ``tests/test_upstream_contracts.py``
fails naming the missing piece when a release changes any of them, and importing this
module on an aiosqlite without the class-level ones raises an ``ImportError`` saying so.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar, cast

import aiosqlite

T = TypeVar("T")

# what aiosqlite.Connection must define on the class (the rest is checked by the tests)
REQUIRED_METHODS = ("_execute", "_conn", "_connect", "stop")
# aiosqlite's default; the saver fetches with its own cursors, so it is not used
_ITER_CHUNK_SIZE = 64

_missing = [name for name in REQUIRED_METHODS if not hasattr(aiosqlite.Connection, name)]
if _missing:  # pragma: no cover - only on an aiosqlite release we do not support
    raise ImportError(
        f"aiosqlite {getattr(aiosqlite, '__version__', '?')} lacks Connection."
        f"{', Connection.'.join(_missing)}, which langgraph_idem_saver's SQLite backend "
        "drives (see langgraph_idem_saver/sqlite/runner.py); install a supported "
        "aiosqlite (the version range in langgraph-idem-saver's requirements)"
    )


async def run_in_worker(conn: aiosqlite.Connection, fn: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``fn(sqlite3_connection)`` on ``conn``'s worker thread: one hand-off.

    Raises aiosqlite's ``ValueError`` when the connection is closed (the caller types it).
    """
    return cast(T, await conn._execute(lambda: fn(conn._conn)))  # type: ignore[no-untyped-call]


def is_started(conn: aiosqlite.Connection) -> bool:
    """Whether the worker thread is running with an open connection."""
    thread = worker_thread(conn)
    return bool(thread is not None and thread.is_alive() and getattr(conn, "_connection", None))


def is_open(conn: aiosqlite.Connection) -> bool:
    """Whether ``conn`` holds an open ``sqlite3`` connection and was not told to close
    (aiosqlite's own test before it queues a call), its worker thread aside: for code
    that runs on the connection from another thread (``_call_here``)."""
    return bool(getattr(conn, "_running", False) and getattr(conn, "_connection", None))


def was_closed(conn: aiosqlite.Connection) -> bool:
    """Whether ``close()`` was called on ``conn`` (as opposed to never opened)."""
    return not getattr(conn, "_running", True)


def worker_thread(conn: aiosqlite.Connection) -> threading.Thread | None:
    """The worker thread of ``conn`` (started or not)."""
    thread = getattr(conn, "_thread", None)
    return thread if isinstance(thread, threading.Thread) else None


def join_worker(conn: aiosqlite.Connection, timeout: float = 1.0) -> None:
    """Wait (bounded) for the worker thread of a ``conn`` just closed to exit.

    aiosqlite answers the stop before its thread returns, so the thread may still be
    alive for an instant after ``close()``: a ``close()`` that promises the saver's threads
    are stopped waits for it."""
    thread = worker_thread(conn)
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        thread.join(timeout)


def raw_connection(conn: aiosqlite.Connection) -> sqlite3.Connection:
    """The ``sqlite3.Connection`` the worker uses (for code running on that thread)."""
    return conn._conn


def connect_arguments(conn: Any) -> tuple[str | bytes | os.PathLike[str], dict[str, Any]] | None:
    """The ``database`` and keyword arguments ``aiosqlite.connect`` was given, read from
    the connector it closed over (aiosqlite keeps no public record of them); None when
    they cannot be found."""
    connector = getattr(conn, "_connector", None)
    code = getattr(connector, "__code__", None)
    cells = getattr(connector, "__closure__", None) or ()
    free = dict(zip(getattr(code, "co_freevars", ()), cells, strict=False))
    try:
        database = free["database"].cell_contents
        kwargs = free["kwargs"].cell_contents if "kwargs" in free else {}
    except (KeyError, ValueError):
        return None
    if not isinstance(database, (str, bytes, os.PathLike)) or not isinstance(kwargs, dict):
        return None
    return database, kwargs


class BorrowedConnection(aiosqlite.Connection):
    """An ``aiosqlite.Connection`` over a ``sqlite3.Connection`` the caller owns.

    Its worker thread runs the saver's SQL on that connection; closing it stops the
    thread and leaves the connection open (aiosqlite would close it).
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        super().__init__(lambda: conn, _ITER_CHUNK_SIZE)

    def stop(self) -> asyncio.Future[Any] | None:
        # forget the connection first: aiosqlite's stop() closes whatever it still holds
        self._connection = None
        return super().stop()

    async def close(self) -> None:
        """Let queued work finish, then stop the worker thread (the connection stays open)."""
        if self._connection is None:
            return
        try:
            # the queue is FIFO: once this ran, everything submitted before it is done
            await self._execute(lambda: None)  # type: ignore[no-untyped-call]
        finally:
            future = self.stop()
            if future is not None:
                await future
                join_worker(self)
