"""IdempotentToolNode: ToolNode parity, replay, keys, unknown outcomes, interrupts,
orphan adoption, scopes, create_react_agent v1/v2 and sync invoke - on both backends.

No mocks of what we sell: every test runs a real saver (checkpointer and ledger in one;
the ``saver`` fixture of conftest.py, a SQLite file or a fresh Postgres schema), real
LangGraph graphs, and scripted fake chat models.
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import InjectedState, ToolNode, ToolRuntime, create_react_agent
from langgraph.types import Command, interrupt
from tool_node_helpers import (
    Counter,
    ai_calls,
    by_id,
    cfg,
    fields,
    intent_for,
    plant_completed,
    plant_in_progress,
    plant_unknown,
    scripted_model,
    tool_graph,
    tool_messages,
)
from typing_extensions import TypedDict

from langgraph_idem_saver import CallStatus, Outcome, SerializationError
from langgraph_idem_saver.errors import IdemSaverError
from langgraph_idem_saver.keys import agent_path_of, args_hash, canonical_args, scope_of
from langgraph_idem_saver.tool_node import (
    NOT_APPLIED,
    IdempotencyConflict,
    IdempotentToolNode,
    NoLedgerError,
    ToolCallInProgress,
    UnknownToolOutcome,
)

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")


def make_tools(effects: Counter) -> list[Any]:
    @tool
    def charge(amount: int, currency: str = "EUR") -> str:
        """Charge the customer."""
        effects.bump(("charge", amount))
        return f"charged {amount} {currency}"

    @tool(response_format="content_and_artifact")
    def receipt(order: str) -> tuple[str, dict[str, Any]]:
        """Make a receipt."""
        effects.bump(("receipt", order))
        return f"receipt for {order}", {"order": order, "pages": 2}

    @tool
    def explode(why: str) -> str:
        """Always fails."""
        effects.bump(("explode", why))
        raise ValueError(f"boom: {why}")

    @tool
    def lookup(q: str) -> str:
        """A pure read."""
        effects.bump(("lookup", q))
        return f"found {q}"

    return [charge, receipt, explode, lookup]


# --- keys -----------------------------------------------------------------------------------


def test_canonical_args_and_paths() -> None:
    assert canonical_args({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    assert args_hash('{"a":1}') == args_hash(canonical_args({"a": 1}))
    with pytest.raises(SerializationError):
        canonical_args({"x": math.nan})
    with pytest.raises(SerializationError):
        canonical_args({"x": object()})
    assert agent_path_of("") == ""
    assert agent_path_of("tools:abc") == "tools"
    assert agent_path_of("parent:1f2|child:9a8") == "parent|child"
    assert scope_of("t1", None) == "t1"
    assert scope_of("t1", "shop") == "ns:shop"


# --- drop-in parity ---------------------------------------------------------------------------


async def test_parity_with_tool_node_and_replay(saver: Any) -> None:
    fx_plain, fx_idem = Counter(), Counter()
    msg = ai_calls(
        ("charge", {"amount": 5}, "c1"),
        ("receipt", {"order": "o1"}, "c2"),
        ("nope", {}, "c3"),  # unregistered tool: ToolNode's error message, no ledger
    )
    plain = tool_graph(ToolNode(make_tools(fx_plain)), InMemorySaver())
    node = IdempotentToolNode(make_tools(fx_idem))
    idem = tool_graph(node, saver)

    expected = tool_messages(await plain.ainvoke({"messages": [msg]}, cfg("t")))
    got = tool_messages(await idem.ainvoke({"messages": [msg]}, cfg("t")))
    assert [fields(m) for m in got] == [fields(m) for m in expected]
    assert got[1].artifact == {"order": "o1", "pages": 2}
    assert len(fx_idem) == 2

    # Re-running the step replays: same messages, no side effect.
    again = tool_messages(await idem.ainvoke({"messages": [msg]}, cfg("t")))
    assert [fields(m) for m in again[-3:]] == [fields(m) for m in expected]
    assert len(fx_idem) == 2
    assert node.counters.executed == 2 and node.counters.replayed == 2
    entries = await saver.alist_entries("t")
    assert [e.status for e in entries] == [CallStatus.COMPLETED] * 2
    assert all(e.replays == 1 for e in entries)


async def test_handled_errors_are_recorded_failed_and_replayed(saver: Any) -> None:
    fx = Counter()
    msg = ai_calls(("explode", {"why": "x"}, "e1"))
    plain = tool_graph(ToolNode(make_tools(Counter()), handle_tool_errors=True), InMemorySaver())
    node = IdempotentToolNode(make_tools(fx), handle_tool_errors=True)
    graph = tool_graph(node, saver)
    [expected] = tool_messages(await plain.ainvoke({"messages": [msg]}, cfg("t")))
    [got] = tool_messages(await graph.ainvoke({"messages": [msg]}, cfg("t")))
    assert fields(got) == fields(expected) and got.status == "error"
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.FAILED and entry.error and "boom: x" in entry.error
    await graph.ainvoke({"messages": [msg]}, cfg("other-thread"))
    assert len(fx) == 2  # another thread: a new call, it runs
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert fields(tool_messages(out)[-1]) == fields(expected)
    assert len(fx) == 2  # same thread: the failure is replayed, not re-run


async def test_unhandled_error_is_an_unknown_outcome_not_a_rerun(saver: Any) -> None:
    """An exception that escapes the tool may come after its effect: the claim stays
    ``issued`` (lease ended, error kept) and the retry asks instead of re-running."""
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), saver)
    msg = ai_calls(("explode", {"why": "y"}, "e1"))
    with pytest.raises(ValueError, match="boom"):
        await graph.ainvoke({"messages": [msg]}, cfg("t"))
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.ISSUED and entry.is_unknown()
    assert entry.error == "ValueError: boom: y"
    out = await graph.ainvoke(None, cfg("t"))  # the ordinary retry
    [asked] = out["__interrupt__"]
    assert asked.value["key"] == entry.key and asked.value["error"] == "ValueError: boom: y"
    assert len(fx) == 1  # asked, not re-run


class Cart(TypedDict):
    messages: Annotated[list[Any], add_messages]
    total: int


async def test_command_tools_injection_and_replay(saver: Any) -> None:
    fx = Counter()

    @tool
    def add_to_cart(
        amount: int,
        tool_call_id: Annotated[str, InjectedToolCallId],
        total: Annotated[int, InjectedState("total")],
        runtime: ToolRuntime,
    ) -> Command:
        """Add to cart."""
        fx.bump(amount)
        assert runtime.tool_call_id == tool_call_id
        return Command(
            update={
                "total": total + amount,
                "messages": [ToolMessage(f"added {amount}", tool_call_id=tool_call_id)],
            }
        )

    def build(node: ToolNode, cp: Any) -> Any:
        b = StateGraph(Cart)
        b.add_node("tools", node)
        b.add_edge(START, "tools")
        return b.compile(checkpointer=cp)

    msg = ai_calls(("add_to_cart", {"amount": 3}, "a1"))
    plain = await build(ToolNode([add_to_cart]), InMemorySaver()).ainvoke(
        {"messages": [msg], "total": 10}, cfg("t")
    )
    node = IdempotentToolNode([add_to_cart])
    graph = build(node, saver)
    got = await graph.ainvoke({"messages": [msg], "total": 10}, cfg("t"))
    assert got["total"] == plain["total"] == 13
    assert fields(tool_messages(got)[0]) == fields(tool_messages(plain)[0])
    [entry] = await saver.alist_entries("t")
    assert entry.args == b'{"amount":3}'  # model args only, nothing injected

    # Replay under the "args" policy to a NEW tool call id: the Command is re-addressed.
    node_args = IdempotentToolNode([add_to_cart], key_policy="args")
    graph2 = build(node_args, saver)
    await graph2.ainvoke({"messages": [msg], "total": 0}, cfg("u"))
    msg2 = ai_calls(("add_to_cart", {"amount": 3}, "a2"))
    out = await graph2.ainvoke({"messages": [msg2], "total": 0}, cfg("u"))
    assert len(fx) == 3  # plain, t, u(first) - the second u call replays
    assert tool_messages(out)[-1].tool_call_id == "a2"
    assert tool_messages(out)[-1].content == "added 3"
    assert out["total"] == 3  # the recorded Command's update (total 0 + 3)


async def test_messages_key_and_user_wrapper_inside(saver: Any) -> None:
    fx = Counter()
    seen: list[str] = []

    async def awrap(request: Any, execute: Any) -> Any:
        seen.append(request.tool_call["id"])
        result = await execute(request)
        result.content = f"wrapped({result.content})"
        return result

    class Chat(TypedDict):
        chat: Annotated[list[Any], add_messages]

    node = IdempotentToolNode(make_tools(fx), messages_key="chat", awrap_tool_call=awrap)
    b = StateGraph(Chat)
    b.add_node("tools", node)
    b.add_edge(START, "tools")
    graph = b.compile(checkpointer=saver)
    msg = ai_calls(("charge", {"amount": 1}, "w1"))
    out = await graph.ainvoke({"chat": [msg]}, cfg("t"))
    assert out["chat"][-1].content == "wrapped(charged 1 EUR)"
    out = await graph.ainvoke({"chat": [msg]}, cfg("t"))
    assert out["chat"][-1].content == "wrapped(charged 1 EUR)"  # the wrapped result replays
    assert seen == ["w1"] and len(fx) == 1  # wrapper ran inside ours: not on replay


# --- keys, conflicts, read-only, no ledger -----------------------------------------------------


async def test_conflict_same_key_different_args(saver: Any) -> None:
    fx = Counter()
    node = IdempotentToolNode(make_tools(fx))
    graph = tool_graph(node, saver)
    await graph.ainvoke({"messages": [ai_calls(("charge", {"amount": 1}, "k"))]}, cfg("t"))
    with pytest.raises(IdempotencyConflict):
        await graph.ainvoke({"messages": [ai_calls(("charge", {"amount": 2}, "k"))]}, cfg("t"))
    [entry] = await saver.alist_entries("t")
    assert entry.conflicts == 1 and node.counters.conflicts == 1 and len(fx) == 1


async def test_args_policy_dedupes_within_and_across_steps(saver: Any) -> None:
    fx = Counter()
    node = IdempotentToolNode(make_tools(fx), key_policy={"charge": "args"})
    graph = tool_graph(node, saver)
    twin = ai_calls(("charge", {"amount": 7}, "x1"), ("charge", {"amount": 7}, "x2"))
    out = await graph.ainvoke({"messages": [twin]}, cfg("t"))
    assert [m.tool_call_id for m in tool_messages(out)] == ["x1", "x2"]
    assert {m.content for m in tool_messages(out)} == {"charged 7 EUR"}
    later = ai_calls(("charge", {"amount": 7}, "x3"))
    out = await graph.ainvoke({"messages": [later]}, cfg("t"))
    assert tool_messages(out)[-1].tool_call_id == "x3"
    assert fx.calls == [("charge", 7)]
    # model args are hashed as emitted: an explicit default is a different call
    explicit = ai_calls(("charge", {"currency": "EUR", "amount": 7}, "x4"))
    await graph.ainvoke({"messages": [explicit]}, cfg("t"))
    assert len(fx) == 2


async def test_custom_key_fn(saver: Any) -> None:
    fx = Counter()

    def vendor_key(tool_call: Any, ctx: Any) -> str:
        return str(tool_call["args"]["amount"])  # pretend: an idempotency key in the args

    graph = tool_graph(IdempotentToolNode(make_tools(fx), key_policy=vendor_key), saver)
    await graph.ainvoke({"messages": [ai_calls(("charge", {"amount": 4}, "v1"))]}, cfg("t"))
    await graph.ainvoke({"messages": [ai_calls(("charge", {"amount": 4}, "v2"))]}, cfg("t"))
    assert len(fx) == 1
    with pytest.raises(IdempotencyConflict):  # same vendor key, different args
        await graph.ainvoke(
            {"messages": [ai_calls(("charge", {"amount": 4, "currency": "USD"}, "v3"))]},
            cfg("t"),
        )


async def test_read_only_tools_skip_the_ledger(saver: Any) -> None:
    fx = Counter()

    @tool
    def weather(city: str) -> str:
        """Read the weather."""
        fx.bump(city)
        return "sunny"

    weather.metadata = {"idempotent_read_only": True}

    node = IdempotentToolNode([*make_tools(fx), weather], read_only={"lookup"})
    assert node.read_only_tools == {"lookup", "weather"}
    graph = tool_graph(node, saver)
    msg = ai_calls(("lookup", {"q": "a"}, "r1"), ("weather", {"city": "x"}, "r2"))
    await graph.ainvoke({"messages": [msg]}, cfg("t"))
    await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert len(fx) == 4 and await saver.alist_entries("t") == []
    # read-only calls need no ledger at all
    plain_cp = tool_graph(IdempotentToolNode(make_tools(fx), read_only=["lookup"]), InMemorySaver())
    await plain_cp.ainvoke({"messages": [ai_calls(("lookup", {"q": "b"}, "r3"))]}, cfg("t"))


async def test_without_ledger_refuses_to_run() -> None:
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), InMemorySaver())
    with pytest.raises(NoLedgerError, match="ToolCallLedger"):
        await graph.ainvoke({"messages": [ai_calls(("charge", {"amount": 1}, "n"))]}, cfg("t"))
    assert len(fx) == 0


async def test_explicit_ledger_kwarg(saver: Any) -> None:
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(make_tools(fx), ledger=saver), InMemorySaver())
    msg = ai_calls(("charge", {"amount": 1}, "l1"))
    await graph.ainvoke({"messages": [msg]}, cfg("t"))
    await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert len(fx) == 1 and len(await saver.alist_entries("t")) == 1


async def test_non_json_args_fail_before_running(saver: Any) -> None:
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), saver)
    bad = ai_calls(("charge", {"amount": 1}, "ok"), ("charge", {"amount": math.inf}, "bad"))
    with pytest.raises(SerializationError):
        await graph.ainvoke({"messages": [bad]}, cfg("t"))
    assert len(fx) == 0 and await saver.alist_entries("t") == []


# --- unknown outcomes -------------------------------------------------------------------------


CALL = {"name": "charge", "args": {"amount": 9}, "id": "u1", "type": "tool_call"}


@pytest.mark.parametrize("verify_async", [False, True])
async def test_verify_hook_landed(saver: Any, verify_async: bool) -> None:
    fx = Counter()
    await plant_unknown(saver, intent_for("t", CALL))

    def landed(args: dict[str, Any]) -> str:
        return f"charge {args['amount']} found at vendor"

    async def alanded(args: dict[str, Any]) -> str:
        return landed(args)

    node = IdempotentToolNode(
        make_tools(fx), verify={"charge": alanded if verify_async else landed}
    )
    out = await tool_graph(node, saver).ainvoke(
        {"messages": [ai_calls(("charge", CALL["args"], "u1"))]}, cfg("t")
    )
    assert tool_messages(out)[-1].content == "charge 9 found at vendor"
    assert len(fx) == 0
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED


async def test_verify_hook_not_applied_reruns(saver: Any) -> None:
    fx = Counter()
    await plant_unknown(saver, intent_for("t", CALL))
    node = IdempotentToolNode(make_tools(fx), verify={"charge": lambda args: NOT_APPLIED})
    out = await tool_graph(node, saver).ainvoke(
        {"messages": [ai_calls(("charge", CALL["args"], "u1"))]}, cfg("t")
    )
    assert tool_messages(out)[-1].content == "charged 9 EUR" and len(fx) == 1
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED and entry.attempts == 2


async def test_rerun_fail_and_raise_policies(saver: Any) -> None:
    fx = Counter()
    msg = {"messages": [ai_calls(("charge", CALL["args"], "u1"))]}
    for thread in ("rerun", "fail", "raise"):
        await plant_unknown(saver, intent_for(thread, CALL))
    rerun = tool_graph(IdempotentToolNode(make_tools(fx), on_unknown="rerun"), saver)
    assert tool_messages(await rerun.ainvoke(msg, cfg("rerun")))[-1].content == "charged 9 EUR"
    assert len(fx) == 1

    fail = tool_graph(IdempotentToolNode(make_tools(fx), on_unknown={"charge": "fail"}), saver)
    [err] = tool_messages(await fail.ainvoke(msg, cfg("fail")))
    assert err.status == "error" and "unknown" in str(err.content) and len(fx) == 1
    [entry] = await saver.alist_entries("fail")
    assert entry.status is CallStatus.ISSUED  # left for an operator

    raising = tool_graph(IdempotentToolNode(make_tools(fx), on_unknown="raise"), saver)
    with pytest.raises(UnknownToolOutcome):
        await raising.ainvoke(msg, cfg("raise"))
    assert len(fx) == 1


@pytest.mark.parametrize(
    ("answer", "content", "status", "runs", "ledger_status"),
    [
        (
            {"action": "completed", "result": "charged by hand"},
            "charged by hand",
            "success",
            0,
            CallStatus.COMPLETED,
        ),
        ({"action": "rerun"}, "charged 9 EUR", "success", 1, CallStatus.COMPLETED),
        (
            {"action": "failed", "error": "card declined"},
            "Error: card declined",
            "error",
            0,
            CallStatus.FAILED,
        ),
    ],
)
async def test_interrupt_policy_resume_actions(
    saver: Any,
    answer: dict[str, Any],
    content: str,
    status: str,
    runs: int,
    ledger_status: CallStatus,
) -> None:
    fx = Counter()
    entry = await plant_unknown(saver, intent_for("t", CALL))
    node = IdempotentToolNode(make_tools(fx))
    graph = tool_graph(node, saver)
    out = await graph.ainvoke({"messages": [ai_calls(("charge", CALL["args"], "u1"))]}, cfg("t"))
    [intr] = out["__interrupt__"]
    assert intr.value["kind"] == "unknown_tool_outcome"
    assert intr.value["key"] == entry.key and intr.value["tool"] == "charge"
    assert intr.value["args"] == {"amount": 9} and intr.value["attempts"] == 1
    out = await graph.ainvoke(Command(resume=answer), cfg("t"))
    [msg] = tool_messages(out)
    assert (msg.content, msg.status, msg.tool_call_id) == (content, status, "u1")
    assert len(fx) == runs
    [row] = await saver.alist_entries("t")
    assert row.status is ledger_status
    # a later replay of the step returns the same settled result
    again = await graph.ainvoke({"messages": [ai_calls(("charge", CALL["args"], "u1"))]}, cfg("t"))
    assert tool_messages(again)[-1].content == content and len(fx) == runs


async def test_invalid_resume_value_can_be_answered_again(saver: Any) -> None:
    fx = Counter()
    await plant_unknown(saver, intent_for("t", CALL))
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), saver)
    await graph.ainvoke({"messages": [ai_calls(("charge", CALL["args"], "u1"))]}, cfg("t"))
    with pytest.raises(Exception):  # noqa: B017 - pydantic ValidationError via LangGraph
        await graph.ainvoke(Command(resume={"action": "maybe"}), cfg("t"))
    out = await graph.ainvoke(Command(resume={"action": "rerun"}), cfg("t"))
    assert tool_messages(out)[-1].content == "charged 9 EUR" and len(fx) == 1


async def test_interrupt_inside_tool_reenters_and_runs_once(saver: Any) -> None:
    fx = Counter()

    @tool
    def transfer(amount: int) -> str:
        """Needs approval."""
        approved = interrupt({"approve": amount})
        if not approved:
            return "rejected"
        fx.bump(amount)
        return f"sent {amount}"

    graph = tool_graph(IdempotentToolNode([transfer]), saver)
    out = await graph.ainvoke({"messages": [ai_calls(("transfer", {"amount": 3}, "t1"))]}, cfg("t"))
    assert out["__interrupt__"][0].value == {"approve": 3}
    assert await saver.alist_entries("t") == []  # claim released: not an unknown outcome
    out = await graph.ainvoke(Command(resume=True), cfg("t"))
    assert tool_messages(out)[-1].content == "sent 3" and len(fx) == 1
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED


async def test_waits_for_call_in_progress_elsewhere(saver: Any) -> None:
    fx = Counter()
    intent = intent_for("t", CALL)
    await plant_in_progress(saver, intent)
    node = IdempotentToolNode(make_tools(fx), wait_seconds=0.2, poll_seconds=0.02)
    graph = tool_graph(node, saver)
    msg = {"messages": [ai_calls(("charge", CALL["args"], "u1"))]}
    with pytest.raises(ToolCallInProgress):
        await graph.ainvoke(msg, cfg("t"))

    async def other_owner_finishes() -> None:
        await asyncio.sleep(0.1)
        data = saver.serde.dumps_typed(
            ToolMessage("charged elsewhere", tool_call_id="u1", name="charge")
        )
        await saver.record_outcome(
            intent.scope,
            intent.key,
            owner="otherhost:2:live",
            outcome=Outcome.completed(data[0], data[1]),
        )

    patient = tool_graph(
        IdempotentToolNode(make_tools(fx), wait_seconds=5, poll_seconds=0.02), saver
    )
    out, _ = await asyncio.gather(patient.ainvoke(msg, cfg("t")), other_owner_finishes())
    assert tool_messages(out)[-1].content == "charged elsewhere" and len(fx) == 0


# --- orphans and scopes ----------------------------------------------------------------------


async def test_orphan_adoption_replays_lost_call(saver: Any) -> None:
    fx = Counter()
    old = {"name": "charge", "args": {"amount": 2}, "id": "old", "type": "tool_call"}
    recorded = ToolMessage("charged 2 EUR", tool_call_id="old", name="charge")
    orphan = await plant_completed(saver, intent_for("t", old), recorded)
    node = IdempotentToolNode(make_tools(fx))
    graph = tool_graph(node, saver)
    msg = ai_calls(("charge", {"amount": 2}, "new"))  # the model re-emitted it under a new id
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    [got] = tool_messages(out)
    assert (got.content, got.tool_call_id, got.name) == ("charged 2 EUR", "new", "charge")
    assert len(fx) == 0 and node.counters.adopted == 1
    [entry] = await saver.alist_entries("t")
    assert entry.key == orphan.key and entry.adopted_by == "new"
    # the step runs again (its checkpoint lost too): still a replay, via adopted_by
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert len(fx) == 0 and tool_messages(out)[-1].tool_call_id == "new"
    # a call whose AIMessage IS in the state is not an orphan: same args, new call, runs
    msg3 = ai_calls(("charge", {"amount": 2}, "third"))
    await graph.ainvoke({"messages": [msg3]}, cfg("t"))
    assert len(fx) == 1


async def test_namespace_scope_isolation(saver: Any) -> None:
    fx = Counter()
    per_thread = tool_graph(IdempotentToolNode(make_tools(fx), key_policy="args"), saver)
    msg = {"messages": [ai_calls(("charge", {"amount": 1}, "s1"))]}
    await per_thread.ainvoke(msg, cfg("A"))
    await per_thread.ainvoke(msg, cfg("B"))
    assert len(fx) == 2  # thread B does not replay thread A
    shared = tool_graph(
        IdempotentToolNode(make_tools(fx), key_policy="args", namespace="shop"), saver
    )
    await shared.ainvoke(msg, cfg("A"))
    await shared.ainvoke(msg, cfg("B"))
    assert len(fx) == 3  # one call across threads in namespace "shop"
    assert {e.scope for e in await saver.alist_entries("A")} == {"A", "ns:shop"}


# --- create_react_agent and sync invoke ---------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v2"])
async def test_create_react_agent_end_to_end(saver: Any, version: str) -> None:
    fx = Counter()
    node = IdempotentToolNode(make_tools(fx))
    model = scripted_model(
        ai_calls(("charge", {"amount": 5}, "r1"), ("receipt", {"order": "o"}, "r2")),
        AIMessage("all done"),
    )
    agent = create_react_agent(model, node, checkpointer=saver, version=version)
    out = await agent.ainvoke({"messages": [HumanMessage("buy")]}, cfg("t"))
    assert out["messages"][-1].content == "all done"
    assert by_id(tool_messages(out))["r2"].artifact == {"order": "o", "pages": 2}
    assert len(fx) == 2
    entries = await saver.alist_entries("t")
    assert sorted(e.tool_call_id for e in entries) == ["r1", "r2"]
    assert all(e.status is CallStatus.COMPLETED for e in entries)

    # Time travel to the checkpoint just before the tools ran: they replay, not re-run.
    history = [s async for s in agent.aget_state_history(cfg("t"))]
    before_tools = next(s for s in history if s.next and "tools" in s.next)
    fork_model = scripted_model(AIMessage("done again"))
    node2 = IdempotentToolNode(make_tools(fx))
    agent2 = create_react_agent(fork_model, node2, checkpointer=saver, version=version)
    first = tool_messages(out)
    out = await agent2.ainvoke(None, before_tools.config)
    assert out["messages"][-1].content == "done again"
    assert len(fx) == 2 and node2.counters.replayed == 2 and node2.counters.executed == 0
    assert sorted(map(fields, tool_messages(out))) == sorted(map(fields, first))


async def test_sync_invoke_uses_the_saver_loop(saver: Any) -> None:
    fx = Counter()
    node = IdempotentToolNode(make_tools(fx), handle_tool_errors=True)
    graph = tool_graph(node, saver)
    msg = {"messages": [ai_calls(("charge", {"amount": 1}, "s1"), ("explode", {"why": "z"}, "s2"))]}
    out = await asyncio.to_thread(graph.invoke, msg, cfg("t"))
    assert [m.status for m in tool_messages(out)] == ["success", "error"]
    out = await asyncio.to_thread(graph.invoke, msg, cfg("t"))
    assert len(fx) == 2 and node.counters.replayed == 2
    statuses = sorted(e.status.value for e in await saver.alist_entries("t"))
    assert statuses == ["completed", "failed"]


async def test_sync_invoke_on_the_loop_thread_is_refused(saver: Any) -> None:
    graph = tool_graph(IdempotentToolNode(make_tools(Counter())), saver)
    with pytest.raises(IdemSaverError):
        graph.invoke({"messages": [ai_calls(("charge", {"amount": 1}, "x"))]}, cfg("t"))


async def test_two_unknown_outcomes_are_asked_one_by_one(saver: Any) -> None:
    fx = Counter()
    c1 = {"name": "charge", "args": {"amount": 1}, "id": "m1", "type": "tool_call"}
    c2 = {"name": "charge", "args": {"amount": 2}, "id": "m2", "type": "tool_call"}
    e1 = await plant_unknown(saver, intent_for("t", c1))
    e2 = await plant_unknown(saver, intent_for("t", c2, message_id="ai-m1"))
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), saver)
    msg = ai_calls(("charge", c1["args"], "m1"), ("charge", c2["args"], "m2"))
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert out["__interrupt__"][0].value["key"] == e1.key
    out = await graph.ainvoke(Command(resume={"action": "rerun", "key": e1.key}), cfg("t"))
    assert out["__interrupt__"][0].value["key"] == e2.key
    assert len(fx) == 0  # nothing applied until every question is answered
    out = await graph.ainvoke(
        Command(resume={"action": "completed", "result": "done by hand", "key": e2.key}), cfg("t")
    )
    assert [m.content for m in tool_messages(out)] == ["charged 1 EUR", "done by hand"]
    assert fx.calls == [("charge", 1)]


async def test_interrupt_in_one_parallel_tool_keeps_the_others(saver: Any) -> None:
    fx = Counter()

    @tool
    def approve(what: str) -> str:
        """Human approval."""
        return f"approved={interrupt(what)}"

    node = IdempotentToolNode([*make_tools(fx), approve])
    graph = tool_graph(node, saver)
    msg = ai_calls(("charge", {"amount": 1}, "p1"), ("approve", {"what": "x"}, "p2"))
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert out["__interrupt__"][0].value == "x"
    [entry] = await saver.alist_entries("t")
    assert entry.tool_call_id == "p1" and entry.status is CallStatus.COMPLETED
    out = await graph.ainvoke(Command(resume="yes"), cfg("t"))
    assert [m.content for m in tool_messages(out)] == ["charged 1 EUR", "approved=yes"]
    assert len(fx) == 1 and node.counters.replayed == 1


async def test_sync_invoke_interrupt_policy_and_verify(saver: Any) -> None:
    fx = Counter()
    await plant_unknown(saver, intent_for("t", CALL))
    graph = tool_graph(IdempotentToolNode(make_tools(fx)), saver)
    msg = {"messages": [ai_calls(("charge", CALL["args"], "u1"))]}
    out = await asyncio.to_thread(graph.invoke, msg, cfg("t"))
    assert out["__interrupt__"][0].value["kind"] == "unknown_tool_outcome"
    out = await asyncio.to_thread(graph.invoke, Command(resume={"action": "rerun"}), cfg("t"))
    assert tool_messages(out)[-1].content == "charged 9 EUR" and len(fx) == 1

    await plant_unknown(saver, intent_for("v", CALL))

    async def averify(args: dict[str, Any]) -> Any:
        return NOT_APPLIED

    verified = tool_graph(IdempotentToolNode(make_tools(fx), verify={"charge": averify}), saver)
    out = await asyncio.to_thread(verified.invoke, msg, cfg("v"))
    assert tool_messages(out)[-1].content == "charged 9 EUR" and len(fx) == 2
