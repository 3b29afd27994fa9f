"""A wide step's fast paths (``engine/wide_step.py``, the inlined ``Running`` of
``IdempotentToolNode._arun_one``) write what the general path writes.

Each step shape runs twice through a real graph on its own SQLite file: once as shipped
(the fast paths taken where their case holds) and once with every fast path turned off
(each returns "not my case", the node runs every call inside ``LedgerEngine.running``).
The ledger rows (every column but the owner and the clock's), the tool messages, what a
re-run of the step replays, and the intents the key step makes must be the same; and the
shipped run must have taken the fast paths the shape allows, the other none of them.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode, telemetry
from langgraph_idem_saver.engine import core, intents, step_writes, wide_step
from langgraph_idem_saver.engine.types import Batch, Kind
from langgraph_idem_saver.engine.upstream import CONFIG_KEY_CHECKPOINT_MAP
from langgraph_idem_saver.ledger import CallIntent
from langgraph_idem_saver.sqlite import ledger_batch

# the ledger's columns compared: all but the owner, and the times (issued, lease, finished)
COLUMNS = (
    "scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id, "
    "status, attempts, replays, conflicts, result_type, result, error, adopted_by, "
    "position, occurrence"
)

Call = tuple[str, dict[str, Any], str]

SHAPES: dict[str, list[Call]] = {
    # every call new, its own id, key and slot: every fast path
    "distinct": [("charge", {"i": i}, f"c{i}") for i in range(12)],
    # identical calls (one tool, one argument set): fork slots' occurrences 0, 1, 2
    "identical arguments": [("charge", {"i": i % 4}, f"c{i}") for i in range(12)],
    # a read-only tool among them: planned call by call, not ledgered
    "a read-only call": [("charge", {"i": i}, f"c{i}") for i in range(6)]
    + [("lookup", {"q": "x"}, "r0")],
    # one id twice in the message: the second follows the first (same key)
    "a repeated call id": [("charge", {"i": i}, f"c{i}") for i in range(6)]
    + [("charge", {"i": 0}, "c0")],
    # a tool returning an error message: a ``failed`` row
    "a failed call": [("charge", {"i": i}, f"c{i}") for i in range(5)]
    + [("refuse", {"i": 9}, "f0")],
}


def make_tools(ran: list[str]) -> list[Any]:
    @tool
    async def charge(i: int) -> str:
        """Charge one card."""
        ran.append(f"charge {i}")
        return f"charged {i}"

    @tool
    async def lookup(q: str) -> str:
        """Look something up."""
        ran.append(f"lookup {q}")
        return f"found {q}"

    @tool
    async def refuse(i: int) -> ToolMessage:
        """Refuse, as an error message."""
        ran.append(f"refuse {i}")
        return ToolMessage(f"refused {i}", tool_call_id="", status="error")

    return [charge, lookup, refuse]


class GeneralNode(IdempotentToolNode):
    """Every call through ``LedgerEngine.running``, as a traced step's calls."""

    _inline_runs = False


@contextmanager
def general_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Every ``wide_step`` fast path answers "not my case" (its caller's loop runs), and
    SQLite writes the claim's and the outcomes' rows a statement each (``ledger_batch``)."""
    with monkeypatch.context() as patch:
        patch.setattr(ledger_batch, "AT_ONCE", False)
        patch.setattr(core, "plan_distinct", lambda *a: False)
        patch.setattr(intents, "distinct_calls", lambda *a: None)
        patch.setattr(core, "all_claimed", lambda *a: False)
        patch.setattr(step_writes, "all_recorded", lambda *a: False)
        yield


@contextmanager
def taken(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How often each fast path took its case (and how often ``running`` was entered)."""
    seen = {"plan_distinct": 0, "distinct_calls": 0, "all_claimed": 0, "all_recorded": 0}
    seen["running"] = 0
    real_running = core.LedgerEngine.running

    def running(self: core.LedgerEngine, batch: Batch, plan: Any) -> Any:
        seen["running"] += 1
        return real_running(self, batch, plan)

    with monkeypatch.context() as patch:

        def spy(module: Any, name: str) -> None:
            real = getattr(module, name)

            def counted(*args: Any) -> Any:
                got = real(*args)
                seen[name] += got is not None and got is not False
                return got

            patch.setattr(module, name, counted)

        spy(core, "plan_distinct")
        spy(intents, "distinct_calls")
        spy(core, "all_claimed")
        spy(step_writes, "all_recorded")
        patch.setattr(core.LedgerEngine, "running", running)
        yield seen


async def run_shape(
    path: str, calls: list[Call], node_class: type[IdempotentToolNode]
) -> dict[str, Any]:
    """The step twice on one thread (the second replays), the rows after each."""
    ran: list[str] = []
    node = node_class(make_tools(ran), read_only={"lookup"})
    builder = StateGraph(MessagesState)
    builder.add_node("tools", node)
    builder.add_edge(START, "tools")
    message = AIMessage(
        "",
        id="ai-1",
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls],
    )
    config = {"configurable": {"thread_id": "wide"}, "run_id": None}
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        graph = builder.compile(checkpointer=saver)
        first = await graph.ainvoke({"messages": [message]}, config, durability="sync")
        ran_first = list(ran)
        rows_first = ledger_rows(path)
        again = await graph.ainvoke({"messages": [message]}, config, durability="sync")
    return {
        "ran": sorted(ran_first),
        "ran_again": sorted(ran[len(ran_first) :]),
        "rows": rows_first,
        "rows_again": ledger_rows(path),
        "branches": branches(path),
        "messages": replies(first),
        "messages_again": replies(again),
        "counters": node.counters,
    }


def ledger_rows(path: str) -> list[tuple[Any, ...]]:
    with sqlite3.connect(path) as conn:
        return conn.execute(
            f"SELECT {COLUMNS} FROM idem_tool_calls ORDER BY tool_call_id, key"
        ).fetchall()


def branches(path: str) -> set[Any]:
    """The fork slots' branches (the checkpoint the step ran from: a uuid a run)."""
    with sqlite3.connect(path) as conn:
        return {b for (b,) in conn.execute("SELECT branch FROM idem_tool_calls")}


def replies(out: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [
        (m.tool_call_id, m.content, m.status) for m in out["messages"] if isinstance(m, ToolMessage)
    ]


@pytest.mark.parametrize("shape", list(SHAPES))
async def test_fast_and_general_paths_write_the_same_rows(
    shape: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = SHAPES[shape]
    # an OpenTelemetry provider set by a test that ran earlier in this process would make
    # every step traced (a span a call: no inlined run); these steps run untraced
    monkeypatch.setattr(telemetry, "ENABLED", False)
    with taken(monkeypatch) as fast_seen:
        fast = await run_shape(os.path.join(tmp_path, "fast.db"), calls, IdempotentToolNode)
    with taken(monkeypatch) as general_seen, general_path(monkeypatch):
        general = await run_shape(os.path.join(tmp_path, "general.db"), calls, GeneralNode)

    for part in ("ran", "ran_again", "rows", "rows_again", "messages", "messages_again"):
        assert fast[part] == general[part], part
    assert fast["counters"] == general["counters"]
    # what the rows say, so that two equally wrong runs could not pass
    ledgered = {i for n, _, i in calls if n != "lookup"}
    assert {r[7] for r in fast["rows"]} == ledgered
    # every ledgered call replayed, none run again (a read-only one runs again)
    assert fast["ran_again"] == sorted(f"lookup {a['q']}" for n, a, _ in calls if n == "lookup")
    assert all(r[9] in ("completed", "failed") for r in fast["rows"])
    assert all(b[11] > a[11] for a, b in zip(fast["rows"], fast["rows_again"], strict=True))
    assert len(fast["branches"]) == 1 and None not in fast["branches"]
    assert len(general["branches"]) == 1 and None not in general["branches"]

    # the general run took no fast path; the shipped one took those its shape allows
    assert general_seen == {
        "plan_distinct": 0, "distinct_calls": 0, "all_claimed": 0, "all_recorded": 0,
        "running": len(general["rows"]),  # each call run (one a row), in the first run
    }  # fmt: skip
    ids = [i for _, _, i in calls]
    own_ids = len(set(ids)) == len(ids)
    assert fast_seen["plan_distinct"] == (2 if own_ids and shape != "a read-only call" else 0)
    own_slots = own_ids and shape != "identical arguments"
    assert fast_seen["distinct_calls"] == (2 if own_slots else 0)
    assert fast_seen["all_claimed"] == 1  # the first run's claim: every row new
    assert fast_seen["all_recorded"] >= 1
    # inlined, but for a call others of its step follow (it publishes its result)
    assert fast_seen["running"] == len(ids) - len(set(ids))


async def test_a_raising_tool_leaves_the_same_unknown_outcome(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call whose tool raises (the exception escapes ToolNode) is abandoned - issued,
    its lease ended, its error kept - through the inlined path as through ``Running``."""

    @tool
    async def explode(i: int) -> str:
        """Fail after the effect might have landed."""
        raise RuntimeError(f"timeout {i}")

    async def rows_after(path: str, node_class: type[IdempotentToolNode]) -> list[Any]:
        builder = StateGraph(MessagesState)
        builder.add_node("tools", node_class([explode]))
        builder.add_edge(START, "tools")
        message = AIMessage(
            "", id="ai-x", tool_calls=[{"name": "explode", "args": {"i": 1}, "id": "x1"}]
        )
        async with AsyncSqliteSaver.from_conn_string(path) as saver:
            graph = builder.compile(checkpointer=saver)
            with pytest.raises(RuntimeError, match="timeout 1"):
                await graph.ainvoke({"messages": [message]}, {"configurable": {"thread_id": "x"}})
            entry = (await saver.alist_entries())[0]
            assert entry.is_unknown()  # the lease ended at once, not after its length
        return ledger_rows(path)

    fast = await rows_after(os.path.join(tmp_path, "fast.db"), IdempotentToolNode)
    with general_path(monkeypatch):
        general = await rows_after(os.path.join(tmp_path, "general.db"), GeneralNode)
    assert fast == general
    (row,) = fast
    assert row[9] == "issued" and row[15] == "RuntimeError: timeout 1"


async def test_the_key_step_makes_the_same_intents_at_once_and_call_by_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wide_step.distinct_calls`` against ``key_calls``' loop, with and without a fork
    point: the same intents (every field), leaders, kinds and policies."""

    def planned(calls: list[Call], config: dict[str, Any]) -> tuple[list[Any], list[Any]]:
        engine = core.LedgerEngine(
            core.LedgerOptions.build(tools={}), name="tools", messages_key="messages"
        )
        batch = Batch(sync=False)
        for n, a, i in calls:
            plan = engine.add_call(batch, {"name": n, "args": a, "id": i, "type": "tool_call"})
            plan.kind = Kind.PENDING
        engine.note_state(batch, [(i, "ai-1") for _, _, i in calls])
        site = intents.site_of(config, None, "tools")
        leaders = intents.key_calls(
            batch.all_plans, site, config, batch.origins, engine.options.policy_for,
            engine.counters,
        )  # fmt: skip
        plans = [(p.intent, p.kind, p.policy, p.leader) for p in batch.all_plans]
        return [p.intent for p in leaders], plans

    in_graph = {
        "configurable": {
            "thread_id": "t",
            "checkpoint_ns": "tools:task-1",
            CONFIG_KEY_CHECKPOINT_MAP: {"": "branch-1"},
        },
        "metadata": {"langgraph_step": 3},
    }
    outside = {"configurable": {"thread_id": "t"}}
    calls = [("charge", {"i": i, "note": "é\u2028"}, f"c{i}") for i in range(9)]
    for config in (in_graph, outside):
        with taken(monkeypatch) as seen:
            fast = planned(calls, config)
        assert seen["distinct_calls"] == 1
        with general_path(monkeypatch):
            general = planned(calls, config)
        assert fast == general
        leaders = fast[0]
        assert all(isinstance(i, CallIntent) for i in leaders) and len(leaders) == 9
        expect_position = config is in_graph
        assert all((i.position is not None) is expect_position for i in leaders)


def test_records_from_columns_equal_records_from_their_constructor() -> None:
    columns: dict[str, list[Any]] = {
        "scope": ["s1", "s2"], "key": ["k1", "k2"], "thread_id": ["t", "t"],
        "agent_path": ["", "a|b"], "tool_name": ["x", "y"], "args_hash": ["h1", "h2"],
        "args": [b"{}", b"[1]"], "tool_call_id": ["c1", "c2"], "run_id": [None, "r"],
        "position": [None, "p"], "branch": [None, "b"], "occurrence": [0, 2],
    }  # fmt: skip
    made = CallIntent._of_columns(columns, 2)
    built = [CallIntent(**{name: values[i] for name, values in columns.items()}) for i in (0, 1)]
    assert made == built
    assert [hash(m) for m in made] == [hash(b) for b in built]
    with pytest.raises(dataclasses.FrozenInstanceError):
        made[0].key = "other"  # type: ignore[misc]


def test_set_each_sets_one_field_of_each_object() -> None:
    class Box:
        value: Any = None

    boxes = [Box() for _ in range(3)]
    wide_step.set_each(boxes, "value", iter([1, 2, 3]))
    assert [b.value for b in boxes] == [1, 2, 3]


def intents_for(scope: str, n: int, start: int = 0) -> list[CallIntent]:
    return [
        CallIntent(
            scope=scope, key=f"k{i}", thread_id=scope, agent_path="", tool_name="charge",
            args_hash=f"h{i}", args=b'{"i":%d}' % i, tool_call_id=f"c{i}", position="p",
            branch="b", occurrence=i,
        )
        for i in range(start, start + n)
    ]  # fmt: skip


async def test_a_claim_inserting_every_row_answers_the_entries_it_stored(tmp_path: Any) -> None:
    """SQLite's claim of a fresh step builds its entries at once (``Claims.
    issued_entries``): each equal to the row read back, and to what a claim that had
    to read some rows back answers for the rows it inserted."""
    async with AsyncSqliteSaver.from_conn_string(os.path.join(tmp_path, "c.db")) as saver:
        await saver.setup()
        fresh = await saver.aclaim(intents_for("s", 6), owner="me", lease_seconds=60)
        assert [o.claimed for o in fresh] == [True] * 6
        for outcome in fresh:
            assert outcome.entry == await saver.aget_entry("s", outcome.entry.key)
            assert outcome.entry.status.value == "issued" and outcome.entry.attempts == 1
        # two rows taken already: the general path, the same entries for the rows it adds
        mixed = await saver.aclaim(intents_for("s", 4, start=4), owner="other", lease_seconds=60)
        assert [o.claimed for o in mixed] == [False, False, True, True]
        assert [o.entry for o in mixed[:2]] == [o.entry for o in fresh[4:]]
        for outcome in mixed[2:]:
            assert outcome.entry == await saver.aget_entry("s", outcome.entry.key)
            assert outcome.entry.owner == "other"


async def test_outcome_rows_one_refused_by_the_database_the_others_recorded(
    tmp_path: Any,
) -> None:
    """A batch of outcome rows (``record_outcome_rows``), its UPDATEs sent through
    ``map``: a row the database refuses (here the status' CHECK) is that row's error
    alone, and the rows before and after it are recorded, as row by row."""
    async with AsyncSqliteSaver.from_conn_string(os.path.join(tmp_path, "o.db")) as saver:
        await saver.setup()
        await saver.aclaim(intents_for("s", 4), owner="me", lease_seconds=60)
        rows = [
            ("completed" if i != 1 else "bogus", "msgpack", b"\x01", None, 1.0, "s", f"k{i}", "me")
            for i in range(4)
        ]
        errors = await saver.record_outcome_rows(rows)
        assert errors[0] is None and errors[2] is None and errors[3] is None
        assert isinstance(errors[1], Exception)
        statuses = [(await saver.aget_entry("s", f"k{i}")).status.value for i in range(4)]
        assert statuses == ["completed", "issued", "completed", "completed"]
