"""The private upstream internals we rely on, each checked where it is used, so an
upgrade that changes one fails here, naming it, instead of somewhere deep in a saver.

* aiosqlite: ``Connection._execute``, ``_conn``, ``_connection``, ``_thread``,
  ``_running``, the ``(connector, iter_chunk_size)`` constructor, ``stop()`` and the
  arguments ``connect()`` closes over - all used by ``sqlite/runner.py`` only (its
  docstring says why there is no public way).
* LangGraph's ``jsonplus`` module (``_option``, ``_msgpack_enc``,
  ``_create_msgpack_ext_hook``, its ``ormsgpack`` global) and ``JsonPlusSerializer``'s
  ``_unpack_ext_hook``/``_allowed_msgpack_modules``/``_custom_unpack_ext_hook``: used by
  ``surrogates.py``, which otherwise falls back to LangGraph's lossy serializer quietly;
  the ext hook's ``importlib`` global, rebound in a rebuilt hook by ``msgpack_revive.py``.
* ``ToolNode._afunc``/``_func`` (one node run) and ``_arun_one``/``_run_one`` (one call),
  ``_parse_input``, ``_extract_state``, ``_messages_key``: overridden or called by
  ``tool_node.py``. The public ``wrap_tool_call``/``awrap_tool_call`` hooks cannot replace
  them: they see one call at a time (the ledger claims a step's calls in one transaction
  before any runs, and settles them in call order for stable ``interrupt()`` positions),
  and an exception they raise becomes an error ``ToolMessage`` under
  ``handle_tool_errors``, where a conflict or a call in progress elsewhere must reach the
  caller.
* LangGraph Agent Server's ``_CustomCheckpointerAdapter`` (``langgraph-api``): the wrapper
  it puts around a custom checkpointer keeps the saver in its instance attribute
  ``_inner``; ``checkpointer_unwrap.py`` reads it to find the ledger (no public way).
* ``langchain.agents.factory``'s composed ``wrap_tool_call`` chain (``call_inner`` with
  the free variables ``inner``/``execute``, ``composed`` with ``outer``/``inner``, each
  hook ``traceable``-wrapped around the bound method) and ``HumanInTheLoopMiddleware``'s
  state key ``hitl_edited_tool_calls``: read by ``middleware_order.py`` to refuse the
  middleware orders that defeat the ledger and to ledger the call a reviewer's edit runs.
* LangGraph's config key ``checkpoint_map`` (``CONFIG_KEY_CHECKPOINT_MAP``, private:
  ``engine/upstream.py`` is the one module that imports it) read by ``engine/forks.py``,
  and ``CONFIG_KEY_CHECKPOINTER``, public in ``langgraph.constants`` but kept there only
  "for backwards compatibility": read by the engine, adoption and ``model_record.py``.
* ``langgraph.checkpoint.serde._msgpack.SAFE_MSGPACK_TYPES``, which the msgpack reviver
  reads as that module's global at each check: ``value_copies.py`` copies only messages it
  lists, and drops its copies when it is rebound.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import sqlite3
import sys
import threading
from pathlib import Path
from typing import Any

import aiosqlite
import ormsgpack
import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.prebuilt import ToolNode
from langgraph.runtime import Runtime
from tool_node_helpers import ai_calls, tool_graph

from langgraph_idem_saver import surrogates
from langgraph_idem_saver.sqlite import runner

AIOSQLITE = f"aiosqlite {getattr(aiosqlite, '__version__', '?')}"
LANGGRAPH_SERDE = "langgraph-checkpoint's jsonplus"


def changed(upstream: str, what: str, user: str) -> str:
    return (
        f"{upstream} changed {what}, which {user} relies on: adapt that module (and the "
        "version pin in pyproject.toml) to the new release"
    )


# --- aiosqlite (sqlite/runner.py) -------------------------------------------------------


def test_aiosqlite_connection_has_the_private_members_the_runner_drives() -> None:
    for name in runner.REQUIRED_METHODS:
        assert hasattr(aiosqlite.Connection, name), changed(
            AIOSQLITE, f"Connection.{name} (gone)", "sqlite/runner.py"
        )
    assert inspect.iscoroutinefunction(aiosqlite.Connection._execute), changed(
        AIOSQLITE, "Connection._execute (no longer a coroutine function)", "sqlite/runner.py"
    )
    params = list(inspect.signature(aiosqlite.Connection.__init__).parameters)
    assert params[1:3] == ["connector", "iter_chunk_size"], changed(
        AIOSQLITE, f"Connection.__init__ (now {params})", "runner.BorrowedConnection"
    )


async def test_aiosqlite_runs_a_function_on_its_worker_with_the_sqlite3_connection(
    tmp_path: Path,
) -> None:
    conn = aiosqlite.connect(str(tmp_path / "x.db"), isolation_level=None)
    assert not runner.is_started(conn) and not runner.was_closed(conn), changed(
        AIOSQLITE, "_thread/_connection/_running before the connection opens", "runner"
    )
    assert not runner.is_open(conn), changed(AIOSQLITE, "_connection before it opens", "runner")
    found = runner.connect_arguments(conn)
    assert found is not None and found[0] == str(tmp_path / "x.db"), changed(
        AIOSQLITE, "the arguments connect() closes over (_connector)", "runner"
    )
    await conn
    try:
        assert runner.is_started(conn), changed(AIOSQLITE, "_thread/_connection", "runner")
        assert runner.is_open(conn), changed(AIOSQLITE, "_connection once open", "runner")
        here = threading.get_ident()

        def probe(c: sqlite3.Connection) -> tuple[bool, int, Any]:
            return (
                isinstance(c, sqlite3.Connection),
                threading.get_ident(),
                c.execute("SELECT 41 + 1").fetchone()[0],
            )

        is_sqlite3, worker, answer = await runner.run_in_worker(conn, probe)
        assert is_sqlite3 and answer == 42, changed(AIOSQLITE, "_execute/_conn", "runner")
        assert worker != here, changed(AIOSQLITE, "where _execute runs functions", "runner")
        assert runner.raw_connection(conn) is not None
    finally:
        await conn.close()
    assert runner.was_closed(conn) and not runner.is_started(conn), changed(
        AIOSQLITE, "_running/_connection after close()", "runner"
    )
    assert not runner.is_open(conn), changed(AIOSQLITE, "_connection after close()", "runner")
    with pytest.raises(ValueError):  # the saver turns it into ConnectionClosedError
        await runner.run_in_worker(conn, lambda c: None)


async def test_a_borrowed_connection_leaves_the_callers_connection_open() -> None:
    raw = sqlite3.connect(":memory:", check_same_thread=False)
    borrowed = runner.BorrowedConnection(raw)
    await borrowed
    assert await runner.run_in_worker(borrowed, lambda c: c is raw), changed(
        AIOSQLITE, "the connector the constructor takes", "runner.BorrowedConnection"
    )
    await borrowed.close()
    assert raw.execute("SELECT 1").fetchone() == (1,), changed(
        AIOSQLITE, "stop() (it closed a connection it no longer holds)", "BorrowedConnection"
    )
    raw.close()


# --- LangGraph's jsonplus (surrogates.py) -----------------------------------------------


def test_jsonplus_has_the_internals_the_lossless_serializer_copies() -> None:
    assert surrogates.AVAILABLE, changed(
        LANGGRAPH_SERDE,
        "_option/_msgpack_enc/_create_msgpack_ext_hook (without them lone surrogates are "
        "stored as '?' again)",
        "surrogates.py",
    )
    assert jsonplus._option & ormsgpack.OPT_REPLACE_SURROGATES, changed(
        LANGGRAPH_SERDE, "_option (no OPT_REPLACE_SURROGATES)", "surrogates.py"
    )
    assert jsonplus.ormsgpack is ormsgpack, changed(
        LANGGRAPH_SERDE, "how it reaches ormsgpack (a module global)", "surrogates.py"
    )
    serde = JsonPlusSerializer()
    for name in ("_unpack_ext_hook", "_allowed_msgpack_modules", "_custom_unpack_ext_hook"):
        assert hasattr(serde, name), changed(
            LANGGRAPH_SERDE, f"JsonPlusSerializer.{name}", "surrogates.py"
        )
    custom = JsonPlusSerializer(__unpack_ext_hook__=lambda code, data: None)
    assert custom._custom_unpack_ext_hook is True, changed(
        LANGGRAPH_SERDE, "_custom_unpack_ext_hook", "surrogates._custom_hook"
    )


def test_the_reviver_reads_importlib_as_a_jsonplus_global() -> None:
    from langgraph_idem_saver import msgpack_revive

    assert msgpack_revive.available(), changed(
        LANGGRAPH_SERDE,
        "_create_msgpack_ext_hook's ext_hook (no importlib global)",
        "msgpack_revive.py",
    )
    assert jsonplus.importlib is importlib, changed(
        LANGGRAPH_SERDE, "its importlib global", "msgpack_revive.py"
    )
    # LosslessJsonPlusSerializer.loads_typed repeats this msgpack branch with the rebuilt hook
    source = " ".join(inspect.getsource(JsonPlusSerializer.loads_typed).split())
    branch = (
        'elif type_ == "msgpack": return ormsgpack.unpackb( data_, '
        "ext_hook=self._unpack_ext_hook, option=ormsgpack.OPT_NON_STR_KEYS )"
    )
    assert branch in source, changed(
        LANGGRAPH_SERDE, "JsonPlusSerializer.loads_typed's msgpack branch", "surrogates.py"
    )


def test_the_private_encoder_copy_writes_langgraphs_very_bytes() -> None:
    value = {"messages": [AIMessage("hi", id="a")], "n": [1, 2.5, None], "s": "é"}
    ours = surrogates.lossless(JsonPlusSerializer())
    assert type(ours) is surrogates.LosslessJsonPlusSerializer
    assert ours.dumps_typed(value) == JsonPlusSerializer().dumps_typed(value), changed(
        LANGGRAPH_SERDE, "_msgpack_enc (the copy no longer matches it)", "surrogates.py"
    )
    lone = {"text": "a\ud800b", "nested": [ToolMessage("x\udfff", tool_call_id="c")]}
    type_, data = ours.dumps_typed(lone)
    assert type_ == surrogates.LOSSLESS_TYPE, changed(
        LANGGRAPH_SERDE, "how _msgpack_enc packs nested values", "surrogates._EscapingMsgpack"
    )
    back = ours.loads_typed((type_, data))
    assert back["text"] == "a\ud800b" and back["nested"][0].content == "x\udfff", changed(
        LANGGRAPH_SERDE, "_create_msgpack_ext_hook", "surrogates.py"
    )


# --- ToolNode (tool_node.py) ------------------------------------------------------------

TOOL_NODE_HOOKS = {
    "_afunc": ["self", "input", "config", "runtime"],
    "_func": ["self", "input", "config", "runtime"],
    "_arun_one": ["self", "call", "input_type", "tool_runtime"],
    "_run_one": ["self", "call", "input_type", "tool_runtime"],
    "_parse_input": ["self", "input"],
    "_extract_state": ["self", "input", "config"],
}


def test_tool_node_has_the_private_methods_we_override_with_their_signatures() -> None:
    for name, params in TOOL_NODE_HOOKS.items():
        method = getattr(ToolNode, name, None)
        assert method is not None, changed("langgraph-prebuilt", f"ToolNode.{name}", "tool_node")
        found = list(inspect.signature(method).parameters)[: len(params)]
        assert found == params, changed(
            "langgraph-prebuilt", f"ToolNode.{name} (now {found})", "tool_node.py"
        )
        is_async = name in ("_afunc", "_arun_one")
        assert inspect.iscoroutinefunction(method) is is_async, changed(
            "langgraph-prebuilt", f"ToolNode.{name} (sync/async)", "tool_node.py"
        )
    assert ToolNode([])._messages_key == "messages", changed(
        "langgraph-prebuilt", "ToolNode._messages_key", "tool_node.py"
    )


class _Spy(ToolNode):
    """A ToolNode recording which of our hooks LangGraph's own code went through."""

    seen: list[str]

    # typed as ToolNode's: LangGraph passes config and runtime to what asks for them
    async def _afunc(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        self.seen.append("_afunc")
        return await super()._afunc(input, config, runtime)

    def _func(self, input: Any, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        self.seen.append("_func")
        return super()._func(input, config, runtime)

    async def _arun_one(self, call: Any, *args: Any) -> Any:
        self.seen.append(f"_arun_one {call['id']}")
        return await super()._arun_one(call, *args)

    def _run_one(self, call: Any, *args: Any) -> Any:
        self.seen.append(f"_run_one {call['id']}")
        return super()._run_one(call, *args)


@pytest.mark.parametrize("mode", ["async", "sync"])
async def test_tool_node_runs_each_step_and_each_call_through_the_hooks(mode: str) -> None:
    @tool
    def echo(text: str) -> str:
        """Echo."""
        return text

    node = _Spy([echo])
    node.seen = []
    state = {"messages": [ai_calls(("echo", {"text": "a"}, "c1"), ("echo", {"text": "b"}, "c2"))]}
    graph = tool_graph(node, None)
    if mode == "async":
        out = await graph.ainvoke(state)
    else:
        out = await asyncio.to_thread(graph.invoke, state)
    prefix = "_arun_one" if mode == "async" else "_run_one"
    step = "_afunc" if mode == "async" else "_func"
    assert node.seen[0] == step and sorted(node.seen[1:]) == [f"{prefix} c1", f"{prefix} c2"], (
        changed("langgraph-prebuilt", f"how ToolNode dispatches ({node.seen})", "tool_node.py")
    )
    assert [m.content for m in out["messages"][1:]] == ["a", "b"]


# --- langgraph-api's checkpointer wrapper (checkpointer_unwrap.py) ----------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="langgraph-api needs Python >= 3.11")
def test_agent_server_wraps_a_custom_checkpointer_in_an_adapter_holding_it_in_inner(
    tmp_path: Path,
) -> None:
    """The server hands graphs ``_CustomCheckpointerAdapter(inner=saver, ...)``, built by
    ``get_checkpointer`` from the ``checkpointer.path`` of ``langgraph.json``: a
    ``BaseCheckpointSaver`` (not our ledger) that forwards other attributes and keeps the
    saver as its instance attribute ``_inner``. If the class moves, is renamed, stops
    being such a wrapper or keeps the saver elsewhere, the front doors stop finding the
    ledger on the server. (Checked in a process configured as ``langgraph dev`` does:
    ``langgraph_api`` reads its settings from the environment when imported.)"""
    from agent_server_harness import adapter_facts

    where = "checkpointer_unwrap.py"
    facts = adapter_facts(tmp_path)
    wrapper = "langgraph_api._checkpointer._adapter._CustomCheckpointerAdapter"
    assert facts["class"], changed("langgraph-api", wrapper, where)
    assert facts["saver_subclass"], changed("langgraph-api", f"{wrapper}'s base class", where)
    assert facts["forwards"], changed("langgraph-api", f"{wrapper}'s __getattr__", where)
    assert facts["built_type"] == wrapper, changed(
        "langgraph-api", "what get_checkpointer() returns for a custom checkpointer", where
    )
    assert facts["inner_is_saver"], changed(
        "langgraph-api", f"where {wrapper} keeps the saver (_inner)", where
    )
    assert facts["ledger_found"], "checkpointer_unwrap.ledger_in misses the saver"
    # the example's checkpointer.py calls setup() because the server does not
    assert not facts["calls_setup"], "langgraph-api now calls setup(): update the README"
    # the server calls adelete_for_runs/adelete_thread/aprune only when overridden
    assert facts["detected"] == ["adelete_for_runs", "adelete_thread", "aprune"], changed(
        "langgraph-api", "how it detects a checkpointer's delete methods", "the savers"
    )


# --- langchain's middleware chain (middleware_order.py) -----------------------------------


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_tool_call_chain_shows_the_middlewares_inside_a_hook(mode: str) -> None:
    """``inner_middlewares(handler)`` reads the hooks listed after the calling one, and
    HITL keeps a reviewer's edit under the state key ``reviewer_edit`` reads."""
    from langchain.agents import create_agent
    from langchain.agents.middleware import (
        AgentMiddleware,
        HumanInTheLoopMiddleware,
        ToolRetryMiddleware,
    )
    from langchain.agents.middleware import human_in_the_loop as hitl_module
    from langgraph.checkpoint.memory import InMemorySaver
    from tool_node_helpers import scripted_model

    from langgraph_idem_saver.middleware_order import HITL_EDITS_KEY, inner_middlewares

    seen: dict[str, Any] = {}

    class Probe(AgentMiddleware):
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            seen.setdefault("inner", inner_middlewares(handler))
            return handler(request)

        async def awrap_tool_call(self, request: Any, handler: Any) -> Any:
            seen.setdefault("inner", inner_middlewares(handler))
            return await handler(request)

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        return "ok"

    retry, hitl = ToolRetryMiddleware(), HumanInTheLoopMiddleware({"charge": False})
    for middleware, expected in (([Probe(), retry, hitl], [retry, hitl]), ([Probe()], [])):
        seen.clear()
        agent = create_agent(
            scripted_model(ai_calls(("charge", {"invoice": "i"}, "c1")), AIMessage("done")),
            tools=[charge],
            middleware=middleware,
            checkpointer=InMemorySaver(),
        )
        config: Any = {"configurable": {"thread_id": "t"}}
        if mode == "sync":
            agent.invoke({"messages": [("user", "pay")]}, config)
        else:
            asyncio.run(agent.ainvoke({"messages": [("user", "pay")]}, config))
        assert seen["inner"] == expected, changed(
            "langchain", "how create_agent composes wrap_tool_call hooks", "middleware_order.py"
        )
    assert hitl_module._EDITED_TOOL_CALLS_KEY == HITL_EDITS_KEY, changed(
        "langchain", "HumanInTheLoopMiddleware's edited-calls state key", "middleware_order.py"
    )


# --- langchain-core: a chat model's identifying parameters (model_record.py) ---------------


def test_chat_models_name_their_identifying_parameters() -> None:
    """``model_record.model_identity`` reads ``BaseChatModel._identifying_params`` (what
    LangChain's own caches key a model by): the model name and settings that make a
    fallback model, or another temperature, another model call."""
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from langgraph_idem_saver.model_record import model_identity

    one = FakeListChatModel(responses=["a"])
    other = FakeListChatModel(responses=["b"])
    assert one._identifying_params == {"responses": ["a"]}, changed(
        "langchain-core", "BaseChatModel._identifying_params", "model_record.py"
    )
    assert model_identity(one) != model_identity(other)


# --- LangGraph's config keys (engine/upstream.py, engine/forks.py, the checkpointer key) ----


def test_langgraph_config_keys_keep_their_names() -> None:
    from langgraph import constants
    from langgraph._internal import _constants

    from langgraph_idem_saver.engine import upstream

    assert upstream.CONFIG_KEY_CHECKPOINT_MAP == "checkpoint_map", changed(
        "langgraph", "the config key of checkpoint_map", "engine/upstream.py"
    )
    assert _constants.CONFIG_KEY_CHECKPOINT_MAP == upstream.CONFIG_KEY_CHECKPOINT_MAP
    assert "CONFIG_KEY_CHECKPOINTER" in constants.__all__, changed(
        "langgraph",
        "langgraph.constants (no longer exports CONFIG_KEY_CHECKPOINTER)",
        "engine/core.py, engine/adoption.py and model_record.py",
    )
    assert constants.CONFIG_KEY_CHECKPOINTER == "__pregel_checkpointer", changed(
        "langgraph", "the config key of the checkpointer", "engine/core.py"
    )


def test_a_subgraph_task_config_carries_the_checkpointer_and_checkpoint_map() -> None:
    """What LangGraph stores under the two keys, seen from a node of a subgraph: the
    run's checkpointer, and per graph namespace from the root down the checkpoint id
    the step started from (what ``engine.forks.fork_point`` takes the branch from)."""
    from typing import TypedDict

    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.constants import CONFIG_KEY_CHECKPOINTER
    from langgraph.graph import START, StateGraph

    from langgraph_idem_saver.engine.forks import fork_point
    from langgraph_idem_saver.engine.upstream import CONFIG_KEY_CHECKPOINT_MAP

    class State(TypedDict):
        x: int

    seen: list[RunnableConfig] = []

    def inner(state: State, config: RunnableConfig) -> State:
        seen.append(config)
        return {"x": state["x"] + 1}

    sub = StateGraph(State)
    sub.add_node("inner", inner)
    sub.add_edge(START, "inner")
    root = StateGraph(State)
    root.add_node("outer", sub.compile())
    root.add_edge(START, "outer")
    saver = InMemorySaver()
    root.compile(checkpointer=saver).invoke({"x": 0}, {"configurable": {"thread_id": "t"}})

    [config] = seen
    configurable = config["configurable"]
    assert configurable.get(CONFIG_KEY_CHECKPOINTER) is saver, changed(
        "langgraph", "what a task's config holds under CONFIG_KEY_CHECKPOINTER", "engine"
    )
    checkpoint_map = configurable.get(CONFIG_KEY_CHECKPOINT_MAP)
    graph_ns = str(configurable["checkpoint_ns"]).rpartition("|")[0]
    assert isinstance(checkpoint_map, dict) and set(checkpoint_map) == {"", graph_ns}, changed(
        "langgraph", f"checkpoint_map (now {checkpoint_map!r})", "engine/forks.py"
    )
    root_ids = {
        c.config["configurable"]["checkpoint_id"]
        for c in saver.list({"configurable": {"thread_id": "t", "checkpoint_ns": ""}})
    }
    assert checkpoint_map[""] in root_ids, changed(
        "langgraph", "checkpoint_map's root entry (not a checkpoint id)", "engine/forks.py"
    )
    point = fork_point(config, "t")
    assert point is not None and point.branch == checkpoint_map[graph_ns], changed(
        "langgraph", "the config fork_point reads", "engine/forks.py"
    )


# --- langgraph dev's save interval (tests/dev_server_knobs.py) --------------------------


@pytest.mark.skipif(sys.version_info < (3, 11), reason="langgraph-api needs Python >= 3.11")
def test_the_dev_server_saves_on_an_interval_its_module_holds() -> None:
    """tests/dev_server_knobs.py makes ``langgraph dev`` save its runs every second by
    setting the module global its flush loop waits on. If that moves, the server tests
    would wait ten seconds per save again, or fail (``flush_often`` raises)."""
    from langgraph_runtime_inmem import _persistence

    assert isinstance(_persistence._flush_interval, int)
    assert "wait(timeout=_flush_interval)" in inspect.getsource(_persistence._flush_loop)
    # flush_often restarts the loop the import started (its first wait took 10 s)
    assert isinstance(_persistence._stores, dict)
    assert callable(_persistence.stop_flush_loop)
    assert "_flush_thread = None" in inspect.getsource(_persistence.stop_flush_loop)
    assert "_flush_thread is None" in inspect.getsource(_persistence.register_persistent_dict)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="langgraph-api needs Python >= 3.11")
def test_the_dev_server_queue_waits_half_a_second_in_runs_next() -> None:
    """tests/dev_server_knobs.py's ``pick_up_runs_soon`` replaces the in-memory queue's
    0.5 s wait (``Runs.next(wait=True)``) with a shorter one and then calls the original
    with ``wait=False``. If the wait moves elsewhere, every server test run waits 0.5-1 s
    again; if the method's shape changes, the knob's call would be wrong."""
    from langgraph_runtime_inmem import ops, queue

    upstream = inspect.getattr_static(ops.Runs, "next")
    assert isinstance(upstream, staticmethod)
    source = inspect.getsource(upstream.__func__)
    assert "if wait:\n            await asyncio.sleep(0.5)" in source
    assert list(inspect.signature(upstream.__func__).parameters) == ["wait", "limit"]
    assert "ops.Runs.next(\n                        wait=wait" in inspect.getsource(queue)


def test_the_reviver_reads_safe_msgpack_types_from_its_module_at_each_check() -> None:
    from langgraph.checkpoint.serde import _msgpack

    assert isinstance(_msgpack.SAFE_MSGPACK_TYPES, frozenset), changed(
        LANGGRAPH_SERDE, "_msgpack.SAFE_MSGPACK_TYPES", "value_copies.py"
    )
    assert ("langchain_core.messages.ai", "AIMessage") in _msgpack.SAFE_MSGPACK_TYPES
    assert getattr(jsonplus, "_lg_msgpack", None) is _msgpack, changed(
        LANGGRAPH_SERDE, "how it reaches _msgpack (a module global)", "value_copies.py"
    )
    source = inspect.getsource(jsonplus._create_msgpack_ext_hook)
    assert "_lg_msgpack.SAFE_MSGPACK_TYPES" in source, changed(
        LANGGRAPH_SERDE, "where the reviver reads its safe types", "value_copies.py"
    )
