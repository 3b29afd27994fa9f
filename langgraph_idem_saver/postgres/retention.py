"""Retention on PostgreSQL: the SQL of ``asweep`` and the mixin ``AsyncPostgresSaver``
inherits.

Each batch is one transaction that first takes the exclusive per-thread advisory locks
deletes and prunes take (``sql.LOCK_THREADS``), so an ``aput`` writing a list delta
waits for it and then finds its base, or writes whole (see ``sql.THREAD_LOCK_SPACE``).
Writes of whole values and ledger claims do not take that lock; so the batch re-checks
the threads it found idle and ``delete`` removes them in one statement whose guard sees
the same snapshot as its deletes: a checkpoint or claim committed before that snapshot
spares the thread, one committed after it is not among the rows deleted. The policy is
in :mod:`langgraph_idem_saver.retention`.

Statements are sent unprepared, planned for the tables as they are (see the thread
maintenance section of ``saver.py``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from langgraph_idem_saver.postgres import sql
from langgraph_idem_saver.retention import RetentionBase, RowCounts, ended_event

if TYPE_CHECKING:
    from langgraph_idem_saver.retention import Cutoffs, LedgerRule

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]

# per thread: its newest checkpoint id and when its ledger was last touched
SELECT_ACTIVITY = """
SELECT c.thread_id, c.head, l.last
FROM (SELECT thread_id, MAX(checkpoint_id) AS head FROM idem_checkpoints
      WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id) AS c
LEFT JOIN (SELECT thread_id, GREATEST(MAX(issued_at), MAX(finished_at)) AS last
           FROM idem_tool_calls WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id) AS l
  ON l.thread_id = c.thread_id
"""

# rows per thread: (table, thread_id, count)
COUNT_ROWS = """
SELECT 'c', thread_id, count(*) FROM idem_checkpoints
WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
UNION ALL
SELECT 'w', thread_id, count(*) FROM idem_writes
WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
UNION ALL
SELECT 'b', thread_id, count(*) FROM idem_blobs
WHERE thread_id = ANY(%(threads)s) GROUP BY thread_id
"""

# "delete": every row of the threads, unless (in this statement's snapshot) a thread
# checkpointed at or after the bound or touched its ledger since the cutoff
DELETE_IDLE_THREADS = """
WITH busy AS (
    SELECT thread_id FROM idem_checkpoints
    WHERE thread_id = ANY(%(threads)s) AND checkpoint_id >= %(bound)s
  UNION
    SELECT thread_id FROM idem_tool_calls
    WHERE thread_id = ANY(%(threads)s) AND (issued_at >= %(since)s OR finished_at >= %(since)s)
), idle AS (
    SELECT t FROM unnest(%(threads)s::text[]) AS t WHERE t NOT IN (SELECT thread_id FROM busy)
), c AS (DELETE FROM idem_checkpoints WHERE thread_id IN (SELECT t FROM idle)),
   w AS (DELETE FROM idem_writes WHERE thread_id IN (SELECT t FROM idle))
DELETE FROM idem_blobs WHERE thread_id IN (SELECT t FROM idle)
"""

# ledger entries a rule may remove ({which}, {removable}: retention.LedgerRule.sql)
DELETE_REMOVABLE = """
DELETE FROM idem_tool_calls AS l
USING unnest(%(scopes)s::text[], %(keys)s::text[]) AS u (scope, key)
WHERE l.scope = u.scope AND l.key = u.key AND {which} AND {removable}
"""

# the entries a deletion kept of threads left without a checkpoint: the "conversation
# ended" event appended to their history (retention.ENDED); thread-scoped only (a named
# namespace's entries are shared across threads by design)
MARK_ENDED = """
UPDATE idem_tool_calls AS l
SET history = (COALESCE(l.history, '[]')::jsonb || jsonb_build_array(%(event)s::jsonb))::text
WHERE l.thread_id = ANY(%(threads)s) AND l.scope = l.thread_id
  AND NOT EXISTS (SELECT 1 FROM idem_checkpoints AS c WHERE c.thread_id = l.thread_id)
"""

COUNT_ISSUED_BEFORE = (
    "SELECT count(*) FROM idem_tool_calls WHERE status = 'issued' AND issued_at < %(since)s"
)
# whether a table is on the search path (a ToolLedger's marker: RetentionBase)
SELECT_TABLE = "SELECT to_regclass(%(name)s) IS NOT NULL"


async def mark_ended(cur: Cursor, threads: Sequence[str], by: str) -> None:
    """Inside a deleting transaction: mark what it kept of ``threads`` (``MARK_ENDED``)."""
    params = {"threads": list(threads), "event": ended_event(by)}
    await cur.execute(MARK_ENDED, params, prepare=False)


async def _counts(cur: Cursor, threads: Sequence[str]) -> dict[str, RowCounts]:
    await cur.execute(COUNT_ROWS, {"threads": list(threads)}, prepare=False)
    return RowCounts.by_thread(await cur.fetchall(), threads)


class PostgresRetention(RetentionBase):
    """``asweep``'s primitives on PostgreSQL (mixed into :class:`AsyncPostgresSaver`)."""

    _MARKER = "%({})s"

    if TYPE_CHECKING:

        async def _run(
            self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
        ) -> T: ...

        @staticmethod
        async def _keep_latest_rows(cur: Cursor, threads: Sequence[str]) -> None: ...

    async def _fetch(self, query: str, params: dict[str, Any]) -> list[TupleRow]:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(query, params, prepare=False)
            return await cur.fetchall()

        return await self._run(read)

    async def _read_pairs(self, query: str, params: dict[str, Any]) -> list[tuple[str, str]]:
        return [(r[0], r[1]) for r in await self._fetch(query, params)]

    async def _sweep_threads(
        self, cut: Cutoffs, threads: list[str]
    ) -> list[tuple[RowCounts, RowCounts]]:
        async def sweep(cur: Cursor) -> list[tuple[RowCounts, RowCounts]]:
            await cur.execute(sql.LOCK_THREADS, {"threads": threads}, prepare=False)
            await cur.execute(SELECT_ACTIVITY, {"threads": threads}, prepare=False)
            idle = [t for t, head, last in await cur.fetchall() if cut.idle(head, last)]
            if not idle:
                return []
            before = await _counts(cur, idle)
            if cut.strategy == "delete":
                params = {"threads": idle, "bound": cut.bound_id, "since": cut.since}
                await cur.execute(DELETE_IDLE_THREADS, params, prepare=False)
                await mark_ended(cur, idle, "sweep")
            else:
                await self._keep_latest_rows(cur, idle)
            after = await _counts(cur, idle)
            return cut.batch_counts(idle, before, after)

        return await self._run(sweep, tx=True)

    async def _remove_entries(self, rule: LedgerRule, keys: list[tuple[str, str]]) -> int:
        query = rule.sql(DELETE_REMOVABLE, self._MARKER)
        params = {
            **rule.params(),
            "scopes": [k[0] for k in keys],
            "keys": [k[1] for k in keys],
        }

        async def remove(cur: Cursor) -> int:
            await cur.execute(query, params, prepare=False)
            return cur.rowcount

        return await self._run(remove)

    async def _count_issued_before(self, since: float) -> int:
        rows = await self._fetch(COUNT_ISSUED_BEFORE, {"since": since})
        return int(rows[0][0])

    async def _ledger_only(self) -> bool:
        rows = await self._fetch(SELECT_TABLE, {"name": self.LEDGER_ONLY_TABLE})
        return bool(rows[0][0])
