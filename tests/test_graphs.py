"""Real compiled LangGraph graphs on our saver, observed exactly as on ``InMemorySaver``.

Each scenario is one async function of a checkpointer that drives a graph and returns
what a user can observe (results, state, history), normalized to drop what is random by
design (message ids, checkpoint ids, timestamps, task ids in namespaces). Every test
asserts that scenario(our saver) == scenario(InMemorySaver()) *and* checks the expected
behaviour explicitly, so a bug shared by both could not pass either.
"""

from __future__ import annotations

import asyncio
import operator
import uuid
from typing import Annotated, Any

import pytest
from delta_extend import extend
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.message import add_messages
from langgraph.types import Command, Interrupt, StateSnapshot, interrupt
from line_graph import line_graph
from tool_node_helpers import cfg
from typing_extensions import TypedDict

# --------------------------------------------------------------------------- normalizing


def norm(value: Any) -> Any:
    if isinstance(value, BaseMessage):
        return (value.type, value.content)
    if isinstance(value, Interrupt):
        return ("interrupt", norm(value.value))
    if isinstance(value, dict):
        return {k: norm(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [norm(v) for v in value]
    return value


def norm_ns(ns: str) -> str:
    """'child:<task id>|grandchild:<task id>' -> 'child|grandchild' (task ids are random)."""
    return "|".join(part.split(":")[0] for part in ns.split("|")) if ns else ""


def snap(s: StateSnapshot) -> dict[str, Any]:
    metadata = s.metadata or {}
    return {
        "values": norm(s.values),
        "next": s.next,
        "step": metadata.get("step"),
        "source": metadata.get("source"),
        "ns": norm_ns(s.config["configurable"].get("checkpoint_ns", "")),
        "has_parent": s.parent_config is not None,
        "tasks": [
            {
                "name": t.name,
                "interrupts": norm(list(t.interrupts)),
                "state": snap(t.state) if isinstance(t.state, StateSnapshot) else None,
            }
            for t in s.tasks
        ],
        "interrupts": norm(list(s.interrupts)),
    }


async def history(graph: Any, config: dict[str, Any]) -> list[dict[str, Any]]:
    return [snap(s) async for s in graph.aget_state_history(config)]


# --------------------------------------------------------------------------- graphs


class ChatState(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]
    turns: Annotated[int, operator.add]


def bot(state: ChatState) -> dict[str, Any]:
    last = state["messages"][-1]
    n = len(state["messages"])
    return {"messages": [AIMessage(f"reply {n} to {last.content}")], "turns": 1}


def chat_graph(checkpointer: Any) -> Any:
    return line_graph(ChatState, checkpointer, bot=bot)


class ApprovalState(TypedDict):
    request: str
    decision: str
    log: Annotated[list[str], operator.add]


def ask(state: ApprovalState) -> dict[str, Any]:
    answer = interrupt({"question": f"approve {state['request']}?"})
    return {"decision": answer, "log": [f"asked:{answer}"]}


def act(state: ApprovalState) -> dict[str, Any]:
    return {"log": [f"acted:{state['decision']}"]}


def approval_graph(checkpointer: Any) -> Any:
    return line_graph(ApprovalState, checkpointer, ask=ask, act=act)


class ParentState(TypedDict):
    log: Annotated[list[str], operator.add]


def child_graph() -> Any:
    def child_prepare(state: ParentState) -> dict[str, Any]:
        return {"log": ["child:prepared"]}

    def child_confirm(state: ParentState) -> dict[str, Any]:
        answer = interrupt("child needs input")
        return {"log": [f"child:got:{answer}"]}

    return line_graph(ParentState, child_prepare=child_prepare, child_confirm=child_confirm)


def parent_graph(checkpointer: Any) -> Any:
    def before(state: ParentState) -> dict[str, Any]:
        return {"log": ["parent:before"]}

    def after(state: ParentState) -> dict[str, Any]:
        return {"log": ["parent:after"]}

    return line_graph(ParentState, checkpointer, before=before, child=child_graph(), after=after)


# --------------------------------------------------------------------------- scenarios


async def chat_turns(checkpointer: Any) -> dict[str, Any]:
    graph = chat_graph(checkpointer)
    config = cfg("chat")
    results = []
    for text in ["hi", "how are you", "bye"]:
        out = await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
        results.append(norm(out))
    state = await graph.aget_state(config)
    return {"results": results, "state": snap(state), "history": await history(graph, config)}


async def approval_flow(checkpointer: Any) -> dict[str, Any]:
    graph = approval_graph(checkpointer)
    config = cfg("approval")
    first = await graph.ainvoke({"request": "refund", "decision": "", "log": []}, config)
    paused = await graph.aget_state(config)
    second = await graph.ainvoke(Command(resume="yes"), config)
    return {
        "first": norm(first),
        "paused": snap(paused),
        "second": norm(second),
        "final": snap(await graph.aget_state(config)),
        "history": await history(graph, config),
    }


async def subgraph_flow(checkpointer: Any) -> dict[str, Any]:
    graph = parent_graph(checkpointer)
    config = cfg("nested")
    first = await graph.ainvoke({"log": []}, config)
    paused = await graph.aget_state(config, subgraphs=True)
    second = await graph.ainvoke(Command(resume="ok"), config)
    namespaces = sorted(
        {
            norm_ns(t.config["configurable"]["checkpoint_ns"])
            async for t in checkpointer.alist(config)
        }
    )
    return {
        "first": norm(first),
        "paused": snap(paused),
        "second": norm(second),
        "final": snap(await graph.aget_state(config, subgraphs=True)),
        "namespaces": namespaces,
        "history": await history(graph, config),
    }


async def time_travel(checkpointer: Any) -> dict[str, Any]:
    graph = chat_graph(checkpointer)
    config = cfg("travel")
    for text in ["one", "two", "three"]:
        await graph.ainvoke({"messages": [HumanMessage(text)]}, config)
    past = [s async for s in graph.aget_state_history(config)]
    # the checkpoint right after the first turn finished: 2 messages, nothing next
    after_first = next(s for s in past if len(s.values["messages"]) == 2 and not s.next)
    replay = await graph.aget_state(after_first.config)
    forked = await graph.ainvoke({"messages": [HumanMessage("alt two")]}, after_first.config)
    latest = await graph.aget_state(config)
    return {
        "replay": snap(replay),
        "forked": norm(forked),
        "latest": snap(latest),
        "fork_parent_is_past": latest.parent_config is not None
        and (await graph.aget_state(latest.parent_config)).parent_config is not None,
        "history": await history(graph, config),
    }


async def update_state_flow(checkpointer: Any) -> dict[str, Any]:
    graph = chat_graph(checkpointer)
    config = cfg("update")
    await graph.ainvoke({"messages": [HumanMessage("hello")]}, config)
    updated_config = await graph.aupdate_state(
        config, {"messages": [AIMessage("injected by operator")], "turns": 10}, as_node="bot"
    )
    after_update = await graph.aget_state(config)
    out = await graph.ainvoke({"messages": [HumanMessage("again")]}, config)
    return {
        "updated_is_latest": updated_config["configurable"]["checkpoint_id"]
        == after_update.config["configurable"]["checkpoint_id"],
        "after_update": snap(after_update),
        "out": norm(out),
        "history": await history(graph, config),
    }


async def durability_flow(checkpointer: Any, durability: str) -> dict[str, Any]:
    graph = approval_graph(checkpointer)
    config = cfg(f"durable-{durability}")
    first = await graph.ainvoke(
        {"request": "ship", "decision": "", "log": []}, config, durability=durability
    )
    second = await graph.ainvoke(Command(resume="no"), config, durability=durability)
    return {
        "first": norm(first),
        "second": norm(second),
        "final": snap(await graph.aget_state(config)),
        "history": await history(graph, config),
    }


async def compare(scenario: Any, saver: Any, *args: Any) -> dict[str, Any]:
    ours = await scenario(saver, *args)
    reference = await scenario(InMemorySaver(), *args)
    assert ours == reference
    return ours


# --------------------------------------------------------------------------- tests


async def test_chat_messages_over_turns(saver: Any) -> None:
    got = await compare(chat_turns, saver)
    assert got["results"][-1]["messages"] == [
        ("human", "hi"),
        ("ai", "reply 1 to hi"),
        ("human", "how are you"),
        ("ai", "reply 3 to how are you"),
        ("human", "bye"),
        ("ai", "reply 5 to bye"),
    ]
    assert got["state"]["values"]["turns"] == 3
    assert got["state"]["next"] == ()
    # per turn: input (step n-1, next __start__), loop (next bot), loop (done); newest first
    assert [(h["source"], h["step"], h["next"]) for h in got["history"]] == [
        ("loop", 7, ()),
        ("loop", 6, ("bot",)),
        ("input", 5, ("__start__",)),
        ("loop", 4, ()),
        ("loop", 3, ("bot",)),
        ("input", 2, ("__start__",)),
        ("loop", 1, ()),
        ("loop", 0, ("bot",)),
        ("input", -1, ("__start__",)),
    ]
    assert [h["has_parent"] for h in got["history"]] == [True] * 8 + [False]


async def test_interrupt_and_resume(saver: Any) -> None:
    got = await compare(approval_flow, saver)
    assert got["first"]["__interrupt__"] == [("interrupt", {"question": "approve refund?"})]
    assert got["paused"]["next"] == ("ask",)
    assert got["paused"]["interrupts"] == [("interrupt", {"question": "approve refund?"})]
    assert got["second"]["log"] == ["asked:yes", "acted:yes"]
    assert got["final"]["next"] == ()
    assert got["final"]["values"]["decision"] == "yes"


async def test_subgraph_state_and_namespaces(saver: Any) -> None:
    got = await compare(subgraph_flow, saver)
    paused = got["paused"]
    assert paused["next"] == ("child",)
    (task,) = paused["tasks"]
    assert task["name"] == "child"
    child = task["state"]
    assert child is not None, "get_state(subgraphs=True) did not return the child's state"
    assert child["ns"] == "child"
    assert child["next"] == ("child_confirm",)
    assert child["values"]["log"] == ["parent:before", "child:prepared"]
    assert child["interrupts"] == [("interrupt", "child needs input")]
    # the child returns its whole state, which the parent's `add` reducer appends
    assert got["second"]["log"] == [
        "parent:before",
        "parent:before",
        "child:prepared",
        "child:got:ok",
        "parent:after",
    ]
    assert got["namespaces"] == ["", "child"]


async def test_time_travel_forks_from_old_checkpoint(saver: Any) -> None:
    got = await compare(time_travel, saver)
    assert got["replay"]["values"]["messages"] == [("human", "one"), ("ai", "reply 1 to one")]
    assert got["forked"]["messages"] == [
        ("human", "one"),
        ("ai", "reply 1 to one"),
        ("human", "alt two"),
        ("ai", "reply 3 to alt two"),
    ]
    assert got["latest"]["values"]["messages"] == got["forked"]["messages"]
    # the abandoned branch is still in the history
    assert any(("human", "three") in h["values"].get("messages", []) for h in got["history"])


async def test_update_state(saver: Any) -> None:
    got = await compare(update_state_flow, saver)
    assert got["updated_is_latest"]
    assert got["after_update"]["source"] == "update"
    assert got["after_update"]["values"]["messages"][-1] == ("ai", "injected by operator")
    assert got["after_update"]["values"]["turns"] == 11
    assert got["out"]["messages"][-1] == ("ai", "reply 4 to again")
    assert got["out"]["turns"] == 12


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
async def test_durability_modes(saver: Any, durability: str) -> None:
    got = await compare(durability_flow, saver, durability)
    assert got["first"]["__interrupt__"] == [("interrupt", {"question": "approve ship?"})]
    assert got["second"]["log"] == ["asked:no", "acted:no"]
    assert got["final"]["values"]["decision"] == "no"
    assert got["final"]["next"] == ()
    steps = [(h["source"], h["step"], h["next"]) for h in got["history"]]
    if durability == "exit":
        # only the state at each exit is saved: the interrupt, then the end
        assert steps == [("loop", 2, ()), ("loop", 0, ("ask",))]
    else:
        assert steps == [
            ("loop", 2, ()),
            ("loop", 1, ("act",)),
            ("loop", 0, ("ask",)),
            ("input", -1, ("__start__",)),
        ]


async def test_sync_invoke_from_worker_thread(saver: Any) -> None:
    graph = chat_graph(saver)
    config = cfg("sync-worker")
    run_id = str(uuid.uuid4())  # the LangGraph server puts it in `configurable`
    run_config = {"configurable": {**config["configurable"], "run_id": run_id}}
    out = await asyncio.to_thread(
        graph.invoke, {"messages": [HumanMessage("from thread")]}, run_config
    )
    assert norm(out["messages"]) == [("human", "from thread"), ("ai", "reply 1 to from thread")]
    state = await asyncio.to_thread(graph.get_state, config)
    assert norm(state.values["messages"]) == norm(out["messages"])
    # and the async side sees the same thread
    assert snap(await graph.aget_state(config)) == snap(state)
    sync_history = await asyncio.to_thread(
        lambda: [snap(s) for s in graph.get_state_history(config)]
    )
    assert sync_history == await history(graph, config)
    # the sync saver API itself, from a worker thread
    tup = await asyncio.to_thread(saver.get_tuple, config)
    assert tup is not None and tup.config == state.config
    listed = await asyncio.to_thread(lambda: list(saver.list(config, limit=2)))
    assert len(listed) == 2 and listed[0].config == state.config
    # the optional capabilities' sync forms, from a worker thread
    await asyncio.to_thread(saver.copy_thread, "sync-worker", "sync-copy")
    copied = await graph.aget_state(cfg("sync-copy"))
    assert norm(copied.values["messages"]) == norm(out["messages"])
    await asyncio.to_thread(lambda: saver.prune(["sync-copy"], strategy="keep_latest"))
    assert len([t async for t in saver.alist(cfg("sync-copy"))]) == 1
    assert copied.metadata.get("run_id") == run_id
    await asyncio.to_thread(saver.delete_for_runs, [run_id])
    assert await saver.aget_tuple(cfg("sync-copy")) is None
    await asyncio.to_thread(saver.delete_thread, "sync-worker")
    assert await saver.aget_tuple(config) is None


async def test_sync_call_on_event_loop_thread_raises_clearly(saver: Any) -> None:
    config = cfg("loop-thread")
    graph = chat_graph(saver)
    await graph.ainvoke({"messages": [HumanMessage("x")]}, config)
    with pytest.raises(asyncio.InvalidStateError, match=r"(?i)thread"):
        saver.get_tuple(config)
    with pytest.raises(asyncio.InvalidStateError, match=r"(?i)thread"):
        list(saver.list(config))
    with pytest.raises(asyncio.InvalidStateError, match=r"(?i)thread"):
        graph.invoke({"messages": [HumanMessage("y")]}, config)
    # the failed sync calls changed nothing and the saver still works
    state = await graph.aget_state(config)
    assert norm(state.values["messages"]) == [("human", "x"), ("ai", "reply 1 to x")]


async def concurrent_threads(checkpointer: Any) -> dict[str, Any]:
    graph = chat_graph(checkpointer)

    async def converse(i: int) -> None:
        for turn in range(3):
            await graph.ainvoke({"messages": [HumanMessage(f"t{i} turn {turn}")]}, cfg(f"c{i}"))

    await asyncio.gather(*(converse(i) for i in range(12)))
    return {
        f"c{i}": {
            "state": snap(await graph.aget_state(cfg(f"c{i}"))),
            "history": await history(graph, cfg(f"c{i}")),
        }
        for i in range(12)
    }


async def test_concurrent_threads_on_one_saver(saver: Any) -> None:
    got = await compare(concurrent_threads, saver)
    for i in range(12):
        messages = got[f"c{i}"]["state"]["values"]["messages"]
        assert messages[-1] == ("ai", f"reply 5 to t{i} turn 2")
        assert len(messages) == 6
        assert len(got[f"c{i}"]["history"]) == 9


# --------------------------------------------------------------------------- DeltaChannel


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=4)]


def delta_graph(checkpointer: Any) -> Any:
    def node(state: DeltaState) -> dict[str, Any]:
        return {"items": [f"n{len(state['items'])}"]}

    return line_graph(DeltaState, checkpointer, node=node)


DELTA_ITEMS = ["in0", "n1", "in1", "n3", "in2", "n5", "in3", "n7", "in4", "n9"]


async def delta_flow(checkpointer: Any) -> dict[str, Any]:
    graph = delta_graph(checkpointer)
    config = cfg("delta")
    for i in range(5):  # 10 updates: the last snapshot (8th) is not on the latest checkpoint
        await graph.ainvoke({"items": [f"in{i}"]}, config)
    return {"state": snap(await graph.aget_state(config)), "history": await history(graph, config)}


async def test_delta_channel_graph(saver: Any) -> None:
    got = await compare(delta_flow, saver)
    assert got["state"]["values"] == {"items": DELTA_ITEMS}


async def test_copy_thread_keeps_delta_channel_state(saver: Any) -> None:
    await delta_flow(saver)
    graph = delta_graph(saver)
    await saver.acopy_thread("delta", "delta-copy")
    assert (await graph.aget_state(cfg("delta-copy"))).values == {"items": DELTA_ITEMS}


async def test_prune_keep_latest_keeps_delta_channel_state(saver: Any) -> None:
    """Pruning history must not change the thread's current state.

    ``BaseCheckpointSaver.prune`` requires savers to be DeltaChannel-aware: keeping only
    the newest checkpoint and its writes loses every update since the last snapshot.
    """
    await delta_flow(saver)
    graph = delta_graph(saver)
    config = cfg("delta")
    await saver.aprune(["delta"], strategy="keep_latest")
    assert (await graph.aget_state(config)).values == {"items": DELTA_ITEMS}
    out = await graph.ainvoke({"items": ["more"]}, config)
    assert out == {"items": [*DELTA_ITEMS, "more", "n11"]}
