"""Recorded model responses in one process: what counts as the same model call, when the
model is asked anew, streaming of a replayed answer, the sync paths, ``ModelRetry``,
structured output, parallel model calls, retention, the opt-out and bad records.

A re-run of a model step is made here the way durability ``"exit"`` makes it after a
crash, without the crash (``tests/test_durable_model.py`` has the real ones): the first
run's checkpoints are lost (a saver that drops them, as a process dying before its exit
write does; the ledger in the same database keeps its rows), and the same input is sent
again.
"""

from __future__ import annotations

import asyncio
import json
import operator
import sqlite3
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    AgentMiddleware,
    AgentState,
    ModelFallbackMiddleware,
    ModelRetryMiddleware,
    SummarizationMiddleware,
)
from langchain.agents.middleware.types import ExtendedModelResponse
from langchain.agents.structured_output import ToolStrategy
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition
from langgraph.types import Command, Send
from pydantic import BaseModel
from typing_extensions import TypedDict

from langgraph_idem_saver import (
    AsyncSqliteSaver,
    ConfigError,
    CorruptRecordError,
    IdempotentToolNode,
    SqliteSaver,
    TTLConfig,
)
from langgraph_idem_saver.answer_records import AnswerRecorder
from langgraph_idem_saver.durable_model import durable_model
from langgraph_idem_saver.ledger import CallStatus
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.model_record import (
    MODEL_TOOL_NAME,
    REPLAY_EVENT,
    input_digest,
    model_identity,
)


class Losing:
    """Mixed into a real saver: while ``losing``, checkpoints and writes are not saved -
    what a process that dies before durability "exit"'s final write leaves."""

    losing = False

    @staticmethod
    def _lost(config: Any, checkpoint: Any) -> Any:
        c = config["configurable"]
        ns = c.get("checkpoint_ns", "")
        return {"configurable": {**c, "checkpoint_ns": ns, "checkpoint_id": checkpoint["id"]}}

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if self.losing:
            return self._lost(config, checkpoint)
        return await super().aput(config, checkpoint, metadata, versions)  # type: ignore[misc]

    async def aput_writes(self, config: Any, writes: Any, task_id: str, path: str = "") -> None:
        if not self.losing:
            await super().aput_writes(config, writes, task_id, path)  # type: ignore[misc]

    def put(self, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        if self.losing:
            return self._lost(config, checkpoint)
        return super().put(config, checkpoint, metadata, versions)  # type: ignore[misc]

    def put_writes(self, config: Any, writes: Any, task_id: str, path: str = "") -> None:
        if not self.losing:
            super().put_writes(config, writes, task_id, path)  # type: ignore[misc]


class LosingAsyncSaver(Losing, AsyncSqliteSaver):
    pass


class LosingSyncSaver(Losing, SqliteSaver):
    pass


class ClaimAndOutcomeSaver(LosingAsyncSaver):
    """A ledger that cannot record an answer in one commit (as a ``ToolCallLedger``
    written elsewhere): ``model_record`` falls back to an ``issued`` claim and its
    ``completed`` outcome. Our savers record in one commit (test_model_record_sqlite.py)."""

    @property
    def arecord_answer(self) -> Any:  # not an AnswerRecorder
        raise AttributeError("arecord_answer")


class Receipt(BaseModel):
    invoice: str
    paid: bool


class FakeModel(BaseChatModel):
    """Charges the invoices the last user message names, under fresh call ids, then
    answers; counts its answers; fails its first ``fail_first`` calls; with
    ``structured`` its final answer calls the ``Receipt`` tool (structured output)."""

    asked: list[str]
    fail_first: int = 0
    structured: bool = False
    delay: float = 0.0

    @property
    def _llm_type(self) -> str:
        return "fake-in-process"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tool_names=[getattr(t, "name", None) or str(t) for t in tools])

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.asked.append("x")
        time.sleep(self.delay)
        if len(self.asked) <= self.fail_first:
            raise ConnectionError("model unavailable")
        last = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        done = [m for m in messages[last:] if isinstance(m, ToolMessage)]
        invoices = [w for w in str(messages[last].content).split() if w.startswith("inv-")]
        fresh = uuid.uuid4().hex[:10]
        if done and self.structured:
            call = {"name": "Receipt", "args": {"invoice": invoices[0], "paid": True}}
            message = AIMessage("", tool_calls=[{**call, "id": f"s_{fresh}", "type": "tool_call"}])
        elif done:
            message = AIMessage(f"done: {len(done)}")
        else:
            calls = [
                {"name": "charge", "args": {"invoice": inv}, "id": f"c_{i}_{fresh}"}
                for i, inv in enumerate(invoices)
            ]
            message = AIMessage(
                "",
                tool_calls=[{**c, "type": "tool_call"} for c in calls],  # type: ignore[misc]
                usage_metadata={"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
                response_metadata={"model_name": "fake", "finish_reason": "tool_calls"},
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


def charge_tool(effects: list[str]) -> Any:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.append(invoice)
        return f"charged {invoice}"

    return charge


def agent_of(model: BaseChatModel, saver: Any, charge: Any, **options: Any) -> Any:
    extra = options.pop("more", [])
    mw = IdempotencyMiddleware(**options)
    return create_agent(model, tools=[charge], middleware=[mw, *extra], checkpointer=saver), mw


def graph_of(model: BaseChatModel, saver: Any, charge: Any) -> Any:
    """START -> agent (a node calling ``durable_model(model)``) <-> IdempotentToolNode."""
    llm = durable_model(model).bind_tools([charge])

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await llm.ainvoke(state["messages"])]}

    def agent_sync(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", RunnableLambda(agent_sync, afunc=agent))
    builder.add_node("tools", IdempotentToolNode([charge]))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition, {"tools": "tools", END: END})
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=saver)


def front_of(front: str, model: BaseChatModel, saver: Any, effects: list[str]) -> Any:
    charge = charge_tool(effects)
    return agent_of(model, saver, charge)[0] if front == "agent" else graph_of(model, saver, charge)


def cfg(thread: str = "t") -> Any:
    return {"configurable": {"thread_id": thread}}


USER = {"messages": [("user", "pay inv-1 inv-2")]}


async def lose_a_run(graph: Any, saver: Any, config: Any) -> None:
    """A run whose checkpoints are lost, as a crash under durability "exit" loses them;
    its recorded model answers and ledger entries stay."""
    saver.losing = True
    try:
        await graph.ainvoke(USER, config, durability="exit")
    finally:
        saver.losing = False
    assert (await graph.aget_state(config)).values == {}  # nothing was saved


def ids_of(messages: list[Any]) -> list[str]:
    return [tc["id"] for m in messages if isinstance(m, AIMessage) for tc in m.tool_calls]


async def model_entries(saver: Any, thread: str = "t") -> list[Any]:
    return [e for e in await saver.alist_entries(thread) if e.tool_name == MODEL_TOOL_NAME]


@pytest.mark.parametrize("front", ["agent", "graph"])
async def test_a_re_run_model_step_is_replayed(front: str, tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = front_of(front, model, saver, effects)
        await lose_a_run(graph, saver, cfg())
        assert len(model.asked) == 2  # the calls, then the answer
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 2  # both steps replayed
        assert sorted(effects) == ["inv-1", "inv-2"]  # the same ids: the tool ledger replayed them
        assert out["messages"][-1].content == "done: 2"
        entries = await model_entries(saver)
        assert [e.replays for e in entries] == [1, 1]
        recorded = next(m for m in out["messages"] if isinstance(m, AIMessage) and m.tool_calls)
        assert recorded.usage_metadata == {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8}
        assert recorded.response_metadata["model_name"] == "fake"


@pytest.mark.parametrize("front", ["agent", "graph"])
async def test_streaming_delivers_a_replayed_answer_with_a_marker(
    front: str, tmp_path: Path
) -> None:
    """``stream_mode="messages"`` gets each replayed message (one chunk), and
    ``astream_events`` an ``idem_saver_replay`` event carrying it."""
    model, effects = FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = front_of(front, model, saver, effects)
        await lose_a_run(graph, saver, cfg())
        chunks = [
            chunk
            async for chunk, _meta in graph.astream(
                USER, cfg(), stream_mode="messages", durability="exit"
            )
            if isinstance(chunk, AIMessage)
        ]
        assert len(model.asked) == 2  # nothing asked: both replayed
        assert [len(c.tool_calls) for c in chunks] == [2, 0]
        final = (await graph.aget_state(cfg())).values["messages"]
        assert ids_of(chunks) == ids_of(final)
        assert chunks[-1].content == "done: 2"

        await lose_a_run(graph, saver, cfg("e"))
        events = [
            e
            async for e in graph.astream_events(USER, cfg("e"), version="v2", durability="exit")
            if e["event"] == "on_custom_event" and e["name"] == REPLAY_EVENT
        ]
        models = [e["data"] for e in events if e["data"]["tool"] == MODEL_TOOL_NAME]
        assert len(models) == 2
        final = (await graph.aget_state(cfg("e"))).values["messages"]
        assert models[0]["tool_call_ids"] == ids_of(final)
        assert models[0]["tool_call_ids"] == ids_of([models[0]["message"]])
        assert models[1]["message"].content == "done: 2"


@pytest.mark.parametrize("front", ["agent", "graph"])
def test_sync_invoke_records_and_replays(front: str, tmp_path: Path) -> None:
    """``graph.invoke`` (``wrap_model_call``, ``DurableChatModel._generate``) with the
    sync saver."""
    model, effects = FakeModel(asked=[]), []
    with LosingSyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = front_of(front, model, saver, effects)
        saver.losing = True
        graph.invoke(USER, cfg(), durability="exit")
        saver.losing = False
        out = graph.invoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 2
        assert sorted(effects) == ["inv-1", "inv-2"]
        assert out["messages"][-1].content == "done: 2"

    async def recorded() -> list[Any]:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as reader:
            return await model_entries(reader)

    assert [e.replays for e in asyncio.run(recorded())] == [1, 1]


async def test_time_travel_asks_the_model_anew(tmp_path: Path) -> None:
    """Resuming from a checkpoint before the model step is a new line of history (a
    later step): the model is asked, not replayed."""
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, mw = agent_of(model, saver, charge_tool(effects))
        await graph.ainvoke(USER, cfg())
        assert len(model.asked) == 2
        before_model = [s async for s in graph.aget_state_history(cfg()) if s.next == ("model",)]
        await graph.ainvoke(None, before_model[-1].config)
        assert len(model.asked) == 4
        assert mw.model_recorder.counts.replayed == 0
        assert len(await model_entries(saver)) == 4


async def test_a_later_turn_with_the_same_words_is_asked_anew(tmp_path: Path) -> None:
    """The same input at a later step is another call: recorded answers are per step."""
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, mw = agent_of(model, saver, charge_tool(effects))
        await graph.ainvoke(USER, cfg())
        await graph.ainvoke(USER, cfg())
        assert len(model.asked) == 4 and mw.model_recorder.counts.replayed == 0
        assert sorted(effects) == ["inv-1", "inv-1", "inv-2", "inv-2"]


async def test_model_retry_inside_records_only_the_answer(tmp_path: Path) -> None:
    """``ModelRetryMiddleware`` inside ours: a failed attempt records nothing and is
    retried against the model; the step's answer is recorded once and replayed."""
    model, effects = FakeModel(asked=[], fail_first=1), []
    retry = ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, mw = agent_of(model, saver, charge_tool(effects), more=[retry])
        await lose_a_run(graph, saver, cfg())
        assert len(model.asked) == 3  # the failure, the retried calls step, the answer
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 3
        assert out["messages"][-1].content == "done: 2"
        assert mw.model_recorder.counts.replayed == 2
        assert len(await model_entries(saver)) == 2


async def test_a_model_error_records_nothing_and_the_retry_asks_anew(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[], fail_first=1), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        with pytest.raises(ConnectionError):
            await lose_a_run(graph, saver, cfg())
        assert await model_entries(saver) == []
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 3 and out["messages"][-1].content == "done: 2"


async def test_structured_output_is_recorded_with_the_answer(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[], structured=True), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = create_agent(
            model,
            tools=[charge_tool(effects)],
            middleware=[IdempotencyMiddleware()],
            response_format=ToolStrategy(Receipt),
            checkpointer=saver,
        )
        await lose_a_run(graph, saver, cfg())
        asked = len(model.asked)
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == asked  # replayed, structured response included
        assert out["structured_response"] == Receipt(invoice="inv-1", paid=True)
        last = (await model_entries(saver))[-1]
        stored = saver.serde.loads_typed((last.result_type, last.result))
        assert stored["structured_response"] == Receipt(invoice="inv-1", paid=True)
        assert any(isinstance(m, ToolMessage) for m in stored["result"])


class Answers(TypedDict):
    answers: Annotated[list[str], operator.add]


async def test_parallel_model_calls_of_one_step_are_two_calls(tmp_path: Path) -> None:
    """Two ``Send`` tasks of one node in one step, asked the same thing, are two model
    calls (the task's path is part of the key); each is replayed on a re-run."""
    model = FakeModel(asked=[])
    llm = durable_model(model)

    async def ask(state: Answers) -> dict[str, Any]:
        answer = await llm.ainvoke([HumanMessage("pay inv-9")])
        return {"answers": [answer.tool_calls[0]["id"]]}

    builder = StateGraph(Answers)
    builder.add_node("ask", ask)
    builder.add_conditional_edges(START, lambda s: [Send("ask", {}), Send("ask", {})])
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = builder.compile(checkpointer=saver)
        saver.losing = True
        first = await graph.ainvoke({"answers": []}, cfg(), durability="exit")
        saver.losing = False
        assert len(model.asked) == 2 and len(await model_entries(saver)) == 2
        assert len(set(first["answers"])) == 2  # two calls, two answers
        again = await graph.ainvoke({"answers": []}, cfg(), durability="exit")
        assert len(model.asked) == 2  # both replayed
        assert sorted(again["answers"]) == sorted(first["answers"])
        assert llm.recorder.counts.replayed == 2


async def test_opt_out_records_nothing_and_asks_again(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, mw = agent_of(model, saver, charge_tool(effects), record_model=False)
        await lose_a_run(graph, saver, cfg())
        await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 4  # the lost steps asked again
        assert await model_entries(saver) == [] and mw.model_recorder is None


async def test_retention_removes_recorded_responses_with_the_thread(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        await graph.ainvoke(USER, cfg("gone"))
        await graph.ainvoke(USER, cfg("kept"))
        assert len(await model_entries(saver, "gone")) == 2
        await saver.adelete_thread("gone")
        assert await model_entries(saver, "gone") == []
        assert len(await model_entries(saver, "kept")) == 2


async def test_an_unreadable_record_is_a_typed_error(tmp_path: Path) -> None:
    path = tmp_path / "db"
    model, effects = FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(path)) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        await lose_a_run(graph, saver, cfg())
    with sqlite3.connect(path) as conn:
        changed = conn.execute(
            "UPDATE idem_tool_calls SET result = ? WHERE tool_name = ?",
            (b"\x00not msgpack", MODEL_TOOL_NAME),
        ).rowcount
    assert changed == 2
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        with pytest.raises(CorruptRecordError):
            await graph.ainvoke(USER, cfg(), durability="exit")
    assert len(model.asked) == 2  # not asked in place of the unreadable record


async def test_outside_a_graph_the_wrapper_is_the_model_unrecorded() -> None:
    model = FakeModel(asked=[])
    llm = durable_model(model)
    answer = await llm.ainvoke([HumanMessage("pay inv-1")])
    assert answer.tool_calls[0]["args"] == {"invoice": "inv-1"}
    assert llm.recorder.counts.unrecorded == 1 and llm.recorder.counts.recorded == 0


def test_bad_input_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        durable_model("gpt-5")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        durable_model(FakeModel(asked=[]), ledger=object())  # type: ignore[arg-type]


def test_the_input_digest_ignores_message_ids_but_not_content() -> None:
    """A re-sent input gets new message ids: the same call. Other words, tools or
    settings: another call."""
    a = {"messages": [HumanMessage("pay inv-1", id="1")], "settings": {"temperature": 0}}
    same = {"messages": [HumanMessage("pay inv-1", id="2")], "settings": {"temperature": 0}}
    other = {"messages": [HumanMessage("pay inv-2", id="1")], "settings": {"temperature": 0}}
    hotter = {"messages": [HumanMessage("pay inv-1", id="1")], "settings": {"temperature": 1}}
    assert input_digest(a) == input_digest(same)
    assert len({input_digest(a), input_digest(other), input_digest(hotter)}) == 3


async def test_a_fallback_answer_is_recorded_and_replayed_without_asking_any_model(
    tmp_path: Path,
) -> None:
    """``ModelFallbackMiddleware`` inside ours: the answer the fallback gave is the step's
    record; a re-run asks neither the failing primary nor the fallback."""
    primary, fallback, effects = FakeModel(asked=[], fail_first=99), FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, mw = agent_of(
            primary, saver, charge_tool(effects), more=[ModelFallbackMiddleware(fallback)]
        )
        await lose_a_run(graph, saver, cfg())
        assert (len(primary.asked), len(fallback.asked)) == (2, 2)
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert (len(primary.asked), len(fallback.asked)) == (2, 2)
        assert out["messages"][-1].content == "done: 2"
        assert mw.model_recorder.counts.replayed == 2


def test_another_model_is_another_call() -> None:
    class OtherModel(FakeModel):
        pass

    messages = {"messages": [HumanMessage("pay inv-1")]}
    one = input_digest({**messages, "model": model_identity(FakeModel(asked=[]))})
    same = input_digest({**messages, "model": model_identity(FakeModel(asked=["x"]))})
    other = input_digest({**messages, "model": model_identity(OtherModel(asked=[]))})
    assert one == same != other


async def test_records_stay_per_thread_with_a_shared_namespace(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects), namespace="billing")
        await graph.ainvoke(USER, cfg("a"))
        await graph.ainvoke(USER, cfg("b"))
        assert len(model.asked) == 4  # thread b asked its own model
        assert {e.scope for e in await model_entries(saver, "a")} == {"a"}
        assert {e.scope for e in await model_entries(saver, "b")} == {"b"}


async def test_two_identical_calls_in_one_node_execution_share_an_answer(
    tmp_path: Path,
) -> None:
    model = FakeModel(asked=[])
    llm = durable_model(model)

    async def twice(state: Answers) -> dict[str, Any]:
        first = await llm.ainvoke([HumanMessage("pay inv-1")])
        second = await llm.ainvoke([HumanMessage("pay inv-1")])
        other = await llm.ainvoke([HumanMessage("pay inv-2")])
        return {"answers": [m.tool_calls[0]["id"] for m in (first, second, other)]}

    builder = StateGraph(Answers)
    builder.add_node("twice", twice)
    builder.add_edge(START, "twice")
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        out = await builder.compile(checkpointer=saver).ainvoke({"answers": []}, cfg())
    first, second, other = out["answers"]
    assert first == second != other
    assert len(model.asked) == 2


class Noted(AgentMiddleware):
    """Inside ours: returns each answer with a ``Command`` adding a note to the state."""

    class State(AgentState[Any]):
        notes: Annotated[list[str], operator.add]

    state_schema = State

    async def awrap_model_call(self, request: Any, handler: Any) -> Any:
        response = await handler(request)
        return ExtendedModelResponse(response, Command(update={"notes": ["noted"]}))


async def test_an_inner_middlewares_command_is_not_replayed(tmp_path: Path) -> None:
    model, effects = FakeModel(asked=[]), []
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects), more=[Noted()])
        fresh = await graph.ainvoke(USER, cfg("fresh"))
        assert fresh["notes"] == ["noted", "noted"]
        await lose_a_run(graph, saver, cfg())
        replayed = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 4  # two for "fresh", two for the lost run, none after
        assert replayed.get("notes", []) == []


class SummaryModel(BaseChatModel):
    asked: list[str]

    @property
    def _llm_type(self) -> str:
        return "fake-summarizer"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        self.asked.append("x")
        return ChatResult(generations=[ChatGeneration(message=AIMessage("earlier: pay"))])


async def test_summarization_is_not_recorded_its_model_is_asked_again(tmp_path: Path) -> None:
    """``SummarizationMiddleware`` calls its model in ``before_model``: a re-run
    summarizes again; the same summary is the same input, so the main model replays."""
    model, summarizer, effects = FakeModel(asked=[]), SummaryModel(asked=[]), []
    summarize = SummarizationMiddleware(summarizer, trigger=("messages", 4), keep=("messages", 3))
    async with LosingAsyncSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph = create_agent(
            model,
            tools=[charge_tool(effects)],
            middleware=[summarize, IdempotencyMiddleware()],
            checkpointer=saver,
        )
        await lose_a_run(graph, saver, cfg())
        assert (len(model.asked), len(summarizer.asked)) == (2, 1)
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(summarizer.asked) == 2  # summarized again
        assert len(model.asked) == 2  # the main model's steps replayed
        assert out["messages"][-1].content == "done: 2"


async def test_a_retention_sweep_removes_recorded_responses_with_the_thread(
    tmp_path: Path,
) -> None:
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        await graph.ainvoke(USER, cfg("idle"))
        assert len(await model_entries(saver, "idle")) == 2
        report = await saver.asweep(time.time() + 40 * 86400, ttl=TTLConfig(after=timedelta(30)))
        assert report.threads_deleted == 1
        assert await saver.alist_entries("idle") == []


def test_the_cli_lists_recorded_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from langgraph_idem_saver.cli import main
    from langgraph_idem_saver.cli.commands import ledger

    assert ledger.MODEL_TOOL_NAME == MODEL_TOOL_NAME
    model, effects = FakeModel(asked=[]), []
    path = str(tmp_path / "db")

    async def fill() -> None:
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            graph, _ = agent_of(model, saver, charge_tool(effects))
            await graph.ainvoke(USER, cfg())

    asyncio.run(fill())
    assert main(["--db", path, "ledger", "t", "--json"]) == 0
    entries = json.loads(capsys.readouterr().out)["entries"]
    answers = [e for e in entries if e["tool"] == MODEL_TOOL_NAME]
    assert [(a["args"]["model_call"], a["args"]["step"]) for a in answers] == [
        ("model", 1),
        ("model", 3),
    ]
    assert answers[0]["result"].startswith("asked for charge c_0_")
    assert answers[1]["result"] == "done: 2"
    assert main(["--db", path, "ledger", "t"]) == 0
    assert "2 tool call(s), 2 recorded model answer(s)" in capsys.readouterr().out


def one_node_graph(llm: Any, saver: Any) -> Any:
    """START -> a node that calls ``llm.invoke`` (sync) inside ``async def``."""

    async def agent(state: MessagesState) -> dict[str, Any]:
        return {"messages": [llm.invoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", agent)
    builder.add_edge(START, "agent")
    return builder.compile(checkpointer=saver)


async def test_a_sync_call_inside_an_async_node_needs_a_ledger_it_can_wait_for(
    tmp_path: Path,
) -> None:
    """``invoke`` in an ``async def`` node blocks the event loop: with the sync saver (its
    ledger runs on a loop of its own) it records and replays; with the async saver (its
    ledger needs the blocked loop) it is a ``ConfigError`` before the model is asked."""
    model = FakeModel(asked=[])
    with LosingSyncSaver.from_conn_string(str(tmp_path / "sync.db")) as saver:
        graph = one_node_graph(durable_model(model), saver)
        saver.losing = True
        first = await graph.ainvoke(USER, cfg(), durability="exit")
        saver.losing = False
        again = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 1
        assert ids_of(again["messages"]) == ids_of(first["messages"])
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "async.db")) as saver:
        graph = one_node_graph(durable_model(model), saver)
        with pytest.raises(ConfigError, match="ainvoke"):
            await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 1


async def test_ledger_stats_count_tool_calls_only(tmp_path: Path) -> None:
    from langgraph_idem_saver import inspection

    assert inspection.MODEL_ANSWER == MODEL_TOOL_NAME
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        graph, _ = agent_of(model, saver, charge_tool(effects))
        await graph.ainvoke(USER, cfg())
        assert len(await model_entries(saver)) == 2
        stats = await inspection.astats(saver, "t")
        assert (stats.executed, stats.by_status) == (2, {"completed": 2})


async def test_two_runs_of_one_step_at_once_go_on_with_the_first_record(tmp_path: Path) -> None:
    """Two resumers re-run one step at the same moment: both ask the model, the first
    answer recorded wins, and both branches go on with it - the same tool-call ids, so
    each tool call runs once."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db")) as saver:
        await two_runs_at_once(saver)


async def two_runs_at_once(saver: Any) -> None:
    """Two agents run one step at once on ``saver``, their model slow to answer: the
    same tool-call ids in both, at least one answer taken from the other's record (the
    calls step), each charge made once."""
    model, effects = FakeModel(asked=[], delay=0.3), []
    first, mw1 = agent_of(model, saver, charge_tool(effects))
    second, mw2 = agent_of(model, saver, charge_tool(effects))
    outs = await asyncio.gather(
        first.ainvoke(USER, cfg(), durability="exit"),
        second.ainvoke(USER, cfg(), durability="exit"),
    )
    assert ids_of(outs[0]["messages"]) == ids_of(outs[1]["messages"])
    won = mw1.model_recorder.counts.adopted_other + mw2.model_recorder.counts.adopted_other
    assert won >= 1  # at least the calls step: one branch took the other's answer
    assert sorted(effects) == ["inv-1", "inv-2"]


async def test_without_a_one_commit_record_an_answer_is_a_claim_and_its_outcome(
    tmp_path: Path,
) -> None:
    """The fallback: per model call an ``issued`` claim under the model's tool name, then
    its outcome; the record replays a re-run step as the one-commit record does."""
    model, effects = FakeModel(asked=[]), []
    async with ClaimAndOutcomeSaver.from_conn_string(str(tmp_path / "db")) as saver:
        assert not isinstance(saver, AnswerRecorder)
        graph = front_of("agent", model, saver, effects)
        seen: list[str] = []
        await saver.conn._execute(lambda: saver.conn._conn.set_trace_callback(seen.append))
        await lose_a_run(graph, saver, cfg())
        inserts = [s for s in seen if s.lstrip().startswith("INSERT INTO idem_tool_calls")]
        model_inserts = [s for s in inserts if f"'{MODEL_TOOL_NAME}'" in s]
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        entries = await model_entries(saver)
    assert len(model.asked) == 2  # the second run was replayed
    assert sorted(effects) == ["inv-1", "inv-2"]
    assert out["messages"][-1].content == "done: 2"
    assert len(model_inserts) == 2, inserts  # one claim per model call, as issued
    assert all("'issued'" in s and "'completed'" not in s for s in model_inserts), inserts
    assert [(e.status, e.replays) for e in entries] == [(CallStatus.COMPLETED, 1)] * 2


async def test_two_runs_at_once_through_claim_and_outcome_go_on_with_the_first_record(
    tmp_path: Path,
) -> None:
    async with ClaimAndOutcomeSaver.from_conn_string(str(tmp_path / "db")) as saver:
        await two_runs_at_once(saver)
        assert all(e.status is CallStatus.COMPLETED for e in await model_entries(saver))
