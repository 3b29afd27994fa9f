"""A small tool-calling agent on the real SQLite saver, run as a child process by the
concurrent-resume and book-exercise tests (and imported in-process for baselines).

``python tests/resume_worker.py '<json scenario>'`` runs one phase and prints one JSON
line: ``{"ok": true, "messages": ..., "counters": ...}``, or ``{"ok": false, "error":
<exception class name>, ...}`` with exit code :data:`FAILED_EXIT_CODE` when the run raised.

Phases:

* ``run``     - send ``inputs`` (one user turn each) to a fresh thread; may die at
  ``crash_at`` for the call to ``crash_invoice``:

  - ``after_issued``  - the tool started (its ``issued`` row is committed), no effect yet
  - ``after_effect``  - the effect is on disk, ``completed`` is not (``os._exit``)
  - ``after_turn``    - the turn that charged ``crash_invoice`` completed; the process
    touches ``ready_file`` and sleeps until the parent kills it (SIGKILL)
* ``prepare`` - send the first input and stop before the tools step (``interrupt_before``)
* ``resume``  - as an application restarting: finish the pending step (``ainvoke(None)``)
  if there is one, then send the inputs the thread has not seen yet.

``barrier`` (``{"dir": ..., "n": ...}``) makes ``n`` processes start their graph work at
the same moment: each opens its saver and builds its graph first, then announces itself
and waits for the others.

The side effect is a line appended to ``effects`` and flushed to the kernel (it survives
``os._exit``); the ``verify`` hook reads that file, as a tool would ask its vendor whether
a charge landed.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from pydantic import Field
from scripted_chat_model import ScriptedChatModel

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode  # noqa: E402
from langgraph_idem_saver.tool_node import NOT_APPLIED  # noqa: E402

CRASH_EXIT_CODE = 77
FAILED_EXIT_CODE = 3
WORKER = Path(__file__)


class InvoiceModel(ScriptedChatModel):
    """A scripted tool-calling "LLM".

    For a user turn ``"pay invoices a b c"`` it asks, in one message (a parallel batch),
    for ``charge(invoice=a, amount=10)``, ``charge(invoice=b, amount=20)``, ...; a turn
    text found in ``script`` asks for the calls listed there instead. Once the turn's
    calls are answered it replies ``"done: <tool results>"``. Like a real model it mints
    fresh tool-call ids on every generation unless ``fixed_ids`` is set (then the ids
    derive from the turn number, as a deterministic model would).
    """

    script: dict[str, list[dict[str, Any]]] = Field(default_factory=dict)
    fixed_ids: bool = False

    llm_type: ClassVar[str] = "scripted-invoices"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        turn = messages[humans[-1] :]
        answered = [m for m in turn if isinstance(m, ToolMessage)]
        if answered:
            message = AIMessage(content="done: " + "; ".join(str(m.content) for m in answered))
        else:
            text = str(turn[0].content)
            calls = self.script.get(text)
            if calls is None:
                calls = [
                    {"name": "charge", "args": {"invoice": inv, "amount": 10 * (i + 1)}}
                    for i, inv in enumerate(text.split()[2:])
                ]
            message = AIMessage(
                content="",
                # fixed ids: the message id is deterministic too (part of the default key)
                id=f"ai_t{len(humans)}" if self.fixed_ids else None,
                tool_calls=[
                    {
                        "name": c["name"],
                        "args": c["args"],
                        "id": (
                            f"call_t{len(humans)}_{i}"
                            if self.fixed_ids
                            else f"call_{uuid.uuid4().hex[:12]}"
                        ),
                        "type": "tool_call",
                    }
                    for i, c in enumerate(calls)
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


def build_graph(
    model: BaseChatModel, node: IdempotentToolNode, saver: Any, **compile_kwargs: Any
) -> Any:
    """agent -> (tools -> agent)* -> END over MessagesState: a minimal ReAct loop."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_node("tools", node)
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver, **compile_kwargs)


def summarize(messages: Sequence[BaseMessage]) -> list[Any]:
    """Messages without ids: what an uncrashed run and a resumed one must agree on."""
    out: list[Any] = []
    for m in messages:
        if isinstance(m, AIMessage):
            calls = sorted(json.dumps([c["name"], c["args"]], sort_keys=True) for c in m.tool_calls)
            out.append(["ai", m.content, calls])
        elif isinstance(m, ToolMessage):
            out.append(["tool", m.name, m.content, m.status])
        else:
            out.append([m.type, m.content])
    return out


def effects_lines(path: Path) -> list[str]:
    return path.read_text().split() if path.exists() else []


def _die() -> None:
    sys.stdout.flush()
    os._exit(CRASH_EXIT_CODE)


def make_node(scenario: dict[str, Any]) -> IdempotentToolNode:
    effects = Path(scenario["effects"])
    crash_at = scenario.get("crash_at") if scenario["phase"] == "run" else None
    crash_invoice = scenario.get("crash_invoice")
    slow = float(scenario.get("slow", 0.0))

    @tool
    async def charge(invoice: str, amount: int) -> str:
        """Charge an invoice (the side effect under test)."""
        if slow:
            await asyncio.sleep(slow)
        if crash_at == "after_issued" and invoice == crash_invoice:
            _die()
        with effects.open("a") as f:
            f.write(f"{invoice}\n")
            f.flush()
        if crash_at == "after_effect" and invoice == crash_invoice:
            _die()
        return f"charged {invoice} ${amount}"

    def verify(args: dict[str, Any]) -> Any:
        """Did this invoice's charge land? (asks the 'vendor': the effects file)"""
        if args["invoice"] in effects_lines(effects):
            return f"charged {args['invoice']} ${args['amount']}"
        return NOT_APPLIED

    return IdempotentToolNode(
        [charge],
        verify={"charge": verify},
        on_unknown="raise",  # every unknown outcome must be settled by verify
        on_earlier_call=scenario.get("on_earlier_call", "ask"),
        lease_seconds=float(scenario.get("lease_seconds", 300.0)),
        wait_seconds=float(scenario.get("wait_seconds", 20.0)),
        poll_seconds=0.05,
    )


def _barrier(spec: dict[str, Any] | None) -> None:
    if not spec:
        return
    folder = Path(spec["dir"])
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while len(list(folder.glob("ready-*"))) < int(spec["n"]):
        if time.monotonic() > deadline:
            raise TimeoutError("barrier: the other resumers never showed up")
        time.sleep(0.005)


async def run_scenario(scenario: dict[str, Any]) -> dict[str, Any]:
    """Run one phase in this process; returns what the parent compares."""
    phase = scenario["phase"]
    config = {"configurable": {"thread_id": scenario.get("thread_id", "t1")}}
    inputs: list[str] = scenario["inputs"]
    crash_at = scenario.get("crash_at") if phase == "run" else None
    async with AsyncSqliteSaver.from_conn_string(scenario["db"]) as saver:
        node = make_node(scenario)
        model = InvoiceModel(fixed_ids=bool(scenario.get("fixed_ids", False)))
        compile_kwargs = {"interrupt_before": ["tools"]} if phase == "prepare" else {}
        graph = build_graph(model, node, saver, **compile_kwargs)
        _barrier(scenario.get("barrier"))
        result: dict[str, Any] = {}
        if phase in ("run", "prepare"):
            for text in inputs[:1] if phase == "prepare" else inputs:
                result = await graph.ainvoke(
                    {"messages": [HumanMessage(content=text)]}, config, durability="sync"
                )
                if crash_at == "after_turn" and scenario["crash_invoice"] in text.split():
                    Path(scenario["ready_file"]).touch()
                    time.sleep(120)  # the parent SIGKILLs us here
        else:
            # The result reported is this process's own run (its branch of the thread):
            # with concurrent resumers the thread's head may be another process's.
            state = await graph.aget_state(config)
            result = state.values
            if state.next:
                result = await graph.ainvoke(None, config, durability="sync")
            seen = {m.content for m in result.get("messages", []) if isinstance(m, HumanMessage)}
            for text in inputs:
                if text not in seen:
                    result = await graph.ainvoke(
                        {"messages": [HumanMessage(content=text)]}, config, durability="sync"
                    )
        if result.get("__interrupt__"):
            raise RuntimeError(f"unexpected interrupt: {result['__interrupt__']!r}")
        entries = await saver.alist_entries(config["configurable"]["thread_id"])
        return {
            "ok": True,
            "pid": os.getpid(),
            "messages": summarize(result.get("messages", [])),
            "counters": node.counters.as_dict(),
            "ledger": [[e.tool_name, e.status.value, e.attempts] for e in entries],
        }


def uncrashed_run(base: Path, inputs: list[Any]) -> list[Any]:
    """The final messages of ``inputs`` run once, never crashed, in this process (only a
    reference for the crash tests); its database and effects file are in ``base``."""
    base.mkdir(parents=True, exist_ok=True)
    scenario = {
        "phase": "run",
        "db": str(base / "a.db"),
        "effects": str(base / "effects"),
        "inputs": inputs,
    }
    payload = asyncio.run(run_scenario(scenario))
    return list(payload["messages"])


def main() -> None:
    scenario = json.loads(sys.argv[1])
    try:
        payload = asyncio.run(run_scenario(scenario))
    except Exception as exc:
        payload = {
            "ok": False,
            "pid": os.getpid(),
            "error": type(exc).__name__,
            "bases": [c.__name__ for c in type(exc).__mro__],
            "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }
        print(json.dumps(payload), flush=True)
        sys.exit(FAILED_EXIT_CODE)
    print(json.dumps(payload), flush=True)


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    main()
