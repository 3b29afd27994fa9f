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
  survives power loss, which the at-most-once promise depends on. ``synchronous="NORMAL"``
  is faster and still crash-safe for the process, but the last transactions before a
  power loss or OS crash may roll back (see docs/guarantees.md).
* **Bound parameters only.** Metadata filters go through ``json_each`` with the key and
  value bound, never interpolated (CVE-2025-67644).
* **Typed errors.** Locked database, closed connection, not-a-database, newer schema,
  corrupt rows: each its own exception from :mod:`langgraph_idem_saver.errors`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from functools import partial
from typing import Any, ClassVar, Literal, TypeVar, cast

import aiosqlite
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

from langgraph_idem_saver.backend import Claims, Guarded, LedgerStatements
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    DatabaseLockedError,
    IdemSaverError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
)
from langgraph_idem_saver.group_commit import GroupCommit
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry
from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder, resolve_value
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
from langgraph_idem_saver.sqlite import runner, sql
from langgraph_idem_saver.sqlite.files import (
    SqliteTarget,
    error_kind,
    open_error,
    parse_target,
    read_only_error,
    read_only_reason,
    target_of_connection,
)
from langgraph_idem_saver.sqlite.inspect import SqliteInspection
from langgraph_idem_saver.sqlite.retention import SqliteRetention
from langgraph_idem_saver.surrogates import utf8_ok

T = TypeVar("T")
Synchronous = Literal["FULL", "NORMAL", "EXTRA"]
# a write for the group commit: its body, and whether it must be synced (a claim)
_Write = tuple[Callable[[sqlite3.Connection], Any], bool]

LIST_PAGE_SIZE = 100


def _write_tx(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
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


def _read_tx(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> T:
    """Run ``body``'s SELECTs in one read transaction: a consistent snapshot."""
    own = not conn.in_transaction
    if own:
        conn.execute("BEGIN")
    try:
        return body(conn)
    finally:
        if own and conn.in_transaction:
            conn.commit()


def _metadata_filter(filter: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """SQL conditions that *narrow* rows by top-level metadata keys (keys and values bound,
    never interpolated). They may let through rows that do not match - the exact check is
    :func:`metadata_matches` in Python - but never drop one that does."""
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in filter.items():
        if not isinstance(key, str):
            raise ConfigError(f"metadata filter keys must be str, got {type(key).__name__}")
        if value is None or not _bindable(key) or (isinstance(value, str) and not _bindable(value)):
            # json_each cuts keys at NUL, SQLite cannot take text with lone surrogates, and
            # None also matches an absent key: these are left to the exact check in
            # Python, never narrowed (a narrowing must not drop a real match)
            continue
        exists = "EXISTS (SELECT 1 FROM json_each(metadata) AS j WHERE j.key = ? AND {})"
        if isinstance(value, (bool, int, float)):
            clauses.append(
                exists.format("j.type IN ('integer', 'real', 'true', 'false') AND j.value = ?")
            )
            params += [key, float(value) if isinstance(value, float) else int(value)]
        elif isinstance(value, str):
            clauses.append(exists.format("j.type = 'text' AND j.value = ?"))
            params += [key, value]
        else:
            try:
                text = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"metadata filter value for {key!r} is not JSON: {exc}") from exc
            kind = "object" if isinstance(value, dict) else "array"
            if not utf8_ok(text) or has_number(value):
                # lone surrogates (not bindable), or numbers and bools, which Python
                # equates across types ([1] == [True]) and JSON text does not: narrow by
                # kind only, the exact check decides
                clauses.append(exists.format("j.type = ?"))
                params += [key, kind]
                continue
            clauses.append(
                exists.format("j.type IN ('object', 'array') AND json(j.value) = json(?)")
            )
            params += [key, text]
    return clauses, params


def _bindable(text: str) -> bool:
    """Whether ``text`` can narrow a filter in SQL: bindable, and without NUL."""
    return "\x00" not in text and utf8_ok(text)


class AsyncSqliteSaver(SqliteInspection, SqliteRetention, IdemSaverBase):
    """Async SQLite checkpointer and tool-call ledger (see the module docstring).

    Args:
        conn: an ``aiosqlite.Connection`` (opened or not yet awaited).
        serde: any ``SerializerProtocol``; LangGraph's ``JsonPlusSerializer`` by default
            (``EncryptedSerializer`` works and also encrypts ledger results).
        synchronous: SQLite's ``synchronous`` setting. ``"FULL"`` (default) makes every
            commit durable across power loss; ``"NORMAL"`` trades that for speed.
        busy_timeout: seconds to wait for another process's write lock before raising
            :class:`DatabaseLockedError`.
        ttl: retention, applied by ``asweep()``/``sweep()`` (see :class:`TTLConfig`).
    """

    _sql: ClassVar[LedgerStatements] = sql

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
        self._deltas = ListDeltaEncoder()
        # concurrent writes share one transaction and one fsync (group_commit.py)
        self._group: GroupCommit[_Write, tuple[bool, Any]] = GroupCommit(self._commit)
        # the file behind conn (for errors naming it); found on setup() if not given
        self._target: SqliteTarget | None = None

    @classmethod
    @asynccontextmanager
    async def from_conn_string(
        cls,
        conn_string: str,
        *,
        serde: SerializerProtocol | None = None,
        synchronous: Synchronous = "FULL",
        busy_timeout: float = 5.0,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
    ) -> AsyncIterator[AsyncSqliteSaver]:
        """Open ``conn_string`` (a path, ``:memory:`` or a ``file:`` URI) for the block.

        Refuses at once, naming the path: a missing directory or a directory
        (:class:`ConfigError`, nothing created); a database this process cannot write
        (:class:`ReadOnlyDatabaseError`) unless it is opened read-only on purpose
        (``file:...?mode=ro``, where writes raise it instead); a file that is not SQLite
        (:class:`NotADatabaseError`).
        """
        ttl = TTLConfig.of(ttl)  # refused before anything is opened
        uri = conn_string.startswith("file:")
        conn = aiosqlite.connect(conn_string, isolation_level=None, uri=uri)
        saver = cls(conn, serde=serde, synchronous=synchronous, busy_timeout=busy_timeout, ttl=ttl)
        saver._target = parse_target(conn_string, uri)
        try:
            await saver.setup()
            yield saver
        finally:
            await conn.close()

    # --- plumbing -------------------------------------------------------------------

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
        found = _read_tx(conn, schema_version)
        if found < sql.SCHEMA_VERSION:
            try:
                _write_tx(conn, migrate)
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
        """Ship ``fn`` to the aiosqlite worker thread: one hand-off, typed errors."""
        conn = self.conn
        if not runner.is_started(conn):
            raise ConnectionClosedError(
                "the aiosqlite connection is closed (or was never opened); open a new one "
                "and create a new saver, e.g. `async with AsyncSqliteSaver.from_conn_string(...)`"
            )
        try:
            return await runner.run_in_worker(conn, fn)
        except IdemSaverError:
            raise
        except (ValueError, sqlite3.Error) as exc:
            typed = _typed_error(exc, self.busy_timeout, self._target)
            if typed is exc:
                raise
            raise typed from exc

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        await self.setup()
        return await self._call(fn)

    async def _write(
        self, body: Callable[[sqlite3.Connection], T], *, before_tool_runs: bool = False
    ) -> T:
        """Run ``body`` in a write transaction, committed before this returns.

        Writes that arrive while another is being committed are **group-committed**: one
        worker hand-off, one transaction and one fsync for all of them, each body in its
        own SAVEPOINT so a failing one is rolled back alone. The parallel tool tasks of a
        step (``create_react_agent`` v2 sends one task per call) then share their claims'
        commit, and checkpoint writes share theirs.

        A transaction holding a claim (``before_tool_runs``: the ``issued`` row that lets
        a tool run, first or again) is committed with at least ``synchronous=FULL``
        whatever the setting: at-most-once rests on that row surviving power loss. Other
        writes follow the setting; losing a ``completed`` row to a power cut leaves the
        call ``issued``: an unknown outcome, verified, never silently re-run.
        """
        await self.setup()
        ok, value = await self._group.submit((body, before_tool_runs))
        if ok:
            return cast(T, value)
        if isinstance(value, (ValueError, sqlite3.Error)) and not isinstance(value, IdemSaverError):
            raise _typed_error(value, self.busy_timeout, self._target) from value
        raise value

    async def _commit(self, batch: list[_Write]) -> list[tuple[bool, Any]]:
        """One transaction for a group of writes: per write, (True, its result) or
        (False, its exception), each rolled back alone (a savepoint each when several)."""
        force_full = self.synchronous == "NORMAL" and any(synced for _, synced in batch)

        def run(conn: sqlite3.Connection) -> list[tuple[bool, Any]]:
            if force_full:
                conn.execute("PRAGMA synchronous = FULL")
            try:
                if len(batch) == 1:  # alone in its transaction: no savepoint needed
                    return _write_tx(conn, lambda c: [_alone(c, batch[0][0])])
                return _write_tx(conn, lambda c: [_in_savepoint(c, b) for b, _ in batch])
            finally:
                if force_full:
                    conn.execute("PRAGMA synchronous = NORMAL")

        return await self._call(run)

    # --- reads ---------------------------------------------------------------------

    def _row_to_tuple(
        self, conn: sqlite3.Connection, row: sqlite3.Row | tuple[Any, ...], *, loading: bool = False
    ) -> CheckpointTuple:
        """Build a CheckpointTuple from a row; ``loading`` when a graph resumes from it."""
        (thread_id, ns, checkpoint_id, parent_id, type_, data, metadata, versions) = row
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        checkpoint = decode_checkpoint(self.serde, type_, data, **where)
        values: dict[str, Any] = {}
        own_versions = checkpoint.get("channel_versions") or {}
        for channel, btype, blob, base_version, version in conn.execute(
            sql.SELECT_BLOBS_FOR_VERSIONS, (versions, thread_id, ns)
        ).fetchall():
            if str(own_versions.get(channel)) != version:
                raise CorruptRecordError(
                    "checkpoint",
                    location=where,
                    cause=ValueError(
                        f"its channel_versions do not name version {version!r} of channel "
                        f"{channel!r}, which its row references"
                    ),
                )
            if btype != "empty":

                def fetch_base(version: str, ch: str = channel) -> Any:
                    return conn.execute(sql.SELECT_BLOB, (thread_id, ns, ch, version)).fetchone()

                values[channel], depth = resolve_value(
                    self.serde, btype, blob, base_version, fetch_base, channel=channel, **where
                )
                if loading:
                    self._deltas.loaded(thread_id, ns, channel, version, values[channel], depth)
        writes = [
            (
                task_id,
                channel,
                decode_typed(
                    self.serde,
                    wtype,
                    value,
                    "pending write",
                    task_id=task_id,
                    channel=channel,
                    **where,
                ),
            )
            for task_id, channel, wtype, value, _path, _idx in conn.execute(
                sql.SELECT_WRITES_FOR_CHECKPOINT, (thread_id, ns, checkpoint_id)
            )
        ]
        return CheckpointTuple(
            config=make_config(thread_id, ns, checkpoint_id),
            checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
            metadata=cast(CheckpointMetadata, _decode_metadata(metadata, **where)),
            parent_config=make_config(thread_id, ns, parent_id) if parent_id else None,
            pending_writes=writes,
        )

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)

        def read(conn: sqlite3.Connection) -> CheckpointTuple | None:
            if checkpoint_id:
                row = conn.execute(
                    sql.SELECT_CHECKPOINT_BY_ID, (thread_id, ns, checkpoint_id)
                ).fetchone()
            else:
                row = conn.execute(sql.SELECT_LATEST_CHECKPOINT, (thread_id, ns)).fetchone()
            return None if row is None else self._row_to_tuple(conn, row, loading=True)

        return await self._run(lambda conn: _read_tx(conn, read))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, fetched a page per worker trip (no lock held between).

        ``limit`` of 0 or less yields nothing (SQLite's ``LIMIT -1`` would mean "all").
        """
        if limit is not None and limit <= 0:
            return
        clauses: list[str] = []
        params: list[Any] = []
        if config is not None:
            clauses.append("thread_id = ?")
            params.append(thread_id_of(config))
            if "checkpoint_ns" in config["configurable"]:
                clauses.append("checkpoint_ns = ?")
                params.append(checkpoint_ns_of(config))
            if checkpoint_id := checkpoint_id_of(config):
                clauses.append("checkpoint_id = ?")
                params.append(checkpoint_id)
        if filter:
            fclauses, fparams = _metadata_filter(filter)
            clauses += fclauses
            params += fparams
        if before is not None and (before_id := checkpoint_id_of(before)):
            clauses.append("checkpoint_id < ?")
            params.append(before_id)

        remaining = limit
        cursor: tuple[str, str, str] | None = None
        while remaining is None or remaining > 0:
            page = LIST_PAGE_SIZE if remaining is None else min(remaining, LIST_PAGE_SIZE)
            where = clauses + ([sql.LIST_AFTER] if cursor else [])
            query = sql.LIST_SELECT
            if where:
                query += " WHERE " + " AND ".join(where)
            query += sql.LIST_ORDER
            args = (*params, *(cursor or ()), page)

            def read(
                conn: sqlite3.Connection, q: str = query, a: tuple[Any, ...] = args
            ) -> tuple[int, tuple[str, str, str] | None, list[CheckpointTuple]]:
                rows = conn.execute(q, a).fetchall()
                last = (rows[-1][2], rows[-1][0], rows[-1][1]) if rows else None
                fetched = len(rows)
                if filter:  # SQL only narrows; this decides (InMemorySaver's rule exactly)
                    rows = [r for r in rows if metadata_matches(_metadata_of(r), filter)]
                return fetched, last, [self._row_to_tuple(conn, row) for row in rows]

            fetched, last, tuples = await self._run(lambda conn, r=read: _read_tx(conn, r))  # type: ignore[misc]
            for tup in tuples:
                if remaining is not None:
                    if remaining <= 0:
                        return
                    remaining -= 1
                yield tup
            if fetched < page or last is None:
                return
            cursor = last

    # --- writes --------------------------------------------------------------------

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        parent_id = checkpoint_id_of(config)
        text_of(checkpoint["id"], "checkpoint id")
        for channel in new_versions:  # ids too: a raw UnicodeEncodeError otherwise
            text_of(channel, "channel")
        stored = checkpoint.copy()
        values: dict[str, Any] = stored.pop("channel_values")  # type: ignore[misc]
        blobs = self._deltas.encode(self.serde, thread_id, ns, values, new_versions)
        type_, data = self.serde.dumps_typed(stored)
        full_metadata = get_checkpoint_metadata(config, metadata)
        run_id = full_metadata.get("run_id")
        row = (
            thread_id,
            ns,
            checkpoint["id"],
            parent_id,
            None if run_id is None else str(run_id),
            type_,
            data,
            encode_metadata(full_metadata),
            encode_versions(checkpoint["channel_versions"]),
        )

        def write(conn: sqlite3.Connection) -> list[EncodedBlob]:
            rows = [
                self._deltas.whole(self.serde, b)
                if b.base_version is not None
                and conn.execute(
                    sql.BLOB_EXISTS, (thread_id, ns, b.channel, b.base_version)
                ).fetchone()
                is None
                else b
                for b in blobs
            ]
            if rows:
                conn.executemany(
                    sql.UPSERT_BLOB,
                    [
                        (thread_id, ns, b.channel, b.version, b.type, b.data, b.base_version)
                        for b in rows
                    ],
                )
            conn.execute(sql.UPSERT_CHECKPOINT, row)
            return rows

        written = await self._write(write)
        self._deltas.remember(thread_id, ns, written)
        return make_config(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)
        if checkpoint_id is None:
            raise ConfigError("put_writes needs config['configurable']['checkpoint_id']")
        text_of(task_id, "task_id")
        text_of(task_path, "task_path")
        rows = [
            (
                thread_id,
                ns,
                checkpoint_id,
                task_id,
                task_path,
                WRITES_IDX_MAP.get(channel, idx),
                text_of(channel, "channel"),
                *self.serde.dumps_typed(value),
            )
            for idx, (channel, value) in enumerate(writes)
        ]
        if rows:
            await self._write(lambda c: c.executemany(sql.UPSERT_WRITE, rows))

    # --- thread maintenance ----------------------------------------------------------

    async def adelete_thread(self, thread_id: str) -> None:
        """Delete a thread's checkpoints, writes, blobs and ledger entries."""
        tid = str(thread_id)

        def delete(conn: sqlite3.Connection) -> None:
            for statement in sql.DELETE_THREAD:
                conn.execute(statement, (tid,))

        await self._write(delete)
        self._deltas.forget([tid])

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) and ledger entries of these runs."""
        ids = [str(r) for r in run_ids]
        if not ids:
            return

        def delete(conn: sqlite3.Connection) -> None:
            threads: set[str] = set()
            for run_id in ids:
                for thread_id, ns, checkpoint_id in conn.execute(
                    sql.SELECT_CHECKPOINTS_OF_RUN, (run_id,)
                ).fetchall():
                    threads.add(thread_id)
                    conn.execute(sql.DELETE_WRITES_OF_CHECKPOINT, (thread_id, ns, checkpoint_id))
                    conn.execute(sql.DELETE_CHECKPOINT, (thread_id, ns, checkpoint_id))
                conn.execute(sql.DELETE_TOOL_CALLS_OF_RUN, (run_id,))
            for thread_id in threads:
                _collect_blobs(conn, thread_id)

        await self._write(delete)
        self._deltas.forget()

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
            _collect_blobs(conn, thread_id)

    # --- the tool-call ledger ----------------------------------------------------------

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        def claim(conn: sqlite3.Connection) -> list[ClaimOutcome]:
            outcomes = []
            for row in claims.rows:
                claimed = conn.execute(sql.INSERT_ISSUED, claims.params(row)).rowcount == 1
                found = conn.execute(sql.SELECT_ENTRY, row[:2]).fetchone()
                if found is None:  # refused by the fork slot: another branch's call
                    found = conn.execute(sql.SELECT_SLOT_HOLDER, claims.slot(row)).fetchone()
                outcomes.append(ClaimOutcome(claimed=claimed, entry=self.entry_of(found)))
            return outcomes

        return await self._write(claim, before_tool_runs=True)

    # --- ledger record primitives (the policy lives in IdemSaverBase) ---------------

    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        return await self._run(lambda conn: [self.entry_of(r) for r in conn.execute(query, params)])

    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        return await self._write(lambda c: c.execute(query, params).rowcount)

    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        def run(conn: sqlite3.Connection) -> LedgerEntry | None:
            if conn.execute(update.query, update.params).rowcount != 1:
                return None
            at = (update.scope, update.key)
            return self.entry_of(conn.execute(sql.SELECT_ENTRY, at).fetchone())

        return await self._write(run, before_tool_runs=update.before_tool_runs)

    # --- DeltaChannel history ----------------------------------------------------------

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per requested channel: the writes on the parent chain since the nearest
        ancestor that stores the channel's value, and that value (``seed``, absent when
        the walk reaches the root without one) - exactly what LangGraph's default
        returns, in one worker hand-off whatever the chain's length.

        LangGraph calls this whenever it loads a thread with a ``DeltaChannel``. Its
        default walks the chain with one ``aget_tuple`` per ancestor, each decoding every
        channel value and write of that checkpoint. Here one recursive statement walks
        the chain (read lazily: it stops once every channel has its seed, or at an id
        seen before), one more fetches just the requested channels' writes of the
        ancestors each channel's walk visited, and each seed is one primary-key read
        (plus its list-delta bases); all in one read transaction.
        """
        wanted = list(dict.fromkeys(channels))
        if not wanted:
            return {}
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        # a name SQLite text cannot hold (a lone surrogate) has nothing stored
        walking = [ch for ch in wanted if utf8_ok(ch)]
        paths = [sql.delta_path(ch) for ch in walking]
        params: dict[str, Any] = {
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint_id_of(config),
        }
        for i, (ch, path) in enumerate(zip(walking, paths, strict=True)):
            params[f"c{i}"] = ch
            if path is not None:
                params[f"p{i}"] = path
        chain_sql = sql.delta_chain_sql(tuple(p is not None for p in paths))

        def read(conn: sqlite3.Connection) -> dict[str, DeltaChannelHistory]:
            result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in wanted}
            if not walking:
                return result
            walked: list[str] = []  # ancestor ids, nearest first
            visits: dict[int, int] = {}  # channel index -> ancestors its walk visited
            seeds: dict[str, tuple[str, str]] = {}  # channel -> (checkpoint id, version)
            remaining = dict(enumerate(walking))
            rows = conn.execute(chain_sql, params)
            try:
                target = rows.fetchone()
                if target is None:
                    return result
                seen = {target[0]}
                for row in rows:
                    if row[0] in seen:  # a chain that loops: stop where it repeats
                        break
                    seen.add(row[0])
                    walked.append(row[0])
                    for i in [i for i in remaining if row[i + 1] is not None]:
                        seeds[remaining.pop(i)] = (row[0], row[i + 1])
                        visits[i] = len(walked)
                    if not remaining:
                        break
            finally:
                rows.close()
            for i in remaining:
                visits[i] = len(walked)
            if walked:
                oldest_first = walked[::-1]
                args: dict[str, Any] = {
                    "thread_id": thread_id,
                    "ns": ns,
                    "chain": json.dumps(oldest_first),
                }
                for i, ch in enumerate(walking):
                    args[f"c{i}"] = ch
                    args[f"f{i}"] = len(walked) - visits[i]
                writes = conn.execute(sql.delta_writes_sql(len(walking)), args).fetchall()
                # oldest checkpoint first, each in writes_sort_key order (get_tuple's)
                writes.sort(key=lambda w: (w[0], w[1], w[2], w[3]))
                for pos, _path, task_id, _idx, channel, wtype, value in writes:
                    value = decode_typed(
                        self.serde, wtype, value, "pending write", thread_id=thread_id,
                        checkpoint_ns=ns, checkpoint_id=oldest_first[pos], task_id=task_id,
                        channel=channel,
                    )  # fmt: skip
                    result[channel]["writes"].append((task_id, channel, value))
            for ch, (checkpoint_id, version) in seeds.items():
                where = {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }

                def fetch(v: str, ch: str = ch) -> Any:
                    return conn.execute(sql.SELECT_BLOB, (thread_id, ns, ch, v)).fetchone()

                row = fetch(version)
                if row is None:  # the chain statement saw it in this same transaction
                    raise CorruptRecordError(
                        "channel value",
                        location={**where, "channel": ch, "version": version},
                        cause=LookupError("the seed's blob vanished within one read"),
                    )
                result[ch]["seed"], _ = resolve_value(
                    self.serde, row[0], row[1], row[2], fetch, channel=ch, **where
                )
            return result

        return await self._run(lambda conn: _read_tx(conn, read))


def _alone(conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]) -> tuple[bool, Any]:
    """Run the only body of a transaction: its failure rolls back the transaction (two
    statements fewer than a savepoint, on every sequential write)."""
    try:
        return True, body(conn)
    except Exception as exc:
        conn.rollback()
        return False, exc


def _in_savepoint(
    conn: sqlite3.Connection, body: Callable[[sqlite3.Connection], T]
) -> tuple[bool, Any]:
    """Run one body of a group commit; its failure rolls back only its own statements."""
    conn.execute("SAVEPOINT idem_write")
    try:
        result = body(conn)
    except Exception as exc:
        conn.execute("ROLLBACK TO idem_write")
        conn.execute("RELEASE idem_write")
        return False, exc
    conn.execute("RELEASE idem_write")
    return True, result


def _typed_error(
    exc: ValueError | sqlite3.Error, busy_timeout: float, target: SqliteTarget | None = None
) -> Exception:
    """The package's exception for an aiosqlite/sqlite3 failure (the original otherwise);
    ``target`` names the database in the message."""
    msg = str(exc)
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
    kind = error_kind(exc)
    if kind == "readonly":
        return read_only_error(target, exc)
    if kind == "notadb":
        where = f" {target.path}" if target.path else ""
        return NotADatabaseError(f"the SQLite file{where} is not a usable database: {msg}")
    if kind == "cantopen" and target.path is not None:
        # a file beside the database (-journal, -wal) could not be created or opened
        return read_only_error(target, exc) if read_only_reason(target) else open_error(target, exc)
    return exc


def _metadata_of(row: Sequence[Any]) -> dict[str, Any]:
    """The decoded metadata of a ``CHECKPOINT_COLUMNS`` row."""
    thread_id, ns, checkpoint_id = row[0], row[1], row[2]
    return _decode_metadata(
        row[6], thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
    )


def _decode_metadata(text: str, **where: Any) -> dict[str, Any]:
    metadata = decode_json(text, "metadata", **where)
    if not isinstance(metadata, dict):
        raise CorruptRecordError(
            "metadata", location=where, cause=TypeError(f"decoded to {type(metadata).__name__}")
        )
    return metadata


def _parent_and_metadata(
    conn: sqlite3.Connection, thread_id: str, ns: str, checkpoint_id: str
) -> tuple[str | None, dict[str, Any]] | None:
    row = conn.execute(sql.SELECT_PARENT_AND_METADATA, (thread_id, ns, checkpoint_id)).fetchone()
    if row is None:
        return None
    return row[0], _decode_metadata(
        row[1], thread_id=thread_id, checkpoint_ns=ns, checkpoint_id=checkpoint_id
    )


def _collect_blobs(conn: sqlite3.Connection, thread_id: str) -> None:
    """Delete the thread's blobs that no remaining checkpoint references, directly or as
    the base of a referenced delta."""
    live: set[tuple[str, str, str]] = set()
    for ns, versions in conn.execute(sql.SELECT_LIVE_VERSIONS, (thread_id,)):
        for channel, version in decode_json(
            versions, "channel_versions", thread_id=thread_id
        ).items():
            live.add((ns, channel, version))
    rows = conn.execute(sql.SELECT_BLOB_KEYS, (thread_id,)).fetchall()
    base_of = {(ns, channel, version): base for ns, channel, version, base in rows}
    for ns, channel, version in list(live):
        base = base_of.get((ns, channel, version))
        while base is not None and (ns, channel, base) not in live:
            live.add((ns, channel, base))
            base = base_of.get((ns, channel, base))
    dead = [(thread_id, *key) for key in base_of if key not in live]
    if dead:
        conn.executemany(sql.DELETE_BLOB, dead)
