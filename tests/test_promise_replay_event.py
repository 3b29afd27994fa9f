"""README: ``IdempotencyMiddleware`` and ``idempotent_task`` - "A replayed call sends an
``idem_saver_replay`` custom callback event (``on_custom_event`` in ``astream_events``) in
place of the tool events it does not fire." (``tests/test_never_twice.py`` shows it for
``IdempotentToolNode``.)

A thread is run once (the tool runs: its own events fire, no replay event), copied with
``acopy_thread`` (the copy carries the ledger's entries) and run again on the copy from
before the call: the call is replayed - the custom event names it, the tool's body does
not run and fires no ``on_tool_start``. Real SQLite, a scripted model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint
from tool_node_helpers import ToolCallingFakeModel, ai_calls, cfg

from langgraph_idem_saver import AsyncSqliteSaver, IdempotencyMiddleware, idempotent_task

REPLAY_EVENT = "idem_saver_replay"
WATCHED = ("on_custom_event", "on_tool_start")


async def watched(stream: Any) -> list[tuple[str, str, Any]]:
    return [(e["event"], e["name"], e["data"]) async for e in stream if e["event"] in WATCHED]


async def test_the_middleware_sends_the_replay_event_instead_of_the_tools(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        ran.append(invoice)
        return f"charged {invoice}"

    model = ToolCallingFakeModel(
        messages=iter(
            [
                ai_calls(("charge", {"invoice": "inv-1"}, "c1")),
                AIMessage("done", id="ai-done"),
                AIMessage("done", id="ai-done-2"),  # the fork's later model step: asked anew
            ]
        ),
        disable_streaming=True,  # (the fake model's stream would drop the tool calls)
    )
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.db")) as saver:
        agent = create_agent(
            model, tools=[charge], middleware=[IdempotencyMiddleware()], checkpointer=saver
        )
        first = await watched(
            agent.astream_events({"messages": [("user", "pay")]}, cfg("t"), version="v2")
        )
        assert [(e, n) for e, n, _ in first] == [("on_tool_start", "charge")]  # it ran
        await saver.acopy_thread("t", "t2")
        history = [s async for s in agent.aget_state_history(cfg("t2"))]
        [before_tools] = [s for s in history if s.next == ("tools",)]
        again = await watched(agent.astream_events(None, before_tools.config, version="v2"))
    assert [(e, n) for e, n, _ in again] == [("on_custom_event", REPLAY_EVENT)]
    assert again[0][2]["tool_call_id"] == "c1" and again[0][2]["recorded"] == "completed"
    assert ran == ["inv-1"]  # replayed, not run


async def test_an_idempotent_task_sends_the_replay_event_when_replayed(tmp_path: Path) -> None:
    ran: list[str] = []

    @idempotent_task
    async def charge(invoice: str) -> str:
        ran.append(invoice)
        return f"charged {invoice}"

    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "t.db")) as saver:

        @entrypoint(checkpointer=saver)
        async def pay(invoice: str) -> str:
            return await charge(invoice)

        first = await watched(pay.astream_events("inv-1", cfg("t"), version="v2"))
        assert [e for e, _, _ in first] == []  # ran: no replay event
        await saver.acopy_thread("t", "t2")
        again = await watched(pay.astream_events("inv-1", cfg("t2"), version="v2"))
    assert [(e, n) for e, n, _ in again] == [("on_custom_event", REPLAY_EVENT)]
    assert again[0][2]["recorded"] == "completed"
    assert ran == ["inv-1"]  # replayed, not run
