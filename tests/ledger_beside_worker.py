"""An agent whose checkpointer is NOT ours, with a ``ToolLedger`` beside it, run as its own
process by ``tests/test_ledger_beside.py``.

``python tests/ledger_beside_worker.py '<json scenario>'`` runs one phase and prints one
JSON line. Scenario keys:

* ``door``: ``tool_node`` (a graph with ``IdempotentToolNode``), ``middleware``
  (``create_agent`` + ``IdempotencyMiddleware``) or ``task`` (``@entrypoint`` +
  ``idempotent_task``);
* ``checkpointer``: ``official_sqlite`` (LangGraph's own ``AsyncSqliteSaver``, or its sync
  ``SqliteSaver`` when ``sync``, on ``checkpoints``), ``official_postgres`` (its
  ``AsyncPostgresSaver`` on the DSN ``checkpoints``; async only) or ``memory``
  (``InMemorySaver``: a fresh process starts with nothing, as after a restart of a server
  without persistence);
* ``ledger``: a SQLite path or a PostgreSQL DSN; ``mode``: ``ours`` or ``stock`` (the
  same graph without the ledger: the control that shows the duplicate);
* ``phase``: ``run`` dies by SIGKILL inside the first charge, right after its effect
  (``fail``: ``raise`` raises a connection reset there instead, ``none`` runs through);
  ``resume`` continues the thread as an application would (``None`` when a checkpoint is
  saved, the input again when there is none);
* ``sync``: drive the graph with ``invoke`` (the ledger opened with ``with``) instead of
  ``ainvoke`` (``async with``).

Each effect is one fsync'd line in ``effects``; ``verify`` reads them back. The model mints
fresh tool-call and message ids on every generation, as a real one does, so a model step
run again after the checkpointer lost it asks for the same charges under new ids.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint, task
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from scripted_chat_model import ScriptedChatModel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import effects_of, record, verify_charge

from langgraph_idem_saver import IdempotentToolNode, ToolLedger

INVOICES = ["inv-1", "inv-2"]


class FreshIdsModel(ScriptedChatModel):
    """Asks for one charge per invoice (fresh ids each time), then answers "done"."""

    llm_type: ClassVar[str] = "fresh-ids"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if any(isinstance(m, ToolMessage) for m in messages):
            done = sorted(str(m.content) for m in messages if isinstance(m, ToolMessage))
            message = AIMessage(f"done: {'; '.join(done)}", id=f"ai-{uuid.uuid4().hex[:8]}")
        else:
            calls = [
                {
                    "name": "charge",
                    "args": {"invoice": inv},
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "tool_call",
                }
                for inv in INVOICES
            ]
            message = AIMessage("", id=f"ai-{uuid.uuid4().hex[:8]}", tool_calls=calls)
        return ChatResult(generations=[ChatGeneration(message=message)])


def build(scenario: dict[str, Any], checkpointer: Any, ledger: ToolLedger | None) -> Any:
    """The scenario's graph: ``ledger`` None builds the stock one."""
    effects = Path(scenario["effects"])
    # how the first charge of a run ends after its effect: "kill" (SIGKILL, nothing after
    # it), "raise" (a connection reset: the in-process tests), "none" (it returns)
    fail = scenario.get("fail", "kill") if scenario["phase"] == "run" else "none"

    def charge_body(invoice: str) -> str:
        record(effects, invoice)
        if invoice == INVOICES[0] and fail == "kill":
            os.kill(os.getpid(), signal.SIGKILL)  # a real kill: nothing after the effect
        if invoice == INVOICES[0] and fail == "raise":
            raise ConnectionResetError("connection reset after the charge was sent")
        return f"charged {invoice}"

    verify = verify_charge(effects)

    door = scenario["door"]
    if door == "task":
        charge_task = (
            task(name="charge")(charge_body)  # type: ignore[arg-type]
            if ledger is None
            else _idempotent_task(charge_body, ledger, verify)
        )

        @entrypoint(checkpointer=checkpointer)
        def pay(invoices: list[str]) -> list[str]:
            return [charge_task(inv).result() for inv in invoices]

        return pay

    charge = tool("charge", description="Charge an invoice.")(charge_body)
    model = FreshIdsModel()
    if door == "middleware":
        from langchain.agents import create_agent

        from langgraph_idem_saver import IdempotencyMiddleware

        middleware = (
            []
            if ledger is None
            else [IdempotencyMiddleware(ledger=ledger, verify={"charge": verify})]
        )
        return create_agent(model, tools=[charge], middleware=middleware, checkpointer=checkpointer)

    node: ToolNode = (
        ToolNode([charge])
        if ledger is None
        else IdempotentToolNode([charge], ledger=ledger, verify={"charge": verify})
    )

    def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [model.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer)


def _idempotent_task(body: Any, ledger: ToolLedger, verify: Any) -> Any:
    from langgraph_idem_saver import idempotent_task

    return idempotent_task(name="charge", verify=verify, ledger=ledger)(body)


def first_input(door: str) -> Any:
    return list(INVOICES) if door == "task" else {"messages": [HumanMessage("pay")]}


def outcome(door: str, result: Any) -> Any:
    """What the run ended with: the task results, or the agent's last message."""
    if door == "task":
        return result
    return str(result["messages"][-1].content)


async def arun(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": scenario["thread"]}}
    async with AsyncExitStack() as stack:
        if scenario["checkpointer"] == "official_sqlite":
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver

            checkpointer: Any = await stack.enter_async_context(
                AsyncSqliteSaver.from_conn_string(scenario["checkpoints"])
            )
        elif scenario["checkpointer"] == "official_postgres":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

            checkpointer = await stack.enter_async_context(
                AsyncPostgresSaver.from_conn_string(scenario["checkpoints"])
            )
            await checkpointer.setup()
        else:
            checkpointer = InMemorySaver()
        ledger = None
        if scenario["mode"] == "ours":
            ledger = await stack.enter_async_context(ToolLedger(scenario["ledger"]))
        graph = build(scenario, checkpointer, ledger)
        state = await graph.aget_state(config)
        saved = "checkpoint_id" in state.config.get("configurable", {})
        payload = None if saved else first_input(scenario["door"])
        result = await graph.ainvoke(payload, config, durability=scenario.get("durability", "sync"))
        entries = [] if ledger is None else await ledger.alist_entries(scenario["thread"])
    return report(scenario, result, entries)


def run_sync(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": scenario["thread"]}}
    with ExitStack() as stack:
        if scenario["checkpointer"] == "official_sqlite":
            from langgraph.checkpoint.sqlite import SqliteSaver

            checkpointer: Any = stack.enter_context(
                SqliteSaver.from_conn_string(scenario["checkpoints"])
            )
        else:
            checkpointer = InMemorySaver()
        ledger = None
        if scenario["mode"] == "ours":
            ledger = stack.enter_context(ToolLedger(scenario["ledger"]))
        graph = build(scenario, checkpointer, ledger)
        saved = "checkpoint_id" in graph.get_state(config).config.get("configurable", {})
        payload = None if saved else first_input(scenario["door"])
        result = graph.invoke(payload, config, durability=scenario.get("durability", "sync"))
        entries = [] if ledger is None else asyncio.run(ledger.alist_entries(scenario["thread"]))
    return report(scenario, result, entries)


def report(scenario: dict[str, Any], result: Any, entries: list[Any]) -> dict[str, Any]:
    return {
        "outcome": outcome(scenario["door"], result),
        "effects": effects_of(Path(scenario["effects"])),
        "ledger": sorted(
            [e.status.value, json.loads(e.args)["invoice"]]
            for e in entries
            if e.tool_name == "charge"  # not the middleware's record of model calls
        ),
    }


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    scenario = json.loads(sys.argv[1])
    out = run_sync(scenario) if scenario.get("sync") else asyncio.run(arun(scenario))
    print(json.dumps(out))
