"""The tool-call ledger's storage hooks on PostgreSQL (mixed into
:class:`AsyncPostgresSaver`): a batch of claims in one pipelined transaction, outcomes of
calls that finish together in one transaction, and the three record primitives. The
policy over them lives in :class:`~langgraph_idem_saver.ledger_policy.LedgerPolicy`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from langgraph_idem_saver.backend import Claims, Guarded, step_params
from langgraph_idem_saver.errors import ConnectionClosedError, LedgerStateError
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry, StepLookup, slot_of
from langgraph_idem_saver.postgres import ledger_sql as sql
from langgraph_idem_saver.postgres.contention import TRANSIENT
from langgraph_idem_saver.postgres.held_writes import (
    FinishAnswer,
    FinishItem,
    PostgresHeldWrites,
    Run,
)
from langgraph_idem_saver.postgres.ledger_rows import claim_rows, finish_rows

if TYPE_CHECKING:
    from langgraph_idem_saver.group_commit import GroupCommit

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
CLAIM_RETRIES = 5

# CUT_SHORT: a statement that starts or ends a claim, cancelled in flight (LangGraph
# cancels a step's other tasks when one raises). psycopg cancels it on the server, but
# one that had already committed (its answer in transit) is a claim its caller never
# learned of: nothing runs under it, and this live process's own retry would wait
# ``wait_seconds`` on it and raise ``ToolCallInProgress`` until its lease ended. It is
# held as after a lost connection (``held_writes``): a claim undone, a re-claim's lease
# ended, a release run again - before the saver's next statement.


class PostgresLedgerStore(PostgresHeldWrites):
    """Ledger rows on PostgreSQL: claims, outcomes, guarded updates, reads."""

    if TYPE_CHECKING:
        _finishes: GroupCommit[FinishItem, FinishAnswer]

        def entry_of(self, row: Sequence[Any]) -> LedgerEntry: ...

        async def _run(
            self,
            fn: Callable[[Cursor], Awaitable[T]],
            *,
            tx: bool = False,
            pipeline: bool = False,
            ledger: bool = False,
        ) -> T: ...

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        _, outcomes = await self._claim(claims, None)
        assert outcomes is not None  # nothing is looked up first
        return outcomes

    async def _claim_unless_found(
        self, claims: Claims, lookup: StepLookup
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        return await self._claim(claims, lookup)

    async def _claim(
        self, claims: Claims, lookup: StepLookup | None
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        """Claim the batch in ONE statement (``CLAIM_STEP``: one round trip, one commit),
        after the step's adoption read in the same statement when ``lookup`` is given
        (nothing is claimed when it finds entries other than ``lookup.inert`` ones); then
        claim again, in a new statement, the calls it returned no row for."""
        base: dict[str, Any] = {
            "owner": claims.owner,
            "now": claims.issued_at,
            "lease": claims.lease_expires_at,
        }
        query = sql.CLAIM_STEP
        if lookup is not None:
            query = sql.CLAIM_STEP_UNLESS_FOUND
            scope, agent_path, signatures, _, spots = step_params(lookup)
            base |= {"scope": scope, "agent_path": agent_path}
            base |= {"signatures": signatures, "spots": spots, "inert": list(lookup.inert)}
        outcomes: dict[int, ClaimOutcome] = {}
        pending = list(enumerate(claims.rows))
        for _ in range(CLAIM_RETRIES):
            params = {**base, "rows": claim_rows([row for _, row in pending])}

            async def claim(cur: Cursor, q: str = query, p: dict[str, Any] = params) -> Any:
                await cur.execute(q, p)
                return await cur.fetchall()

            try:
                rows = await self._run(claim, ledger=True)
            except ConnectionClosedError:  # committed or not, no tool runs under it
                self._hold_claims_lost(claims)
                raise
            except asyncio.CancelledError:  # the same: its answer cut short (CUT_SHORT)
                self._hold_claims_lost(claims, lost=False)
                raise
            except TRANSIENT:  # a lock or a timeout: this statement wrote nothing, but an
                # earlier one committed claims its caller now never learns of: undone
                if any(o.claimed for o in outcomes.values()):
                    self._hold_claims_lost(claims, lost=False)
                raise
            found = sorted((r for r in rows if r[0] == "f"), key=lambda r: r[1])  # seq
            if found:
                return [self.entry_of(r[2:]) for r in found], None
            query = sql.CLAIM_STEP  # decided: claim what is still missing
            inserted = {(r[2], r[3]) for r in rows if r[0] == "i"}  # scope, key
            if len(inserted) == len(pending):  # all inserted (a fresh step): nothing to match
                for pos, _ in pending:
                    outcomes[pos] = ClaimOutcome(claimed=True, entry=claims.issued_entry(pos))
                return [], [outcomes[p] for p in range(len(claims.rows))]
            # the rows inserted are built (Claims.issued_entry), the others read
            entries = {(r[2], r[3]): self.entry_of(r[2:]) for r in rows if r[0] != "i"}
            holders = {slot_of(e): e for e in entries.values() if e.position is not None}
            missing: list[tuple[int, tuple[Any, ...]]] = []
            for pos, row in pending:  # in insertion order: the first of a key inserts it
                k = (row[0], row[1])  # scope, key
                if k in inserted:
                    mine = claims.issued_entry(pos)
                    outcomes[pos] = ClaimOutcome(claimed=True, entry=mine)
                    inserted.discard(k)  # a key repeated in the batch is claimed once...
                    entries[k] = mine  # ...and its repeats find this entry
                    if mine.position is not None:
                        holders[slot_of(mine)] = mine
                    continue
                # a key refused by the fork slot: another branch's call holds the slot
                entry = entries.get(k) or holders.get(claims.slot(row))
                if entry is None:  # committed by a concurrent claimer after our snapshot
                    missing.append((pos, row))
                    continue
                outcomes[pos] = ClaimOutcome(claimed=False, entry=entry)
            if not missing:
                return [], [outcomes[p] for p in range(len(claims.rows))]
            pending = missing
        raise LedgerStateError(
            f"could not claim {len(pending)} tool call(s): their rows kept being "
            "deleted concurrently"
        )

    def _finish_soon(self, outcome: tuple[Any, ...]) -> asyncio.Future[Any]:
        """An outcome submitted to the group commit now: outcomes of calls that finish
        together share one statement (``_finish_batch``)."""
        return self._finishes.submit_nowait(outcome)

    def _finish_matched(self, answer: tuple[bool, TupleRow | None]) -> bool:
        return answer[0]

    def _finish_all_soon(self, rows: Sequence[tuple[Any, ...]]) -> asyncio.Future[Any]:
        """Several outcomes (a step's, gathered already: ``engine.step_writes``,
        ``sync_step_writes``) as ONE item of the group commit: one future for the rows,
        not one each, and committed with what is pending now, without waiting a loop
        iteration more (``GroupCommit.submit_gathered``); in one statement with any
        single outcomes pending beside them (``_finish_all``)."""
        return self._finishes.submit_gathered(list(rows))

    def _finish_all_matched(self, answer: Any) -> list[bool | Exception]:
        """Per row of ``_finish_all_soon``: whether its guard matched (the write's error
        was raised when awaited: every row's)."""
        return [matched for matched, _ in answer]

    async def _finish_batch(
        self, batch: list[tuple[Any, ...]], run: Run | None = None
    ) -> list[tuple[bool, TupleRow | None]]:
        """Record the outcomes of calls that finished together: ONE statement (one round
        trip, one commit) for all, prepared: ``FINISH_STEP_KEYS`` (its rows as one JSON
        document) for several, ``FINISH_ONE_KEY`` for one. Per outcome, whether it was
        ours to record, and the (scope, key) of its row: no row travels back whole.
        ``run``: how to run it (``_run``; the held writes' path runs it directly)."""
        run = run or functools.partial(self._run, ledger=True)
        if len(batch) == 1:  # one outcome: scalar parameters, no JSON (FINISH_ONE_KEY)
            (params,) = batch

            async def finish_one(cur: Cursor) -> list[tuple[bool, TupleRow | None]]:
                await cur.execute(sql.FINISH_ONE_KEY, params)
                row = await cur.fetchone()
                return [(row is not None, row)]

            return await run(finish_one)

        async def finish(cur: Cursor) -> list[tuple[bool, TupleRow | None]]:
            await cur.execute(sql.FINISH_STEP_KEYS, (finish_rows(batch),))
            finished = {(r[0], r[1]): r for r in await cur.fetchall()}  # scope, key
            out: list[tuple[bool, TupleRow | None]] = []
            for params in batch:
                row = finished.pop((params[5], params[6]), None)
                out.append((row is not None, row))
            return out

        return await run(finish)

    # --- ledger record primitives (the policy lives in IdemSaverBase) ---------------

    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        async def write(cur: Cursor) -> int:
            await cur.execute(query, params)
            return cur.rowcount

        try:
            return await self._run(write, ledger=True)
        except ConnectionClosedError:
            self._hold_lost(query, params)  # a release: run again before the next statement
            raise
        except TRANSIENT:  # a lock or a timeout: nothing written, the connection usable
            self._hold_ending(query, params)
            raise
        except asyncio.CancelledError:  # CUT_SHORT
            self._hold_lost(query, params, lost=False)
            raise

    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        """One ``UPDATE ... RETURNING`` statement (the server's durability applies)."""

        async def run(cur: Cursor) -> TupleRow | None:
            await cur.execute(update.query, update.params)
            return await cur.fetchone()

        try:
            row = await self._run(run, ledger=True)
        except ConnectionClosedError:
            self._hold_lost(update.query, update.params)  # a re-claim, an abandon: see there
            raise
        except TRANSIENT:
            self._hold_ending(update.query, update.params)
            raise
        except asyncio.CancelledError:  # CUT_SHORT
            self._hold_lost(update.query, update.params, lost=False)
            raise
        return None if row is None else self.entry_of(row)

    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(query, params)
            return await cur.fetchall()

        return [self.entry_of(r) for r in await self._run(read)]
