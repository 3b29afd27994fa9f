"""The call ``IdempotencyMiddleware`` ledgers: the one that runs, not the one the model made.

A middleware may replace a call's arguments before the tool runs: listed before ours
(``HumanInTheLoopMiddleware`` applying a reviewer's edit, a redacting middleware) it hands
us the replaced call; listed after ours, ``HumanInTheLoopMiddleware`` swaps the reviewer's
edit in inside its own ``wrap_tool_call``, after we planned. Either way the ledger must
record, verify and ask about the arguments the tool is invoked with, while the key stays
the model's call (its id in its message). :func:`executed_call` resolves that call;
:func:`anote_edit` appends an ``edited`` event (the model's arguments and the ones that
ran) to the entry's audit trail, so an edit is visible in ``LedgerEntry.events()``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, cast

from langchain_core.messages import AIMessage, ToolCall

from langgraph_idem_saver.engine.context import anote_event
from langgraph_idem_saver.engine.types import Batch, Kind, Plan
from langgraph_idem_saver.middleware_order import reviewer_edit

__all__ = ["Executed", "anote_edit", "executed_call"]


@dataclass(frozen=True, slots=True)
class Executed:
    """The call that will run, the tool it runs, and the model's own arguments when they
    differ (None: not edited)."""

    call: ToolCall
    tool: Any
    model_args: dict[str, Any] | None
    edited_by: str | None


def model_call(messages: Any, call_id: str) -> ToolCall | None:
    """The model's call with this id in the visible messages (the newest one)."""
    if not isinstance(messages, list):
        return None
    for message in reversed(messages):
        if isinstance(message, AIMessage):
            for call in message.tool_calls:
                if call.get("id") == call_id:
                    return call
    return None


def executed_call(call: ToolCall, tool: Any, state: Any, messages: Any, tools: Any) -> Executed:
    """The call the tool will be invoked with (see the module docstring)."""
    call_id = str(call.get("id"))
    edited_by: str | None = None
    edit = reviewer_edit(state, call_id)
    if edit is not None and (edit["name"] != call["name"] or edit["args"] != call["args"]):
        # HITL listed after ours: it swaps this edit in inside its wrap_tool_call
        call = cast(ToolCall, {**call, "name": edit["name"], "args": dict(edit["args"])})
        if tool is None or getattr(tool, "name", None) != edit["name"]:
            tool = next((t for t in tools or () if getattr(t, "name", None) == edit["name"]), None)
        edited_by = "HumanInTheLoopMiddleware"
    elif edit is not None:
        edited_by = "HumanInTheLoopMiddleware"  # listed before ours: already swapped in
    original = model_call(messages, call_id)
    if original is None or (original["args"] == call["args"] and original["name"] == call["name"]):
        return Executed(call, tool, None, None)
    return Executed(call, tool, dict(original["args"]), edited_by or "a middleware")


async def anote_edit(batch: Batch, plan: Plan, executed: Executed) -> None:
    """Append an ``edited`` event to the entry we just claimed (a claim of ours, first
    attempt or a re-run): what the model asked, what runs, and who changed it."""
    entry = plan.entry
    if executed.model_args is None or plan.kind is not Kind.RUN or not plan.owned or entry is None:
        return
    if any(
        e.get("action") == "edited" and e.get("attempt") == entry.attempts for e in entry.events()
    ):
        return  # noted when this attempt was claimed (a re-entered task claims it again)
    event = {
        "by": executed.edited_by,
        "action": "edited",
        "attempt": entry.attempts,
        "model_args": executed.model_args,
        "args": dict(executed.call["args"]),
        "tool": executed.call["name"],
    }
    # a claim of ours: issued, so the entry's own status and fields are what it keeps
    updated = await anote_event(batch, entry, event)  # None: a ledger without an audit trail
    if updated is not None:
        plan.entry = updated
