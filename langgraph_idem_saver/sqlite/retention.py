"""Retention on SQLite: the SQL of ``asweep`` and the mixin ``AsyncSqliteSaver`` inherits.

Each batch is one write transaction (``BEGIN IMMEDIATE``, through the saver's group
commit), so it is serialized with every other writer: the threads it re-checks as idle
inside it cannot gain a checkpoint or a claim before it commits. Candidates are found
by reads, which in WAL mode block nobody. The policy is in
:mod:`langgraph_idem_saver.retention`.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_idem_saver.retention import RetentionBase, RowCounts, ended_event

if TYPE_CHECKING:
    from langgraph_idem_saver.retention import Cutoffs, LedgerRule

T = TypeVar("T")

# a thread's newest checkpoint id and when its ledger was last touched
SELECT_ACTIVITY = """
SELECT (SELECT MAX(checkpoint_id) FROM idem_checkpoints WHERE thread_id = ?1),
       (SELECT MAX(MAX(issued_at), COALESCE(MAX(finished_at), 0))
        FROM idem_tool_calls WHERE thread_id = ?1)
"""

# rows per thread of a JSON array of thread ids: (table, thread_id, count)
COUNT_ROWS = """
SELECT 'c', thread_id, COUNT(*) FROM idem_checkpoints
WHERE thread_id IN (SELECT value FROM json_each(?1)) GROUP BY thread_id
UNION ALL
SELECT 'w', thread_id, COUNT(*) FROM idem_writes
WHERE thread_id IN (SELECT value FROM json_each(?1)) GROUP BY thread_id
UNION ALL
SELECT 'b', thread_id, COUNT(*) FROM idem_blobs
WHERE thread_id IN (SELECT value FROM json_each(?1)) GROUP BY thread_id
"""

# a ledger entry a rule may remove ({which}, {removable}: retention.LedgerRule.sql)
DELETE_REMOVABLE = """
DELETE FROM idem_tool_calls AS l
WHERE l.scope = :s AND l.key = :k AND {which} AND {removable}
"""

# the entries a deletion kept of threads left without a checkpoint: the "conversation
# ended" event appended to their history (retention.ENDED); thread-scoped only (a named
# namespace's entries are shared across threads by design)
MARK_ENDED = """
UPDATE idem_tool_calls AS l SET history = json_insert(
    CASE WHEN json_valid(l.history) THEN l.history ELSE '[]' END, '$[#]', json(:event))
WHERE l.thread_id IN (SELECT value FROM json_each(:threads)) AND l.scope = l.thread_id
  AND NOT EXISTS (SELECT 1 FROM idem_checkpoints AS c WHERE c.thread_id = l.thread_id)
"""

COUNT_ISSUED_BEFORE = (
    "SELECT COUNT(*) FROM idem_tool_calls WHERE status = 'issued' AND issued_at < ?"
)
SELECT_TABLE = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?"


def mark_ended(conn: sqlite3.Connection, threads: Sequence[str], by: str) -> None:
    """Inside a deleting transaction: mark what it kept of ``threads`` (``MARK_ENDED``)."""
    conn.execute(MARK_ENDED, {"threads": json.dumps(list(threads)), "event": ended_event(by)})


def _counts(conn: sqlite3.Connection, threads: Sequence[str]) -> dict[str, RowCounts]:
    return RowCounts.by_thread(conn.execute(COUNT_ROWS, (json.dumps(list(threads)),)), threads)


class SqliteRetention(RetentionBase):
    """``asweep``'s primitives on SQLite (mixed into :class:`AsyncSqliteSaver`)."""

    _MARKER = ":{}"

    if TYPE_CHECKING:

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(
            self, body: Callable[[sqlite3.Connection], T], *, before_tool_runs: bool = False
        ) -> T: ...

        @staticmethod
        def _prune_rows(conn: sqlite3.Connection, ids: Sequence[str], strategy: str) -> None: ...

    async def _read_pairs(self, query: str, params: dict[str, Any]) -> list[tuple[str, str]]:
        return await self._run(lambda c: [(r[0], r[1]) for r in c.execute(query, params)])

    async def _sweep_threads(
        self, cut: Cutoffs, threads: list[str]
    ) -> list[tuple[RowCounts, RowCounts]]:
        def sweep(conn: sqlite3.Connection) -> list[tuple[RowCounts, RowCounts]]:
            idle = [t for t in threads if cut.idle(*conn.execute(SELECT_ACTIVITY, (t,)).fetchone())]
            before = _counts(conn, idle)
            self._prune_rows(conn, idle, cut.strategy)
            if cut.strategy == "delete":
                mark_ended(conn, idle, "sweep")
            after = _counts(conn, idle)
            return cut.batch_counts(idle, before, after)

        return await self._write(sweep)

    async def _remove_entries(self, rule: LedgerRule, keys: list[tuple[str, str]]) -> int:
        query = rule.sql(DELETE_REMOVABLE, self._MARKER)
        base = rule.params()

        def remove(conn: sqlite3.Connection) -> int:
            return sum(conn.execute(query, {**base, "s": s, "k": k}).rowcount for s, k in keys)

        return await self._write(remove)

    async def _count_issued_before(self, since: float) -> int:
        return await self._run(
            lambda c: int(c.execute(COUNT_ISSUED_BEFORE, (since,)).fetchone()[0])
        )

    async def _ledger_only(self) -> bool:
        return await self._run(
            lambda c: c.execute(SELECT_TABLE, (self.LEDGER_ONLY_TABLE,)).fetchone() is not None
        )
