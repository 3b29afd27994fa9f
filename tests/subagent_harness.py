"""A supervisor with two ``create_react_agent`` children, run in-process by the tests and
as a separate OS process by the crash tests (``python tests/subagent_harness.py '<json>'``).

The system (see :func:`build`):

* ``supervisor`` - a plain node that counts rounds and fans out to both agents in
  parallel on the first round, then ends with a summary of the spend;
* ``researcher`` - a ``create_react_agent`` (version v2: each tool call is its own
  ``Send`` task inside the child graph) compiled into the parent as a node;
* ``writer`` - a ``create_react_agent`` (version v1: one tool node run for the batch),
  invoked from inside a node function.

Both agents have a ``buy(item, cost)`` tool whose side effect is a line
``<agent>:<item>`` appended to the effects file (flushed, so it survives ``os._exit``)
and whose result is ``Command(update={"messages": [...], "spend": cost})``: the spend
flows into the state through an ``operator.add`` reducer, as a session budget does.
Both agents buy ``"shared"`` with the same arguments: two agents, two calls.

Topologies (``scenario["topology"]``):

* ``"parallel"`` (default) - the above;
* ``"sends"`` - the supervisor sends two tasks to the *same* ``researcher`` node; both
  researchers buy the same item, one of them after a read-only lookup step (so its
  buy runs after its sibling's has finished);
* ``"handoff"`` - the researcher buys, then hands off to the writer with a tool that
  returns ``Command(goto="writer", graph=Command.PARENT)``.

Phases, crash points and the resume loop follow ``tests/crash_harness.py``: ``run`` may
die at ``crash_at`` for the call ``crash_target`` (``"<agent>:<item>"``); ``resume``, in
a fresh process, continues the thread and answers ``unknown_tool_outcome`` interrupts as
a human who looked at the outside world would (``scenario["answer"] == "oracle"``) or
with a fixed answer. Crash points are injected from the outside (a saver subclass, a
tool that dies, a node subclass): the product code has no test hooks.
"""

from __future__ import annotations

import asyncio
import json
import operator
import os
import sys
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Annotated, Any, ClassVar

from langchain_core.messages import (
    AIMessage,
    AnyMessage,
    BaseMessage,
    HumanMessage,
    ToolMessage,
)
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import InjectedState, create_react_agent
from langgraph.prebuilt.chat_agent_executor import AgentState
from langgraph.types import Command, Send, interrupt
from pydantic import Field
from scripted_chat_model import ScriptedChatModel
from typing_extensions import TypedDict

if __package__ in (None, ""):  # run as a script: make `langgraph_idem_saver` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.tool_node import NOT_APPLIED

CRASH_EXIT_CODE = 77
COST = {"shared": 3.0, "alpha": 5.0, "beta": 7.0, "gamma": 11.0}


# --- the scripted models -----------------------------------------------------------------


class PlanModel(ScriptedChatModel):
    """A stand-in LLM following a plan: one batch of tool calls per turn, then a summary.

    ``plans`` maps the task (the last HumanMessage's content) to a list of batches, each
    a list of ``[tool_name, args]``. Like a real model it mints fresh tool-call ids on
    every generation unless ``fixed_ids`` (ids ``call_<n>``, the same in every agent).
    """

    agent: str
    plans: dict[str, list[list[list[Any]]]] = Field(default_factory=dict)
    fixed_ids: bool = False

    llm_type: ClassVar[str] = "plan"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        turn = messages[humans[-1] :] if humans else messages
        task = str(turn[0].content) if humans else ""
        plan = self.plans.get(task, [])
        done = sum(1 for m in turn if isinstance(m, AIMessage) and m.tool_calls)
        if done < len(plan):
            message = AIMessage(
                content="",
                name=self.agent,
                # fixed ids: the message id is deterministic too (it is part of the default
                # ledger key), unique per agent conversation as the conversation grows
                id=f"{self.agent}-{len(messages)}" if self.fixed_ids else None,
                tool_calls=[
                    {
                        "name": name,
                        "args": args,
                        "id": f"call_{n}" if self.fixed_ids else f"call_{uuid.uuid4().hex[:12]}",
                        "type": "tool_call",
                    }
                    for n, (name, args) in enumerate(plan[done])
                ],
            )
        else:
            results = sorted(str(m.content) for m in turn if isinstance(m, ToolMessage))
            message = AIMessage(content=f"{self.agent} done: {results}", name=self.agent)
        return ChatResult(generations=[ChatGeneration(message=message)])


# --- state -------------------------------------------------------------------------------


class SessionState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    spend: Annotated[float, operator.add]
    rounds: Annotated[int, operator.add]
    tasks: list[str]


class ChildState(AgentState):
    spend: Annotated[float, operator.add]


class SendState(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    spend: Annotated[float, operator.add]


# --- tools -------------------------------------------------------------------------------


def buy_result(agent: str, item: str, cost: float, tool_call_id: str) -> Command:
    """What ``buy`` returns (and what its verify hook / a human reports after a crash)."""
    return Command(
        update={
            "messages": [
                ToolMessage(f"{agent} bought {item} for {cost}", tool_call_id=tool_call_id)
            ],
            "spend": cost,
        }
    )


class Effects:
    """The outside world: one line per side effect, ``<agent>:<item>``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def add(self, line: str) -> None:
        with self.path.open("a") as f:
            f.write(f"{line}\n")
            f.flush()

    def lines(self) -> list[str]:
        return self.path.read_text().split() if self.path.exists() else []


class SimulatedCrash(Exception):
    """The in-process stand-in for a crash: the step fails, its writes are not saved."""


class Faults:
    """Where a ``run`` phase dies, and the rendezvous that makes calls overlap."""

    def __init__(self, scenario: dict[str, Any]) -> None:
        running = scenario.get("phase", "run") == "run"
        self.crash_at: str | None = scenario.get("crash_at") if running else None
        self.target: str = scenario.get("crash_target", "researcher:alpha")
        self.nth = int(scenario.get("crash_nth", 1))  # die at the nth hit of the target
        self.raise_only = scenario.get("crash_mode") == "raise"  # in-process: raise once
        self.approval = bool(scenario.get("approval", False))
        self.rendezvous = int(scenario.get("rendezvous", 0)) if running else 0
        self.hits = 0
        self.arrived = 0
        self.all_here = asyncio.Event()
        # per agent: its tool nodes of this process between entry and return
        self.nodes_running: Counter[str] = Counter()

    async def others_returned(self, agent: str) -> None:
        """In-process (``raise``) crashes "after the node": wait (bounded) until the
        agent's other tool nodes of the step (its ``Send`` siblings) have returned too,
        which is the state these tests describe: the step's calls all ran, its writes are
        lost. Only the agent's own: waiting for another agent's nodes (the writer, which
        runs beside the researcher) would let that agent finish its whole run first, and
        its saved writes would show in the state the test expects empty."""
        if not self.raise_only or self.crash_at != "after_node":
            return
        for _ in range(100):
            if self.nodes_running[agent] == 0:
                return
            await asyncio.sleep(0.05)

    def die(self, point: str, where: str) -> None:
        if self.crash_at != point or where != self.target:
            return
        self.hits += 1
        if self.hits != self.nth:
            return
        if self.raise_only:
            self.crash_at = None
            raise SimulatedCrash(f"{point} at {where}")
        sys.stdout.flush()
        os._exit(CRASH_EXIT_CODE)

    async def meet(self, where: str) -> None:
        """Wait (bounded) until every expected call is in flight; the target goes on at
        once while the others linger, so they are mid-call when the target dies."""
        if not self.rendezvous:
            return
        self.arrived += 1
        if self.arrived >= self.rendezvous:
            self.all_here.set()
        with suppress(TimeoutError):
            await asyncio.wait_for(self.all_here.wait(), timeout=2.0)
        if where != self.target:
            await asyncio.sleep(0.4)


def label(args: dict[str, Any]) -> str:
    """The name a crash target uses for a call: the item bought, or ``handoff``."""
    return str(args.get("item", "handoff"))


def agent_tools(agent: str, effects: Effects, faults: Faults) -> list[Any]:
    @tool
    async def buy(
        item: str, cost: float, tool_call_id: Annotated[str, InjectedToolCallId]
    ) -> Command:
        """Buy an item (the side effect under test); its cost is added to the spend."""
        where = f"{agent}:{item}"
        if faults.approval:
            answer = interrupt({"approve": where, "cost": cost})
            if answer != "yes":
                return Command(
                    update={"messages": [ToolMessage("declined", tool_call_id=tool_call_id)]}
                )
        await faults.meet(where)
        faults.die("after_issued", where)
        effects.add(where)
        faults.die("after_effect", where)
        return buy_result(agent, item, cost, tool_call_id)

    @tool
    def lookup(topic: str) -> str:
        """A pure read: safe to re-run (declared ``read_only``, it skips the ledger)."""
        return f"notes on {topic}"

    @tool
    def transfer_to_writer(
        reason: str,
        tool_call_id: Annotated[str, InjectedToolCallId],
        state: Annotated[dict[str, Any], InjectedState],
    ) -> Command:
        """Hand the conversation over to the writer agent, with this agent's spend."""
        effects.add(f"{agent}:handoff")
        return Command(
            goto="writer",
            graph=Command.PARENT,
            update={
                "messages": [
                    AIMessage(
                        "",
                        name=agent,
                        tool_calls=[
                            {
                                "name": "transfer_to_writer",
                                "args": {"reason": reason},
                                "id": tool_call_id,
                                "type": "tool_call",
                            }
                        ],
                    ),
                    ToolMessage(f"handed off: {reason}", tool_call_id=tool_call_id),
                    HumanMessage("write it up"),
                ],
                "tasks": ["write it up"],
                "spend": state.get("spend", 0.0),
            },
        )

    return [buy, lookup, transfer_to_writer]


def verify_for(agent: str, effects: Effects) -> Any:
    def verify(args: dict[str, Any]) -> Any:
        """The tool's own check: did this agent's purchase land?"""
        if f"{agent}:{args['item']}" in effects.lines():
            return buy_result(agent, args["item"], args["cost"], "unknown")
        return NOT_APPLIED

    return verify


class ToolsNode(IdempotentToolNode):
    """Our node, dying after it returned when the scenario says so (its writes lost)."""

    def __init__(self, *args: Any, agent: str, faults: Faults, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._agent = agent
        self._faults = faults

    async def _afunc(self, input: Any, config: Any, runtime: Any) -> Any:
        self._faults.nodes_running[self._agent] += 1
        try:
            out = await super()._afunc(input, config, runtime)
        finally:
            self._faults.nodes_running[self._agent] -= 1
        call = input.get("tool_call") if isinstance(input, dict) else None
        calls = [call] if call else getattr(input["messages"][-1], "tool_calls", [])
        await self._faults.others_returned(self._agent)
        for c in calls:
            self._faults.die("after_node", f"{self._agent}:{label(c['args'])}")
        return out


# --- plans -------------------------------------------------------------------------------

RESEARCH = "research the market"
WRITE = "write the report"
PLANS: dict[str, dict[str, list[list[list[Any]]]]] = {
    "researcher": {
        RESEARCH: [
            [
                ["buy", {"item": "alpha", "cost": COST["alpha"]}],
                ["buy", {"item": "shared", "cost": COST["shared"]}],
            ]
        ],
        # the "sends" siblings: same purchase, one after a read-only lookup
        "fast": [[["buy", {"item": "shared", "cost": COST["shared"]}]]],
        "slow": [
            [["lookup", {"topic": "slow"}]],
            [["buy", {"item": "shared", "cost": COST["shared"]}]],
        ],
        # the handoff: buy, then hand over to the writer
        "hand over": [
            [["buy", {"item": "alpha", "cost": COST["alpha"]}]],
            [["transfer_to_writer", {"reason": "research done"}]],
        ],
    },
    "writer": {
        WRITE: [
            [
                ["buy", {"item": "beta", "cost": COST["beta"]}],
                ["buy", {"item": "shared", "cost": COST["shared"]}],
            ]
        ],
        "write it up": [[["buy", {"item": "gamma", "cost": COST["gamma"]}]]],
    },
}


# --- the graph ---------------------------------------------------------------------------


def make_agent(
    agent: str,
    version: str,
    effects: Effects,
    faults: Faults,
    *,
    verify: bool = True,
    fixed_ids: bool = False,
    state_schema: Any = ChildState,
) -> tuple[Any, ToolsNode]:
    kwargs: dict[str, Any] = {"verify": {"buy": verify_for(agent, effects)}} if verify else {}
    node = ToolsNode(
        agent_tools(agent, effects, faults),
        agent=agent,
        faults=faults,
        read_only=["lookup"],
        **kwargs,
    )
    model = PlanModel(agent=agent, plans=PLANS[agent], fixed_ids=fixed_ids)
    graph = create_react_agent(model, node, state_schema=state_schema, version=version, name=agent)  # type: ignore[call-overload]
    return graph, node


def build(scenario: dict[str, Any], checkpointer: Any) -> tuple[Any, dict[str, ToolsNode], Effects]:
    """The supervisor graph of ``scenario["topology"]``, compiled on ``checkpointer``."""
    effects = Effects(scenario["effects"])
    faults = Faults(scenario)
    verify = scenario.get("verify", True)
    fixed_ids = scenario.get("fixed_ids", False)
    topology = scenario.get("topology", "parallel")
    researcher, r_node = make_agent(
        "researcher", "v2", effects, faults, verify=verify, fixed_ids=fixed_ids
    )
    writer, w_node = make_agent("writer", "v1", effects, faults, verify=verify, fixed_ids=fixed_ids)
    nodes = {"researcher": r_node, "writer": w_node}

    if topology == "sends":
        builder = StateGraph(SendState)
        builder.add_node("researcher", researcher)

        def fan_out(state: SendState) -> list[Send]:
            return [
                Send("researcher", {"messages": [HumanMessage(task, id=f"task-{task}")]})
                for task in ("fast", "slow")
            ]

        builder.add_conditional_edges(START, fan_out, ["researcher"])
        return builder.compile(checkpointer=checkpointer), nodes, effects

    async def supervisor(state: SessionState) -> dict[str, Any]:
        if state.get("rounds", 0) == 0:
            return {"rounds": 1}
        spend = state.get("spend", 0.0)
        return {
            "rounds": 1,
            "messages": [AIMessage(f"supervisor: spent {spend}", name="supervisor")],
        }

    def route(state: SessionState) -> Any:
        if state.get("rounds", 0) > 1:
            return END
        if topology == "handoff":
            return "researcher"
        return ["researcher", "writer"]

    async def run_writer(state: SessionState, config: RunnableConfig) -> dict[str, Any]:
        """The writer is invoked from inside a node: only its task goes in, only its
        answer and spend come out (per-agent context, spend counted once)."""
        task = state.get("tasks", [WRITE])[-1]
        out = await writer.ainvoke({"messages": [HumanMessage(task, id=f"task-{task}")]}, config)
        return {"messages": [out["messages"][-1]], "spend": out.get("spend", 0.0)}

    builder = StateGraph(SessionState)
    builder.add_node("supervisor", supervisor)
    builder.add_node("writer", run_writer)
    builder.add_edge(START, "supervisor")
    builder.add_conditional_edges("supervisor", route, ["researcher", "writer", END])
    builder.add_edge("writer", "supervisor")
    builder.add_node("researcher", researcher)
    if topology != "handoff":  # there the researcher always hands off (Command.PARENT)
        builder.add_edge("researcher", "supervisor")
    return builder.compile(checkpointer=checkpointer), nodes, effects


def inputs_of(scenario: dict[str, Any]) -> dict[str, Any]:
    topology = scenario.get("topology", "parallel")
    if topology == "sends":
        return {"messages": []}
    task = "hand over" if topology == "handoff" else RESEARCH
    return {"messages": [HumanMessage(task, id="task-0")], "tasks": [WRITE]}


# --- running -----------------------------------------------------------------------------


def summarize(messages: list[BaseMessage]) -> list[Any]:
    """Messages without ids: what an uncrashed run and a resumed one must agree on."""
    out: list[Any] = []
    for m in messages:
        if isinstance(m, AIMessage):
            calls = sorted(json.dumps([c["name"], c["args"]], sort_keys=True) for c in m.tool_calls)
            out.append(["ai", m.name, m.content, calls])
        elif isinstance(m, ToolMessage):
            out.append(["tool", m.name, m.content, m.status])
        else:
            out.append([m.type, m.content])
    return out


def oracle_answer(question: dict[str, Any], effects: Effects) -> dict[str, Any]:
    """A human who checks the outside world for the agent the interrupt names."""
    agent = question["agent_path"].split("|")[0]
    item = question["args"]["item"]
    if f"{agent}:{item}" in effects.lines():
        done = buy_result(agent, item, question["args"]["cost"], question["tool_call_id"])
        return {"action": "completed", "result": done, "key": question["key"]}
    return {"action": "rerun", "key": question["key"]}


async def drive(
    graph: Any, scenario: dict[str, Any], effects: Effects, config: dict[str, Any]
) -> tuple[dict[str, Any], list[Any]]:
    """Run (phase ``run``) or resume the thread to the end, answering interrupts."""
    durability = scenario.get("durability", "sync")
    interrupts: list[Any] = []
    if scenario.get("phase", "run") == "run":
        result = await graph.ainvoke(inputs_of(scenario), config, durability=durability)
    else:
        state = await graph.aget_state(config)
        payload = None if state.values else inputs_of(scenario)
        result = await graph.ainvoke(payload, config, durability=durability)
    while result.get("__interrupt__"):
        answers = {}
        for i in result["__interrupt__"]:
            interrupts.append(i.value)
            answer = scenario.get("answer", "oracle")
            answers[i.id] = oracle_answer(i.value, effects) if answer == "oracle" else answer
        result = await graph.ainvoke(Command(resume=answers), config, durability=durability)
    return result, interrupts


def crashing(cls: type) -> type:
    """The real saver class, dying at the ledger points a scenario names."""

    class CrashingSaver(cls):  # type: ignore[valid-type,misc]
        faults: Faults | None = None
        items: ClassVar[dict[str, str]] = {}  # ledger key -> crash target name

        def before_claim(self, intents: Any) -> None:
            for intent in intents:
                target = f"{intent.agent_path.split('|')[0]}:{label(json.loads(intent.args))}"
                if self.faults is not None:
                    self.faults.die("before_issued", target)
                self.items[intent.key] = target

        async def aclaim(self, intents: Any, **kwargs: Any) -> Any:
            self.before_claim(intents)
            return await super().aclaim(intents, **kwargs)

        async def aclaim_step(self, intents: Any, lookup: Any, **kwargs: Any) -> Any:
            """A step's claim (with adoption's read, in one trip): the same crash point."""
            self.before_claim(intents)
            return await super().aclaim_step(intents, lookup, **kwargs)

        def record_outcome(self, scope: str, key: str, **kwargs: Any) -> Any:
            """A call's outcome: committed once its answer is awaited."""
            written = super().record_outcome(scope, key, **kwargs)

            async def then_die() -> None:
                await written
                if self.faults is not None:
                    self.faults.die("after_completed", self.items.get(key, ""))

            return then_die()

        def record_outcome_rows(self, rows: Any) -> Any:
            """Outcomes of a ToolNode step sent together: committed once awaited; the
            point is each row's (``KEY`` of ``held_outcomes.OutcomeParams``)."""
            written = super().record_outcome_rows(rows)

            async def then_die() -> Any:
                errors = await written
                if self.faults is not None:
                    for row, error in zip(rows, errors, strict=True):
                        if error is None:  # committed
                            self.faults.die("after_completed", self.items.get(row[6], ""))
                return errors

            return then_die()

    return CrashingSaver


@asynccontextmanager
async def open_saver(scenario: dict[str, Any]) -> AsyncIterator[Any]:
    if scenario.get("backend", "sqlite") == "postgres":
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        async with crashing(AsyncPostgresSaver).from_conn_string(scenario["db"]) as saver:
            yield saver
    else:
        from langgraph_idem_saver import AsyncSqliteSaver

        async with crashing(AsyncSqliteSaver).from_conn_string(scenario["db"]) as saver:
            yield saver


async def main(scenario: dict[str, Any]) -> dict[str, Any]:
    config = {"configurable": {"thread_id": scenario.get("thread_id", "chat-1")}}
    async with open_saver(scenario) as saver:
        graph, nodes, effects = build(scenario, saver)
        faults = nodes["researcher"]._faults
        saver.faults = faults if faults.crash_at else None
        result, interrupts = await drive(graph, scenario, effects, config)
        thread = config["configurable"]["thread_id"]
        entries = await saver.alist_entries(thread)
        return {
            "messages": summarize(result["messages"]),
            "spend": result.get("spend", 0.0),
            "rounds": result.get("rounds", 0),
            "interrupts": interrupts,
            "ledger": sorted(
                [e.agent_path, e.tool_name, e.status.value, e.adopted_by is not None]
                for e in entries
            ),
            "counters": {a: n.counters.as_dict() for a, n in nodes.items()},
        }


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1]))), default=str))
