"""Running a saver's work on SQLite: ``setup()`` (pragmas, migrations, refusals that name
the file), one worker hand-off per call, transactions, the group commit of writes, and
typed errors (mixed into :class:`AsyncSqliteSaver`).

Kept apart from the checkpoint methods so that every function run on the connection goes
through one place that commits, syncs and types its errors.

**The connection lock.** Every function runs holding the saver's :class:`ConnectionLock`:
on the aiosqlite worker (``_call``, the async path) and on the caller's own thread
(``_call_here``/``_write_here``, the direct path of the sync ``SqliteSaver``, which skips
the hops to the loop and the worker). One function at a time uses the ``sqlite3``
connection, so transactions never interleave whichever thread runs them. Nothing holding
the lock waits for a loop or another thread, so a caller waiting for it never deadlocks:
it waits for the function in progress, then runs.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal, NoReturn, TypeVar

from langgraph_idem_saver.errors import (
    ConnectionClosedError,
    CorruptRecordError,
    DatabaseLockedError,
    IdemSaverError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
    StorageFullError,
    unencodable_text,
)
from langgraph_idem_saver.sqlite import runner, sql
from langgraph_idem_saver.sqlite.files import (
    SqliteTarget,
    error_kind,
    open_error,
    read_only_error,
    read_only_reason,
    target_of_connection,
)

if TYPE_CHECKING:
    import aiosqlite

    from langgraph_idem_saver.group_commit import GroupCommit

T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "EXTRA"]
# how a write must reach the disk (see SqliteConnection._write): a claim is synced
# whatever the setting, an outcome is not synced by its own commit, the rest follow it
OUTCOME, AS_SET, CLAIM = 0, 1, 2
# a write for the group commit: its body, one of the three levels above, and whether the
# body is one statement (atomic alone: no savepoint needed when it shares a transaction)
Write = tuple[Callable[[sqlite3.Connection], Any], int, bool]
# the setting a transaction is committed with instead of the connection's, by (the
# connection's setting, the highest level among the transaction's writes)
_SWITCH: dict[tuple[str, int], str] = {("NORMAL", CLAIM): "FULL", ("FULL", OUTCOME): "NORMAL"}


def write_tx(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body`` in one ``BEGIN IMMEDIATE`` transaction and commit it.

    IMMEDIATE takes the write lock up front, so a busy database waits in
    ``busy_timeout`` instead of failing later on a lock upgrade.
    """
    if not conn.in_transaction:
        conn.execute("BEGIN IMMEDIATE")
    try:
        result = body(conn)
        conn.commit()
    except BaseException:
        if conn.in_transaction:
            conn.rollback()
        raise
    return result


def read_tx(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body``'s SELECTs in one read transaction: a consistent snapshot."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        return body(conn)
    finally:
        if own and conn.in_transaction:
            conn.commit()


class ConnectionLock:
    """The connection lock (see the module docstring), shared by a saver and its
    ``with_allowlist`` copies; ``direct_closed`` once the direct path is shut (set under
    the lock: when :meth:`close_direct` returns, no direct call runs and none will)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.direct_closed = False

    def close_direct(self) -> None:
        """Wait for a direct call in progress, then refuse every later one."""
        with self.lock:
            self.direct_closed = True

    def holding(self, fn: Callable[[sqlite3.Connection], T]) -> Callable[[sqlite3.Connection], T]:
        """``fn`` run holding the lock (what the worker runs)."""
        lock = self.lock

        def run(conn: sqlite3.Connection) -> T:
            with lock:
                return fn(conn)

        return run


class SqliteConnection:
    """How :class:`AsyncSqliteSaver` runs a function on its connection (``_run``,
    ``_write``; ``_call_here``, ``_write_here`` from the caller's thread)."""

    conn: aiosqlite.Connection
    synchronous: Synchronous
    busy_timeout: float
    _target: SqliteTarget | None
    _conn_lock: ConnectionLock

    if TYPE_CHECKING:
        _group: GroupCommit[Write, tuple[bool, Any]]

        is_setup: bool

        async def setup(self) -> None: ...

    async def _setup_once(self) -> None:
        """Configure the connection and apply pending migrations (``setup()``).

        Refuses (``SchemaVersionError``) a database written by a newer release,
        (``NotADatabaseError``) a file that is not SQLite, (``ConfigError``) a path in a
        missing directory or naming a directory, and (``ReadOnlyDatabaseError``) a
        database this process cannot write - unless the connection was opened read-only
        on purpose (``mode=ro``/``immutable=1``): then reads work and each write raises it.
        """
        if self._target is None:
            self._target = target_of_connection(self.conn)
        if not runner.is_started(self.conn):
            if runner.was_closed(self.conn):
                raise ConnectionClosedError(
                    "the aiosqlite connection was closed before the saver used it; open a new one"
                )
            try:
                await self.conn
            except sqlite3.Error as exc:
                # aiosqlite stops its worker thread without waiting: wait here, or it
                # may report to a loop that has closed by then
                thread = runner.worker_thread(self.conn)
                if thread is not None and thread.is_alive():
                    thread.join(1.0)
                raise open_error(self._target, exc) from exc
        await self._call(self._setup_sync)

    def _setup_sync(self, conn: sqlite3.Connection) -> None:
        target = self._target or SqliteTarget(None, None)
        # before the first read, which may create -wal/-shm files beside the database
        if target.read_only is False and read_only_reason(target):
            raise read_only_error(target, at_open=True)
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self.busy_timeout * 1000)}")
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            main = [row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"]
        except sqlite3.DatabaseError as exc:
            raise open_error(target, exc) from exc
        if main and main[0]:
            self._target = target = SqliteTarget(main[0], target.read_only)
        if str(mode).lower() not in ("wal", "memory") and not target.read_only:
            try:
                conn.execute("PRAGMA journal_mode = WAL")
            except sqlite3.OperationalError as exc:
                # a connection that cannot write cannot switch to WAL; it may still
                # read, unless it was meant to write
                if error_kind(exc) != "readonly" or target.read_only is False:
                    raise
        conn.execute(f"PRAGMA synchronous = {self.synchronous}")

        def schema_version(c: sqlite3.Connection) -> int:
            if not c.execute(sql.SELECT_MIGRATIONS_TABLE).fetchone():
                return -1
            row = c.execute(sql.SELECT_SCHEMA_VERSION).fetchone()
            found = -1 if row[0] is None else int(row[0])
            if found > sql.SCHEMA_VERSION:
                raise SchemaVersionError(found, sql.SCHEMA_VERSION, f"SQLite database {where}")
            return found

        def migrate(c: sqlite3.Connection) -> None:
            for version in range(schema_version(c) + 1, len(sql.MIGRATIONS)):
                for statement in sql.MIGRATIONS[version].split(";"):
                    if statement.strip():
                        c.execute(statement)
                c.execute(sql.INSERT_MIGRATION, (version,))

        where = target.shown
        # a current database is only read: opening a saver must not need the write lock
        # (another process may hold it for a while); migrations take it and re-check
        found = read_tx(conn, schema_version)
        if found < sql.SCHEMA_VERSION:
            try:
                write_tx(conn, migrate)
            except sqlite3.OperationalError as exc:
                if error_kind(exc) != "readonly":
                    raise
                why = read_only_reason(target) or f"SQLite refused the write ({exc})"
                raise ReadOnlyDatabaseError(
                    f"SQLite database {where} is at schema version {found} and this release "
                    f"needs {sql.SCHEMA_VERSION}; upgrading it is a write, and {why}. Open it "
                    "read-write once (e.g. with the application) to upgrade it; nothing was "
                    "written",
                    path=target.path,
                ) from exc

    async def _call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Ship ``fn`` to the aiosqlite worker thread: one hand-off, typed errors; ``fn``
        runs there holding the connection lock."""
        conn = self.conn
        if not runner.is_started(conn):
            raise _not_started()
        try:
            return await runner.run_in_worker(conn, self._conn_lock.holding(fn))
        except (ValueError, sqlite3.Error) as exc:
            self._raise_typed(exc)

    def _call_here(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``fn`` on the ``sqlite3`` connection from the calling thread, holding the
        connection lock: no hand-off, the same typed errors as ``_call``.

        Only for a saver that is set up, over a connection opened with
        ``check_same_thread=False`` (the sync ``SqliteSaver`` makes sure of both).
        """
        gate = self._conn_lock
        with gate.lock:
            if gate.direct_closed:
                raise _direct_closed()
            if not runner.is_open(self.conn):  # the worker itself is not needed here
                raise _not_started()
            try:
                return fn(runner.raw_connection(self.conn))
            except (ValueError, sqlite3.Error) as exc:
                self._raise_typed(exc)

    def _raise_typed(self, exc: ValueError | sqlite3.Error) -> NoReturn:
        """Raise the package's exception for ``exc`` (from it), or ``exc`` itself."""
        if not isinstance(exc, IdemSaverError):
            typed = typed_error(exc, self.busy_timeout, self._target)
            if typed is not exc:
                raise typed from exc
        raise exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if not self.is_setup:  # a coroutine less on every read of a set-up saver
            await self.setup()
        return await self._call(fn)

    async def _write(
        self,
        body: Callable[[sqlite3.Connection], T],
        *,
        before_tool_runs: bool = False,
        outcome: bool = False,
        one_statement: bool = False,
    ) -> T:
        """Run ``body`` in a write transaction, committed before this returns.

        Writes that arrive while another is being committed are **group-committed**: one
        worker hand-off, one transaction and one fsync for all of them, each body in its
        own SAVEPOINT so a failing one is rolled back alone - or none, for a body that is
        ``one_statement`` (SQLite undoes a failing statement by itself). The parallel
        tool tasks of a step (``create_react_agent`` v2 sends one task per call) then
        share their claims' commit, the outcomes of calls that finish together share
        theirs (an ``UPDATE`` each), and checkpoint writes share theirs.

        A transaction holding a claim (``before_tool_runs``: the ``issued`` row that lets
        a tool run, first or again) is committed with at least ``synchronous=FULL``
        whatever the setting: at-most-once rests on that row surviving power loss.

        A transaction of outcomes alone (``outcome``: ``completed``/``failed`` rows) is
        committed with ``synchronous=NORMAL`` under ``FULL``: atomic, and safe from a
        process crash at once, it reaches the disk with the next synced commit - in WAL
        mode a synced commit makes every earlier one durable - which is the step's own
        checkpoint write, right after the node returns. A power cut before that loses the
        step's writes too (LangGraph runs the step again) and leaves the call ``issued``:
        an unknown outcome, verified, never silently re-run. Its fsync (0.1-0.25 ms on
        this disk) was a quarter of a lone call's ledger. ``EXTRA`` syncs every commit,
        outcomes included.
        Other writes follow the setting.
        """
        if not self.is_setup:  # a coroutine less on every write of a set-up saver
            await self.setup()
        level = CLAIM if before_tool_runs else OUTCOME if outcome else AS_SET
        ok, value = await self._group.submit((body, level, one_statement))
        return self._written(ok, value)  # type: ignore[no-any-return]  # T: body's

    def _write_here(self, body: Callable[[sqlite3.Connection], T]) -> T:
        """``_write`` from the calling thread (``_call_here``): ``body`` alone in its
        transaction, committed before this returns. Concurrent callers take turns on the
        connection lock, each with its own commit (no group commit: nothing waits on a
        loop to gather them). Not for claims: those go through ``_write``.

        Alone in its transaction, ``body`` needs none of the group commit's bookkeeping
        (``_commit_body``: no savepoint, no switch of ``synchronous``): a failure rolls
        the transaction back and is raised typed, as ``_write`` raises it.

        ``_call_here`` written out (no closure, one frame less): every ``put`` and
        ``put_writes`` of a sync ``graph.invoke`` comes through here."""
        gate = self._conn_lock
        with gate.lock:
            if gate.direct_closed:
                raise _direct_closed()
            conn = self.conn
            if not runner.is_open(conn):
                raise _not_started()
            try:
                return write_tx(runner.raw_connection(conn), body)
            except (ValueError, sqlite3.Error) as exc:
                self._raise_typed(exc)

    def _written(self, ok: bool, value: Any) -> Any:
        """A write's result as ``_commit`` reported it: the value, or its error raised."""
        if ok:
            return value
        if isinstance(value, (ValueError, sqlite3.Error)):
            self._raise_typed(value)
        raise value

    async def _commit(self, batch: list[Write]) -> list[tuple[bool, Any]]:
        """One transaction for a group of writes, on the worker (``_commit_body``)."""
        return await self._call(self._commit_body(batch))

    def _commit_body(
        self, batch: list[Write]
    ) -> Callable[[sqlite3.Connection], list[tuple[bool, Any]]]:
        """One transaction for a group of writes: per write, (True, its result) or
        (False, its exception), each rolled back alone (a savepoint each when several)."""
        switch = _SWITCH.get((self.synchronous, max(level for _, level, _ in batch)))

        def run(conn: sqlite3.Connection) -> list[tuple[bool, Any]]:
            if switch:
                conn.execute(f"PRAGMA synchronous = {switch}")
            try:
                if len(batch) == 1:  # alone in its transaction: no savepoint needed
                    return write_tx(conn, lambda c: [alone(c, batch[0][0])])
                return write_tx(conn, lambda c: [in_batch(c, b, one) for b, _, one in batch])
            finally:
                if switch:
                    conn.execute(f"PRAGMA synchronous = {self.synchronous}")

        return run


def alone(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> tuple[bool, Any]:
    """Run the only body of a transaction: its failure rolls back the transaction (two
    statements fewer than a savepoint, on every sequential write)."""
    try:
        return True, body(conn)
    except Exception as exc:
        conn.rollback()
        return False, exc


def in_batch(
    conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T], one_statement: bool
) -> tuple[bool, Any]:
    """Run one body of a group commit; its failure rolls back only its own statements.

    A ``one_statement`` body needs no savepoint (two statements fewer): SQLite undoes a
    failing statement alone. If the failure ended the whole transaction instead (a full
    disk, an I/O error), it is raised: every write of the batch then fails with it."""
    if not one_statement:
        return in_savepoint(conn, body)
    try:
        return True, body(conn)
    except Exception as exc:
        if not conn.in_transaction:
            raise
        return False, exc


def in_savepoint(
    conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]
) -> tuple[bool, Any]:
    """Run one body of a group commit; its failure rolls back only its own statements,
    or, when it ended the whole transaction (a full disk), fails every write with it."""
    conn.execute("SAVEPOINT idem_write")
    try:
        result = body(conn)
    except Exception as exc:
        if not conn.in_transaction:
            raise
        conn.execute("ROLLBACK TO idem_write")
        conn.execute("RELEASE idem_write")
        return False, exc
    conn.execute("RELEASE idem_write")
    return True, result


def _direct_closed() -> ConnectionClosedError:
    return ConnectionClosedError(
        "the saver is closed (close() was called or its `with` block ended); open a new one"
    )


def _not_started() -> ConnectionClosedError:
    return ConnectionClosedError(
        "the aiosqlite connection is closed (or was never opened); open a new one "
        "and create a new saver, e.g. `async with AsyncSqliteSaver.from_conn_string(...)`"
    )


def typed_error(
    exc: ValueError | sqlite3.Error, busy_timeout: float, target: SqliteTarget | None = None
) -> Exception:
    """The package's exception for an aiosqlite/sqlite3 failure (the original otherwise);
    ``target`` names the database in the message."""
    msg = str(exc)
    if isinstance(exc, UnicodeEncodeError):  # sqlite3 encoding a parameter
        return unencodable_text(exc)
    if isinstance(exc, ValueError):
        if "closed" in msg or "no active connection" in msg:
            return ConnectionClosedError(f"the aiosqlite connection is closed: {msg}")
        return exc
    if isinstance(exc, sqlite3.ProgrammingError) and "closed" in msg:
        return ConnectionClosedError(f"the SQLite connection is closed: {msg}")
    if isinstance(exc, sqlite3.OperationalError) and ("locked" in msg or "busy" in msg):
        return DatabaseLockedError(
            f"the SQLite database stayed locked by another writer for more than "
            f"busy_timeout={busy_timeout}s ({msg}); nothing was written, retry"
        )
    if not isinstance(exc, sqlite3.DatabaseError):
        return exc
    target = target or SqliteTarget(None, None)
    if isinstance(exc, sqlite3.OperationalError) and "malformed JSON" in msg:
        # a JSON column edited by hand, read by SQL (the reads check the columns they
        # hand SQLite first and name the row): the file itself is fine
        return CorruptRecordError(
            "JSON column", location={"database": target.path or ""}, cause=exc
        )
    kind = error_kind(exc)
    if kind == "readonly":
        return read_only_error(target, exc)
    if kind == "notadb":
        where = f" {target.path}" if target.path else ""
        return NotADatabaseError(f"the SQLite file{where} is not a usable database: {msg}")
    if kind == "full":
        where = f" {target.path}" if target.path else ""
        return StorageFullError(
            f"the SQLite database{where} cannot grow ({msg}: its disk is full, or it "
            "reached its max_page_count); nothing of this call was written, retry once "
            "there is room"
        )
    if kind == "cantopen" and target.path is not None:
        # a file beside the database (-journal, -wal) could not be created or opened
        return read_only_error(target, exc) if read_only_reason(target) else open_error(target, exc)
    return exc
