"""A sync step's claim sent from the node's thread (``engine.prepare.prepare_blocking``)
is traced and counted as ``aprepare``'s on the private loop was: one ``idem.claim``
span under the caller's span, its attributes, the claim's metrics, and the calls' own
spans (``Batch.traced``, decided in the claim's span) - compared with the general path
forced, on real SQLite files, with OpenTelemetry's SDK (``test_telemetry``'s providers:
its globals are set once a process, so this file sorts after it: a test running after a
provider was set sees traced steps)."""

from __future__ import annotations

import contextvars
import sqlite3
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import test_telemetry
from langchain_core.tools import tool
from test_telemetry import Otel, assert_child_of
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode, tool_node
from langgraph_idem_saver.engine.core import LedgerEngine
from langgraph_idem_saver.engine.loops import run_private
from langgraph_idem_saver.engine.types import Batch
from langgraph_idem_saver.sqlite import SqliteSaver

COUNTED = ("idem.calls.claimed", "idem.calls.ran", "idem.claim.duration")


@pytest.fixture
def otel() -> Iterator[Otel]:
    """``test_telemetry``'s providers (made once a process, by whichever test is first)."""
    if test_telemetry._OTEL is None:
        test_telemetry._OTEL = Otel()
    test_telemetry._OTEL.spans.clear()
    yield test_telemetry._OTEL


def charge_tool(effects: list[str]) -> Any:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice (a side effect, as the ledger sees it)."""
        effects.append(invoice)
        return f"charged {invoice}"

    return charge


def general(engine: LedgerEngine, batch: Batch, config: Any) -> None:
    """The earlier path: the whole preparation on the thread's private loop."""
    run_private(engine.aprepare(batch, config))


def traced_step(otel: Otel, db: Path) -> tuple[list[Any], dict[str, float]]:
    """One sync step of two calls under a ``request`` span: what its spans show (claim
    attributes, the tools' call ids) and what its metrics counted."""
    otel.spans.clear()
    before = otel.counted()
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            effects: list[str] = []
            graph: Any = tool_graph(IdempotentToolNode([charge_tool(effects)]), saver)
            msg = ai_calls(("charge", {"invoice": "a"}, "c1"), ("charge", {"invoice": "b"}, "c2"))
            with otel.tracer.start_as_current_span("request") as request:
                context = contextvars.copy_context()  # the caller's span, in the node's thread
                with ThreadPoolExecutor(1) as caller:
                    caller.submit(context.run, graph.invoke, {"messages": [msg]}, cfg("t")).result()
            assert sorted(effects) == ["a", "b"]  # the two calls run in parallel threads
    finally:
        conn.close()
    [claim] = otel.named("idem.claim")
    assert_child_of(claim, request)
    tools = otel.named("execute_tool")
    for span in tools:
        assert_child_of(span, request)
    attributes = dict(claim.attributes or {})
    seen = [
        {k: v for k, v in attributes.items()},
        sorted(str((s.attributes or {})["gen_ai.tool.call.id"]) for s in tools),
        claim.status.status_code.name,
    ]
    after = otel.counted()
    return seen, {name: after.get(name, 0) - before.get(name, 0) for name in COUNTED}


def test_fast_claim_traced_as_the_private_loop_traced(
    otel: Otel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = traced_step(otel, tmp_path / "shipped.db")
    monkeypatch.setattr(tool_node, "prepare_blocking", general)
    forced = traced_step(otel, tmp_path / "general.db")

    assert shipped == forced
    (attributes, tools, status), counted = shipped
    assert attributes["idem.calls"] == 2 and attributes["idem.claimed"] == 2
    assert attributes["idem.thread_id"] == "t" and attributes["idem.adopted"] == 0
    assert tools == ["c1", "c2"]  # the calls' spans: the step was traced
    assert status == "UNSET"
    assert counted == {"idem.calls.claimed": 2, "idem.calls.ran": 2, "idem.claim.duration": 1}
