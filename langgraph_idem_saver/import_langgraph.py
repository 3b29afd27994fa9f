"""Adopting a database that LangGraph's own saver filled: import its threads into ours.

Our tables are separate from LangGraph's (``idem_*``), so switching an existing
``agent.db`` (or Postgres schema) to our saver would silently hide every thread. This
module copies every checkpoint, channel value and pending write from LangGraph's tables
in the same SQLite file / Postgres schema into ours, and warns on ``setup()`` while there
is something to import.

How, and why so:

* Rows are decoded (each backend's reader, ``sqlite/import_sql.py`` and
  ``postgres/import_sql.py``, mirrors LangGraph's own ``aget_tuple``) and written
  (``import_copy.py``) through our saver's ``aput_writes`` / ``aput``, with the
  ``new_versions`` a live run would have passed (the channels whose version differs from
  the parent's): our storage format stays exactly what a live run writes (list deltas
  included), never a byte copy of another format. Ids, parent ids, metadata, versions
  and task ids/paths are kept.
* **A thread is imported whole or not at all.** Its checkpoints are written under a
  staging thread id (``STAGING_PREFIX`` + its id), then renamed to its own id in one
  transaction once every checkpoint of it is in (and read back): an import that fails or
  is killed midway leaves none of that thread visible under its id (so ``setup()`` still
  warns about it), never a few of its checkpoints. Staged rows left by a killed run are
  deleted by the next run, which imports the thread again.
* **Idempotent and resumable.** A thread in our tables is complete (see above); its
  checkpoints are skipped. A killed import re-run continues with the thread it was on; a
  finished one changes nothing. What LangGraph's saver added to an imported thread later
  - checkpoints, and pending writes of checkpoints already imported (an interrupt
  answered there, a task finished) - is imported by a re-run, as a whole too.
* **Verified.** Each imported checkpoint is read back through our ``aget_tuple`` and
  compared with the source (checkpoint, metadata, parent, pending writes);
  :class:`~langgraph_idem_saver.errors.ImportVerificationError` stops the import at the
  first difference.
* Pending writes are kept as LangGraph's saver stored them, special ones included
  (``WRITES_IDX_MAP``: an error, a scheduled write, an interrupt, its answer).
* Layouts: ``langgraph-checkpoint-sqlite`` / ``-postgres`` current (3.x) and the previous
  major (2.x, whose ``writes`` table may lack ``task_path``), told apart by the columns.

Run it while nothing writes to LangGraph's tables (the old application stopped).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from langgraph_idem_saver.errors import ConfigError, ImportLayoutError
from langgraph_idem_saver.import_copy import Copier
from langgraph_idem_saver.import_rows import ImportReport, Key, LangGraphTables
from langgraph_idem_saver.saver_checkpoints import CheckpointMethods

LOG = logging.getLogger("langgraph_idem_saver.import")

DEFAULT_BATCH_SIZE = 200
CLI_COMMAND = "idem-saver import-langgraph"
# the thread ids a thread is written under while it is imported (reserved: a thread of
# ours whose id starts with it is deleted by the next import)
STAGING_PREFIX = "idem-saver:importing:"

# What both backends ask of our own tables (``{p}``: the driver's placeholder).
SELECT_IMPORTED = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, w.task_id, w.idx
FROM idem_checkpoints AS c LEFT JOIN idem_writes AS w
    ON w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
    AND w.checkpoint_id = c.checkpoint_id
WHERE (c.thread_id, c.checkpoint_ns, c.checkpoint_id) BETWEEN ({p}, {p}, {p}) AND ({p}, {p}, {p})
"""
COUNT_CHECKPOINTS = "SELECT count(*) FROM checkpoints"
# One index seek per thread, not one per checkpoint (it runs at every setup() while
# LangGraph's tables are there): a loose index scan over their primary key.
SELECT_UNIMPORTED_THREAD = """
WITH RECURSIVE t(thread_id) AS (
    SELECT min(thread_id) FROM checkpoints
    UNION ALL
    SELECT (SELECT min(c.thread_id) FROM checkpoints AS c WHERE c.thread_id > t.thread_id)
    FROM t WHERE t.thread_id IS NOT NULL
)
SELECT 1 FROM t
WHERE t.thread_id IS NOT NULL
    AND NOT EXISTS (SELECT 1 FROM idem_checkpoints AS i WHERE i.thread_id = t.thread_id)
LIMIT 1
"""
# A staged thread becomes the real one, in one transaction (each statement's parameters:
# the real id, the staged id). A blob the real thread already has (the same channel
# version, written by an earlier import of the thread) is kept; the staged copy dropped.
PUBLISH = (
    "UPDATE idem_checkpoints SET thread_id = {p} WHERE thread_id = {p}",
    "UPDATE idem_writes SET thread_id = {p} WHERE thread_id = {p}",
    """DELETE FROM idem_blobs WHERE EXISTS (
        SELECT 1 FROM idem_blobs AS b WHERE b.thread_id = {p}
            AND b.checkpoint_ns = idem_blobs.checkpoint_ns AND b.channel = idem_blobs.channel
            AND b.version = idem_blobs.version) AND thread_id = {p}""",
    "UPDATE idem_blobs SET thread_id = {p} WHERE thread_id = {p}",
)
# the staged rows of a failed or killed import (parameters: ``staged_range()``)
DISCARD_STAGED = tuple(
    f"DELETE FROM {table} WHERE thread_id >= {{p}} AND thread_id < {{p}}"
    for table in ("idem_checkpoints", "idem_writes", "idem_blobs")
)
# LangGraph's writes of a page of its checkpoints, the page's first key to its last
# (``{table}``, ``{value}``: the layout's names; ``{task_path}`` left for the reader:
# the column, or an empty text in a layout without it)
SELECT_WRITES = """
SELECT thread_id, checkpoint_ns, checkpoint_id, task_id, {{task_path}}, idx, channel, type, {value}
FROM {table}
WHERE (thread_id, checkpoint_ns, checkpoint_id) BETWEEN ({p}, {p}, {p}) AND ({p}, {p}, {p})
"""


@dataclass(frozen=True)
class ImportSql:
    """The import's statements with one driver's placeholder (``?``, ``%s``), for a
    backend's reader of LangGraph's tables (``*/import_sql.py``)."""

    select_writes: str  # ``{task_path}`` left to fill
    select_imported: str
    publish: tuple[str, ...]
    discard_staged: tuple[str, ...]

    @classmethod
    def of(cls, p: str, *, writes_table: str, value: str) -> ImportSql:
        """With placeholder ``p``; LangGraph's writes in ``writes_table``, their values
        in its column ``value``."""
        return cls(
            SELECT_WRITES.format(p=p, table=writes_table, value=value),
            SELECT_IMPORTED.format(p=p),
            tuple(q.format(p=p) for q in PUBLISH),
            tuple(q.format(p=p) for q in DISCARD_STAGED),
        )


def staged_id(thread_id: str) -> str:
    """The thread id ``thread_id``'s checkpoints are written under until it is whole."""
    return STAGING_PREFIX + thread_id


def imported_writes(rows: Sequence[Any]) -> dict[Key, set[tuple[str, int]]]:
    """``SELECT_IMPORTED``'s rows: each checkpoint's key, with its writes' (task id, index)."""
    out: dict[Key, set[tuple[str, int]]] = {}
    for thread_id, ns, checkpoint_id, task_id, idx in rows:
        writes = out.setdefault((thread_id, ns, checkpoint_id), set())
        if task_id is not None:
            writes.add((task_id, idx))
    return out


def staged_range() -> tuple[str, str]:
    """Bounds of the staging ids, ``low <= id < high`` (binary / "C" order)."""
    return STAGING_PREFIX, STAGING_PREFIX[:-1] + chr(ord(STAGING_PREFIX[-1]) + 1)


@runtime_checkable
class BesideLangGraph(Protocol):
    """A saver whose database may hold LangGraph's own tables. Each backend's saver
    hands its reader of them (``*/import_sql.py``) through this one hook, so nothing here
    names a backend."""

    def _langgraph_tables(self) -> LangGraphTables:
        """The reader of LangGraph's tables beside this saver's own."""
        ...


def tables_of(saver: object) -> LangGraphTables:
    """The reader of LangGraph's tables beside ``saver``'s own."""
    if isinstance(saver, BesideLangGraph):
        return saver._langgraph_tables()
    raise ConfigError(
        f"importing LangGraph's tables needs an AsyncSqliteSaver or AsyncPostgresSaver "
        f"of langgraph-idem-saver, got {type(saver).__name__}"
    )


async def aimport_langgraph(
    saver: CheckpointMethods,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    verify: bool = True,
    progress: Callable[[ImportReport], None] | None = None,
) -> ImportReport:
    """Copy every thread in LangGraph's own tables beside ``saver``'s into ``saver``.

    Args:
        saver: an ``AsyncSqliteSaver`` or ``AsyncPostgresSaver``; LangGraph's tables are
            read from the same SQLite file / the same Postgres schema (``search_path``).
            Its serializer must read what LangGraph's saver wrote (the same
            ``EncryptedSerializer`` key, if one was used).
        batch_size: checkpoints read per round trip (memory is bounded by it).
        verify: read each imported checkpoint back and compare it with the source.
        progress: called with the report so far after each batch (``checkpoints_found``
            of ``checkpoints_total``).

    Returns the counts. A thread is imported whole or not at all: one that fails (or an
    import killed on it) leaves none of its checkpoints under its id. Idempotent (a re-run
    imports nothing) and resumable (a killed run, re-run, finishes). Raises (from
    :mod:`langgraph_idem_saver.errors`)
    ``ImportLayoutError`` for tables it cannot read, ``CorruptRecordError`` for a row that
    does not decode, ``ImportVerificationError`` for a copy that does not read back equal.
    """
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    started = time.monotonic()
    tables = tables_of(saver)
    report = ImportReport()
    layout = await tables.alayout()
    if layout is None:
        return report
    report.source = layout.name
    report.checkpoints_total = await tables.acount()
    copier = Copier(saver, report, verify)
    await tables.adiscard_staged()  # what a killed run left: imported again below
    thread: str | None = None
    imported_before = 0  # what was written before the current thread

    async def publish() -> None:
        if thread is not None and copier.written() > imported_before:
            await tables.apublish(staged_id(thread), thread)
            report.count_thread(thread, imported=True)

    try:
        after: Key | None = None
        while rows := await tables.apage(layout, after, batch_size):
            present = await tables.aimported(rows[0].key, rows[-1].key)
            for row in rows:
                if row.thread_id != thread:
                    await publish()
                    thread, imported_before = row.thread_id, copier.written()
                into = staged_id(row.thread_id)
                await copier.acopy(row, present=present.get(row.key), into=into)
            after = rows[-1].key
            report.batches += 1
            report.seconds = time.monotonic() - started
            if progress is not None:
                progress(report)
        published = report.threads_imported
        await publish()
        if progress is not None and report.threads_imported != published:
            progress(report)  # the last thread is in
    except BaseException:
        # the thread in progress: none of it becomes visible (a killed run's rows are
        # deleted by the next run)
        try:
            await tables.adiscard_staged()
        except Exception:  # the first error is the one to report
            LOG.debug("deleting the staged rows of a failed import failed", exc_info=True)
        raise
    report.seconds = time.monotonic() - started
    return report


async def awarn_if_unimported(saver: CheckpointMethods) -> None:
    """Log one warning when LangGraph's tables beside ours hold threads ours lacks.

    Called once by each saver's ``setup()``. Tables named like LangGraph's that are not
    LangGraph's (another program's ``checkpoints``) are not ours to mention, nor are
    LangGraph's tables beside a ``ToolLedger``'s (``ledger_only``): its graph's
    checkpointer reads them itself.
    """
    if getattr(saver, "ledger_only", False):
        return
    tables = tables_of(saver)
    try:
        layout = await tables.alayout()
    except ImportLayoutError:
        return
    if layout is None or not await tables.ahas_unimported_threads():
        return
    LOG.warning(
        "LangGraph's own checkpoint tables in %s hold threads that this saver does not "
        "have (its tables are separate), so those conversations are not visible here. "
        "Import them once: `%s %s`, or `await saver.aimport_langgraph()` "
        "(`saver.import_langgraph()` on a sync saver).",
        tables.where(),
        CLI_COMMAND,
        tables.target(),
    )
