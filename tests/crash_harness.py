"""A ReAct agent that charges invoices, run as a separate process by the crash tests.

``python tests/crash_harness.py '<json scenario>'`` runs one *phase* of a scenario and
prints one JSON line with what it saw. Phases:

* ``run``    - invoke the agent on a fresh thread; may die at ``crash_at`` (``os._exit``,
  no cleanup, no flush of anything the process did not commit itself).
* ``resume`` - in a fresh process: continue the thread the way an application would
  (``ainvoke(None)`` when a checkpoint is pending, the original input again when nothing
  was saved), answering unknown-outcome interrupts with ``scenario["answer"]`` - or, with
  ``"answer": "payload"``, as a human who sees only the interrupt's payload: "completed",
  with the result the tool would have returned for those arguments.

``scenario["verify"]`` picks the tool's ``verify`` hook: ``True`` (the default: it reads
the effects file, as a tool would ask its vendor), ``"liar"`` (it always answers "not
applied", even for a charge that landed) or ``False`` (none: unknown outcomes go to the
human). The test's own witnesses, never read by the agent: every start of the tool's body
is a line in ``starts`` and every question to ``verify`` a line in ``asked``.

Crash points are injected from the outside, by a subclass of the real saver and a tool
that dies: the product code has no test hooks.

* ``before_issued``    - inside ``aclaim``, before the ``issued`` row is committed
* ``after_issued``     - the tool starts, before its side effect
* ``after_effect``     - the side effect is on disk, ``completed`` is not
* ``after_completed``  - ``completed`` is committed, the node has not returned
* ``after_node``       - the node returned, LangGraph has not committed its writes

The side effect is a line appended to ``effects`` (flushed to the kernel, so it survives
``os._exit``); the tests count lines to count charges.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode, create_react_agent
from langgraph.types import Command
from scripted_chat_model import ScriptedChatModel

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode
from langgraph_idem_saver.tool_node import NOT_APPLIED

CRASH_EXIT_CODE = 77


class ScriptedModel(ScriptedChatModel):
    """A stand-in LLM: asks for ``n_calls`` charges, then answers "done".

    Like a real model it mints fresh tool-call ids on every generation, so a model step
    that LangGraph re-runs after a crash yields *different* ids for the same calls.
    """

    n_calls: int = 1

    llm_type: ClassVar[str] = "scripted"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        answered = [m for m in messages[last_human:] if isinstance(m, ToolMessage)]
        if answered:
            message = AIMessage(content=f"done: {len(answered)} charges")
        else:
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "charge",
                        "args": {"invoice": f"inv-{i}", "amount": 10 * (i + 1)},
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "tool_call",
                    }
                    for i in range(self.n_calls)
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


def charge_result(args: dict[str, Any]) -> str:
    """What ``charge`` returns for these arguments."""
    return f"charged {args['invoice']} ${args['amount']}"


def witness(scenario: dict[str, Any], name: str, invoice: str) -> None:
    """One line in the test's witness file ``scenario[name]`` (when the test asked for it),
    flushed to the kernel before the process may die."""
    if scenario.get(name):
        with open(scenario[name], "a") as f:
            f.write(f"{invoice}\n")
            f.flush()


def answer_of(scenario: dict[str, Any], question: dict[str, Any]) -> dict[str, Any]:
    """The human's answer to an unknown-outcome interrupt: the scenario's fixed answer, or
    (``"payload"``) one made from the payload alone - the call happened, with the result
    the tool returns for its arguments, about this key and attempt."""
    answer = scenario.get("answer", {"action": "rerun"})
    if answer != "payload":
        return dict(answer)
    return {
        "action": "completed",
        "result": charge_result(question["args"]),
        "key": question["key"],
        "attempt": question["attempt"],
    }


def die() -> None:
    sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


def build(scenario: dict[str, Any], saver: Any) -> Any:
    effects = Path(scenario["effects"])
    crash_at = scenario.get("crash_at") if scenario["phase"] == "run" else None
    crash_invoice = scenario.get("crash_invoice", "inv-0")

    @tool
    async def charge(invoice: str, amount: int) -> str:
        """Charge an invoice (the side effect under test)."""
        witness(scenario, "starts", invoice)
        if crash_at == "after_issued" and invoice == crash_invoice:
            die()
        with effects.open("a") as f:
            f.write(f"{invoice}\n")
            f.flush()
        if crash_at == "after_effect" and invoice == crash_invoice:
            die()
        return f"charged {invoice} ${amount}"

    def verify(args: dict[str, Any]) -> Any:
        """The tool's own check: did this invoice's charge land? (The liar: never.)"""
        witness(scenario, "asked", args["invoice"])
        lines = effects.read_text().split() if effects.exists() else []
        if args["invoice"] in lines and scenario.get("verify") != "liar":
            return charge_result(args)
        return NOT_APPLIED

    if scenario.get("node") == "stock":
        node: ToolNode = _StockNode([charge], crash_at=crash_at)
    else:
        kwargs: dict[str, Any] = {}
        if scenario.get("verify", True) is not False:
            kwargs["verify"] = {"charge": verify}
        node = _CrashingNode([charge], crash_at=crash_at, **kwargs)
    model = ScriptedModel(n_calls=scenario.get("n_calls", 1))
    return create_react_agent(
        model, node, checkpointer=saver, version=scenario.get("version", "v2")
    )


class _CrashingNode(IdempotentToolNode):
    def __init__(self, *args: Any, crash_at: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._crash_at = crash_at

    async def _afunc(self, *args: Any, **kwargs: Any) -> Any:
        out = await super()._afunc(*args, **kwargs)
        if self._crash_at == "after_node":
            die()
        return out


class _StockNode(ToolNode):
    def __init__(self, *args: Any, crash_at: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._crash_at = crash_at

    async def _afunc(self, *args: Any, **kwargs: Any) -> Any:
        out = await super()._afunc(*args, **kwargs)
        if self._crash_at in ("after_node", "after_completed"):
            die()
        return out


class _Crashing:
    """Mixed into the real saver: dies at the ledger points a scenario names."""

    crash_at: str | None = None

    async def aclaim(self, intents: Any, **kwargs: Any) -> Any:
        if self.crash_at == "before_issued":
            die()
        return await super().aclaim(intents, **kwargs)  # type: ignore[misc]

    async def aclaim_step(self, intents: Any, lookup: Any, **kwargs: Any) -> Any:
        """A step's claim (with adoption's read, in one trip): the same crash point."""
        if self.crash_at == "before_issued":
            die()
        return await super().aclaim_step(intents, lookup, **kwargs)  # type: ignore[misc]

    def record_outcome(self, *args: Any, **kwargs: Any) -> Any:
        """A call's outcome, committed when its answer is awaited (at once by the
        middleware and tasks; by a ToolNode step before the node returns): die right
        after the first one is."""
        written = super().record_outcome(*args, **kwargs)  # type: ignore[misc]

        async def then_die() -> None:
            await written
            if self.crash_at == "after_completed":
                die()

        return then_die()

    def record_outcome_rows(self, rows: Any) -> Any:
        """A ToolNode step's outcomes of one loop iteration, sent together: die right
        after the first batch is committed (before the node returns)."""
        written = super().record_outcome_rows(rows)  # type: ignore[misc]

        async def then_die() -> Any:
            errors = await written
            if self.crash_at == "after_completed":
                die()
            return errors

        return then_die()


class CrashingSqliteSaver(_Crashing, AsyncSqliteSaver):
    pass


def open_saver(scenario: dict[str, Any]) -> Any:
    """The scenario's database: a SQLite file, or a PostgreSQL schema (``dsn``)."""
    if scenario.get("dsn"):
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        class CrashingPostgresSaver(_Crashing, AsyncPostgresSaver):
            pass

        return CrashingPostgresSaver.from_conn_string(scenario["dsn"])
    return CrashingSqliteSaver.from_conn_string(scenario["db"])


def summarize(messages: list[BaseMessage]) -> list[Any]:
    """Messages without ids: what an uncrashed run and a resumed one must agree on."""
    out: list[Any] = []
    for m in messages:
        if isinstance(m, AIMessage):
            out.append(
                [
                    "ai",
                    m.content,
                    sorted(
                        json.dumps([c["name"], c["args"]], sort_keys=True) for c in m.tool_calls
                    ),
                ]
            )
        elif isinstance(m, ToolMessage):
            out.append(["tool", m.name, m.content, m.status])
        else:
            out.append([m.type, m.content])
    return out


async def main(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": scenario.get("thread_id", "t1")}}
    durability = scenario.get("durability", "sync")
    inputs = {"messages": [HumanMessage(content="pay my invoices")]}
    async with open_saver(scenario) as saver:
        if scenario["phase"] == "run":
            saver.crash_at = scenario.get("crash_at")
        graph = build(scenario, saver)
        interrupts: list[Any] = []
        if scenario["phase"] == "run":
            result = await graph.ainvoke(inputs, config, durability=durability)
        else:
            state = await graph.aget_state(config)
            if not state.values:
                result = await graph.ainvoke(inputs, config, durability=durability)
            else:
                # even when `state.next` is empty: a finished task's writes may be pending
                # (durability "async" lost the checkpoint after them), and only a run applies
                # them and schedules what they sent
                result = await graph.ainvoke(None, config, durability=durability)
            while result.get("__interrupt__"):
                interrupts += [i.value for i in result["__interrupt__"]]
                answers = {i.id: answer_of(scenario, i.value) for i in result["__interrupt__"]}
                result = await graph.ainvoke(Command(resume=answers), config, durability=durability)
        entries = await saver.alist_entries(config["configurable"]["thread_id"])
        return {
            "messages": summarize(result["messages"]),
            "interrupts": interrupts,
            "ledger": [[e.tool_name, e.status.value, e.attempts, e.replays] for e in entries],
            "calls": calls_of(entries),
        }


def calls_of(entries: list[Any]) -> dict[str, list[Any]]:
    """``{invoice: [status, attempts, replays]}`` of a thread's ledger entries."""
    return {json.loads(e.args)["invoice"]: [e.status.value, e.attempts, e.replays] for e in entries}


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))))
