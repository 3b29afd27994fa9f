"""The tool-call ledger's storage hooks on SQLite (mixed into :class:`AsyncSqliteSaver`):
claims committed (and synced) before any tool runs, and the three record primitives. The
policy over them lives in :class:`~langgraph_idem_saver.ledger_policy.LedgerPolicy`.
"""

from __future__ import annotations

import asyncio
import operator
import sqlite3
from collections import deque
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import TYPE_CHECKING, Any

from langgraph_idem_saver.backend import Claims, Guarded
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry, StepLookup, records_of
from langgraph_idem_saver.sqlite import cut_short, ledger_batch, sql
from langgraph_idem_saver.sqlite.connection import AS_SET, OUTCOME, SqliteConnection

_ROWCOUNT = operator.attrgetter("rowcount")


def _each_matched(
    conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]]
) -> list[bool | Exception]:
    """Outcome rows an ``UPDATE`` each: whether each matched, or its error (undone alone
    by SQLite, the rows after it recorded); a failure that ends the transaction raised."""
    matched: list[bool | Exception] = []
    left = iter(rows)  # each row's UPDATE through ``map``: no Python frame a row
    while True:
        try:
            updated = map(_ROWCOUNT, map(conn.execute, repeat(sql.FINISH_ENTRY), left))
            deque(map(matched.append, map(operator.eq, updated, repeat(1))), maxlen=0)
            return matched
        except Exception as exc:  # that row's alone; the rest go on after it
            if not conn.in_transaction:
                raise
            matched.append(exc)


if TYPE_CHECKING:
    # what this mixin calls on the connection, as mypy sees it (the saver mixes both in)
    _Connected = SqliteConnection
else:
    _Connected = object


class SqliteLedgerStore(_Connected):
    """Ledger rows on SQLite: claims, guarded updates, writes, reads."""

    if TYPE_CHECKING:

        def entry_of(self, row: Sequence[Any]) -> LedgerEntry: ...

    def _claim_rows(self, conn: sqlite3.Connection, claims: Claims) -> list[ClaimOutcome]:
        """Insert every claim row whose key and slot are free. An inserted row's entry is
        built, not read (``Claims.issued_entry``); the rows refused are read back in one
        statement (a claim refused by a fork slot: the slot's holder, one read each).
        Several rows of distinct keys are one multi-row ``INSERT ... RETURNING``
        (:mod:`.ledger_batch`), others a row's ``INSERT`` each through ``map``
        (``Claims.params``' tuples, no Python frame a row); every row inserted (a fresh
        step), the entries are built at once."""
        shared = (claims.owner, claims.issued_at, claims.lease_expires_at)
        inserted = ledger_batch.claim_inserted(conn, claims.rows, shared)
        if inserted is None:  # one row, a key twice, or an SQLite before 3.35
            params = map(tuple.__add__, claims.rows, repeat(shared))  # Claims.params of each
            inserted = list(map(_ROWCOUNT, map(conn.execute, repeat(sql.INSERT_ISSUED), params)))
        if inserted.count(1) == len(inserted):
            issued = claims.issued_entries()
            outcome = {"claimed": repeat(True), "entry": issued}
            return records_of(ClaimOutcome, outcome, len(issued))
        claimed = [n == 1 for n in inserted]
        refused = [row[:2] for row, new in zip(claims.rows, claimed, strict=True) if not new]
        entries = self._entries_by_keys(conn, refused) if refused else {}
        outcomes = []
        for i, (row, new) in enumerate(zip(claims.rows, claimed, strict=True)):
            if new:
                outcomes.append(ClaimOutcome(claimed=True, entry=claims.issued_entry(i)))
                continue
            entry = entries.get(row[:2])
            if entry is None:  # refused by the fork slot: another branch's call
                found = conn.execute(sql.SELECT_SLOT_HOLDER, claims.slot(row)).fetchone()
                entry = self.entry_of(found)
            outcomes.append(ClaimOutcome(claimed=new, entry=entry))
        return outcomes

    def _entries_by_keys(
        self, conn: sqlite3.Connection, keys: Sequence[tuple[Any, ...]]
    ) -> dict[tuple[Any, ...], LedgerEntry]:
        """(scope, key) -> entry, for those of ``keys`` that exist: one statement (more
        where the connection binds fewer parameters than ``sql.KEYS_PER_READ`` pairs)."""
        found: dict[tuple[Any, ...], LedgerEntry] = {}
        per = max(1, min(sql.KEYS_PER_READ, ledger_batch.variables(conn) // 2))
        for i in range(0, len(keys), per):
            chunk = keys[i : i + per]
            params = [part for pair in chunk for part in pair]
            for row in conn.execute(sql.select_entries_by_keys(len(chunk)), params):
                entry = self.entry_of(row)
                found[entry.scope, entry.key] = entry
        return found

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        try:
            return await self._write(
                lambda conn: self._claim_rows(conn, claims), before_tool_runs=True
            )
        except asyncio.CancelledError:  # committed all the same, nothing runs under it
            self._undo_cut_short(cut_short.unclaim(claims))
            raise

    def _undo_cut_short(self, undo: cut_short.Undo) -> None:
        """A claim whose caller was cancelled: ``undo`` committed after it by the group
        commit (:mod:`.cut_short`). Not set up: the claim was never submitted."""
        if self.is_setup:
            self._group.submit_nowait((undo, AS_SET, False)).add_done_callback(cut_short.logged)

    async def _claim_unless_found(
        self, claims: Claims, lookup: StepLookup
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        """The adoption read and the claim in one write transaction (one hand-off to
        the worker): nothing is written, and nothing synced, when the read finds entries."""

        def claim(conn: sqlite3.Connection) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
            rows = conn.execute(*ledger_batch.step_candidates(lookup, conn)).fetchall()
            if rows:
                return [self.entry_of(r) for r in rows], None
            return [], self._claim_rows(conn, claims)

        try:
            return await self._write(claim, before_tool_runs=True)
        except asyncio.CancelledError:  # see _insert_claims
            self._undo_cut_short(cut_short.unclaim(claims))
            raise

    def _finish_body(
        self, outcome: tuple[Any, ...]
    ) -> Callable[[sqlite3.Connection], tuple[bool, None]]:
        """An outcome's ``UPDATE`` as a write body (``_finish_soon``): whether it matched.

        Outcomes of calls that finish together share one transaction (the group commit),
        each its own statement: no savepoint between them."""

        def finish(conn: sqlite3.Connection) -> tuple[bool, None]:
            return conn.execute(sql.FINISH_ENTRY, outcome).rowcount == 1, None

        return finish

    def _finish_soon(self, outcome: tuple[Any, ...]) -> asyncio.Future[Any]:
        """An outcome's write submitted to the group commit now: ``_write`` split in two,
        its answer read by ``_finish_matched``."""
        finish = self._finish_body(outcome)
        if not self.is_setup:  # a claim sets the saver up: only an outcome sent alone
            return asyncio.ensure_future(self._set_up_then(finish))
        return self._group.submit_nowait((finish, OUTCOME, True))

    async def _set_up_then(
        self, finish: Callable[[sqlite3.Connection], Any], one_statement: bool = True
    ) -> tuple[bool, Any]:
        await self.setup()
        return await self._group.submit((finish, OUTCOME, one_statement))

    def _finish_matched(self, answer: tuple[bool, Any]) -> bool:
        done, _ = self._written(*answer)  # the body's (done, None), or its error raised
        return bool(done)

    def _finish_all_soon(self, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[Any]:
        """Several outcomes as ONE write of the group commit (one future, not one each):
        one ``UPDATE ... FROM (VALUES ...)`` for rows of distinct keys
        (:mod:`.ledger_batch`), else an ``UPDATE`` each; a failing row undone alone by
        SQLite and reported for its row only; a failure that ends the transaction fails
        them all."""
        rows = list(rows)

        def finish_all(conn: sqlite3.Connection) -> list[bool | Exception]:
            return ledger_batch.outcomes_matched(conn, rows, _each_matched)

        if not self.is_setup:  # only outcomes sent before anything else used the saver
            return asyncio.ensure_future(self._set_up_then(finish_all, False))
        # not one statement: batched with other writes, a savepoint keeps it apart; the
        # rows were gathered over a loop iteration already (``engine.step_writes``)
        return self._group.submit_gathered((finish_all, OUTCOME, False))

    def _finish_all_matched(self, answer: tuple[bool, Any]) -> list[bool | Exception]:
        matched: list[bool | Exception] = self._written(*answer)  # or the write's error
        if matched.count(True) + matched.count(False) == len(matched):
            return matched
        typed: list[bool | Exception] = []
        for one in matched:
            if isinstance(one, Exception):
                try:
                    self._written(False, one)  # raises it typed
                except Exception as exc:
                    one = exc
            typed.append(one)
        return typed

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

        try:
            return await self._write(run, before_tool_runs=update.before_tool_runs)
        except asyncio.CancelledError:  # a re-claim (it starts a claim): its lease ended
            if update.before_tool_runs:
                self._undo_cut_short(cut_short.end_lease(update))
            raise
