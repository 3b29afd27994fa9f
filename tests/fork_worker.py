"""A child process for ``tests/test_forks.py``: the invoice agent of ``resume_worker`` on
either backend, for two resumers that fork one thread (issue 15 item 11), and for a model
that words its calls differently each time it runs (item 5).

``python tests/fork_worker.py '<json scenario>'`` runs one phase and prints one JSON
line (``{"ok": true, "counters": ..., "ledger": ...}`` or ``{"ok": false, "error": ...}``):

* ``prepare`` - send the first user turn and stop before the model step
  (``interrupt_before=["agent"]``): the thread's last checkpoint has the model pending;
* ``run`` - send the user turn under ``durability``, dying at ``crash_at`` for the charge
  of ``crash_invoice`` (see ``resume_worker.make_node``);
* ``resume`` - run what is pending (``ainvoke(None)``), or re-send the turn if the thread
  never saw it (durability ``"exit"`` saves nothing before the end). With ``barrier``
  (``{"dir", "n"}``) the *model* waits until ``n`` processes are inside it: every
  resumer has read the same checkpoint, so each one's model answer forks the thread,
  each with its own fresh tool-call ids.

``ask_human``: no ``verify`` hook; unknown outcomes are interrupts, answered by a human who
looks the charge up at the vendor (:func:`human`); the payloads are reported as ``asked``.

``reword``: every model answer adds a fresh ``memo`` to each charge's arguments, as a real
model rewords a call it makes again.

The saver is ``db`` (SQLite file) or ``dsn`` (PostgreSQL).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatResult
from langgraph.types import Command
from resume_worker import (
    InvoiceModel,
    _barrier,
    build_graph,
    effects_lines,
    make_node,
)
from worker_report import report

from langgraph_idem_saver import IdempotentToolNode

PAY = "pay invoices inv-0 inv-1"


def human(asked: dict[str, Any], effects: str) -> dict[str, Any]:
    """A human who looks the charge asked about up at the vendor (the effects file); asked
    whether a reworded call is the lost one (``earlier_call``), compares the invoices."""
    if asked["kind"] == "earlier_call":
        same = asked["earlier"]["args"]["invoice"] == asked["args"]["invoice"]
        return {"key": asked["key"], "action": "replay" if same else "run"}
    answer = {"key": asked["key"], "attempt": asked["attempt"]}
    if asked["args"]["invoice"] in effects_lines(Path(effects)):
        return {**answer, "action": "completed", "result": "charged (checked by hand)"}
    return {**answer, "action": "rerun"}


class MeetingModel(InvoiceModel):
    """The invoice model, which first waits for the other resumers to be in their model,
    and may reword its calls (a fresh ``memo`` argument in every answer)."""

    barrier: dict[str, Any] | None = None
    reword: bool = False

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        _barrier(self.barrier)
        self.barrier = None  # once: the turn's last model step runs alone
        result = super()._generate(messages, stop, run_manager, **kwargs)
        message = result.generations[0].message
        if self.reword and isinstance(message, AIMessage):
            for call in message.tool_calls:
                call["args"] = {**call["args"], "memo": uuid.uuid4().hex[:8]}
        return result


@asynccontextmanager
async def open_saver(scenario: dict[str, Any]) -> AsyncIterator[Any]:
    if scenario.get("dsn"):
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(scenario["dsn"]) as saver:
            yield saver
    else:
        from langgraph_idem_saver import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(scenario["db"]) as saver:
            yield saver


async def run(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": "t1"}}
    phase, durability = scenario["phase"], scenario.get("durability", "sync")
    turn = {"messages": [HumanMessage(content=PAY)]}
    async with open_saver(scenario) as saver:
        node = make_node(scenario)  # crashes only in phase "run"
        if scenario.get("ask_human"):  # no verify hook: unknown outcomes go to a human
            node = IdempotentToolNode(
                list(node.tools_by_name.values()),
                on_earlier_call=scenario.get("on_earlier_call", "ask"),
            )
        asked: list[Any] = []
        model = MeetingModel(barrier=scenario.get("barrier"), reword=scenario.get("reword", False))
        if phase == "prepare":
            graph = build_graph(model, node, saver, interrupt_before=["agent"])
            await graph.ainvoke(turn, config)
        elif phase == "run":
            await build_graph(model, node, saver).ainvoke(turn, config, durability=durability)
        else:
            graph = build_graph(model, node, saver)
            state = await graph.aget_state(config)
            pending = None if state.values.get("messages") else turn
            out = await graph.ainvoke(pending, config, durability=durability)
            while out.get("__interrupt__") and scenario.get("ask_human"):
                interrupts = out["__interrupt__"]
                asked += [i.value for i in interrupts]
                answers = {i.id: human(i.value, scenario["effects"]) for i in interrupts}
                out = await graph.ainvoke(Command(resume=answers), config, durability=durability)
            if out.get("__interrupt__"):
                raise RuntimeError(f"unexpected interrupt: {out['__interrupt__']!r}")
        entries = await saver.alist_entries("t1")
        return {
            "ok": True,
            "counters": node.counters.as_dict(),
            "ledger": [[e.tool_name, e.status.value, e.attempts] for e in entries],
            "asked": asked,
        }


if __name__ == "__main__":
    report(run)
