"""``current_call()`` on the inlined run of an untraced async ``IdempotentToolNode`` step
(``_arun_one`` sets ``RUNNING_CALL`` itself instead of entering ``LedgerEngine.running``).

The same step runs through the inlined path and, as the control, through ``running`` for
every call (``_inline_runs = False``), each on its own SQLite file and one thread id (so
the keys are the same): each call sees its own row's vendor key in its own body, in a
task it spawned (read after the call returned), after a nested graph of another
``IdempotentToolNode`` ran inside it (whose call saw its own key), and in a sync tool's
worker thread; a read-only tool of the step sees none; nothing is left set after the
step. The spy on ``running`` shows which path each run took.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import pytest
from langchain_core.tools import tool
from test_ledger_wide_step_fast import GeneralNode as WideGeneralNode
from test_ledger_wide_step_fast import general_path, ledger_rows, make_tools, replies, taken
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode, NotInLedgeredCall
from langgraph_idem_saver.call_context import RUNNING_CALL, current_call, vendor_key
from langgraph_idem_saver.engine import core


class GeneralNode(IdempotentToolNode):
    """Every call through ``LedgerEngine.running`` (the control)."""

    _inline_runs = False


async def run_step(path: str, node_class: type[IdempotentToolNode]) -> dict[str, Any]:
    """One step of three async calls, a sync call and a read-only call; what each saw."""
    seen: dict[str, Any] = {}
    spawned: list[asyncio.Task[str]] = []

    async def later_key() -> str:
        await asyncio.sleep(0.02)  # read once the call that spawned it has returned
        return current_call().key

    @tool
    async def inner(n: int) -> str:
        """A call of the nested graph."""
        seen[f"inner {n}"] = current_call().key
        return f"inner {n}"

    @tool
    async def outer(n: int) -> str:
        """A call that spawns a task and runs a nested graph of ledgered calls."""
        before = current_call().key
        spawned.append(asyncio.create_task(later_key(), name=f"outer {n}"))
        message = ai_calls(("inner", {"n": n}, f"in{n}"), msg_id=f"ai-in{n}")
        await nested.ainvoke({"messages": [message]}, cfg(f"nested {n}"))
        seen[f"outer {n}"] = (before, current_call().key)
        return f"outer {n}"

    @tool
    def outer_sync(n: int) -> str:
        """A sync call (a worker thread)."""
        seen[f"sync {n}"] = current_call().key
        return f"sync {n}"

    @tool
    async def lookup(n: int) -> str:
        """Read-only: not ledgered."""
        try:
            current_call()
        except NotInLedgeredCall:
            seen[f"lookup {n}"] = None
            return "no key"
        seen[f"lookup {n}"] = "a key"
        return "a key"

    runs = {"running": 0}
    real_running = core.LedgerEngine.running

    def running(self: core.LedgerEngine, batch: Any, plan: Any) -> Any:
        runs["running"] += 1
        return real_running(self, batch, plan)

    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        nested = tool_graph(node_class([inner]), saver)
        graph = tool_graph(node_class([outer, outer_sync, lookup], read_only={"lookup"}), saver)
        message = ai_calls(
            ("outer", {"n": 0}, "o0"), ("outer", {"n": 1}, "o1"), ("outer", {"n": 2}, "o2"),
            ("outer_sync", {"n": 3}, "s3"), ("lookup", {"n": 4}, "r4"), msg_id="ai-1",
        )  # fmt: skip
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(core.LedgerEngine, "running", running)
            await graph.ainvoke({"messages": [message]}, cfg("outer"))
        seen["spawned"] = {t.get_name(): await t for t in spawned}
        seen["left set"] = RUNNING_CALL.get()
        seen["rows"] = {
            e.tool_call_id: vendor_key(e.scope, e.key) for e in await saver.alist_entries("outer")
        }
        for n in range(3):
            nested_rows = await saver.alist_entries(f"nested {n}")
            seen["rows"].update({e.tool_call_id: vendor_key(e.scope, e.key) for e in nested_rows})
    seen["running"] = runs["running"]
    return seen


@pytest.mark.parametrize("node_class", [IdempotentToolNode, GeneralNode])
async def test_each_call_sees_its_own_key_in_tasks_threads_and_nested_graphs(
    node_class: type[IdempotentToolNode], tmp_path: Any
) -> None:
    seen = await run_step(os.path.join(tmp_path, "c.db"), node_class)
    rows = seen["rows"]
    assert set(rows) == {"o0", "o1", "o2", "s3", "in0", "in1", "in2"}  # no read-only row
    for n in range(3):
        own = rows[f"o{n}"]
        assert seen[f"outer {n}"] == (own, own)  # the nested graph left the outer's key
        assert seen["spawned"][f"outer {n}"] == own  # a task it spawned: its key
        assert seen[f"inner {n}"] == rows[f"in{n}"] != own  # the nested call: its own
    assert seen["sync 3"] == rows["s3"]
    assert seen["lookup 4"] is None  # a read-only call of the step sees no key
    assert seen["left set"] is None
    assert len(set(rows.values())) == len(rows)
    # the inlined path enters ``running`` for no call; the control for each of the 7
    assert seen["running"] == (0 if node_class is IdempotentToolNode else 7)


async def test_the_inlined_and_the_general_path_give_the_same_keys(tmp_path: Any) -> None:
    inlined = await run_step(os.path.join(tmp_path, "a.db"), IdempotentToolNode)
    general = await run_step(os.path.join(tmp_path, "b.db"), GeneralNode)
    for part in ("rows", "spawned", "outer 0", "inner 1", "sync 3", "lookup 4"):
        assert inlined[part] == general[part], part


async def run_mixed(path: str, node_class: type[IdempotentToolNode]) -> dict[str, Any]:
    """A step of three calls, then the same message grown to six (a step with three
    calls recorded before and three new ones): the rows and what ran each time."""
    ran: list[str] = []
    graph_node = node_class(make_tools(ran))
    first = ai_calls(*[("charge", {"i": i}, f"c{i}") for i in range(3)], msg_id="ai-1")
    grown = ai_calls(*[("charge", {"i": i}, f"c{i}") for i in range(6)], msg_id="ai-1")
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = tool_graph(graph_node, saver)
        await graph.ainvoke({"messages": [first]}, cfg("mixed"), durability="sync")
        ran_first = sorted(ran)
        out = await graph.ainvoke({"messages": [grown]}, cfg("mixed"), durability="sync")
    return {
        "ran": ran_first,
        "ran_then": sorted(ran[len(ran_first) :]),
        "rows": ledger_rows(path),
        "replies": replies(out)[-6:],
    }


async def test_a_step_mixing_recorded_and_new_calls_leaves_the_fast_claim(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three calls recorded before and three new in one step: the claim refuses the
    recorded three, so its answer is not taken at once (``all_claimed``); the recorded
    calls are replayed, never run again, the new ones run once - the same rows and
    replies as with every fast path off."""
    with taken(monkeypatch) as seen:
        fast = await run_mixed(os.path.join(tmp_path, "fast.db"), IdempotentToolNode)
    with general_path(monkeypatch):
        general = await run_mixed(os.path.join(tmp_path, "general.db"), WideGeneralNode)
    assert fast == general
    assert fast["ran"] == ["charge 0", "charge 1", "charge 2"]
    assert fast["ran_then"] == ["charge 3", "charge 4", "charge 5"]  # the recorded: replayed
    assert [r[9] for r in fast["rows"]] == ["completed"] * 6
    assert seen["all_claimed"] == 1  # the first step's claim only: the second was refused
    assert seen["distinct_calls"] == 2  # both steps keyed at once (their own keys)
