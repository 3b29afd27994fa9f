"""Forks of one thread never both run the same logical call (issue 15 item 11).

Two workers that resume one thread at the same moment, when its last checkpoint has the
model step pending, both re-run the model; LangGraph forks the checkpoint chain and each
branch asks for the same charges under fresh tool-call ids. Under the default key policy
each branch's call is a new key, so only the fork slot (``engine/forks.py``) ties the two
together: the branch that claims first runs the call, the other replays it (or waits for
it).
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.config import get_config
from langgraph.graph import START, MessagesState, StateGraph
from pg_server import fresh_dsn
from resume_worker import CRASH_EXIT_CODE, FAILED_EXIT_CODE, effects_lines
from test_concurrent_resume import collect
from test_concurrent_resume import spawn as spawn_worker

from langgraph_idem_saver.engine.forks import fork_point

WORKER = Path(__file__).with_name("fork_worker.py")
INVOICES = ["inv-0", "inv-1"]


def run_children(scenarios: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the workers at once; each must report (finished, or failed with a report)."""
    results = [spawn(s) for s in scenarios]
    payloads = []
    for code, payload, err in map(collect, results):
        assert payload is not None, f"exit {code}: {err}"
        assert code in (0, FAILED_EXIT_CODE), err
        payloads.append(payload)
    return payloads


def spawn(scenario: dict[str, Any]) -> subprocess.Popen[str]:
    return spawn_worker(scenario, WORKER)


def where(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if backend == "sqlite":
        return {"db": str(tmp_path / "a.db")}
    return {"dsn": fresh_dsn(request.getfixturevalue("pg_server_dsn"))}


def test_two_resumers_that_fork_a_thread_charge_each_invoice_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    scenario = {**where(backend, tmp_path, request), "effects": str(tmp_path / "effects")}
    [prepared] = run_children([{**scenario, "phase": "prepare"}])
    assert prepared["ok"] and prepared["ledger"] == [], prepared

    barrier = {"dir": str(tmp_path / "barrier"), "n": 2}
    payloads = run_children([{**scenario, "phase": "resume", "barrier": barrier}] * 2)

    assert all(p["ok"] for p in payloads), [p.get("traceback") for p in payloads]
    assert Counter(effects_lines(tmp_path / "effects")) == dict.fromkeys(INVOICES, 1), (
        "each invoice charged once although both branches asked for it"
    )
    executed = sorted(p["counters"]["executed"] for p in payloads)
    assert sum(executed) == 2, "two charges ran in all: the other branch replayed them"
    ledger = payloads[-1]["ledger"]
    assert sorted(status for _, status, _ in ledger) == ["completed", "completed"]


@pytest.mark.parametrize("crash_at", ["after_issued", "after_effect"])
def test_a_reworded_call_after_a_lost_message_is_settled_by_the_lost_one(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, crash_at: str
) -> None:
    """Issue 15 item 5. Durability ``"exit"``: the process dies in the tools step, so
    the model's message is lost with it; the re-run model asks for the same charges with
    other arguments (a fresh memo), so orphan adoption cannot match them. The lost call
    of the same step and tool is settled first - ``verify`` asked with *its* arguments:
    landed, the new call is answered with it; not landed, it is closed and the new call
    runs. Each invoice is charged once, and no entry is left ``issued``. A lost call
    answers a reworded one only when the user chose it (``on_earlier_call="replay"``;
    the default asks: ``tests/test_no_silent_guesses.py``)."""
    scenario = {
        **where(backend, tmp_path, request),
        "effects": str(tmp_path / "effects"),
        "on_earlier_call": "replay",
        "reword": True,
        "durability": "exit",
        "crash_at": crash_at,
        "crash_invoice": "inv-1",
    }
    code, _, err = collect(spawn({**scenario, "phase": "run"}))
    assert code == CRASH_EXIT_CODE, err
    [resumed] = run_children([{**scenario, "phase": "resume"}])

    assert resumed["ok"], resumed.get("traceback")
    assert Counter(effects_lines(tmp_path / "effects")) == dict.fromkeys(INVOICES, 1)
    statuses = Counter(status for _, status, _ in resumed["ledger"])
    assert statuses["issued"] == 0, "no lost call left unknown in pending"
    assert statuses["completed"] == 2 and resumed["counters"]["adopted"] >= 1


def test_a_reworded_call_asks_the_human_about_the_lost_one_first(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Item 5 without a ``verify`` hook: the lost charge is surfaced as an interrupt about
    *its* arguments, naming the new call that waits on it - never run past it. The human
    found the charge, then is asked about the new call (``earlier_call``) and, seeing the
    same invoice, answers it with the lost call's outcome: nothing runs twice."""
    scenario = {
        **where(backend, tmp_path, request),
        "effects": str(tmp_path / "effects"),
        "reword": True,
        "durability": "exit",
        "crash_at": "after_effect",
        "crash_invoice": "inv-1",
        "ask_human": True,
    }
    code, _, err = collect(spawn({**scenario, "phase": "run"}))
    assert code == CRASH_EXIT_CODE, err
    [resumed] = run_children([{**scenario, "phase": "resume"}])

    assert resumed["ok"], resumed.get("traceback")
    assert Counter(effects_lines(tmp_path / "effects")) == dict.fromkeys(INVOICES, 1)
    unknown = [q for q in resumed["asked"] if q["kind"] == "unknown_tool_outcome"]
    [lost] = [q for q in unknown if q["args"]["invoice"] == "inv-1"]
    assert lost["superseded_by"]["args"]["invoice"] == "inv-1"
    assert lost["superseded_by"]["args"]["memo"] != lost["args"]["memo"], "asked: the lost call"
    decided = [q for q in resumed["asked"] if q["kind"] == "earlier_call"]
    assert sorted(q["args"]["invoice"] for q in decided if q["reason"] == "reworded") == INVOICES, (
        "each reworded call decided explicitly once its lost call was settled"
    )
    assert all(status != "issued" for _, status, _ in resumed["ledger"])


async def test_a_graph_step_has_a_fork_point() -> None:
    """``fork_point`` reads LangGraph's private ``checkpoint_map``: if LangGraph stops
    putting it (or the step) in a task's config, forks would silently run twice - fail
    here instead."""
    from langgraph.checkpoint.memory import InMemorySaver

    seen: list[Any] = []

    def node(state: MessagesState) -> dict[str, Any]:
        seen.append(fork_point(get_config(), "t"))
        return {}

    builder = StateGraph(MessagesState)
    builder.add_node("n", node)
    builder.add_edge(START, "n")
    graph = builder.compile(checkpointer=InMemorySaver())
    config: RunnableConfig = {"configurable": {"thread_id": "t"}}
    await graph.ainvoke({"messages": []}, config)
    await graph.ainvoke({"messages": []}, config)
    first, second = seen
    assert first is not None and second is not None
    assert first.position != second.position, "two turns are two positions"
    states = [s async for s in graph.aget_state_history(config)]
    ids = {s.config["configurable"]["checkpoint_id"] for s in states}
    assert first.branch in ids and second.branch in ids, "the branch is the step's checkpoint"
