"""Calls an earlier entry *might* answer: decided explicitly, never guessed.

An entry answers a call silently only when it is that call. Two kinds of entries reach a
call without proof of it, and are decided here instead:

* **reworded**: the entry of a lost call of the same step and tool with *other*
  canonical arguments (``adoption.aadopt_superseded``: a model re-run after its message
  was lost asks for "inv-7" where the lost call charged "inv-1"). The lost call is
  settled on its own first - recorded, or ``verify`` / ``on_unknown`` / a human asked
  about *its* arguments (``unknown.adecide``). When it did not happen it is closed (see
  below) and the new call runs; when it happened, the new call is decided here.
* **of an ended conversation**: an entry kept when its thread was deleted
  (``adelete_thread``) or swept (``asweep``), which appended a ``conversation_ended``
  event to its history (:data:`ENDED`). A new conversation on the same thread id is not
  the one that made it, whatever its arguments: once that entry is settled (an unknown
  one goes to ``verify`` / policy / a human first), the new call is decided here.

The decision is ``on_earlier_call`` (per tool): ``"ask"`` (default: an ``interrupt()``
of kind ``earlier_call`` showing both calls, answered ``{"action": "run"}`` or
``{"action": "replay"}`` with the payload's ``key``), ``"run"`` or ``"replay"`` (the
earlier entry's outcome answers the call: the behaviour before this rule, for users who
want it).

And an entry closed as superseded (a lost call that did *not* happen, replaced by a
reworded one) answers nothing: it records "not applied", so a call with its very
arguments that reaches it later (its fork slot, its key, adoption) runs it again as its
next attempt instead of being told it failed (:func:`areopen`).

The marks live in the entry's history (JSON events), which every backend already stores
and reads with the entry: no schema change, no extra read on the common path.
"""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Mapping
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langgraph.types import interrupt

from langgraph_idem_saver.engine.context import EngineContext, anote_event, on_ledger_loop
from langgraph_idem_saver.engine.results import text_of
from langgraph_idem_saver.engine.types import (
    Batch,
    Kind,
    OnEarlierCall,
    Plan,
    ToolCallInProgress,
)
from langgraph_idem_saver.ledger import (
    CallStatus,
    LedgerEntry,
    Outcome,
    ToolCallLedger,
    adopter_of,
)
from langgraph_idem_saver.owners import RERUN_APPROVED
from langgraph_idem_saver.retention import ENDED  # appended by deleting transactions

SUPERSEDED = "superseded"
"""History event: a lost call that did not happen, closed ``failed`` for the reworded
call that replaced it. It answers no call."""
REOPENED = "reopened"
"""History event: the entry was opened again for a call (its next attempt runs it)."""
_MARKS = (SUPERSEDED, ENDED, REOPENED)
BY = "idem-saver"


def last_mark(entry: LedgerEntry) -> str | None:
    """The newest of this module's events in the entry's history (None: none).

    Cheap on the common path: most entries have no history, and one without any of the
    marks' names is not parsed."""
    history = entry.history
    if not history or not any(mark in history for mark in _MARKS):
        return None
    for event in reversed(entry.events()):
        action = event.get("action") if isinstance(event, dict) else None
        if action in _MARKS:
            return cast(str, action)
    return None


def closed_superseded(entry: LedgerEntry) -> bool:
    """A lost call closed as "not applied; superseded": it did not happen."""
    return entry.status is CallStatus.FAILED and last_mark(entry) == SUPERSEDED


def of_ended_conversation(entry: LedgerEntry) -> bool:
    """Kept when its thread was deleted or swept, not reopened since."""
    return last_mark(entry) == ENDED


async def aclose_superseded(ctx: EngineContext, batch: Batch, plan: Plan) -> bool:
    """A lost call that did not happen, replaced by ``plan``'s call: record it ``failed``
    (not applied, superseded; the :data:`SUPERSEDED` event says so for good) and let the
    new call be claimed on its own. False when the row changed under us."""
    entry = cast(LedgerEntry, plan.entry)
    call = plan.call
    note = (
        f"not applied; superseded by call {call['id']!r} with other arguments after its "
        "model message was lost"
    )
    result = ToolMessage(
        content=f"Error: {note}", name=call["name"], tool_call_id=entry.tool_call_id, status="error"
    )
    result_type, data = ctx.dumps(batch, result)
    event = {
        "by": BY,
        "action": SUPERSEDED,
        "attempt": entry.attempts,
        "superseded_by": str(call["id"]),
    }
    closed = await _aupdate(
        batch, entry, CallStatus.FAILED, entry.owner, result_type, data, note, event
    )
    if closed is None:
        return False
    plan.entry = plan.ledger_key = None
    plan.superseded = False
    return True


async def areopen(ctx: EngineContext, batch: Batch, plan: Plan, why: str) -> bool:
    """Open ``plan``'s entry again for ``plan``'s call: "issued, approved for a re-run"
    (:data:`REOPENED` in its history), then claimed as its next attempt. After it the plan
    runs (``Kind.RUN``); False when the row changed under us (someone else got there)."""
    entry = cast(LedgerEntry, plan.entry)
    owner = f"{RERUN_APPROVED}{uuid.uuid4().hex[:12]}"
    event = _reopened(entry, plan, why)
    opened = await _aupdate(batch, entry, CallStatus.ISSUED, owner, None, None, entry.error, event)
    return opened is not None and await arerun(ctx, batch, plan, opened)


async def arerun(ctx: EngineContext, batch: Batch, plan: Plan, entry: LedgerEntry) -> bool:
    """Claim ``entry`` (issued: unknown, or approved for a re-run) as its next attempt, for
    ``plan`` to run, guarded by the attempt and owner it was decided about. False when the
    row changed since."""
    ledger = cast(ToolCallLedger, batch.ledger)
    fresh = await on_ledger_loop(
        batch,
        ledger.areclaim(entry, owner=batch.owner, lease_seconds=ctx.options.lease_seconds),
    )
    if fresh is None:
        return False
    plan.kind, plan.owned, plan.entry, plan.ledger_key = Kind.RUN, True, fresh, fresh.key
    plan.superseded = False
    return True


def _reopened(entry: LedgerEntry, plan: Plan, why: str) -> dict[str, Any]:
    """The :data:`REOPENED` event of ``entry`` opened again for ``plan``'s call."""
    return {
        "by": BY,
        "action": REOPENED,
        "attempt": entry.attempts,
        "status_before": entry.status.value,
        "for_call": str(plan.call["id"]),
        "why": why,
    }


async def _aupdate(
    batch: Batch,
    entry: LedgerEntry,
    status: CallStatus,
    owner: str,
    result_type: str | None,
    result: bytes | None,
    error: str | None,
    event: dict[str, Any],
) -> LedgerEntry | None:
    """One guarded rewrite of ``entry`` with ``event`` appended to its history."""
    ledger = cast(ToolCallLedger, batch.ledger)
    rewritten = dataclasses.replace(
        entry,
        status=status,
        owner=owner,
        # a claim we hold keeps its lease; one opened for a re-run has none
        lease_expires_at=0.0 if owner.startswith(RERUN_APPROVED) else entry.lease_expires_at,
        result_type=result_type,
        result=result,
        error=error,
        finished_at=None if status is CallStatus.ISSUED else time.time(),
    )
    event = {"at": time.time(), **event}
    try:
        return await on_ledger_loop(batch, ledger.aoperator_update(entry, rewritten, event))
    except NotImplementedError:  # a ledger without operator updates: no mark kept
        if status is CallStatus.ISSUED:
            return None
        return await aresolve_as_decided(batch, entry, status, result_type, result, error)


async def aresolve_as_decided(
    batch: Batch,
    entry: LedgerEntry,
    status: CallStatus,
    result_type: str | None,
    result: bytes | None,
    error: str | None,
) -> LedgerEntry | None:
    """Settle ``entry`` guarded by the attempt and owner it was decided about (None: the
    row changed since)."""
    ledger = cast(ToolCallLedger, batch.ledger)
    outcome = Outcome(status, result_type, result, error)
    return await on_ledger_loop(batch, ledger.aresolve(entry, outcome))


def earlier_reason(plan: Plan) -> str | None:
    """Why a call's settled entry is not proven to be that call: ``"reworded"``,
    ``"ended_conversation"``, or None (it is the call: answer from it)."""
    entry = plan.entry
    if entry is None or entry.status is CallStatus.ISSUED:
        return None
    if plan.kind not in (Kind.REPLAY, Kind.RETURN):
        return None
    if plan.superseded:
        return "reworded"
    if of_ended_conversation(entry):
        return "ended_conversation"
    return None


async def adecide_earlier(
    ctx: EngineContext, batch: Batch, plans: list[Plan], *, sole: bool
) -> list[Plan]:
    """Decide every call whose settled entry is not proven to be it (see the module's
    docstring), in call order, after every unknown outcome was decided (their questions
    come first, so a node re-entered after an answer asks in a stable order). Returns
    the reworded calls to be claimed on their own; calls reopened on an ended
    conversation's entry are ``Kind.RUN`` on return."""
    fresh: list[Plan] = []
    for plan in plans:
        if plan.kind is Kind.RUN and plan.owned and plan.entry is not None:
            await amark_reclaimed(batch, plan)
        reason = earlier_reason(plan)
        if reason is None:
            continue
        choice = ctx.options.on_earlier_call_for(plan.call["name"])
        if choice == "ask":
            choice = ask(batch, plan, reason, sole=sole)
        if choice == "replay":
            continue
        if reason == "reworded":
            await ahand_back(batch, plan)
            plan.entry = plan.ledger_key = None
            plan.superseded = False
            plan.kind, plan.result = Kind.PENDING, None
            fresh.append(plan)
        elif not await areopen(ctx, batch, plan, "a call of a new conversation, run"):
            raise_changed(plan)
    return fresh


async def ahand_back(batch: Batch, plan: Plan) -> None:
    """A reworded call decided to run is another call: the lost call's entry it was paired
    with stops being adopted by it and is a lost call again. Left adopted, the entry would
    be hidden from orphan adoption (its adopter's message is durable), and the lost call
    made again later - its very arguments - would run a second time instead of being
    answered by its outcome. A row adopted since by someone else is theirs: left as is."""
    entry, intent = cast(LedgerEntry, plan.entry), plan.intent
    adopter = intent.tool_call_id if intent is not None else str(plan.call["id"])
    if adopter_of(entry.adopted_by) != adopter:
        return
    ledger = cast(ToolCallLedger, batch.ledger)
    await on_ledger_loop(
        batch,
        ledger.aadopt(batch.scope, entry.key, tool_call_id=None, previous=entry.adopted_by),
    )


async def amark_reclaimed(batch: Batch, plan: Plan) -> None:
    """An ended conversation's unknown entry that did not happen, reclaimed to run this
    call: it is this conversation's from now on (:data:`REOPENED`), so its outcome
    answers this call's re-entries without a question."""
    entry = cast(LedgerEntry, plan.entry)
    if not of_ended_conversation(entry):
        return
    why = "a call of a new conversation; the earlier call did not happen"
    marked = await anote_event(batch, entry, _reopened(entry, plan, why))
    if marked is not None:
        plan.entry = marked


def raise_changed(plan: Plan) -> None:
    """The entry a call was to reopen changed under us: another resumer took it."""
    entry = cast(LedgerEntry, plan.entry)
    raise ToolCallInProgress(
        f"the entry {entry.key!r} that {plan.call['name']!r} call {plan.call['id']!r} was "
        "decided to run on changed concurrently; retry"
    )


def ask(batch: Batch, plan: Plan, reason: str, *, sole: bool) -> OnEarlierCall:
    """Ask a human whether the call runs or is answered by the earlier entry, until an
    answer about *this* question comes back (LangGraph hands a task's answers back by
    position: a value about another question is skipped, and the next one taken)."""
    entry = cast(LedgerEntry, plan.entry)
    intent = plan.intent
    call = plan.call
    key = intent.key if intent is not None else entry.key
    payload: dict[str, Any] = {
        "kind": "earlier_call",
        "reason": reason,
        "tool": call["name"],
        "args": dict(call["args"]),
        "tool_call_id": call["id"],
        "key": key,
        "scope": batch.scope,
        "earlier": {
            "key": entry.key,
            "tool_call_id": entry.tool_call_id,
            "args": _args_of(entry),
            "status": entry.status.value,
            "result": _shown(plan.result),
            "error": entry.error,
        },
        "answers": {
            "run": "run this call (the earlier one stays as recorded)",
            "replay": "answer this call with the earlier call's recorded outcome",
        },
        "answer_with": {"key": key},
        "how_to_answer": (
            "Command(resume={interrupt.id: {'action': 'run' | 'replay', plus this "
            "payload's answer_with}})"
        ),
    }
    while True:
        answer = interrupt(payload)
        choice, why = _read(answer, key, sole=sole)
        if choice is not None:
            return choice
        payload = {**payload, "previous_answer_ignored": why}


def _read(answer: Any, key: str, *, sole: bool) -> tuple[OnEarlierCall | None, str]:
    """The choice an answer makes about the question of ``key`` (None, why: skipped)."""
    if not isinstance(answer, Mapping):
        return None, f"not an answer to this question: {answer!r}"[:300]
    action = answer.get("action")
    if action not in ("run", "replay"):
        return None, f"action {action!r} is not 'run' or 'replay'"
    if "key" in answer and answer["key"] != key:
        return None, f"it answered key {answer['key']!r}, not {key!r}"
    if "key" not in answer and not sole:
        return None, "answers must name the interrupt's 'key' here"
    return cast(OnEarlierCall, action), ""


def _args_of(entry: LedgerEntry) -> Any:
    try:
        return json.loads(entry.args)
    except ValueError:
        return None


def _shown(result: Any) -> str:
    if isinstance(result, ToolMessage):
        return text_of(result.content)[:2000]
    return repr(result)[:2000]
