"""A fresh call through the sync ``IdempotencyMiddleware`` and the sync
``idempotent_task`` - claimed from the caller's thread (``engine.prepare.
prepare_blocking``), its outcome committed from there (``engine.finish.
finish_blocking``) - is traced and counted as on the private loop: the same spans under
the caller's span (``idem.claim``, the call's own), the claim span's attributes, and the
same metrics (claims, runs, the claim's and the outcome's durations). Compared with the
earlier path forced, on real SQLite files, with OpenTelemetry's SDK (``test_telemetry``'s
providers: its globals are set once a process, so this file sorts after it)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import test_telemetry
from langchain.agents import create_agent
from langchain_core.tools import tool
from langgraph.func import entrypoint
from test_sync_middleware_claim_fast import calls
from test_sync_task_claim_fast import general_finish, general_prepare, sync_saver
from test_telemetry import Otel
from tool_node_helpers import scripted_model

from langgraph_idem_saver import middleware, task
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.task import idempotent_task

COUNTED = (
    "idem.calls.claimed",
    "idem.calls.ran",
    "idem.claim.duration",
    "idem.outcome.duration",
)


@pytest.fixture
def otel() -> Iterator[Otel]:
    """``test_telemetry``'s providers (made once a process, by whichever test is first)."""
    if test_telemetry._OTEL is None:
        test_telemetry._OTEL = Otel()
    test_telemetry._OTEL.spans.clear()
    yield test_telemetry._OTEL


def agent_run(saver: Any) -> Callable[[], Any]:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        return f"charged {invoice}"

    model = scripted_model(*calls("a1", ("charge", {"invoice": "i1"})))
    agent = create_agent(
        model,
        tools=[charge],
        middleware=[IdempotencyMiddleware(record_model=False)],
        checkpointer=saver,
    )
    return lambda: agent.invoke(
        {"messages": [("user", "pay")]}, {"configurable": {"thread_id": "t"}}
    )


def flow_run(saver: Any) -> Callable[[], Any]:
    @idempotent_task
    def charge(invoice: str) -> str:
        return f"charged {invoice}"

    @entrypoint(checkpointer=saver)
    def pay(invoice: str) -> str:
        return str(charge(invoice).result())

    return lambda: pay.invoke("i1", {"configurable": {"thread_id": "t"}})


def traced(otel: Otel, tmp: Path, name: str, door: str) -> tuple[list[Any], dict[str, float]]:
    """One fresh call through ``door`` under a ``request`` span: its spans (name, parent's
    name, status), the claim span's attributes, and what the metrics counted."""
    otel.spans.clear()
    before = otel.counted()
    with sync_saver("sqlite", tmp, name) as (saver, _):
        run = agent_run(saver) if door == "middleware" else flow_run(saver)
        with otel.tracer.start_as_current_span("request"):
            context = contextvars.copy_context()  # the caller's span, in the caller's thread
            with ThreadPoolExecutor(1) as caller:
                caller.submit(context.run, run).result()
    spans = otel.spans.get_finished_spans()
    names = {s.context.span_id: s.name for s in spans if s.context is not None}
    shape = sorted(
        (s.name, names.get(s.parent.span_id) if s.parent else None, s.status.status_code.name)
        for s in spans
    )
    [claim] = otel.named("idem.claim")
    after = otel.counted()
    counted = {k: after.get(k, 0) - before.get(k, 0) for k in COUNTED}
    return [shape, dict(claim.attributes or {})], counted


@pytest.mark.parametrize("door", ["middleware", "task"])
def test_fast_doors_traced_as_the_private_loop_traced(
    otel: Otel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, door: str
) -> None:
    shipped = traced(otel, tmp_path, "shipped", door)
    module: Any = middleware if door == "middleware" else task
    monkeypatch.setattr(module, "prepare_blocking", general_prepare)
    monkeypatch.setattr(module, "finish_blocking", general_finish)
    forced = traced(otel, tmp_path, "general", door)

    assert shipped == forced
    (shape, attributes), counted = shipped
    assert shape == [
        ("execute_tool charge", "request", "UNSET"),  # the call's own (current_call())
        ("idem.claim", "request", "UNSET"),
        ("request", None, "UNSET"),
    ]
    assert attributes["idem.calls"] == 1 and attributes["idem.claimed"] == 1
    assert counted == {
        "idem.calls.claimed": 1,
        "idem.calls.ran": 1,
        "idem.claim.duration": 1,
        "idem.outcome.duration": 1,
    }
