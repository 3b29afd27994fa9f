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
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncConnection, AsyncPipeline, Capabilities
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from langgraph_idem_saver.answer_records import AnswerRecords
from langgraph_idem_saver.backend import CheckpointPut, LedgerStatements, ListPage
from langgraph_idem_saver.group_commit import GroupCommit
from langgraph_idem_saver.import_rows import LangGraphTables
from langgraph_idem_saver.ledger_queries import LedgerSql
from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder
from langgraph_idem_saver.postgres import ledger_sql, sql
from langgraph_idem_saver.postgres.blob_gc import acollect_blobs
from langgraph_idem_saver.postgres.codec import COMPRESS_MIN_BYTES, ZLIB_PREFIX, PostgresCodec
from langgraph_idem_saver.postgres.connection import (
    Conn,
    Cursor,
    PostgresConnection,
    Statement,
    Steps,
    migrate,
    migrate_unless_current,
    single,
)
from langgraph_idem_saver.postgres.delta_history import PostgresDeltaHistory
from langgraph_idem_saver.postgres.import_sql import PostgresTables
from langgraph_idem_saver.postgres.inspect import PostgresInspection
from langgraph_idem_saver.postgres.jsonb import as_text, metadata_columns, metadata_filter
from langgraph_idem_saver.postgres.ledger_store import CLAIM_RETRIES, PostgresLedgerStore
from langgraph_idem_saver.postgres.reconnect import OwnedConnection
from langgraph_idem_saver.postgres.retention import PostgresRetention, mark_ended
from langgraph_idem_saver.retention import TTLConfig
from langgraph_idem_saver.saver_base import IdemSaverBase, check_prune_strategy, checkpoints_to_keep
from langgraph_idem_saver.saver_checkpoints import ListQuery, PageReader
from langgraph_idem_saver.saver_codec import encode_versions, metadata_matches
from langgraph_idem_saver.saver_config import (
    checkpoint_id_of,
    checkpoint_ns_of,
    thread_id_of,
)

# moved with their jobs; importable from here as before
__all__ = ["CLAIM_RETRIES", "COMPRESS_MIN_BYTES", "ZLIB_PREFIX", "AsyncPostgresSaver"]

LIST_PAGE_SIZE = sql.PAGE_BOUND


class AsyncPostgresSaver(
    PostgresLedgerStore,
    PostgresDeltaHistory,
    PostgresCodec,
    PostgresConnection,
    PostgresInspection,
    PostgresRetention,
    AnswerRecords,
    IdemSaverBase,
):
    """Async PostgreSQL checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: a psycopg 3 ``AsyncConnection`` or an ``AsyncConnectionPool`` (opened).
        pipe: an ``AsyncPipeline`` of ``conn`` (single connection only), as LangGraph's
            saver accepts; ``from_conn_string(..., pipeline=True)`` makes one.
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default.
        ttl: retention, applied by ``asweep()``/``sweep()`` (see :class:`TTLConfig`).

    **A transaction of yours** open on your own ``AsyncConnection`` (``async with
    conn.transaction():``, or statements not yet committed on a non-autocommit one),
    decided per call:

    * checkpoint calls (``aget_tuple``, ``alist``, ``aput``, ``aput_writes``) join it,
      as LangGraph's saver's do: committed with it, gone with its rollback;
    * maintenance (``adelete_thread``, ``adelete_for_runs``, ``acopy_thread``,
      ``aprune``) joins it too: it changes rows only, all undone by a rollback, and
      nothing the saver keeps in memory assumes it committed (the list-delta cache
      forgets the threads touched either way). Its thread locks are held until you end
      your transaction;
    * ``setup()`` joins it but is not remembered: a rollback takes the tables with it,
      so calls check the schema again until a ``setup()`` outside it (see :meth:`setup`);
    * the ledger's writes (claims, outcomes, releases, model answers) refuse it with
      :class:`ConfigError`, nothing sent: a claim must be committed before its tool runs;
    * a transaction of yours that has *failed* makes every call raise
      :class:`ConfigError` (roll it back), never psycopg's ``InFailedSqlTransaction``;
    * a call inside it refused on a lock, a conflict or a timeout raises
      :class:`DatabaseLockedError` / :class:`StatementTimeoutError` saying your
      transaction is aborted: roll it back, then retry.

    A pool's connections and the one ``from_conn_string`` opens hold no transaction of
    yours. (The sync ``PostgresSaver`` refuses what runs on its loop - setup, the ledger,
    maintenance - inside a transaction of yours: ``postgres/borrowed.py``.)
    """

    _sql: ClassVar[LedgerStatements] = LedgerSql(ledger_sql)
    _list_page_size = LIST_PAGE_SIZE

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

        ``pipeline=True`` runs the connection in pipeline mode, as LangGraph's does. The
        saver owns this connection: one lost (a server restart) is replaced by a new one
        at the next call (``postgres/reconnect.py``), and the block's end writes the
        outcomes it still holds (``held_outcomes.py``) before closing it.
        """
        ttl = TTLConfig.of(ttl)  # refused before connecting
        owned = OwnedConnection(conn_string, pipeline=pipeline)
        conn, pipe = await owned.open()
        try:
            saver = cls(conn, pipe=pipe, serde=serde, ttl=ttl)
            saver._owned = owned
            await saver.setup()
            try:
                yield saver
            finally:
                await saver._write_held_at_close()
                saver._owned = None  # closed for good with the block: never reopened
        finally:
            await owned.aclose()

    # --- plumbing -------------------------------------------------------------------

    async def setup(self) -> None:
        """Create or migrate the tables (idempotent; also runs on first use).

        Inside a transaction of yours open on your own ``AsyncConnection``, the
        migrations join it (a savepoint, committed with it) and the saver does *not*
        count itself set up: your transaction may still roll back, taking the tables with
        it. Each later call then checks the schema again until a ``setup()`` runs
        outside a transaction of yours, as every call's does on first use. On a schema
        already current it takes no migration lock, which would be held until your
        transaction ends and hold every other saver's ``setup()`` back; one that
        migrates does hold it until then.
        """
        if not self.is_setup and self._users_transaction_open():
            self._remember_loop()
            # joined, so not remembered; no migration lock held for the user's
            # transaction when there is nothing to migrate
            await self._execute(migrate_unless_current, tx=True)
            return
        await super().setup()

    async def _setup_once(self) -> None:
        """Apply pending migrations (``setup()``).

        One transaction under ``pg_advisory_xact_lock``, so workers starting together
        migrate once. Raises :class:`SchemaVersionError` for a database written by a
        newer release.
        """
        await self._execute(migrate, tx=True)

    def _langgraph_tables(self) -> LangGraphTables:
        """LangGraph's own Postgres tables on this connection's ``search_path``, for
        ``import_langgraph``."""
        return PostgresTables(self)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint (latest of the thread/namespace, or by id), one round trip."""
        statement = self._tuple_statement(config)
        return self._tuple_of(await self._read_steps(lambda: single(statement)))

    # Each checkpoint call is built here as a Statement (or Steps) and decoded here; only
    # running it differs between this saver and PostgresSaver's direct path.

    def _tuple_statement(self, config: RunnableConfig) -> Statement:
        """``aget_tuple``'s statement (the config validated at once)."""
        thread_id = as_text(thread_id_of(config), "thread_id")
        ns = as_text(checkpoint_ns_of(config), "checkpoint_ns")
        checkpoint_id = checkpoint_id_of(config)
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns, "checkpoint_id": None}
        if checkpoint_id:
            params["checkpoint_id"] = as_text(checkpoint_id, "checkpoint_id")
        return Statement(sql.SELECT_TUPLE_CALL, params, "one")

    def _tuple_of(self, row: TupleRow | None) -> CheckpointTuple | None:
        """``aget_tuple``'s result from its statement's row."""
        return None if row is None else self._row_to_tuple(row, loading=True)

    def _list_pages(self, query: ListQuery) -> PageReader:
        """Pages newest first, a statement each (no connection held between)."""
        page_steps = self._list_page_steps(query)

        async def read_page(after: tuple[str, str, str] | None, size: int) -> ListPage:
            return await self._read_steps(lambda: page_steps(after, size))

        return read_page

    def _list_page_steps(
        self, query: ListQuery
    ) -> Callable[[tuple[str, str, str] | None, int], Steps[ListPage]]:
        """How to read each page of ``query`` (validated at once): its statement, after
        the key of the previous page's last row, and its decoding."""
        clauses: list[str] = []
        params: dict[str, Any] = {}
        for column, name, value in (
            ("thread_id", "thread_id", query.thread_id),
            ("checkpoint_ns", "ns", query.ns),
            ("checkpoint_id", "checkpoint_id", query.checkpoint_id),
        ):
            if value is not None:
                clauses.append(f"{column} = %({name})s")
                params[name] = value
        filter = query.filter
        if filter:
            clauses += metadata_filter(filter, params)
        if query.before_id is not None:
            clauses.append("checkpoint_id < %(before)s")
            params["before"] = query.before_id
        if query.ns is not None:
            after_clause = sql.LIST_AFTER_IN_NS
        elif query.thread_id is not None:
            after_clause = sql.LIST_AFTER_IN_THREAD
        else:
            after_clause = sql.LIST_AFTER

        # get_state_history's shape (one namespace of a thread, no filter) goes through
        # idem_list_in_ns, whose cached plans cannot scan (sql.LIST_IN_NS_FUNCTION). The
        # other shapes (a whole thread, a metadata filter, every thread, one checkpoint)
        # are sent unprepared: their text varies with the filter, and a generic plan
        # cached while the tables were small would scan them after they grew.
        in_ns = (
            query.thread_id is not None
            and query.ns is not None
            and query.checkpoint_id is None
            and not filter
        )

        def page_steps(after: tuple[str, str, str] | None, size: int) -> Steps[ListPage]:
            if in_ns:
                bounds = [b for b in (query.before_id, after and after[0]) if b is not None]
                q = sql.SELECT_LIST_IN_NS_CALL
                args: dict[str, Any] = {**params, "limit": size}
                args["upper"] = min(bounds) if bounds else None
            else:
                where = list(clauses)
                args = {**params, "limit": size}
                if after is not None:
                    where.append(after_clause)
                    args.update(c_id=after[0], c_thread=after[1], c_ns=after[2])
                q = sql.SELECT_TUPLES.format(
                    where=("WHERE " + " AND ".join(where)) if where else "",
                    limit=sql.LIST_LIMIT,
                )
            rows: list[TupleRow] = yield Statement(q, args, "all", prepare=None if in_ns else False)
            last = (rows[-1][2], rows[-1][0], rows[-1][1]) if rows else None
            # decoded as yielded; SQL only narrows, Python equality decides
            tuples = (
                tup
                for tup in map(self._row_to_tuple, rows)
                if not filter or metadata_matches(dict(tup.metadata), filter)
            )
            return ListPage(len(rows), last, tuples)

        return page_steps

    # --- writes --------------------------------------------------------------------

    async def _put_checkpoint(self, put: CheckpointPut) -> list[EncodedBlob]:
        """One statement, one round trip (a second when a delta's base is gone); encoded
        once, run again on a fresh connection if the first one is lost (_write_steps)."""
        args = self._put_args(put)
        return await self._write_steps(lambda: self._put_rounds(*args))

    def _put_steps(self, put: CheckpointPut) -> Steps[list[EncodedBlob]]:
        """``_put_checkpoint``'s statements; validated and encoded at once."""
        return self._put_rounds(*self._put_args(put))

    def _put_args(self, put: CheckpointPut) -> tuple[str, str, list[EncodedBlob], tuple[Any, ...]]:
        """What ``_put_rounds`` writes: validated and encoded (once a put)."""
        thread_id, ns, checkpoint = put.thread_id, put.ns, put.checkpoint
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]
        for channel in put.new_versions:
            if channel in values:
                as_text(channel, "channel")
        # an emptied channel (not in values) gets no row: it reads back absent, as
        # "empty" does; the encoder still sees it, to forget the channel's last version
        blobs = self._deltas.encode(self.serde, thread_id, ns, values, put.new_versions)
        run_id = put.metadata.get("run_id")
        metadata_json, metadata_exact = metadata_columns(put.metadata)
        checkpoint_params = (
            thread_id,
            ns,
            as_text(checkpoint["id"], "checkpoint id"),
            put.parent_id,
            None if run_id is None else str(run_id),
            *self._dump(stored),
            metadata_json,
            metadata_exact,
            encode_versions(checkpoint["channel_versions"]),
        )
        return thread_id, ns, blobs, checkpoint_params

    def _put_rounds(
        self, thread_id: str, ns: str, blobs: list[EncodedBlob], checkpoint_params: tuple[Any, ...]
    ) -> Steps[list[EncodedBlob]]:
        """The put statement; at most twice: a second stores the deltas whose base is gone
        whole. The blobs as stored."""
        rows = blobs
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
            if deltas:  # idem_missing_bases' argument, between the rows and the checkpoint
                bases = [
                    (thread_id, ns, b.channel, b.base_version)
                    for b in stored_rows
                    if b.base_version is not None
                ]
                params.append(sql.delta_bases_json(bases))
            params += checkpoint_params
            query = sql.put_checkpoint_sql(len(stored_rows), deltas)
            found = yield Statement(query, params, "all" if deltas else "none")
            missing = {r[0] for r in found or ()}
            if not missing:
                return rows
            rows = [self._deltas.whole(self.serde, b) if b.channel in missing else b for b in rows]

    async def _insert_writes(self, rows: list[tuple[Any, ...]]) -> None:
        statement = self._writes_statement(rows)
        await self._write_steps(lambda: single(statement))

    @staticmethod
    def _writes_statement(rows: list[tuple[Any, ...]]) -> Statement:
        """``_insert_writes``'s statement."""
        params = [value for row in rows for value in row]
        return Statement(sql.put_writes_sql(len(rows)), params)

    # --- thread maintenance ----------------------------------------------------------
    #
    # Sent unprepared (prepare=False): planned on each call for the tables as they are.
    # Prepared, PostgreSQL caches a generic plan after five executions, and one built
    # while the tables were small scans them whole once they have grown (until their
    # next ANALYZE). These calls are rare, so planning them (well under 1 ms) is cheap;
    # the per-step calls get the same safety from functions (sql.py, migrations 7-12).

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, writes, blobs and settled ledger entries (its
        ``issued`` ones stay: docs/guarantees.md, "Lifecycle"): one statement, under the
        thread's lock (so an aput writing a delta at the same time either
        committed before and is deleted too, or finds its base gone and writes whole)."""
        tid = str(thread_id)

        async def delete(cur: Cursor) -> None:
            await cur.execute(sql.LOCK_THREADS, {"threads": [tid]}, prepare=False)
            await cur.execute(sql.DELETE_THREAD, {"t": tid}, prepare=False)
            await mark_ended(cur, [tid], "adelete_thread")  # what it kept: retention.ENDED

        await self._run(delete, tx=True, pipeline=True)
        self._deltas.forget([tid])

    async def _delete_runs(self, run_ids: list[str]) -> None:
        async def delete(cur: Cursor) -> None:
            await cur.execute(sql.SELECT_THREADS_OF_RUNS, {"runs": run_ids}, prepare=False)
            locked = [r[0] for r in await cur.fetchall()]
            if not locked:
                return
            # the threads' locks before anything is deleted: see sql.THREAD_LOCK_SPACE
            await cur.execute(sql.LOCK_THREADS, {"threads": locked}, prepare=False)
            await cur.execute(sql.DELETE_RUNS, {"runs": run_ids, "threads": locked}, prepare=False)
            threads = [r[0] for r in await cur.fetchall()]
            if threads:
                await acollect_blobs(cur, threads)

        await self._run(delete, tx=True)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history, and its thread-scoped ledger entries."""
        params = {"src": str(source_thread_id), "dst": str(target_thread_id)}

        async def copy(cur: Cursor) -> None:
            await cur.execute(sql.COPY_THREAD, params, prepare=False)

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
            await cur.execute(sql.LOCK_THREADS, {"threads": threads}, prepare=False)
            await cur.execute(sql.PRUNE_DELETE, {"threads": threads}, prepare=False)

        async def keep_latest(cur: Cursor) -> None:
            await cur.execute(sql.LOCK_THREADS, {"threads": threads}, prepare=False)
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
            await cur.execute(sql.SELECT_HEADS, (thread_id,), prepare=False)
            keep_ns: list[str] = []
            keep_ids: list[str] = []
            heads = await cur.fetchall()
            for ns, head_id, parent_id, counters in heads:
                keep = [head_id]
                if counters:  # a DeltaChannel: keep the ancestors it replays from
                    await cur.execute(sql.SELECT_LINEAGE, (thread_id, ns), prepare=False)
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
                prepare=False,
            )
        await acollect_blobs(cur, list(threads))
