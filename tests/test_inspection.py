"""The inspection API: entries, unknown outcomes, counters, and settling by hand."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from tool_node_helpers import (
    Counter,
    ai_calls,
    cfg,
    intent_for,
    plant_completed,
    plant_in_progress,
    tool_graph,
    tool_messages,
)

from langgraph_idem_saver import IdempotentToolNode, LedgerStateError
from langgraph_idem_saver.inspection import (
    aentries,
    aresolve_unknown,
    astats,
    aunknown_outcomes,
    decode_args,
    decode_result,
)
from langgraph_idem_saver.owners import make_owner

CALL = {"name": "charge", "args": {"invoice": "inv-9", "amount": 5}, "id": "call_9"}


def dead_owner() -> str:
    """An owner string naming a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host, _, nonce = make_owner().split(":")
    return f"{host}:{child.pid}:{nonce}"


async def plant_crashed(saver: Any, call: dict[str, Any], thread_id: str) -> Any:
    """An issued entry whose process died (long lease: only owner death makes it unknown)."""
    [outcome] = await saver.aclaim(
        [intent_for(thread_id, call)], owner=dead_owner(), lease_seconds=3600
    )
    return outcome.entry


async def test_a_dead_owner_makes_an_unknown_outcome_without_waiting_for_the_lease(
    saver: Any,
) -> None:
    entry = await plant_crashed(saver, CALL, "t-dead")
    await plant_in_progress(saver, intent_for("t-live", {**CALL, "id": "call_live"}))
    unknown = await aunknown_outcomes(saver)
    assert [e.key for e in unknown] == [entry.key], "only the dead process's call"
    assert decode_args(unknown[0]) == CALL["args"]


async def test_stats_count_each_state(saver: Any) -> None:
    await plant_crashed(saver, CALL, "t1")
    await plant_in_progress(saver, intent_for("t1", {**CALL, "id": "c2"}))
    done = await plant_completed(
        saver, intent_for("t1", {**CALL, "id": "c3"}), ToolMessage("ok", tool_call_id="c3")
    )
    await saver.anote_replay(done.scope, done.key)
    await saver.anote_replay(done.scope, done.key, conflict=True)
    stats = await astats(saver, "t1")
    assert (stats.executed, stats.unknown, stats.in_progress, stats.replayed, stats.conflicts) == (
        1,
        1,
        1,
        1,
        1,
    )
    assert stats.by_status == {"issued": 2, "completed": 1}
    assert (await astats(saver, "other-thread")).by_status == {}


async def call_again(saver: Any, thread_id: str) -> tuple[Counter, dict[str, Any]]:
    """The agent sends :data:`CALL` again on ``thread_id`` (as a resume does), to a
    ``charge`` tool that counts its runs: those runs, and what the graph returned."""
    charges = Counter()

    @tool
    def charge(invoice: str, amount: int) -> str:
        """Charge."""
        charges.bump(invoice)
        return f"charged {invoice}"

    graph = tool_graph(IdempotentToolNode([charge]), saver)
    out = await graph.ainvoke(
        {"messages": [ai_calls(("charge", CALL["args"], "call_9"))]}, cfg(thread_id)
    )
    return charges, out


async def test_resolve_completed_is_replayed_by_the_next_resume(saver: Any) -> None:
    entry = await plant_crashed(saver, CALL, "t-res")
    settled = await aresolve_unknown(saver, entry, "completed", result="charged inv-9 (by hand)")
    assert settled is not None and settled.status.value == "completed"
    assert decode_result(saver, settled).content == "charged inv-9 (by hand)"

    charges, out = await call_again(saver, "t-res")
    assert len(charges) == 0, "the operator said it happened: not re-run"
    assert [m.content for m in tool_messages(out)] == ["charged inv-9 (by hand)"]


async def test_resolve_rerun_lets_the_next_resume_run_it(saver: Any) -> None:
    entry = await plant_crashed(saver, CALL, "t-rerun")
    approved = await aresolve_unknown(saver, entry, "rerun")
    assert approved.rerun_approved() and approved.attempts == entry.attempts
    charges, out = await call_again(saver, "t-rerun")
    assert len(charges) == 1
    assert [m.content for m in tool_messages(out)] == ["charged inv-9"]
    [done] = await aentries(saver, "t-rerun")
    assert done.status.value == "completed" and done.attempts == entry.attempts + 1


async def test_resolve_failed_replays_the_error(saver: Any) -> None:
    entry = await plant_crashed(saver, CALL, "t-fail")
    settled = await aresolve_unknown(saver, entry, "failed", error="card declined")
    assert settled is not None and settled.error == "card declined"
    message = decode_result(saver, settled)
    assert (message.status, message.content) == ("error", "Error: card declined")


async def test_resolve_refuses_what_is_not_unknown_or_changed(saver: Any) -> None:
    done = await plant_completed(
        saver, intent_for("t-x", CALL), ToolMessage("ok", tool_call_id="call_9")
    )
    with pytest.raises(LedgerStateError, match="not an unknown outcome: completed"):
        await aresolve_unknown(saver, done, "completed", result="x")
    live = await plant_in_progress(saver, intent_for("t-y", CALL))
    with pytest.raises(LedgerStateError, match="still leased"):
        await aresolve_unknown(saver, live, "rerun")
    crashed = await plant_crashed(saver, CALL, "t-z")
    await aresolve_unknown(saver, crashed, "failed", error="settled by someone else")
    with pytest.raises(LedgerStateError, match="not an unknown outcome: failed"):
        await aresolve_unknown(saver, crashed, "completed", result="late")
