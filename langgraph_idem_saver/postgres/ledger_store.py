"""The tool-call ledger's storage hooks on PostgreSQL (mixed into
:class:`AsyncPostgresSaver`): a batch of claims in one pipelined transaction, outcomes of
calls that finish together in one transaction, and the three record primitives. The
policy over them lives in :class:`~langgraph_idem_saver.saver_base.IdemSaverBase`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import TupleRow, tuple_row

from langgraph_idem_saver.backend import Claims, Guarded
from langgraph_idem_saver.errors import LedgerStateError
from langgraph_idem_saver.ledger import ClaimOutcome, LedgerEntry, slot_of
from langgraph_idem_saver.postgres import ledger_sql as sql

if TYPE_CHECKING:
    from langgraph_idem_saver.group_commit import GroupCommit

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
CLAIM_RETRIES = 5


class PostgresLedgerStore:
    """Ledger rows on PostgreSQL: claims, outcomes, guarded updates, reads."""

    if TYPE_CHECKING:
        _finishes: GroupCommit[tuple[Any, ...], tuple[bool, TupleRow | None]]

        def entry_of(self, row: Sequence[Any]) -> LedgerEntry: ...

        async def _run(
            self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
        ) -> T: ...

    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        """Claim the batch in one transaction: ``INSERT ... ON CONFLICT DO NOTHING`` for
        every row, then read every row back (pipelined: one round trip)."""
        base = {
            "owner": claims.owner,
            "now": claims.issued_at,
            "lease": claims.lease_expires_at,
        }

        async def claim(cur: Cursor) -> list[ClaimOutcome]:
            pending = claims.rows
            outcomes: dict[int, ClaimOutcome] = {}
            positions = list(range(len(pending)))
            for _ in range(CLAIM_RETRIES):
                params: dict[str, Any] = {**base, **claims.columns(pending)}
                await cur.execute(sql.INSERT_ISSUED, params)
                async with cur.connection.cursor(row_factory=tuple_row, binary=True) as read:
                    await read.execute(sql.SELECT_ENTRIES_BY_KEYS, params)
                    inserted = {(r[0], r[1]) for r in await cur.fetchall()}
                    rows = {(r[0], r[1]): self.entry_of(r) for r in await read.fetchall()}
                    holders: dict[tuple[Any, ...], LedgerEntry] = {}
                    if any(p is not None for p in params["position"]):
                        await read.execute(sql.SELECT_SLOT_HOLDERS, params)
                        holders = {slot_of(e): e for e in map(self.entry_of, await read.fetchall())}
                missing: list[tuple[int, tuple[Any, ...]]] = []
                for pos, row in zip(positions, pending, strict=True):
                    k = (row[0], row[1])  # scope, key
                    # a key refused by the fork slot: another branch's call holds the slot
                    entry = rows.get(k) or holders.get(claims.slot(row))
                    if entry is None:  # deleted by a concurrent release/delete: claim again
                        missing.append((pos, row))
                        continue
                    claimed = k in inserted
                    inserted.discard(k)  # a key repeated in the batch is claimed once
                    outcomes[pos] = ClaimOutcome(claimed=claimed, entry=entry)
                if not missing:
                    break
                positions = [p for p, _ in missing]
                pending = [r for _, r in missing]
            else:
                raise LedgerStateError(
                    f"could not claim {len(pending)} tool call(s): their rows kept being "
                    "deleted concurrently"
                )
            return [outcomes[p] for p in range(len(claims.rows))]

        return await self._run(claim, tx=True, pipeline=True)

    async def _finish_entry(self, finish: Guarded) -> LedgerEntry | None:
        """Outcomes of calls that finish together share one transaction (_finish_all)."""
        done, row = await self._finishes.submit(finish.params)
        return self.entry_of(row) if done and row is not None else None

    async def _finish_all(self, batch: list[tuple[Any, ...]]) -> list[tuple[bool, TupleRow | None]]:
        """Record the outcomes of calls that finished together: one transaction (one
        WAL flush) for all; per outcome, its row, or (not ours to finish) the row as is."""

        async def finish(cur: Cursor) -> list[tuple[bool, TupleRow | None]]:
            # one pipelined executemany: one round trip whatever the number of outcomes
            await cur.executemany(sql.FINISH_ENTRY, batch, returning=True)
            rows = [await cur.fetchone()]
            while cur.nextset():
                rows.append(await cur.fetchone())
            done: list[tuple[bool, TupleRow | None]] = []
            for params, row in zip(batch, rows, strict=True):
                if row is None:  # not ours to finish: the row as it is
                    await cur.execute(sql.SELECT_ENTRY, params[5:7])  # scope, key
                    done.append((False, await cur.fetchone()))
                else:
                    done.append((True, row))
            return done

        return await self._run(finish, tx=len(batch) > 1)

    # --- ledger record primitives (the policy lives in IdemSaverBase) ---------------

    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        async def write(cur: Cursor) -> int:
            await cur.execute(query, params)
            return cur.rowcount

        return await self._run(write)

    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        """One ``UPDATE ... RETURNING`` statement (the server's durability applies)."""

        async def run(cur: Cursor) -> TupleRow | None:
            await cur.execute(update.query, update.params)
            return await cur.fetchone()

        row = await self._run(run)
        return None if row is None else self.entry_of(row)

    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        async def read(cur: Cursor) -> list[TupleRow]:
            await cur.execute(query, params)
            return await cur.fetchall()

        return [self.entry_of(r) for r in await self._run(read)]
