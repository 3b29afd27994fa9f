"""OpenTelemetry spans and metrics (``langgraph_idem_saver/telemetry.py``), read back from
the SDK's in-memory span exporter and metric reader, through every front door on both
backends: names, attributes, parents (the caller's current span), a replay's span and no
tool span for it, unknown-outcome decisions, an operator's resolution, the counters and
histograms; and, without OpenTelemetry importable, nothing imported and the same results.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint
from langgraph.types import Command
from opentelemetry import metrics, trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tool_node_helpers import (
    ai_calls,
    cfg,
    intent_for,
    plant_completed,
    plant_unknown,
    scripted_model,
    tool_graph,
)

from langgraph_idem_saver import (
    NOT_APPLIED,
    IdempotencyMiddleware,
    IdempotentToolNode,
    idempotent_task,
    telemetry,
)
from langgraph_idem_saver.inspection import aresolve_unknown

HERE = Path(__file__).resolve().parent


def run_program(program: str, db: Path) -> dict[str, Any]:
    """Run ``program`` in a fresh interpreter (what it imports is the point: OpenTelemetry
    present or not, a provider set or not) on the database ``db``; its last line of JSON."""
    env = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}
    done = subprocess.run(
        [sys.executable, "-c", program, str(db)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return seen


class Otel:
    """The SDK providers of this test process (OpenTelemetry's globals are set once)."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.metrics = InMemoryMetricReader()
        tracer_provider = TracerProvider()
        tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        trace.set_tracer_provider(tracer_provider)
        metrics.set_meter_provider(MeterProvider(metric_readers=[self.metrics]))
        # the globals took (nothing else in this process set them first)
        assert trace.get_tracer_provider() is tracer_provider
        self.tracer = trace.get_tracer("test")

    def named(self, prefix: str) -> list[ReadableSpan]:
        return [s for s in self.spans.get_finished_spans() if s.name.startswith(prefix)]

    def counted(self) -> dict[str, float]:
        """Every metric's total so far: a counter's sum, a histogram's count."""
        totals: dict[str, float] = {}
        data = self.metrics.get_metrics_data()
        for resource in data.resource_metrics if data is not None else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        value = getattr(point, "value", None)
                        if value is None:
                            value = point.count  # type: ignore[union-attr]
                        totals[metric.name] = totals.get(metric.name, 0) + value
        return totals


_OTEL: Otel | None = None


@pytest.fixture
def otel() -> Iterator[Otel]:
    global _OTEL
    if _OTEL is None:
        _OTEL = Otel()
    _OTEL.spans.clear()
    yield _OTEL


def charge_tool(effects: list[str]) -> Any:
    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.append(invoice)
        return f"charged {invoice}"

    return charge


def assert_child_of(span: ReadableSpan, parent: Any) -> None:
    assert span.parent is not None
    assert span.parent.span_id == parent.get_span_context().span_id
    assert span.context is not None
    assert span.context.trace_id == parent.get_span_context().trace_id


def assert_tool_span(span: ReadableSpan, *, call_id: str, thread: str, key: str) -> None:
    attributes = dict(span.attributes or {})
    assert span.name == "execute_tool charge"
    assert attributes["gen_ai.operation.name"] == "execute_tool"
    assert attributes["gen_ai.tool.name"] == "charge"
    assert attributes["gen_ai.tool.call.id"] == call_id
    assert attributes["idem.key"] == key
    assert attributes["idem.attempt"] == 1
    assert attributes["idem.outcome"] == "ran"
    assert attributes["idem.thread_id"] == thread
    assert attributes["idem.agent_path"] == "tools"


def test_enabled_with_the_api_installed() -> None:
    assert telemetry.ENABLED


async def test_tool_node_spans_and_a_replay(otel: Otel, saver: Any) -> None:
    effects: list[str] = []
    graph = tool_graph(IdempotentToolNode([charge_tool(effects)]), saver)
    message = ai_calls(("charge", {"invoice": "a"}, "c1"), ("charge", {"invoice": "b"}, "c2"))
    before = otel.counted()
    with otel.tracer.start_as_current_span("request") as request:
        await graph.ainvoke({"messages": [message]}, cfg("t"))
    entries = {e.tool_call_id: e for e in await saver.alist_entries("t")}
    [claim] = otel.named("idem.claim")
    assert_child_of(claim, request)
    claim_attributes = dict(claim.attributes or {})
    assert claim_attributes["idem.calls"] == 2 and claim_attributes["idem.claimed"] == 2
    assert claim_attributes["idem.thread_id"] == "t"
    assert claim_attributes["idem.backend"] == type(saver).__name__
    tools = sorted(
        otel.named("execute_tool"), key=lambda s: str((s.attributes or {})["gen_ai.tool.call.id"])
    )
    assert len(tools) == 2
    for span, call_id in zip(tools, ["c1", "c2"], strict=True):
        assert_tool_span(span, call_id=call_id, thread="t", key=entries[call_id].key)
        assert_child_of(span, request)
    after = otel.counted()
    assert after["idem.calls.claimed"] - before.get("idem.calls.claimed", 0) == 2
    assert after["idem.calls.ran"] - before.get("idem.calls.ran", 0) == 2
    assert after["idem.claim.duration"] - before.get("idem.claim.duration", 0) == 1
    assert after["idem.outcome.duration"] - before.get("idem.outcome.duration", 0) == 1

    # the same calls, recorded by a process that lost its checkpoint: replayed
    otel.spans.clear()
    again = ai_calls(("charge", {"invoice": "z"}, "r1"))
    await plant_completed(
        saver, intent_for("t2", again.tool_calls[0]), ToolMessage("charged z", tool_call_id="r1")
    )
    with otel.tracer.start_as_current_span("request") as request:
        await graph.ainvoke({"messages": [again]}, cfg("t2"))
    [replay] = otel.named("idem.replay")
    assert replay.name == "idem.replay charge"
    attributes = dict(replay.attributes or {})
    assert attributes["idem.outcome"] == "replayed" and attributes["gen_ai.tool.call.id"] == "r1"
    assert_child_of(replay, request)
    assert otel.named("execute_tool") == [] and effects == ["a", "b"]
    assert otel.counted()["idem.calls.replayed"] - after.get("idem.calls.replayed", 0) == 1


def agent_turn(invoice: str) -> list[AIMessage]:
    call = {"name": "charge", "args": {"invoice": invoice}, "id": "call_0", "type": "tool_call"}
    return [AIMessage("", id="ai-charges", tool_calls=[call]), AIMessage("done", id="ai-done")]


async def test_middleware_spans_and_a_replay(otel: Otel, saver: Any) -> None:
    effects: list[str] = []

    def agent() -> Any:
        return create_agent(
            scripted_model(*agent_turn("a")),
            tools=[charge_tool(effects)],
            middleware=[IdempotencyMiddleware()],
            checkpointer=saver,
        )

    with otel.tracer.start_as_current_span("request") as request:
        await agent().ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    [entry] = [e for e in await saver.alist_entries("t") if e.tool_name == "charge"]
    [span] = otel.named("execute_tool")
    assert_tool_span(span, call_id="call_0", thread="t", key=entry.key)
    assert_child_of(span, request)
    assert_child_of(otel.named("idem.claim")[0], request)

    otel.spans.clear()
    call = {"name": "charge", "args": {"invoice": "a"}, "id": "call_0"}
    intent = intent_for("t2", call, checkpoint_ns="tools:x", message_id="ai-charges")
    await plant_completed(saver, intent, ToolMessage("charged a (earlier)", tool_call_id="call_0"))
    with otel.tracer.start_as_current_span("request") as request:
        await agent().ainvoke({"messages": [("user", "pay")]}, cfg("t2"))
    [replay] = otel.named("idem.replay charge")
    assert_child_of(replay, request)
    assert dict(replay.attributes or {})["idem.key"] == intent.key
    assert otel.named("execute_tool") == [] and effects == ["a"]


async def test_task_spans_and_a_replay(otel: Otel, saver: Any) -> None:
    effects: list[str] = []

    @idempotent_task
    async def charge(invoice: str) -> str:
        effects.append(invoice)
        return f"charged {invoice}"

    @entrypoint(checkpointer=saver)
    async def pay(invoice: str) -> str:
        return str(await charge(invoice))

    with otel.tracer.start_as_current_span("request") as request:
        await pay.ainvoke("a", cfg("t"))
    [entry] = await saver.alist_entries("t")
    [span] = otel.named("execute_tool charge")
    attributes = dict(span.attributes or {})
    assert attributes["idem.key"] == entry.key and attributes["idem.outcome"] == "ran"
    assert attributes["gen_ai.tool.call.id"] == "task:charge"
    assert_child_of(span, request)

    otel.spans.clear()
    with otel.tracer.start_as_current_span("request") as request:
        assert await pay.ainvoke("a", cfg("t")) == "charged a"
    [replay] = otel.named("idem.replay charge")
    assert_child_of(replay, request)
    assert otel.named("execute_tool") == [] and effects == ["a"]


async def test_unknown_outcome_decisions(otel: Otel, saver: Any) -> None:
    """verify -> ``idem.verify``; the rerun policy -> ``idem.unknown_outcome`` then a
    tool span of attempt 2; the interrupt -> asked; an operator's answer -> ``idem.resolve``."""
    effects: list[str] = []
    before = otel.counted()

    def planted(thread: str) -> tuple[AIMessage, Any]:
        message = ai_calls(("charge", {"invoice": thread}, "c1"), msg_id=f"ai-{thread}")
        return message, intent_for(thread, message.tool_calls[0], message_id=message.id)

    message, intent = planted("v")
    await plant_unknown(saver, intent)
    verified = IdempotentToolNode(
        [charge_tool(effects)], verify={"charge": lambda args: f"found {args['invoice']}"}
    )
    await tool_graph(verified, saver).ainvoke({"messages": [message]}, cfg("v"))
    [verify] = otel.named("idem.verify charge")
    assert dict(verify.attributes or {})["idem.outcome"] == "verified"
    [answer] = otel.named("idem.answer charge")
    assert dict(answer.attributes or {})["idem.outcome"] == "verified"

    message, intent = planted("r")
    await plant_unknown(saver, intent)
    rerun = IdempotentToolNode([charge_tool(effects)], on_unknown="rerun")
    await tool_graph(rerun, saver).ainvoke({"messages": [message]}, cfg("r"))
    [decided] = otel.named("idem.unknown_outcome charge")
    assert dict(decided.attributes or {})["idem.outcome"] == "rerun"
    assert dict(decided.attributes or {})["idem.decided_by"] == "rerun"
    [ran] = otel.named("execute_tool charge")
    assert dict(ran.attributes or {})["idem.attempt"] == 2

    otel.spans.clear()
    message, intent = planted("i")
    entry = await plant_unknown(saver, intent)
    asking = tool_graph(IdempotentToolNode([charge_tool(effects)]), saver)
    out = await asking.ainvoke({"messages": [message]}, cfg("i"))
    assert out["__interrupt__"]
    [asked] = otel.named("idem.unknown_outcome charge")
    assert dict(asked.attributes or {})["idem.outcome"] == "asked"
    assert asked.status.is_ok  # a question, not an error

    with otel.tracer.start_as_current_span("operator") as operator:
        await aresolve_unknown(saver, entry, "completed", result="charged on the dashboard")
    [resolved] = otel.named("idem.resolve charge")
    assert_child_of(resolved, operator)
    assert dict(resolved.attributes or {})["idem.resolution"] == "completed"
    await asking.ainvoke(Command(resume={"action": "rerun"}), cfg("i"))  # the answer is moot

    after = otel.counted()
    assert after["idem.calls.verified"] - before.get("idem.calls.verified", 0) == 1
    assert after["idem.calls.rerun"] - before.get("idem.calls.rerun", 0) == 1
    assert after["idem.unknown.settled"] - before.get("idem.unknown.settled", 0) == 2
    assert after["idem.unknown.resolved"] - before.get("idem.unknown.resolved", 0) == 1
    assert effects == ["r"]


async def test_a_failed_tool_span_is_an_error_and_counted_unknown(otel: Otel, saver: Any) -> None:
    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        raise TimeoutError("the reply was lost")

    before = otel.counted()
    graph = tool_graph(IdempotentToolNode([charge], handle_tool_errors=False), saver)
    with pytest.raises(TimeoutError):
        await graph.ainvoke({"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}, cfg("t"))
    [span] = otel.named("execute_tool charge")
    assert not span.status.is_ok and span.events[0].name == "exception"
    after = otel.counted()
    assert after["idem.unknown.raised"] - before.get("idem.unknown.raised", 0) == 1


def test_sync_invoke_spans_in_the_tool_thread(otel: Otel, tmp_path: Path) -> None:
    """A sync ``invoke``: each sync tool runs in a pool thread, its span there, a child
    of the caller's span (LangChain's executor copies the context)."""
    from langgraph_idem_saver.sqlite import SqliteSaver

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        return f"charged {invoice}"

    with SqliteSaver.from_conn_string(str(tmp_path / "sync.sqlite")) as saver:
        graph = tool_graph(IdempotentToolNode([charge]), saver)
        message = ai_calls(("charge", {"invoice": "a"}, "c1"), ("charge", {"invoice": "b"}, "c2"))
        with otel.tracer.start_as_current_span("request") as request:
            graph.invoke({"messages": [message]}, cfg("t"))
    spans = otel.named("execute_tool charge")
    assert len(spans) == 2
    for span in spans:
        assert_child_of(span, request)


def test_verify_returning_not_applied_is_a_rerun(otel: Otel, tmp_path: Path) -> None:
    """``NOT_APPLIED`` from ``verify``: the decision span says rerun (not verified)."""
    from langgraph_idem_saver import AsyncSqliteSaver

    async def run() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "v.sqlite")) as saver:
            message = ai_calls(("charge", {"invoice": "a"}, "c1"))
            await plant_unknown(
                saver, intent_for("t", message.tool_calls[0], message_id=message.id)
            )
            node = IdempotentToolNode([charge_tool([])], verify={"charge": lambda a: NOT_APPLIED})
            await tool_graph(node, saver).ainvoke({"messages": [message]}, cfg("t"))

    asyncio.run(run())
    [verify] = otel.named("idem.verify charge")
    assert dict(verify.attributes or {})["idem.outcome"] == "rerun"


async def test_the_counters_are_the_engines_counts(otel: Otel, saver: Any) -> None:
    """Each engine count (``IdempotencyCounters``) is also its metric: ran, replayed,
    adopted, released (``NotAppliedError``), conflicts, unknown raised and decided."""
    from langgraph_idem_saver import IdempotencyConflict, NotAppliedError

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        if invoice == "declined":
            raise NotAppliedError("declined before charging")
        if invoice == "timeout":
            raise TimeoutError("the reply was lost")
        return f"charged {invoice}"

    before = otel.counted()
    node = IdempotentToolNode([charge], on_unknown="rerun", handle_tool_errors=False)
    graph = tool_graph(node, saver)
    await graph.ainvoke({"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}, cfg("t"))
    await graph.ainvoke({"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}, cfg("t"))
    with pytest.raises(IdempotencyConflict):
        await graph.ainvoke({"messages": [ai_calls(("charge", {"invoice": "b"}, "c1"))]}, cfg("t"))
    with pytest.raises(NotAppliedError):
        message = ai_calls(("charge", {"invoice": "declined"}, "c2"))
        await graph.ainvoke({"messages": [message]}, cfg("t2"))
    with pytest.raises(TimeoutError):
        await graph.ainvoke(
            {"messages": [ai_calls(("charge", {"invoice": "timeout"}, "c3"))]}, cfg("t3")
        )
    lost = ai_calls(("charge", {"invoice": "o"}, "c4"), msg_id="ai-lost")
    await plant_unknown(saver, intent_for("t4", lost.tool_calls[0], message_id=lost.id))
    again = ai_calls(("charge", {"invoice": "o"}, "c4"), msg_id="ai-again")
    otel.spans.clear()
    await graph.ainvoke({"messages": [again]}, cfg("t4"))
    [claim] = otel.named("idem.claim")
    assert dict(claim.attributes or {})["idem.adopted"] == 1

    engine = node.counters.as_dict()
    after = otel.counted()
    for name, metric in telemetry.COUNTER_NAMES.items():
        assert after.get(metric, 0) - before.get(metric, 0) == engine[name], name
    assert {n: engine[n] for n in ("executed", "replayed", "conflicts", "released")} == {
        "executed": 2,
        "replayed": 1,
        "conflicts": 1,
        "released": 1,
    }
    assert engine["abandoned"] == 1 and engine["adopted"] == 1 and engine["unknown"] == 1


def waiting(otel: Otel, name: str) -> list[tuple[float, dict[str, Any]]]:
    """The ``idem.unknown.waiting`` points of the ledger named ``name``."""
    found = []
    data = otel.metrics.get_metrics_data()
    for resource in data.resource_metrics if data is not None else ():
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                if metric.name != "idem.unknown.waiting":
                    continue
                for point in metric.data.data_points:
                    attributes = dict(point.attributes or {})
                    if attributes.get("idem.ledger") == name:
                        found.append((point.value, attributes))  # type: ignore[union-attr]
    return found


async def test_the_gauge_of_unknown_outcomes_waiting(otel: Otel, saver: Any) -> None:
    """Read at each collection (here in a thread, as a periodic reader does) from the
    ledger, on its own loop: planted, then one resolved, then no longer watched."""
    entries = []
    for invoice in ("a", "b"):
        message = ai_calls(("charge", {"invoice": invoice}, f"c-{invoice}"))
        intent = intent_for("t", message.tool_calls[0], message_id=message.id)
        entries.append(await plant_unknown(saver, intent))
    stop = telemetry.observe_unknown(saver, name="billing")
    try:
        [(value, attributes)] = await asyncio.to_thread(waiting, otel, "billing")
        assert value == 2 and attributes["idem.backend"] == type(saver).__name__
        await aresolve_unknown(saver, entries[0], "failed", error="declined")
        [(value, _)] = await asyncio.to_thread(waiting, otel, "billing")
        assert value == 1
        # collected on the ledger's own loop: it cannot wait for itself, nothing reported
        assert waiting(otel, "billing") == []
    finally:
        stop()
    assert await asyncio.to_thread(waiting, otel, "billing") == []


NO_OTEL = """
import asyncio, json, sys
sys.modules["opentelemetry"] = None  # as if not installed: find_spec None, import fails
from langchain_core.tools import tool
from langgraph.func import entrypoint
from langchain.agents import create_agent
from tool_node_helpers import ai_calls, cfg, scripted_model, tool_graph
from langchain_core.messages import AIMessage
from langgraph_idem_saver import (
    AsyncSqliteSaver, IdempotencyMiddleware, IdempotentToolNode, current_call, idempotent_task,
    telemetry,
)
from langgraph_idem_saver.engine import LedgerEngine

@tool
async def charge(invoice: str) -> str:
    '''Charge an invoice.'''
    return current_call().key

@idempotent_task
async def pay(invoice: str) -> str:
    return current_call().key

async def main(path):
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        node = tool_graph(IdempotentToolNode([charge]), saver)
        first = {"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}
        a = await node.ainvoke(first, cfg("n"))
        call = {"name": "charge", "args": {"invoice": "b"}, "id": "c2", "type": "tool_call"}
        model = scripted_model(AIMessage("", id="ai-2", tool_calls=[call]), AIMessage("done"))
        agent = create_agent(
            model, tools=[charge], middleware=[IdempotencyMiddleware()], checkpointer=saver
        )
        b = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("m"))

        @entrypoint(checkpointer=saver)
        async def flow(invoice: str) -> str:
            return await pay(invoice)

        c = await flow.ainvoke("c", cfg("t"))
    loaded = sorted(
        m for m, v in sys.modules.items() if m.startswith("opentelemetry") and v is not None
    )
    print(json.dumps({
        "enabled": telemetry.ENABLED,
        "loaded": loaded,
        "wrapped": hasattr(LedgerEngine.aprepare, "__wrapped__"),
        "keys": [a["messages"][-1].content, b["messages"][-2].content, c],
    }))

asyncio.run(main(sys.argv[1]))
"""


def test_without_opentelemetry_nothing_is_imported(tmp_path: Path) -> None:
    seen = run_program(NO_OTEL, tmp_path / "db.sqlite")
    assert seen["enabled"] is False and seen["loaded"] == [] and seen["wrapped"] is False
    assert all(str(k).startswith("idem-") for k in seen["keys"]) and len(set(seen["keys"])) == 3


API_ONLY = """
import asyncio, json, sys
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph
from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode, telemetry

@tool
async def charge(invoice: str) -> str:
    '''Charge an invoice.'''
    return f"charged {invoice}"

async def main(path):
    seen = {}
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = tool_graph(IdempotentToolNode([charge]), saver)
        first = {"messages": [ai_calls(("charge", {"invoice": "a"}, "c1"))]}
        await graph.ainvoke(first, cfg("a"))
        seen["before"] = telemetry.tracing()
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        second = {"messages": [ai_calls(("charge", {"invoice": "b"}, "c2"))]}
        await graph.ainvoke(second, cfg("b"))
        seen["after"] = telemetry.tracing()
        seen["spans"] = sorted(s.name for s in spans.get_finished_spans())
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def test_api_alone_makes_no_spans_until_an_sdk_is_set(tmp_path: Path) -> None:
    """With the API and no SDK, spans are not even made (they would be no-ops); an SDK
    provider set later, after the first calls, gets the spans from then on."""
    seen = run_program(API_ONLY, tmp_path / "db.sqlite")
    assert seen["before"] is False and seen["after"] is True
    assert seen["spans"] == ["execute_tool charge", "idem.claim"]
