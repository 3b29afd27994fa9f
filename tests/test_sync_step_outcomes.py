"""A sync ``graph.invoke`` step's outcomes: handed from the tools' threads to the ledger's
loop and awaited once at the step's end (``langgraph_idem_saver.sync_step_writes``).

Real parts: our sync ``SqliteSaver`` on a real SQLite file, read back with a second
connection right after ``invoke`` returns - every outcome must be committed by then
(``docs/guarantees.md``). The engine's own ``afinish``/``aoutcomes`` are counted by
wrapping them on the node's engine (they still run).
"""

from __future__ import annotations

import asyncio
import contextvars
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import Counter, ai_calls, cfg, tool_graph, tool_messages

from langgraph_idem_saver import IdempotentToolNode, SerializationError
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_step_writes import wait_on


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def saver(db_file: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(db_file, check_same_thread=False)
    try:
        with SqliteSaver(conn) as s:
            s.setup()
            yield s
    finally:
        conn.close()


def ledger_rows(db_file: Path, thread: str) -> dict[str, tuple[str, str | None]]:
    """tool call id -> (status, error), read with a connection of its own."""
    with sqlite3.connect(db_file) as conn:
        rows = conn.execute(
            "SELECT tool_call_id, status, error FROM idem_tool_calls WHERE thread_id = ?",
            (thread,),
        ).fetchall()
    return {call_id: (status, error) for call_id, status, error in rows}


def counted(node: IdempotentToolNode) -> dict[str, int]:
    """Count the engine's ``afinish`` (a call awaiting its own outcome) and ``aoutcomes``
    (a step's outcomes awaited together) of ``node``; both still run."""
    counts = {"afinish": 0, "aoutcomes": 0}
    engine = node.engine
    for name in counts:
        real = getattr(engine, name)

        def wrapper(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _real(*args, **kwargs)

        setattr(engine, name, wrapper)
    return counts


def sync_tools(fx: Counter) -> list[Any]:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer (a sync tool)."""
        fx.bump(amount)
        return f"charged {amount}"

    @tool
    def explode(amount: int) -> str:
        """Fails with an error handle_tool_errors lets out."""
        fx.bump(-amount)
        raise KeyError("boom")

    @tool(response_format="content_and_artifact")
    def opaque(amount: int) -> tuple[str, Any]:
        """Returns an artifact the serializer refuses."""
        fx.bump(amount)
        return "done", object()

    return [charge, explode, opaque]


def test_a_ten_call_step_awaits_its_outcomes_once_and_all_are_committed(
    saver: SqliteSaver, db_file: Path
) -> None:
    fx = Counter()
    node = IdempotentToolNode(sync_tools(fx))
    counts = counted(node)
    graph = tool_graph(node, saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(10)]
    out = graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    # read at once: every outcome committed before invoke returned
    assert ledger_rows(db_file, "t") == {f"c{i}": ("completed", None) for i in range(10)}
    contents = sorted(m.content for m in tool_messages(out))
    assert contents == sorted(f"charged {i}" for i in range(10))
    assert counts == {"afinish": 0, "aoutcomes": 1}  # one hop for the step's outcomes
    assert node.counters.executed == 10 and sorted(fx.calls) == list(range(10))

    # replayed, never re-run: the rows are what a re-run of the step reads
    again = IdempotentToolNode(sync_tools(fx))
    graph2 = tool_graph(again, saver)
    graph2.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    assert len(fx) == 10 and again.counters.replayed == 10 and again.counters.executed == 0


def test_duplicate_calls_of_a_step_still_record_their_own_and_follow(
    saver: SqliteSaver, db_file: Path
) -> None:
    fx = Counter()
    node = IdempotentToolNode(sync_tools(fx), key_policy="args")
    counts = counted(node)
    graph = tool_graph(node, saver)
    calls = [("charge", {"amount": 7}, "a"), ("charge", {"amount": 7}, "b")]
    calls += [("charge", {"amount": i}, f"c{i}") for i in range(3)]
    out = graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    assert sorted(fx.calls) == [0, 1, 2, 7]  # the twin ran once
    assert {m.tool_call_id: m.content for m in tool_messages(out)}["b"] == "charged 7"
    # the leader (followed) awaited its own outcome; the others were handed over
    assert counts == {"afinish": 1, "aoutcomes": 1}
    assert {s for s, _ in ledger_rows(db_file, "t").values()} == {"completed"}
    assert node.counters.replayed == 1


def test_a_call_raising_out_of_the_step_leaves_its_siblings_committed(
    saver: SqliteSaver, db_file: Path
) -> None:
    fx = Counter()
    charge, _, _ = sync_tools(fx)

    @tool
    def explode(amount: int) -> str:
        """Fails once the four charges started: LangGraph's executor cancels the calls
        not started yet when one raises (those are released, never run)."""
        fx.bump(-amount)
        deadline = time.monotonic() + 30
        while sum(c >= 0 for c in list(fx.calls)) < 4:
            assert time.monotonic() < deadline, "the charges never started"
            time.sleep(0.002)
        raise KeyError("boom")

    node = IdempotentToolNode([charge, explode], handle_tool_errors=False, on_unknown="raise")
    graph = tool_graph(node, saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(4)]
    calls.insert(1, ("explode", {"amount": 9}, "x"))
    with pytest.raises(KeyError):
        graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    rows = ledger_rows(db_file, "t")
    assert {k: v for k, v in rows.items() if k != "x"} == {
        f"c{i}": ("completed", None) for i in range(4)
    }
    status, error = rows["x"]  # an unknown outcome: issued, its lease ended, error kept
    assert status == "issued" and error is not None and "KeyError" in error
    assert sorted(fx.calls) == [-9, 0, 1, 2, 3]


def test_an_unserializable_result_fails_its_own_call_only(
    saver: SqliteSaver, db_file: Path
) -> None:
    fx = Counter()
    node = IdempotentToolNode(sync_tools(fx), handle_tool_errors=False)
    graph = tool_graph(node, saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(3)]
    calls.append(("opaque", {"amount": 5}, "o"))
    with pytest.raises(SerializationError):
        graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    rows = ledger_rows(db_file, "t")
    assert {k: v for k, v in rows.items() if k != "o"} == {
        f"c{i}": ("completed", None) for i in range(3)
    }
    assert rows["o"][0] == "issued"  # never recorded: its outcome stays unknown
    assert sorted(fx.calls) == [0, 1, 2, 5]


WHO: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_the_step_end_hop_runs_on_the_loop_in_the_callers_context() -> None:
    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)

    async def where() -> tuple[bool, str]:
        return threading.current_thread() is runner, WHO.get()

    token = WHO.set("the node")
    try:
        # a loop not running: on_loop's typed error, the coroutine closed (not leaked)
        with pytest.raises(ConfigError, match="not running"):
            wait_on(loop, where())
        runner.start()
        assert wait_on(loop, where()) == (True, "the node")
    finally:
        WHO.reset(token)
        if runner.is_alive():
            loop.call_soon_threadsafe(loop.stop)
            runner.join(timeout=10)
        loop.close()
