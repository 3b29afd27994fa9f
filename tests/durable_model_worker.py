"""An agent whose model answer is recorded (or not), in its own process, for the crash
tests of recorded model responses (``tests/test_durable_model.py``).

``python tests/durable_model_worker.py '<json scenario>'`` runs one phase and prints one
JSON line. Scenario keys:

* ``db`` (SQLite path or Postgres DSN), ``effects``, ``calls`` (files), ``thread``;
* ``front``: ``agent`` (``create_agent`` + ``IdempotencyMiddleware``) or ``graph`` (a
  hand-written ``StateGraph``: a node calling ``durable_model(model)``, then
  ``IdempotentToolNode``);
* ``record``: True (recorded model answers) or False (the stock model call: the control);
* ``durability``; ``text``: the user's message (``"pay inv-1 inv-2"``);
* ``crash``: True - the process dies inside a tool, right after its effect (``os._exit``:
  no cleanup, as a SIGKILL leaves it); False - run to the end (the resume).

The model is a fake that, like a real one, mints fresh tool-call ids on every answer, and
appends one fsync'd line to ``calls`` per answer: the tests count model calls across
processes. Each effect is one fsync'd line ``<invoice> <tool call id>`` in ``effects``.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import effects_of as lines
from effects_file import record as append  # "record" is the scenario's switch here
from resume_rule import asaved_next, resume_input

from langgraph_idem_saver import NOT_APPLIED, AsyncSqliteSaver, IdempotentToolNode
from langgraph_idem_saver.durable_model import durable_model
from langgraph_idem_saver.middleware import IdempotencyMiddleware

CRASH_EXIT_CODE = 137


class CountingModel(BaseChatModel):
    """Charges the invoices the last user message names (fresh call ids each time, as a
    real model mints them), then answers; every answer is a line in ``calls_file``."""

    calls_file: str

    @property
    def _llm_type(self) -> str:
        return "counting-fake"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[t.name for t in tools])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        answered = [m for m in messages[last:] if isinstance(m, ToolMessage)]
        if answered:
            message = AIMessage(f"done: {len(answered)}", id=f"ai-{uuid.uuid4().hex[:8]}")
        else:
            invoices = [w for w in str(messages[last].content).split() if w.startswith("inv-")]
            calls = [
                {
                    "name": "charge",
                    "args": {"invoice": inv},
                    "id": f"call_{uuid.uuid4().hex[:12]}",
                    "type": "tool_call",
                }
                for inv in invoices
            ]
            message = AIMessage(
                "",
                id=f"ai-{uuid.uuid4().hex[:8]}",
                tool_calls=calls,
                usage_metadata={"input_tokens": 11, "output_tokens": 7, "total_tokens": 18},
                response_metadata={"model_name": "counting-fake", "finish_reason": "tool_calls"},
            )
        append(Path(self.calls_file), "answer" if answered else "calls")
        return ChatResult(generations=[ChatGeneration(message=message)])


def build(scenario: dict[str, Any], saver: Any) -> tuple[Any, Any]:
    effects = Path(scenario["effects"])
    crash = bool(scenario.get("crash"))

    @tool
    def charge(invoice: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> str:
        """Charge an invoice."""
        append(effects, f"{invoice} {tool_call_id}")
        if crash:
            os._exit(CRASH_EXIT_CODE)
        return f"charged {invoice}"

    def charged(args: dict[str, Any]) -> Any:
        done = {line.split()[0] for line in lines(effects)}
        return f"charged {args['invoice']}" if args["invoice"] in done else NOT_APPLIED

    model = CountingModel(calls_file=scenario["calls"])
    record = bool(scenario["record"])
    if scenario["front"] == "agent":
        middleware = IdempotencyMiddleware(verify={"charge": charged}, record_model=record)
        agent = create_agent(model, tools=[charge], middleware=[middleware], checkpointer=saver)
        return agent, middleware.engine.counters

    llm = (durable_model(model) if record else model).bind_tools([charge])

    async def agent_node(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    tools = IdempotentToolNode([charge], verify={"charge": charged})
    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent_node)
    builder.add_node("tools", tools)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver), tools.counters


async def main(scenario: dict[str, Any]) -> None:
    opener: Any = AsyncSqliteSaver
    if scenario["db"].startswith(("postgresql:", "postgres:")) or "dbname=" in scenario["db"]:
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    async with opener.from_conn_string(scenario["db"]) as saver:
        graph, counters = build(scenario, saver)
        config = {"configurable": {"thread_id": scenario["thread"]}}
        durability = scenario["durability"]
        first = {"messages": [("user", scenario["text"])]}
        interrupted = False
        if scenario.get("turn"):  # a new turn on the thread, whatever it holds
            out = await graph.ainvoke(first, config, durability=durability)
            interrupted = bool(out.get("__interrupt__"))
        for _ in range(5):  # resume as an application would (tests/resume_rule.py)
            next_tasks = await asaved_next(graph, config)
            if next_tasks == ():
                break
            out = await graph.ainvoke(
                resume_input(next_tasks, first), config, durability=durability
            )
            interrupted = interrupted or bool(out.get("__interrupt__"))
            if interrupted:
                break  # a question for a human: this worker has no answers
        messages = (await graph.aget_state(config)).values["messages"]
        entries = await saver.alist_entries(scenario["thread"])
    print(
        json.dumps(
            {
                "contents": [str(m.content) for m in messages],
                "call_ids": [
                    tc["id"] for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls
                ],
                "answered_ids": [m.tool_call_id for m in messages if isinstance(m, ToolMessage)],
                "usage": [
                    m.usage_metadata for m in messages if isinstance(m, AIMessage) and m.tool_calls
                ],
                "adopted": counters.adopted,
                "interrupted": interrupted,
                "adopted_entries": [e.key for e in entries if e.adopted_by],
                "recorded": [e.key for e in entries if e.tool_name == "__model__"],
            }
        )
    )


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    asyncio.run(main(json.loads(sys.argv[1])))
