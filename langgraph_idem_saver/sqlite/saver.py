"""``AsyncSqliteSaver``: LangGraph checkpoints and the tool-call ledger in one SQLite file.

A drop-in for ``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver`` (same name, same
constructor, same ``from_conn_string``), with these differences that matter in
production:

* **One hand-off per call.** aiosqlite runs every statement in a worker thread; each
  hop costs 100-300 µs. Every method here ships *one* function to that thread that does
  all its SQL (and the commit, and for reads the decoding) in one go. Because the worker
  runs one function at a time, each call is also naturally serialized: no asyncio lock.
* **O(N) storage.** Channel values live in ``idem_blobs``, written only for
  ``new_versions``; a checkpoint row holds no channel values.
* **Durable by default.** WAL with ``synchronous=FULL``: a committed ``issued`` ledger row
  survives power loss, which the at-most-once promise depends on (claims are synced
  whatever the setting). ``synchronous="NORMAL"`` is faster and still crash-safe for the
  process, but the last transactions before a power loss or OS crash may roll back. An
  outcome's own commit is never synced: the step's checkpoint write carries it to disk
  (see docs/guarantees.md, "Durability of a commit").
* **Bound parameters only.** Metadata filters go through ``json_each`` with the key and
  value bound, never interpolated (CVE-2025-67644); a dotted key also names a nested
  value, as in LangGraph's ``SqliteSaver`` (``sqlite/metadata_filter.py``).
* **Typed errors.** Locked database, closed connection, not-a-database, newer schema,
  corrupt rows: each its own exception from :mod:`langgraph_idem_saver.errors`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from operator import attrgetter
from typing import Any, ClassVar, TypeVar

import aiosqlite
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from typing_extensions import TypedDict, Unpack

from langgraph_idem_saver.answer_records import AnswerRecords
from langgraph_idem_saver.backend import CheckpointPut, LedgerStatements, ListPage
from langgraph_idem_saver.group_commit import GroupCommit
from langgraph_idem_saver.import_rows import LangGraphTables
from langgraph_idem_saver.ledger_queries import LedgerSql
from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder
from langgraph_idem_saver.retention import TTLConfig
from langgraph_idem_saver.saver_base import IdemSaverBase, check_prune_strategy, checkpoints_to_keep
from langgraph_idem_saver.saver_checkpoints import ListQuery, PageReader
from langgraph_idem_saver.saver_codec import (
    encode_metadata,
    encode_versions,
)
from langgraph_idem_saver.saver_config import (
    checkpoint_id_of,
    checkpoint_ns_of,
    storable_text,
    thread_id_of,
)
from langgraph_idem_saver.sqlite import metadata_filter, runner, sql
from langgraph_idem_saver.sqlite.blob_gc import collect_blobs
from langgraph_idem_saver.sqlite.connection import (
    ConnectionLock,
    SqliteConnection,
    Synchronous,
    Write,
    read_tx,
)
from langgraph_idem_saver.sqlite.delta_history import SqliteDeltaHistory
from langgraph_idem_saver.sqlite.files import (
    SqliteTarget,
    parse_target,
)
from langgraph_idem_saver.sqlite.import_sql import SqliteTables
from langgraph_idem_saver.sqlite.inspect import SqliteInspection
from langgraph_idem_saver.sqlite.ledger_store import SqliteLedgerStore
from langgraph_idem_saver.sqlite.reads import (
    Fetched,
    decode_metadata,
    decode_page,
    decode_tuple,
    fetch_page,
    fetch_tuple,
)
from langgraph_idem_saver.sqlite.retention import SqliteRetention, mark_ended

T = TypeVar("T")

# moved with their jobs; importable from here as before
__all__ = ["AsyncSqliteSaver", "SqliteOptions", "Synchronous"]

LIST_PAGE_SIZE = 100
# a blob's columns of UPSERT_BLOB after the thread and namespace, read in one call
_BLOB_COLUMNS = attrgetter("channel", "version", "type", "data", "base_version")
# for the key after which a page starts and its size, the read of that page
PageBodies = Callable[[tuple[str, str, str] | None, int], Callable[[sqlite3.Connection], ListPage]]


class SqliteOptions(TypedDict, total=False):
    """A SQLite saver's keyword arguments (``AsyncSqliteSaver``'s, which says what each
    does), as ``from_conn_string`` and the sync ``SqliteSaver`` pass them on."""

    serde: SerializerProtocol | None
    synchronous: Synchronous
    busy_timeout: float
    ttl: TTLConfig | Mapping[str, Any] | None


class AsyncSqliteSaver(
    SqliteLedgerStore,
    SqliteDeltaHistory,
    SqliteConnection,
    SqliteInspection,
    SqliteRetention,
    AnswerRecords,
    IdemSaverBase,
):
    """Async SQLite checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: an ``aiosqlite.Connection`` (opened or not yet awaited).
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default
            (``EncryptedSerializer`` works and also encrypts ledger results).
        synchronous: SQLite's ``synchronous`` setting. ``"FULL"`` (default) makes every
            checkpoint commit durable across power loss; ``"NORMAL"`` trades that for
            speed. Claims are synced and outcomes are not, whatever the setting (but
            ``"EXTRA"``, which syncs every commit).
        busy_timeout: seconds to wait for another process's write lock before raising
            :class:`DatabaseLockedError`.
        ttl: retention, applied by ``asweep()``/``sweep()`` (see :class:`TTLConfig`).
    """

    _sql: ClassVar[LedgerStatements] = LedgerSql(sql)
    _list_page_size = LIST_PAGE_SIZE

    def __init__(
        self,
        conn: aiosqlite.Connection,
        *,
        serde: SerializerProtocol | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(serde=serde)
        self.ttl = TTLConfig.of(ttl)
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ValueError(f"synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self.conn = conn
        self.synchronous = synchronous
        self.busy_timeout = busy_timeout
        # held by every function running on the connection, on whatever thread
        self._conn_lock = ConnectionLock()
        self._deltas = ListDeltaEncoder()
        # concurrent writes share one transaction and one fsync (group_commit.py)
        self._group: GroupCommit[Write, tuple[bool, Any]] = GroupCommit(self._commit)
        # the file behind conn (for errors naming it); found on setup() if not given
        self._target: SqliteTarget | None = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls, conn_string: str, **options: Unpack[SqliteOptions]
    ) -> AsyncIterator[AsyncSqliteSaver]:
        """Open ``conn_string`` (a path, ``:memory:`` or a ``file:`` URI) for the block,
        with the constructor's keyword arguments (``options``).

        Refuses at once, naming the path: a missing directory or a directory
        (:class:`ConfigError`, nothing created); a database this process cannot write
        (:class:`ReadOnlyDatabaseError`) unless it is opened read-only on purpose
        (``file:...?mode=ro``, where writes raise it instead); a file that is not SQLite
        (:class:`NotADatabaseError`).
        """
        options["ttl"] = TTLConfig.of(options.get("ttl"))  # refused before anything is opened
        uri = conn_string.startswith("file:")
        # check_same_thread=False: the sync SqliteSaver runs its checkpoint reads and
        # writes from its callers' threads (holding the connection lock)
        conn = aiosqlite.connect(
            conn_string, isolation_level=None, uri=uri, check_same_thread=False
        )
        saver = cls(conn, **options)
        saver._target = parse_target(conn_string, uri)
        try:
            await saver.setup()
            yield saver
        finally:
            await conn.close()
            runner.join_worker(conn)

    def _langgraph_tables(self) -> LangGraphTables:
        """LangGraph's own SQLite tables in this file, for ``import_langgraph``."""
        return SqliteTables(self)

    # --- reads ---------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._run(self._get_tuple_body(config))

    def _get_tuple_body(
        self, config: RunnableConfig
    ) -> Callable[[sqlite3.Connection], CheckpointTuple | None]:
        """``aget_tuple``'s read (in one read transaction), to run on the connection."""
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)

        def read(conn: sqlite3.Connection) -> Fetched | None:
            if checkpoint_id:
                row = conn.execute(
                    sql.SELECT_CHECKPOINT_BY_ID, (thread_id, ns, checkpoint_id)
                ).fetchone()
            else:
                row = conn.execute(sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns)).fetchone()
            return None if row is None else fetch_tuple(conn, row)

        def body(conn: sqlite3.Connection) -> CheckpointTuple | None:
            fetched = read_tx(conn, read)
            return None if fetched is None else decode_tuple(fetched, self.serde, self._deltas)

        return body

    def _list_pages(self, query: ListQuery) -> PageReader:
        """Pages newest first, each one worker trip (no lock held between)."""
        page_body = self._list_page_bodies(query)

        async def read_page(after: tuple[str, str, str] | None, size: int) -> ListPage:
            return await self._run(page_body(after, size))

        return read_page

    def _list_page_bodies(self, query: ListQuery) -> PageBodies:
        """The reads of ``query``'s pages (validated at once): for the key after which a
        page starts and its size, the read of that page (one read transaction)."""
        clauses: list[str] = []
        params: list[Any] = []
        for column, value in (
            ("thread_id", query.thread_id),
            ("checkpoint_ns", query.ns),
            ("checkpoint_id", query.checkpoint_id),
        ):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        filter = query.filter
        if filter:
            fclauses, fparams = metadata_filter.narrowing(filter)
            clauses += fclauses
            params += fparams
        if query.before_id is not None:
            clauses.append("checkpoint_id < ?")
            params.append(query.before_id)

        def read(
            conn: sqlite3.Connection, after: tuple[str, str, str] | None, size: int
        ) -> tuple[int, tuple[str, str, str] | None, list[Fetched]]:
            where = clauses + ([sql.LIST_AFTER] if after else [])
            q = sql.LIST_SELECT
            if where:
                q += " WHERE " + " AND ".join(where)
            q += sql.LIST_ORDER
            rows = conn.execute(q, (*params, *(after or ()), size)).fetchall()
            last = (rows[-1][2], rows[-1][0], rows[-1][1]) if rows else None
            fetched = len(rows)
            if filter:  # SQL only narrows; this decides (metadata_filter.py's rule)
                rows = [
                    r for r in rows if metadata_filter.metadata_matches(_metadata_of(r), filter)
                ]
            return fetched, last, fetch_page(conn, rows)

        def page_body(
            after: tuple[str, str, str] | None, size: int
        ) -> Callable[[sqlite3.Connection], ListPage]:
            def body(conn: sqlite3.Connection) -> ListPage:
                fetched, last, rows = read_tx(conn, partial(read, after=after, size=size))
                return ListPage(fetched, last, decode_page(rows, self.serde, self._deltas.copies))

            return body

        return page_body

    # --- writes --------------------------------------------------------------------

    async def _put_checkpoint(self, put: CheckpointPut) -> list[EncodedBlob]:
        return await self._write(self._put_body(put))

    def _put_body(self, put: CheckpointPut) -> Callable[[sqlite3.Connection], list[EncodedBlob]]:
        """Validate and encode ``put`` (here, before any lock), and the write body storing
        it; the body returns the blobs as stored."""
        thread_id, ns, checkpoint = put.thread_id, put.ns, put.checkpoint
        new_versions = put.new_versions
        # storable_text's own test inline (an ASCII id needs no more)
        if not checkpoint["id"].isascii():
            storable_text(checkpoint["id"], "checkpoint id")
        for channel in new_versions:  # ids too: a raw UnicodeEncodeError otherwise
            if not channel.isascii():
                storable_text(channel, "channel")
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]
        serde = self.serde
        blobs = self._deltas.encode(serde, thread_id, ns, values, new_versions)
        type_, data = serde.dumps_typed(stored)
        run_id = put.metadata.get("run_id")
        row = (
            thread_id,
            ns,
            checkpoint["id"],
            put.parent_id,
            None if run_id is None else str(run_id),
            type_,
            data,
            encode_metadata(put.metadata),
            encode_versions(checkpoint["channel_versions"]),
        )
        # the statement's rows built here, before the lock; only a delta's base is probed
        head: tuple[Any, ...] = (thread_id, ns)
        params = list(map(head.__add__, map(_BLOB_COLUMNS, blobs)))
        deltas = [
            (i, (thread_id, ns, p[2], base))
            for i, p in enumerate(params)
            if (base := p[6]) is not None
        ]

        def write(conn: sqlite3.Connection) -> list[EncodedBlob]:
            rows, args = blobs, params
            for i, key in deltas:
                if conn.execute(sql.BLOB_EXISTS, key).fetchone() is None:
                    # its base is gone (pruned, deleted): the value is stored whole
                    if rows is blobs:
                        rows, args = list(blobs), list(params)
                    b = rows[i] = self._deltas.whole(self.serde, blobs[i])
                    args[i] = (thread_id, ns, b.channel, b.version, b.type, b.data, None)
            if args:
                conn.executemany(sql.UPSERT_BLOB, args)
            conn.execute(sql.UPSERT_CHECKPOINT, row)
            return rows

        return write

    async def _insert_writes(self, rows: list[tuple[Any, ...]]) -> None:
        await self._write(self._writes_body(rows))

    @staticmethod
    def _writes_body(rows: list[tuple[Any, ...]]) -> Callable[[sqlite3.Connection], None]:
        """The write body storing ``aput_writes``' rows."""

        def write(conn: sqlite3.Connection) -> None:
            conn.executemany(sql.UPSERT_WRITE, rows)

        return write

    # --- thread maintenance ----------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, writes, blobs and settled ledger entries (its
        ``issued`` ones stay: docs/guarantees.md, "Lifecycle")."""
        tid = str(thread_id)

        def delete(conn: sqlite3.Connection) -> None:
            for statement in sql.DELETE_THREAD:
                conn.execute(statement, (tid,))
            mark_ended(conn, [tid], "adelete_thread")  # what it kept: retention.ENDED

        await self._write(delete)
        self._deltas.forget([tid])

    async def _delete_runs(self, run_ids: list[str]) -> None:
        def delete(conn: sqlite3.Connection) -> None:
            threads: set[str] = set()
            for run_id in run_ids:
                for thread_id, ns, checkpoint_id in conn.execute(
                    sql.SELECT_CHECKPOINTS_OF_RUN, (run_id,)
                ).fetchall():
                    threads.add(thread_id)
                    conn.execute(sql.DELETE_WRITES_OF_CHECKPOINT, (thread_id, ns, checkpoint_id))
                    conn.execute(sql.DELETE_CHECKPOINT, (thread_id, ns, checkpoint_id))
            for thread_id in threads:
                collect_blobs(conn, thread_id)

        await self._write(delete)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy a thread's whole history, and its thread-scoped ledger entries."""
        src, dst = str(source_thread_id), str(target_thread_id)

        def copy(conn: sqlite3.Connection) -> None:
            for statement in sql.COPY_THREAD:
                conn.execute(statement, (dst, src))
            conn.execute(sql.COPY_TOOL_CALLS, (dst, dst, src, src))

        await self._write(copy)
        self._deltas.forget([dst])

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """Prune checkpoints; ledger entries are always kept (pruning must not cause re-runs).

        ``keep_latest`` keeps the newest checkpoint of each namespace with its writes;
        ``delete`` removes every checkpoint of the threads.
        """
        check_prune_strategy(strategy)
        ids = [str(t) for t in thread_ids]
        await self._write(lambda conn: self._prune_rows(conn, ids, strategy))
        self._deltas.forget(ids)

    @staticmethod
    def _prune_rows(conn: sqlite3.Connection, ids: Sequence[str], strategy: str) -> None:
        """``aprune``'s transaction body (retention's ``keep_latest`` reuses it)."""
        for thread_id in ids:
            if strategy == "delete":
                conn.execute(sql.DELETE_CHECKPOINTS_OF_THREAD, (thread_id,))
                conn.execute(sql.DELETE_WRITES_OF_THREAD, (thread_id,))
                conn.execute(sql.DELETE_BLOBS_OF_THREAD, (thread_id,))
                continue
            keep: set[tuple[str, str]] = set()
            for ns, head_id in conn.execute(sql.SELECT_HEADS, (thread_id,)).fetchall():
                read = partial(_parent_and_metadata, conn, thread_id, ns)
                keep.update((ns, cid) for cid in checkpoints_to_keep(head_id, read))
            for ns, checkpoint_id in conn.execute(
                sql.SELECT_CHECKPOINT_KEYS, (thread_id,)
            ).fetchall():
                if (ns, checkpoint_id) not in keep:
                    conn.execute(sql.DELETE_WRITES_OF_CHECKPOINT, (thread_id, ns, checkpoint_id))
                    conn.execute(sql.DELETE_CHECKPOINT, (thread_id, ns, checkpoint_id))
            collect_blobs(conn, thread_id)


def _metadata_of(row: Sequence[Any]) -> dict[str, Any]:
    """The decoded metadata of a ``CHECKPOINT_COLUMNS`` row."""
    thread_id, ns, checkpoint_id = row[0], row[1], row[2]
    return decode_metadata(
        row[6], thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
    )


def _parent_and_metadata(
    conn: sqlite3.Connection, thread_id: str, ns: str, checkpoint_id: str
) -> tuple[str | None, dict[str, Any]] | None:
    row = conn.execute(sql.SELECT_PARENT_AND_METADATA, (thread_id, ns, checkpoint_id)).fetchone()
    if row is None:
        return None
    return row[0], decode_metadata(
        row[1], thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
    )
