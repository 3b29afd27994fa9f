"""Unknown outcomes: a call was claimed and never finished, or its tool raised.

Decided in one order, the same for every front door: an operator's approval to re-run,
then the tool's ``verify`` hook, then its ``on_unknown`` policy, and by default a human
through LangGraph's ``interrupt()``. :func:`adecide` makes no ledger write (so a node
re-entered after an interrupt asks the same questions in the same order);
:func:`aapply` records the decision.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, cast

from langchain_core.messages import ToolMessage
from langgraph.types import interrupt
from pydantic import ValidationError

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.engine.context import EngineContext, on_ledger_loop
from langgraph_idem_saver.engine.earlier import (  # a superseded call answers nothing
    aclose_superseded,
    areopen,
    arerun,
    aresolve_as_decided,
    closed_superseded,
)
from langgraph_idem_saver.engine.loops import call_maybe_async
from langgraph_idem_saver.engine.nested import orchestrates
from langgraph_idem_saver.engine.types import (
    INTERRUPT_HAS_SCHEMA,
    NOT_APPLIED,
    RESUME_ADAPTER,
    Batch,
    Kind,
    Plan,
    ToolCallInProgress,
    UnknownOutcomeResume,
    UnknownToolOutcome,
    live,
)
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, ToolCallLedger


@telemetry.traced_decision
async def adecide(ctx: EngineContext, batch: Batch, plan: Plan, *, sole: bool) -> tuple[str, Any]:
    """What to do with an unknown outcome: ("completed", result) | ("failed", error)
    | ("rerun", None) | ("fail", None). Makes no ledger write.

    ``sole``: this is the only ledgered call of the node run, so an interrupt answer
    cannot belong to another call of the same task (see :func:`ask`)."""
    call, entry = plan.call, cast(LedgerEntry, plan.entry)
    name = call["name"]
    if entry.rerun_approved():
        return ("rerun", None)  # an operator settled it: it did not happen
    if orchestrates(entry):
        return ("rerun", None)  # a task over ledgered tasks: re-run it (engine/nested.py)
    hook = ctx.options.verify.get(name)
    if hook is not None:
        outcome = await call_maybe_async(hook, asked_args(plan))
        if outcome is NOT_APPLIED:
            return ("rerun", None)
        if outcome is None:
            raise ConfigError(
                f"verify hook for tool {name!r} returned None: return the call's result "
                "when the effect happened, or NOT_APPLIED when it did not (nothing was "
                "recorded; the call stays an unknown outcome)"
            )
        return ("completed", outcome)
    policy = ctx.options.on_unknown_for(name)
    if policy == "rerun":
        return ("rerun", None)
    if policy == "fail":
        return ("fail", None)
    if policy == "raise":
        raise UnknownToolOutcome(
            f"tool call {call['id']!r} to {name!r} (key {entry.key!r}, scope "
            f"{batch.scope!r}) was started at {entry.issued_at:.3f} and never finished; "
            "it may or may not have taken effect"
        )
    value = ask(batch, plan, sole=sole)
    if value["action"] == "completed":
        return ("completed", value["result"])
    if value["action"] == "failed":
        return ("failed", value["error"])
    return ("rerun", None)


def ask(batch: Batch, plan: Plan, *, sole: bool) -> Any:
    """Ask a human through ``interrupt()`` until an answer that is about this call
    *and this attempt* comes back.

    LangGraph hands a task's resume values back by position. After a crash between
    two answers were applied, or when the same call is unknown again one attempt
    later, the value at a position may be about another call or an older attempt.
    So the payload names ``key`` and ``attempt``; an answer that names another key or
    attempt is skipped (the next ``interrupt()`` takes the next value, or asks anew),
    and an answer naming neither is accepted only where it cannot be misplaced: the
    node run's only ledgered call, on its first attempt.
    """
    call, entry = plan.call, cast(LedgerEntry, plan.entry)
    name = call["name"]
    payload: dict[str, Any] = {
        "kind": "unknown_tool_outcome",
        "tool": name,
        "args": asked_args(plan),
        "tool_call_id": call["id"],
        "key": entry.key,
        "attempt": entry.attempts,
        "attempts": entry.attempts,  # kept for answers written against 0.1
        "scope": batch.scope,
        "agent_path": entry.agent_path,
        "issued_at": entry.issued_at,
        "error": entry.error,
    }
    if plan.superseded:  # the lost call is asked about; this one waits on the answer
        payload["superseded_by"] = {"tool_call_id": call["id"], "args": call["args"]}
    payload.update(answer_instructions(entry, sole=sole))
    while True:
        if INTERRUPT_HAS_SCHEMA:
            answer = interrupt(payload, response_schema=cast(Any, UnknownOutcomeResume))
        else:  # pragma: no cover - LangGraph < 1.1
            answer = interrupt(payload)
        try:
            value = RESUME_ADAPTER.validate_python(answer)
        except ValidationError as exc:
            raise UnknownToolOutcome(
                f"invalid resume value for the unknown outcome of {name!r} call "
                f"{call['id']!r}: {answer!r}. Expected {{'action': 'completed', "
                "'result': ...}, {'action': 'rerun'} or {'action': 'failed', "
                "'error': '...'}, with the interrupt's 'key' and 'attempt'"
            ) from exc
        reason = answer_mismatch(value, entry, sole=sole)
        if reason is None:
            return value
        payload = {**payload, "previous_answer_ignored": reason}


async def aapply(ctx: EngineContext, batch: Batch, plan: Plan, decision: tuple[str, Any]) -> None:
    ledger = cast(ToolCallLedger, batch.ledger)
    entry = cast(LedgerEntry, plan.entry)
    action, value = decision
    call = plan.call
    ctx.counters.bump("unknown")  # once per call decided, not per re-entry
    if action == "fail":
        plan.kind = Kind.RETURN
        plan.result = ToolMessage(
            content=(
                f"Error: the outcome of an earlier {call['name']!r} call with these "
                "arguments is unknown: it started but was never recorded as finished, so "
                "it may or may not have taken effect. It was NOT retried; an operator "
                "must resolve it."
            ),
            name=call["name"],
            tool_call_id=call["id"],
            status="error",
        )
        return
    if action == "rerun" and plan.superseded:
        if await aclose_superseded(ctx, batch, plan):
            return
    elif action == "rerun":
        if await arerun(ctx, batch, plan, entry):
            return
    else:
        if action == "completed":
            status, error = CallStatus.COMPLETED, None
            result = ctx.as_result(value, call)
        else:
            status, error = CallStatus.FAILED, str(value)
            result = ToolMessage(
                content=f"Error: {value}",
                name=call["name"],
                tool_call_id=call["id"],
                status="error",
            )
        # guarded by the attempt and owner it was decided about (None: the row changed)
        result_type, data = ctx.dumps(batch, result)
        settled = await aresolve_as_decided(batch, entry, status, result_type, data, error)
        if settled is not None:
            plan.kind, plan.result, plan.entry = Kind.RETURN, result, settled
            return
    # The row changed under us: someone else settled or reclaimed it first. A
    # resumer that reclaimed it is running it now: wait for it, as for any live claim.
    latest = await on_ledger_loop(batch, ledger.aget_entry(batch.scope, entry.key))
    if latest is not None and live(latest):
        plan.entry = latest
        await ctx.await_settled(batch, plan)
        if plan.kind is Kind.RUN:
            return
        latest = plan.entry
    if latest is not None and closed_superseded(latest) and not plan.superseded:
        # closed "not applied" by a reworded call meanwhile: it did not happen, and this
        # call asks for its very arguments - run it (engine/earlier.py), never replay it
        plan.entry = latest
        if await areopen(ctx, batch, plan, "not applied; superseded"):
            return
        latest = None
    if latest is not None and latest.status is not CallStatus.ISSUED:
        ctx.set_replay(batch, plan, latest)
        return
    raise ToolCallInProgress(
        f"the unknown outcome of {call['name']!r} call {call['id']!r} (key {entry.key!r}) "
        "was taken over concurrently by another resumer; retry later"
    )


def asked_args(plan: Plan) -> dict[str, Any]:
    """The arguments an unknown outcome is about: the call's, or for a call that replaced
    a lost one with other arguments, the lost call's (what may have happened)."""
    entry = cast(LedgerEntry, plan.entry)
    if plan.superseded:
        try:
            args = json.loads(entry.args)
        except ValueError:
            args = None
        if isinstance(args, dict):
            return args
    return dict(plan.call["args"])


def answer_instructions(entry: LedgerEntry, *, sole: bool) -> dict[str, Any]:
    """What the payload says to send: ``answer_with`` (the ``key`` and ``attempt`` to copy
    into the answer) and ``how_to_answer``, one sentence, so an answer by interrupt id that
    copies it is applied at once, whatever else is pending in the task."""
    needed = "" if sole and entry.attempts == 1 else " (required here)"
    return {
        "answer_with": {"key": entry.key, "attempt": entry.attempts},
        "how_to_answer": (
            "Command(resume={interrupt.id: {'action': 'completed', 'result': ...} | "
            "{'action': 'rerun'} | {'action': 'failed', 'error': '...'}, plus this "
            f"payload's answer_with{needed}}})"
        ),
    }


def answer_mismatch(value: Mapping[str, Any], entry: LedgerEntry, *, sole: bool) -> str | None:
    """Why an interrupt answer cannot be applied to ``entry`` (None: it can).

    An answer that names no ``attempt`` is applied only to a first attempt: on a later
    one it may be the answer to an earlier attempt, stored in the task and handed back
    again after a crash (a stale ``rerun`` would run the call once more)."""
    if "key" in value and value["key"] != entry.key:
        return f"it answered key {value['key']!r}, not {entry.key!r}"
    if "attempt" in value and value["attempt"] != entry.attempts:
        return f"it answered attempt {value['attempt']}, this is attempt {entry.attempts}"
    if "key" not in value and not (sole and entry.attempts == 1):
        return "answers must name the interrupt's 'key' and 'attempt' here (see answer_with)"
    if "attempt" not in value and entry.attempts > 1:
        return (
            f"it names key {entry.key!r} but no 'attempt'; this is attempt "
            f"{entry.attempts}, and an answer to a later attempt must name it (an "
            "earlier attempt's answer is not applied again)"
        )
    return None
