"""Graphs the server crash tests serve beside the example's ``agent``, one per front door.

``tests/test_agent_server.py`` lists them in the ``langgraph.json`` of a copy of
``examples/agent-server`` (run from that copy's directory, so the example's ``agent`` and
``payments`` modules import as they do there). Each charges through the example's
``payments`` module, and can stop at a crash point a thread's *plan* names:

* ``ours`` - ``create_agent`` with ``IdempotencyMiddleware`` (and the example's ``verify``);
* ``stock`` - ``create_agent`` without it: the control, which must show a duplicate;
* ``asking`` - ``ours`` without ``verify``: an unknown outcome is an interrupt to answer;
* ``node`` - a ``StateGraph`` whose tool node is ``IdempotentToolNode``;
* ``task`` - a Functional API ``entrypoint`` whose charges are ``idempotent_task``s.

None is given ``ledger=``: each finds the ledger through the server's checkpointer.

A plan is ``$IDEM_SERVER_WORK/plans/<thread id>.json``: ``{"crash": point, "park":
invoice}``. The call of ``park`` stops at ``before_effect`` or ``after_effect`` - or, for
``after_tools``, the model stops when it is called after the tools returned -, once per
thread (``fired/<thread id>``: not again when the server runs the thread after a
restart), writes ``parked/<thread id>`` and waits. Once the test has seen every thread
parked it creates ``kill``: the first parked call to see it SIGKILLs the server's process
group, from inside the tool (or the model). A plan's ``hang`` (``after_effect``) stops
that call after its effect, once per thread (``hung/<thread id>``), until the run is
cancelled: a run the test rolls back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.config import get_config
from langgraph.func import entrypoint
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the test's directory
import payments  # the example's: the server runs in its directory
from agent import PayModel, charge_landed
from dev_server_knobs import pick_up_runs_soon
from process_guard import exit_with_parent

from langgraph_idem_saver import (
    IdempotencyMiddleware,
    IdempotentToolNode,
    idempotent_task,
)

WORK = Path(os.environ.get("IDEM_SERVER_WORK", "."))
POLL_SECONDS = 0.05


def _plan(thread_id: str) -> dict[str, Any]:
    path = WORK / "plans" / f"{thread_id}.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _thread_id() -> str:
    return str(get_config()["configurable"]["thread_id"])


async def _stop_here(thread_id: str) -> None:
    """Say we are parked, then wait for ``kill`` and SIGKILL the server from here."""
    await asyncio.to_thread((WORK / "parked" / thread_id).write_text, "parked")
    kill = WORK / "kill"
    while not await asyncio.to_thread(kill.exists):
        await asyncio.sleep(POLL_SECONDS)
    os.killpg(os.getpgrp(), signal.SIGKILL)


async def _once(marker: Path) -> bool:
    """True the first time it is asked for ``marker`` (which it then creates)."""
    if await asyncio.to_thread(marker.exists):
        return False
    await asyncio.to_thread(marker.write_text, "x")
    return True


async def _maybe_stop(thread_id: str, point: str, invoice: str | None = None) -> None:
    plan = _plan(thread_id)
    if invoice is not None and plan.get("park") not in (None, invoice):
        return
    if plan.get("crash") == point and await _once(WORK / "fired" / thread_id):
        await _stop_here(thread_id)
    if plan.get("hang") == point and await _once(WORK / "hung" / thread_id):
        await asyncio.Event().wait()  # until the run is cancelled (rolled back)


@tool
async def charge(invoice: str, amount: int) -> str:
    """Charge an invoice."""
    thread_id = _thread_id()
    await _maybe_stop(thread_id, "before_effect", invoice)
    result = await asyncio.to_thread(payments.charge, invoice, amount)
    await _maybe_stop(thread_id, "after_effect", invoice)
    return result


class StoppingModel(PayModel):
    """The example's model; stops at ``after_tools`` when called after the tools."""

    async def _agenerate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        asked = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        if any(isinstance(m, AIMessage) and m.tool_calls for m in messages[asked:]):
            await _maybe_stop(_thread_id(), "after_tools")
        return self._generate(messages, stop, None, **kwargs)


ours = create_agent(
    StoppingModel(),
    tools=[charge],
    middleware=[IdempotencyMiddleware(verify={"charge": charge_landed})],
)
stock = create_agent(StoppingModel(), tools=[charge])
# no verify hook: an unknown outcome interrupts, and the user answers it
asking = create_agent(StoppingModel(), tools=[charge], middleware=[IdempotencyMiddleware()])


async def _model_step(state: MessagesState) -> dict[str, Any]:
    return {"messages": [await StoppingModel().ainvoke(state["messages"])]}


_builder = StateGraph(MessagesState)
_builder.add_node("model", _model_step)
_builder.add_node("tools", IdempotentToolNode([charge], verify={"charge": charge_landed}))
_builder.add_edge(START, "model")
_builder.add_conditional_edges("model", tools_condition)
_builder.add_edge("tools", "model")
node = _builder.compile()


@idempotent_task(verify=charge_landed)
async def charge_task(invoice: str, amount: int) -> str:
    """One charge, at most once per thread and arguments."""
    return str(await charge.ainvoke({"invoice": invoice, "amount": amount}))


@entrypoint()
async def task(inputs: dict[str, Any], config: RunnableConfig) -> list[str]:
    """Charge each invoice of ``inputs["invoices"]``."""
    return [await charge_task(invoice, 10) for invoice in inputs["invoices"]]


def _modules_named(path: Path) -> list[str]:
    """The names under which the module at ``path`` is imported in this process."""
    return sorted(
        name
        for name, module in list(sys.modules.items())
        if getattr(module, "__file__", None) and Path(module.__file__).resolve() == path
    )


def _example_modules() -> dict[str, list[str]]:
    here = Path.cwd().resolve()
    return {name: _modules_named(here / name) for name in ("checkpointer.py", "agent.py")}


@entrypoint()
async def modules(inputs: dict[str, Any]) -> dict[str, list[str]]:
    """Under which names the server imported the example's modules (file system calls
    in a thread: the dev server refuses blocking calls on its event loop)."""
    return await asyncio.to_thread(_example_modules)


def _refused() -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    return create_agent(StoppingModel(), tools=[charge], checkpointer=InMemorySaver())


# only listed by the test that shows the dev server refusing it
compiled_with_checkpointer = _refused()

exit_with_parent()  # the server never outlives the test run (tests/process_guard.py)
pick_up_runs_soon()  # a new run starts within 0.05 s, not 0.5-1 s (dev_server_knobs.py)
