"""Holes in "never twice" (issue 15), each a test on both backends.

* a tool that raises after its side effect (a timeout, a reset connection) is an unknown
  outcome: the retry asks ``verify`` / the policy / a human, never re-runs silently -
  also inside one ``ainvoke`` under a node ``RetryPolicy``;
* a tool (or the user) can declare that an exception means "nothing happened";
* owner identity is thread-safe under a sync ``invoke`` with parallel tool threads;
* models that reuse tool-call ids (``call_0`` every turn) still make distinct calls;
* a ``verify`` hook that returns ``None`` is a configuration error, not "it happened";
* adoption survives consecutive lost messages;
* interrupt answers apply only to the call and attempt they were given for;
* counters count calls; the multi-interrupt resume form of the README works;
* a resumer that loses a reclaim race waits for the winner instead of failing;
* operators can break a claim of a process on another host, reopen a failed call, and
  every decision keeps the attempt count and lands in the entry's audit trail.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, RetryPolicy, Send
from tool_node_helpers import (
    Counter,
    ai_calls,
    cfg,
    intent_for,
    plant_unknown,
    scripted_model,
    tool_graph,
    tool_messages,
)

from langgraph_idem_saver import CallStatus, ConfigError, LedgerStateError
from langgraph_idem_saver.engine.core import REPLAY_EVENT
from langgraph_idem_saver.inspection import aresolve_unknown, aretry_failed, astale_claims
from langgraph_idem_saver.owners import minted_here
from langgraph_idem_saver.tool_node import NOT_APPLIED, IdempotentToolNode, NotAppliedError

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

CHARGE = {"name": "charge", "args": {"invoice": "inv-1"}, "id": "c1", "type": "tool_call"}


class CardDeclined(Exception):
    """A vendor error that is known to happen before any money moves."""


def vendor_tools(effects: Counter, *, fail_after: type[BaseException] | None = None) -> Any:
    """``charge`` moves money, then (optionally) raises as if the reply was lost."""
    failures = {"left": 1}

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.bump(invoice)
        if fail_after is not None and failures["left"] > 0:
            failures["left"] -= 1
            raise fail_after("the vendor's reply was lost")
        return f"charged {invoice}"

    return charge


def found_at_vendor(effects: Counter, asked: list[Any]) -> Any:
    def verify(args: dict[str, Any]) -> str:
        asked.append(args)
        if args["invoice"] in effects.calls:
            return f"charged {args['invoice']} (found at vendor)"
        return NOT_APPLIED

    return verify


# --- 1. an exception after the effect is an unknown outcome ----------------------------


async def test_timeout_after_effect_then_retry_asks_verify(saver: Any) -> None:
    fx, asked = Counter(), []
    node = IdempotentToolNode(
        [vendor_tools(fx, fail_after=TimeoutError)], verify={"charge": found_at_vendor(fx, asked)}
    )
    graph = tool_graph(node, saver)
    msg = ai_calls(("charge", {"invoice": "inv-1"}, "c1"))
    with pytest.raises(TimeoutError):
        await graph.ainvoke({"messages": [msg]}, cfg("t"))
    out = await graph.ainvoke(None, cfg("t"))  # the user's ordinary retry
    assert fx.calls == ["inv-1"]  # charged once
    assert asked == [{"invoice": "inv-1"}]  # verify was consulted
    assert tool_messages(out)[-1].content == "charged inv-1 (found at vendor)"
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED and entry.attempts == 1
    assert node.counters.abandoned == 1 and node.counters.unknown == 1


async def test_retry_policy_does_not_charge_twice_within_one_invoke(saver: Any) -> None:
    fx, asked = Counter(), []
    node = IdempotentToolNode(
        [vendor_tools(fx, fail_after=ConnectionResetError)],
        verify={"charge": found_at_vendor(fx, asked)},
    )
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=saver)
    msg = ai_calls(("charge", {"invoice": "inv-1"}, "c1"))
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert fx.calls == ["inv-1"]
    assert len(asked) == 1
    assert tool_messages(out)[-1].content == "charged inv-1 (found at vendor)"


async def test_retry_policy_without_verify_asks_a_human(saver: Any) -> None:
    fx = Counter()
    node = IdempotentToolNode([vendor_tools(fx, fail_after=ConnectionResetError)])
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=saver)
    out = await graph.ainvoke(
        {"messages": [ai_calls(("charge", {"invoice": "inv-1"}, "c1"))]}, cfg("t")
    )
    [question] = out["__interrupt__"]
    assert question.value["error"] == "ConnectionResetError: the vendor's reply was lost"
    assert question.value["attempt"] == 1
    assert fx.calls == ["inv-1"]
    answer = {"action": "rerun", "key": question.value["key"], "attempt": 1}
    out = await graph.ainvoke(Command(resume=answer), cfg("t"))
    assert fx.calls == ["inv-1", "inv-1"]  # the human said it did not land: run again
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED and entry.attempts == 2


@pytest.mark.parametrize("how", ["marker", "declared"])
async def test_declared_no_effect_errors_release_the_claim(saver: Any, how: str) -> None:
    fx = Counter()
    error = NotAppliedError if how == "marker" else CardDeclined
    extra: dict[str, Any] = {} if how == "marker" else {"not_applied_errors": (CardDeclined,)}
    node = IdempotentToolNode([vendor_tools(fx, fail_after=error)], **extra)
    graph = tool_graph(node, saver)
    with pytest.raises(error):
        await graph.ainvoke(
            {"messages": [ai_calls(("charge", {"invoice": "inv-1"}, "c1"))]}, cfg("t")
        )
    assert await saver.alist_entries("t") == []  # released: nothing happened
    out = await graph.ainvoke(None, cfg("t"))
    assert tool_messages(out)[-1].content == "charged inv-1"
    assert node.counters.released == 1 and node.counters.abandoned == 0


def test_not_applied_errors_must_be_exception_types() -> None:
    with pytest.raises(ConfigError, match="exception types"):
        IdempotentToolNode([vendor_tools(Counter())], not_applied_errors=("nope",))  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="does not have"):
        IdempotentToolNode([vendor_tools(Counter())], not_applied_errors={"x": (KeyError,)})


# --- 2. owner identity under threads ----------------------------------------------------


def test_owner_is_set_atomically_for_concurrent_readers() -> None:
    for _ in range(50):
        node = IdempotentToolNode([vendor_tools(Counter())])
        barrier = threading.Barrier(8)
        seen: list[str] = []

        def read(
            node: IdempotentToolNode = node,
            barrier: threading.Barrier = barrier,
            seen: list[str] = seen,
        ) -> None:
            barrier.wait()
            seen.append(node.owner)

        threads = [threading.Thread(target=read) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert len(set(seen)) == 1 and minted_here(seen[0])


async def test_sync_invoke_with_parallel_calls_per_request_nodes(saver: Any) -> None:
    """The reported race: a node built per request, sync invoke, tool calls in threads."""
    fx = Counter()

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        fx.bump(invoice)
        return f"charged {invoice}"

    def run(i: int) -> dict[str, Any]:
        graph = tool_graph(IdempotentToolNode([charge]), saver)
        calls = [("charge", {"invoice": f"{i}-{j}"}, f"c{i}-{j}") for j in range(4)]
        return graph.invoke({"messages": [ai_calls(*calls)]}, cfg(f"t{i}"))

    for i in range(10):
        out = await asyncio.to_thread(run, i)
        assert len(tool_messages(out)) == 4
    assert len(fx) == 40
    for i in range(10):
        entries = await saver.alist_entries(f"t{i}")
        assert {e.status for e in entries} == {CallStatus.COMPLETED}
        assert all(minted_here(e.owner) for e in entries)


# --- 4. models that reuse tool-call ids -------------------------------------------------


async def test_reused_call_id_in_a_new_turn_is_a_new_call(saver: Any) -> None:
    fx = Counter()
    graph = tool_graph(IdempotentToolNode([vendor_tools(fx)]), saver)
    turn1 = ai_calls(("charge", {"invoice": "inv-1"}, "call_0"), msg_id="turn-1")
    turn2 = ai_calls(("charge", {"invoice": "inv-1"}, "call_0"), msg_id="turn-2")
    turn3 = ai_calls(("charge", {"invoice": "inv-2"}, "call_0"), msg_id="turn-3")
    for msg in (turn1, turn2, turn3):
        await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert fx.calls == ["inv-1", "inv-1", "inv-2"]  # asked three times: ran three times
    assert len(await saver.alist_entries("t")) == 3


async def test_reused_call_id_in_a_send_fan_out(saver: Any) -> None:
    fx = Counter()

    def fan_out(state: MessagesState) -> list[Send]:
        return [
            Send(
                "tools",
                {
                    "messages": [
                        ai_calls(("charge", {"invoice": f"w{i}"}, "call_0"), msg_id=f"worker-{i}")
                    ]
                },
            )
            for i in range(3)
        ]

    builder = StateGraph(MessagesState)
    builder.add_node("tools", IdempotentToolNode([vendor_tools(fx)]))
    builder.add_conditional_edges(START, fan_out, ["tools"])
    graph = builder.compile(checkpointer=saver)
    await graph.ainvoke({"messages": []}, cfg("t"))
    assert sorted(fx.calls) == ["w0", "w1", "w2"]


# --- 6. verify returning None -----------------------------------------------------------


async def test_verify_returning_none_is_a_config_error(saver: Any) -> None:
    fx = Counter()
    await plant_unknown(saver, intent_for("t", CHARGE))
    node = IdempotentToolNode([vendor_tools(fx)], verify={"charge": lambda args: None})
    with pytest.raises(ConfigError, match=r"'charge'.*returned None"):
        await tool_graph(node, saver).ainvoke(
            {"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}, cfg("t")
        )
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.ISSUED and len(fx) == 0  # nothing recorded or run


# --- 10. consecutive lost messages ------------------------------------------------------


@pytest.mark.parametrize("first_run", ["charged", "died_before_charging"])
async def test_adoption_survives_two_lost_messages(saver: Any, first_run: str) -> None:
    """Run 1 claimed (and maybe charged) under ``lost-1``; run 2 adopted it under
    ``lost-2``; both messages were lost. Run 3 (``c3``) must adopt it again."""
    fx, asked = Counter(), []
    lost1 = {**CHARGE, "id": "lost-1"}
    entry = await plant_unknown(saver, intent_for("t", lost1, message_id="gone-1"))
    if first_run == "charged":
        fx.bump("inv-1")
    assert await saver.aadopt("t", entry.key, tool_call_id="lost-2") is not None
    node = IdempotentToolNode([vendor_tools(fx)], verify={"charge": found_at_vendor(fx, asked)})
    out = await tool_graph(node, saver).ainvoke(
        {"messages": [ai_calls(("charge", CHARGE["args"], "c3"))]}, cfg("t")
    )
    assert fx.calls == ["inv-1"]  # once, whichever way run 1 ended
    assert len(asked) == 1 and node.counters.adopted == 1
    [settled] = await saver.alist_entries("t")
    assert settled.adopted_by == "c3" and settled.status is CallStatus.COMPLETED
    assert tool_messages(out)[-1].tool_call_id == "c3"


async def test_adoption_guard_refuses_a_stale_previous(saver: Any) -> None:
    entry = await plant_unknown(saver, intent_for("t", CHARGE))
    assert await saver.aadopt("t", entry.key, tool_call_id="a") is not None
    assert await saver.aadopt("t", entry.key, tool_call_id="b") is None  # saw None: stale
    again = await saver.aadopt("t", entry.key, tool_call_id="b", previous="a")
    assert again is not None and again.adopted_by == "b"


# --- 12. answers apply to their call and attempt only -----------------------------------


async def test_stale_answer_from_an_earlier_attempt_is_asked_again(saver: Any) -> None:
    fx = Counter()
    planted = await plant_unknown(saver, intent_for("t", CHARGE))
    # attempt 1 was answered "rerun" and died again: the same call, now attempt 2
    again = await saver.areclaim(planted, owner="deadhost:1:dead2", lease_seconds=0.001)
    assert again is not None and again.attempts == 2
    await asyncio.sleep(0.01)
    graph = tool_graph(IdempotentToolNode([vendor_tools(fx)]), saver)
    out = await graph.ainvoke({"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}, cfg("t"))
    assert out["__interrupt__"][0].value["attempt"] == 2
    stale = {"action": "rerun", "key": planted.key, "attempt": 1}
    out = await graph.ainvoke(Command(resume=stale), cfg("t"))
    [question] = out["__interrupt__"]
    assert "attempt 1" in question.value["previous_answer_ignored"]
    keyless = {"action": "rerun"}  # cannot tell which attempt it is about
    out = await graph.ainvoke(Command(resume=keyless), cfg("t"))
    assert "must name" in out["__interrupt__"][0].value["previous_answer_ignored"]
    assert len(fx) == 0
    answer = {"action": "completed", "result": "found by hand", "key": planted.key, "attempt": 2}
    out = await graph.ainvoke(Command(resume=answer), cfg("t"))
    assert tool_messages(out)[-1].content == "found by hand" and len(fx) == 0


async def test_answer_for_another_key_is_not_applied(saver: Any) -> None:
    fx = Counter()
    c2 = {**CHARGE, "args": {"invoice": "inv-2"}, "id": "c2"}
    e1 = await plant_unknown(saver, intent_for("t", CHARGE))
    e2 = await plant_unknown(saver, intent_for("t", c2, message_id="ai-c1"))
    graph = tool_graph(IdempotentToolNode([vendor_tools(fx)]), saver)
    msg = ai_calls(("charge", {"invoice": "inv-1"}, "c1"), ("charge", {"invoice": "inv-2"}, "c2"))
    out = await graph.ainvoke({"messages": [msg]}, cfg("t"))
    assert out["__interrupt__"][0].value["key"] == e1.key
    wrong = {"action": "rerun", "key": e2.key, "attempt": 1}
    out = await graph.ainvoke(Command(resume=wrong), cfg("t"))
    assert out["__interrupt__"][0].value["key"] == e1.key  # asked again, nothing applied
    assert len(fx) == 0


# --- 9. counters count calls; the README's multi-interrupt resume form ------------------


async def test_three_parallel_unknown_outcomes_v2_resume_by_interrupt_id(saver: Any) -> None:
    fx = Counter()
    calls = [{**CHARGE, "args": {"invoice": f"inv-{i}"}, "id": f"p{i}"} for i in range(3)]
    msg = AIMessage("", id="ai-p", tool_calls=calls)
    for call in calls:
        await plant_unknown(
            saver, intent_for("t", call, checkpoint_ns="tools:x", message_id="ai-p")
        )
    node = IdempotentToolNode([vendor_tools(fx)])
    model = scripted_model(msg, AIMessage("all settled"))
    agent = create_react_agent(model, node, checkpointer=saver, version="v2")
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    interrupts = out["__interrupt__"]
    assert len(interrupts) == 3
    answers = {
        i.id: {
            "action": "completed",
            "result": f"done {i.value['args']['invoice']}",
            "key": i.value["key"],
            "attempt": i.value["attempt"],
        }
        for i in interrupts
    }
    out = await agent.ainvoke(Command(resume=answers), cfg("t"))
    assert sorted(m.content for m in tool_messages(out)) == [
        "done inv-0",
        "done inv-1",
        "done inv-2",
    ]
    assert len(fx) == 0
    assert node.counters.unknown == 3  # calls, not interrupt re-entries


# --- 13. a resumer that loses the reclaim race waits -------------------------------------


async def test_reclaim_race_loser_waits_for_the_winner(saver: Any) -> None:
    fx = Counter()

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice (slowly)."""
        fx.bump(invoice)
        await asyncio.sleep(0.3)
        return f"charged {invoice}"

    await plant_unknown(saver, intent_for("t", CHARGE))
    msg = {"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}
    graphs = [
        tool_graph(IdempotentToolNode([charge], on_unknown="rerun", poll_seconds=0.02), saver)
        for _ in range(2)
    ]
    outs = await asyncio.gather(*(g.ainvoke(msg, cfg("t")) for g in graphs))
    assert fx.calls == ["inv-1"]
    assert [tool_messages(o)[-1].content for o in outs] == ["charged inv-1"] * 2


# --- 7. a dead claim on another host; 8. failed entries and the audit trail --------------


async def test_operator_forces_a_claim_held_by_another_host(saver: Any) -> None:
    fx = Counter()
    [claimed] = await saver.aclaim(
        [intent_for("t", CHARGE)], owner="gone-pod:7:abc", lease_seconds=300
    )
    entry = claimed.entry
    assert not entry.is_unknown()  # another host: alive as far as we can tell
    assert [e.key for e in await astale_claims(saver, older_than=0)] == [entry.key]
    with pytest.raises(LedgerStateError, match="force"):
        await aresolve_unknown(saver, entry, "rerun")
    approved = await aresolve_unknown(saver, entry, "rerun", force=True, by="ops", note="pod gone")
    [event] = approved.events()
    assert event["by"] == "ops" and event["forced"] and event["owner_before"] == "gone-pod:7:abc"
    assert event["action"] == "rerun" and event["note"] == "pod gone"
    assert await astale_claims(saver, older_than=0) == []
    graph = tool_graph(IdempotentToolNode([vendor_tools(fx)]), saver)
    out = await graph.ainvoke({"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}, cfg("t"))
    assert tool_messages(out)[-1].content == "charged inv-1" and fx.calls == ["inv-1"]
    [done] = await saver.alist_entries("t")
    assert done.status is CallStatus.COMPLETED and done.attempts == 2  # attempts kept
    assert len(done.events()) == 1  # the trail survives the re-run


async def test_failed_entry_under_args_policy_can_be_retried(saver: Any) -> None:
    fx = Counter()

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice; the first try hits a transient vendor error."""
        fx.bump(invoice)
        if len(fx) == 1:
            raise ValueError("vendor busy")
        return f"charged {invoice}"

    node = IdempotentToolNode([charge], key_policy="args", handle_tool_errors=True)
    graph = tool_graph(node, saver)
    first = await graph.ainvoke(
        {"messages": [ai_calls(("charge", CHARGE["args"], "a1"))]}, cfg("t")
    )
    assert tool_messages(first)[-1].status == "error"
    again = await graph.ainvoke(
        {"messages": [ai_calls(("charge", CHARGE["args"], "a2"))]}, cfg("t")
    )
    assert tool_messages(again)[-1].status == "error" and len(fx) == 1  # answered from the ledger
    [failed] = await saver.alist_entries("t")
    with pytest.raises(LedgerStateError, match="not an unknown outcome"):
        await aresolve_unknown(saver, failed, "rerun")
    reopened = await aretry_failed(saver, failed, by="ops")
    assert reopened.events()[0]["action"] == "retry"
    retried = await graph.ainvoke(
        {"messages": [ai_calls(("charge", CHARGE["args"], "a3"))]}, cfg("t")
    )
    assert tool_messages(retried)[-1].content == "charged inv-1" and len(fx) == 2
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.COMPLETED and entry.attempts == 2
    with pytest.raises(LedgerStateError, match="not failed"):
        await aretry_failed(saver, entry)


async def test_resolve_keeps_attempts_and_records_who(saver: Any) -> None:
    entry = await plant_unknown(saver, intent_for("t", CHARGE))
    settled = await aresolve_unknown(saver, entry, "completed", result="charged by hand", by="ann")
    assert settled.status is CallStatus.COMPLETED and settled.attempts == entry.attempts
    [event] = settled.events()
    assert event["by"] == "ann" and event["action"] == "completed" and event["attempt"] == 1
    assert event["status_before"] == "issued" and "forced" not in event


async def test_rerun_approved_entry_is_no_longer_pending(saver: Any) -> None:
    entry = await plant_unknown(saver, intent_for("t", CHARGE))
    assert [e.key for e in await saver.alist_unknown()] == [entry.key]
    await aresolve_unknown(saver, entry, "rerun")
    assert await saver.alist_unknown() == []  # settled: the next resume runs it


async def test_entry_keyed_by_the_id_alone_is_still_found(saver: Any) -> None:
    """A claim left by a release whose default key was the tool call id alone (before
    message ids were hashed in) is the same call: asked about, never run afresh."""
    fx, asked = Counter(), []
    await plant_unknown(saver, intent_for("t", CHARGE, message_id=""))
    node = IdempotentToolNode([vendor_tools(fx)], verify={"charge": found_at_vendor(fx, asked)})
    out = await tool_graph(node, saver).ainvoke(
        {"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}, cfg("t")
    )
    assert len(asked) == 1 and fx.calls == ["inv-1"]  # verified (not found), then run once
    assert tool_messages(out)[-1].content == "charged inv-1"
    assert len(await saver.alist_entries("t")) == 1


# --- replays are visible to tracing and streaming users -----------------------------------


async def test_a_replayed_call_emits_a_custom_event(saver: Any) -> None:
    fx = Counter()
    graph = tool_graph(IdempotentToolNode([vendor_tools(fx)]), saver)
    msg = {"messages": [ai_calls(("charge", CHARGE["args"], "c1"))]}
    await graph.ainvoke(msg, cfg("t"))
    events = [
        e
        async for e in graph.astream_events(msg, cfg("t2"), version="v2")
        if e["event"] in ("on_custom_event", "on_tool_start")
    ]
    assert [e["event"] for e in events] == ["on_tool_start"]  # first run: the tool ran
    await saver.acopy_thread("t", "t3")  # a fork has the call: replayed there
    target = [s async for s in graph.aget_state_history(cfg("t3"))][-1].config
    replays = [
        e
        async for e in graph.astream_events(msg, target, version="v2")
        if e["event"] == "on_custom_event" and e["name"] == REPLAY_EVENT
    ]
    assert [r["data"]["tool_call_id"] for r in replays] == ["c1"] and len(fx) == 2
    assert replays[0]["data"]["recorded"] == "completed"


async def test_losing_an_adoption_race_to_another_resumer_never_runs_the_call(
    saver: Any,
) -> None:
    """Another process adopts the orphan between our read and our adoption (found by the
    torture test): we follow its entry - verify, replay - and never claim the call anew."""
    fx, asked = Counter(), []
    lost = {**CHARGE, "id": "lost-1"}
    entry = await plant_unknown(saver, intent_for("t", lost, message_id="gone-1"))
    fx.bump("inv-1")  # the dead process did charge
    original = saver.aclaim_step

    async def raced(*args: Any, **kwargs: Any) -> Any:
        step = await original(*args, **kwargs)  # the adoption read (it finds the orphan)
        await saver.aadopt("t", entry.key, tool_call_id="other-resumer-call")
        return step

    saver.aclaim_step = raced
    try:
        node = IdempotentToolNode([vendor_tools(fx)], verify={"charge": found_at_vendor(fx, asked)})
        out = await tool_graph(node, saver).ainvoke(
            {"messages": [ai_calls(("charge", CHARGE["args"], "c2"))]}, cfg("t")
        )
    finally:
        del saver.aclaim_step
    assert fx.calls == ["inv-1"] and len(asked) == 1
    assert tool_messages(out)[-1].content == "charged inv-1 (found at vendor)"
    assert len(await saver.alist_entries("t")) == 1
