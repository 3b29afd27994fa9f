"""The tool-call ledger's storage hooks on SQLite (mixed into :class:`AsyncSqliteSaver`):
claims committed (and synced) before any tool runs, and the three record primitives. The
policy over them lives in :class:`~langgraph_idem_saver.saver_base.IdemSaverBase`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langgraph_idem_saver.backend import Claims, Guarded, step_params
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry, StepLookup
from langgraph_idem_saver.sqlite import sql

T = TypeVar("T")


class SqliteLedgerStore:
    """Ledger rows on SQLite: claims, guarded updates, writes, reads."""

    if TYPE_CHECKING:

        def entry_of(self, row: Sequence[Any]) -> LedgerEntry: ...

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

        async def _write(
            self, body: Callable[[sqlite3.Connection], T], *, before_tool_runs: bool = False
        ) -> T: ...

    def _claim_rows(self, conn: sqlite3.Connection, claims: Claims) -> list[ClaimOutcome]:
        outcomes = []
        for row in claims.rows:
            claimed = conn.execute(sql.INSERT_ISSUED, claims.params(row)).rowcount == 1
            found = conn.execute(sql.SELECT_ENTRY, row[:2]).fetchone()
            if found is None:  # refused by the fork slot: another branch's call
                found = conn.execute(sql.SELECT_SLOT_HOLDER, claims.slot(row)).fetchone()
            outcomes.append(ClaimOutcome(claimed=claimed, entry=self.entry_of(found)))
        return outcomes

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        return await self._write(lambda conn: self._claim_rows(conn, claims), before_tool_runs=True)

    async def _claim_unless_found(
        self, claims: Claims, lookup: StepLookup
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        """The adoption read and the claim in one write transaction (one hand-off to
        the worker): nothing is written, and nothing synced, when the read finds entries."""

        def claim(conn: sqlite3.Connection) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
            rows = conn.execute(sql.SELECT_STEP_CANDIDATES, step_params(lookup)).fetchall()
            if rows:
                return [self.entry_of(r) for r in rows], None
            return [], self._claim_rows(conn, claims)

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
