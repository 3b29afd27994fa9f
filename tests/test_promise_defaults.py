"""README, ``IdempotentToolNode(...)`` options: "``lease_seconds=300``, ``wait_seconds=30``",
and "``IdempotencyMiddleware(...)`` and ``idempotent_task(...)`` take the same ledger
options" - the same defaults through every front door.

The lease is shown where it acts: each door's claim, on a real SQLite file, is leased
for 300 s from its ``issued_at``. The wait (how long a resumer waits for another live
claim) would cost 30 s to show by waiting: it is read from each door's options."""

from __future__ import annotations

import inspect
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint
from tool_node_helpers import ai_calls, cfg, scripted_model, tool_graph

from langgraph_idem_saver import (
    AsyncSqliteSaver,
    IdempotencyMiddleware,
    IdempotentToolNode,
    idempotent_task,
)


@tool
def charge(invoice: str) -> str:
    """Charge an invoice."""
    return f"charged {invoice}"


async def leases(saver: AsyncSqliteSaver, thread: str, tool_name: str) -> list[float]:
    entries = await saver.alist_entries(thread)
    return [e.lease_expires_at - e.issued_at for e in entries if e.tool_name == tool_name]


async def test_every_front_door_leases_a_claim_for_300_s(tmp_path: Path) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.db")) as saver:
        node = IdempotentToolNode([charge])
        message = ai_calls(("charge", {"invoice": "a"}, "c1"))
        await tool_graph(node, saver).ainvoke({"messages": [message]}, cfg("node"))

        middleware = IdempotencyMiddleware()
        model = scripted_model(
            ai_calls(("charge", {"invoice": "b"}, "c2")), AIMessage("done", id="ai-done")
        )
        agent = create_agent(model, tools=[charge], middleware=[middleware], checkpointer=saver)
        await agent.ainvoke({"messages": [("user", "pay b")]}, cfg("agent"))

        @idempotent_task
        async def pay(invoice: str) -> str:
            return f"paid {invoice}"

        @entrypoint(checkpointer=saver)
        async def run(invoice: str) -> str:
            return await pay(invoice)

        await run.ainvoke("c", cfg("task"))

        assert await leases(saver, "node", "charge") == [300.0]
        assert await leases(saver, "agent", "charge") == [300.0]
        assert await leases(saver, "task", "pay") == [300.0]
    assert node.engine.options.wait_seconds == 30.0
    assert middleware.engine.options.wait_seconds == 30.0
    defaults = inspect.signature(idempotent_task).parameters
    assert (defaults["lease_seconds"].default, defaults["wait_seconds"].default) == (300.0, 30.0)
