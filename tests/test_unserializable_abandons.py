"""A tool whose result the serializer refuses: the tool ran, so its claim is abandoned.

The ``SerializationError`` reaches the caller, and the call is left as ``araised`` leaves
a call that raised after starting - ``issued``, its lease ended, the error kept - so the
next attempt in the same process goes through verify -> policy at once, instead of
waiting ``wait_seconds`` and raising ``ToolCallInProgress`` for the whole lease.

Real parts: the suite's savers (a real SQLite file; PostgreSQL where the suite runs it),
``IdempotentToolNode`` async (an async graph) and sync (``graph.invoke``).
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph, tool_messages

from langgraph_idem_saver import CallStatus, SerializationError
from langgraph_idem_saver.tool_node import IdempotentToolNode

# Short enough to keep the control quick, long enough to tell "asked at once" from a wait.
WAIT = 3.0


def opaque_tools(ran: list[int]) -> list[Any]:
    @tool(response_format="content_and_artifact")
    async def aopaque(amount: int) -> tuple[str, Any]:
        """Returns an artifact the serializer refuses (an async tool)."""
        ran.append(amount)
        return "done", object()

    @tool(response_format="content_and_artifact")
    def opaque(amount: int) -> tuple[str, Any]:
        """Returns an artifact the serializer refuses (a sync tool)."""
        ran.append(amount)
        return "done", object()

    return [aopaque, opaque]


def node_for(ran: list[int], asked: list[dict[str, Any]]) -> IdempotentToolNode:
    def found(args: dict[str, Any]) -> str:
        asked.append(args)
        return f"charge {args['amount']} found at vendor"

    return IdempotentToolNode(
        opaque_tools(ran),
        handle_tool_errors=False,
        verify={"aopaque": found, "opaque": found},
        wait_seconds=WAIT,
    )


async def assert_abandoned(saver: Any, thread: str) -> None:
    [entry] = await saver.alist_entries(thread)
    assert entry.status is CallStatus.ISSUED
    assert entry.lease_expires_at <= time.time()  # its lease ended, not left running
    assert entry.error is not None and "SerializationError" in entry.error


@pytest.mark.parametrize("name", ["aopaque", "opaque"])
async def test_an_unserializable_result_abandons_its_claim_async(saver: Any, name: str) -> None:
    ran: list[int] = []
    asked: list[dict[str, Any]] = []
    graph = tool_graph(node_for(ran, asked), saver)
    with pytest.raises(SerializationError):
        await graph.ainvoke({"messages": [ai_calls((name, {"amount": 7}, "o"))]}, cfg("t"))
    assert ran == [7]
    await assert_abandoned(saver, "t")

    started = time.monotonic()
    out = await graph.ainvoke(None, cfg("t"))  # the retry: asked at once, never re-run
    assert time.monotonic() - started < WAIT
    assert asked == [{"amount": 7}] and ran == [7]
    assert tool_messages(out)[-1].content == "charge 7 found at vendor"


def test_an_unserializable_result_abandons_its_claim_sync(tmp_path: Any) -> None:
    import sqlite3

    from langgraph_idem_saver.sqlite import SqliteSaver

    ran: list[int] = []
    asked: list[dict[str, Any]] = []
    conn = sqlite3.connect(tmp_path / "ledger.db", check_same_thread=False)
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            graph = tool_graph(node_for(ran, asked), saver)
            calls = [("opaque", {"amount": 5}, "o")]
            with pytest.raises(SerializationError):
                graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
            assert ran == [5]
            with sqlite3.connect(tmp_path / "ledger.db") as reader:  # a connection of its own
                [(status, lease_expires_at, error)] = reader.execute(
                    "SELECT status, lease_expires_at, error FROM idem_tool_calls"
                ).fetchall()
            assert status == "issued"
            assert lease_expires_at <= time.time()
            assert error is not None and "SerializationError" in error

            started = time.monotonic()
            out = graph.invoke(None, cfg("t"))
            assert time.monotonic() - started < WAIT
            assert asked == [{"amount": 5}] and ran == [5]
            assert tool_messages(out)[-1].content == "charge 5 found at vendor"
    finally:
        conn.close()


async def test_the_middleware_abandons_it_and_a_retry_is_asked_at_once(saver: Any) -> None:
    from langchain.agents import create_agent
    from langchain.agents.middleware import ToolRetryMiddleware
    from langchain_core.messages import AIMessage, ToolMessage
    from tool_node_helpers import scripted_model

    from langgraph_idem_saver.middleware import IdempotencyMiddleware

    ran: list[int] = []
    asked: list[dict[str, Any]] = []

    def found(args: dict[str, Any]) -> str:
        asked.append(args)
        return f"charge {args['amount']} found at vendor"

    call = {"name": "opaque", "args": {"amount": 3}, "id": "call_0", "type": "tool_call"}
    model = scripted_model(
        AIMessage("", id="ai-calls", tool_calls=[call]), AIMessage("done", id="ai-done")
    )
    # the retry (outer) catches the SerializationError and runs the call again at once
    retry = ToolRetryMiddleware(max_retries=1, initial_delay=0.0, jitter=False)
    ledger = IdempotencyMiddleware(verify={"opaque": found}, wait_seconds=WAIT)
    agent = create_agent(
        model, tools=[opaque_tools(ran)[1]], middleware=[retry, ledger], checkpointer=saver
    )
    started = time.monotonic()
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert time.monotonic() - started < WAIT
    assert ran == [3] and asked == [{"amount": 3}]
    texts = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
    assert texts == ["charge 3 found at vendor"]
    entries = [e for e in await saver.alist_entries("t") if e.tool_name != "__model__"]
    assert [e.status for e in entries] == [CallStatus.COMPLETED]
