"""``SqliteSaver`` and ``PostgresSaver``: the synchronous drop-ins, for programs with no
event loop (``graph.invoke`` / ``graph.stream`` in the main thread).

* LangGraph's sync checkpointer API on every way of building them (``SqliteSaver(conn)``
  over ``sqlite3.connect(path, check_same_thread=False)``, ``from_conn_string``;
  ``PostgresSaver(Connection)``, ``(ConnectionPool)``, ``from_conn_string``, pipelines),
  and LangGraph's conformance suite driven through the sync methods;
* the three front doors on sync graphs: ``IdempotentToolNode``, ``IdempotencyMiddleware``
  (``create_agent``) and ``idempotent_task`` (``@entrypoint``), with sync tools, sync
  ``verify`` hooks and interrupts;
* one file format / schema: a thread written by the async saver continued by the sync one
  and back, ledger included;
* threads sharing one saver; a real crash (``tests/sync_crash_worker.py``, killed inside a
  tool after its effect) resumed in a fresh process: each effect once;
* lifetime: ``close`` stops the saver's threads and never closes the caller's connection;
  a saver never closed still lets the process exit; typed errors for unusable inputs.
"""

from __future__ import annotations

import asyncio
import gc
import json
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import psycopg
import pytest
import zygote
from delta_extend import extend
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    CheckpointTuple,
    empty_checkpoint,
)
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.func import entrypoint
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import create_react_agent
from langgraph.types import Command, interrupt
from pg_server import fresh_dsn
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from tool_node_helpers import (
    Counter,
    ai_calls,
    cfg,
    intent_for,
    plant_unknown,
    scripted_model,
    tool_graph,
    tool_messages,
)
from typing_extensions import TypedDict

from langgraph_idem_saver import (
    NOT_APPLIED,
    CallStatus,
    ConfigError,
    ConnectionClosedError,
    IdempotencyMiddleware,
    IdempotentToolNode,
    LedgerEntry,
    idempotent_task,
)
from langgraph_idem_saver.forwarding import LIST_CHUNK
from langgraph_idem_saver.postgres import AsyncPostgresSaver, PostgresSaver
from langgraph_idem_saver.saver_base import SyncCallOnEventLoopError
from langgraph_idem_saver.sqlite import AsyncSqliteSaver, SqliteSaver

WORKER = Path(__file__).resolve().parent / "sync_crash_worker.py"

# every way of building a sync saver, by backend
HOWS = {
    "sqlite": ["conn", "from_conn_string"],
    "postgres": ["conn", "pool", "from_conn_string", "pipeline"],
}
ALL_HOWS = [f"{backend}-{how}" for backend, hows in HOWS.items() for how in hows]
# one per backend, for the tests that are about behaviour rather than construction
PLAIN = ["sqlite-conn", "postgres-conn"]


class Db:
    """A fresh database of one backend, opened as many times (and ways) as a test likes."""

    def __init__(self, backend: str, where: str) -> None:
        self.backend = backend
        self.where = where  # a file path (SQLite) or a DSN on a fresh schema (Postgres)

    @contextmanager
    def sync(self, how: str = "conn") -> Iterator[Any]:
        """A sync saver built ``how``; what the test opened for it is closed after."""
        if self.backend == "sqlite":
            if how == "from_conn_string":
                with SqliteSaver.from_conn_string(self.where) as saver:
                    yield saver
                return
            conn = sqlite3.connect(self.where, check_same_thread=False)  # LangGraph's docs
            try:
                with SqliteSaver(conn) as saver:
                    yield saver
            finally:
                conn.close()
            return
        if how in ("from_conn_string", "pipeline"):
            with PostgresSaver.from_conn_string(self.where, pipeline=how == "pipeline") as saver:
                yield saver
            return
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "prepare_threshold": 0,
            "row_factory": dict_row,
        }
        if how == "pool":
            with (
                ConnectionPool(self.where, kwargs=kwargs, min_size=1, max_size=4) as pool,
                PostgresSaver(pool) as saver,
            ):
                saver.setup()  # LangGraph's docs: call setup() once
                yield saver
            return
        with psycopg.Connection.connect(self.where, **kwargs) as conn, PostgresSaver(conn) as saver:
            saver.setup()
            yield saver

    def asynchronous(self) -> Any:
        """The async saver on the same database (an async context manager)."""
        if self.backend == "sqlite":
            return AsyncSqliteSaver.from_conn_string(self.where)
        return AsyncPostgresSaver.from_conn_string(self.where)


def new_db(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    if backend == "sqlite":
        return Db("sqlite", str(tmp_path / f"db-{time.monotonic_ns()}.sqlite"))
    return Db("postgres", fresh_dsn(request.getfixturevalue("pg_server_dsn")))


@pytest.fixture(params=ALL_HOWS)
def any_saver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    """A sync saver on a fresh database, built each possible way."""
    backend, how = str(request.param).split("-", 1)
    with new_db(backend, request, tmp_path).sync(how) as saver:
        yield saver


@pytest.fixture(params=PLAIN)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Db:
    """A fresh database, SQLite and Postgres."""
    return new_db(str(request.param).split("-", 1)[0], request, tmp_path)


@pytest.fixture
def sync_saver(db: Db) -> Iterator[Any]:
    with db.sync() as saver:
        yield saver


def entries(saver: Any, thread_id: str) -> list[LedgerEntry]:
    """The tool calls of a thread's ledger, read from a sync program (the ledger API is
    async); recorded model answers (``__model__``, tests/test_model_record.py) left out."""
    found: list[LedgerEntry] = asyncio.run(saver.alist_entries(thread_id))
    return [e for e in found if e.tool_name != "__model__"]


def saver_threads() -> list[str]:
    return sorted(
        t.name
        for t in threading.enumerate()
        if t.name in ("SqliteSaver", "PostgresSaver") or "_connection_worker_thread" in t.name
    )


# --- LangGraph's sync checkpointer API ---------------------------------------------------


def put_chain(saver: Any, thread_id: str, n: int, *, ns: str = "", run_id: str = "r1") -> list[Any]:
    """``n`` checkpoints, each the child of the one before; their configs, oldest first."""
    configs: list[Any] = []
    parent: RunnableConfig = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}
    versions: dict[str, Any] = {}
    for step in range(n):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": list(range(step + 1)), "step": step}
        versions = {
            "messages": saver.get_next_version(versions.get("messages"), None),
            "step": saver.get_next_version(versions.get("step"), None),
        }
        checkpoint["channel_versions"] = dict(versions)
        metadata: Any = {
            "source": "input" if step == 0 else "loop",
            "step": step,
            "user": {"id": 7},
            "run_id": run_id,
        }
        parent = saver.put(parent, checkpoint, metadata, dict(versions))
        configs.append(parent)
        time.sleep(0.001)  # distinct, ordered checkpoint ids (uuid6 carries a timestamp)
    return configs


def test_langgraph_sync_api(any_saver: Any) -> None:
    saver = any_saver
    c = put_chain(saver, "t", 3)
    latest = saver.get_tuple({"configurable": {"thread_id": "t"}})
    assert latest.config == c[2] and latest.parent_config == c[1]
    assert latest.checkpoint["channel_values"] == {"messages": [0, 1, 2], "step": 2}
    first = saver.get_tuple(c[0])
    assert first.checkpoint["channel_values"] == {"messages": [0], "step": 0}
    assert first.metadata["source"] == "input" and first.parent_config is None

    saver.put_writes(c[2], [("messages", "w1"), ("other", {"x": 1})], "task-1", "path")
    assert saver.get_tuple(c[2]).pending_writes == [
        ("task-1", "messages", "w1"),
        ("task-1", "other", {"x": 1}),
    ]

    ids = [t.config["configurable"]["checkpoint_id"] for t in saver.list(cfg("t"))]
    assert ids == [x["configurable"]["checkpoint_id"] for x in reversed(c)]
    assert len(list(saver.list(cfg("t"), filter={"source": "loop"}))) == 2
    assert len(list(saver.list(cfg("t"), filter={"user": {"id": 7}, "step": 0}))) == 1
    assert list(saver.list(cfg("t"), filter={"source": "nope"})) == []
    assert [t.config for t in saver.list(cfg("t"), before=c[2])] == [c[1], c[0]]
    assert [t.config for t in saver.list(cfg("t"), limit=1)] == [c[2]]
    assert list(saver.list(cfg("t"), limit=0)) == []
    put_chain(saver, "t", 1, ns="child")
    assert len(list(saver.list(None, filter={"step": 0}))) == 2  # across namespaces

    saver.copy_thread("t", "copy")
    assert len(list(saver.list(cfg("copy")))) == 4
    put_chain(saver, "runs", 2, run_id="r-gone")
    saver.delete_for_runs(["r-gone"])
    assert saver.get_tuple(cfg("runs")) is None
    saver.prune(["copy"], strategy="keep_latest")
    assert len(list(saver.list(cfg("copy"), filter={}))) == 2  # one per namespace
    saver.delete_thread("t")
    assert saver.get_tuple(cfg("t")) is None and len(list(saver.list(cfg("copy")))) == 2
    saver.setup()  # idempotent


def test_list_is_lazy_and_the_caller_may_write_while_iterating(sync_saver: Any) -> None:
    put_chain(sync_saver, "long", LIST_CHUNK + 20)
    seen = 0
    for i, _ in enumerate(sync_saver.list(cfg("long"))):
        seen += 1
        if i in (0, LIST_CHUNK - 1, LIST_CHUNK):  # before, at and after a page boundary
            put_chain(sync_saver, f"other-{i}", 1)
    assert seen == LIST_CHUNK + 20
    it = sync_saver.list(cfg("long"))
    next(it)
    it.close()  # abandoned early: the async generator behind it is closed
    assert sync_saver.get_tuple(cfg("other-0")) is not None


class SyncDriven(BaseCheckpointSaver[str]):
    """The conformance suite calls async methods; this runs each through the sync saver's
    *sync* method in a worker thread (as ``graph.invoke``'s executor does), so the suite
    checks the sync API."""

    def __init__(self, saver: Any) -> None:
        self.sync = saver

    @property  # type: ignore[override]
    def serde(self) -> Any:
        return self.sync.serde

    def get_next_version(self, current: str | None, channel: None) -> str:
        result: str = self.sync.get_next_version(current, channel)
        return result

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await asyncio.to_thread(self.sync.get_tuple, config)

    async def alist(self, config: RunnableConfig | None, **kwargs: Any) -> AsyncIterator[Any]:
        it = self.sync.list(config, **kwargs)  # filter=, before=, limit= as given
        end = object()
        while (item := await asyncio.to_thread(next, it, end)) is not end:
            yield item

    async def aput(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        result: RunnableConfig = await asyncio.to_thread(self.sync.put, *args, **kwargs)
        return result

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        await asyncio.to_thread(self.sync.put_writes, *args, **kwargs)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.sync.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.sync.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.sync.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(lambda: self.sync.prune(thread_ids, strategy=strategy))


@pytest.mark.parametrize("through", ["sync_methods", "async_methods"])
async def test_conformance_suite(
    db: Db, through: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """LangGraph's conformance suite (81 spec functions, every capability): through the
    sync methods (``SyncDriven``), and through the sync saver's own async methods, called
    from this test's loop (they hop to the saver's)."""
    server = request.getfixturevalue("pg_server_dsn") if db.backend == "postgres" else None

    async def factory() -> AsyncIterator[Any]:
        if server is None:
            fresh = Db("sqlite", str(tmp_path / f"conformance-{time.monotonic_ns()}.sqlite"))
        else:
            fresh = Db("postgres", await asyncio.to_thread(fresh_dsn, server))
        manager = fresh.sync()
        saver = await asyncio.to_thread(manager.__enter__)
        try:
            yield SyncDriven(saver) if through == "sync_methods" else saver
        finally:
            await asyncio.to_thread(manager.__exit__, None, None, None)

    registered = checkpointer_test(name=f"sync-{db.backend}-{through}")(factory)
    results: list[tuple[str, str, bool, str | None]] = []
    report = await validate(
        registered,
        progress=ProgressCallbacks(
            on_test_result=lambda cap, name, ok, err: results.append((cap, name, ok, err))
        ),
    )
    assert [f"{cap}.{name}: {err}" for cap, name, ok, err in results if not ok] == []
    assert all(r.detected for r in report.results.values())
    assert report.conformance_level() == "FULL"
    assert len(results) == 81


# --- the front doors on sync graphs (no event loop in the program) ----------------------


def charge_tools(fx: Counter, *, delay: float = 0.0) -> list[Any]:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer (a sync tool)."""
        if delay:
            time.sleep(delay)
        fx.bump(amount)
        return f"charged {amount}"

    @tool
    def approve(what: str) -> str:
        """Ask a human (LangGraph interrupt)."""
        return f"approved={interrupt(what)}"

    return [charge, approve]


def test_tool_node_with_graph_invoke_and_stream(any_saver: Any) -> None:
    saver = any_saver
    fx = Counter()
    model = scripted_model(
        ai_calls(("charge", {"amount": 1}, "c1"), ("charge", {"amount": 2}, "c2")),
        AIMessage("done", id="ai-done"),
    )
    node = IdempotentToolNode(charge_tools(fx))
    agent = create_react_agent(model, node, checkpointer=saver)
    assert threading.current_thread() is threading.main_thread()
    out = agent.invoke({"messages": [("user", "pay")]}, cfg("t"))
    assert sorted(m.content for m in tool_messages(out)) == ["charged 1", "charged 2"]
    assert sorted(fx.calls) == [1, 2]
    assert {e.status for e in entries(saver, "t")} == {CallStatus.COMPLETED}

    # time travel: re-run from the checkpoint before the tools: replayed, never re-run
    history = list(agent.get_state_history(cfg("t")))
    before_tools = next(s for s in history if s.next and "tools" in s.next)
    model2 = scripted_model(AIMessage("done again", id="ai-again"))
    node2 = IdempotentToolNode(charge_tools(fx))
    agent2 = create_react_agent(model2, node2, checkpointer=saver)
    updates = list(agent2.stream(None, before_tools.config, stream_mode="updates"))
    assert [next(iter(u)) for u in updates][-1] == "agent"
    assert {next(iter(u)) for u in updates} == {"tools", "agent"}
    assert len(fx) == 2 and node2.counters.replayed == 2 and node2.counters.executed == 0


def test_interrupts_and_unknown_outcomes(any_saver: Any) -> None:
    saver = any_saver
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(charge_tools(fx)), saver)
    msg = ai_calls(("charge", {"amount": 5}, "p1"), ("approve", {"what": "ship?"}, "p2"))
    out = graph.invoke({"messages": [msg]}, cfg("t"))
    assert out["__interrupt__"][0].value == "ship?" and fx.calls == [5]
    out = graph.invoke(Command(resume="yes"), cfg("t"))
    assert [m.content for m in tool_messages(out)] == ["charged 5", "approved=yes"]
    assert fx.calls == [5], "the charge was replayed on resume, not run again"

    # an unknown outcome (a dead process's claim): asked, answered, recorded
    call = {"name": "charge", "args": {"amount": 9}, "id": "u1", "type": "tool_call"}
    planted = asyncio.run(plant_unknown(saver, intent_for("u", call)))
    out = graph.invoke({"messages": [ai_calls(("charge", {"amount": 9}, "u1"))]}, cfg("u"))
    [question] = out["__interrupt__"]
    assert question.value["kind"] == "unknown_tool_outcome" and question.value["key"] == planted.key
    answer = {"action": "completed", "result": "found on the dashboard", "key": planted.key}
    out = graph.invoke(Command(resume=answer), cfg("u"))
    assert tool_messages(out)[-1].content == "found on the dashboard" and fx.calls == [5]
    [entry] = entries(saver, "u")
    assert entry.status is CallStatus.COMPLETED

    # a sync verify hook settles it without asking
    asyncio.run(plant_unknown(saver, intent_for("v", call)))
    asked: list[Any] = []

    def landed(args: dict[str, Any]) -> Any:
        asked.append(threading.current_thread() is threading.main_thread())
        return f"charge {args['amount']} found" if args["amount"] == 9 else NOT_APPLIED

    verified = tool_graph(IdempotentToolNode(charge_tools(fx), verify={"charge": landed}), saver)
    out = verified.invoke({"messages": [ai_calls(("charge", {"amount": 9}, "u1"))]}, cfg("v"))
    assert tool_messages(out)[-1].content == "charge 9 found" and fx.calls == [5]
    assert asked == [False], "verify ran once, in a worker thread"


def test_middleware_on_a_sync_create_agent(any_saver: Any) -> None:
    saver = any_saver
    fx = Counter()
    tools = charge_tools(fx)
    turn = [
        AIMessage(
            "",
            id="ai-charges",
            tool_calls=[{"name": "charge", "args": {"amount": 3}, "id": "m1", "type": "tool_call"}],
        ),
        AIMessage("done", id="ai-done"),
    ]
    mw = IdempotencyMiddleware()
    agent = create_agent(scripted_model(*turn), tools=tools, middleware=[mw], checkpointer=saver)
    out = agent.invoke({"messages": [("user", "pay")]}, cfg("t"))
    assert out["messages"][-1].content == "done" and fx.calls == [3]
    [entry] = entries(saver, "t")
    assert entry.status is CallStatus.COMPLETED and entry.agent_path == "tools"

    # the same call again after a lost checkpoint (a second agent on the thread replays)
    planted_call = {"name": "charge", "args": {"amount": 3}, "id": "m1", "type": "tool_call"}
    intent = intent_for("u", planted_call, checkpoint_ns="tools:x", message_id="ai-charges")
    asyncio.run(plant_unknown(saver, intent))
    mw2 = IdempotencyMiddleware()
    agent2 = create_agent(scripted_model(*turn), tools=tools, middleware=[mw2], checkpointer=saver)
    out = agent2.invoke({"messages": [("user", "pay")]}, cfg("u"))
    assert out["__interrupt__"][0].value["kind"] == "unknown_tool_outcome"
    out = agent2.invoke(Command(resume={"action": "rerun"}), cfg("u"))
    assert out["messages"][-1].content == "done" and fx.calls == [3, 3]


def test_idempotent_task_on_a_sync_entrypoint(any_saver: Any) -> None:
    fx = Counter()

    @idempotent_task
    def charge(invoice: str) -> str:
        fx.bump(invoice)
        return f"charged {invoice}"

    @entrypoint(checkpointer=any_saver)
    def pay(invoices: list[str]) -> list[str]:
        results = [charge(i).result() for i in invoices]
        answer = interrupt("confirm?")
        return [*results, answer]

    pay.invoke(["a", "b"], cfg("t"))
    assert pay.get_state(cfg("t")).interrupts[0].value == "confirm?"
    assert fx.calls == ["a", "b"]
    assert pay.invoke(Command(resume="ok"), cfg("t")) == ["charged a", "charged b", "ok"]
    assert fx.calls == ["a", "b"], "the entrypoint re-ran on resume; the tasks were replayed"
    assert [e.status for e in entries(any_saver, "t")] == [CallStatus.COMPLETED] * 2


async def test_graph_ainvoke_with_a_sync_saver(sync_saver: Any) -> None:
    """The async methods hop to the saver's loop: one saver serves both styles."""
    fx = Counter()
    graph = tool_graph(IdempotentToolNode(charge_tools(fx)), sync_saver)
    msg = {"messages": [ai_calls(("charge", {"amount": 4}, "a1"))]}
    await graph.ainvoke(msg, cfg("t"))
    out = await asyncio.to_thread(graph.invoke, msg, cfg("t"))
    assert tool_messages(out)[-1].content == "charged 4" and fx.calls == [4]


class DeltaState(TypedDict):
    items: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]
    n: int


def delta_flow(checkpointer: Any) -> list[Any]:
    """A ``DeltaChannel`` graph (LangGraph loads it with ``get_delta_channel_history``):
    runs, resumes, history, time travel and an ``update_state`` fork, all sync."""

    def step(state: DeltaState) -> dict[str, Any]:
        n = state.get("n", 0)
        return {"items": [f"s{n}:{len(state['items'])}"], "n": n + 1}

    builder = StateGraph(DeltaState)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["n"] % 4 else END, ["step", END])
    graph = builder.compile(checkpointer=checkpointer)
    config = cfg("delta")
    seen: list[Any] = [graph.invoke({"items": [f"in{i}"]}, config) for i in range(3)]
    history = list(graph.get_state_history(config))
    seen.append([(h.values, h.next) for h in history])
    seen.append(graph.invoke(None, next(h for h in history[len(history) // 2 :] if h.next).config))
    forked = graph.update_state(history[-3].config, {"items": ["edited"]})
    seen.append(graph.invoke(None, forked))
    seen.append(graph.get_state(config).values)
    return seen


def test_delta_channel_graphs_match_in_memory(sync_saver: Any) -> None:
    ours = delta_flow(sync_saver)
    assert ours == delta_flow(InMemorySaver())
    assert ours[2]["n"] == 12 and "edited" in ours[-2]["items"]


# --- one schema: async and sync continue each other's threads --------------------------


def before_tools(history: list[Any], call_id: str) -> Any:
    """The config of the checkpoint about to run the tool step of call ``call_id``."""
    return next(
        s.config
        for s in history
        if s.next == ("tools",) and s.values["messages"][-1].tool_calls[0]["id"] == call_id
    )


def test_threads_cross_between_the_async_and_the_sync_saver(db: Db) -> None:
    fx = Counter()
    node = IdempotentToolNode(charge_tools(fx))
    first = {"messages": [ai_calls(("charge", {"amount": 1}, "c1"))]}
    asking = {"messages": [ai_calls(("approve", {"what": "ok?"}, "c2"))]}
    third = {"messages": [ai_calls(("charge", {"amount": 3}, "c3"))]}

    async def async_part_one() -> None:
        async with db.asynchronous() as saver:
            graph = tool_graph(node, saver)
            await graph.ainvoke(first, cfg("t"))
            out = await graph.ainvoke(asking, cfg("t"))
            assert out["__interrupt__"][0].value == "ok?"

    asyncio.run(async_part_one())
    assert fx.calls == [1]

    with db.sync() as saver:
        graph = tool_graph(node, saver)
        assert graph.get_state(cfg("t")).interrupts[0].value == "ok?"
        out = graph.invoke(Command(resume="yes"), cfg("t"))
        assert tool_messages(out)[-1].content == "approved=yes"
        # re-run the async saver's tool step from its checkpoint: its ledger entry replays
        out = graph.invoke(None, before_tools(list(graph.get_state_history(cfg("t"))), "c1"))
        assert tool_messages(out)[-1].content == "charged 1" and fx.calls == [1]
        graph.invoke(third, cfg("t"))
        assert fx.calls == [1, 3]
        sync_count = len(list(saver.list(cfg("t"))))
        sync_messages = [m.content for m in graph.get_state(cfg("t")).values["messages"]]

    async def async_part_two() -> None:
        async with db.asynchronous() as saver:
            graph = tool_graph(node, saver)
            assert len([t async for t in saver.alist(cfg("t"))]) == sync_count
            state = await graph.aget_state(cfg("t"))
            assert [m.content for m in state.values["messages"]] == sync_messages
            history = [s async for s in graph.aget_state_history(cfg("t"))]
            out = await graph.ainvoke(None, before_tools(history, "c3"))  # sync's entry replays
            assert tool_messages(out)[-1].content == "charged 3"
            ledger = await saver.alist_entries("t")
            assert [(e.tool_call_id, e.status) for e in ledger] == [
                ("c1", CallStatus.COMPLETED),  # async
                ("c2", CallStatus.COMPLETED),  # asked in async, answered in sync
                ("c3", CallStatus.COMPLETED),  # sync
            ]

    asyncio.run(async_part_two())
    assert fx.calls == [1, 3]


# --- threads ----------------------------------------------------------------------------


def test_threads_share_one_saver(db: Db) -> None:
    """Eight threads run graphs on their own threads while four race on one call: every
    call runs once, every checkpoint lands."""
    lock = threading.Lock()
    effects: list[Any] = []

    @tool
    def charge(amount: int) -> str:
        """Charge (sync, slow enough for the racers to overlap)."""
        time.sleep(0.05)
        with lock:
            effects.append(amount)
        return f"charged {amount}"

    with db.sync() as saver:
        node = IdempotentToolNode([charge])
        graph = tool_graph(node, saver)
        errors: list[BaseException] = []
        results: list[str] = []

        def own_thread(i: int) -> None:
            try:
                for turn in range(3):
                    call = ("charge", {"amount": 100 * i + turn}, f"c{i}-{turn}")
                    graph.invoke({"messages": [ai_calls(call)]}, cfg(f"own-{i}"))
            except BaseException as exc:
                errors.append(exc)

        def racer() -> None:
            try:
                out = graph.invoke(
                    {"messages": [ai_calls(("charge", {"amount": 7}, "r"))]}, cfg("race")
                )
                results.append(tool_messages(out)[-1].content)
            except BaseException as exc:
                errors.append(exc)

        workers = [threading.Thread(target=own_thread, args=(i,)) for i in range(8)]
        workers += [threading.Thread(target=racer) for _ in range(4)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(120)
        assert errors == []
        assert sorted(effects) == sorted([7] + [100 * i + t for i in range(8) for t in range(3)])
        assert results == ["charged 7"] * 4
        for i in range(8):
            assert len(entries(saver, f"own-{i}")) == 3
            assert len(graph.get_state(cfg(f"own-{i}")).values["messages"]) == 6


# --- a real crash, in a sync program -----------------------------------------------------


@pytest.mark.parametrize(
    ("backend", "door"),
    [
        ("sqlite", "tool_node"),
        ("postgres", "tool_node"),
        ("sqlite", "middleware"),
        ("sqlite", "task"),
        ("sqlite", "stock"),
    ],
)
def test_crash_inside_a_tool_then_resume_in_a_fresh_process(
    backend: str, door: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    where = new_db(backend, request, tmp_path).where
    effects = tmp_path / "effects.txt"

    def run(crash: str) -> subprocess.CompletedProcess[str]:
        return zygote.run(
            [sys.executable, str(WORKER), backend, where, str(effects), "t", door, crash],
            capture_output=True,
            text=True,
            timeout=180,
        )

    crashed = run("after_effect")
    assert crashed.returncode == 137, crashed.stderr
    assert "inv-2" in effects.read_text().split()
    resumed = run("none")
    assert resumed.returncode == 0, resumed.stderr
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    for invoice in ("inv-1", "inv-2", "inv-3"):
        assert f"charged {invoice}" in out
    charged = sorted(effects.read_text().split())
    if door == "stock":  # the control: without the ledger the resume charges again
        assert len(charged) > 3 and charged.count("inv-2") == 2
    else:
        assert charged == ["inv-1", "inv-2", "inv-3"], "each effect exactly once"


# --- lifetime and typed errors ------------------------------------------------------------


def test_close_stops_the_threads_and_leaves_the_connection_open(tmp_path: Path) -> None:
    before = saver_threads()
    conn = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    put_chain(saver, "t", 1)
    assert saver_threads() != before
    saver.close()
    saver.close()  # idempotent
    assert saver_threads() == before
    assert conn.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
    with pytest.raises(ConnectionClosedError):
        saver.get_tuple(cfg("t"))
    with pytest.raises(ConnectionClosedError):
        asyncio.run(saver.aget_tuple(cfg("t")))
    conn.close()


def test_a_closed_borrowed_connection_has_no_worker_thread_left() -> None:
    """aiosqlite answers the stop before its worker thread returns; ``close()`` waits for
    the thread, so "close() stops the threads" holds at once, not an instant later (the
    race showed in about 1 close of 300 on a quiet host, more under load)."""
    from langgraph_idem_saver.sqlite import runner

    async def closes() -> int:
        conn = sqlite3.connect(":memory:", check_same_thread=False)
        alive = 0
        for _ in range(300):
            borrowed = runner.BorrowedConnection(conn)
            await borrowed
            await borrowed.close()
            thread = runner.worker_thread(borrowed)
            alive += thread is not None and thread.is_alive()
        conn.close()
        return alive

    assert asyncio.run(closes()) == 0


def test_postgres_close_leaves_the_callers_connection_and_pool_open(pg_dsn: str) -> None:
    before = saver_threads()
    with psycopg.Connection.connect(pg_dsn, autocommit=True) as conn:
        saver = PostgresSaver(conn)
        put_chain(saver, "t", 1)
        saver.close()
        assert saver_threads() == before
        assert conn.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
    with ConnectionPool(pg_dsn, min_size=1, max_size=2) as pool:
        with PostgresSaver(pool) as saver:
            assert saver.get_tuple(cfg("t")) is not None
        with pool.connection() as pooled:
            assert pooled.execute("SELECT 1").fetchone() == (1,)
    assert saver_threads() == before


def test_a_saver_never_closed_is_closed_when_collected(tmp_path: Path) -> None:
    before = saver_threads()
    conn = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    saver = SqliteSaver(conn)
    put_chain(saver, "t", 1)
    clone = saver.with_allowlist([("my_app", "Thing")])
    del saver, clone
    gc.collect()
    deadline = time.monotonic() + 10
    while saver_threads() != before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert saver_threads() == before
    assert conn.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
    conn.close()


def test_a_program_that_never_closes_its_savers_exits(tmp_path: Path, pg_dsn: str) -> None:
    script = f"""
import sqlite3, psycopg
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.postgres import PostgresSaver
s = SqliteSaver(sqlite3.connect({str(tmp_path / "x.db")!r}, check_same_thread=False))
p = PostgresSaver(psycopg.Connection.connect({pg_dsn!r}, autocommit=True))
s.setup(); p.setup()
print("ok")
"""
    started = time.monotonic()
    # a fresh interpreter, not a zygote child: its exit tears down every module, which a
    # zygote child skips for the preloaded ones (this package's among them)
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
    assert "Traceback" not in done.stderr
    assert time.monotonic() - started < 60


def test_unusable_sqlite_connections_are_refused(tmp_path: Path) -> None:
    before = saver_threads()
    own_thread_only = sqlite3.connect(tmp_path / "x.db")
    with pytest.raises(ConfigError, match="check_same_thread=False"):
        SqliteSaver(own_thread_only)
    own_thread_only.close()
    closed = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    closed.close()
    with pytest.raises(ConnectionClosedError):
        SqliteSaver(closed)
    with pytest.raises(TypeError):
        SqliteSaver("x.db")  # type: ignore[arg-type]
    with pytest.raises(ConfigError), SqliteSaver.from_conn_string(str(tmp_path / "no" / "x.db")):
        pass
    assert not (tmp_path / "no").exists()
    assert saver_threads() == before, "a refused saver leaves no thread behind"


def test_unusable_postgres_inputs_are_refused(pg_dsn: str) -> None:
    before = saver_threads()
    with (
        ConnectionPool(pg_dsn, min_size=1, max_size=1) as pool,
        pytest.raises(ValueError, match="Pipeline"),
    ):
        PostgresSaver(pool, pipe=object())  # type: ignore[arg-type]
    conn = psycopg.Connection.connect(pg_dsn)
    conn.close()
    with pytest.raises(ConnectionClosedError):
        PostgresSaver(conn)
    with pytest.raises(TypeError, match="AsyncPostgresSaver"):
        PostgresSaver(object())  # type: ignore[arg-type]
    with (
        pytest.raises(ConnectionClosedError),
        PostgresSaver.from_conn_string("postgresql://nobody@127.0.0.1:1/none"),
    ):
        pass
    assert saver_threads() == before


def test_a_sync_call_on_the_savers_own_loop_is_refused(sync_saver: Any) -> None:
    async def on_the_loop() -> None:
        sync_saver.get_tuple(cfg("t"))

    future = asyncio.run_coroutine_threadsafe(on_the_loop(), sync_saver.loop)
    with pytest.raises(SyncCallOnEventLoopError):
        future.result(30)


def test_with_allowlist_shares_the_loop_connection_and_ledger(sync_saver: Any) -> None:
    sync_saver.serde = JsonPlusSerializer(allowed_msgpack_modules=None)
    clone = sync_saver.with_allowlist([("my_app.models", "Invoice")])
    assert clone is not sync_saver and clone.serde is not sync_saver.serde
    assert clone.loop is sync_saver.loop and clone.saver.conn is sync_saver.saver.conn
    [stored] = put_chain(clone, "t", 1)
    assert sync_saver.get_tuple(stored) is not None
    sync_saver.close()
    with pytest.raises(ConnectionClosedError):
        clone.get_tuple(stored)


def test_pipeline_with_a_callers_connection(pg_dsn: str) -> None:
    with (
        psycopg.Connection.connect(pg_dsn, autocommit=True) as conn,
        conn.pipeline() as pipe,
        PostgresSaver(conn, pipe) as saver,
    ):
        assert saver.pipe is pipe and saver.saver.pipe is not None
        fx = Counter()
        graph = tool_graph(IdempotentToolNode(charge_tools(fx)), saver)
        graph.invoke({"messages": [ai_calls(("charge", {"amount": 2}, "p"))]}, cfg("t"))
        graph.invoke({"messages": [ai_calls(("charge", {"amount": 2}, "p"))]}, cfg("t"))
        assert fx.calls == [2] and len(entries(saver, "t")) == 1
