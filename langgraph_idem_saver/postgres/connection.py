"""Running a saver's statements on PostgreSQL: a connection per call (the pool's, or
ours under a lock), transactions, pipelining, cancellation safety, typed errors, and
the migrations ``setup()`` applies (mixed into :class:`AsyncPostgresSaver`).

Kept apart from the checkpoint methods so that every statement the saver runs goes
through one place that turns psycopg's exceptions into the package's typed errors.

The checkpoint calls ``PostgresSaver`` also runs on a *sync* connection (its direct path,
:mod:`langgraph_idem_saver.postgres.direct`) are written once, as :data:`Steps`: a
generator that yields each :class:`Statement` and is sent its rows. :func:`arun_steps`
runs one on an async cursor and :func:`run_steps` on a sync one; nothing else differs.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import psycopg
from psycopg import AsyncConnection, AsyncCursor, AsyncPipeline, BaseConnection, pq
from psycopg import sql as psql
from psycopg.abc import Params
from psycopg.rows import TupleRow, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed, PoolTimeout

from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
    SerializationError,
    StorageFullError,
    unencodable_text,
)
from langgraph_idem_saver.held_outcomes import Held, HeldOutcomes
from langgraph_idem_saver.postgres import sql
from langgraph_idem_saver.postgres.contention import contention_error

if TYPE_CHECKING:
    from langgraph_idem_saver.postgres.reconnect import OwnedConnection

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
Conn = AsyncConnection[Any] | AsyncConnectionPool[Any]


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of a :data:`Steps` body, and which of its rows the body is sent back
    (``"none"``: None, ``"one"``: ``fetchone()``, ``"all"``: ``fetchall()``).

    ``prepare=False`` sends it unprepared: planned on each call for the tables as they
    are, never from a plan cached while they were small (None: the connection decides)."""

    query: str | bytes | psql.SQL | psql.Composed
    params: Params | None = None
    fetch: Literal["none", "one", "all"] = "none"
    prepare: bool | None = None


# a body of statements shared by the async and the sync paths: yields each statement,
# is sent its rows, returns the call's result (see the module docstring)
Steps = Generator[Statement, Any, T]


def single(statement: Statement) -> Steps[Any]:
    """The body of one statement: its rows (as ``statement.fetch`` asks) are the result."""
    return (yield statement)


async def arun_steps(steps: Steps[T], cur: Cursor) -> T:
    """Run ``steps`` on an async cursor (:func:`run_steps` is its sync twin)."""
    statement, result = _advance(steps, None)
    while statement is not None:
        await cur.execute(statement.query, statement.params, prepare=statement.prepare)
        statement, result = _advance(steps, await _afetch(cur, statement.fetch))
    return result


def run_steps(steps: Steps[T], cur: psycopg.Cursor[TupleRow]) -> T:
    """Run ``steps`` on a sync cursor (the direct path's :func:`arun_steps`)."""
    statement, result = _advance(steps, None)
    while statement is not None:
        cur.execute(statement.query, statement.params, prepare=statement.prepare)
        statement, result = _advance(steps, _fetch(cur, statement.fetch))
    return result


def _advance(steps: Steps[T], rows: Any) -> tuple[Statement | None, T]:
    """Send ``steps`` the rows of its last statement: its next statement, or (None, its
    result) when it is done."""
    try:
        return steps.send(rows), None  # type: ignore[return-value]
    except StopIteration as done:
        return None, done.value


async def _afetch(cur: Cursor, fetch: str) -> Any:
    if fetch == "none":
        return None
    return await (cur.fetchone() if fetch == "one" else cur.fetchall())


def _fetch(cur: psycopg.Cursor[TupleRow], fetch: str) -> Any:
    if fetch == "none":
        return None
    return cur.fetchone() if fetch == "one" else cur.fetchall()


def run_in_transaction(conn: psycopg.Connection[Any], steps: Steps[T], tx: bool = False) -> T:
    """Run ``steps`` on a sync connection as ``_in_transaction`` runs a function on an
    async one: in a transaction committed before returning when ``tx`` or not in
    autocommit; on a ``tuple_row``, binary cursor whatever the connection's row factory."""
    own_tx = tx or not conn.autocommit
    with (
        conn.transaction() if own_tx else contextlib.nullcontext(),
        conn.cursor(row_factory=tuple_row, binary=True) as cur,
    ):
        return run_steps(steps, cur)


# after a pooled connection was lost, for BRIDGE_SECONDS a call waits BRIDGE_WAIT seconds
# for the pool's connection and then opens its own (PostgresConnection._bridged)
BRIDGE_SECONDS = 60.0
BRIDGE_WAIT = 0.25
BRIDGE_DRY_SECONDS = 1.0  # after a wait in vain, calls barely wait for this long

# SQLSTATEs meaning the session is gone: connection exceptions (class 08) and the
# server shutting the backend down (admin / crash / cannot connect now).
_LOST_SQLSTATES = ("57P01", "57P02", "57P03")


class PostgresConnection:
    """How :class:`AsyncPostgresSaver` runs a function on a cursor (``_run``)."""

    conn: Conn
    pipe: AsyncPipeline | None
    lock: asyncio.Lock
    supports_pipeline: bool
    # the connection ``from_conn_string`` opened (reopened after a restart), else None
    _owned: OwnedConnection | None = None
    # outcomes the database could not take yet: written before the next statement
    _held: HeldOutcomes | None = None
    # when a pooled connection was last found lost (time.monotonic), 0.0: never
    _pool_lost_at: float = 0.0
    # until when the pool is taken for empty (it had no connection within BRIDGE_WAIT)
    _pool_dry_until: float = 0.0

    if TYPE_CHECKING:
        is_setup: bool

        async def setup(self) -> None: ...

        async def _write_held(self, held: list[Held]) -> None: ...

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for one call: the pool's next one, or ours under the lock."""
        conn = self.conn
        if isinstance(conn, AsyncConnectionPool):
            if self._pool_lost_at and time.monotonic() - self._pool_lost_at < BRIDGE_SECONDS:
                async with self._bridged(conn) as bridged:
                    yield bridged
                return
            async with conn.connection() as pooled:
                yield pooled
            return
        async with self.lock:
            if self.conn.closed and self._owned is not None:  # lost, and ours: a new one
                conn, self.pipe = await self._owned.reopen()
                self.conn = conn
            if conn.closed:
                raise ConnectionClosedError(
                    "the PostgreSQL connection is closed; open a new connection and create "
                    "a new saver (e.g. `async with AsyncPostgresSaver.from_conn_string(dsn)"
                    "`), or pass an AsyncConnectionPool, which replaces lost connections"
                )
            yield conn

    @asynccontextmanager
    async def _bridged(self, pool: AsyncConnectionPool[Any]) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection soon after the pool lost its own: the pool's, if it has one within
        ``BRIDGE_WAIT``, else one of our own for this call. psycopg_pool replaces lost
        connections with growing pauses (1 s, 2, 4, 8...), so after a server restart it
        can stay empty for as long again as the server was down; the saver's calls meanwhile
        run on connections it opens with the pool's settings, and closes after the call.
        After a wait in vain, the calls of the next ``BRIDGE_DRY_SECONDS`` barely wait."""
        dry = time.monotonic() < self._pool_dry_until  # it just had none: barely wait
        try:
            pooled = await pool.getconn(timeout=0.02 if dry else BRIDGE_WAIT)
        except PoolTimeout:
            if not dry:
                self._pool_dry_until = time.monotonic() + BRIDGE_DRY_SECONDS
        else:
            try:
                yield pooled
            finally:
                await pool.putconn(pooled)
            return
        try:
            conninfo, kwargs = await _resolved(pool.conninfo), await _resolved(pool.kwargs)
            own = await AsyncConnection.connect(conninfo, **(kwargs or {}))
        except psycopg.OperationalError as exc:  # the server still down
            raise ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}") from exc
        async with own:
            yield own

    async def _execute(
        self,
        fn: Callable[[Cursor], Awaitable[T]],
        *,
        tx: bool = False,
        pipeline: bool = False,
        ledger: bool = False,
    ) -> T:
        """Run ``fn`` on a cursor of a connection: atomically, with typed errors.

        A single statement on an autocommit connection is atomic by itself; ``tx=True``
        (or a non-autocommit connection) wraps ``fn`` in a transaction committed before
        returning. ``pipeline=True`` sends all of ``fn``'s statements in one round trip
        where libpq supports pipeline mode.

        It runs in the caller's task. LangGraph cancels sibling tasks when one fails or
        interrupts; psycopg (3.2 and later, our floor) answers a cancellation that lands
        mid-statement by cancelling the statement on the server and waiting for it to
        end, so the connection - ours, shared under the lock, or the pool's - stays
        usable, and a cancelled write is rolled back like any failed one. A task of its
        own behind ``asyncio.shield`` for every call would cost two or three event-loop
        iterations a call (measured: ~15-25 µs a call, and the 20-superstep graph 5-10%
        slower, LangGraph's own tasks waiting behind them). The writes that must land
        even when their caller is cancelled are shielded where they are made: a step's
        outcomes run in the group commit's own task, and the lease end of a call
        cancelled mid-run is shielded by the engine (``LedgerEngine.acancelled``).

        A second cancellation while psycopg is cancelling the statement leaves the
        connection mid-command, unusable: it is closed (psycopg 3.3 does it itself), so
        the calls after it get :class:`ConnectionClosedError` on a single connection,
        and a pool replaces it. The one trade against a task of its own per call, which
        kept a shared connection through any number of cancellations.
        """
        used: AsyncConnection[Any] | None = None
        try:
            async with self._connection() as conn:
                used = conn
                if ledger and conn is self.conn and self._owned is None:
                    _refuse_users_transaction(conn)
                if pipeline and self.pipe is None and self.supports_pipeline:
                    async with conn.pipeline():
                        result = await _in_transaction(conn, fn, tx)
                else:
                    result = await _in_transaction(conn, fn, tx)
                if self.pipe is not None:
                    await self.pipe.sync()
                return result
        except (psycopg.Error, PoolClosed, UnicodeEncodeError) as exc:
            error = self._typed_error(exc, used)
            if error is None:
                raise
            # a connection lost; not a pool that had none to give (all in use, or closed):
            # that lost nothing, and bridging it would open connections past its max_size
            if isinstance(error, ConnectionClosedError) and not isinstance(
                exc, (PoolTimeout, PoolClosed)
            ):
                await self._discard_dead_connections()
            raise error from exc
        except BaseException:  # a cancellation (or any other exit) amid a command
            if used is not None and _mid_command(used):
                used.pgconn.finish()
            raise

    async def _run(
        self,
        fn: Callable[[Cursor], Awaitable[T]],
        *,
        tx: bool = False,
        pipeline: bool = False,
        ledger: bool = False,
    ) -> T:
        """``_execute`` once set up; ``ledger=True``: a ledger write, refused inside a
        transaction of the user's (see ``_refuse_users_transaction``)."""
        if not self.is_setup:  # a coroutine less on every call of a set-up saver
            await self.setup()
        if self._held:  # outcomes the database could not take: before anything else
            await self._held.write(self._write_held)
        return await self._execute(fn, tx=tx, pipeline=pipeline, ledger=ledger)

    async def _write_held_at_close(self) -> None:
        """The last chance of the outcomes this saver holds (its owned connection is about
        to close): written now, or - the database still unreachable - given up
        (``held_outcomes.give_up``: this process reads their calls as unknown at once)."""
        held = self._held
        if not held:
            return
        try:
            await held.write(self._write_held)
        except Exception:
            held.give_up()

    def _users_transaction_open(self) -> bool:
        """Whether a transaction of the user's is open on the user's own connection (the
        one the saver was given, not a pool's nor one ``from_conn_string`` owns)."""
        conn = self.conn
        return (
            isinstance(conn, AsyncConnection)
            and self._owned is None
            and conn.info.transaction_status in _USERS_TX
        )

    def _reconnects(self) -> bool:
        """Whether a lost connection is replaced by the next call: an open pool's, or the
        one ``from_conn_string`` owns (a user's single connection is not ours to replace)."""
        conn = self.conn
        if isinstance(conn, AsyncConnectionPool):
            return not conn.closed
        return self._owned is not None

    async def _run_steps(self, steps: Steps[T], *, tx: bool = False) -> T:
        """``_run`` of a :data:`Steps` body (what the sync saver's loop path runs too)."""
        return await self._run(functools.partial(arun_steps, steps), tx=tx)

    async def _read_steps(self, make_steps: Callable[[], Steps[T]]) -> T:
        """``_run_steps`` for a read, retried once on a fresh pooled connection.

        A server restart or ``pg_terminate_backend`` kills every pooled connection, but
        the pool's health check can still find an idle one alive if its backend has not
        exited yet. A read changes nothing, so running it again is always safe; a write is
        never retried here (its outcome is unknown: the error says so).
        """
        return await self._again_on_lost(make_steps)

    async def _write_steps(self, make_steps: Callable[[], Steps[T]]) -> T:
        """``_run_steps`` for a checkpoint write, run once more on a fresh connection when
        its connection was lost. The write is an upsert of the same rows (a checkpoint, its
        blobs, a task's writes: ``ON CONFLICT ... DO UPDATE`` with the same values), so
        running it again stores what running it once does, whether or not the first
        attempt committed: a run whose writes landed is not reported failed for an answer
        lost in transit."""
        return await self._again_on_lost(make_steps)

    async def _again_on_lost(self, make_steps: Callable[[], Steps[T]]) -> T:
        try:
            return await self._run_steps(make_steps())
        except ConnectionClosedError as exc:
            # not a pool that had no connection to give: nothing was lost in transit
            never_had = isinstance(exc.__cause__, (PoolTimeout, PoolClosed))
            if never_had or not self._reconnects():
                raise
            return await self._run_steps(make_steps())

    def _typed_error(
        self, exc: BaseException, conn: BaseConnection[Any] | None
    ) -> Exception | None:
        """The package's exception for a psycopg/pool error, or None to re-raise it; the
        same for the async connection (or pool) and for the sync one of the direct path
        (``conn``: the connection the call used, if it got one)."""
        pooled = isinstance(self.conn, AsyncConnectionPool)
        if isinstance(exc, UnicodeEncodeError):  # psycopg encoding a parameter, before sending
            return unencodable_text(exc)
        if isinstance(exc, PoolTimeout):  # the server down (or the pool exhausted) so long
            return ConnectionClosedError(
                f"no PostgreSQL connection within the pool's timeout ({exc}); retry the "
                "call once the server is reachable"
            )
        if isinstance(exc, PoolClosed):
            return ConnectionClosedError(
                f"the connection pool is closed ({exc}); open it (`pool.open()`, `await "
                "pool.open()`, or `with pool:`) before using the saver"
            )
        sqlstate = getattr(exc, "sqlstate", None) or ""
        lost = (
            sqlstate.startswith("08")
            or sqlstate in _LOST_SQLSTATES
            or (conn is not None and (conn.closed or conn.broken))
            or (isinstance(exc, psycopg.OperationalError) and "connection is closed" in str(exc))
        )
        if lost:
            if pooled:
                hint = (
                    "the pool discards the dead connection: retry the call (the outcome "
                    "of a write in flight is unknown until you read it back)"
                )
            elif self._owned is not None:
                hint = (
                    "the saver opens a new connection at its next call: retry the call (the "
                    "outcome of a write in flight is unknown until you read it back)"
                )
            else:
                hint = (
                    "open a new connection and create a new saver (e.g. `async with "
                    "AsyncPostgresSaver.from_conn_string(dsn)`), or pass an "
                    "AsyncConnectionPool, which replaces lost connections"
                )
            return ConnectionClosedError(f"the PostgreSQL connection was lost ({exc}); {hint}")
        # a lock, a conflict, a timeout; on the user's own AsyncConnection (read before
        # any other task could use it: no await since the call failed), inside their
        # transaction or not
        inside = conn is not None and conn is self.conn and self._users_transaction_open()
        contention = contention_error(exc, sqlstate, in_users_transaction=inside)
        if contention is not None:
            return contention
        if sqlstate == "25P02":  # in_failed_sql_transaction: a transaction of the user's
            return ConfigError(
                f"a transaction of yours on the saver's connection has failed ({exc}); roll "
                "it back before using the saver (nothing of this call was written)"
            )
        if sqlstate == "25006":  # read_only_sql_transaction
            where = f"database {conn.info.dbname!r}" if conn is not None else "the database"
            return ReadOnlyDatabaseError(
                f"PostgreSQL refused a write to {where}: {exc} (a read-only session - "
                "default_transaction_read_only - or a hot standby); nothing was written"
            )
        if sqlstate == "53100":  # disk_full
            return StorageFullError(
                f"PostgreSQL could not write: its disk is full ({exc}); nothing of this call "
                "was written, retry once there is room"
            )
        if sqlstate == "54000":  # program_limit_exceeded: e.g. an id too long to index
            return ConfigError(
                f"a value is too large for PostgreSQL to index ({exc}); use a shorter thread "
                "id / namespace / key (nothing was written)"
            )
        # a NUL in a text parameter (psycopg refuses it: "NUL (0x00)"; the server: 22021
        # "... 0x00"), or as \u0000 in a JSON one (22P05); not any message saying "NULL"
        if sqlstate == "22P05" or _nul_text(exc, sqlstate):
            return SerializationError(
                f"PostgreSQL text cannot hold NUL (\\x00) characters: {exc}; nothing was written"
            )
        return None

    async def _discard_dead_connections(self) -> None:
        """After a lost connection, make the pool drop its other dead idle connections
        (a server restart or ``pg_terminate_backend`` kills them all), so the next call
        gets a live one."""
        if isinstance(self.conn, AsyncConnectionPool):
            self._pool_lost_at = time.monotonic()  # bridged for a while (_bridged)
            # the pool closing or the server being down leaves nothing to do here
            with contextlib.suppress(Exception):
                await self.conn.check()


def _nul_text(exc: BaseException, sqlstate: str) -> bool:
    """Whether ``exc`` is a NUL character in text, as psycopg or the server reports it."""
    if not isinstance(exc, psycopg.DataError):
        return False
    msg = str(exc)
    return "NUL (0x00)" in msg or (sqlstate == "22021" and "0x00" in msg)


async def _resolved(value: T | Callable[[], T] | Callable[[], Awaitable[T]]) -> T:
    """A pool setting as psycopg_pool takes it: a value, or a (sync or async) function."""
    if not callable(value):
        return value
    found = value()
    return await found if inspect.isawaitable(found) else found


def _mid_command(conn: BaseConnection[Any]) -> bool:
    """Whether ``conn`` was left in the middle of a command (its result never read), so
    that no statement can be sent on it again. Not in pipeline mode, where commands in
    flight between two syncs are the normal state."""
    pgconn = conn.pgconn
    return bool(
        pgconn.transaction_status == pq.TransactionStatus.ACTIVE
        and pgconn.pipeline_status == pq.PipelineStatus.OFF
    )


# a transaction open on the connection, healthy or failed
_USERS_TX = (pq.TransactionStatus.INTRANS, pq.TransactionStatus.INERROR)


def _refuse_users_transaction(conn: AsyncConnection[Any]) -> None:
    """A ledger write on the user's own connection while a transaction of the user's is
    open: ours would be a savepoint of it (or join it), not committed before the tool
    runs and gone with a rollback. Refused, nothing sent - as the sync saver does."""
    status = conn.info.transaction_status
    if status in _USERS_TX:
        raise ConfigError(
            "the psycopg connection given to AsyncPostgresSaver has a transaction of yours "
            f"open ({status.name}); the ledger commits each call before a tool runs, so it "
            "cannot run inside it: commit or roll back first (autocommit or not), or give "
            "the saver a connection or pool of its own"
        )


async def _in_transaction(
    conn: AsyncConnection[Any], fn: Callable[[Cursor], Awaitable[T]], tx: bool
) -> T:
    if tx or not conn.autocommit:
        async with (
            conn.transaction(),
            conn.cursor(row_factory=tuple_row, binary=True) as cur,
        ):
            return await fn(cur)
    async with conn.cursor(row_factory=tuple_row, binary=True) as cur:
        return await fn(cur)


async def _schema_version(cur: Cursor) -> int:
    """The schema version the database holds (-1: none)."""
    await cur.execute(sql.SELECT_MIGRATIONS_TABLE)
    row = await cur.fetchone()
    if row is None or not row[0]:
        return -1
    await cur.execute(sql.SELECT_SCHEMA_VERSION)
    version_row = await cur.fetchone()
    return -1 if version_row is None or version_row[0] is None else int(version_row[0])


async def migrate_unless_current(cur: Cursor) -> None:
    """:func:`migrate`, without taking its lock when the schema is already current. For
    ``setup()`` inside a transaction of the user's: the transaction-scoped lock would be
    held until the user ends it, and every other saver's ``setup()`` would wait."""
    if await _schema_version(cur) != sql.SCHEMA_VERSION:
        await migrate(cur)


async def migrate(cur: Cursor) -> None:
    """Bring the schema up to date; the caller runs this in one transaction."""
    await cur.execute(sql.TAKE_MIGRATION_LOCK, (sql.MIGRATION_LOCK_KEY,))
    found = await _schema_version(cur)
    if found > sql.SCHEMA_VERSION:
        raise SchemaVersionError(found, sql.SCHEMA_VERSION, "this PostgreSQL database")
    for version in range(found + 1, len(sql.MIGRATIONS)):
        for statement in sql.MIGRATIONS[version]:
            await cur.execute(statement, prepare=False)
        await cur.execute(sql.INSERT_MIGRATION, (version,), prepare=False)


def connect_error(exc: psycopg.Error, conn_string: str) -> Exception:
    """Why connecting to ``conn_string`` failed: :class:`ConnectionClosedError` when the
    server cannot be reached, :class:`ConfigError` when the DSN itself is malformed
    (``ProgrammingError``; then raise it ``from None``: libpq may quote the whole DSN
    back, password included, and the message never repeats it)."""
    if isinstance(exc, psycopg.ProgrammingError):
        why = str(exc).replace(conn_string, "<the connection string>").strip()
        return ConfigError(f"bad PostgreSQL connection string: {why}")
    return ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}")
