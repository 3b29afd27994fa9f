"""What a lost connection leaves undone in the ledger, kept and written when PostgreSQL is
back (mixed into :class:`PostgresLedgerStore`; the why: :mod:`..held_outcomes`).

* :meth:`_finish_all` - a batch of outcomes (the group commit's: single outcomes, and
  a step's rows gathered already, each one item), retried on a fresh connection with
  growing pauses for up to ``outcome_retry_seconds`` before the node returns, then held;
* :meth:`_hold_lost` - a claim, re-claim, release or abandon whose statement failed:
  held as the write that ends it (:class:`Held`);
* :meth:`_write_held` - everything held, written before the saver's next statement
  (``PostgresConnection._run``), in one transaction.

An attempt whose answer was lost may have committed. Each held write is guarded so that
running it again is harmless: an outcome already recorded as itself (same status, owner
and ``finished_at``) counts as recorded; an undo names the claim by its owner and its own
``issued_at``, so it never touches a later claim of the same call.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from langgraph_idem_saver.backend import LEDGER_COLUMNS, Claims
from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.held_outcomes import (
    OUTCOME_RETRY_SECONDS,
    Held,
    HeldOutcomes,
    identity,
    landed,
    remaining,
    retry_delays,
)
from langgraph_idem_saver.postgres.contention import TRANSIENT

if TYPE_CHECKING:
    from langgraph_idem_saver.backend import LedgerStatements

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
Run = Callable[[Callable[[Cursor], Awaitable[Any]]], Awaitable[Any]]
Batch = list[tuple[Any, ...]]  # outcomes' parameters (``held_outcomes.OutcomeParams``)
Answers = list[tuple[bool, Any]]
# an item of the outcomes' group commit: one outcome, or the rows of a step gathered
# already (``_finish_all_soon``: one future for them all); answered in kind
FinishItem = tuple[Any, ...] | Batch
FinishAnswer = tuple[bool, Any] | Answers

_COLUMNS = LEDGER_COLUMNS.split(", ")

# the entries of (scope, key) pairs: outcomes read back after an answer lost in transit
SELECT_ENTRIES_BY_KEYS = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE (scope, key) IN (SELECT * FROM unnest(%s::text[], %s::text[]))
"""
# a claim whose caller never learned it was claimed: nothing ran under it
UNCLAIM = """
DELETE FROM idem_tool_calls
WHERE scope = %s AND key = %s AND status = 'issued' AND owner = %s AND issued_at = %s
"""
# a re-claim the same: the row stays (an earlier attempt may have happened), lease ended
END_LEASE = """
UPDATE idem_tool_calls SET lease_expires_at = %s, error = %s
WHERE scope = %s AND key = %s AND status = 'issued' AND owner = %s AND issued_at = %s
"""
# what an outcome's write is retried on: a lost connection; a lock or a timeout (TRANSIENT)
_RETRIED: tuple[type[Exception], ...] = (ConnectionClosedError, *TRANSIENT)
_RETRIED_OR_LATE: tuple[type[Exception], ...] = (*_RETRIED, asyncio.TimeoutError)

RECLAIM_LOST = "ConnectionClosedError: the re-claim's answer was lost; no tool ran under it"


class PostgresHeldWrites:
    """Outcomes retried and held, claims undone, when the connection is lost."""

    outcome_retry_seconds: float = OUTCOME_RETRY_SECONDS
    """How long an outcome's write is retried before it is held (seconds)."""

    if TYPE_CHECKING:
        _held: HeldOutcomes | None
        _sql: ClassVar[LedgerStatements]

        def _reconnects(self) -> bool: ...

        async def _run(
            self,
            fn: Callable[[Cursor], Awaitable[T]],
            *,
            tx: bool = False,
            pipeline: bool = False,
            ledger: bool = False,
        ) -> T: ...

        async def _execute(
            self,
            fn: Callable[[Cursor], Awaitable[T]],
            *,
            tx: bool = False,
            pipeline: bool = False,
            ledger: bool = False,
        ) -> T: ...

        async def _finish_batch(self, batch: Batch, run: Run | None = None) -> Answers: ...

    async def _finish_all(self, items: list[FinishItem]) -> list[FinishAnswer]:
        """The group commit's batch as ONE write (:meth:`_finish_rows`): its single
        outcomes and gathered steps' rows flattened, the answers handed back in kind (a
        gathered item gets its rows' answers as one list)."""
        if not any(isinstance(item, list) for item in items):
            return await self._finish_rows(items)  # type: ignore[arg-type, return-value]
        rows: Batch = []
        for item in items:
            if isinstance(item, list):
                rows.extend(item)
            else:
                rows.append(item)
        answers = await self._finish_rows(rows)
        out: list[FinishAnswer] = []
        at = 0
        for item in items:
            if isinstance(item, list):
                out.append(answers[at : at + len(item)])
                at += len(item)
            else:
                out.append(answers[at])
                at += 1
        return out

    async def _finish_rows(self, batch: Batch) -> Answers:
        """:meth:`_finish_batch`, kept through a lost connection, a lock or a timeout
        (``contention.TRANSIENT``): retried on a fresh connection (the pool's next, or a
        reopened one; after a lock or a timeout, the same kind of connection, still good)
        with growing pauses for up to ``outcome_retry_seconds``; then held and written
        before the saver's next statement, and the callers get the typed error
        (``ConnectionClosedError``, ``DatabaseLockedError``...) saying so."""
        lost: Exception
        try:
            return await self._finish_batch(batch)
        except _RETRIED as exc:  # a lost connection, a lock, a timeout
            lost = exc
        seconds = self.outcome_retry_seconds
        deadline = time.monotonic() + seconds
        # a lock or a timeout leaves the connection usable: retried even on one not ours
        retry = self._reconnects() or not isinstance(lost, ConnectionClosedError)
        for delay in retry_delays(seconds) if retry else ():
            await asyncio.sleep(delay)
            try:
                answers = await asyncio.wait_for(self._finish_batch(batch), remaining(deadline))
            except _RETRIED_OR_LATE as exc:
                # (a StatementTimeoutError is a TimeoutError too: asked by what it is)
                lost = exc if isinstance(exc, _RETRIED) else lost
                if isinstance(exc, ConnectionClosedError) and not self._reconnects():
                    break  # a connection not ours to replace, now lost: no more tries
                continue
            return await self._answers_after_loss(
                batch, answers, functools.partial(self._run, ledger=True)
            )
        calls = len(batch)
        closed = isinstance(lost, ConnectionClosedError)
        if self._keep([Held.outcome(params) for params in batch], lost=closed):
            raise type(lost)(
                f"{lost}; the outcome of {calls} tool call(s) is kept by the saver and "
                "written before its next statement: retry the run once PostgreSQL "
                f"{'is back' if closed else 'takes it'} (the calls are replayed, not run again)"
            ) from lost
        raise ConnectionClosedError(
            f"{lost}; the outcome of {calls} tool call(s) could not be recorded and this "
            "saver cannot reconnect: this process reads those calls as unknown outcomes at "
            "once (verify, on_unknown, or a human decides)"
        ) from lost

    def _keep(self, held: list[Held], *, lost: bool = True) -> bool:
        """Hold ``held`` until the database takes it; False when this saver can never
        write it (a user's closed connection, a closed pool): then it is given up.
        ``lost=False``: a statement a cancellation cut short - its connection is not
        known to be lost, so what is held waits for the next statement on any saver."""
        if self._held is None:
            self._held = HeldOutcomes()
        self._held.hold(held)
        if not lost or self._reconnects():
            return True
        self._held.give_up()
        return False

    def _hold_claims_lost(self, claims: Claims, *, lost: bool = True) -> None:
        """A claim statement failed (``lost=False``: a cancellation cut it short): the
        rows it may have committed are undone before the next statement (the caller never
        learned it claimed them: nothing ran)."""
        self._keep(
            [Held("unclaim", r[0], r[1], claims.owner, (claims.issued_at,)) for r in claims.rows],
            lost=lost,
        )

    def _hold_lost(self, query: str, params: tuple[Any, ...], *, lost: bool = True) -> None:
        """A guarded statement that starts or ends a claim of ours failed (``lost=False``:
        a cancellation cut it short): what ends the claim is held (a re-claim: its lease
        ended; a release or an abandon: run again)."""
        sql = self._sql
        if query is sql.RECLAIM_ENTRY:
            owner, issued_at, _, scope, key = params[:5]
            self._keep([Held("end_lease", scope, key, owner, (issued_at,))], lost=lost)
        elif query is sql.ABANDON_ENTRY:
            held = [Held("statement", params[2], params[3], params[4], (query, params))]
            self._keep(held, lost=lost)
        elif query is sql.RELEASE_ENTRY:
            held = [Held("statement", params[0], params[1], params[2], (query, params))]
            self._keep(held, lost=lost)

    def _hold_ending(self, query: str, params: tuple[Any, ...]) -> None:
        """A release or an abandon the server refused on a lock or a timeout (nothing
        written, the connection usable): run again before the next statement, so the
        claim it ends is not left live for its lease. Anything else (a claim, a re-claim)
        wrote nothing that needs undoing."""
        if query is self._sql.RELEASE_ENTRY or query is self._sql.ABANDON_ENTRY:
            self._hold_lost(query, params, lost=False)

    async def _write_held(self, held: list[Held]) -> None:
        """Write what is held: one transaction, on the connection ``_run`` was about to
        use (raises while the database is unreachable: it is then held again)."""
        outcomes = [h.params for h in held if h.kind == "outcome"]
        others = [h for h in held if h.kind != "outcome"]

        async def undo(cur: Cursor) -> None:
            now = time.time()
            for h in others:
                if h.kind == "unclaim":
                    await cur.execute(UNCLAIM, (h.scope, h.key, h.owner, h.params[0]))
                elif h.kind == "end_lease":
                    params = (now, RECLAIM_LOST, h.scope, h.key, h.owner, h.params[0])
                    await cur.execute(END_LEASE, params)
                else:
                    await cur.execute(*h.params)

        direct: Run = functools.partial(self._execute, ledger=True)
        if others:
            await self._execute(undo, tx=True, ledger=True)
        if outcomes:
            answers = await self._finish_batch(outcomes, direct)
            await self._answers_after_loss(outcomes, answers, direct)

    async def _answers_after_loss(self, batch: Batch, answers: Answers, run: Run) -> Answers:
        """Answers of a retried batch: an outcome the guard refused may be this very one,
        committed by the attempt whose answer was lost (read back, :func:`landed`). One
        refused and not recorded as itself is no longer ours (an operator settled it)."""
        refused = [i for i, (done, _) in enumerate(answers) if not done]
        if not refused:
            return answers
        wanted = [identity(batch[i]) for i in refused]

        async def read(cur: Cursor) -> list[TupleRow]:
            params = ([w[0] for w in wanted], [w[1] for w in wanted])
            await cur.execute(SELECT_ENTRIES_BY_KEYS, params)
            return await cur.fetchall()

        rows = {(r[0], r[1]): r for r in await run(read)}  # scope, key lead
        out = list(answers)
        for i, (scope, key, _) in zip(refused, wanted, strict=True):
            row = rows.get((scope, key))
            if landed(batch[i], row, _COLUMNS):
                out[i] = (True, row)
        return out
