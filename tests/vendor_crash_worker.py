"""One front door charging a vendor that dedupes by key, run as its own process by
``tests/test_vendor_key_crash.py``.

``python tests/vendor_crash_worker.py DOOR DB VENDOR_URL THREAD CRASH KEYING``:

* ``DOOR``: ``node`` (``IdempotentToolNode``, a sync tool), ``agent`` (``create_agent``
  with ``IdempotencyMiddleware``, an async tool) or ``task`` (``idempotent_task``);
  each with ``on_unknown="rerun"`` and no ``verify`` hook;
* ``DB``: a SQLite file, or a PostgreSQL DSN;
* ``CRASH``: ``after_vendor`` (the process SIGKILLs itself - nothing flushed, nothing
  cleaned up - once the vendor took the charge, before the ledger's ``completed``) or
  ``none`` (the resume);
* ``KEYING``: ``ledger`` (the tool sends ``current_call().key`` as the vendor's
  ``Idempotency-Key``) or ``random`` (a new key per attempt: the control, what a tool
  without the ledger's key would send).

Prints one JSON line: the run's answer, and the interrupts and next tasks left.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from scripted_chat_model import ScriptedChatModel

INVOICE = "inv-1"
AMOUNT = 500


class OneChargeModel(ScriptedChatModel):
    """Asks for one charge (fixed ids, as a recorded answer would give), then "done"."""

    llm_type: ClassVar[str] = "one-charge"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        answered = [m for m in messages if isinstance(m, ToolMessage)]
        if answered:
            message = AIMessage(content=f"done: {answered[-1].content}", id="ai-done")
        else:
            call = {"name": "charge", "args": {"invoice": INVOICE}, "id": "call_1"}
            message = AIMessage(content="", id="ai-1", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


async def main(door: str, db: str, url: str, thread: str, crash: str, keying: str) -> None:
    from fake_vendor import Vendor
    from resume_rule import asaved_next, resume_input

    from langgraph_idem_saver import current_call

    vendor = Vendor(url)

    def pay(invoice: str) -> str:
        key = current_call().key if keying == "ledger" else f"random-{uuid.uuid4().hex}"
        charge = vendor.charges.create(amount=AMOUNT, invoice=invoice, idempotency_key=key)
        if crash == "after_vendor":
            os.kill(os.getpid(), signal.SIGKILL)  # charged; the ledger has no "completed"
        return f"{charge['id']} for {invoice}"

    if db.startswith(("postgresql:", "postgres:")) or "dbname=" in db:
        from langgraph_idem_saver import AsyncPostgresSaver as opener
    else:
        from langgraph_idem_saver import AsyncSqliteSaver as opener  # type: ignore[assignment]
    config: Any = {"configurable": {"thread_id": thread}}
    async with opener.from_conn_string(db) as saver:
        graph, first = build(door, saver, pay)
        payload = resume_input(await asaved_next(graph, config), first)
        out = await graph.ainvoke(payload, config)
        state = await graph.aget_state(config)
    print(
        json.dumps(
            {
                "answer": answer_of(out),
                "interrupts": len(state.interrupts),
                "next": list(state.next),
            }
        )
    )


def build(door: str, saver: Any, pay: Any) -> tuple[Any, Any]:
    """The graph of ``door`` charging through ``pay``, and its first input."""
    if door == "node":
        from tool_node_helpers import ai_calls, tool_graph

        from langgraph_idem_saver import IdempotentToolNode

        @tool
        def charge(invoice: str) -> str:
            """Charge an invoice (a sync tool: it runs in a worker thread)."""
            return pay(invoice)

        message = ai_calls(("charge", {"invoice": INVOICE}, "call_1"), msg_id="ai-1")
        node = IdempotentToolNode([charge], on_unknown="rerun")
        return tool_graph(node, saver), {"messages": [message]}
    if door == "agent":
        from langchain.agents import create_agent

        from langgraph_idem_saver import IdempotencyMiddleware

        @tool
        async def charge(invoice: str) -> str:  # type: ignore[no-redef]
            """Charge an invoice (an async tool)."""
            return pay(invoice)

        agent = create_agent(
            OneChargeModel(),
            tools=[charge],
            middleware=[IdempotencyMiddleware(on_unknown="rerun")],
            checkpointer=saver,
        )
        return agent, {"messages": [("user", "pay inv-1")]}
    from langgraph.func import entrypoint

    from langgraph_idem_saver import idempotent_task

    @idempotent_task(name="charge", on_unknown="rerun")
    async def charge_task(invoice: str) -> str:
        return pay(invoice)

    @entrypoint(checkpointer=saver)
    async def workflow(invoice: str) -> str:
        return str(await charge_task(invoice))

    return workflow, INVOICE


def answer_of(out: Any) -> str:
    if isinstance(out, dict) and "messages" in out:
        return str(out["messages"][-1].content)
    return str(out)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    asyncio.run(main(*sys.argv[1:7]))
