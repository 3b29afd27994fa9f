"""A child process for ``tests/test_no_silent_guesses.py``: the invoice agent of
``resume_worker`` on either backend, as a ``StateGraph`` over ``IdempotentToolNode``
(``agent="graph"``) or ``create_react_agent(version="v2")`` (``agent="react_v2"``: one
task per tool call, each its own ledger run).

``python tests/earlier_call_worker.py '<json scenario>'`` runs one phase and prints one
JSON line (``{"ok": true, ...}`` or ``{"ok": false, "error": ..., "traceback": ...}``):

* ``run`` - send ``text`` under ``durability``, dying at ``crash_at`` for the charge of
  ``crash_invoice`` (``resume_worker.make_node``; ``os._exit``, as a SIGKILL leaves it);
* ``resume`` - an application restarting: finish what is pending, or send ``text`` when
  the thread holds nothing (durability ``"exit"`` saved nothing before the crash).

``calls`` (optional): the invoices the model asks for this time, whatever the text - a
model re-run after a crash need not ask for the same calls. ``hold``
(``{"invoice", "until"}``): the ledger's step read of the calls for ``invoice`` waits
until ``until`` was charged (or until another call took its lost entry: ``"adopted"``) -
two tasks of one step in a fixed order; ``verify_waits_for``: the ``verify`` hook answers
its first question once a second was asked, and the others once that invoice was charged.
Interrupts are answered by a human: an ``earlier_call`` question with ``answer_earlier``
(``"run"`` or ``"replay"``), an unknown outcome by looking the charge up (the effects file).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage, ToolMessage
from langgraph.types import Command
from resume_worker import InvoiceModel, build_graph, effects_lines, make_node
from worker_report import report

from langgraph_idem_saver import NOT_APPLIED, IdempotentToolNode

THREAD = "t1"


def holding(saver_class: type, hold: dict[str, str] | None, effects: Path) -> type:
    """``saver_class`` whose step read of ``hold["invoice"]``'s call waits until
    ``hold["until"]`` was charged, or (``"until": "adopted"``) until another call took
    that invoice's lost entry (every other call goes straight through)."""
    if not hold:
        return saver_class

    class Holding(saver_class):  # type: ignore[misc, valid-type]
        async def released(self) -> bool:
            if hold["until"] != "adopted":
                return hold["until"] in effects_lines(effects)
            return any(
                e.adopted_by and json.loads(e.args)["invoice"] == hold["invoice"]
                for e in await self.alist_entries(THREAD)
            )

        async def aclaim_step(self, intents: Any, lookup: Any, **kwargs: Any) -> Any:
            wanted = f'"invoice":"{hold["invoice"]}"'
            if any(wanted in i.args.decode() for i in intents):
                deadline = time.monotonic() + 60
                while not await self.released():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"never released: {hold!r}")
                    await asyncio.sleep(0.05)
            return await super().aclaim_step(intents, lookup, **kwargs)

    return Holding


@asynccontextmanager
async def open_saver(scenario: dict[str, Any]) -> AsyncIterator[Any]:
    effects = Path(scenario["effects"])
    if scenario.get("dsn"):
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        cls = holding(AsyncPostgresSaver, scenario.get("hold"), effects)
        async with cls.from_conn_string(scenario["dsn"]) as saver:
            yield saver
    else:
        from langgraph_idem_saver import AsyncSqliteSaver

        cls = holding(AsyncSqliteSaver, scenario.get("hold"), effects)
        async with cls.from_conn_string(scenario["db"]) as saver:
            yield saver


def answer(asked: dict[str, Any], scenario: dict[str, Any]) -> dict[str, Any]:
    if asked["kind"] == "earlier_call":
        return {"key": asked["key"], "action": scenario["answer_earlier"]}
    reply = {"key": asked["key"], "attempt": asked["attempt"]}
    if asked["args"]["invoice"] in effects_lines(Path(scenario["effects"])):
        return {**reply, "action": "completed", "result": "charged (checked by hand)"}
    return {**reply, "action": "rerun"}


def waiting_verify(effects: Path, scenario: dict[str, Any]) -> Any:
    """``verify`` that looks the invoice up at the "vendor" (the effects file), the first
    question answered only once a second one was asked, the second and later ones only
    once ``verify_waits_for`` was charged: two askers of one step in a fixed order."""
    asked: list[dict[str, Any]] = []

    async def verify(args: dict[str, Any]) -> Any:
        asked.append(args)
        first = len(asked) == 1
        deadline = time.monotonic() + 60
        while (
            (len(asked) < 2)
            if first
            else (scenario["verify_waits_for"] not in effects_lines(effects))
        ):
            if time.monotonic() > deadline:
                raise RuntimeError(f"verify waited in vain: {asked!r}")
            await asyncio.sleep(0.05)
        if args["invoice"] in effects_lines(effects):
            return f"charged {args['invoice']} ${args['amount']}"
        return NOT_APPLIED

    return verify


def build(scenario: dict[str, Any], saver: Any) -> tuple[Any, Any]:
    text = scenario["text"]
    script = {}
    if scenario.get("calls") is not None:
        script[text] = [
            {"name": "charge", "args": {"invoice": inv, "amount": 10}} for inv in scenario["calls"]
        ]
    model = InvoiceModel(script=script)
    node = make_node(scenario)
    if scenario.get("no_verify"):  # unknown outcomes go to a human (an interrupt)
        node = IdempotentToolNode(
            list(node.tools_by_name.values()),
            on_unknown="interrupt",
            on_earlier_call=scenario.get("on_earlier_call", "ask"),
        )
    if scenario.get("verify_waits_for"):  # verify answers once that invoice was charged
        node = IdempotentToolNode(
            list(node.tools_by_name.values()),
            verify={"charge": waiting_verify(Path(scenario["effects"]), scenario)},
            on_unknown="raise",
        )
    if scenario.get("agent") == "react_v2":
        from langgraph.prebuilt import create_react_agent

        graph = create_react_agent(model, tools=node, checkpointer=saver, version="v2")
    else:
        graph = build_graph(model, node, saver)
    return graph, node


async def run(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": THREAD}}
    durability = scenario.get("durability", "sync")
    asked_then: list[Any] = []
    async with open_saver(scenario) as saver:
        graph, node = build(scenario, saver)
        state = await graph.aget_state(config)
        turn = {"messages": [HumanMessage(content=scenario["text"])]}
        pending = turn if scenario["phase"] == "run" or not state.next else None
        out = await graph.ainvoke(pending, config, durability=durability)
        asked: list[Any] = []
        while out.get("__interrupt__"):
            interrupts = out["__interrupt__"]
            asked += [i.value for i in interrupts]
            if scenario.get("leave_unanswered"):  # a user who never answers, asks anew
                break
            if len(asked) > 10:
                raise RuntimeError(f"asked again and again: {asked!r}")
            answers = {i.id: answer(i.value, scenario) for i in interrupts}
            out = await graph.ainvoke(Command(resume=answers), config, durability=durability)
        if scenario.get("then"):  # the user's next turn, in this same process
            then = {"messages": [HumanMessage(content=scenario["then"])]}
            out = await graph.ainvoke(then, config, durability=durability)
            asked_then = [i.value for i in out.get("__interrupt__", ())]
        entries = await saver.alist_entries(THREAD)
        return {
            "ok": True,
            "counters": node.counters.as_dict(),
            "ledger": [
                {
                    "invoice": json.loads(e.args)["invoice"],
                    "status": e.status.value,
                    "attempts": e.attempts,
                    "error": e.error,
                    "events": [ev.get("action") for ev in e.events()],
                }
                for e in entries
            ],
            "tool_messages": {
                str(m.tool_call_id): str(m.content)
                for m in out["messages"]
                if isinstance(m, ToolMessage)
            },
            "calls": {
                str(c["id"]): c["args"]["invoice"]
                for m in out["messages"]
                for c in getattr(m, "tool_calls", None) or ()
            },
            "asked": asked,
            "asked_then": asked_then,
        }


if __name__ == "__main__":
    report(run)
