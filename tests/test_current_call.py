"""``current_call()``: the ledger's key of the running call, read inside the call.

Through all three front doors (``IdempotentToolNode``, ``IdempotencyMiddleware``,
``idempotent_task``), async and sync tools, async ``ainvoke`` and sync ``invoke`` (the sync
savers), on both backends: the key is the same on every attempt of one call (an unknown
outcome re-run), differs between calls, is short and header-safe, names the row the call
acts on (an adopted orphan's), and outside a ledgered call ``NotInLedgeredCall`` is raised.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint
from pg_server import fresh_dsn
from tool_node_helpers import ai_calls, cfg, intent_for, plant_unknown, scripted_model, tool_graph

from langgraph_idem_saver import (
    CallInfo,
    IdempotencyMiddleware,
    IdempotentToolNode,
    NotInLedgeredCall,
    current_call,
    idempotent_task,
)
from langgraph_idem_saver.call_context import vendor_key
from langgraph_idem_saver.errors import IdemSaverError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry

HEADER_SAFE = re.compile(r"^idem-[0-9a-f]{40}$")


class Seen:
    """What the tools saw of ``current_call()``, per invoice (a list: one per attempt)."""

    def __init__(self) -> None:
        self.calls: dict[str, list[CallInfo]] = {}

    def note(self, invoice: str) -> CallInfo:
        info = current_call()
        self.calls.setdefault(invoice, []).append(info)
        return info


def charge_tools(seen: Seen) -> list[Any]:
    """An async and a sync charging tool that read ``current_call()``, and a read-only
    lookup that tries to."""

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        info = seen.note(invoice)
        return f"charged {invoice} with {info.key}"

    @tool
    def charge_sync(invoice: str) -> str:
        """Charge an invoice (a sync tool: run in a worker thread)."""
        info = seen.note(invoice)
        return f"charged {invoice} with {info.key}"

    @tool
    def lookup(invoice: str) -> str:
        """Look an invoice up (read-only: not ledgered)."""
        try:
            current_call()
        except NotInLedgeredCall as exc:
            return f"no key: {type(exc).__name__}"
        return "a key"  # pragma: no cover - the assertion below fails on it

    lookup.metadata = {"read_only": True}
    return [charge, charge_sync, lookup]


async def entries_by_invoice(saver: Any, thread: str) -> dict[str, LedgerEntry]:
    found = await saver.alist_entries(thread)
    return {json.loads(e.args)["invoice"]: e for e in found if e.tool_name != "__model__"}


def assert_keys(seen: Seen, entries: dict[str, LedgerEntry]) -> None:
    """Each call's key is its row's vendor key, header-safe, and unique per call."""
    keys = set()
    for invoice, infos in seen.calls.items():
        entry = entries[invoice]
        for info in infos:
            assert HEADER_SAFE.match(info.key), info.key
            assert info.key == vendor_key(entry.scope, entry.key)
            assert info.ledger_key == entry.key
            assert info.tool_call_id == entry.tool_call_id
            assert info.tool_name == entry.tool_name
            assert info.thread_id == entry.thread_id
        keys.add(infos[0].key)
    assert len(keys) == len(seen.calls)  # another call, another key


def test_outside_a_ledgered_call_it_is_a_typed_error() -> None:
    with pytest.raises(NotInLedgeredCall, match="only available inside a tool"):
        current_call()
    assert issubclass(NotInLedgeredCall, IdemSaverError)


async def test_tool_node_async_and_sync_tools(saver: Any) -> None:
    seen = Seen()
    node = IdempotentToolNode(charge_tools(seen))
    graph = tool_graph(node, saver)
    calls = [
        ("charge", {"invoice": "a"}, "c1"),
        ("charge_sync", {"invoice": "b"}, "c2"),
        ("lookup", {"invoice": "c"}, "c3"),
    ]
    out = await graph.ainvoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    texts = {m.tool_call_id: str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)}
    assert texts["c3"] == "no key: NotInLedgeredCall"
    assert_keys(seen, await entries_by_invoice(saver, "t"))
    assert [i.attempt for i in seen.calls["a"]] == [1]
    assert texts["c1"].endswith(seen.calls["a"][0].key)
    with pytest.raises(NotInLedgeredCall):  # the call's context ended with it
        current_call()
    # another thread, the same call ids: other rows, other keys
    await graph.ainvoke({"messages": [ai_calls(*calls[:1])]}, cfg("t2"))
    assert seen.calls["a"][1].key != seen.calls["a"][0].key


async def test_an_unknown_outcome_rerun_keeps_the_key(saver: Any) -> None:
    """A crashed attempt re-run (``on_unknown="rerun"``): the same key, attempt 2."""
    seen = Seen()
    message = ai_calls(("charge", {"invoice": "a"}, "c1"))
    planted = await plant_unknown(
        saver, intent_for("t", message.tool_calls[0], message_id=message.id)
    )
    node = IdempotentToolNode(charge_tools(seen), on_unknown="rerun")
    await tool_graph(node, saver).ainvoke({"messages": [message]}, cfg("t"))
    [info] = seen.calls["a"]
    assert info.key == vendor_key(planted.scope, planted.key) and info.attempt == 2


async def test_an_adopted_orphan_gives_the_key_of_its_entry(saver: Any) -> None:
    """The model message of a call was lost (a crash before the checkpoint): the call
    comes back with a new message id, adopts the old entry, and hands the vendor the
    adopted row's key - the one the first attempt sent."""
    seen = Seen()
    node = IdempotentToolNode(charge_tools(seen), on_unknown="rerun")
    lost = ai_calls(("charge", {"invoice": "a"}, "c1"), msg_id="ai-lost")
    planted = await plant_unknown(saver, intent_for("t", lost.tool_calls[0], message_id=lost.id))
    again = ai_calls(("charge", {"invoice": "a"}, "c1"), msg_id="ai-again")
    await tool_graph(node, saver).ainvoke({"messages": [again]}, cfg("t"))
    [info] = seen.calls["a"]
    assert node.counters.adopted == 1
    assert info.ledger_key == planted.key
    assert info.key == vendor_key(planted.scope, planted.key) and info.attempt == 2


def agent_turn(*calls: tuple[str, str]) -> list[AIMessage]:
    first = AIMessage(
        "",
        id="ai-charges",
        tool_calls=[
            {"name": name, "args": {"invoice": inv}, "id": f"call_{inv}", "type": "tool_call"}
            for name, inv in calls
        ],
    )
    return [first, AIMessage("done", id="ai-done")]


async def test_middleware_async_and_sync_tools(saver: Any) -> None:
    seen = Seen()
    agent = create_agent(
        scripted_model(*agent_turn(("charge", "a"), ("charge_sync", "b"))),
        tools=charge_tools(seen),
        middleware=[IdempotencyMiddleware()],
        checkpointer=saver,
    )
    await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    entries = await entries_by_invoice(saver, "t")
    assert {i: e.status for i, e in entries.items()} == {
        "a": CallStatus.COMPLETED,
        "b": CallStatus.COMPLETED,
    }
    assert_keys(seen, entries)
    assert entries["a"].agent_path == "tools" and seen.calls["a"][0].agent_path == "tools"


async def test_task_async_and_sync_bodies(saver: Any) -> None:
    seen = Seen()

    @idempotent_task
    async def pay(invoice: str) -> str:
        return seen.note(invoice).key

    @idempotent_task
    def pay_sync(invoice: str) -> str:
        return seen.note(invoice).key

    @entrypoint(checkpointer=saver)
    async def run(invoices: list[str]) -> list[str]:
        return [await pay(invoices[0]), await pay_sync(invoices[1])]

    keys = await run.ainvoke(["a", "b"], cfg("t"))
    assert_keys(seen, await entries_by_invoice(saver, "t"))
    assert keys == [seen.calls["a"][0].key, seen.calls["b"][0].key]
    # replayed, the body does not run: the recorded key comes back
    assert await run.ainvoke(["a", "b"], cfg("t")) == keys
    assert len(seen.calls["a"]) == 1


# --- sync invoke on the sync savers ---------------------------------------------------------


@pytest.fixture
def sync_saver(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    if backend == "sqlite":
        from langgraph_idem_saver.sqlite import SqliteSaver

        with SqliteSaver.from_conn_string(str(tmp_path / "sync.sqlite")) as saver:
            yield saver
    else:
        from langgraph_idem_saver.postgres import PostgresSaver

        dsn = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
        with PostgresSaver.from_conn_string(dsn) as saver:
            yield saver


def sync_entries(saver: Any, thread: str) -> dict[str, LedgerEntry]:
    found = asyncio.run(saver.alist_entries(thread))
    return {json.loads(e.args)["invoice"]: e for e in found if e.tool_name != "__model__"}


def test_sync_invoke_through_all_three_front_doors(sync_saver: Any) -> None:
    seen = Seen()
    tools = charge_tools(seen)
    node_graph = tool_graph(IdempotentToolNode(tools), sync_saver)
    message = ai_calls(
        ("charge_sync", {"invoice": "n1"}, "c1"), ("charge_sync", {"invoice": "n2"}, "c2")
    )
    node_graph.invoke({"messages": [message]}, cfg("node"))
    assert_keys(seen, sync_entries(sync_saver, "node"))

    agent = create_agent(
        scripted_model(*agent_turn(("charge_sync", "m1"))),
        tools=tools,
        middleware=[IdempotencyMiddleware()],
        checkpointer=sync_saver,
    )
    agent.invoke({"messages": [("user", "pay")]}, cfg("agent"))

    @idempotent_task
    def pay(invoice: str) -> str:
        return seen.note(invoice).key

    @entrypoint(checkpointer=sync_saver)
    def run(invoice: str) -> str:
        return str(pay(invoice).result())

    key = run.invoke("t1", cfg("task"))
    entries = {
        **sync_entries(sync_saver, "node"),
        **sync_entries(sync_saver, "agent"),
        **sync_entries(sync_saver, "task"),
    }
    assert set(seen.calls) == {"n1", "n2", "m1", "t1"}
    assert_keys(seen, entries)
    assert key == seen.calls["t1"][0].key
