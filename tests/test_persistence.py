"""State written by one process is read back by fresh processes, from the same SQLite file.

A child process runs two chat turns and stops a second graph at an ``interrupt()``, then
dies with ``os._exit`` without closing the connection (what commits must survive); a
second, fresh process reads that state, adds a turn and resumes the interrupt; finally
the test process reopens the file and checks everything, via the graph and the saver.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import zygote
from conftest import REPO_ROOT, sqlite_saver_class

WORKER = r"""
import asyncio, json, operator, os, sys
from typing import Annotated, Any

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, interrupt
from typing_extensions import TypedDict


def saver_class():
    if os.environ.get("IDEM_TEST_SAVER") == "official":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    else:
        from langgraph_idem_saver import AsyncSqliteSaver
    return AsyncSqliteSaver


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def bot(state: Chat) -> dict[str, Any]:
    return {"messages": [AIMessage(f"pid-independent reply to {state['messages'][-1].content}")]}


def chat_graph(saver):
    b = StateGraph(Chat)
    b.add_node("bot", bot)
    b.add_edge(START, "bot")
    b.add_edge("bot", END)
    return b.compile(checkpointer=saver)


class Approval(TypedDict):
    log: Annotated[list[str], operator.add]


def ask(state: Approval) -> dict[str, Any]:
    return {"log": [f"answer:{interrupt('approve?')}"]}


def approval_graph(saver):
    b = StateGraph(Approval)
    b.add_node("ask", ask)
    b.add_edge(START, "ask")
    b.add_edge("ask", END)
    return b.compile(checkpointer=saver)


CHAT = {"configurable": {"thread_id": "chat"}}
APPROVAL = {"configurable": {"thread_id": "approval"}}


def texts(messages):
    return [(m.type, m.content) for m in messages]


async def write(path):
    ctx = saver_class().from_conn_string(path)
    saver = await ctx.__aenter__()
    chat = chat_graph(saver)
    for text in ["first", "second"]:
        await chat.ainvoke({"messages": [HumanMessage(text)]}, CHAT)
    out = await approval_graph(saver).ainvoke({"log": []}, APPROVAL)
    print(json.dumps({"interrupted": "__interrupt__" in out, "pid": os.getpid()}), flush=True)
    os._exit(0)  # no close, no cleanup: what was committed must be on disk


async def resume(path):
    async with saver_class().from_conn_string(path) as saver:
        chat = chat_graph(saver)
        before = texts((await chat.aget_state(CHAT)).values["messages"])
        await chat.ainvoke({"messages": [HumanMessage("third")]}, CHAT)
        approval = approval_graph(saver)
        pending = (await approval.aget_state(APPROVAL)).next
        out = await approval.ainvoke(Command(resume="granted"), APPROVAL)
        print(json.dumps({"before": before, "pending": list(pending), "log": out["log"],
                          "pid": os.getpid()}))


if __name__ == "__main__":
    asyncio.run({"write": write, "resume": resume}[sys.argv[1]](sys.argv[2]))
"""


def run_worker(script: Path, mode: str, db: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    proc = zygote.run(
        [sys.executable, str(script), mode, str(db)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, f"{mode} worker failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def load_worker(script: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location("persistence_worker", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_state_survives_processes(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    db = tmp_path / "shared.sqlite"

    wrote = run_worker(script, "write", db)
    assert wrote["interrupted"] is True
    assert db.exists() and db.stat().st_size > 0

    resumed = run_worker(script, "resume", db)
    assert resumed["pid"] != wrote["pid"] != os.getpid()
    assert resumed["before"] == [
        ["human", "first"],
        ["ai", "pid-independent reply to first"],
        ["human", "second"],
        ["ai", "pid-independent reply to second"],
    ]
    assert resumed["pending"] == ["ask"]
    assert resumed["log"] == ["answer:granted"]

    worker = load_worker(script)
    async with sqlite_saver_class().from_conn_string(str(db)) as saver:
        chat = worker.chat_graph(saver)
        state = await chat.aget_state(worker.CHAT)
        assert worker.texts(state.values["messages"]) == [
            ("human", "first"),
            ("ai", "pid-independent reply to first"),
            ("human", "second"),
            ("ai", "pid-independent reply to second"),
            ("human", "third"),
            ("ai", "pid-independent reply to third"),
        ]
        assert state.next == ()
        history = [s async for s in chat.aget_state_history(worker.CHAT)]
        assert len(history) == 3 * 3  # input, loop (bot next), loop (done) per turn
        assert [s.metadata["step"] for s in history] == list(range(7, -2, -1))

        approval = await worker.approval_graph(saver).aget_state(worker.APPROVAL)
        assert approval.values == {"log": ["answer:granted"]}
        assert approval.next == () and approval.interrupts == ()

        # the saver API agrees with the graph's view
        latest = await saver.aget_tuple(worker.CHAT)
        assert latest is not None
        assert (
            latest.config["configurable"]["checkpoint_id"]
            == (state.config["configurable"]["checkpoint_id"])
        )
        assert len([t async for t in saver.alist(worker.CHAT)]) == 9


async def test_reopen_in_same_process(tmp_path: Path) -> None:
    """Writes through one connection are read back through a new one to the same file."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    db = str(tmp_path / "reopen.sqlite")
    cls = sqlite_saver_class()
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    cp = generate_checkpoint(channel_values={"a": [1, "zoë"]}, channel_versions={"a": 1})
    async with cls.from_conn_string(db) as first:
        stored = await first.aput(config, cp, {"source": "input", "step": -1}, {"a": 1})
        await first.aput_writes(stored, [("a", {"pending": True})], "task-1")
    async with cls.from_conn_string(db) as second:
        tup = await second.aget_tuple(config)
        assert tup is not None
        assert tup.config["configurable"]["checkpoint_id"] == cp["id"]
        assert tup.checkpoint["channel_values"] == {"a": [1, "zoë"]}
        assert tup.metadata == {"source": "input", "step": -1}
        assert tup.pending_writes == [("task-1", "a", {"pending": True})]
        await second.setup()  # idempotent on an existing database
        assert (await second.aget_tuple(config)) == tup
