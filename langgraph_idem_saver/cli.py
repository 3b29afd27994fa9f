"""``idem-saver`` (``python -m langgraph_idem_saver``): look into a database, settle calls.

Point it at a SQLite file or a PostgreSQL DSN with ``--db`` (or ``$IDEM_SAVER_DB``)::

    idem-saver --db app.sqlite threads
    idem-saver --db postgresql://user@host/db pending --json

Commands
--------
``demo [--db PATH]``            the crash-and-resume demonstration; keeps its database
                                (default ./idem-demo.db, overwritten on each run)
``threads``                     every thread: checkpoints, last update, status, unknown outcomes
``history THREAD``              a thread's checkpoints, newest first
``show THREAD [--checkpoint ID]``  the decoded state (messages: role, content, tool calls)
``diff THREAD [--from ID] [--to ID]``  channels added/changed/removed, messages appended
``ledger THREAD [--agent PATH]``  every recorded tool call of the thread
``pending``                     unknown outcomes across all threads
``resolve ENTRY (--completed --result TEXT | --failed [--error TEXT] | --rerun)``
``prune (--keep-latest | --before DATE) [--thread T ...] [--apply]``  (dry run by default)
``stats``                       row counts, ledger entries by state, size on disk

Checkpoint ids and ledger keys may be abbreviated to a unique prefix (keys: 6+ characters,
as ``ledger``/``pending`` show them).

Thread status (``threads``, ``show``) is read from the latest root checkpoint only, without
the graph: ``interrupted`` when it holds an ``__interrupt__`` write, ``error`` when it holds
an ``__error__`` write, ``pending`` when the channels its step updated trigger a node
(``next`` lists them: LangGraph's ``branch:to:<node>`` channels, ``__start__``, and
pending ``Send``s - named by ``show``, shown as ``(send)`` by ``threads``, which decodes no
channel value) -
i.e. a resume would run something, as after a crash or ``interrupt_before`` - else
``done``. Exact for ``StateGraph`` and ``create_react_agent`` graphs; ``unknown`` when the
checkpoint does not record its updated channels (or cannot be decoded).

Read commands open SQLite read-only (``mode=ro``; ``immutable=1`` when the directory is
not writable, where a WAL database cannot be opened ``mode=ro``) and PostgreSQL sessions
read-only: they never create or change a database, and work on a read-only file or in a
read-only directory. (Like any SQLite reader, a ``mode=ro`` read of a WAL database may
leave the ``-wal``/``-shm`` files SQLite keeps beside it.) Only ``resolve`` and ``prune
--apply`` write.

Exit codes: ``0`` ok; ``1`` refused or not found (missing file, unknown thread, checkpoint
or entry, an entry that is not an unknown outcome or changed, a server that cannot be
reached, a database written by a newer release); ``2`` usage or bad input (bad arguments,
a file that is not an idem-saver database, a malformed DSN, an ambiguous prefix, a bad
date). Errors are one line on stderr, ``idem-saver: error: ...``.

JSON output (``--json``; field names are stable, times are ISO 8601 UTC or null)
--------------------------------------------------------------------------------
* threads: ``{"threads": [{thread_id, checkpoints, last_checkpoint_id, updated_at, status,
  next, ledger_entries, unknown_outcomes}]}``
* history: ``{thread_id, checkpoint_ns, total, checkpoints: [{checkpoint_id,
  parent_checkpoint_id, created_at, step, source, pending_writes}]}``
* show: ``{thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, created_at, step,
  source, status, next, channels: {name: value}, pending_writes: [{task_id, channel,
  value}]}``; a message list is a list of ``{index, id, role, content, name, tool_calls:
  [{id, name, args}], tool_call_id, status}``
* diff: ``{thread_id, checkpoint_ns, from, to, added: {name: value}, removed: [name],
  changed: {name: {from, to}}, messages: {channel: {appended, removed, changed}}}``
* ledger / pending: ``{thread_id, agent_path, entries: [entry]}`` / ``{entries: [entry]}``;
  entry: ``{key, key_short, scope, thread_id, agent_path, tool, tool_call_id, args, status,
  state, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
  result, error, adopted_by, run_id}``; ``status`` is the stored one (issued, completed,
  failed), ``state`` splits issued into ``unknown`` and ``in_progress``
* resolve: ``{key, thread_id, tool, resolution, status}``
* prune: ``{mode, before, applied, threads: [{thread_id, checkpoints, delete_checkpoints,
  delete_writes}], totals: {checkpoints, delete_checkpoints, delete_writes, blobs_deleted}}``
* stats: ``{backend, database, schema_version, threads, checkpoints, blobs, writes,
  ledger: {total, by_status, by_state, replays, conflicts}, size_bytes}``
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import enum
import json
import os
import re
import sqlite3
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from langgraph_idem_saver.errors import (
    ConnectionClosedError,
    CorruptRecordError,
    DatabaseLockedError,
    IdemSaverError,
    LedgerStateError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
)
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry
from langgraph_idem_saver.sqlite.files import (
    SqliteTarget,
    error_kind,
    open_error,
    read_only_uris,
)

if TYPE_CHECKING:
    from rich.console import Console

    from langgraph_idem_saver.saver_base import IdemSaverBase

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

ENV_DB = "IDEM_SAVER_DB"
KEY_SHORT = 12
MIN_KEY_PREFIX = 6
MIN_CHECKPOINT_PREFIX = 4
SQLITE_MAGIC = b"SQLite format 3\x00"
INTERRUPT, ERROR, RESUME = "__interrupt__", "__error__", "__resume__"
TASKS = "__pregel_tasks"
BRANCH_PREFIX = "branch:to:"
_UUID_EPOCH = datetime(1582, 10, 15, tzinfo=timezone.utc)


class CliError(Exception):
    """A failure reported as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


# --- small helpers ------------------------------------------------------------------


def checkpoint_time(checkpoint_id: str | None) -> datetime | None:
    """When a checkpoint was created, read from its id (LangGraph mints UUIDv6 ids, whose
    leading bits are a timestamp); None for ids of another form."""
    if not checkpoint_id:
        return None
    try:
        u = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    if u.version != 6:
        return None
    h = u.hex
    ticks = int(h[0:12] + h[13:16], 16)  # 100 ns intervals since 1582-10-15
    return _UUID_EPOCH + timedelta(microseconds=ticks // 10)


def from_epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=timezone.utc)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def short_time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """``2025-01-31``, ``2025-01-31T12:00[:00][+02:00|Z]`` (naive = UTC), or an age such
    as ``30d``, ``12h``, ``90m``, ``2w`` (that long before now)."""
    now = now or datetime.now(timezone.utc)
    if m := _DURATION.match(text):
        return now - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise CliError(
            f"bad date {text!r}: use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS][+HH:MM] (UTC when no "
            "offset) or an age like 30d, 12h, 90m",
            EXIT_USAGE,
        ) from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)


def redact_dsn(dsn: str) -> str:
    """A DSN safe to print: the password replaced."""
    dsn = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)


def is_postgres_target(target: str) -> bool:
    """A PostgreSQL URL, or a libpq ``key=value`` conninfo string (not an existing file)."""
    if target.startswith(("postgresql://", "postgres://")):
        return True
    return bool(re.match(r"^\s*[A-Za-z_]+\s*=", target)) and not Path(target).exists()


# --- the read-only query API -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ThreadAggregate:
    """One thread, aggregated in SQL: nothing but its latest root checkpoint is decoded."""

    thread_id: str
    checkpoints: int
    head_id: str | None
    head: dict[str, Any] | None  # the latest root checkpoint (no channel values), decoded
    head_writes: int
    head_interrupted: bool
    head_error: bool
    ledger_entries: int


@dataclasses.dataclass(frozen=True)
class HistoryRow:
    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: dict[str, Any]
    pending_writes: int


@dataclasses.dataclass(frozen=True)
class CheckpointNode:
    """A checkpoint's place in its thread's history, for prune planning."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: str  # JSON text, parsed only when DeltaChannel ancestry is needed
    writes: int


@dataclasses.dataclass
class TableCounts:
    threads: int = 0
    checkpoints: int = 0
    blobs: int = 0
    writes: int = 0
    ledger_by_status: dict[str, int] = dataclasses.field(default_factory=dict)
    replays: int = 0
    conflicts: int = 0
    schema_version: int | None = None
    size_bytes: int | None = None


class Inspector(Protocol):
    """What the CLI reads (and, for ``prune --before``, deletes) beyond the saver API.

    A backend implements it over the saver's own connection; everything else goes
    through the saver (``aget_tuple``, ``aprune``, the ledger methods).
    """

    saver: IdemSaverBase
    backend: str
    database: str

    async def thread_aggregates(self) -> list[ThreadAggregate]: ...

    async def thread_exists(self, thread_id: str) -> bool: ...

    async def history(
        self, thread_id: str, checkpoint_ns: str, limit: int | None
    ) -> tuple[int, list[HistoryRow]]: ...

    async def match_checkpoints(
        self, thread_id: str, checkpoint_ns: str, prefix: str
    ) -> list[str]: ...

    async def match_entries(self, prefix: str, thread_id: str | None) -> list[tuple[str, str]]: ...

    async def checkpoint_nodes(self, thread_ids: Sequence[str] | None) -> list[CheckpointNode]: ...

    async def delete_checkpoints(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> tuple[int, int, int]: ...

    async def counts(self) -> TableCounts: ...


def decode_head(serde: Any, type_: str | None, data: bytes | None) -> dict[str, Any] | None:
    """A stored checkpoint (without channel values), or None when it cannot be decoded."""
    if type_ is None:
        return None
    try:
        value = serde.loads_typed((type_, data if data is not None else b""))
    except Exception:
        return None
    return value if isinstance(value, dict) else None


class SqliteInspector:
    """The query API over an :class:`AsyncSqliteSaver`'s aiosqlite connection."""

    backend = "sqlite"

    def __init__(self, saver: Any, path: Path) -> None:
        self.saver = saver
        self.conn = saver.conn
        self.path = path
        self.database = str(path)

    async def _all(self, query: str, params: Sequence[Any] = ()) -> list[Any]:
        async with self.conn.execute(query, tuple(params)) as cur:
            return list(await cur.fetchall())

    async def thread_aggregates(self) -> list[ThreadAggregate]:
        rows = await self._all(
            """
            WITH t AS (
                SELECT thread_id, COUNT(*) AS n,
                       MAX(CASE WHEN checkpoint_ns = '' THEN checkpoint_id END) AS head
                FROM idem_checkpoints GROUP BY thread_id
            )
            SELECT t.thread_id, t.n, t.head, c.type, c.checkpoint,
                (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head),
                EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head
                    AND w.channel = '__interrupt__'),
                EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head
                    AND w.channel = '__error__')
            FROM t LEFT JOIN idem_checkpoints AS c
              ON c.thread_id = t.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = t.head
            """
        )
        ledger = dict(
            await self._all("SELECT thread_id, COUNT(*) FROM idem_tool_calls GROUP BY thread_id")
        )
        return _aggregates(self.saver.serde, rows, ledger)

    async def thread_exists(self, thread_id: str) -> bool:
        rows = await self._all(
            "SELECT EXISTS (SELECT 1 FROM idem_checkpoints WHERE thread_id = ?1) "
            "OR EXISTS (SELECT 1 FROM idem_tool_calls WHERE thread_id = ?1)",
            (thread_id,),
        )
        return bool(rows[0][0])

    async def history(
        self, thread_id: str, checkpoint_ns: str, limit: int | None
    ) -> tuple[int, list[HistoryRow]]:
        total = (
            await self._all(
                "SELECT COUNT(*) FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ?",
                (thread_id, checkpoint_ns),
            )
        )[0][0]
        rows = await self._all(
            """
            SELECT c.checkpoint_id, c.parent_checkpoint_id, c.metadata,
                (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = c.thread_id
                   AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)
            FROM idem_checkpoints AS c WHERE c.thread_id = ? AND c.checkpoint_ns = ?
            ORDER BY c.checkpoint_id DESC LIMIT ?
            """,
            (thread_id, checkpoint_ns, -1 if limit is None else limit),
        )
        return int(total), [HistoryRow(r[0], r[1], _metadata(r[2]), int(r[3])) for r in rows]

    async def match_checkpoints(self, thread_id: str, checkpoint_ns: str, prefix: str) -> list[str]:
        rows = await self._all(
            "SELECT checkpoint_id FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
            "AND substr(checkpoint_id, 1, ?) = ? ORDER BY checkpoint_id LIMIT 10",
            (thread_id, checkpoint_ns, len(prefix), prefix),
        )
        return [r[0] for r in rows]

    async def match_entries(self, prefix: str, thread_id: str | None) -> list[tuple[str, str]]:
        query = "SELECT scope, key FROM idem_tool_calls WHERE substr(key, 1, ?) = ?"
        params: list[Any] = [len(prefix), prefix]
        if thread_id is not None:
            query += " AND thread_id = ?"
            params.append(thread_id)
        return [(r[0], r[1]) for r in await self._all(query + " ORDER BY rowid LIMIT 10", params)]

    async def checkpoint_nodes(self, thread_ids: Sequence[str] | None) -> list[CheckpointNode]:
        query = """
            SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
                   c.metadata, COALESCE(w.n, 0)
            FROM idem_checkpoints AS c LEFT JOIN (
                SELECT thread_id, checkpoint_ns, checkpoint_id, COUNT(*) AS n FROM idem_writes
                GROUP BY thread_id, checkpoint_ns, checkpoint_id
            ) AS w USING (thread_id, checkpoint_ns, checkpoint_id)
        """
        params: list[Any] = []
        if thread_ids is not None:
            query += " WHERE c.thread_id IN (SELECT value FROM json_each(?))"
            params.append(json.dumps(list(thread_ids)))
        return [CheckpointNode(*r) for r in await self._all(query, params)]

    async def delete_checkpoints(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> tuple[int, int, int]:
        # The saver's own blob collection (it knows which blobs are deltas of which), in
        # the same transaction; see the report: this wants a public saver method.
        from langgraph_idem_saver.sqlite.saver import _collect_blobs

        rows = [tuple(k) for k in keys]
        threads = sorted({k[0] for k in keys})
        count_blobs = "SELECT COUNT(*) FROM idem_blobs WHERE thread_id = ?"

        def delete(conn: sqlite3.Connection) -> tuple[int, int, int]:
            conn.execute("BEGIN IMMEDIATE")
            try:
                writes = conn.executemany(
                    "DELETE FROM idem_writes WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id = ?",
                    rows,
                ).rowcount
                checkpoints = conn.executemany(
                    "DELETE FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? "
                    "AND checkpoint_id = ?",
                    rows,
                ).rowcount
                blobs = 0
                for thread_id in threads:
                    before = conn.execute(count_blobs, (thread_id,)).fetchone()[0]
                    _collect_blobs(conn, thread_id)
                    blobs += before - conn.execute(count_blobs, (thread_id,)).fetchone()[0]
                conn.commit()
            except BaseException:
                conn.rollback()
                raise
            return checkpoints, writes, blobs

        result: tuple[int, int, int] = await self.saver._call(delete)
        return result

    async def counts(self) -> TableCounts:
        c = TableCounts()
        [(c.threads, c.checkpoints)] = await self._all(
            "SELECT COUNT(DISTINCT thread_id), COUNT(*) FROM idem_checkpoints"
        )
        c.blobs = (await self._all("SELECT COUNT(*) FROM idem_blobs"))[0][0]
        c.writes = (await self._all("SELECT COUNT(*) FROM idem_writes"))[0][0]
        for status, n, replays, conflicts in await self._all(
            "SELECT status, COUNT(*), SUM(replays), SUM(conflicts) FROM idem_tool_calls "
            "GROUP BY status"
        ):
            c.ledger_by_status[status] = n
            c.replays += replays or 0
            c.conflicts += conflicts or 0
        c.schema_version = (await self._all("SELECT MAX(v) FROM idem_saver_migrations"))[0][0]
        c.size_bytes = sum(
            p.stat().st_size for p in (self.path, Path(f"{self.path}-wal")) if p.exists()
        )
        return c


class PostgresInspector:
    """The query API over an :class:`AsyncPostgresSaver`'s connection."""

    backend = "postgres"

    def __init__(self, saver: Any, database: str) -> None:
        self.saver = saver
        self.conn = saver.conn
        self.database = database

    async def _all(self, query: str, params: Any = None) -> list[Any]:
        from psycopg.rows import tuple_row

        async with self.conn.cursor(row_factory=tuple_row) as cur:
            await cur.execute(query, params)
            return list(await cur.fetchall())

    def _unpack(self, type_: str | None, data: bytes | None) -> tuple[str | None, bytes | None]:
        from langgraph_idem_saver.postgres.saver import ZLIB_PREFIX

        if type_ is not None and type_.startswith(ZLIB_PREFIX):
            import zlib

            try:
                return type_[len(ZLIB_PREFIX) :], zlib.decompress(data or b"")
            except zlib.error:
                return None, None
        return type_, data

    async def thread_aggregates(self) -> list[ThreadAggregate]:
        rows = await self._all(
            """
            WITH t AS (
                SELECT thread_id, COUNT(*) AS n,
                       MAX(checkpoint_id) FILTER (WHERE checkpoint_ns = '') AS head
                FROM idem_checkpoints GROUP BY thread_id
            )
            SELECT t.thread_id, t.n, t.head, c.type, c.checkpoint,
                (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head),
                EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head
                    AND w.channel = '__interrupt__'),
                EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
                    AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head
                    AND w.channel = '__error__')
            FROM t LEFT JOIN idem_checkpoints AS c
              ON c.thread_id = t.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = t.head
            """
        )
        rows = [(*r[:3], *self._unpack(r[3], r[4]), *r[5:]) for r in rows]
        ledger = dict(
            await self._all("SELECT thread_id, COUNT(*) FROM idem_tool_calls GROUP BY thread_id")
        )
        return _aggregates(self.saver.serde, rows, ledger)

    async def thread_exists(self, thread_id: str) -> bool:
        rows = await self._all(
            "SELECT EXISTS (SELECT 1 FROM idem_checkpoints WHERE thread_id = %(t)s) "
            "OR EXISTS (SELECT 1 FROM idem_tool_calls WHERE thread_id = %(t)s)",
            {"t": thread_id},
        )
        return bool(rows[0][0])

    async def history(
        self, thread_id: str, checkpoint_ns: str, limit: int | None
    ) -> tuple[int, list[HistoryRow]]:
        total = (
            await self._all(
                "SELECT COUNT(*) FROM idem_checkpoints WHERE thread_id = %s AND checkpoint_ns = %s",
                (thread_id, checkpoint_ns),
            )
        )[0][0]
        rows = await self._all(
            """
            SELECT c.checkpoint_id, c.parent_checkpoint_id,
                COALESCE(c.metadata_exact, c.metadata::text),
                (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = c.thread_id
                   AND w.checkpoint_ns = c.checkpoint_ns AND w.checkpoint_id = c.checkpoint_id)
            FROM idem_checkpoints AS c WHERE c.thread_id = %s AND c.checkpoint_ns = %s
            ORDER BY c.checkpoint_id DESC LIMIT %s
            """,
            (thread_id, checkpoint_ns, limit),
        )
        return int(total), [HistoryRow(r[0], r[1], _metadata(r[2]), int(r[3])) for r in rows]

    async def match_checkpoints(self, thread_id: str, checkpoint_ns: str, prefix: str) -> list[str]:
        rows = await self._all(
            "SELECT checkpoint_id FROM idem_checkpoints WHERE thread_id = %s AND checkpoint_ns = %s"
            " AND left(checkpoint_id, %s) = %s ORDER BY checkpoint_id LIMIT 10",
            (thread_id, checkpoint_ns, len(prefix), prefix),
        )
        return [r[0] for r in rows]

    async def match_entries(self, prefix: str, thread_id: str | None) -> list[tuple[str, str]]:
        query = "SELECT scope, key FROM idem_tool_calls WHERE left(key, %s) = %s"
        params: list[Any] = [len(prefix), prefix]
        if thread_id is not None:
            query += " AND thread_id = %s"
            params.append(thread_id)
        return [(r[0], r[1]) for r in await self._all(query + " ORDER BY seq LIMIT 10", params)]

    async def checkpoint_nodes(self, thread_ids: Sequence[str] | None) -> list[CheckpointNode]:
        query = """
            SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id,
                   COALESCE(c.metadata_exact, c.metadata::text), COALESCE(w.n, 0)
            FROM idem_checkpoints AS c LEFT JOIN (
                SELECT thread_id, checkpoint_ns, checkpoint_id, COUNT(*) AS n FROM idem_writes
                GROUP BY thread_id, checkpoint_ns, checkpoint_id
            ) AS w USING (thread_id, checkpoint_ns, checkpoint_id)
        """
        params: dict[str, Any] = {}
        if thread_ids is not None:
            query += " WHERE c.thread_id = ANY(%(threads)s)"
            params["threads"] = list(thread_ids)
        return [CheckpointNode(*r) for r in await self._all(query, params)]

    async def delete_checkpoints(
        self, keys: Sequence[tuple[str, str, str]]
    ) -> tuple[int, int, int]:
        from psycopg.rows import tuple_row

        from langgraph_idem_saver.postgres import sql

        threads = sorted({k[0] for k in keys})
        arrays = {
            "t": [k[0] for k in keys],
            "ns": [k[1] for k in keys],
            "id": [k[2] for k in keys],
            "threads": threads,
        }
        target = (
            "(thread_id, checkpoint_ns, checkpoint_id) IN (SELECT * FROM unnest("
            "%(t)s::text[], %(ns)s::text[], %(id)s::text[]))"
        )
        async with self.conn.transaction(), self.conn.cursor(row_factory=tuple_row) as cur:
            # the threads' locks first, as the saver's deletes take them: an aput writing a
            # delta meanwhile never loses its base (sql.THREAD_LOCK_SPACE)
            await cur.execute(sql.LOCK_THREADS, arrays)
            await cur.execute(f"DELETE FROM idem_writes WHERE {target}", arrays)
            writes = cur.rowcount
            await cur.execute(f"DELETE FROM idem_checkpoints WHERE {target}", arrays)
            checkpoints = cur.rowcount
            await cur.execute(sql.COLLECT_BLOBS, arrays)
            blobs = cur.rowcount
        return checkpoints, writes, blobs

    async def counts(self) -> TableCounts:
        c = TableCounts()
        [(c.threads, c.checkpoints)] = await self._all(
            "SELECT COUNT(DISTINCT thread_id), COUNT(*) FROM idem_checkpoints"
        )
        c.blobs = (await self._all("SELECT COUNT(*) FROM idem_blobs"))[0][0]
        c.writes = (await self._all("SELECT COUNT(*) FROM idem_writes"))[0][0]
        for status, n, replays, conflicts in await self._all(
            "SELECT status, COUNT(*), SUM(replays), SUM(conflicts) FROM idem_tool_calls "
            "GROUP BY status"
        ):
            c.ledger_by_status[status] = int(n)
            c.replays += int(replays or 0)
            c.conflicts += int(conflicts or 0)
        c.schema_version = (await self._all("SELECT MAX(v) FROM idem_saver_migrations"))[0][0]
        size = (
            await self._all(
                "SELECT SUM(pg_total_relation_size(to_regclass(t))) FROM unnest(ARRAY["
                "'idem_checkpoints', 'idem_blobs', 'idem_writes', 'idem_tool_calls', "
                "'idem_saver_migrations']) AS t"
            )
        )[0][0]
        c.size_bytes = None if size is None else int(size)
        return c


def _metadata(text: Any) -> dict[str, Any]:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _aggregates(
    serde: Any, rows: Iterable[Sequence[Any]], ledger: dict[str, int]
) -> list[ThreadAggregate]:
    out = []
    seen = set()
    for thread_id, n, head_id, type_, data, writes, interrupted, errored in rows:
        seen.add(thread_id)
        out.append(
            ThreadAggregate(
                thread_id=thread_id,
                checkpoints=int(n),
                head_id=head_id,
                head=decode_head(serde, type_, data),
                head_writes=int(writes or 0),
                head_interrupted=bool(interrupted),
                head_error=bool(errored),
                ledger_entries=int(ledger.get(thread_id, 0)),
            )
        )
    for thread_id, entries in ledger.items():  # threads that only have ledger entries
        if thread_id not in seen:
            out.append(ThreadAggregate(thread_id, 0, None, None, 0, False, False, int(entries)))
    return out


def head_status(
    head: dict[str, Any] | None, *, interrupted: bool, errored: bool, exists: bool = True
) -> tuple[str, list[str]]:
    """``(status, next)`` of a thread from its latest root checkpoint (see the module doc).

    ``head`` is the stored checkpoint; when it carries ``channel_values`` (``show``), the
    nodes of pending ``Send``s are named, else they show as ``(send)``.
    """
    if not exists:
        return "empty", []
    updated = head.get("updated_channels") if head is not None else None
    nxt: list[str] = []
    if updated is not None:
        for channel in sorted(updated):
            if channel.startswith(BRANCH_PREFIX):
                nxt.append(channel[len(BRANCH_PREFIX) :])
            elif channel == "__start__":
                nxt.append("__start__")
            elif channel == TASKS:
                sends = (head or {}).get("channel_values", {}).get(TASKS)
                nodes = [getattr(s, "node", None) for s in sends or ()]
                if nodes and all(isinstance(n, str) for n in nodes):
                    nxt += sorted(set(nodes) - set(nxt))  # type: ignore[arg-type]
                else:
                    nxt.append("(send)")
    if interrupted:
        return "interrupted", nxt
    if errored:
        return "error", nxt
    if updated is None:
        return "unknown", nxt
    return ("pending" if nxt else "done"), nxt


# --- opening a database ------------------------------------------------------------


@asynccontextmanager
async def open_inspector(target: str, *, write: bool = False) -> AsyncIterator[Inspector]:
    """An :class:`Inspector` (with its saver) for a SQLite path or a PostgreSQL DSN.

    Read-only unless ``write``; never creates a database either way.
    """
    if is_postgres_target(target):
        async with _open_postgres(target, write=write) as inspector:
            yield inspector
    else:
        async with _open_sqlite(target, write=write) as sqlite_inspector:
            yield sqlite_inspector


@asynccontextmanager
async def _open_sqlite(target: str, *, write: bool) -> AsyncIterator[SqliteInspector]:
    import aiosqlite

    from langgraph_idem_saver.sqlite import AsyncSqliteSaver

    path = Path(target).expanduser()
    if not path.exists():
        raise CliError(f"no such database file: {target} (not creating one)")
    if path.is_dir():
        raise CliError(f"{target} is a directory, not a database file", EXIT_USAGE)
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise CliError(f"cannot read {target}: {exc.strerror or exc}") from None
    if header != SQLITE_MAGIC:
        raise CliError(f"{target} is not a SQLite database", EXIT_USAGE)
    # never creates the file; reads: mode=ro, or immutable=1 where mode=ro cannot open it
    where = SqliteTarget(str(path.resolve()), read_only=not write)
    uris = [(path.resolve().as_uri() + "?mode=rw", False)] if write else read_only_uris(path)
    immutable = False
    for attempt, (uri, immutable) in enumerate(uris, 1):  # noqa: B007 (used after the loop)
        try:
            conn = await aiosqlite.connect(uri, uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise CliError(f"cannot open {target}: {exc}") from None
        try:
            async with conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' "
                "AND name = 'idem_saver_migrations'"
            ) as cur:
                ours = await cur.fetchone()
            break
        except sqlite3.DatabaseError as exc:
            await conn.close()
            if error_kind(exc) in ("readonly", "cantopen"):
                if attempt < len(uris):
                    continue  # mode=ro cannot read this WAL database here: immutable=1 next
                raise open_error(where, exc) from None
            raise CliError(f"{target} is not a usable SQLite database: {exc}", EXIT_USAGE) from None
    if immutable and Path(f"{path}-wal").exists():
        print(
            f"idem-saver: note: {target}-wal cannot be read from this read-only directory; "
            "showing the database without its latest transactions",
            file=sys.stderr,
        )
    try:
        if ours is None:
            raise CliError(
                f"{target} is a SQLite database without langgraph-idem-saver tables "
                "(idem_saver_migrations missing): wrong file?",
                EXIT_USAGE,
            )
        saver = AsyncSqliteSaver(conn)
        saver._target = where
        try:
            await saver.setup()
        except ReadOnlyDatabaseError as exc:
            if write:
                raise
            raise CliError(f"{exc} (read commands never write)") from None
        yield SqliteInspector(saver, path)
    finally:
        await conn.close()


@asynccontextmanager
async def _open_postgres(dsn: str, *, write: bool) -> AsyncIterator[PostgresInspector]:
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
        from psycopg.rows import dict_row

        from langgraph_idem_saver.postgres import AsyncPostgresSaver
    except ImportError:
        raise CliError(
            "PostgreSQL needs the postgres extra: pip install 'langgraph-idem-saver[postgres]'"
        ) from None
    shown = redact_dsn(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise CliError(f"bad PostgreSQL DSN {shown}: {exc}", EXIT_USAGE) from None
    if not write:  # every transaction of this session is read-only
        options = str(params.get("options") or "")
        params["options"] = f"{options} -c default_transaction_read_only=on".strip()
    try:
        conn = await psycopg.AsyncConnection.connect(
            make_conninfo("", **params), autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
    except psycopg.ProgrammingError as exc:
        raise CliError(f"bad PostgreSQL DSN {shown}: {exc}", EXIT_USAGE) from None
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot connect to PostgreSQL at {shown}: {first}") from None
    async with conn:
        cur = await conn.execute("SELECT to_regclass('idem_saver_migrations') IS NOT NULL")
        row = await cur.fetchone()
        if not row or not next(iter(row.values())):
            raise CliError(
                f"no langgraph-idem-saver tables in {shown} (idem_saver_migrations not on the "
                "search_path): wrong database or schema?",
                EXIT_USAGE,
            )
        saver = AsyncPostgresSaver(conn)
        try:
            await saver.setup()
        except (psycopg.errors.ReadOnlySqlTransaction, ReadOnlyDatabaseError):
            raise CliError(
                f"{shown} needs a schema upgrade; open it once with the application "
                "(read commands never write)"
            ) from None
        yield PostgresInspector(saver, shown)


# --- values, messages ------------------------------------------------------------------

ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(compact_json(jsonable(block)))
        return "\n".join(parts)
    return compact_json(jsonable(content))


def message_dict(message: Any, index: int | None = None) -> dict[str, Any]:
    """A message as stable JSON: role, content (text), tool calls, tool-call id."""
    tool_calls = getattr(message, "tool_calls", None) or []
    return {
        "index": index,
        "id": message.id,
        "role": ROLES.get(message.type, message.type),
        "content": content_text(message.content),
        "name": getattr(message, "name", None),
        "tool_calls": [
            {"id": c.get("id"), "name": c.get("name"), "args": jsonable(c.get("args"))}
            for c in tool_calls
        ],
        "tool_call_id": getattr(message, "tool_call_id", None),
        "status": getattr(message, "status", None) if message.type == "tool" else None,
    }


def is_message(value: Any) -> bool:
    from langchain_core.messages import BaseMessage

    return isinstance(value, BaseMessage)


def is_message_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_message(m) for m in value)


def jsonable(value: Any) -> Any:
    """Any channel value as JSON data (messages as :func:`message_dict`, else repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if is_message(value):
        return message_dict(value)
    if is_message_list(value):
        return [message_dict(m, i) for i, m in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump())
        except Exception:
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def is_internal_channel(name: str) -> bool:
    """LangGraph's bookkeeping channels (``branch:to:x``, ``__start__``, ...)."""
    return name.startswith("__") or ":" in name


def message_signature(m: dict[str, Any]) -> tuple[Any, ...]:
    return (m["role"], m["content"], compact_json(m["tool_calls"]), m["tool_call_id"])


def diff_messages(
    old: list[dict[str, Any]], new: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Messages appended, removed and changed between two versions of a message list."""
    if [message_signature(m) for m in old] == [
        message_signature(m) for m in new[: len(old)]
    ] and len(new) >= len(old):
        return {"appended": new[len(old) :], "removed": [], "changed": []}
    old_by_id = {m["id"]: m for m in old if m["id"]}
    new_ids = {m["id"] for m in new if m["id"]}
    appended, changed = [], []
    for m in new:
        before = old_by_id.get(m["id"]) if m["id"] else None
        if before is None:
            appended.append(m)
        elif message_signature(before) != message_signature(m):
            changed.append(m)
    removed = [m for m in old if not m["id"] or m["id"] not in new_ids]
    return {"appended": appended, "removed": removed, "changed": changed}


def entry_dict(saver: Any, e: LedgerEntry, now: float) -> dict[str, Any]:
    """A ledger entry as stable JSON (see the module doc)."""
    from langgraph_idem_saver.inspection import decode_args, decode_result

    if e.status is CallStatus.ISSUED:
        state = "unknown" if e.is_unknown(now) else "in_progress"
    else:
        state = e.status.value
    try:
        args: Any = decode_args(e)
    except CorruptRecordError:
        args = e.args.decode("utf-8", "replace") if isinstance(e.args, bytes) else str(e.args)
    result: Any = None
    if e.result is not None:
        try:
            decoded = decode_result(saver, e)
        except CorruptRecordError as exc:
            result = f"<undecodable: {exc}>"
        else:
            result = content_text(decoded.content) if is_message(decoded) else jsonable(decoded)
    return {
        "key": e.key,
        "key_short": e.key[:KEY_SHORT],
        "scope": e.scope,
        "thread_id": e.thread_id,
        "agent_path": e.agent_path,
        "tool": e.tool_name,
        "tool_call_id": e.tool_call_id,
        "args": args,
        "status": e.status.value,
        "state": state,
        "attempts": e.attempts,
        "replays": e.replays,
        "conflicts": e.conflicts,
        "owner": e.owner,
        "issued_at": iso(from_epoch(e.issued_at)),
        "lease_expires_at": iso(from_epoch(e.lease_expires_at)),
        "finished_at": iso(from_epoch(e.finished_at)),
        "result": result,
        "error": e.error,
        "adopted_by": e.adopted_by,
        "run_id": e.run_id,
        "history": e.events(),
    }


# --- output ----------------------------------------------------------------------------


class Out:
    """Where a command writes: JSON for scripts, rich tables for people."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            width = None  # a terminal's own width; piped output is not cut at 80 columns
            if not sys.stdout.isatty():
                width = int(os.environ.get("COLUMNS") or 0) or PIPE_WIDTH
            self._console = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width)
        return self._console

    def json(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=repr) + "\n")

    def table(
        self, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]
    ) -> None:
        from rich.table import Table

        table = Table(title=title, title_justify="left", show_lines=False)
        for name in columns:
            no_wrap = name in ("key", "checkpoint", "status", "state", "created (UTC)")
            table.add_column(name, no_wrap=no_wrap, overflow="fold")
        for row in rows:
            table.add_row(*("-" if v is None else str(v) for v in row))
        self.console.print(table)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)


PIPE_WIDTH = 160
STATE_STYLE = {"unknown": "UNKNOWN", "in_progress": "in progress"}


# --- commands ----------------------------------------------------------------------------


async def cmd_threads(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    aggregates = await insp.thread_aggregates()
    unknown = Counter(e.thread_id for e in await insp.saver.alist_unknown())
    rows: list[dict[str, Any]] = []
    for a in aggregates:
        status, nxt = head_status(
            a.head,
            interrupted=a.head_interrupted,
            errored=a.head_error,
            exists=a.head_id is not None,
        )
        rows.append(
            {
                "thread_id": a.thread_id,
                "checkpoints": a.checkpoints,
                "last_checkpoint_id": a.head_id,
                "updated_at": iso(checkpoint_time(a.head_id)),
                "status": status,
                "next": nxt,
                "ledger_entries": a.ledger_entries,
                "unknown_outcomes": unknown.get(a.thread_id, 0),
            }
        )
    rows.sort(key=lambda r: (r["updated_at"] or "", r["thread_id"]), reverse=True)
    if args.limit:
        rows = rows[: args.limit]
    if out.as_json:
        out.json({"threads": rows})
        return EXIT_OK
    if not rows:
        out.line("no threads")
        return EXIT_OK
    out.table(
        f"{len(rows)} thread(s)",
        ["thread", "checkpoints", "updated (UTC)", "status", "next", "calls", "unknown"],
        (
            [
                r["thread_id"],
                r["checkpoints"],
                short_time(checkpoint_time(r["last_checkpoint_id"])),
                r["status"],
                ", ".join(r["next"]) or "",
                r["ledger_entries"],
                r["unknown_outcomes"] or "",
            ]
            for r in rows
        ),
    )
    return EXIT_OK


async def require_thread(insp: Inspector, thread_id: str) -> None:
    if not await insp.thread_exists(thread_id):
        raise CliError(f"unknown thread {thread_id!r} (see: idem-saver threads)")


async def find_checkpoint(insp: Inspector, thread_id: str, ns: str, ref: str) -> str:
    """A checkpoint id from an id or a unique prefix of one."""
    matches = await insp.match_checkpoints(thread_id, ns, ref)
    if ref in matches:
        return ref
    if len(ref) < MIN_CHECKPOINT_PREFIX or not matches:
        raise CliError(f"no checkpoint {ref!r} in thread {thread_id!r} (see: idem-saver history)")
    if len(matches) > 1:
        raise CliError(
            f"checkpoint prefix {ref!r} is ambiguous in thread {thread_id!r}: "
            + ", ".join(matches[:5]),
            EXIT_USAGE,
        )
    return matches[0]


async def cmd_history(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    await require_thread(insp, args.thread)
    total, rows = await insp.history(args.thread, args.ns, args.limit or None)
    items: list[dict[str, Any]] = [
        {
            "checkpoint_id": r.checkpoint_id,
            "parent_checkpoint_id": r.parent_checkpoint_id,
            "created_at": iso(checkpoint_time(r.checkpoint_id)),
            "step": r.metadata.get("step"),
            "source": r.metadata.get("source"),
            "pending_writes": r.pending_writes,
        }
        for r in rows
    ]
    if out.as_json:
        out.json(
            {
                "thread_id": args.thread,
                "checkpoint_ns": args.ns,
                "total": total,
                "checkpoints": items,
            }
        )
        return EXIT_OK
    title = f"thread {args.thread!r}: {total} checkpoint(s)"
    if args.ns:
        title += f" in namespace {args.ns!r}"
    if len(items) < total:
        title += f", newest {len(items)} shown (--limit 0 for all)"
    out.table(
        title,
        ["checkpoint", "created (UTC)", "step", "source", "writes", "parent"],
        (
            [
                i["checkpoint_id"],
                short_time(checkpoint_time(i["checkpoint_id"])),
                i["step"],
                i["source"],
                i["pending_writes"] or "",
                (i["parent_checkpoint_id"] or "")[:13],
            ]
            for i in items
        ),
    )
    return EXIT_OK


async def load_tuple(insp: Inspector, thread_id: str, ns: str, checkpoint_id: str | None) -> Any:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    if checkpoint_id:
        config["configurable"]["checkpoint_id"] = checkpoint_id
    tup = await insp.saver.aget_tuple(config)  # type: ignore[arg-type]
    if tup is None:
        raise CliError(f"thread {thread_id!r} has no checkpoint in namespace {ns!r}")
    return tup


def state_of(tup: Any, all_channels: bool) -> dict[str, Any]:
    values = tup.checkpoint["channel_values"]
    return {k: values[k] for k in sorted(values) if all_channels or not is_internal_channel(k)}


async def cmd_show(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    await require_thread(insp, args.thread)
    cid = (
        await find_checkpoint(insp, args.thread, args.ns, args.checkpoint)
        if args.checkpoint
        else None
    )
    tup = await load_tuple(insp, args.thread, args.ns, cid)
    checkpoint_id = tup.config["configurable"]["checkpoint_id"]
    writes = tup.pending_writes or []
    status, nxt = head_status(
        tup.checkpoint,
        interrupted=any(c == INTERRUPT for _, c, _ in writes),
        errored=any(c == ERROR for _, c, _ in writes),
    )
    state = state_of(tup, args.all)
    doc = {
        "thread_id": args.thread,
        "checkpoint_ns": args.ns,
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": (tup.parent_config or {})
        .get("configurable", {})
        .get("checkpoint_id"),
        "created_at": iso(checkpoint_time(checkpoint_id)),
        "step": tup.metadata.get("step"),
        "source": tup.metadata.get("source"),
        "status": status,
        "next": nxt,
        "channels": {k: jsonable(v) for k, v in state.items()},
        "pending_writes": [
            {"task_id": t, "channel": c, "value": jsonable(v)} for t, c, v in writes
        ],
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    out.line(
        f"thread {args.thread!r}  checkpoint {checkpoint_id}  step {doc['step']}  "
        f"source {doc['source']}  created {short_time(checkpoint_time(checkpoint_id))} UTC"
    )
    out.line(f"status: {status}" + (f" (next: {', '.join(nxt)})" if nxt else ""))
    others = []
    for name, value in state.items():
        if is_message_list(value):
            render_messages(out, f"{name}: {len(value)} message(s)", jsonable(value))
        else:
            others.append([name, short(compact_json(jsonable(value)), 2000)])
    if others:
        out.table("channels", ["channel", "value"], others)
    if writes:
        out.table(
            "pending writes",
            ["task", "channel", "value"],
            ([t[:13], c, short(compact_json(jsonable(v)), 300)] for t, c, v in writes),
        )
    return EXIT_OK


def tool_calls_text(m: dict[str, Any]) -> str:
    return "\n".join(f"{c['name']}({compact_json(c['args'])}) [{c['id']}]" for c in m["tool_calls"])


def render_messages(out: Out, title: str, messages: list[dict[str, Any]]) -> None:
    rows = []
    for m in messages:
        extra = tool_calls_text(m)
        if m["role"] == "tool":
            extra = f"{m['name'] or ''} [{m['tool_call_id']}]" + (
                f" {m['status']}" if m["status"] and m["status"] != "success" else ""
            )
        rows.append([m["index"], m["role"], short(m["content"], 2000), extra])
    out.table(title, ["#", "role", "content", "tool calls / call id"], rows)


async def cmd_diff(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    await require_thread(insp, args.thread)
    to_id = await find_checkpoint(insp, args.thread, args.ns, args.to) if args.to else None
    new = await load_tuple(insp, args.thread, args.ns, to_id)
    if args.from_:
        old = await load_tuple(
            insp,
            args.thread,
            args.ns,
            await find_checkpoint(insp, args.thread, args.ns, args.from_),
        )
    elif new.parent_config is not None:
        old = await load_tuple(
            insp, args.thread, args.ns, new.parent_config["configurable"]["checkpoint_id"]
        )
    else:
        raise CliError("the checkpoint has no parent: pass --from ID")
    a, b = state_of(old, args.all), state_of(new, args.all)
    added = {k: jsonable(b[k]) for k in b if k not in a}
    removed = [k for k in a if k not in b]
    changed: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for k in a:
        if k not in b:
            continue
        va, vb = jsonable(a[k]), jsonable(b[k])
        if va == vb:
            continue
        if (is_message_list(a[k]) or a[k] == []) and is_message_list(b[k]):
            messages[k] = diff_messages(va, vb)
        else:
            changed[k] = {"from": va, "to": vb}
    doc = {
        "thread_id": args.thread,
        "checkpoint_ns": args.ns,
        "from": old.config["configurable"]["checkpoint_id"],
        "to": new.config["configurable"]["checkpoint_id"],
        "added": added,
        "removed": removed,
        "changed": changed,
        "messages": messages,
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    out.line(f"thread {args.thread!r}: {doc['from']} -> {doc['to']}")
    rows = [["+", k, short(compact_json(v), 500)] for k, v in added.items()]
    rows += [["-", k, ""] for k in removed]
    rows += [
        ["~", k, short(f"{compact_json(v['from'])} -> {compact_json(v['to'])}", 500)]
        for k, v in changed.items()
    ]
    for k, d in messages.items():
        parts = [f"{len(d[x])} {x}" for x in ("appended", "removed", "changed") if d[x]]
        rows.append(["~", k, ", ".join(parts)])
    if not rows:
        out.line("no changes")
    else:
        out.table("channels", ["", "channel", "change"], rows)
    for k, d in messages.items():
        for kind in ("appended", "removed", "changed"):
            if d[kind]:
                render_messages(out, f"{k}: {kind}", d[kind])
    return EXIT_OK


def ledger_rows(entries: list[dict[str, Any]], with_thread: bool) -> Iterable[list[Any]]:
    for e in entries:
        outcome = e["error"] if e["state"] == "failed" else e["result"]
        row = [
            e["key_short"],
            STATE_STYLE.get(e["state"], e["state"]),
            e["tool"],
            short(compact_json(e["args"]), 60),
            short_time(datetime.fromisoformat(e["issued_at"])),
            short_time(datetime.fromisoformat(e["finished_at"])) if e["finished_at"] else "",
            e["attempts"],
            e["replays"],
            "" if outcome is None else short(str(outcome), 60),
        ]
        if with_thread:
            row.insert(1, e["thread_id"])
        yield row


LEDGER_COLUMNS = [
    "key",
    "state",
    "tool",
    "args",
    "issued (UTC)",
    "finished",
    "att",
    "rpl",
    "result / error",
]


async def cmd_ledger(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    await require_thread(insp, args.thread)
    now = time.time()
    entries = [
        entry_dict(insp.saver, e, now)
        for e in await insp.saver.alist_entries(args.thread, agent_path=args.agent)
    ]
    if out.as_json:
        out.json({"thread_id": args.thread, "agent_path": args.agent, "entries": entries})
        return EXIT_OK
    if not entries:
        out.line(f"thread {args.thread!r} has no ledger entries")
        return EXIT_OK
    title = f"thread {args.thread!r}: {len(entries)} tool call(s)"
    if args.agent is not None:
        title += f" of agent {args.agent!r}"
    out.table(title, LEDGER_COLUMNS, ledger_rows(entries, with_thread=False))
    return EXIT_OK


async def cmd_pending(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    from langgraph_idem_saver.inspection import astale_claims

    now = time.time()
    entries = [entry_dict(insp.saver, e, now) for e in await insp.saver.alist_unknown(now=now)]
    stale = [
        entry_dict(insp.saver, e, now)
        for e in await astale_claims(insp.saver, older_than=args.stale)
    ]
    if out.as_json:
        out.json({"entries": entries, "stale_claims": stale})
        return EXIT_OK
    columns = [*LEDGER_COLUMNS[:1], "thread", *LEDGER_COLUMNS[1:]]
    if stale:
        out.table(
            f"{len(stale)} live claim(s) older than {args.stale:g}s (owner may be gone)",
            [*columns, "owner"],
            [
                [*row, e["owner"]]
                for row, e in zip(ledger_rows(stale, with_thread=True), stale, strict=True)
            ],
        )
        out.line(
            "if an owner's process is gone (e.g. a replaced pod): idem-saver resolve KEY "
            "--force --rerun | --completed --result TEXT | --failed --error TEXT"
        )
    if not entries:
        out.line("no unknown outcomes")
        return EXIT_OK
    out.table(f"{len(entries)} unknown outcome(s)", columns, ledger_rows(entries, with_thread=True))
    out.line(
        "settle each after checking the outside world: idem-saver resolve KEY "
        "--completed --result TEXT | --failed --error TEXT | --rerun"
    )
    return EXIT_OK


async def cmd_resolve(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    from langgraph_idem_saver.inspection import Resolution, aresolve_unknown, aretry_failed

    prefix = args.entry.strip().lower()
    if len(prefix) < MIN_KEY_PREFIX:
        raise CliError(
            f"entry key prefix {args.entry!r} is too short: give at least {MIN_KEY_PREFIX} "
            "characters (as shown by idem-saver ledger / pending)",
            EXIT_USAGE,
        )
    if args.thread is not None:
        await require_thread(insp, args.thread)
    matches = await insp.match_entries(prefix, args.thread)
    if not matches:
        where = f" in thread {args.thread!r}" if args.thread else ""
        raise CliError(f"no ledger entry with key {prefix!r}{where} (see: idem-saver pending)")
    if len({k for _, k in matches}) > 1 or len(matches) > 1:
        found = []
        for scope, key in matches[:5]:
            entry = await insp.saver.aget_entry(scope, key)
            found.append(f"{key[:KEY_SHORT]} (thread {entry.thread_id if entry else scope!r})")
        hint = "a longer prefix" if len({k for _, k in matches}) > 1 else "--thread"
        raise CliError(
            f"entry {prefix!r} is ambiguous: {', '.join(found)}; give {hint}", EXIT_USAGE
        )
    scope, key = matches[0]
    entry = await insp.saver.aget_entry(scope, key)
    if entry is None:
        raise CliError(f"ledger entry {key[:KEY_SHORT]} disappeared while being read")
    if args.expect_attempts is not None and args.expect_attempts != entry.attempts:
        raise CliError(
            f"entry {key[:KEY_SHORT]} ({entry.tool_name}) changed since it was shown: "
            f"attempt {entry.attempts} now, {args.expect_attempts} expected; look at it again"
        )
    resolution: Resolution = "completed" if args.completed else "failed" if args.failed else "rerun"
    try:
        if args.retry:
            settled = await aretry_failed(insp.saver, entry, note=args.note)
        else:
            settled = await aresolve_unknown(
                insp.saver,
                entry,
                resolution,
                result=args.result,
                error=args.error,
                force=args.force,
                note=args.note,
            )
    except LedgerStateError as exc:
        raise CliError(f"refused: {exc}") from None
    if args.retry:
        resolution = "rerun"
    status = "released" if settled.status is CallStatus.ISSUED else settled.status.value
    if out.as_json:
        out.json(
            {
                "key": key,
                "thread_id": entry.thread_id,
                "tool": entry.tool_name,
                "resolution": resolution,
                "status": status,
            }
        )
        return EXIT_OK
    what = {
        "completed": "completed: the next resume replays the given result",
        "failed": "failed: the next resume returns the error to the model",
        "rerun": "released: the next resume runs the tool again",
    }[resolution]
    out.line(f"entry {key[:KEY_SHORT]} ({entry.tool_name}, thread {entry.thread_id!r}) {what}")
    return EXIT_OK


@dataclasses.dataclass
class PrunePlan:
    thread_id: str
    checkpoints: int = 0
    delete: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    delete_writes: int = 0


def plan_prune(nodes: Sequence[CheckpointNode], before: datetime | None) -> dict[str, PrunePlan]:
    """Which checkpoints ``keep_latest`` (``before`` None) or ``--before`` would delete.

    Both keep each namespace's latest checkpoint and the ancestors a kept checkpoint's
    ``DeltaChannel`` still replays from (``saver_base.checkpoints_to_keep``), as the
    savers' ``aprune`` does; ``--before`` also keeps every checkpoint created at or after
    ``before``, and those whose id carries no time.
    """
    from langgraph_idem_saver.saver_base import checkpoints_to_keep

    groups: dict[tuple[str, str], dict[str, CheckpointNode]] = defaultdict(dict)
    for n in nodes:
        groups[(n.thread_id, n.checkpoint_ns)][n.checkpoint_id] = n
    plans: dict[str, PrunePlan] = {}
    for (thread_id, ns), by_id in sorted(groups.items()):
        plan = plans.setdefault(thread_id, PrunePlan(thread_id))
        plan.checkpoints += len(by_id)

        def read(
            cid: str, by_id: dict[str, CheckpointNode] = by_id
        ) -> tuple[str | None, dict[str, Any]] | None:
            n = by_id.get(cid)
            return None if n is None else (n.parent_checkpoint_id, _metadata(n.metadata))

        head = max(by_id)
        keep = {head}
        if before is not None:
            for cid in by_id:
                created = checkpoint_time(cid)
                if created is None or created >= before:
                    keep.add(cid)
        for cid in list(keep):
            parent = by_id[cid].parent_checkpoint_id
            if parent is not None and parent not in keep:  # a boundary of what stays
                keep.update(checkpoints_to_keep(cid, read))
        for cid, n in sorted(by_id.items()):
            if cid not in keep:
                plan.delete.append((thread_id, ns, cid))
                plan.delete_writes += n.writes
    return plans


async def cmd_prune(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    before = parse_when(args.before) if args.before else None
    threads: list[str] | None = None
    if args.thread:
        threads = list(dict.fromkeys(args.thread))
        for t in threads:
            await require_thread(insp, t)
    plans = plan_prune(await insp.checkpoint_nodes(threads), before)
    doomed = [p for p in plans.values() if p.delete]
    blobs_deleted = 0
    if args.apply and doomed:
        if before is None:
            blobs_at_start = (await insp.counts()).blobs
            await insp.saver.aprune([p.thread_id for p in doomed], strategy="keep_latest")
            blobs_deleted = blobs_at_start - (await insp.counts()).blobs
        else:
            keys = [k for p in doomed for k in p.delete]
            _, _, blobs_deleted = await insp.delete_checkpoints(keys)
    totals = {
        "checkpoints": sum(p.checkpoints for p in plans.values()),
        "delete_checkpoints": sum(len(p.delete) for p in plans.values()),
        "delete_writes": sum(p.delete_writes for p in plans.values()),
        "blobs_deleted": blobs_deleted,
    }
    if out.as_json:
        out.json(
            {
                "mode": "keep_latest" if before is None else "before",
                "before": iso(before),
                "applied": bool(args.apply),
                "threads": [
                    {
                        "thread_id": p.thread_id,
                        "checkpoints": p.checkpoints,
                        "delete_checkpoints": len(p.delete),
                        "delete_writes": p.delete_writes,
                    }
                    for p in plans.values()
                ],
                "totals": totals,
            }
        )
        return EXIT_OK
    verb = "deleted" if args.apply else "would delete"
    rule = (
        "keep the latest checkpoint of each namespace"
        if before is None
        else f"delete checkpoints created before {short_time(before)} UTC (the latest of "
        "each namespace is always kept)"
    )
    if doomed:
        out.table(
            f"prune: {rule}",
            ["thread", "checkpoints", verb, "their pending writes"],
            ([p.thread_id, p.checkpoints, len(p.delete), p.delete_writes] for p in doomed),
        )
    summary = (
        f"{verb} {totals['delete_checkpoints']} of {totals['checkpoints']} checkpoint(s) and "
        f"{totals['delete_writes']} pending write(s) in {len(doomed)} thread(s)"
    )
    if args.apply:
        summary += f", and {blobs_deleted} unreferenced blob(s)"
    out.line(summary + "; ledger entries are never pruned")
    if doomed and not args.apply:
        out.line("dry run: nothing was changed; add --apply to delete")
    return EXIT_OK


async def cmd_stats(insp: Inspector, args: argparse.Namespace, out: Out) -> int:
    c = await insp.counts()
    unknown = len(await insp.saver.alist_unknown())
    issued = c.ledger_by_status.get("issued", 0)
    by_state = {
        "completed": c.ledger_by_status.get("completed", 0),
        "failed": c.ledger_by_status.get("failed", 0),
        "unknown": unknown,
        "in_progress": max(issued - unknown, 0),
    }
    doc = {
        "backend": insp.backend,
        "database": insp.database,
        "schema_version": c.schema_version,
        "threads": c.threads,
        "checkpoints": c.checkpoints,
        "blobs": c.blobs,
        "writes": c.writes,
        "ledger": {
            "total": sum(c.ledger_by_status.values()),
            "by_status": dict(sorted(c.ledger_by_status.items())),
            "by_state": by_state,
            "replays": c.replays,
            "conflicts": c.conflicts,
        },
        "size_bytes": c.size_bytes,
    }
    if out.as_json:
        out.json(doc)
        return EXIT_OK
    rows: list[list[Any]] = [
        ["database", f"{insp.database} ({insp.backend}, schema v{c.schema_version})"],
        ["threads", c.threads],
        ["checkpoints", c.checkpoints],
        ["blobs", c.blobs],
        ["pending writes", c.writes],
        ["ledger entries", doc["ledger"]["total"]],  # type: ignore[index]
    ]
    rows += [[f"  {state.replace('_', ' ')}", n] for state, n in by_state.items()]
    rows += [["  replays", c.replays], ["  conflicts", c.conflicts]]
    rows.append(["size", "-" if c.size_bytes is None else human_size(c.size_bytes)])
    out.table(None, ["", "count"], rows)
    return EXIT_OK


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover


COMMANDS = {
    "threads": cmd_threads,
    "history": cmd_history,
    "show": cmd_show,
    "diff": cmd_diff,
    "ledger": cmd_ledger,
    "pending": cmd_pending,
    "resolve": cmd_resolve,
    "prune": cmd_prune,
    "stats": cmd_stats,
}
WRITE_COMMANDS = {"resolve", "prune"}


# --- the parser ----------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (exit 2), like the rest of the CLI."""

    def error(self, message: str) -> Any:
        raise CliError(f"{message} (see: {self.prog} --help)", EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        help=f"SQLite file or PostgreSQL DSN (default: ${ENV_DB})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )

    parser = _Parser(
        prog="idem-saver",
        description="Inspect and maintain langgraph-idem-saver databases (SQLite or "
        "PostgreSQL): threads, checkpoints, the tool-call ledger.",
        epilog="Exit codes: 0 ok, 1 refused or not found, 2 usage or bad input. "
        "More: python -c 'import langgraph_idem_saver.cli as c; help(c)'",
    )
    parser.add_argument("--db", help=f"SQLite file or PostgreSQL DSN (default: ${ENV_DB})")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    from langgraph_idem_saver import __version__

    parser.add_argument("--version", action="version", version=f"idem-saver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    sub.add_parser(
        "demo",
        help="crash a ReAct agent mid tool batch and resume it; keeps its database "
        "(demo --db PATH, default ./idem-demo.db, overwritten on each run)",
    )
    p = sub.add_parser("threads", parents=[common], help="threads: status, updates, unknowns")
    p.add_argument("--limit", type=int, default=0, help="show the N most recently updated")

    def thread_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("thread", help="thread id")
        p.add_argument("--ns", default="", help="checkpoint namespace (default: root)")

    p = sub.add_parser("history", parents=[common], help="a thread's checkpoints, newest first")
    thread_args(p)
    p.add_argument("--limit", type=int, default=50, help="at most N (default 50; 0 = all)")

    p = sub.add_parser("show", parents=[common], help="a checkpoint's decoded state")
    thread_args(p)
    p.add_argument("--checkpoint", help="checkpoint id or unique prefix (default: latest)")
    p.add_argument("--all", action="store_true", help="include LangGraph's internal channels")

    p = sub.add_parser("diff", parents=[common], help="what changed between two checkpoints")
    thread_args(p)
    p.add_argument("--from", dest="from_", help="older checkpoint (default: parent of --to)")
    p.add_argument("--to", help="newer checkpoint (default: latest)")
    p.add_argument("--all", action="store_true", help="include LangGraph's internal channels")

    p = sub.add_parser("ledger", parents=[common], help="a thread's recorded tool calls")
    p.add_argument("thread", help="thread id")
    p.add_argument("--agent", help="only this agent path (e.g. 'tools' or 'supervisor|tools')")

    p = sub.add_parser("pending", parents=[common], help="unknown outcomes across all threads")
    p.add_argument(
        "--stale",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="also list live claims older than this, with their owner (default 600)",
    )

    p = sub.add_parser(
        "resolve",
        parents=[common],
        help="settle an unknown outcome",
        description="Settle an unknown outcome after checking the outside world.",
    )
    p.add_argument(
        "entry", metavar="ENTRY", help=f"ledger key or unique prefix (>= {MIN_KEY_PREFIX})"
    )
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("--completed", action="store_true", help="it happened; needs --result")
    how.add_argument("--failed", action="store_true", help="it failed; --error says why")
    how.add_argument("--rerun", action="store_true", help="it did not happen: run it again")
    how.add_argument(
        "--retry", action="store_true", help="a failed call's failure was transient: run again"
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="settle a claim whose lease still runs (its process, e.g. on another host, is gone)",
    )
    p.add_argument("--note", help="why, kept in the entry's audit trail")
    p.add_argument("--result", help="the tool's answer, replayed to the model")
    p.add_argument("--error", help="the error replayed to the model")
    p.add_argument("--thread", help="the entry's thread (when its key is in several)")
    p.add_argument(
        "--expect-attempts",
        type=int,
        help="refuse unless the entry is still at this attempt (as shown by --json)",
    )

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="delete old checkpoints (dry run unless --apply)",
        description="Delete old checkpoints; a dry run unless --apply. Ledger entries are "
        "never pruned. The latest checkpoint of each namespace is always kept.",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--keep-latest", action="store_true", help="keep only the latest (the saver's aprune)"
    )
    what.add_argument(
        "--before",
        metavar="DATE",
        help="delete checkpoints created before DATE (YYYY-MM-DD[THH:MM], UTC; or 30d, 12h)",
    )
    p.add_argument("--thread", nargs="+", action="extend", metavar="T", help="only these threads")
    p.add_argument("--apply", action="store_true", help="really delete")

    sub.add_parser("stats", parents=[common], help="row counts, ledger states, size")
    return parser


def _error_code(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, NotADatabaseError):
        return EXIT_USAGE, str(exc)
    if isinstance(exc, LedgerStateError):
        return EXIT_REFUSED, f"refused: {exc}"
    if isinstance(exc, (SchemaVersionError, ConnectionClosedError, DatabaseLockedError)):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, IdemSaverError):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, sqlite3.Error):
        return EXIT_REFUSED, f"SQLite: {exc}"
    return EXIT_REFUSED, f"{type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``idem-saver`` entry point; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "demo":
        from langgraph_idem_saver.demo import main as demo_main

        return demo_main(args_list[1:])
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help / --version
            return int(exc.code or 0)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE if args_list else EXIT_OK
        target = args.db or os.environ.get(ENV_DB)
        if not target:
            raise CliError(f"no database: pass --db PATH_OR_DSN or set ${ENV_DB}", EXIT_USAGE)
        if args.command == "resolve":
            if args.completed and args.result is None:
                raise CliError("--completed needs --result TEXT (the tool's answer)", EXIT_USAGE)
            if args.result is not None and not args.completed:
                raise CliError("--result goes with --completed", EXIT_USAGE)
            if args.error is not None and not args.failed:
                raise CliError("--error goes with --failed", EXIT_USAGE)
            if args.force and args.retry:
                raise CliError("--force settles unknown outcomes; --retry reopens failed calls",
                               EXIT_USAGE)
        if args.command in ("history",) and args.limit < 0:
            raise CliError("--limit must be >= 0", EXIT_USAGE)
        out = Out(bool(args.json))
        write = args.command == "resolve" or (args.command == "prune" and args.apply)
        return asyncio.run(_run(target, args, out, write=write))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code, message = _error_code(exc)
        message = " ".join(message.split())
        print(f"idem-saver: error: {message}", file=sys.stderr)
        return code


async def _run(target: str, args: argparse.Namespace, out: Out, *, write: bool) -> int:
    async with open_inspector(target, write=write) as insp:
        return await COMMANDS[args.command](insp, args, out)


if __name__ == "__main__":
    raise SystemExit(main())
