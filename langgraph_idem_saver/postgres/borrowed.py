"""The async saver behind ``PostgresSaver(conn)`` / ``PostgresSaver(pool)``: what runs on
the saver's loop - the ledger (claims, outcomes, model-answer records, driven by the
engine there), ``setup()``, maintenance, the ``a``-methods - runs on *your* sync
connection or pool, borrowed for the call. The saver holds no session of its own.

Why: LangGraph's sync ``PostgresSaver`` runs everything on the connection or pool it is
given, so a program (or LangGraph's own saver tests) can close that connection or pool
and then ``DROP DATABASE`` without closing the saver. An async session of the saver's own
blocked that drop; opening one per call and closing it (the design this replaces) kept the
drop working but paid a connect - a new server process - on every ledger call: one claim
and its outcome took 28-39 ms that way against 2.7-3.3 ms on a kept session (2026-11-27
at commit 3752985, loaded 2-core host). Borrowing pays neither.

**How.** The saver's statement bodies are written once, against an async cursor
(``fn(cur)`` with ``await cur.execute(...)``, ``await cur.fetchall()``; ledger_store.py,
held_writes.py, migrations, maintenance). :meth:`BorrowedPostgresSaver._execute` - the one
place ``_run`` funnels into - hands ``fn`` a :class:`SyncBackedCursor`, whose ``async``
methods call your sync cursor and return at once, and drives ``fn`` to its end without
the event loop (:func:`drive`: a body that awaited anything else is a bug, refused). The
connection, the transaction (each call committed before it returns: refused with
:class:`ConfigError` while a transaction of yours is open on it - autocommit or not -
which would make ours part of yours, committed only with it) and the typed errors are
the direct path's
(:meth:`DirectPath.call`, ``postgres/direct.py``), so both paths take turns on your
``Connection`` under one ``threading.Lock``, and a pool lends one connection per call.

**Where the statements run.** Decided per kind of connection:

* your ``Connection``: on the loop thread itself, blocking it for the statement. One call
  runs at a time on one connection anyway, and the loop is this saver's alone; a hop to a
  thread would add two thread switches per call for nothing. No deadlock: the lock is
  held only for a call's statements, and nothing holding it ever waits on the loop (the
  direct path runs on the caller's thread; a body never suspends).
* your ``ConnectionPool``: on a worker thread of the saver's (as many as the pool's
  ``max_size``; for a ``NullConnectionPool``'s unlimited 0, Python's default count), so
  calls run concurrently, one pooled connection each, and a call waiting for a
  connection (the pool exhausted, or the server down: up to the pool's ``timeout``)
  never stalls the loop that every other ledger call of the process needs.
  A call cancelled on the loop (``wait_for``, a cancelled ``ainvoke``) runs no statement
  after the cancellation: one still waiting for a connection runs nothing; one whose
  statement is running is waited for (the engine, on the saver's loop, never moves on
  while it may still write) and its transaction, if it has one, rolled back. A
  statement that ran under autocommit stays, as when a cancellation lands on the async
  saver just after one.

**Measured** (2026-11-27, at commit 998e272 against the same tree with the
connect-per-call saver restored; ``benchmarks/sync_pg_ledger.py``, alternating processes,
a 2-core host at load average 4-5, ranges over two runs; ``benchmarks/README.md``): one
claim and its outcome 16.2-26.8 ms connecting per call -> 1.30-4.07 ms on your
``Connection``; 15.7-27.7 -> 2.08-7.55 ms on your pool; a 10-call ``IdempotentToolNode``
step 7.8-11.2 -> 2.67-5.06 ms per call (connection), 7.3-10.3 -> 3.44-6.25 (pool); a kept
async session measured 1.82-4.02 and 3.40-5.41 beside them. The pool's hop to a worker
thread, against running its calls on the loop thread: four threads making claims and
outcomes at once, 2.31-3.24 against 5.00-10.13 ms wall time per pair.

**What it changes.** Nothing of yours is copied: the ledger runs on your sessions
themselves, so a ``configure`` callback of your pool, its ``reset``, your connection's
``search_path`` or ``prepare_threshold`` apply to it as they do to checkpoints; your row
factory applies to neither (each call reads tuples, on a cursor of its own).
``keep_session=True`` is kept for compatibility and does nothing (there is no session of
the saver's to keep). Lost connections: a pool replaces them, so an outcome whose write
failed is retried for ``outcome_retry_seconds`` and then held until the database is back
(``held_writes.py``); a lost ``Connection`` is not the saver's to replace, so such an
outcome is given up at once (read as unknown by this process), as on
``AsyncPostgresSaver(conn)``. A pipelined connection keeps a session of the saver's own
(``postgres/sync_saver.py`` says why).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from typing import Any, TypeVar, cast

from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import BaseConnection, Connection
from psycopg import Cursor as SyncCursor
from psycopg import sql as psql
from psycopg.abc import Params
from psycopg.pq import TransactionStatus
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool, PoolClosed, PoolTimeout

from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.postgres.connection import Cursor
from langgraph_idem_saver.postgres.direct import DirectPath
from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver
from langgraph_idem_saver.retention import TTLConfig

T = TypeVar("T")
Query = str | bytes | psql.SQL | psql.Composed
# a transaction open on the user's connection (``BEGIN`` or ``conn.transaction()`` under
# autocommit too): the ledger refuses to run inside it (``run_borrowed``)
_OPEN = (TransactionStatus.INTRANS, TransactionStatus.INERROR)


class CallCancelled(Exception):
    """A borrowed call whose caller was cancelled: raised before its next statement (or
    its commit), so the call's transaction rolls back."""


class CallState:
    """Whether a borrowed call has started its statements, and whether its caller gave up
    on it; set from the loop, read from the worker thread."""

    __slots__ = ("_lock", "cancelled", "started")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.cancelled = False
        self.started = False

    def start(self) -> None:
        """The connection is in hand: go on, unless the caller is gone."""
        with self._lock:
            self.check()
            self.started = True

    def check(self) -> None:
        if self.cancelled:
            raise CallCancelled("the caller was cancelled: nothing more of this call runs")

    def cancel(self) -> bool:
        """Stop the call before its next statement; whether statements had started."""
        with self._lock:
            self.cancelled = True
            return self.started


class SyncBackedCursor:
    """The part of ``AsyncCursor``'s API the saver's statement bodies use, over a sync
    cursor: each method runs the statement here and returns at once (never suspends)."""

    __slots__ = ("_cur", "_state")

    def __init__(self, cur: SyncCursor[TupleRow], state: CallState) -> None:
        self._cur = cur
        self._state = state

    async def execute(
        self,
        query: Query,
        params: Params | None = None,
        *,
        prepare: bool | None = None,
        binary: bool | None = None,
    ) -> SyncBackedCursor:
        self._state.check()
        self._cur.execute(query, params, prepare=prepare, binary=binary)
        return self

    async def executemany(
        self, query: Query, params_seq: Iterable[Params], *, returning: bool = False
    ) -> None:
        self._state.check()
        self._cur.executemany(query, params_seq, returning=returning)

    async def fetchone(self) -> TupleRow | None:
        return self._cur.fetchone()

    async def fetchmany(self, size: int = 0) -> list[TupleRow]:
        return self._cur.fetchmany(size)

    async def fetchall(self) -> list[TupleRow]:
        return self._cur.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cur.rowcount


def drive(awaitable: Awaitable[T]) -> T:
    """Run ``awaitable`` to its end here, without an event loop: it may await only what
    returns at once (a :class:`SyncBackedCursor`'s methods)."""
    steps = awaitable.__await__()
    try:
        steps.send(None)
    except StopIteration as done:
        return cast(T, done.value)
    steps.close()
    raise RuntimeError(
        "a statement body of the Postgres saver awaited something other than its cursor; "
        "on a borrowed sync connection it cannot (a bug: please report it)"
    )


def run_borrowed(
    conn: Connection[Any], fn: Callable[[Cursor], Awaitable[T]], tx: bool, state: CallState
) -> T:
    """``fn`` on ``conn`` as ``_in_transaction`` runs it on an async connection: in a
    transaction committed before returning when ``tx`` or not in autocommit, on a
    ``tuple_row`` binary cursor whatever the connection's row factory."""
    state.start()
    status = conn.info.transaction_status
    if status in _OPEN or (status == TransactionStatus.ACTIVE and not conn.autocommit):
        # ours would be a savepoint of yours (or, under autocommit, its statements would
        # join yours): nothing committed until you commit - and gone if you roll back
        raise ConfigError(
            "the psycopg connection given to PostgresSaver has a transaction of yours open "
            f"({status.name}); the ledger commits each call before a tool runs, so it "
            "cannot run inside it: commit or roll back first (autocommit or not), or give "
            "the saver a connection or pool of its own"
        )
    with (
        conn.transaction() if tx or not conn.autocommit else nullcontext(),
        conn.cursor(row_factory=tuple_row, binary=True) as cur,
    ):
        result = drive(fn(cast(Cursor, SyncBackedCursor(cur, state))))
        state.check()  # a caller cancelled meanwhile: roll back rather than commit
        return result


class BorrowedPostgresSaver(AsyncPostgresSaver):
    """An :class:`AsyncPostgresSaver` whose statements run on the user's sync
    ``Connection`` or ``ConnectionPool`` (see the module docstring).

    ``conn`` (the base class's) is a pool that is never opened, a stand-in for "the
    user's connections": nothing reads it but the typed errors, through
    :meth:`_typed_error` below.
    """

    def __init__(
        self,
        direct: DirectPath,
        *,
        serde: SerializerProtocol | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(AsyncConnectionPool("", open=False), serde=serde, ttl=ttl)
        self._direct = direct
        users = direct.conn
        self._pool = users if isinstance(users, ConnectionPool) else None
        # one per pooled connection; a NullConnectionPool's max_size 0 means no limit (and
        # ThreadPoolExecutor refuses 0): then Python's default count
        self._workers = (
            ThreadPoolExecutor(users.max_size or None, thread_name_prefix="PostgresSaver-ledger")
            if isinstance(users, ConnectionPool)
            else None
        )

    def close_workers(self) -> None:
        """Stop the worker threads (at the sync saver's close, after its direct path
        closed, so no call is left on them)."""
        if self._workers is not None:
            self._workers.shutdown(wait=True)

    async def _execute(
        self,
        fn: Callable[[Cursor], Awaitable[T]],
        *,
        tx: bool = False,
        pipeline: bool = False,
        ledger: bool = False,
    ) -> T:
        """Run ``fn`` on a borrowed connection (``pipeline`` is moot: each statement's rows
        are read before the next is sent, on a connection that is not in pipeline mode;
        ``ledger`` too: ``run_borrowed`` refuses a user's open transaction for every call)."""
        state = CallState()
        body = partial(run_borrowed, fn=fn, tx=tx, state=state)
        if self._workers is None:  # the user's Connection: here, one call at a time
            return self._direct.call(self, body)
        work = asyncio.get_running_loop().run_in_executor(
            self._workers, self._direct.call, self, body
        )
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            work.add_done_callback(_retrieved)  # its end (CallCancelled) is nobody's news
            if state.cancel():  # its statements started: wait until they end (rolled back)
                await _ended(work)
            raise

    def _reconnects(self) -> bool:
        """A pool replaces a lost connection; the user's single connection is not ours to."""
        return self._pool is not None and not self._pool.closed

    async def _discard_dead_connections(self) -> None:
        """Done by the direct path, on the thread that found the connection lost."""

    def _typed_error(
        self, exc: BaseException, conn: BaseConnection[Any] | None
    ) -> Exception | None:
        """The async saver's typing, with the advice of a sync ``Connection`` when one was
        lost (it cannot be replaced by the saver: a new connection and saver are needed)."""
        error = super()._typed_error(exc, conn)
        if (
            self._pool is None
            and isinstance(error, ConnectionClosedError)
            and not isinstance(exc, (PoolClosed, PoolTimeout))
        ):
            return ConnectionClosedError(
                f"the PostgreSQL connection was lost ({exc}); open a new connection and "
                "create a new saver (e.g. `with PostgresSaver.from_conn_string(dsn)`), or "
                "pass a ConnectionPool, which replaces lost connections"
            )
        return error


def _retrieved(work: asyncio.Future[Any]) -> None:
    """Mark a cancelled caller's call as seen, so its error is not logged as lost."""
    if not work.cancelled():
        work.exception()


async def _ended(work: asyncio.Future[Any]) -> None:
    """Wait until ``work`` (a worker thread's call) is over, through further
    cancellations: it stops at its next statement, so this is short."""
    while not work.done():
        try:
            await asyncio.wait({work})
        except asyncio.CancelledError:
            continue
