"""What OpenTelemetry costs a wide step when it is installed but not configured.

With the API installed and no SDK provider set, spans are not made (``test_telemetry``);
asking the API whether a provider is set reads the process environment each time while
none is, so the engine asks once a run (``Batch.traced``), not once a tool call. Counted
here in a fresh process (the other telemetry tests set an SDK provider for theirs): a
step of 50 parallel calls asks as often as a step of one, and a provider set after the
first steps is used by the next step's calls.
"""

from __future__ import annotations

from pathlib import Path

from test_telemetry import run_program

ASKED = """
import asyncio, json, sys
from langchain_core.tools import tool
from opentelemetry import trace
from tool_node_helpers import ai_calls, cfg, tool_graph
from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode

asked = 0
original = trace.get_tracer_provider

def counted():
    global asked
    asked += 1
    return original()

trace.get_tracer_provider = counted

@tool
async def charge(invoice: str) -> str:
    '''Charge an invoice.'''
    return f"charged {invoice}"

async def step(graph, thread, n):
    global asked
    asked = 0
    calls = [("charge", {"invoice": f"{thread}-{i}"}, f"{thread}-c{i}") for i in range(n)]
    out = await graph.ainvoke({"messages": [ai_calls(*calls)]}, cfg(thread))
    ran = sum(1 for m in out["messages"] if getattr(m, "content", "").startswith("charged"))
    return {"asked": asked, "ran": ran}

async def main(path):
    seen = {}
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = tool_graph(IdempotentToolNode([charge]), saver)
        await step(graph, "warm", 1)  # the API's tracer and instruments made
        seen["one"] = await step(graph, "one", 1)
        seen["fifty"] = await step(graph, "fifty", 50)
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        seen["traced"] = await step(graph, "traced", 50)
        seen["tool_spans"] = sum(
            s.name == "execute_tool charge" for s in spans.get_finished_spans()
        )
    print(json.dumps(seen))

asyncio.run(main(sys.argv[1]))
"""


def test_a_wide_step_asks_for_the_tracer_provider_once_a_run(tmp_path: Path) -> None:
    seen = run_program(ASKED, tmp_path / "db.sqlite")
    assert seen["one"]["ran"] == 1 and seen["fifty"]["ran"] == 50
    # the count sees the engine's question: once a run, whatever the run's calls
    assert seen["one"]["asked"] == seen["fifty"]["asked"] == 1, seen
    # set after the first steps: the next step's every call has its span
    assert seen["traced"]["ran"] == 50 and seen["tool_spans"] == 50
