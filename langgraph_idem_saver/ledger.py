"""The tool-call ledger: backend-neutral types and protocol.

A ledger entry is the durable record of one logical side-effecting tool call:

* ``issued``    - written and committed *before* the tool runs. It is the claim: only
  the process that inserted it (the *owner*) may run the tool while its lease lasts.
* ``completed`` - the tool returned; ``result`` holds its serialized output.
* ``failed``    - the tool raised; ``error`` holds the message and ``result`` the
  serialized error ``ToolMessage`` that was returned to the model (replayed as is).

An ``issued`` entry whose lease has expired has an *unknown outcome*: its process died
somewhere between the claim and the final write, so the side effect may or may not have
happened. The engine never re-runs such a call silently (see ``engine.unknown``).

Backends (SQLite, Postgres) implement :class:`ToolCallLedger`'s small set of record
methods; all policy (keys, status transitions, leases, replay) lives in the core so the
backends cannot disagree about it.
"""

from __future__ import annotations

import asyncio
import json
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from itertools import repeat
from typing import Any, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.counts import Counts
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.held_outcomes import KEY, OWNER, SCOPE, STATUS, OutcomeParams, given_up
from langgraph_idem_saver.owners import RERUN_APPROVED, minted_here, owner_is_dead


class CallStatus(str, Enum):
    """The three states of a ledger entry."""

    ISSUED = "issued"
    COMPLETED = "completed"
    FAILED = "failed"


_Record = TypeVar("_Record", bound="CallRecord")
_SET = object.__setattr__  # a frozen record's ``__dict__``, set whole (``_of_columns``)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}  # a dataclass's fields, in order
_T = TypeVar("_T")


def records_over(
    cls: type[_T], template: dict[str, Any], names: tuple[str, ...], rows: Iterable[Any]
) -> list[_T]:
    """Instances of the dataclass ``cls``, one a row: each ``__dict__`` a copy of
    ``template`` (every field, in field order) with ``names`` set from the row, as
    :func:`records_of` builds them but copying one dict a record instead of zipping
    every field's column (~1.6 against ~3 µs a record of ``LedgerEntry``). Only for
    complete, already typed values."""
    rows = list(rows)
    n = len(rows)
    dicts = list(map(dict.copy, repeat(template, n)))
    deque(map(dict.update, dicts, map(zip, repeat(names), rows)), maxlen=0)
    records = list(map(object.__new__, repeat(cls, n)))
    deque(map(_SET, records, repeat("__dict__"), dicts), maxlen=0)
    return records


def records_of(cls: type[_T], columns: dict[str, Iterable[Any]], n: int) -> list[_T]:
    """``n`` instances of the dataclass ``cls`` from each field's column of values (every
    field named), each given its fields' values as its ``__dict__`` - not through
    ``__init__`` (a frozen one sets each field with ``object.__setattr__``): no Python
    frame a record, for a wide step's 50 intents, entries or claim outcomes at once.
    Only for complete, already typed values, as :meth:`CallRecord._of`."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))  # type: ignore[arg-type]
    rows = zip(*map(columns.__getitem__, names), strict=False)  # (repeat()s: unending)
    records = list(map(object.__new__, repeat(cls, n)))
    deque(
        map(_SET, records, repeat("__dict__"), map(dict, map(zip, repeat(names), rows))), maxlen=0
    )
    return records


@dataclass(frozen=True)
class CallRecord:
    """What names one logical call and what the model asked of it: the columns an
    intent is claimed with and its entry is read back with, declared once so the two
    cannot drift apart (``backend.LEDGER_COLUMNS`` starts with them, in this order)."""

    scope: str
    key: str
    thread_id: str
    agent_path: str
    tool_name: str
    args_hash: str
    args: bytes  # canonical JSON of the model-emitted args (before injection)
    tool_call_id: str

    @classmethod
    def _of(cls: type[_Record], values: dict[str, Any]) -> _Record:
        """A record from every field's value, bypassing the frozen dataclass's
        ``__init__`` (one ``object.__setattr__`` per field: 7 µs a ledger entry, 3 µs an
        intent; a step builds 50 of each). Only for complete, already typed values: the
        callers are ``LedgerEntry.from_row``, ``Claims.issued_entry`` and the engine's
        ``intent_of``."""
        record = object.__new__(cls)
        record.__dict__.update(values)
        return record

    @classmethod
    def _of_columns(cls: type[_Record], columns: dict[str, Iterable[Any]], n: int) -> list[_Record]:
        """``n`` records from each field's column of values (every field named), as
        :meth:`_of` builds one, with no Python frame a record (``map`` over the columns:
        a wide step's 50 intents at once)."""
        return records_of(cls, columns, n)


@dataclass(frozen=True)
class CallIntent(CallRecord):
    """What the tool node knows about a call before it runs it (one ``issued`` row).

    ``scope`` is the thread id by default, or ``"ns:<name>"`` for an explicitly named
    namespace shared across threads. ``agent_path`` is the checkpoint namespace with task
    ids stripped (``"supervisor|researcher|tools"``: every graph node from the root down to
    the tool node), so a child agent's call keeps its identity
    when LangGraph re-runs the task under a new task id.

    ``key`` must not embed ``scope``: the primary key is ``(scope, key)`` and
    ``acopy_thread`` re-scopes a thread's rows to the fork, which must still find them.
    """

    run_id: str | None = None
    # the fork slot (see ``engine.forks``): None when the call's place in the thread's
    # history is unknown (outside a graph, or a key policy that forks share anyway)
    position: str | None = None
    branch: str | None = None
    occurrence: int = 0


def slot_of(call: CallIntent | LedgerEntry) -> tuple[Any, ...]:
    """The fork slot a call claims: (scope, position, tool, arguments, occurrence)."""
    return (call.scope, call.position, call.tool_name, call.args_hash, call.occurrence)


PAIRED = "reworded:"
"""``adopted_by`` of a lost call's entry taken by a *reworded* call (``engine/earlier.py``):
``PAIRED`` + that call's id. A pairing is a question, not proof that the two are one
call, so it never hides the entry from the lost call itself: made again with its very
arguments, it is found by orphan adoption - whatever became of the question."""
ADOPTED = "adopted:"
"""Prefixed to a plain adoption's call id that itself starts with a prefix of this
codec: no model-given id is ever read as a pairing."""


def paired_with(tool_call_id: str) -> str:
    """The ``adopted_by`` a reworded call writes on the lost entry it is paired with."""
    return PAIRED + tool_call_id


def adopted_with(tool_call_id: str) -> str:
    """The ``adopted_by`` a call writes on the lost entry it adopts: its id."""
    return ADOPTED + tool_call_id if tool_call_id.startswith((PAIRED, ADOPTED)) else tool_call_id


def is_paired(adopted_by: str | None) -> bool:
    """``adopted_by`` records a reworded call's pairing, not an adoption."""
    return adopted_by is not None and adopted_by.startswith(PAIRED)


def adopter_of(adopted_by: str | None) -> str | None:
    """The call id an ``adopted_by`` names, paired or adopted."""
    if adopted_by is None:
        return None
    for prefix in (PAIRED, ADOPTED):
        if adopted_by.startswith(prefix):
            return adopted_by[len(prefix) :]
    return adopted_by


@dataclass(frozen=True)
class LedgerEntry(CallRecord):
    """One row of the ledger, as read back."""

    status: CallStatus
    attempts: int
    replays: int
    conflicts: int
    owner: str
    issued_at: float
    lease_expires_at: float
    finished_at: float | None = None
    result_type: str | None = None
    result: bytes | None = None
    error: str | None = None
    run_id: str | None = None
    adopted_by: str | None = None
    history: str | None = None  # JSON list of decisions: see ``events``
    position: str | None = None  # the fork slot: see ``CallIntent``
    branch: str | None = None
    occurrence: int | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> LedgerEntry:
        """An entry from a row in the column order every backend selects: this class's
        fields in order (``backend.LEDGER_COLUMNS`` is derived from them)."""
        values = dict(zip(_ENTRY_FIELDS, row, strict=True))
        values["args"] = bytes(values["args"])  # drivers return memoryview/bytearray too
        values["status"] = CallStatus(values["status"])
        if values["result"] is not None:
            values["result"] = bytes(values["result"])
        return cls._of(values)

    def events(self) -> list[dict[str, Any]]:
        """The audit trail: each decision an operator or a human made about this call
        (``{"at", "by", "action", "attempt", ...}``), oldest first."""
        if not self.history:
            return []
        try:
            events = json.loads(self.history)
        except ValueError:
            return [{"action": "unreadable history", "raw": self.history[:200]}]
        return events if isinstance(events, list) else []

    def rerun_approved(self) -> bool:
        """An operator decided the effect did not happen (or a failure was transient):
        the next resume runs the call again, as its next attempt, without asking."""
        return self.status is CallStatus.ISSUED and self.owner.startswith(RERUN_APPROVED)

    def is_unknown(self, now: float | None = None) -> bool:
        """True when the call was issued, never finished, and its claim has lapsed.

        A claim lapses when its lease expires, or at once when its owner is a process on
        this machine that no longer exists (a crash here need not wait out the lease), or
        is this process and gave the call up (its outcome could never be written:
        :mod:`~langgraph_idem_saver.held_outcomes`) - no wait on itself.
        """
        if self.status is not CallStatus.ISSUED:
            return False
        now = time.time() if now is None else now
        return (
            self.lease_expires_at <= now
            or owner_is_dead(self.owner)
            or (given_up(self.scope, self.key, self.owner) and minted_here(self.owner))
        )


_ENTRY_FIELDS = tuple(f.name for f in fields(LedgerEntry))
_new, _set = object.__new__, object.__setattr__


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a claimed call ended, as :meth:`ToolCallLedger.record_outcome` records it:
    ``completed`` with the tool's serialized result, or ``failed`` with the error's text
    and the serialized error ``ToolMessage`` the model was given (replayed as is).

    One value rather than four parameters beside the entry's scope, key and owner, so
    every ledger method that writes an outcome takes the same thing. ``issued`` is a
    claim, not an outcome: :class:`~langgraph_idem_saver.errors.ConfigError`.
    """

    status: CallStatus
    result_type: str | None = None
    result: bytes | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.status is not CallStatus.COMPLETED and self.status is not CallStatus.FAILED:
            raise ConfigError(
                f"an outcome is CallStatus.COMPLETED or CallStatus.FAILED, got {self.status!r}"
                " (an issued entry is a claim: nothing has ended yet)"
            )

    @classmethod
    def completed(cls, result_type: str | None, result: bytes | None) -> Outcome:
        """The tool returned: its result as the serializer typed and dumped it."""
        return cls._of(CallStatus.COMPLETED, result_type, result, None)

    @classmethod
    def failed(
        cls, error: str | None, result_type: str | None = None, result: bytes | None = None
    ) -> Outcome:
        """The tool failed: ``error`` its text, ``result`` what to replay (if anything)."""
        return cls._of(CallStatus.FAILED, result_type, result, error)

    @classmethod
    def _of(
        cls, status: CallStatus, result_type: str | None, result: bytes | None, error: str | None
    ) -> Outcome:
        """An outcome of a status known to be one, without the frozen ``__init__`` and its
        check (half the cost; the engine makes one a tool call)."""
        outcome = _new(cls)
        _set(outcome, "status", status)
        _set(outcome, "result_type", result_type)
        _set(outcome, "result", result)
        _set(outcome, "error", error)
        return outcome


@dataclass(frozen=True)
class ClaimOutcome:
    """Result of trying to claim one call.

    ``claimed`` is True when *this* call inserted the ``issued`` row (the caller must
    now run the tool and then record its :class:`Outcome`). Otherwise ``entry`` is
    the row that already existed under the same key.
    """

    claimed: bool
    entry: LedgerEntry


@dataclass(frozen=True)
class StepCandidates:
    """What orphan adoption looks at for one step, read at once: per call signature
    (tool, args hash) the entries ``afind_orphans`` gives, per spot (position, tool) those
    ``afind_at_position`` gives, each list oldest first."""

    by_signature: dict[tuple[str, str], list[LedgerEntry]]
    at_position: dict[tuple[str, str], list[LedgerEntry]]

    def any(self) -> bool:
        """Whether there is anything for adoption to look at."""
        return any(self.by_signature.values()) or any(self.at_position.values())

    @classmethod
    def sorted_out(
        cls,
        found: Sequence[LedgerEntry],
        agent_path: str,
        signatures: Sequence[tuple[str, str]],
        spots: Sequence[tuple[str, str]],
    ) -> StepCandidates:
        """Split one read of both kinds (``found``, oldest first) into the two maps."""
        # a fresh list a key (``iter(list, None)``: no Python frame a key of a wide step)
        by_signature: dict[tuple[str, str], list[LedgerEntry]] = dict(
            zip(signatures, iter(list, None), strict=False)
        )
        at_position: dict[tuple[str, str], list[LedgerEntry]] = dict(
            zip(spots, iter(list, None), strict=False)
        )
        for e in found:
            if e.agent_path == agent_path and (e.tool_name, e.args_hash) in by_signature:
                by_signature[e.tool_name, e.args_hash].append(e)
            if e.position is not None and (e.position, e.tool_name) in at_position:
                at_position[e.position, e.tool_name].append(e)
        return cls(by_signature, at_position)


@dataclass(frozen=True)
class StepLookup:
    """What orphan adoption looks for in one step (``afind_step_candidates``' arguments):
    the entries of each call signature (tool, args hash) of the agent path, and those each
    tool made at each spot (fork position, tool).

    ``inert``: keys of the other calls of the step's message, as this state shows them
    (``adoption.step_lookup``). An entry under one of them, adopted by nobody, is a call
    of this state, which adoption never takes (``adoption._maybe_orphan``): found alone,
    it does not hold the claim back (a sibling's claim of a ``create_agent`` message is
    then one statement, not a read and a claim)."""

    scope: str
    agent_path: str
    signatures: list[tuple[str, str]]
    spots: list[tuple[str, str]]
    inert: frozenset[str] = frozenset()


@dataclass(frozen=True)
class StepClaim:
    """``aclaim_step``'s answer: what adoption looks at, and the claims - made only when
    adoption has nothing to look at (``claimed`` is None otherwise: nothing was written)."""

    candidates: StepCandidates
    claimed: list[ClaimOutcome] | None


@dataclass
class CallCounts(Counts):
    """How calls went: run to an outcome (``executed``), answered from the record
    (``replayed``), left with an unknown outcome, refused as a conflicting reuse of a
    key. Counted in process by a node (``IdempotencyCounters``) and over the ledger's
    entries (:class:`LedgerStats`), with one meaning for both."""

    executed: int = 0
    replayed: int = 0
    unknown: int = 0
    conflicts: int = 0


@dataclass
class LedgerStats(CallCounts):
    """Counters over a set of entries (a thread, or the whole ledger)."""

    in_progress: int = 0
    failed: int = 0
    by_status: dict[str, int] = field(default_factory=dict)


class ToolCallLedger(ABC):
    """The ledger protocol every backend implements.

    All methods are atomic: each is one transaction, committed before it returns
    (``claim`` commits every ``issued`` row of a batch of parallel calls at once).

    Attributes:
        loop: the event loop this ledger's coroutines must run on (a connection bound
            to it), or None when any loop will do; the engine hops there.
        serde: the serializer of recorded results (the saver's, so ``EncryptedSerializer``
            and allowlists apply to them as to checkpoints).
    """

    loop: asyncio.AbstractEventLoop | None = None
    serde: SerializerProtocol = JsonPlusSerializer()

    @abstractmethod
    async def aclaim(
        self, intents: Sequence[CallIntent], *, owner: str, lease_seconds: float
    ) -> list[ClaimOutcome]:
        """Insert an ``issued`` row for each intent whose key is free, in one commit.

        For a key already present the existing row is returned unchanged (the caller
        decides: replay, conflict, wait, or unknown outcome).
        """

    @abstractmethod
    def record_outcome(
        self, scope: str, key: str, *, owner: str, outcome: Outcome
    ) -> Awaitable[None]:
        """Record how a claimed call ended: the write starts now, the caller awaits it.

        Only an ``issued`` row owned by ``owner`` takes an outcome; otherwise awaiting
        raises :class:`~langgraph_idem_saver.errors.LedgerStateError` naming the entry's
        state. The write must be under way before this returns - not a coroutine that
        starts when awaited - so that an outcome is committed as soon as its call
        finished, whatever the caller awaits meanwhile: ``IdempotentToolNode`` starts each
        call's write as its tool returns and awaits them all once, before the node
        returns (the savers of this package submit it to their group commit). Called on
        this ledger's ``loop`` (any, when that is None). Nothing is read back: the engine
        has no use for the row (``aget_entry`` reads it).
        """

    def record_outcome_rows(
        self, rows: Sequence[OutcomeParams]
    ) -> Awaitable[list[Exception | None]]:
        """Record the outcomes of several calls that finished together, each given as its
        parameters (``held_outcomes.OutcomeParams``: status value, result type, result,
        error, finished_at, scope, key, owner): every write under way before this returns,
        as :meth:`record_outcome`'s. Awaited: per row None (recorded) or the exception
        awaiting its :meth:`record_outcome` would raise. A wide step of
        ``IdempotentToolNode`` sends its outcomes this way, once a loop iteration; this
        default records each with :meth:`record_outcome`, and the savers of this package
        send the rows as one write (``LedgerPolicy``). A row whose ``record_outcome``
        raises at once (a ledger's own check) is answered with that exception; the rows
        after it are still recorded."""
        writes: list[Awaitable[None]] = []
        for row in rows:
            try:
                outcome = Outcome(CallStatus(row[STATUS]), row[1], row[2], row[3])
                writes.append(
                    self.record_outcome(row[SCOPE], row[KEY], owner=row[OWNER], outcome=outcome)
                )
            except Exception as exc:  # this row's answer only
                writes.append(raising(exc))
        return errors_of(writes)

    @abstractmethod
    async def areclaim(
        self, entry: LedgerEntry, *, owner: str, lease_seconds: float
    ) -> LedgerEntry | None:
        """Take over ``entry``, ``issued`` and its outcome settled as "did not happen".

        Atomically bumps ``attempts``, sets the new owner and lease, and returns the
        row; returns None when the row changed since ``entry`` was read (``attempts`` or
        ``owner`` differ, or it is no longer ``issued``) - another process got there
        first. Both are checked: a key released and claimed afresh starts again at
        attempt 1, but owners never repeat.
        """

    @abstractmethod
    async def arelease(self, scope: str, key: str, *, owner: str) -> bool:
        """Delete an ``issued`` row owned by ``owner`` without recording an outcome.

        For a tool that raised LangGraph's ``interrupt()`` (human approval): it did
        nothing final, and LangGraph re-enters it on resume, which must run it again.
        Returns False when the row is not ours or not ``issued`` any more.
        """

    async def aabandon(self, scope: str, key: str, *, owner: str, error: str) -> LedgerEntry | None:
        """Give up an ``issued`` claim we own whose tool raised: its outcome is unknown.

        The row stays ``issued`` (the effect may have happened before the exception) but
        its lease ends now, so the next attempt treats it as an unknown outcome at once -
        verify, policy or a human decide - instead of waiting out the lease. ``error``
        (the exception) is kept on the row for whoever decides. Returns None when the row
        is not ours or not ``issued``.

        Not abstract, for ledgers written before it existed: their claims then simply
        lapse into unknown outcomes when the lease ends (safe, only slower).
        """
        return None

    @abstractmethod
    async def aadopt(
        self, scope: str, key: str, *, tool_call_id: str | None, previous: str | None = None
    ) -> LedgerEntry | None:
        """Mark an orphaned entry as adopted by a re-issued call (new tool_call_id).

        ``previous`` is the ``adopted_by`` the caller saw (None: never adopted). An entry
        adopted by a call whose own message was lost too is adopted again, so adoption
        survives any number of consecutive lost messages. Returns None if the entry's
        ``adopted_by`` changed since it was read (someone else adopted it first).
        ``tool_call_id=None`` hands the entry back: adopted by no call (a reworded call
        decided to run on its own, ``engine.earlier``).
        """

    @abstractmethod
    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        """Read one entry."""

    @abstractmethod
    async def afind_orphans(
        self, scope: str, agent_path: str, tool_name: str, args_hash: str
    ) -> list[LedgerEntry]:
        """Every entry with this call signature (scope, agent path, tool, args hash),
        adopted or not, oldest first: what orphan adoption looks at, by index, so its
        cost does not grow with the thread's other calls."""

    async def afind_at_position(
        self, scope: str, position: str, tool_name: str
    ) -> list[LedgerEntry]:
        """Every entry one tool claimed at one position of the thread's history (one
        step, any branch, any arguments), oldest first: what a call regenerated after
        a lost message looks at (``engine.forks``). Not abstract, for ledgers written
        before fork slots: they have none, so nothing is found."""
        return []

    async def afind_step_candidates(self, lookup: StepLookup) -> StepCandidates:
        """Both look-ups of orphan adoption for a whole step: ``afind_orphans`` of every
        (tool, args hash) in ``lookup.signatures`` and ``afind_at_position`` of every
        (position, tool) in ``lookup.spots``. The savers answer in one read, so a step's
        ledger cost does not grow with its number of calls; this default (for ledgers
        written before it) makes one read per signature and spot."""
        scope, path = lookup.scope, lookup.agent_path
        signatures, spots = dict.fromkeys(lookup.signatures), dict.fromkeys(lookup.spots)
        by_signature = {s: await self.afind_orphans(scope, path, *s) for s in signatures}
        at_position = {s: await self.afind_at_position(scope, *s) for s in spots}
        return StepCandidates(by_signature, at_position)

    async def aclaim_step(
        self, intents: Sequence[CallIntent], lookup: StepLookup, *, owner: str, lease_seconds: float
    ) -> StepClaim:
        """A step's adoption read and, when it finds nothing (the common case), its
        claim: ``afind_step_candidates`` then ``aclaim``. The savers do both in one round
        trip (one statement, or one transaction), so a fresh step costs one trip to the
        database before its tools run; this default (for other ledgers) makes two."""
        found = await self.afind_step_candidates(lookup)
        if found.any():
            return StepClaim(found, None)
        claimed = await self.aclaim(intents, owner=owner, lease_seconds=lease_seconds)
        return StepClaim(found, claimed)

    @abstractmethod
    async def alist_entries(
        self, thread_id: str | None = None, *, agent_path: str | None = None
    ) -> list[LedgerEntry]:
        """Entries of one thread (optionally one agent path), or all, oldest first."""

    @abstractmethod
    async def alist_unknown(self, *, now: float | None = None) -> list[LedgerEntry]:
        """Unknown outcomes across all threads (``LedgerEntry.is_unknown`` at ``now``):
        ``issued`` with an expired lease or a dead owner process, not yet approved for a
        re-run by an operator."""

    @abstractmethod
    async def aresolve(self, entry: LedgerEntry, outcome: Outcome) -> LedgerEntry | None:
        """Settle ``entry``'s unknown outcome by hand (operator or human-in-the-loop).

        Returns None if the row is not ``issued`` any more, or its ``attempts`` or
        ``owner`` changed since ``entry`` was read.
        """

    async def aoperator_update(
        self, entry: LedgerEntry, rewritten: LedgerEntry, event: dict[str, Any]
    ) -> LedgerEntry | None:
        """Rewrite ``entry`` as an operator decided - its status, owner, lease, result,
        error and finish time as in ``rewritten`` (``dataclasses.replace(entry, ...)``)
        - appending ``event`` to its audit trail.

        Guarded by what the operator looked at: only applies while the row still has
        ``entry``'s status, attempts and owner (None otherwise). ``attempts`` is never
        reset, so the count of tries survives every decision.
        """
        raise NotImplementedError(f"{type(self).__name__} does not support operator updates")

    async def alist_issued(self) -> list[LedgerEntry]:
        """Every ``issued`` entry (live claims and unknown outcomes), oldest first."""
        return [e for e in await self.alist_entries() if e.status is CallStatus.ISSUED]

    @abstractmethod
    async def anote_replay(self, scope: str, key: str, *, conflict: bool = False) -> None:
        """Count a replay (or an idempotency conflict) on an entry."""


async def raising(exc: Exception) -> Any:
    """An awaitable that raises ``exc``: the answer of a write refused before it started."""
    raise exc


async def errors_of(writes: Sequence[Awaitable[None]]) -> list[Exception | None]:
    """Await every write; per write None or the exception it raised. Cancelled, the
    writes not awaited yet are closed (a coroutine) or left to finish (a future) without
    being reported as never awaited."""
    errors: list[Exception | None] = []
    for at, written in enumerate(writes):
        try:
            await written
        except Exception as exc:
            errors.append(exc)
            continue
        except BaseException:
            for left in writes[at + 1 :]:
                if asyncio.iscoroutine(left):
                    left.close()
            raise
        errors.append(None)
    return errors
