"""The ledger's policy, written once for every backend: statuses, guards, leases, the
parameters of each statement, and what the ledger keeps in clear.

As in AWS Powertools' idempotency persistence layer, each backend supplies only its SQL
module (``_sql``, a :class:`~langgraph_idem_saver.backend.LedgerStatements`), three
record primitives (``_select_entries``, ``_guarded_update``, ``_ledger_write``), the
claim writers (``_insert_claims``, ``_claim_unless_found``) and the outcome writer
(``_finish_soon``, its answer read by ``_finish_matched``). :class:`LedgerPolicy` sits
beside :class:`~langgraph_idem_saver.saver_checkpoints.CheckpointMethods` in every
saver's bases (:class:`~langgraph_idem_saver.saver_base.IdemSaverBase`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import operator
import time
from abc import abstractmethod
from collections.abc import Awaitable, Sequence
from typing import Any, ClassVar

from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.backend import (
    INTENT_COLUMNS,
    Claims,
    Guarded,
    LedgerStatements,
    step_params,
)
from langgraph_idem_saver.errors import LedgerStateError
from langgraph_idem_saver.held_outcomes import KEY, OWNER, SCOPE, OutcomeParams
from langgraph_idem_saver.ledger import (
    CallIntent,
    ClaimOutcome,
    LedgerEntry,
    Outcome,
    StepCandidates,
    StepClaim,
    StepLookup,
    ToolCallLedger,
)
from langgraph_idem_saver.saver_codec import decode_typed
from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer

__all__ = ["SEALED_ARGS", "LedgerPolicy"]

# marks tool args stored encrypted (canonical JSON never starts with a NUL byte)
SEALED_ARGS = b"\x00sealed\x00"
# a claim row (INTENT_COLUMNS values) from a CallIntent, and where its args stand
_INTENT_ROW = operator.attrgetter(*INTENT_COLUMNS)
_ARGS = INTENT_COLUMNS.index("args")
_ERROR = operator.itemgetter(3)  # an outcome row's error (``held_outcomes.OutcomeParams``)
# serializer classes that are not ``EncryptedSerializer``s (``_encrypts``' fast path)
_PLAIN_SERDES = (LosslessJsonPlusSerializer, JsonPlusSerializer)


class LedgerPolicy(ToolCallLedger):
    """The :class:`~langgraph_idem_saver.ledger.ToolCallLedger` methods over a backend's
    statements and primitives."""

    _sql: ClassVar[LedgerStatements]

    # --- what the ledger keeps in clear --------------------------------------------

    def _encrypts(self) -> bool:
        serde = self.serde
        # asked once a call; ``isinstance`` of ``EncryptedSerializer`` (a subclass of a
        # ``typing.Protocol``) runs ~45 bytecodes of typing's and abc's checks, and the
        # default serializer, by far the most used, is never one
        return type(serde) not in _PLAIN_SERDES and isinstance(serde, EncryptedSerializer)

    def seal_args(self, args: bytes) -> bytes:
        """Tool args as stored: in clear (canonical JSON), or encrypted by the saver's
        serializer when it encrypts - then the ledger holds no plaintext but keys,
        hashes, names and timestamps."""
        if not self._encrypts():
            return args
        type_, data = self.serde.dumps_typed(args.decode("utf-8"))
        return SEALED_ARGS + type_.encode() + b"\x00" + data

    def ledger_error(self, error: str | None) -> str | None:
        """The error text kept beside a failed call's result: none when encrypting (the
        encrypted result, the error ToolMessage, holds it)."""
        if error is None:  # most outcomes: no serializer asked
            return None
        return None if self._encrypts() else error

    def entry_of(self, row: Sequence[Any]) -> LedgerEntry:
        """A ledger row as an entry, its args opened if they were sealed."""
        entry = LedgerEntry.from_row(row)
        if not entry.args.startswith(SEALED_ARGS):
            return entry
        type_, _, data = entry.args[len(SEALED_ARGS) :].partition(b"\x00")
        text = decode_typed(
            self.serde, type_.decode(), data, "tool call args", scope=entry.scope, key=entry.key
        )
        return dataclasses.replace(entry, args=str(text).encode("utf-8"))

    # --- the backend's primitives -----------------------------------------------------

    @abstractmethod
    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        """Rows of a SELECT over the ledger, as entries."""

    @abstractmethod
    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        """``update``, committed: the entry after it, or None when the guard did not match."""

    @abstractmethod
    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        """One ledger statement, committed; the number of rows it changed."""

    @abstractmethod
    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        """Insert an ``issued`` row per claim row whose key is free, in one transaction
        committed durably (a tool runs after it); per row, whether it was inserted and its
        entry (``Claims.issued_entry`` for the rows inserted, read back for the others)."""

    @abstractmethod
    async def _claim_unless_found(
        self, claims: Claims, lookup: StepLookup
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        """In one round trip: the entries ``lookup`` finds (``SELECT_STEP_CANDIDATES``,
        oldest first) and, only when there are none, ``_insert_claims(claims)``'s
        outcomes (None when something was found: nothing is written then)."""

    def _claims(self, intents: Sequence[CallIntent], owner: str, lease_seconds: float) -> Claims:
        now = time.time()
        rows = list(map(_INTENT_ROW, intents))
        if not self._encrypts():
            return Claims(rows, owner, now, now + lease_seconds)
        sealed = [(*r[:_ARGS], self.seal_args(r[_ARGS]), *r[_ARGS + 1 :]) for r in rows]
        return Claims(sealed, owner, now, now + lease_seconds, [r[_ARGS] for r in rows])

    async def aclaim(
        self, intents: Sequence[CallIntent], *, owner: str, lease_seconds: float
    ) -> list[ClaimOutcome]:
        if not intents:
            return []
        return await self._insert_claims(self._claims(intents, owner, lease_seconds))

    async def aclaim_step(
        self, intents: Sequence[CallIntent], lookup: StepLookup, *, owner: str, lease_seconds: float
    ) -> StepClaim:
        claims = self._claims(intents, owner, lease_seconds)
        found, claimed = await self._claim_unless_found(claims, lookup)
        candidates = StepCandidates.sorted_out(
            found, lookup.agent_path, lookup.signatures, lookup.spots
        )
        return StepClaim(candidates, claimed)

    def record_outcome(
        self, scope: str, key: str, *, owner: str, outcome: Outcome
    ) -> Awaitable[None]:
        # no task of its own: the write is submitted to the backend's group commit now,
        # and its answer checked when the caller awaits (one coroutine, nothing else);
        # status._value_, not .value: Enum's .value is a property, a Python call an outcome
        error = self.ledger_error(outcome.error)
        params = (
            outcome.status._value_, outcome.result_type, outcome.result, error, time.time(),
            scope, key, owner,
        )  # fmt: skip
        return self._recorded(self._finish_soon(params), scope, key, owner)

    def record_outcome_rows(
        self, rows: Sequence[OutcomeParams]
    ) -> Awaitable[list[Exception | None]]:
        # one write for all (``_finish_all_soon``), its answer read once the caller awaits
        if list(map(_ERROR, rows)).count(None) != len(rows) and self._encrypts():
            rows = [(*row[:3], None, *row[4:]) for row in rows]  # as ``ledger_error``
        return self._rows_recorded(self._finish_all_soon(rows), rows)

    async def _rows_recorded(
        self, finishing: Awaitable[Any], rows: Sequence[OutcomeParams]
    ) -> list[Exception | None]:
        matched = self._finish_all_matched(await finishing)
        if matched.count(True) == len(rows):  # every guard matched: the usual answer
            return [None] * len(rows)
        errors: list[Exception | None] = []
        for answer, row in zip(matched, rows, strict=True):
            if answer is True:
                errors.append(None)
            elif answer is False:
                try:  # why it was refused: a failed read is this row's answer alone
                    errors.append(await self._not_finished(row[SCOPE], row[KEY], row[OWNER]))
                except Exception as exc:
                    errors.append(exc)
            else:
                errors.append(answer)
        return errors

    def _finish_all_soon(self, rows: Sequence[OutcomeParams]) -> Awaitable[Any]:
        """Submit several outcomes to the backend's group commit now; the awaitable of
        the answer ``_finish_all_matched`` reads. Here each through ``_finish_soon`` (they
        share the group commit's batch); a backend may send them as one write."""
        return asyncio.gather(*(self._finish_soon(row) for row in rows), return_exceptions=True)

    def _finish_all_matched(self, answer: Any) -> list[bool | Exception]:
        """Per row of ``_finish_all_soon``: whether its guard matched, or its error."""
        matched: list[bool | Exception] = []
        for one in answer:
            if isinstance(one, BaseException):
                if not isinstance(one, Exception):
                    raise one
                matched.append(one)
                continue
            try:
                matched.append(self._finish_matched(one))
            except Exception as exc:
                matched.append(exc)
        return matched

    async def _recorded(
        self, finishing: asyncio.Future[Any], scope: str, key: str, owner: str
    ) -> None:
        if not self._finish_matched(await finishing):
            raise await self._not_finished(scope, key, owner)

    async def _not_finished(self, scope: str, key: str, owner: str) -> LedgerStateError:
        """Why an outcome was refused: the entry as it is now."""
        found = await self.aget_entry(scope, key)
        state = "missing" if found is None else f"{found.status.value} (owner {found.owner!r})"
        return LedgerStateError(
            f"cannot record the outcome of tool call {key!r} in scope {scope!r}: "
            f"entry is {state}, not issued to {owner!r}"
        )

    @abstractmethod
    def _finish_soon(self, outcome: tuple[Any, ...]) -> asyncio.Future[Any]:
        """Submit one outcome to the backend's group commit now (``record_outcome``):
        ``outcome`` is (status, result_type, result, error, finished_at, scope, key,
        owner), applied only while the entry is ``issued`` to ``owner``; outcomes of calls
        that finish together share one commit. The future of its answer, which
        ``_finish_matched`` reads."""

    @abstractmethod
    def _finish_matched(self, answer: Any) -> bool:
        """Whether ``_finish_soon``'s answer says the guard matched (or its error, raised)."""

    async def areclaim(
        self, entry: LedgerEntry, *, owner: str, lease_seconds: float
    ) -> LedgerEntry | None:
        now, scope, key = time.time(), entry.scope, entry.key
        params = (owner, now, now + lease_seconds, scope, key, entry.attempts, entry.owner)
        reclaim = Guarded(self._sql.RECLAIM_ENTRY, params, scope, key, before_tool_runs=True)
        return await self._guarded_update(reclaim)

    async def arelease(self, scope: str, key: str, *, owner: str) -> bool:
        """Drop an ``issued`` claim we own without an outcome (the tool was interrupted
        by ``interrupt()`` before doing anything final, so re-entry must run it again)."""
        return await self._ledger_write(self._sql.RELEASE_ENTRY, (scope, key, owner)) > 0

    async def aadopt(
        self, scope: str, key: str, *, tool_call_id: str | None, previous: str | None = None
    ) -> LedgerEntry | None:
        params = (tool_call_id, scope, key, previous)
        return await self._guarded_update(Guarded(self._sql.ADOPT_ENTRY, params, scope, key))

    async def aabandon(self, scope: str, key: str, *, owner: str, error: str) -> LedgerEntry | None:
        params = (time.time(), self.ledger_error(error), scope, key, owner)
        return await self._guarded_update(Guarded(self._sql.ABANDON_ENTRY, params, scope, key))

    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        found = await self._select_entries(self._sql.SELECT_ENTRY, (scope, key))
        return found[0] if found else None

    async def afind_orphans(
        self, scope: str, agent_path: str, tool_name: str, args_hash: str
    ) -> list[LedgerEntry]:
        return await self._select_entries(
            self._sql.SELECT_ORPHAN_CANDIDATES, (scope, agent_path, tool_name, args_hash)
        )

    async def afind_at_position(
        self, scope: str, position: str, tool_name: str
    ) -> list[LedgerEntry]:
        return await self._select_entries(
            self._sql.SELECT_AT_POSITION, (scope, position, tool_name)
        )

    async def afind_step_candidates(self, lookup: StepLookup) -> StepCandidates:
        """One read for the whole step (``SELECT_STEP_CANDIDATES``): the signatures and
        spots go as JSON arrays, the one list parameter both dialects can bind."""
        found = await self._select_entries(self._sql.SELECT_STEP_CANDIDATES, step_params(lookup))
        return StepCandidates.sorted_out(found, lookup.agent_path, lookup.signatures, lookup.spots)

    async def alist_entries(
        self, thread_id: str | None = None, *, agent_path: str | None = None
    ) -> list[LedgerEntry]:
        if thread_id is None:
            return await self._select_entries(self._sql.SELECT_ALL_ENTRIES, ())
        if agent_path is None:
            return await self._select_entries(self._sql.SELECT_ENTRIES_OF_THREAD, (str(thread_id),))
        return await self._select_entries(
            self._sql.SELECT_ENTRIES_OF_AGENT, (str(thread_id), agent_path)
        )

    async def alist_issued(self) -> list[LedgerEntry]:
        return await self._select_entries(self._sql.SELECT_ISSUED, ())

    async def alist_unknown(self, *, now: float | None = None) -> list[LedgerEntry]:
        at = time.time() if now is None else now
        # an entry an operator approved for a re-run is settled: the next resume runs it
        issued = await self.alist_issued()
        return [e for e in issued if e.is_unknown(at) and not e.rerun_approved()]

    async def aoperator_update(
        self, entry: LedgerEntry, rewritten: LedgerEntry, event: dict[str, Any]
    ) -> LedgerEntry | None:
        history = json.dumps([*entry.events(), event], ensure_ascii=False, default=str)
        new = rewritten
        params = (
            new.status.value, new.owner, new.lease_expires_at, new.result_type, new.result,
            self.ledger_error(new.error), new.finished_at, history,
            entry.scope, entry.key, entry.status.value, entry.attempts, entry.owner,
        )  # fmt: skip
        update = Guarded(self._sql.OPERATOR_UPDATE, params, entry.scope, entry.key)
        return await self._guarded_update(update)

    async def aresolve(self, entry: LedgerEntry, outcome: Outcome) -> LedgerEntry | None:
        scope, key = entry.scope, entry.key
        params = (
            outcome.status.value, outcome.result_type, outcome.result,
            self.ledger_error(outcome.error), time.time(), scope, key, entry.attempts, entry.owner,
        )  # fmt: skip
        return await self._guarded_update(Guarded(self._sql.RESOLVE_ENTRY, params, scope, key))

    async def anote_replay(self, scope: str, key: str, *, conflict: bool = False) -> None:
        query = self._sql.NOTE_CONFLICT if conflict else self._sql.NOTE_REPLAY
        await self._ledger_write(query, (scope, key))
