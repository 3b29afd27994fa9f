"""``PostgresSaver``: the synchronous drop-in for ``langgraph.checkpoint.postgres.PostgresSaver``.

For programs without an event loop (``graph.invoke`` / ``graph.stream``): the same name,
constructor ``(conn, pipe=None, serde=None)`` over a psycopg 3 ``Connection`` or
``ConnectionPool``, ``from_conn_string(dsn, *, pipeline=False)`` (a context manager) and
``setup()`` as LangGraph's, with the tool-call ledger.

**Design: the async saver on a private loop, not a second implementation.** A
``PostgresSaver`` owns an event loop in a daemon thread and an
:class:`AsyncPostgresSaver` on it (see :mod:`langgraph_idem_saver.sync_bridge` for why);
every method hands its work to that saver. So the schema is the async saver's by
construction: a database written by ``AsyncPostgresSaver`` is continued by
``PostgresSaver`` and vice versa, ledger included, and every capability (one-statement
reads, compression, list deltas, advisory-locked migrations, typed errors, ``prune``,
``copy_thread``, the ledger) is the same code.

The async saver needs psycopg's *async* connections, so what you pass in is used as a
recipe, not as the transport:

* ``PostgresSaver(conn)`` opens one ``AsyncConnection`` with ``conn``'s parameters
  (``conn.info.dsn`` and its password), ``autocommit`` and ``prepare_threshold`` (so
  ``prepare_threshold=None`` for pgbouncer carries over). ``pipe`` given: that connection
  runs in pipeline mode. Session state you set on ``conn`` afterwards (``SET
  search_path``) does not carry over: put it in the DSN (``options=-c search_path=...``).
* ``PostgresSaver(pool)`` opens an ``AsyncConnectionPool`` with the pool's ``conninfo``,
  ``kwargs``, sizes and timeouts; calls then run concurrently, one pooled connection
  each. A ``configure`` callback (a function of sync connections) cannot run on async
  ones: :class:`ConfigError` - put session settings in ``conninfo``/``kwargs`` instead.
  ``reset`` is not needed (the saver leaves no session state) and ``check`` becomes
  ``AsyncConnectionPool.check_connection``.
* ``from_conn_string(dsn)`` opens the async connection directly, as
  ``AsyncPostgresSaver.from_conn_string`` does; ``conn`` is then that ``AsyncConnection``.

Your connection or pool stays yours: ``close()`` (or the ``with`` block's end) closes what
the saver opened and never yours.

Threads: one saver may be shared by any number of threads; with a single connection calls
are serialized (one connection runs one transaction at a time), with a pool they run
concurrently.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AsyncExitStack, contextmanager
from typing import Any, cast

import psycopg
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, Capabilities, Connection, Pipeline
from psycopg_pool import AsyncConnectionPool, ConnectionPool

from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver
from langgraph_idem_saver.retention import SyncRetention, TTLConfig
from langgraph_idem_saver.sync_bridge import SyncSaverBase

__all__ = ["PostgresSaver"]


class PostgresSaver(SyncRetention, SyncSaverBase[AsyncPostgresSaver]):
    """Sync PostgreSQL checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a psycopg 3 ``Connection`` or ``ConnectionPool`` (its parameters are used to
            open the saver's own async connection or pool).
        pipe: a ``Pipeline`` of ``conn`` (single connection only), as LangGraph's saver
            accepts: the saver's connection then runs in pipeline mode.
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default.
        ttl: retention, applied by ``sweep()`` (see ``TTLConfig``).
    """

    conn: Connection[Any] | ConnectionPool[Any] | AsyncConnection[Any]
    pipe: Pipeline | None
    supports_pipeline: bool

    def __init__(
        self,
        conn: Connection[Any] | ConnectionPool[Any],
        pipe: Pipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        ttl = TTLConfig.of(ttl)
        if isinstance(conn, ConnectionPool):
            if pipe is not None:
                raise ValueError(
                    "Pipeline should be used only with a single Connection, not ConnectionPool."
                )
            pool_args = _async_pool_args(conn)

            async def open_saver(stack: AsyncExitStack) -> AsyncPostgresSaver:
                pool: AsyncConnectionPool[Any] = AsyncConnectionPool(**pool_args, open=False)
                await pool.open()
                stack.push_async_callback(pool.close)
                return AsyncPostgresSaver(pool, serde=serde, ttl=ttl)

        elif isinstance(conn, Connection):
            dsn, connect_args = _async_connection_args(conn)
            pipeline = pipe is not None

            async def open_saver(stack: AsyncExitStack) -> AsyncPostgresSaver:
                aconn = await _connect(dsn, **connect_args)
                stack.push_async_callback(aconn.close)
                apipe = await stack.enter_async_context(aconn.pipeline()) if pipeline else None
                return AsyncPostgresSaver(aconn, apipe, serde=serde, ttl=ttl)

        else:
            raise TypeError(
                f"conn must be a psycopg Connection or ConnectionPool, got {type(conn).__name__}"
                " (for an AsyncConnection or AsyncConnectionPool use AsyncPostgresSaver)"
            )
        self.conn = conn
        self.pipe = pipe
        self.supports_pipeline = Capabilities().has_pipeline()
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
        """Connect to ``conn_string`` for the block (autocommit, prepared statements), set
        up; ``pipeline=True`` runs the connection in pipeline mode, as LangGraph's does."""

        async def open_saver(stack: AsyncExitStack) -> AsyncPostgresSaver:
            return await stack.enter_async_context(
                AsyncPostgresSaver.from_conn_string(
                    conn_string, pipeline=pipeline, serde=serde, ttl=ttl
                )
            )

        saver = cls.__new__(cls)
        saver._start("PostgresSaver", open_saver)
        try:
            saver.conn = cast(AsyncConnection[Any], saver.saver.conn)  # what it opened
            saver.pipe = None
            saver.supports_pipeline = saver.saver.supports_pipeline
            yield saver
        finally:
            saver.close()

    def setup(self) -> None:
        """Create or migrate the tables (idempotent; also runs on first use), in one
        transaction under an advisory lock, as ``AsyncPostgresSaver.setup`` does."""
        self._call(self.saver.setup())


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


async def _connect(dsn: str, **args: Any) -> AsyncConnection[Any]:
    try:
        return await AsyncConnection.connect(dsn, **args)
    except psycopg.OperationalError as exc:
        raise ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}") from exc


def _async_pool_args(pool: ConnectionPool[Any]) -> dict[str, Any]:
    """The arguments of an ``AsyncConnectionPool`` equivalent to ``pool``."""
    # psycopg_pool keeps the callbacks private; reading them is the only way to refuse
    # a configure callback instead of silently dropping it
    if getattr(pool, "_configure", None) is not None:
        raise ConfigError(
            "PostgresSaver(pool) runs on an AsyncConnectionPool built from your pool's "
            "conninfo and kwargs, where a configure callback (a function of sync "
            "connections) cannot run. Put session settings in the conninfo (e.g. "
            "options='-c search_path=...') and pass a pool without configure, or use "
            "AsyncPostgresSaver with an AsyncConnectionPool"
        )
    check = getattr(pool, "_check", None)
    return {
        "conninfo": pool.conninfo,
        "kwargs": pool.kwargs,
        "min_size": pool.min_size,
        "max_size": pool.max_size,
        "timeout": pool.timeout,
        "max_waiting": pool.max_waiting,
        "max_lifetime": pool.max_lifetime,
        "max_idle": pool.max_idle,
        "reconnect_timeout": pool.reconnect_timeout,
        "num_workers": pool.num_workers,
        "check": AsyncConnectionPool.check_connection if check is not None else None,
        "name": f"{pool.name}-idem-saver",
    }
