"""A sync step's claim sent from the node's thread (``engine.prepare.prepare_blocking``)
does what the claim on the thread's private loop (``run_private(engine.aprepare)``) did.

``prepare_blocking`` keys the calls in the caller, sends the claim to the ledger's loop
and waits on its future; a fresh step ends there, anything else (an entry found, a fork
slot refused, an unknown outcome to settle) continues on the private loop as before.
The graph test runs the same steps on real SQLite files twice in one process - as
shipped, and with the general path forced - and compares the ledger rows (every column
but the owner and the clock's), the tool messages and the interrupts; the shipped run
must have taken the fast path for its fresh steps and the general one for the others.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command
from test_sync_tool_step_fast import make_tools
from tool_node_helpers import ai_calls, cfg, intent_for, plant_unknown, tool_graph, tool_messages

from langgraph_idem_saver import IdempotentToolNode, tool_node
from langgraph_idem_saver.engine import prepare
from langgraph_idem_saver.engine.core import LedgerEngine
from langgraph_idem_saver.engine.loops import run_private
from langgraph_idem_saver.engine.types import Batch
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.sqlite import SqliteSaver

COLUMNS = (
    "scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id, "
    "status, attempts, replays, conflicts, result_type, result, error, adopted_by, "
    "position, occurrence"
)


def by_amount(call: Any, ctx: Any) -> str:
    """A ``key_fn``: one key an amount (calls of one amount follow the first)."""
    KEYED_IN.add(threading.current_thread().name)
    return f"amount-{call['args']['i']}"


KEYED_IN: set[str] = set()
REFUSE = ("refuse", {"i": 1}, "f1")

# (node, thread, calls): "plain" keys by call id (the adoption read rides on the claim),
# "keyed" by ``by_amount`` (no adoption read: the plain claim)
STEPS: list[tuple[str, str, list[tuple[str, dict[str, Any], str]]]] = [
    ("plain", "t1", [("charge", {"i": i}, f"c{i}") for i in range(10)]),
    ("plain", "t1", [("charge", {"i": i}, f"c{i}") for i in range(10)]),  # replayed
    ("plain", "t2", [("charge", {"i": i % 3}, f"d{i}") for i in range(6)] + [REFUSE]),
    ("keyed", "k1", [("charge", {"i": i % 4}, f"k{i}") for i in range(8)]),  # followers
    ("keyed", "k1", [("charge", {"i": i}, f"m{i}") for i in range(5)]),  # found: replays
]  # fmt: skip


class Paths:
    """Which way each claim went: ``fast`` fresh steps, ``general`` the others."""

    def __init__(self) -> None:
        self.fast = 0
        self.general = 0


@pytest.fixture
def paths(monkeypatch: pytest.MonkeyPatch) -> Iterator[Paths]:
    seen = Paths()
    real_aclaimed = prepare.aclaimed

    def counted_aclaimed(*args: Any, **kwargs: Any) -> Any:
        seen.general += 1
        return real_aclaimed(*args, **kwargs)

    real_wait = prepare.wait_on

    def counted_wait(*args: Any) -> Any:
        seen.fast += 1
        return real_wait(*args)

    monkeypatch.setattr(prepare, "aclaimed", counted_aclaimed)
    monkeypatch.setattr(prepare, "wait_on", counted_wait)
    yield seen


def general(engine: LedgerEngine, batch: Batch, config: Any) -> None:
    """The earlier path: the whole preparation on the thread's private loop."""
    run_private(engine.aprepare(batch, config))


def run_steps(db: Path) -> tuple[list[tuple[Any, ...]], list[Any]]:
    conn = sqlite3.connect(db, check_same_thread=False)
    seen: list[Any] = []
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            graphs = {
                "plain": tool_graph(
                    IdempotentToolNode(make_tools(), handle_tool_errors=True), saver
                ),
                "keyed": tool_graph(IdempotentToolNode(make_tools(), key_policy=by_amount), saver),
            }
            with ThreadPoolExecutor(1) as caller:  # one thread, as a program's main thread
                for n, (node, thread, calls) in enumerate(STEPS):
                    msg = ai_calls(*calls, msg_id=f"ai-{thread}-{n if n != 1 else 0}")
                    graph: Any = graphs[node]
                    out = caller.submit(graph.invoke, {"messages": [msg]}, cfg(thread)).result()
                    step = tool_messages(out)[-len(calls) :]  # this step's answers
                    seen.append([(str(m.tool_call_id), str(m.content), m.status) for m in step])
                # an unknown outcome: interrupt() on the private loop, then a resume
                asyncio.run(plant_unknown(saver, intent_for("u", {"name": "charge",
                    "args": {"i": 7}, "id": "u1"})))  # fmt: skip
                msg = ai_calls(("charge", {"i": 7}, "u1"))
                out = caller.submit(graphs["plain"].invoke, {"messages": [msg]}, cfg("u")).result()
                seen.append(out["__interrupt__"][0].value["kind"])
                resume = Command(resume={"action": "rerun"})
                out = caller.submit(graphs["plain"].invoke, resume, cfg("u")).result()
                seen.append(tool_messages(out)[-1].content)
    finally:
        conn.close()
    with sqlite3.connect(db) as read:
        rows = read.execute(
            f"SELECT {COLUMNS} FROM idem_tool_calls ORDER BY thread_id, tool_call_id, key"
        ).fetchall()
    return rows, seen


def test_fast_claim_writes_what_the_private_loop_wrote(
    tmp_path: Path, paths: Paths, monkeypatch: pytest.MonkeyPatch
) -> None:
    KEYED_IN.clear()
    shipped = run_steps(tmp_path / "shipped.db")
    fast, continued = paths.fast, paths.general
    shipped_keyed_in = set(KEYED_IN)

    monkeypatch.setattr(tool_node, "prepare_blocking", general)
    paths.fast = paths.general = 0
    forced = run_steps(tmp_path / "general.db")

    assert shipped == forced
    rows, seen = shipped
    assert len(rows) == 10 + 7 + 4 + 1 + 1  # t1, t2 (fork slots, refuse), k1's keys, u1
    assert {r[9] for r in rows} >= {"completed", "failed"}
    assert seen[1] == seen[0]  # the replay answers what the first run returned
    assert any(status == "error" for _, _, status in seen[2])
    assert seen[-2:] == ["unknown_tool_outcome", "charged 7"]
    # shipped: every claim sent from the caller; four went on on the private loop as
    # before - t1's replay, k1's found keys, u1's unknown outcome and its resume
    assert fast == len(STEPS) + 2
    assert continued == 4
    assert paths.fast == 0 and paths.general == len(STEPS) + 2  # forced: never fast
    # key_fn ran in the node's thread (which LangGraph's threads run it varies), as
    # before: never on the saver's loop thread (named "SqliteSaver")
    assert shipped_keyed_in and KEYED_IN
    assert "SqliteSaver" not in shipped_keyed_in | KEYED_IN


def test_refused_inside_a_running_loop_before_any_key(tmp_path: Path) -> None:
    """From a thread running a loop, the sync node's ``ConfigError`` comes first, as
    ``run_private``'s did: no key computed, no claim sent."""
    KEYED_IN.clear()
    conn = sqlite3.connect(tmp_path / "loop.db", check_same_thread=False)
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            graph: Any = tool_graph(IdempotentToolNode(make_tools(), key_policy=by_amount), saver)
            msg = ai_calls(("charge", {"i": 1}, "x1"))

            async def inside() -> None:
                with pytest.raises(ConfigError, match="event loop"):
                    graph.invoke({"messages": [msg]}, cfg("x"))

            asyncio.run(inside())
            assert not KEYED_IN
    finally:
        conn.close()
    with sqlite3.connect(tmp_path / "loop.db") as read:
        assert read.execute("SELECT count(*) FROM idem_tool_calls").fetchone() == (0,)
