"""``AsyncPostgresSaver``: LangGraph checkpoints and the tool-call ledger in PostgreSQL.

A drop-in for ``langgraph.checkpoint.postgres.aio.AsyncPostgresSaver`` (same name, same
constructor ``(conn, pipe=None, serde=None)``, same ``from_conn_string(dsn, *,
pipeline=False, serde=None)``), built from a psycopg 3 ``AsyncConnection`` (autocommit or
not, any row factory, any ``prepare_threshold`` including ``None`` for pgbouncer) or an
``AsyncConnectionPool``. Differences that matter in production:

* **Concurrency that scales.** With a pool, every call takes its own connection, so
  independent calls run concurrently (LangGraph's saver serializes all calls behind one
  lock even with a pool). With a single connection, calls are serialized by a lock,
  since one connection runs one transaction at a time.
* **One statement per call.** ``aput`` writes the new blobs and the checkpoint in one
  statement (a data-modifying CTE over ``unnest``ed arrays); ``aget_tuple`` and each page
  of ``alist`` read the checkpoint, its channel values and its pending writes in one
  statement. One round trip each, and atomic on its own under autocommit (on a
  non-autocommit connection each call runs in its own transaction, committed before it
  returns).
* **Flat reads.** Channel values are looked up by primary key through the checkpoint's
  ``channel_versions``; nothing scans a thread's blobs, so reading the latest checkpoint
  of a 5,000-checkpoint thread touches as many rows as reading a 10-checkpoint one's.
* **O(N) storage.** Channel values live in ``idem_blobs``, written only for
  ``new_versions``; a growing list channel (``messages``) is stored as the items
  appended to the version before it (see :mod:`langgraph_idem_saver.list_deltas`), so a
  long conversation stores each message about once instead of once per turn. A read
  follows such a delta's chain (at most ``MAX_CHAIN`` primary-key probes) in the same
  statement; ``aput`` checks, in its one statement, that the version a delta extends is
  still stored, and writes the value whole (a second statement) when it is not. Deletes
  and prunes hold a per-thread advisory lock that this check takes shared, so a delete
  running at the same time never removes a base under a new delta (sql.THREAD_LOCK_SPACE).
* **Safe migrations.** ``setup()`` (also run on first use) applies migrations in one
  transaction under an advisory lock: no ``CREATE INDEX CONCURRENTLY``, so it works on a
  plain connection, inside or outside a transaction, and concurrent workers don't race.
  A database written by a newer release raises :class:`SchemaVersionError`.
* **Typed errors.** A lost or closed connection raises :class:`ConnectionClosedError`
  (with a pool, the dead connections are discarded and the next call works); corrupt
  rows raise :class:`CorruptRecordError`; a missing ``thread_id`` :class:`ConfigError`.

Metadata is stored as JSONB and filtered with bound parameters only. Filter semantics
follow LangGraph's ``InMemorySaver`` (Python equality: ``None`` matches an absent key,
``1 == 1.0 == True``): the SQL narrows the rows with per-key JSONB comparisons that
never exclude a match, and each candidate is then checked with Python equality on its
exact metadata. Known difference: an integer and a float beyond 2**53 that Python finds
equal (``2**60 == 2.0**60``) compare by their JSON decimal text in SQL and do not match.

PostgreSQL text cannot hold NUL characters or unpaired surrogates: ids (thread, namespace,
checkpoint, task, channel) containing them are refused (:class:`ConfigError` /
:class:`SerializationError`). Metadata containing them is stored exactly (in
``metadata_exact``) and still filterable.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar, TypeVar, cast

import psycopg
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, AsyncCursor, AsyncPipeline, Capabilities
from psycopg.rows import TupleRow, dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool, PoolClosed

from langgraph_idem_saver.backend import Claims, Guarded, LedgerStatements
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    LedgerStateError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
    SerializationError,
)
from langgraph_idem_saver.group_commit import GroupCommit
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry, slot_of
from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder, resolve_value
from langgraph_idem_saver.postgres import sql
from langgraph_idem_saver.postgres.inspect import PostgresInspection
from langgraph_idem_saver.postgres.retention import PostgresRetention
from langgraph_idem_saver.retention import TTLConfig
from langgraph_idem_saver.saver_base import (
    IdemSaverBase,
    canonical_json,
    check_prune_strategy,
    checkpoint_id_of,
    checkpoint_ns_of,
    checkpoints_to_keep,
    decode_checkpoint,
    decode_json,
    decode_typed,
    encode_metadata,
    encode_versions,
    has_number,
    make_config,
    metadata_matches,
    text_of,
    thread_id_of,
)
from langgraph_idem_saver.surrogates import utf8_ok

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
Conn = AsyncConnection[Any] | AsyncConnectionPool[Any]

LIST_PAGE_SIZE = sql.PAGE_BOUND

# Values whose serialized form reaches this size are compressed by the client (zlib level
# 1) before they are sent. PostgreSQL would otherwise compress them itself (TOAST, pglz,
# from ~2 KB on), at several times the CPU cost, on the one machine every worker shares:
# a 25 KB message list costs ~0.5 ms of server CPU with pglz, ~0.08 ms of client CPU with
# zlib, and ends up smaller. The marker is a type prefix, so uncompressed rows (and
# rows written with compression off) read back unchanged.
COMPRESS_MIN_BYTES = 2048
ZLIB_PREFIX = "zlib:"
CLAIM_RETRIES = 5

# SQLSTATEs meaning the session is gone: connection exceptions (class 08) and the
# server shutting the backend down (admin / crash / cannot connect now).
_LOST_SQLSTATES = ("57P01", "57P02", "57P03")


class AsyncPostgresSaver(PostgresInspection, PostgresRetention, IdemSaverBase):
    """Async PostgreSQL checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a psycopg 3 ``AsyncConnection`` or an ``AsyncConnectionPool`` (opened).
        pipe: an ``AsyncPipeline`` of ``conn`` (single connection only), as LangGraph's
            saver accepts; ``from_conn_string(..., pipeline=True)`` makes one.
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default.
        ttl: retention, applied by ``asweep()``/``sweep()`` (see :class:`TTLConfig`).
    """

    _sql: ClassVar[LedgerStatements] = sql
    lock: asyncio.Lock
    # values serialized to at least this many bytes are stored zlib-compressed (level 1)
    # when that saves 10% or more; None stores everything as serialized
    compress_min_bytes: int | None = COMPRESS_MIN_BYTES

    def __init__(
        self,
        conn: Conn,
        pipe: AsyncPipeline | None = None,
        serde: SerializerProtocol | None = None,
        *,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.ttl = TTLConfig.of(ttl)
        if isinstance(conn, AsyncConnectionPool):
            if pipe is not None:
                raise ValueError(
                    "Pipeline should be used only with a single AsyncConnection, "
                    "not AsyncConnectionPool."
                )
        elif not isinstance(conn, AsyncConnection):
            raise TypeError(
                f"conn must be a psycopg AsyncConnection or AsyncConnectionPool, "
                f"got {type(conn).__name__}"
            )
        self.conn = conn
        self.pipe = pipe
        self.lock = asyncio.Lock()
        self.supports_pipeline = Capabilities().has_pipeline()
        self._deltas = ListDeltaEncoder()
        # outcomes of calls that finish together share one transaction (group_commit.py)
        self._finishes = GroupCommit(self._finish_all)

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        pipeline: bool = False,
        serde: SerializerProtocol | None = None,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> AsyncIterator[AsyncPostgresSaver]:
        """Connect to ``conn_string`` for the block (autocommit, prepared statements).

        ``pipeline=True`` runs the connection in pipeline mode, as LangGraph's does.
        """
        ttl = TTLConfig.of(ttl)  # refused before connecting
        try:
            conn = await AsyncConnection.connect(
                conn_string, autocommit=True, prepare_threshold=0, row_factory=dict_row
            )
        except psycopg.OperationalError as exc:
            raise ConnectionClosedError(f"cannot connect to PostgreSQL: {exc}") from exc
        except psycopg.ProgrammingError as exc:  # the DSN itself is malformed
            # libpq may quote the whole DSN back, password included: never repeat it
            why = str(exc).replace(conn_string, "<the connection string>").strip()
            raise ConfigError(f"bad PostgreSQL connection string: {why}") from None
        async with conn:
            if pipeline:
                async with conn.pipeline() as pipe:
                    saver = cls(conn, pipe=pipe, serde=serde, ttl=ttl)
                    await saver.setup()
                    yield saver
            else:
                saver = cls(conn, serde=serde, ttl=ttl)
                await saver.setup()
                yield saver

    # --- plumbing -------------------------------------------------------------------

    async def _setup_once(self) -> None:
        """Apply pending migrations (``setup()``).

        One transaction under ``pg_advisory_xact_lock``, so workers starting together
        migrate once. On a connection already inside a transaction, the migrations join
        it (as a savepoint) and are committed with it. Raises :class:`SchemaVersionError`
        for a database written by a newer release.
        """
        await self._execute(_migrate, tx=True)

    @asynccontextmanager
    async def _connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        """A connection for one call: the pool's next one, or ours under the lock."""
        conn = self.conn
        if isinstance(conn, AsyncConnectionPool):
            async with conn.connection() as pooled:
                yield pooled
            return
        async with self.lock:
            if conn.closed:
                raise ConnectionClosedError(
                    "the PostgreSQL connection is closed; open a new connection and create "
                    "a new saver (e.g. `async with AsyncPostgresSaver.from_conn_string(dsn)"
                    "`), or pass an AsyncConnectionPool, which replaces lost connections"
                )
            yield conn

    async def _execute(
        self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
    ) -> T:
        """Run ``fn`` to completion even if the caller is cancelled.

        LangGraph cancels sibling tasks when one fails or interrupts; a query cancelled
        mid-flight makes psycopg close its connection, which on a single shared
        connection would break the saver for everyone. So the work runs in its own task
        and the caller only stops *waiting* for it.
        """
        task = asyncio.ensure_future(self._execute_now(fn, tx=tx, pipeline=pipeline))
        task.add_done_callback(_consume_outcome)
        return await asyncio.shield(task)

    async def _execute_now(
        self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
    ) -> T:
        """Run ``fn`` on a cursor of a connection: atomically, with typed errors.

        A single statement on an autocommit connection is atomic by itself; ``tx=True``
        (or a non-autocommit connection) wraps ``fn`` in a transaction committed before
        returning. ``pipeline=True`` sends all of ``fn``'s statements in one round trip
        where libpq supports pipeline mode.
        """
        used: AsyncConnection[Any] | None = None
        try:
            async with self._connection() as conn:
                used = conn
                if pipeline and self.pipe is None and self.supports_pipeline:
                    async with conn.pipeline():
                        result = await _in_transaction(conn, fn, tx)
                else:
                    result = await _in_transaction(conn, fn, tx)
                if self.pipe is not None:
                    await self.pipe.sync()
                return result
        except (psycopg.Error, PoolClosed) as exc:
            error = self._typed_error(exc, used)
            if error is None:
                raise
            if isinstance(error, ConnectionClosedError):
                await self._discard_dead_connections()
            raise error from exc

    async def _run(
        self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
    ) -> T:
        await self.setup()
        return await self._execute(fn, tx=tx, pipeline=pipeline)

    def _typed_error(
        self, exc: BaseException, conn: AsyncConnection[Any] | None
    ) -> Exception | None:
        """The package's exception for a psycopg/pool error, or None to re-raise it."""
        pooled = isinstance(self.conn, AsyncConnectionPool)
        if isinstance(exc, PoolClosed):
            return ConnectionClosedError(
                f"the AsyncConnectionPool is closed ({exc}); open it (`await pool.open()` "
                "or `async with pool:`) before using the saver"
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
            else:
                hint = (
                    "open a new connection and create a new saver (e.g. `async with "
                    "AsyncPostgresSaver.from_conn_string(dsn)`), or pass an "
                    "AsyncConnectionPool, which replaces lost connections"
                )
            return ConnectionClosedError(f"the PostgreSQL connection was lost ({exc}); {hint}")
        if sqlstate == "25006":  # read_only_sql_transaction
            where = f"database {conn.info.dbname!r}" if conn is not None else "the database"
            return ReadOnlyDatabaseError(
                f"PostgreSQL refused a write to {where}: {exc} (a read-only session - "
                "default_transaction_read_only - or a hot standby); nothing was written"
            )
        if sqlstate == "54000":  # program_limit_exceeded: e.g. an id too long to index
            return ConfigError(
                f"a value is too large for PostgreSQL to index ({exc}); use a shorter thread "
                "id / namespace / key (nothing was written)"
            )
        if isinstance(exc, psycopg.DataError) and "NUL" in str(exc):
            return SerializationError(
                f"PostgreSQL text cannot hold NUL (\\x00) characters: {exc}; nothing was written"
            )
        return None

    async def _discard_dead_connections(self) -> None:
        """After a lost connection, make the pool drop its other dead idle connections
        (a server restart or ``pg_terminate_backend`` kills them all), so the next call
        gets a live one."""
        if isinstance(self.conn, AsyncConnectionPool):
            # the pool closing or the server being down leaves nothing to do here
            with contextlib.suppress(Exception):
                await self.conn.check()

    # --- values ----------------------------------------------------------------------

    def _dump(self, value: Any) -> tuple[str, bytes]:
        """``serde.dumps_typed``, zlib-compressed when that pays (see COMPRESS_MIN_BYTES)."""
        return self._pack(*self.serde.dumps_typed(value))

    def _pack(self, type_: str, data: bytes) -> tuple[str, bytes]:
        """Serialized ``(type, data)`` as stored: zlib-compressed when that pays."""
        limit = self.compress_min_bytes
        if limit is not None and len(data) >= limit:
            packed = zlib.compress(data, 1)
            if len(packed) <= len(data) * 0.9:
                return ZLIB_PREFIX + type_, packed
        return type_, data

    def _unpack(
        self, type_: str, data: bytes | None, what: str, **location: Any
    ) -> tuple[str, bytes | None]:
        """A stored ``(type, data)`` as ``serde`` wrote it: decompressed if it was."""
        if type_.startswith(ZLIB_PREFIX):
            try:
                data = zlib.decompress(data or b"")
            except zlib.error as exc:
                raise CorruptRecordError(what, location=location, cause=exc) from exc
            type_ = type_[len(ZLIB_PREFIX) :]
        return type_, data

    def _load(self, type_: str, data: bytes | None, what: str, **location: Any) -> Any:
        """Decode a stored value (decompressing it first if it was compressed)."""
        return decode_typed(
            self.serde, *self._unpack(type_, data, what, **location), what, **location
        )

    # --- reads ---------------------------------------------------------------------

    def _row_to_tuple(self, row: Sequence[Any], *, loading: bool = False) -> CheckpointTuple:
        """Build a CheckpointTuple from a row; ``loading`` when a graph resumes from it
        (its list values may then serve as the bases of the next deltas)."""
        (
            thread_id,
            ns,
            checkpoint_id,
            parent_id,
            type_,
            data,
            metadata,
            metadata_exact,
            blobs,
            writes,
        ) = row
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        checkpoint = decode_checkpoint(
            self.serde, *self._unpack(type_, data, "checkpoint", **where), **where
        )
        values: dict[str, Any] = {}
        # one row per stored version: each channel's own first, then (for a delta) the
        # versions it extends, by depth
        chains: dict[str, list[tuple[str, bytes | None, str | None, str | None]]] = {}
        for channel_b, btype_b, blob, version_b, base_b in blobs or ():
            chains.setdefault(bytes(channel_b).decode(), []).append(
                (
                    bytes(btype_b).decode(),
                    blob,
                    None if version_b is None else bytes(version_b).decode(),
                    None if base_b is None else bytes(base_b).decode(),
                )
            )
        for channel, chain in chains.items():
            btype, blob, version, base_version = chain[0]
            if base_version is None:
                values[channel] = self._load(btype, blob, "channel value", channel=channel, **where)
                depth = 0
            else:
                values[channel], depth = self._resolve(chain, channel=channel, **where)
            value = values[channel]
            if loading and version is not None:
                self._deltas.loaded(thread_id, ns, channel, version, value, depth)
        pending = []
        for task_b, channel_b, wtype_b, value in writes or ():
            task_id = bytes(task_b).decode()
            channel = bytes(channel_b).decode()
            pending.append(
                (
                    task_id,
                    channel,
                    self._load(
                        bytes(wtype_b).decode(),
                        value,
                        "pending write",
                        task_id=task_id,
                        channel=channel,
                        **where,
                    ),
                )
            )
        if metadata_exact is not None:
            metadata = decode_json(metadata_exact, "metadata", **where)
        if not isinstance(metadata, dict):
            raise CorruptRecordError(
                "metadata", location=where, cause=TypeError("metadata is not a JSON object")
            )
        return CheckpointTuple(
            config=make_config(thread_id, ns, checkpoint_id),
            checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
            metadata=cast(CheckpointMetadata, metadata),
            parent_config=make_config(thread_id, ns, parent_id) if parent_id else None,
            pending_writes=pending,
        )

    def _resolve(
        self, chain: list[tuple[str, bytes | None, str | None, str | None]], **where: Any
    ) -> tuple[Any, int]:
        """A delta's value: its chain (as SELECT_TUPLES returns it) resolved to a list,
        and its depth. A base the chain lacks is reported as corrupt."""
        by_version = {version: (t, b, base) for t, b, version, base in chain[1:]}

        def fetch_base(version: str) -> tuple[str, bytes | None, str | None] | None:
            row = by_version.get(version)
            if row is None:
                return None
            type_, blob, base = row
            return (*self._unpack(type_, blob, "channel value", **where), base)

        type_, blob, _, base_version = chain[0]
        type_, data = self._unpack(type_, blob, "channel value (delta)", **where)
        return resolve_value(self.serde, type_, data, base_version, fetch_base, **where)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint (latest of the thread/namespace, or by id), one round trip."""
        thread_id = _text(thread_id_of(config), "thread_id")
        ns = _text(checkpoint_ns_of(config), "checkpoint_ns")
        checkpoint_id = checkpoint_id_of(config)
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns}
        if checkpoint_id:
            params["checkpoint_id"] = _text(checkpoint_id, "checkpoint_id")
            query = sql.SELECT_TUPLE_BY_ID
        else:
            query = sql.SELECT_LATEST_TUPLE

        async def read(cur: Cursor) -> TupleRow | None:
            await cur.execute(query, params)
            return await cur.fetchone()

        row = await self._run(read)
        return None if row is None else self._row_to_tuple(row, loading=True)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, a page per statement (no connection held between).

        ``limit`` of 0 or less yields nothing.
        """
        if limit is not None and limit <= 0:
            return
        clauses: list[str] = []
        params: dict[str, Any] = {}
        if config is not None:
            clauses.append("thread_id = %(thread_id)s")
            params["thread_id"] = _text(thread_id_of(config), "thread_id")
            if "checkpoint_ns" in config["configurable"]:
                clauses.append("checkpoint_ns = %(ns)s")
                params["ns"] = _text(checkpoint_ns_of(config), "checkpoint_ns")
            if checkpoint_id := checkpoint_id_of(config):
                clauses.append("checkpoint_id = %(checkpoint_id)s")
                params["checkpoint_id"] = _text(checkpoint_id, "checkpoint_id")
        if filter:
            clauses += _metadata_filter(filter, params)
        if before is not None and (before_id := checkpoint_id_of(before)):
            clauses.append("checkpoint_id < %(before)s")
            params["before"] = _text(before_id, "checkpoint_id")

        remaining = limit
        cursor: tuple[str, str, str] | None = None
        while remaining is None or remaining > 0:
            page = LIST_PAGE_SIZE if remaining is None else min(remaining, LIST_PAGE_SIZE)
            where = list(clauses)
            args = {**params, "limit": page}
            if cursor is not None:
                if "ns" in params:
                    where.append(sql.LIST_AFTER_IN_NS)
                elif "thread_id" in params:
                    where.append(sql.LIST_AFTER_IN_THREAD)
                else:
                    where.append(sql.LIST_AFTER)
                args.update(c_id=cursor[0], c_thread=cursor[1], c_ns=cursor[2])
            query = sql.SELECT_TUPLES.format(
                where=("WHERE " + " AND ".join(where)) if where else "", limit=sql.LIST_LIMIT
            )

            async def read(cur: Cursor, q: str = query, a: dict[str, Any] = args) -> list[TupleRow]:
                await cur.execute(q, a)
                return await cur.fetchall()

            rows = await self._run(read)
            for row in rows:
                tup = self._row_to_tuple(row)
                if filter and not metadata_matches(dict(tup.metadata), filter):
                    continue
                yield tup
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return
            if len(rows) < page:
                return
            last = rows[-1]
            cursor = (last[2], last[0], last[1])

    # --- writes --------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store the checkpoint and its new channel values: one statement, one round trip."""
        thread_id = _text(thread_id_of(config), "thread_id")
        ns = _text(checkpoint_ns_of(config), "checkpoint_ns")
        parent_id = checkpoint_id_of(config)
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]
        for channel in new_versions:
            if channel in values:
                _text(channel, "channel")
        # an emptied channel (not in values) gets no row: it reads back absent, as
        # "empty" does; the encoder still sees it, to forget the channel's last version
        blobs = self._deltas.encode(self.serde, thread_id, ns, values, new_versions)
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        metadata_json, metadata_exact = _metadata_columns(full_metadata)
        checkpoint_params = (
            thread_id,
            ns,
            _text(checkpoint["id"], "checkpoint id"),
            parent_id,
            None if run_id is None else str(run_id),
            *self._dump(stored),
            metadata_json,
            metadata_exact,
            encode_versions(checkpoint["channel_versions"]),
        )

        async def write(cur: Cursor) -> list[EncodedBlob]:
            rows = blobs
            # at most twice: a second attempt stores the deltas whose base is gone whole
            while True:
                stored_rows = [b for b in rows if b.type != "empty"]
                deltas = any(b.base_version is not None for b in stored_rows)
                params: list[Any] = []
                for b in stored_rows:
                    assert b.data is not None
                    params += (
                        thread_id,
                        ns,
                        b.channel,
                        b.version,
                        *self._pack(b.type, b.data),
                        b.base_version,
                    )
                params += checkpoint_params
                await cur.execute(sql.put_checkpoint_sql(len(stored_rows), deltas), params)
                if not deltas:
                    return rows
                missing = {r[0] for r in await cur.fetchall()}
                if not missing:
                    return rows
                rows = [
                    self._deltas.whole(self.serde, b) if b.channel in missing else b for b in rows
                ]

        written = await self._run(write)
        self._deltas.remember(thread_id, ns, written)
        return make_config(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes: one statement (regular writes are never replaced)."""
        thread_id = _text(thread_id_of(config), "thread_id")
        ns = _text(checkpoint_ns_of(config), "checkpoint_ns")
        checkpoint_id = checkpoint_id_of(config)
        if checkpoint_id is None:
            raise ConfigError("put_writes needs config['configurable']['checkpoint_id']")
        text_of(task_id, "task_id")
        text_of(task_path, "task_path")
        # one row per idx; a repeated special write (idx < 0) replaces the earlier one
        by_idx: dict[int, tuple[str, str, bytes]] = {}
        for idx, (channel, value) in enumerate(writes):
            by_idx[WRITES_IDX_MAP.get(channel, idx)] = (
                text_of(channel, "channel"),
                *self._dump(value),
            )
        if not by_idx:
            return
        params: list[Any] = []
        for idx, (channel, type_, data) in by_idx.items():
            params += (thread_id, ns, checkpoint_id, task_id, task_path, idx, channel, type_, data)
        query = sql.put_writes_sql(len(by_idx))

        async def write(cur: Cursor) -> None:
            await cur.execute(query, params)

        await self._run(write)

    # --- thread maintenance ----------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, writes, blobs and ledger entries: one statement,
        under the thread's lock (so an aput writing a delta at the same time either
        committed before and is deleted too, or finds its base gone and writes whole)."""
        tid = str(thread_id)

        async def delete(cur: Cursor) -> None:
            await cur.execute(sql.LOCK_THREADS, {"threads": [tid]})
            await cur.execute(sql.DELETE_THREAD, {"t": tid})

        await self._run(delete, tx=True, pipeline=True)
        self._deltas.forget([tid])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) and ledger entries of these runs."""
        ids = [str(r) for r in run_ids]
        if not ids:
            return

        async def delete(cur: Cursor) -> None:
            await cur.execute(sql.SELECT_THREADS_OF_RUNS, {"runs": ids})
            locked = [r[0] for r in await cur.fetchall()]
            if not locked:
                return
            # the threads' locks before anything is deleted: see sql.THREAD_LOCK_SPACE
            await cur.execute(sql.LOCK_THREADS, {"threads": locked})
            await cur.execute(sql.DELETE_RUNS, {"runs": ids, "threads": locked})
            threads = [r[0] for r in await cur.fetchall()]
            if threads:
                await cur.execute(sql.COLLECT_BLOBS, {"threads": threads})

        await self._run(delete, tx=True)
        self._deltas.forget()

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history, and its thread-scoped ledger entries."""
        params = {"src": str(source_thread_id), "dst": str(target_thread_id)}

        async def copy(cur: Cursor) -> None:
            await cur.execute(sql.COPY_THREAD, params)

        await self._run(copy)
        self._deltas.forget([params["dst"]])

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints; ledger entries are always kept (pruning must not cause re-runs).

        ``keep_latest`` keeps the newest checkpoint of each namespace with its writes
        (and the ancestors a ``DeltaChannel`` rebuilds its value from); ``delete``
        removes every checkpoint of the threads.
        """
        check_prune_strategy(strategy)
        threads = [str(t) for t in thread_ids]
        if not threads:
            return

        # Both run under the threads' locks (sql.THREAD_LOCK_SPACE), taken first: no aput
        # writing a delta is then half-way between checking its base and committing.
        async def delete(cur: Cursor) -> None:
            await cur.execute(sql.LOCK_THREADS, {"threads": threads})
            await cur.execute(sql.PRUNE_DELETE, {"threads": threads})

        async def keep_latest(cur: Cursor) -> None:
            await cur.execute(sql.LOCK_THREADS, {"threads": threads})
            await self._keep_latest_rows(cur, threads)

        if strategy == "delete":
            await self._run(delete, tx=True, pipeline=True)
        else:
            await self._run(keep_latest, tx=True)
        self._deltas.forget(threads)

    @staticmethod
    async def _keep_latest_rows(cur: Cursor, threads: Sequence[str]) -> None:
        """``aprune``'s ``keep_latest``, under the threads' locks the caller holds
        (retention's ``keep_latest`` reuses it)."""
        for thread_id in threads:
            await cur.execute(sql.SELECT_HEADS, (thread_id,))
            keep_ns: list[str] = []
            keep_ids: list[str] = []
            heads = await cur.fetchall()
            for ns, head_id, parent_id, counters in heads:
                keep = [head_id]
                if counters:  # a DeltaChannel: keep the ancestors it replays from
                    await cur.execute(sql.SELECT_LINEAGE, (thread_id, ns))
                    lineage = {
                        cid: (parent, {"counters_since_delta_snapshot": ctrs})
                        for cid, parent, ctrs in await cur.fetchall()
                    }
                    lineage[head_id] = (parent_id, {"counters_since_delta_snapshot": counters})
                    keep = checkpoints_to_keep(head_id, lineage.get)
                keep_ns += [ns] * len(keep)
                keep_ids += keep
            await cur.execute(
                sql.PRUNE_KEEP,
                {
                    "thread": thread_id,
                    "head_ns": [h[0] for h in heads],
                    "head_ids": [h[1] for h in heads],
                    "keep_ns": keep_ns,
                    "keep_ids": keep_ids,
                },
            )
        await cur.execute(sql.COLLECT_BLOBS, {"threads": list(threads)})

    # --- the tool-call ledger ----------------------------------------------------------

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        """Claim the batch in one transaction: ``INSERT ... ON CONFLICT DO NOTHING`` for
        every row, then read every row back (pipelined: one round trip)."""
        base = {
            "owner": claims.owner,
            "now": claims.issued_at,
            "lease": claims.lease_expires_at,
        }

        async def claim(cur: Cursor) -> list[ClaimOutcome]:
            pending = claims.rows
            outcomes: dict[int, ClaimOutcome] = {}
            positions = list(range(len(pending)))
            for _ in range(CLAIM_RETRIES):
                params: dict[str, Any] = {**base, **claims.columns(pending)}
                await cur.execute(sql.INSERT_ISSUED, params)
                async with cur.connection.cursor(row_factory=tuple_row, binary=True) as read:
                    await read.execute(sql.SELECT_ENTRIES_BY_KEYS, params)
                    inserted = {(r[0], r[1]) for r in await cur.fetchall()}
                    rows = {(r[0], r[1]): self.entry_of(r) for r in await read.fetchall()}
                    holders: dict[tuple[Any, ...], LedgerEntry] = {}
                    if any(p is not None for p in params["position"]):
                        await read.execute(sql.SELECT_SLOT_HOLDERS, params)
                        holders = {slot_of(e): e for e in map(self.entry_of, await read.fetchall())}
                missing: list[tuple[int, tuple[Any, ...]]] = []
                for pos, row in zip(positions, pending, strict=True):
                    k = (row[0], row[1])  # scope, key
                    # a key refused by the fork slot: another branch's call holds the slot
                    entry = rows.get(k) or holders.get(claims.slot(row))
                    if entry is None:  # deleted by a concurrent release/delete: claim again
                        missing.append((pos, row))
                        continue
                    claimed = k in inserted
                    inserted.discard(k)  # a key repeated in the batch is claimed once
                    outcomes[pos] = ClaimOutcome(claimed=claimed, entry=entry)
                if not missing:
                    break
                positions = [p for p, _ in missing]
                pending = [r for _, r in missing]
            else:
                raise LedgerStateError(
                    f"could not claim {len(pending)} tool call(s): their rows kept being "
                    "deleted concurrently"
                )
            return [outcomes[p] for p in range(len(claims.rows))]

        return await self._run(claim, tx=True, pipeline=True)

    async def _finish_entry(self, finish: Guarded) -> LedgerEntry | None:
        """Outcomes of calls that finish together share one transaction (_finish_all)."""
        done, row = await self._finishes.submit(finish.params)
        return self.entry_of(row) if done and row is not None else None

    async def _finish_all(self, batch: list[tuple[Any, ...]]) -> list[tuple[bool, TupleRow | None]]:
        """Record the outcomes of calls that finished together: one transaction (one
        WAL flush) for all; per outcome, its row, or (not ours to finish) the row as is."""

        async def finish(cur: Cursor) -> list[tuple[bool, TupleRow | None]]:
            # one pipelined executemany: one round trip whatever the number of outcomes
            await cur.executemany(sql.FINISH_ENTRY, batch, returning=True)
            rows = [await cur.fetchone()]
            while cur.nextset():
                rows.append(await cur.fetchone())
            done: list[tuple[bool, TupleRow | None]] = []
            for params, row in zip(batch, rows, strict=True):
                if row is None:  # not ours to finish: the row as it is
                    await cur.execute(sql.SELECT_ENTRY, params[5:7])  # scope, key
                    done.append((False, await cur.fetchone()))
                else:
                    done.append((True, row))
            return done

        return await self._run(finish, tx=len(batch) > 1)

    # --- ledger record primitives (the policy lives in IdemSaverBase) ---------------

    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        async def write(cur: Cursor) -> int:
            await cur.execute(query, params)
            return cur.rowcount

        return await self._run(write)

    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        """One ``UPDATE ... RETURNING`` statement (the server's durability applies)."""

        async def run(cur: Cursor) -> TupleRow | None:
            await cur.execute(update.query, update.params)
            return await cur.fetchone()

        row = await self._run(run)
        return None if row is None else self.entry_of(row)

    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(query, params)
            return await cur.fetchall()

        return [self.entry_of(r) for r in await self._run(read)]

    # --- DeltaChannel history ----------------------------------------------------------

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per requested channel: the writes on the parent chain since the nearest
        ancestor that stores the channel's value, and that value (``seed``, absent when
        the walk reaches the root without one) - exactly what LangGraph's default
        returns, in ONE statement (one round trip) whatever the chain's length.

        LangGraph calls this whenever it loads a thread with a ``DeltaChannel``. Its
        default walks the chain with one ``aget_tuple`` (one round trip, every channel
        value and write decoded) per ancestor. Here one recursive statement
        (``sql.delta_history_sql``) follows the parent ids by primary key, stops each
        channel at its seed, and returns only the requested channels' writes and seeds.
        (LangGraph's own Postgres saver pages the namespace by checkpoint id instead,
        which misses a parent whose id sorts after its child's - ids are only ordered
        within one process.)
        """
        wanted = list(dict.fromkeys(channels))
        if not wanted:
            return {}
        thread_id = _text(thread_id_of(config), "thread_id")
        ns = _text(checkpoint_ns_of(config), "checkpoint_ns")
        checkpoint_id = checkpoint_id_of(config)
        # a channel name PostgreSQL text cannot hold has nothing stored: no writes, no seed
        walking = [ch for ch in wanted if _clean_str(ch)]
        result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in wanted}
        if not walking:
            return result
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns}
        params.update((f"c{i}", ch) for i, ch in enumerate(walking))
        if checkpoint_id:
            params["checkpoint_id"] = _text(checkpoint_id, "checkpoint_id")
        query = sql.delta_history_sql(len(walking), bool(checkpoint_id))

        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(query, params)
            return await cur.fetchall()

        target: TupleRow | None = None
        chain: dict[str, list[TupleRow]] = {}  # checkpoint id -> its chain rows
        # checkpoint id -> (task_id, idx) -> write; (checkpoint id, channel) -> depth -> blob.
        # Keyed so that a chain that loops (its rows repeat) yields each row once.
        writes: dict[str, dict[tuple[str, int], TupleRow]] = {}
        blobs: dict[tuple[str, str], dict[int, TupleRow]] = {}
        for row in await self._run(read):
            kind, cid = row[0], row[1]
            if kind == 0 and row[3]:
                target = row
            elif kind == 0:
                chain.setdefault(cid, []).append(row)
            elif kind == 1:
                writes.setdefault(cid, {})[(row[7], row[8])] = row
            else:
                blobs.setdefault((cid, row[9]), {})[row[8]] = row
        if target is None:
            return result
        # re-walk from the target: the chain rows of the channels' walks, nearest first
        walk: list[tuple[str, set[str], list[str]]] = []  # (id, walking, seeded)
        remaining = "1" * len(walking)
        seen = {target[1]}
        parent: str | None = target[2]
        while parent is not None and "1" in remaining and parent not in seen:
            seen.add(parent)
            # one row per ancestor; more only when a corrupt chain loops back
            rows = [r for r in chain.get(parent, ()) if r[4] == remaining]
            if not rows:  # the parent is gone (pruned, deleted)
                break
            flags = list(zip(walking, remaining, rows[0][5], strict=True))
            walk.append(
                (
                    parent,
                    {ch for ch, w, _ in flags if w == "1"},
                    [ch for ch, w, s in flags if w == "1" and s == "1"],
                )
            )
            remaining = "".join("1" if w == "1" and s == "0" else "0" for _, w, s in flags)
            parent = rows[0][2]
        for cid, walking_here, seeded_here in reversed(walk):
            where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
            # writes_sort_key order, as get_tuple returns them
            for *_, _path, task_id, _idx, channel, wtype, data, _ in sorted(
                writes.get(cid, {}).values(), key=lambda w: (w[6], w[7], w[8])
            ):
                if channel in walking_here:
                    value = self._load(
                        wtype, data, "pending write", task_id=task_id, channel=channel, **where
                    )
                    result[channel]["writes"].append((task_id, channel, value))
            for channel in seeded_here:
                stored = [
                    (r[10], r[11], r[6], r[12])  # type, blob, version, base_version
                    for _, r in sorted(blobs.get((cid, channel), {}).items())
                ]
                if not stored:  # the chain saw it in this same statement
                    raise CorruptRecordError(
                        "channel value",
                        location={**where, "channel": channel},
                        cause=LookupError("the seed's blob vanished within one statement"),
                    )
                btype, blob, _, base_version = stored[0]
                if base_version is None:
                    seed = self._load(btype, blob, "channel value", channel=channel, **where)
                else:
                    seed, _ = self._resolve(stored, channel=channel, **where)
                result[channel]["seed"] = seed
        return result


# --- helpers -----------------------------------------------------------------------


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


async def _migrate(cur: Cursor) -> None:
    """Bring the schema up to date; the caller runs this in one transaction."""
    await cur.execute(sql.TAKE_MIGRATION_LOCK, (sql.MIGRATION_LOCK_KEY,))
    await cur.execute(sql.SELECT_MIGRATIONS_TABLE)
    row = await cur.fetchone()
    found = -1
    if row is not None and row[0]:
        await cur.execute(sql.SELECT_SCHEMA_VERSION)
        version_row = await cur.fetchone()
        if version_row is not None and version_row[0] is not None:
            found = int(version_row[0])
    if found > sql.SCHEMA_VERSION:
        raise SchemaVersionError(found, sql.SCHEMA_VERSION, "this PostgreSQL database")
    for version in range(found + 1, len(sql.MIGRATIONS)):
        for statement in sql.MIGRATIONS[version]:
            await cur.execute(statement, prepare=False)
        await cur.execute(sql.INSERT_MIGRATION, (version,), prepare=False)


def _text(value: str, what: str) -> str:
    """An id as PostgreSQL text, or a ConfigError for what TEXT cannot hold."""
    if value.isascii():
        if "\x00" not in value:
            return value
    elif "\x00" not in value and utf8_ok(value):
        return value
    raise ConfigError(
        f"{what} {value!r} cannot be stored in PostgreSQL: text cannot hold NUL characters "
        "or unpaired surrogates"
    )


def _clean_str(value: str) -> bool:
    """Whether JSONB holds this string exactly (no NUL, no unpaired surrogate)."""
    if "\x00" in value:
        return False
    return value.isascii() or utf8_ok(value)


def _jsonb_exact(value: Any) -> bool:
    """Whether JSONB round-trips this (already JSON-encodable) value exactly.

    JSONB refuses NUL characters and unpaired surrogates, and prints numbers in plain
    decimal: ``1e+16`` would come back as the int ``10000000000000000`` and ``-0.0``
    as ``0.0``.
    """
    if value is None or isinstance(value, (bool, int)):
        return True
    if isinstance(value, str):
        return _clean_str(value)
    if isinstance(value, float):
        return "e+" not in repr(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)
    if isinstance(value, dict):
        return all(
            (not isinstance(k, str) or _clean_str(k)) and _jsonb_exact(v) for k, v in value.items()
        )
    if isinstance(value, (list, tuple)):
        return all(_jsonb_exact(v) for v in value)
    return False


def _sanitize(value: Any) -> Any:
    """A JSONB-storable stand-in: NUL and unpaired surrogates become U+FFFD.

    Applied alike to stored metadata and to filter values, so equal values still match
    (the Python check on the exact metadata then removes false positives).
    """
    if isinstance(value, str):
        if _clean_str(value):
            return value
        return "".join(
            "\ufffd" if ch == "\x00" or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in value
        )
    if isinstance(value, dict):
        return {_sanitize(k): _sanitize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_sanitize(v) for v in value]
    return value


def _metadata_columns(metadata: CheckpointMetadata) -> tuple[str, str | None]:
    """``(metadata JSONB text, metadata_exact)``: the exact text only when JSONB can't
    hold the metadata as is."""
    text = encode_metadata(metadata)
    if _jsonb_exact(metadata):
        return text, None
    safe = _sanitize(json.loads(text))
    return json.dumps(safe, ensure_ascii=False, sort_keys=True, separators=(",", ":")), text


def _metadata_filter(filter: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """SQL conditions that keep every row whose top-level metadata matches ``filter``
    (with keys and values bound); ``_matches`` then checks each row exactly.

    Equality follows Python's (``1 == 1.0 == True``), as LangGraph's in-memory saver
    compares; a ``None`` filter value also matches an absent key, as there.
    """
    clauses: list[str] = []
    for n, (key, value) in enumerate(filter.items()):
        if not isinstance(key, str):
            raise ConfigError(f"metadata filter keys must be str, got {type(key).__name__}")
        if not _clean_str(key):
            # stored metadata holds such keys sanitized (U+FFFD), where two keys can
            # collide: narrowing by one could drop a real match. The exact check decides.
            continue
        k, v = f"fk{n}", f"fv{n}"
        params[k] = key
        if value is None:
            clauses.append(f"COALESCE(metadata -> %({k})s, 'null'::jsonb) = 'null'::jsonb")
        elif isinstance(value, (bool, int, float)):
            if isinstance(value, float) and not math.isfinite(value):
                clauses.append("FALSE")  # NaN and infinities equal no JSON value
                continue
            alternatives = [json.dumps(value if isinstance(value, float) else int(value))]
            if value == 1:
                alternatives.append("true")
            elif value == 0:
                alternatives.append("false")
            params[v] = alternatives
            clauses.append(f"metadata -> %({k})s = ANY(%({v})s::jsonb[])")
        elif isinstance(value, str):
            params[v] = json.dumps(_sanitize(value), ensure_ascii=False)
            clauses.append(f"metadata -> %({k})s = %({v})s::jsonb")
        else:
            try:
                text = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"metadata filter value for {key!r} is not JSON: {exc}") from exc
            if has_number(value) or not isinstance(value, (dict, list, tuple)):
                # JSONB compares true and 1 as different; narrow by kind only
                params[v] = "object" if isinstance(value, dict) else "array"
                clauses.append(f"jsonb_typeof(metadata -> %({k})s) = %({v})s")
            else:
                params[v] = json.dumps(_sanitize(json.loads(text)), ensure_ascii=False)
                clauses.append(f"metadata -> %({k})s = %({v})s::jsonb")
    return clauses


def _consume_outcome(task: asyncio.Future[Any]) -> None:
    """Mark a shielded task's exception as seen (its caller may have stopped waiting)."""
    if not task.cancelled():
        task.exception()
