"""A corpus of threads as LangGraph's own savers write them, for the import tests.

Every kind of thing the official savers store: interrupts answered with
``Command(resume=...)`` (the task's ``__resume__`` write at -4 beside its ``__interrupt__``
at -3 and its ordinary writes from another ``put_writes`` call), two interrupts in one
node, a subgraph paused and answered, ``Send`` fan-outs (one paused inside a sent task,
its finished siblings' writes pending), Functional-API ``@task``s, a tool-calling agent
whose tool's interrupt was answered in one turn and waits in the next, a node that failed
(``__error__`` at -1, beside a sibling's successful writes), runs under durability
``exit``, and a ``__scheduled__`` write (-2; LangGraph defines it, its runtime does not
write it yet, so it is written through the saver's ``put_writes`` as a caller would).

:data:`THREADS` names each thread, its graph, how to fill it and how to resume it.
``afill`` runs them on an async official saver (``ainvoke``); ``fill_sync`` on a sync one
(``invoke``). Every node is a plain function, so the same graphs run both ways.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.serde.types import SCHEDULED
from langgraph.func import entrypoint, task
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode, tools_condition
from langgraph.types import Command, Send, StateSnapshot, interrupt
from line_graph import line_graph
from test_graphs import norm, norm_ns
from typing_extensions import TypedDict


class Log(TypedDict):
    log: Annotated[list[str], operator.add]


class Counts(TypedDict):
    x: int
    log: Annotated[list[str], operator.add]


# --------------------------------------------------------------------------- graphs


def two_questions(checkpointer: Any) -> Any:
    """One node asking twice (one task, two interrupts), then one that asks again."""

    def ask(state: Counts) -> dict[str, Any]:
        n = interrupt("how many?")
        sure = interrupt(f"sure about {n}?")
        return {"x": n, "log": [f"ask:{n}:{sure}"]}

    def confirm(state: Counts) -> dict[str, Any]:
        ok = interrupt(f"confirm {state['x']}?")
        return {"log": [f"confirm:{ok}"]}

    return line_graph(Counts, checkpointer, ask=ask, confirm=confirm)


def one_question(checkpointer: Any) -> Any:
    """The issue's reproduction: a node asks once and is answered with 41."""

    def ask(state: Counts) -> dict[str, Any]:
        return {"x": interrupt("how many?") + 1}

    def after(state: Counts) -> dict[str, Any]:
        return {"log": [f"after:{state['x']}"]}

    return line_graph(Counts, checkpointer, ask=ask, after=after)


def nested(checkpointer: Any) -> Any:
    """A subgraph whose node asks twice."""

    def child_ask(state: Log) -> dict[str, Any]:
        a = interrupt("child: first?")
        b = interrupt("child: second?")
        return {"log": [f"child:{a}:{b}"]}

    return line_graph(
        Log,
        checkpointer,
        before=lambda state: {"log": ["before"]},
        child=line_graph(Log, child_ask=child_ask),
        after=lambda state: {"log": ["after"]},
    )


class Fan(TypedDict):
    subjects: list[str]
    done: Annotated[list[str], operator.add]


def fan_out(checkpointer: Any) -> Any:
    """Send to one task per subject; the task for 'b' asks first."""

    def work(item: dict[str, str]) -> dict[str, Any]:
        subject = item["subject"]
        if subject == "b":
            subject = f"b:{interrupt('b needs a go')}"
        return {"done": [subject.upper()]}

    builder = StateGraph(Fan)
    builder.add_node("plan", lambda state: {})
    builder.add_node("work", work)
    builder.add_edge(START, "plan")
    builder.add_conditional_edges(
        "plan", lambda state: [Send("work", {"subject": s}) for s in state["subjects"]]
    )
    builder.add_edge("work", END)
    return builder.compile(checkpointer=checkpointer)


def functional(checkpointer: Any) -> Any:
    """The Functional API: tasks, and an interrupt in the entrypoint between them."""

    @task
    def double(n: int) -> int:
        return n * 2

    @task
    def label(n: int, answer: str) -> str:
        return f"{n}:{answer}"

    @entrypoint(checkpointer=checkpointer)
    def flow(n: int) -> str:
        doubled = double(n).result()
        answer = interrupt(f"keep {doubled}?")
        return label(doubled, answer).result()

    return flow


FAILING = {"on": True}  # the flaky node fails while this is on (the fill), not after


def flaky(checkpointer: Any) -> Any:
    """Two parallel nodes: 'steady' succeeds, 'flaky' raises (an ``__error__`` write)."""

    def flaky_node(state: Log) -> dict[str, Any]:
        if FAILING["on"]:
            raise RuntimeError("the service is down")
        return {"log": ["flaky:ok"]}

    builder = StateGraph(Log)
    builder.add_node("steady", lambda state: {"log": ["steady"]})
    builder.add_node("flaky", flaky_node)
    builder.add_edge(START, "steady")
    builder.add_edge(START, "flaky")
    builder.add_edge("steady", END)
    builder.add_edge("flaky", END)
    return builder.compile(checkpointer=checkpointer)


def counter(checkpointer: Any) -> Any:
    """A plain two-step graph (for durability 'exit' and the scheduled write)."""
    return line_graph(
        Counts,
        checkpointer,
        inc=lambda state: {"x": state["x"] + 1, "log": ["inc"]},
        ask=lambda state: {"log": [f"asked:{interrupt('go on?')}"]},
    )


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


AGENT_TURNS = [
    AIMessage(
        "",
        id="ai-1",
        tool_calls=[{"name": "charge", "args": {"invoice": "inv-1"}, "id": "c1"}],
    ),
    AIMessage("charged inv-1", id="ai-2"),
    AIMessage(
        "",
        id="ai-3",
        tool_calls=[{"name": "charge", "args": {"invoice": "inv-2"}, "id": "c2"}],
    ),
    AIMessage("charged inv-2", id="ai-4"),
]


@tool
def charge(invoice: str) -> str:
    """Charge an invoice, once a human approves."""
    answer = interrupt(f"approve charging {invoice}?")
    return f"{invoice}: {answer}"


def agent(checkpointer: Any) -> Any:
    """A tool-calling agent whose tool asks a human first (the issue's agent thread: an
    answered interrupt among messages). The model is scripted: its n-th answer is
    ``AGENT_TURNS[n]``, whatever process or saver runs it."""

    def model(state: Chat) -> dict[str, Any]:
        answered = sum(1 for m in state["messages"] if isinstance(m, AIMessage))
        return {"messages": [AGENT_TURNS[answered]]}

    builder = StateGraph(Chat)
    builder.add_node("model", model)
    builder.add_node("tools", ToolNode([charge]))
    builder.add_edge(START, "model")
    builder.add_conditional_edges("model", tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


# --------------------------------------------------------------------------- threads


@dataclass(frozen=True)
class Thread:
    """A thread of the corpus: its graph, the inputs that fill it (each a run), and the
    input that resumes it when it is left paused (None: it finished)."""

    name: str
    graph: Callable[[Any], Any]
    runs: tuple[Any, ...]
    resume: Any = None
    durability: str | None = None
    scheduled: bool = False  # write a __scheduled__ write on its latest checkpoint

    def config(self) -> dict[str, Any]:
        return {"configurable": {"thread_id": self.name}}


THREADS = (
    # the reproduction: answered with 41, finished
    Thread("answered", one_question, ({"x": 0, "log": []}, Command(resume=41))),
    Thread(
        "two-questions",
        two_questions,
        ({"x": 0, "log": []}, Command(resume=41)),
        resume=Command(resume="yes"),
    ),
    Thread(
        "two-questions-done",
        two_questions,
        ({"x": 0, "log": []}, Command(resume=7), Command(resume="yes"), Command(resume="ok")),
    ),
    Thread("nested", nested, ({"log": []}, Command(resume="a")), resume=Command(resume="b")),
    Thread(
        "send", fan_out, ({"subjects": ["a", "b", "c"], "done": []},), resume=Command(resume="go")
    ),
    Thread("send-done", fan_out, ({"subjects": ["a", "b"], "done": []}, Command(resume="go"))),
    Thread("functional", functional, (3,), resume=Command(resume="yes")),
    Thread("functional-done", functional, (5, Command(resume="no"))),
    Thread("error", flaky, ({"log": []},), resume=None),
    Thread(
        "exit",
        counter,
        ({"x": 0, "log": []},),
        resume=Command(resume="fine"),
        durability="exit",
    ),
    Thread("exit-done", counter, ({"x": 5, "log": []}, Command(resume="ok")), durability="exit"),
    Thread("scheduled", counter, ({"x": 1, "log": []}, Command(resume="ok")), scheduled=True),
    Thread(
        "agent",
        agent,
        (
            {"messages": [HumanMessage("pay inv-1", id="h-1")]},
            Command(resume="approved"),
            {"messages": [HumanMessage("now inv-2", id="h-2")]},
        ),
        resume=Command(resume="approved"),
    ),
)
# threads left paused, and what resumes each (the error thread: run again, None)
PAUSED = ("two-questions", "nested", "send", "functional", "error", "exit", "agent")


def _kwargs(thread: Thread) -> dict[str, Any]:
    return {} if thread.durability is None else {"durability": thread.durability}


def _failing_run(thread: Thread) -> bool:
    return thread.graph is flaky


async def afill(saver: Any) -> None:
    """Run every thread on an async official saver."""
    FAILING["on"] = True
    for thread in THREADS:
        graph = thread.graph(saver)
        for run in thread.runs:
            try:
                await graph.ainvoke(run, thread.config(), **_kwargs(thread))
            except RuntimeError:
                assert _failing_run(thread)
        if thread.scheduled:
            latest = await saver.aget_tuple(thread.config())
            await saver.aput_writes(latest.config, [(SCHEDULED, {"at": "later"})], "sched-task")
    FAILING["on"] = False


def fill_sync(saver: Any) -> None:
    """Run every thread on a sync official saver."""
    FAILING["on"] = True
    for thread in THREADS:
        graph = thread.graph(saver)
        for run in thread.runs:
            try:
                graph.invoke(run, thread.config(), **_kwargs(thread))
            except RuntimeError:
                assert _failing_run(thread)
        if thread.scheduled:
            latest = saver.get_tuple(thread.config())
            saver.put_writes(latest.config, [(SCHEDULED, {"at": "later"})], "sched-task")
    FAILING["on"] = False


# --------------------------------------------------------------------------- comparing


def snapshot(s: StateSnapshot) -> dict[str, Any]:
    """Everything a ``StateSnapshot`` says, comparable across savers."""
    return {
        "values": norm(s.values),
        "next": s.next,
        "config": s.config,
        "metadata": s.metadata,
        "created_at": s.created_at,
        "parent_config": s.parent_config,
        "tasks": [
            {
                "id": t.id,
                "name": t.name,
                "path": t.path,
                "error": repr(t.error) if t.error is not None else None,
                "interrupts": [(i.id, norm(i.value)) for i in t.interrupts],
                "result": norm(t.result),
                "state": snapshot(t.state) if isinstance(t.state, StateSnapshot) else t.state,
            }
            for t in s.tasks
        ],
        "interrupts": [(i.id, norm(i.value)) for i in s.interrupts],
        "ns": norm_ns(s.config["configurable"].get("checkpoint_ns", "")),
    }


async def ahistory(saver: Any, thread: Thread) -> list[dict[str, Any]]:
    """The thread's whole history as the graph reads it, and its state with subgraphs."""
    graph = thread.graph(saver)
    states = [snapshot(s) async for s in graph.aget_state_history(thread.config())]
    latest = await graph.aget_state(thread.config(), subgraphs=True)
    return [*states, snapshot(latest)]


async def aresume(saver: Any, thread: Thread) -> list[Any]:
    """Resume a paused thread with its resume input until it finishes (at most three
    times); what the graph returned each time, normalized."""
    graph, outs = thread.graph(saver), []
    for _ in range(3):
        out = await graph.ainvoke(thread.resume, thread.config(), **_kwargs(thread))
        outs.append(norm(out))
        if not (await graph.aget_state(thread.config())).next:
            break
    return outs
