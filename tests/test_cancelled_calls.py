"""A tool call cancelled while it runs is an unknown outcome at once, on every front door.

Cancellation comes from a timeout around ``ainvoke``, a cancelled task, or LangGraph
cancelling a step's other tasks after one of them raised. The effect may have landed, so
the call must not be re-run; but this process is alive, so its claim must not hold the
full lease either: the user's own retry, in the same process, would wait ``wait_seconds``
on a call that nobody runs and then raise ``ToolCallInProgress``. Each test sets a short
``wait_seconds`` so that, without the fix, it fails in a second instead of thirty.

Both backends (the ``saver`` fixture); real graphs; the tool blocks on an event that is
never set, and the test cancels the run once the tool has started.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.types import Command, Send
from tool_node_helpers import Counter, ai_calls, cfg, scripted_model, tool_graph, tool_messages

from langgraph_idem_saver import CallStatus
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.task import idempotent_task
from langgraph_idem_saver.tool_node import IdempotentToolNode

SHORT_WAIT = {"wait_seconds": 1.0, "poll_seconds": 0.05}
CANCELLED = "CancelledError: cancelled while the tool ran"


class Blocking:
    """A side effect that lands, then hangs (a reply that never comes)."""

    def __init__(self) -> None:
        self.effects = Counter()
        self.started = asyncio.Event()
        self.never = asyncio.Event()

    async def charge(self, invoice: str) -> str:
        self.effects.bump(invoice)
        self.started.set()
        await self.never.wait()
        return f"charged {invoice}"  # pragma: no cover - never reached


async def cancel_once_started(run: Awaitable[Any], started: asyncio.Event) -> None:
    task = asyncio.ensure_future(run)
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def assert_left_unknown(saver: Any, thread: str, count: int = 1) -> None:
    # tool calls only: recorded model answers (``__model__``) are test_model_record.py's
    entries = [e for e in await saver.alist_entries(thread) if e.tool_name != "__model__"]
    assert len(entries) == count
    for entry in entries:
        assert entry.status is CallStatus.ISSUED and entry.is_unknown()
        assert entry.error == CANCELLED


async def test_tool_node_call_cancelled_mid_run_is_asked_at_once(saver: Any) -> None:
    blocking = Blocking()
    charge = tool(blocking.charge, description="Charge an invoice.")
    graph = tool_graph(IdempotentToolNode([charge], **SHORT_WAIT), saver)
    msg = {"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}
    await cancel_once_started(graph.ainvoke(msg, cfg("t")), blocking.started)
    await assert_left_unknown(saver, "t")
    out = await graph.ainvoke(msg, cfg("t"))  # the user's retry, same process
    [asked] = out["__interrupt__"]
    assert asked.value["error"] == CANCELLED and asked.value["args"] == {"invoice": "a"}
    out = await graph.ainvoke(
        Command(resume={"action": "completed", "result": "found charged"}), cfg("t")
    )
    assert tool_messages(out)[-1].content == "found charged"
    assert blocking.effects.calls == ["a"]  # ran once, never again


async def test_sibling_cancelled_by_a_failing_call_is_asked_not_rerun(saver: Any) -> None:
    """LangGraph cancels a step's other tasks when one raises: a call that was mid-run
    then is an unknown outcome beside the failing one, not a claim held by a live owner."""
    blocking = Blocking()
    charge = tool(blocking.charge, description="Charge an invoice.")

    @tool
    async def explode(why: str) -> str:
        """Fail once the charge is under way."""
        await blocking.started.wait()
        raise ValueError(f"boom: {why}")

    def fan_out(state: MessagesState) -> list[Send]:
        return [
            Send("tools", {"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}),
            Send("tools", {"messages": [ai_calls(("explode", {"why": "y"}, "e1"))]}),
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("tools", IdempotentToolNode([charge, explode], **SHORT_WAIT))
    builder.add_conditional_edges(START, fan_out, ["tools"])
    graph = builder.compile(checkpointer=saver)
    with pytest.raises(ValueError, match="boom"):
        await graph.ainvoke({"messages": []}, cfg("t"))
    by_tool = {e.tool_name: e for e in await saver.alist_entries("t")}
    assert by_tool["charge"].is_unknown() and by_tool["charge"].error == CANCELLED
    assert by_tool["explode"].is_unknown() and by_tool["explode"].error == "ValueError: boom: y"
    out = await graph.ainvoke(None, cfg("t"))  # the retry: asked, not waited on
    assert {q.value["tool"] for q in out["__interrupt__"]} <= {"charge", "explode"}
    assert out["__interrupt__"]
    assert blocking.effects.calls == ["a"]


async def test_middleware_call_cancelled_mid_run_is_asked_at_once(saver: Any) -> None:
    blocking = Blocking()
    charge = tool(blocking.charge, description="Charge an invoice.")
    calls = [{"name": "charge", "args": {"invoice": "a"}, "id": "c1", "type": "tool_call"}]
    model = scripted_model(
        AIMessage("", id="ai-charges", tool_calls=calls),
        AIMessage("", id="ai-charges", tool_calls=calls),
        AIMessage("done", id="ai-done"),
    )
    agent = create_agent(
        model, tools=[charge], middleware=[IdempotencyMiddleware(**SHORT_WAIT)], checkpointer=saver
    )
    await cancel_once_started(
        agent.ainvoke({"messages": [("user", "pay")]}, cfg("t")), blocking.started
    )
    await assert_left_unknown(saver, "t")
    out = await agent.ainvoke(None, cfg("t"))  # resume where the run was cut off
    [asked] = out["__interrupt__"]
    assert asked.value["error"] == CANCELLED and asked.value["tool"] == "charge"
    assert blocking.effects.calls == ["a"]


async def test_task_cancelled_mid_run_is_asked_at_once(saver: Any) -> None:
    blocking = Blocking()
    charge = idempotent_task(name="charge", **SHORT_WAIT)(blocking.charge)

    @entrypoint(checkpointer=saver)
    async def pay(invoice: str) -> str:
        return await charge(invoice)

    await cancel_once_started(pay.ainvoke("a", cfg("t")), blocking.started)
    await assert_left_unknown(saver, "t")
    out = await pay.ainvoke("a", cfg("t"))
    [asked] = (
        out["__interrupt__"]
        if isinstance(out, dict)
        else (await pay.aget_state(cfg("t"))).interrupts
    )
    assert asked.value["error"] == CANCELLED and asked.value["args"] == {"invoice": "a"}
    assert blocking.effects.calls == ["a"]
