"""``IdempotencyMiddleware`` with ``HumanInTheLoopMiddleware``, in process, both backends.

Every decision type (approve / edit / reject / respond), batched and per call, in both
orders: each effect once, with the arguments that ran; the ledger records, verifies and
asks about those arguments (the key stays the model's call) and the entry's history shows
the edit. ``per_call`` review listed after ours is refused at the first call, before any
tool runs. The crash sequences (a real SIGKILL) are in ``test_middleware_kills.py``.
"""

from __future__ import annotations

from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command
from tool_node_helpers import Counter, cfg, scripted_model

from langgraph_idem_saver import CallStatus
from langgraph_idem_saver.engine import MiddlewareOrderError
from langgraph_idem_saver.middleware import IdempotencyMiddleware

ORDERS = ["hitl_first", "ledger_first"]


def charge_tool(effects: Counter) -> Any:
    @tool
    def charge(invoice: str, amount: int) -> str:
        """Charge an invoice."""
        effects.bump((invoice, amount))
        return f"charged {invoice} {amount}"

    return charge


def ask(*calls: tuple[str, int], msg_id: str = "ai-charges", first: int = 1) -> AIMessage:
    return AIMessage(
        "",
        id=msg_id,
        tool_calls=[
            {
                "name": "charge",
                "args": {"invoice": inv, "amount": amount},
                "id": f"call_{first + i}",
                "type": "tool_call",
            }
            for i, (inv, amount) in enumerate(calls)
        ],
    )


def agent_of(
    effects: Counter, saver: Any, order: str, mode: str, *messages: AIMessage, **ledger: Any
) -> Any:
    hitl = HumanInTheLoopMiddleware(interrupt_on={"charge": True}, interrupt_mode=mode)  # type: ignore[arg-type]
    ours = IdempotencyMiddleware(**ledger)
    middleware = [hitl, ours] if order == "hitl_first" else [ours, hitl]
    return create_agent(
        scripted_model(*messages),
        tools=[charge_tool(effects)],
        middleware=middleware,
        checkpointer=saver,
    )


async def charges_of(saver: Any) -> list[Any]:
    """The ledger's tool entries (the middleware also records model answers)."""
    return [e for e in await saver.alist_entries("t") if e.tool_name == "charge"]


def texts(out: dict[str, Any]) -> dict[str, str]:
    return {m.tool_call_id: str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)}


FOUR = (("inv-1", 10), ("inv-2", 20), ("inv-3", 30), ("inv-4", 40))
DECISIONS: list[dict[str, Any]] = [
    {"type": "approve"},
    {
        "type": "edit",
        "edited_action": {"name": "charge", "args": {"invoice": "inv-2", "amount": 25}},
    },
    {"type": "reject", "message": "not this one"},
    {"type": "respond", "message": "paid by hand"},
]


async def check_four(
    saver: Any, effects: Counter, out: dict[str, Any], by: str = "HumanInTheLoopMiddleware"
) -> None:
    """Approve ran as asked, edit ran edited (once), reject and respond never ran; ``by``:
    who the entry's history says edited the call (a per-call edit is applied before our
    hook, from the reviewer's answer, so the ledger sees only that the call differs)."""
    assert sorted(effects.calls) == [("inv-1", 10), ("inv-2", 25)]
    by_id = texts(out)
    assert by_id["call_1"] == "charged inv-1 10"
    assert "charged inv-2 25" in by_id["call_2"]  # HITL prepends its edit notice
    assert "not this one" in by_id["call_3"] and by_id["call_4"] == "paid by hand"
    entries = {e.tool_call_id: e for e in await charges_of(saver)}
    assert set(entries) == {"call_1", "call_2"}  # nothing ran for reject / respond
    assert all(e.status is CallStatus.COMPLETED and e.attempts == 1 for e in entries.values())
    assert entries["call_1"].args == b'{"amount":10,"invoice":"inv-1"}'
    assert entries["call_2"].args == b'{"amount":25,"invoice":"inv-2"}'  # what ran
    [edit] = [e for e in entries["call_2"].events() if e["action"] == "edited"]
    assert edit["model_args"] == {"invoice": "inv-2", "amount": 20}
    assert edit["args"] == {"invoice": "inv-2", "amount": 25}
    assert edit["by"] == by and edit["attempt"] == 1
    assert entries["call_1"].events() == []


@pytest.mark.parametrize("order", ORDERS)
async def test_batched_review_every_decision(saver: Any, order: str) -> None:
    effects = Counter()
    agent = agent_of(effects, saver, order, "batched", ask(*FOUR), AIMessage("done", id="d"))
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    [question] = out["__interrupt__"]
    assert len(question.value["action_requests"]) == 4 and effects.calls == []
    out = await agent.ainvoke(Command(resume={"decisions": DECISIONS}), cfg("t"))
    await check_four(saver, effects, out)


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_per_call_review_every_decision_with_review_listed_first(
    saver: Any, sync: bool
) -> None:
    """One approval interrupt per call (each its own task), answered by interrupt id."""
    effects = Counter()
    agent = agent_of(effects, saver, "hitl_first", "per_call", ask(*FOUR), AIMessage("d", id="d"))
    if sync:  # the sync hooks: the saver's sync twin is not needed, the agent runs in a thread
        import asyncio

        def invoke(payload: Any) -> Any:
            return agent.invoke(payload, cfg("t"))

        out = await asyncio.to_thread(invoke, {"messages": [("user", "pay")]})
    else:
        out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    questions = {q.value["tool_call_id"]: q for q in out["__interrupt__"]}
    assert sorted(questions) == ["call_1", "call_2", "call_3", "call_4"] and effects.calls == []
    answers = {questions[f"call_{i + 1}"].id: d for i, d in enumerate(DECISIONS)}
    if sync:
        out = await asyncio.to_thread(invoke, Command(resume=answers))
    else:
        out = await agent.ainvoke(Command(resume=answers), cfg("t"))
    await check_four(saver, effects, out, by="a middleware")


@pytest.mark.parametrize("sync", [False, True], ids=["async", "sync"])
async def test_per_call_review_listed_after_ours_is_refused_before_anything_runs(
    saver: Any, sync: bool
) -> None:
    effects = Counter()
    agent = agent_of(effects, saver, "ledger_first", "per_call", ask(*FOUR[:1]))
    with pytest.raises(MiddlewareOrderError, match=r"List it before: middleware=\[Human"):
        if sync:
            import asyncio

            await asyncio.to_thread(agent.invoke, {"messages": [("user", "pay")]}, cfg("t"))
        else:
            await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert effects.calls == [] and await charges_of(saver) == []


@pytest.mark.parametrize("order", ORDERS)
async def test_key_policy_args_after_an_edit_never_replays_other_arguments(
    saver: Any, order: str
) -> None:
    """The edit ran charge(inv-2, 25); a later approved charge(inv-2, 20) is another call
    by its arguments: it runs (it used to be answered from the 25 entry, keyed by 20)."""
    effects = Counter()
    messages = [
        ask(("inv-2", 20)),
        AIMessage("done", id="d1"),
        ask(("inv-2", 20), msg_id="ai-again", first=7),
        AIMessage("done again", id="d2"),
    ]
    agent = agent_of(effects, saver, order, "batched", *messages, key_policy="args")
    await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    edit = {
        "type": "edit",
        "edited_action": {"name": "charge", "args": {"invoice": "inv-2", "amount": 25}},
    }
    await agent.ainvoke(Command(resume={"decisions": [edit]}), cfg("t"))
    assert effects.calls == [("inv-2", 25)]
    await agent.ainvoke({"messages": [("user", "pay the 20 too")]}, cfg("t"))
    out = await agent.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg("t"))
    assert effects.calls == [("inv-2", 25), ("inv-2", 20)]
    assert texts(out)["call_7"] == "charged inv-2 20"
    entries = sorted(await charges_of(saver), key=lambda e: e.issued_at)
    assert [e.args for e in entries] == [
        b'{"amount":25,"invoice":"inv-2"}',
        b'{"amount":20,"invoice":"inv-2"}',
    ]
    assert [e.replays for e in entries] == [0, 0]


@pytest.mark.parametrize("order", ORDERS)
async def test_verify_and_the_question_get_the_edited_arguments(saver: Any, order: str) -> None:
    """An edited call that raised (an unknown outcome): verify is asked about the edited
    arguments; without verify, the interrupt payload shows them."""
    effects = Counter()
    asked: list[dict[str, Any]] = []

    @tool
    def charge(invoice: str, amount: int) -> str:
        """Charge an invoice."""
        effects.bump((invoice, amount))
        raise ConnectionResetError("reply lost")

    def verify(args: dict[str, Any]) -> Any:
        asked.append(args)
        return f"found {args['invoice']} {args['amount']}"

    hitl = HumanInTheLoopMiddleware(interrupt_on={"charge": True})
    ours = IdempotencyMiddleware(verify={"charge": verify})
    agent = create_agent(
        scripted_model(ask(("inv-2", 20)), AIMessage("done", id="d")),
        tools=[charge],
        middleware=[hitl, ours] if order == "hitl_first" else [ours, hitl],
        checkpointer=saver,
    )
    await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    edit = {
        "type": "edit",
        "edited_action": {"name": "charge", "args": {"invoice": "inv-2", "amount": 25}},
    }
    with pytest.raises(ConnectionResetError):
        await agent.ainvoke(Command(resume={"decisions": [edit]}), cfg("t"))
    out = await agent.ainvoke(None, cfg("t"))  # the task again: the unknown outcome is verified
    assert asked == [{"invoice": "inv-2", "amount": 25}] and effects.calls == [("inv-2", 25)]
    assert "found inv-2 25" in texts(out)["call_1"]
    [entry] = await charges_of(saver)
    assert entry.status is CallStatus.COMPLETED
    assert entry.args == b'{"amount":25,"invoice":"inv-2"}'


@pytest.mark.parametrize("order", ORDERS)
async def test_an_edit_to_another_tool_is_ledgered_as_that_tool(saver: Any, order: str) -> None:
    """A batched edit may name another tool: the ledger records the tool that ran."""
    effects = Counter()
    refunds = Counter()

    @tool
    def refund(invoice: str, amount: int) -> str:
        """Refund an invoice."""
        refunds.bump((invoice, amount))
        return f"refunded {invoice} {amount}"

    hitl = HumanInTheLoopMiddleware(interrupt_on={"charge": True})
    ours = IdempotencyMiddleware()
    agent = create_agent(
        scripted_model(ask(("inv-2", 20)), AIMessage("done", id="d")),
        tools=[charge_tool(effects), refund],
        middleware=[hitl, ours] if order == "hitl_first" else [ours, hitl],
        checkpointer=saver,
    )
    await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    swap = {"name": "refund", "args": {"invoice": "inv-2", "amount": 20}}
    out = await agent.ainvoke(
        Command(resume={"decisions": [{"type": "edit", "edited_action": swap}]}), cfg("t")
    )
    assert effects.calls == [] and refunds.calls == [("inv-2", 20)]
    assert "refunded inv-2 20" in texts(out)["call_1"]
    assert await charges_of(saver) == []
    [entry] = [e for e in await saver.alist_entries("t") if e.tool_name == "refund"]
    assert entry.tool_call_id == "call_1" and entry.status is CallStatus.COMPLETED
    [edit] = [e for e in entry.events() if e["action"] == "edited"]
    assert edit["tool"] == "refund" and edit["model_args"] == {"invoice": "inv-2", "amount": 20}
