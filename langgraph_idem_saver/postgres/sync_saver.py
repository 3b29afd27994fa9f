"""``PostgresSaver``: the synchronous drop-in for ``langgraph.checkpoint.postgres.PostgresSaver``.

For programs without an event loop (``graph.invoke`` / ``graph.stream``): the same name,
constructor ``(conn, pipe=None, serde=None)`` over a psycopg 3 ``Connection`` or
``ConnectionPool``, ``from_conn_string(dsn, *, pipeline=False)`` (a context manager) and
``setup()`` as LangGraph's, with the tool-call ledger.

**Design: the async saver on a private loop, not a second implementation.** A
``PostgresSaver`` owns an event loop in a daemon thread and an
:class:`AsyncPostgresSaver` on it (see :mod:`langgraph_idem_saver.sync_bridge` for why).
So the schema is the async saver's by construction: a database written by
``AsyncPostgresSaver`` is continued by ``PostgresSaver`` and vice versa, ledger included,
and every capability (one-statement reads, compression, list deltas, advisory-locked
migrations, typed errors, ``prune``, ``copy_thread``, the ledger) is the same code.

**The direct path.** What ``graph.invoke`` calls on every step - ``get_tuple``, ``put``,
``put_writes`` and ``list`` - does not go through the loop: once the saver is set up,
each runs on the caller's thread over *your* sync connection, as LangGraph's
``PostgresSaver`` does: a ``Connection`` one call at a time under a ``threading.Lock``, a
``ConnectionPool`` one pooled connection per call, concurrently. What runs is the async
saver's own statements and decoding (a ``Steps`` body, ``postgres/connection.py``; only
the execute differs), on a ``tuple_row`` binary cursor whatever your row factory
(``dict_row`` as LangGraph asks, or any other), with the same typed errors (a closed or
lost connection, or a closed pool: :class:`ConnectionClosedError`; a read-only session:
:class:`ReadOnlyDatabaseError`; ...). On a non-autocommit connection each call runs in
its own transaction, committed before it returns (don't leave a transaction of yours
open on it - nor a ``conn.transaction()`` block on an autocommit one: the checkpoint
calls' statements would join it, as LangGraph's do; what runs on the loop - the ledger,
``setup()``, maintenance - refuses to, with :class:`ConfigError`, since a claim must be
committed before its tool runs). The hop
to the loop and back cost hundreds of microseconds per call, more than a read's SQL.

``get_delta_channel_history`` (what loading a thread with a ``DeltaChannel`` reads) runs
there too. The rest - the ledger (which the engine drives on the loop), ``setup()`` (the
first call of a saver not set up yet takes the loop, setting up first), ``prune``,
``copy_thread``, ``delete_thread``, ``sweep``, the ``a``-methods - runs on the loop, but
its statements run on your connection or pool too, borrowed for the call
(:mod:`langgraph_idem_saver.postgres.borrowed`): on your ``Connection`` under the same
lock as the direct path, one call at a time; on your ``ConnectionPool`` one pooled
connection per call, concurrently. The saver holds no session of its own and opens no
connection, so closing your connection or pool is enough for a ``DROP DATABASE``, as with
LangGraph's saver, even if the saver is never closed; and whatever your sessions carry -
``search_path``, ``prepare_threshold=None`` for pgbouncer, a pool's ``configure``
callback - applies to the ledger as to the checkpoints. ``keep_session=True`` is accepted
for compatibility and does nothing.

``from_conn_string(dsn)`` opens a sync ``Connection`` as LangGraph's does (autocommit,
``prepare_threshold=0``, ``dict_row``), which is then ``conn``, and the saver over it as
above, closed at the end of the ``with`` block.

**A pipeline keeps the loop path.** With ``pipe`` (``PostgresSaver(conn, pipe)``, or
``from_conn_string(..., pipeline=True)``) every call goes through an async connection of
the saver's own, kept until ``close()``, in pipeline mode; it connects with ``conn``'s
parameters (``conn.info.dsn`` and its password), ``autocommit``, ``prepare_threshold``
and current ``search_path`` (so set it on ``conn`` before making the saver). The direct
path would share your pipeline: in pipeline mode an error is reported at the next sync
point and aborts what else is queued until it, so a failing statement of ours would fail
statements of yours queued in the same pipeline (and one of yours would fail our call),
and each of our calls reads its rows at once anyway, forcing a sync - nothing for a
pipeline to batch.

Your connection or pool stays yours: ``close()`` (or the ``with`` block's end) waits,
within ``CLOSE_SECONDS``, for the calls whose statements are running (not for one still
waiting for a pooled connection: it gives up, having run nothing), closes what the saver
opened and never yours; every call after it raises :class:`ConnectionClosedError`. Closing
yours without closing the saver leaves nothing of the saver's open on the server (but the
pipelined connection's session, until the saver is closed or collected).

Threads: one saver may be shared by any number of threads; with a single connection calls
take turns (one connection runs one transaction at a time), with a pool they run
concurrently.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AsyncExitStack, contextmanager, nullcontext
from typing import Any, TypeVar

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, DeltaChannelHistory
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, Capabilities, Connection, Pipeline
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from langgraph_idem_saver.backend import CheckpointPut
from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.list_deltas import EncodedBlob
from langgraph_idem_saver.postgres.borrowed import BorrowedPostgresSaver
from langgraph_idem_saver.postgres.connection import Steps, connect_error, single
from langgraph_idem_saver.postgres.direct import DirectPath
from langgraph_idem_saver.postgres.inspect import PostgresSyncInspection
from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver
from langgraph_idem_saver.retention import SyncRetention, TTLConfig
from langgraph_idem_saver.saver_checkpoints import ListQuery, SyncCheckpointCalls, SyncPageReader
from langgraph_idem_saver.sync_bridge import SyncSaverBase

__all__ = ["PostgresSaver"]

T = TypeVar("T")


class PostgresSaver(
    SyncCheckpointCalls,
    SyncRetention,
    PostgresSyncInspection,
    SyncSaverBase[AsyncPostgresSaver],
):
    """Sync PostgreSQL checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a psycopg 3 ``Connection`` or ``ConnectionPool``: every call runs on it
            (with ``pipe``, its parameters open the saver's own async connection).
        pipe: a ``Pipeline`` of ``conn`` (single connection only), as LangGraph's saver
            accepts: the saver's async connection then runs in pipeline mode, and every
            call goes through it (no direct path).
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default.
        ttl: retention, applied by ``sweep()`` (see ``TTLConfig``).
        keep_session: accepted for compatibility, and does nothing: the ledger and
            maintenance run on ``conn`` itself, so there is no session of the saver's
            own to keep (``postgres/borrowed.py``).
    """

    conn: Connection[Any] | ConnectionPool[Any]
    saver: AsyncPostgresSaver
    pipe: Pipeline | None
    supports_pipeline: bool
    _direct_path: DirectPath | None

    def __init__(
        self,
        conn: Connection[Any] | ConnectionPool[Any],
        pipe: Pipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
        keep_session: bool = False,
    ) -> None:
        ttl = TTLConfig.of(ttl)
        del keep_session  # kept for compatibility: no session of the saver's to keep
        if isinstance(conn, ConnectionPool):
            if pipe is not None:
                raise ValueError(
                    "Pipeline should be used only with a single Connection, not ConnectionPool."
                )
        elif not isinstance(conn, Connection):
            raise TypeError(
                f"conn must be a psycopg Connection or ConnectionPool, got {type(conn).__name__}"
                " (for an AsyncConnection or AsyncConnectionPool use AsyncPostgresSaver)"
            )
        elif conn.closed:
            raise ConnectionClosedError(
                "the psycopg connection is closed; pass an open Connection (or a ConnectionPool)"
            )
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
        # a pipelined connection takes the loop path, on a session of its own (docstring)
        direct = self._direct_path = None if pipe is not None else DirectPath(conn)
        if direct is None:
            assert isinstance(conn, Connection)
            dsn, connect_args = _async_connection_args(conn)
            search_path = _search_path(conn)

        async def open_saver(stack: AsyncExitStack) -> AsyncPostgresSaver:
            if direct is None:
                aconn = await _connect(dsn, search_path, **connect_args)
                stack.push_async_callback(aconn.close)
                apipe = await stack.enter_async_context(aconn.pipeline())
                return AsyncPostgresSaver(aconn, apipe, serde=serde, ttl=ttl)
            # the ledger and maintenance on your connection or pool (postgres/borrowed.py)
            saver = BorrowedPostgresSaver(direct, serde=serde, ttl=ttl)
            stack.callback(saver.close_workers)
            # registered last, so closing ends the direct path (its calls) first
            stack.callback(direct.close)
            return saver

        self._start("PostgresSaver", open_saver)

    @classmethod
    @contextmanager
    def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> Iterator[PostgresSaver]:
        """Connect to ``conn_string`` for the block (autocommit, prepared statements, as
        LangGraph's does), set up; ``pipeline=True`` runs the connection in pipeline mode.
        ``conn`` is that sync connection, closed with the block. The saver's ``close()``
        keeps to :attr:`CLOSE_SECONDS`; closing this connection after it is psycopg's, and
        waits for a statement of it the server still holds back (another session's lock)."""
        ttl = TTLConfig.of(ttl)  # refused before connecting
        with _connect_sync(conn_string) as conn:
            pipe_cm = conn.pipeline() if pipeline else nullcontext()
            with pipe_cm as pipe, cls(conn, pipe, serde=serde, ttl=ttl) as saver:
                saver.setup()
                yield saver

    def close(self) -> None:
        """Stop the saver: from its first instant every call raises
        :class:`ConnectionClosedError`. Your connection or pool stays open. Idempotent.

        On the saver's loop, in order: the outcome rows a live sync step holds are
        committed; what the saver still holds (an outcome, or the undo of a claim, that
        the database refused or could not take and no later statement has written yet:
        ``held_writes.py``) gets its last chance - written now, or, if the database still
        refuses it (it waits for a connection up to your pool's ``timeout``), given up:
        this process then reads those calls as unknown outcomes at once; then the direct
        path stops, once the calls whose statements are running on your connection or
        pool are done (a call still *waiting for* a pooled connection is not waited for:
        it sees the close within ``direct.CLOSE_POLL_SECONDS`` and raises
        ``ConnectionClosedError``, having run nothing); then what the saver opened (a
        pipelined session) is closed and its loop thread stopped.

        All of it within ``CLOSE_SECONDS`` (``sync_closing.py``). A statement blocked on
        a lock (another session's row lock) is not cut short: the saver has nothing of
        its own to abandon on your connection, so past the bound ``close()`` raises
        :class:`~langgraph_idem_saver.errors.CloseTimeoutError`, and the close goes on
        in the background until the statement ends or fails (set ``lock_timeout`` /
        ``statement_timeout`` to bound it); an outcome not committed leaves its call
        ``issued``, an unknown outcome, never re-run."""
        super().close()

    async def _last_writes(self) -> None:
        """In :meth:`close`, on the loop: what the saver still holds, its last chance
        (written now, else given up: read as unknown at once by this process, never a
        live claim it would wait on); the direct path is still open for it."""
        if self.saver._held:
            await self.saver._write_held_at_close()

    def setup(self) -> None:
        """Create or migrate the tables (idempotent; also runs on first use), in one
        transaction under an advisory lock, as ``AsyncPostgresSaver.setup`` does."""
        self._call(self.saver.setup())

    # --- the direct path (see the module docstring) ------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        saver = self.saver
        statement = saver._tuple_statement(config)
        return saver._tuple_of(self._read_steps(lambda: single(statement)))

    # put, put_writes and list: SyncCheckpointCalls, over these

    def _direct_put(self, put: CheckpointPut) -> list[EncodedBlob]:
        saver = self.saver
        args = saver._put_args(put)  # encoded once, even if run twice
        return self._write_steps(lambda: saver._put_rounds(*args))

    def _direct_writes(self, rows: list[tuple[Any, ...]]) -> None:
        statement = self.saver._writes_statement(rows)
        self._write_steps(lambda: single(statement))

    def _direct_pages(self, query: ListQuery) -> SyncPageReader:
        page_steps = self.saver._list_page_steps(query)
        return lambda after, size: self._read_steps(lambda: page_steps(after, size))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        if not channels:
            return {}
        saver = self.saver
        return self._read_steps(lambda: saver._delta_history_steps(config, channels))

    def _read_steps(self, make_steps: Callable[[], Steps[T]]) -> T:
        """``_run_steps`` for a read, retried once on a fresh pooled connection (see
        ``AsyncPostgresSaver._read_steps``: a read is always safe to run again)."""
        return self._again_on_lost(make_steps)

    def _write_steps(self, make_steps: Callable[[], Steps[T]]) -> T:
        """``_run_steps`` for a checkpoint write, run once more on a fresh pooled
        connection when its connection was lost, as ``AsyncPostgresSaver._write_steps``
        does (an upsert of the same rows: running it again stores what running it once
        does). LangGraph writes a step's checkpoint in the background while the next step
        runs (``durability="async"``), so a write is what a lost connection most often
        meets; a run whose writes landed is not failed for an answer lost in transit."""
        return self._again_on_lost(make_steps)

    def _again_on_lost(self, make_steps: Callable[[], Steps[T]]) -> T:
        try:
            return self._run_steps(make_steps())
        except ConnectionClosedError as exc:
            # a connection lost under the call; not one never had (the pool's timeout
            # passed, or it is closed; or the saver closed while the call waited): that
            # lost nothing, and a second try would wait again, or say less
            direct = self._direct_path
            never_had = isinstance(exc.__cause__, (PoolTimeout, PoolClosed)) or (
                direct is not None and direct.closed
            )
            if not isinstance(self.conn, ConnectionPool) or never_had:
                raise
            return self._run_steps(make_steps())

    def _run_steps(self, steps: Steps[T]) -> T:
        """Run a checkpoint call's statements here, on the user's connection, or on the
        loop (which sets up first) when they cannot run here: not set up yet, a pipeline,
        closed, or called on the loop's own thread (refused there)."""
        direct, runtime = self._direct_path, self._runtime
        if (
            direct is not None
            and self.saver.is_setup
            and not runtime.closed
            and threading.get_ident() != runtime.thread.ident
        ):
            return direct.run(self.saver, steps)
        return self._call(self.saver._run_steps(steps))


# get_tuple says what aget_tuple says (it runs the same statement; put, put_writes and
# list: SyncCheckpointCalls')
PostgresSaver.get_tuple.__doc__ = AsyncPostgresSaver.aget_tuple.__doc__
PostgresSaver.get_delta_channel_history.__doc__ = (
    AsyncPostgresSaver.aget_delta_channel_history.__doc__
)


def _async_connection_args(conn: Connection[Any]) -> tuple[str, dict[str, Any]]:
    """How to open an async connection like ``conn``: its DSN and connect arguments."""
    if conn.closed:
        raise ConnectionClosedError(
            "the psycopg connection is closed; pass an open Connection (or a ConnectionPool)"
        )
    args: dict[str, Any] = {
        "autocommit": conn.autocommit,
        "prepare_threshold": conn.prepare_threshold,
    }
    password = conn.info.password  # never part of info.dsn
    if password:
        args["password"] = password
    return conn.info.dsn, args


def _search_path(conn: Connection[Any]) -> str:
    """The ``search_path`` of the user's connection, which the saver's async connection
    (the ledger, maintenance) then uses too: one set of tables for both."""
    with conn.transaction(), conn.cursor(row_factory=tuple_row) as cur:
        cur.execute("SELECT current_setting('search_path')")
        row = cur.fetchone()
    assert row is not None
    return str(row[0])


async def _connect(dsn: str, search_path: str, **args: Any) -> AsyncConnection[Any]:
    """The saver's async connection, on the tables the user's connection sees."""
    try:
        aconn = await AsyncConnection.connect(dsn, **args)
    except psycopg.OperationalError as exc:
        raise ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}") from exc
    try:
        async with aconn.transaction():
            await aconn.execute("SELECT set_config('search_path', %s, false)", (search_path,))
    except BaseException:
        await aconn.close()
        raise
    return aconn


def _connect_sync(conn_string: str) -> Connection[Any]:
    """``from_conn_string``'s connection, opened as LangGraph's ``PostgresSaver`` opens
    it, with the errors ``AsyncPostgresSaver.from_conn_string`` raises."""
    try:
        return Connection.connect(
            conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
    except (psycopg.OperationalError, psycopg.ProgrammingError) as exc:
        error = connect_error(exc, conn_string)
        raise error from (None if isinstance(error, ConfigError) else exc)
