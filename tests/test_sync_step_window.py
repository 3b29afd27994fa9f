"""A sync step's outcomes in one write (``sync_step_writes.SyncStepWrites``): the rows wait
until the step's last ledgered call returned, at most ``WINDOW`` (50 ms) after the first
row waiting, and the step's end sends what still waits.

Real parts: our sync ``SqliteSaver`` on a SQLite file and ``PostgresSaver`` on a real
PostgreSQL, each over the user's own connection; the outcome writes are counted where
they reach the database (SQLite's trace callback: transactions holding an outcome
``UPDATE``; psycopg's cursor: ``idem_finish_*`` statements), and every outcome is read
back with another connection as ``invoke`` returns. The crash test kills a real process
(SIGKILL) while a returned call's row waits for its sibling, and resumes in a fresh one.
"""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
import zygote
from effects_file import effects_of
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.postgres import PostgresSaver
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_step_writes import SyncStepWrites

WORKER = Path(__file__).resolve().parent / "sync_step_window_worker.py"
BACKENDS = ["sqlite", "postgres"]


class Store:
    """A fresh database of one backend: a sync saver over the user's connection, the
    outcome writes counted on it, and the ledger read back with another connection."""

    def __init__(self, backend: str, where: str) -> None:
        self.backend, self.where = backend, where
        self.writes = 0  # outcome writes (transactions / statements) since opened

    @contextmanager
    def saver(self, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.where, check_same_thread=False)
            try:
                with SqliteSaver(conn) as saver:
                    saver.setup()
                    conn.set_trace_callback(self._sqlite_seen())
                    yield saver
            finally:
                conn.close()
            return
        with (
            psycopg.Connection.connect(self.where, autocommit=True, prepare_threshold=0) as pg,
            PostgresSaver(pg) as saver,
        ):
            saver.setup()
            real = psycopg.Cursor.execute

            def execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
                if cur.connection is pg and "idem_finish_" in str(query):
                    self.writes += 1  # one statement, one commit (autocommit)
                return real(cur, query, *args, **kwargs)

            monkeypatch.setattr(psycopg.Cursor, "execute", execute)
            yield saver

    def _sqlite_seen(self) -> Callable[[str], None]:
        outcome = [False]  # the open transaction holds an outcome UPDATE

        def seen(text: str) -> None:
            text = " ".join(text.split())
            if re.match(r"UPDATE idem_tool_calls (AS \w+ )?SET status", text):
                outcome[0] = True
            elif text == "COMMIT" and outcome[0]:
                self.writes += 1
                outcome[0] = False

        return seen

    def statuses(self, thread: str) -> dict[str, str]:
        """tool call id -> status, as committed (another connection)."""
        query = "SELECT tool_call_id, status FROM idem_tool_calls WHERE thread_id = "
        if self.backend == "sqlite":
            with closing(sqlite3.connect(self.where)) as conn:
                return dict(conn.execute(query + "?", (thread,)).fetchall())
        with psycopg.connect(self.where, autocommit=True) as conn:
            return dict(conn.execute(query + "%s", (thread,)).fetchall())  # type: ignore[arg-type]


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Store:
    if request.param == "sqlite":
        return Store("sqlite", str(tmp_path / "window.db"))
    return Store("postgres", request.getfixturevalue("pg_dsn"))


def calls(n: int, tag: str) -> Any:
    return ai_calls(*[("work", {"i": i}, f"{tag}{i}") for i in range(n)], msg_id=f"ai-{tag}")


def test_a_steps_outcomes_go_as_one_write_once_its_calls_all_returned(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ten quick sync calls: one outcome write a step, sent when the tenth returned (the
    window made long, so only the step's last call can end the wait), and every outcome
    committed when ``invoke`` returns."""
    monkeypatch.setattr(SyncStepWrites, "WINDOW", 30.0)

    @tool
    def work(i: int) -> str:
        """A quick side-effecting tool."""
        return f"done {i}"

    with store.saver(monkeypatch) as saver:
        graph = tool_graph(IdempotentToolNode([work]), saver)
        for step in range(3):
            started = time.monotonic()
            graph.invoke({"messages": [calls(10, f"s{step}-")]}, cfg(f"t{step}"))
            assert time.monotonic() - started < 15  # not held until the window's end
            assert store.statuses(f"t{step}") == {f"s{step}-{i}": "completed" for i in range(10)}
    assert store.writes == 3


def test_the_counter_sees_each_write_when_calls_return_one_by_one(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control for the count above: with a short window, calls that each return only
    once the earlier ones' outcomes are committed make one write each, and the count
    sees all four."""
    monkeypatch.setattr(SyncStepWrites, "WINDOW", 0.01)

    @tool
    def work(i: int) -> str:
        """Returns once the calls before it are completed in the database."""
        deadline = time.monotonic() + 30
        earlier = {f"one-{j}" for j in range(i)}
        while {c for c, s in store.statuses("one").items() if s == "completed"} < earlier:
            assert time.monotonic() < deadline, "the earlier outcomes were never written"
            time.sleep(0.005)
        return f"done {i}"

    with store.saver(monkeypatch) as saver:
        graph = tool_graph(IdempotentToolNode([work]), saver)
        graph.invoke({"messages": [calls(4, "one-")]}, cfg("one"))
    assert store.writes == 4
    assert set(store.statuses("one").values()) == {"completed"}


@pytest.mark.parametrize("window", [None, 3.0])
def test_a_row_waits_no_longer_than_the_window_for_a_slow_sibling(
    store: Store, monkeypatch: pytest.MonkeyPatch, window: float | None
) -> None:
    """Two quick calls and one that returns only once their outcomes are committed: the
    window (the default 50 ms) ends their wait while the slow one still runs, so the
    step finishes (it would hang if they waited for it) with at least two writes, and
    the quick outcomes are committed well within 2 s of the first quick call's return.
    The control (``window`` 3 s) shows the measure sees a longer wait."""
    if window is None:
        assert SyncStepWrites.WINDOW == 0.05
    else:
        monkeypatch.setattr(SyncStepWrites, "WINDOW", window)
    returned: list[float] = []
    seen: list[float] = []

    @tool
    def work(i: int) -> str:
        """Calls 0 and 1 return at once; call 2 waits for their committed outcomes."""
        if i == 2:
            deadline = time.monotonic() + 30
            while list(store.statuses("slow").values()).count("completed") < 2:
                assert time.monotonic() < deadline, "the quick outcomes waited for the slow call"
                time.sleep(0.005)
            seen.append(time.monotonic())
        else:
            returned.append(time.monotonic())
        return f"done {i}"

    with store.saver(monkeypatch) as saver:
        graph = tool_graph(IdempotentToolNode([work]), saver)
        graph.invoke({"messages": [calls(3, "slow-")]}, cfg("slow"))
    assert store.statuses("slow") == {f"slow-{i}": "completed" for i in range(3)}
    assert store.writes >= 2
    waited = seen[0] - min(returned)  # the first quick return to both committed
    if window is None:
        assert waited < 2.0  # the 50 ms window, a commit, the polling: a shared host
    else:
        assert waited >= window  # the control: the rows waited out the longer window


def test_the_steps_end_sends_the_rows_still_waiting(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A call that raises hands no row, so the step's last row never comes: the step's
    end sends what waits at once (the window, made 30 s long, does not hold the node),
    in one write; the raising call is left ``issued`` (an unknown outcome)."""
    monkeypatch.setattr(SyncStepWrites, "WINDOW", 30.0)
    handed = threading.Semaphore(0)
    real_hand = SyncStepWrites.hand

    def hand(writes: SyncStepWrites, plan: Any, result: Any) -> bool:
        taken = real_hand(writes, plan, result)
        handed.release()
        return taken

    monkeypatch.setattr(SyncStepWrites, "hand", hand)

    @tool
    def work(i: int) -> str:
        """Call 2 raises once the other two have handed their rows."""
        if i == 2:
            for _ in range(2):
                assert handed.acquire(timeout=30)
            raise RuntimeError("the vendor timed out")
        return f"done {i}"

    with store.saver(monkeypatch) as saver:
        node = IdempotentToolNode([work], handle_tool_errors=False)
        graph = tool_graph(node, saver)
        started = time.monotonic()
        with pytest.raises(RuntimeError, match="timed out"):
            graph.invoke({"messages": [calls(3, "end-")]}, cfg("end"))
        assert time.monotonic() - started < 15
    assert store.statuses("end") == {"end-0": "completed", "end-1": "completed", "end-2": "issued"}
    assert store.writes == 1


# --- a real process killed while a returned call's row waits -------------------------------


@pytest.mark.parametrize("node", ["idem", "stock"])
def test_killed_while_a_row_waits_then_resumed_each_effect_once(
    store: Store, node: str, tmp_path: Path
) -> None:
    """The process dies (SIGKILL) after ``fast`` returned, its row waiting unsent for
    ``slow``: ``fast`` is left ``issued``, and the resume in a fresh process asks
    ``verify`` (the effect landed) instead of running it again - each effect once. The
    stock ``ToolNode`` killed at the same point charges both again on resume."""
    effects, markers = tmp_path / "effects.txt", tmp_path / "markers"
    markers.mkdir()

    def args(phase: str) -> list[str]:
        return [
            sys.executable, str(WORKER), store.backend, store.where, str(effects),
            str(markers), "w", node, phase,
        ]  # fmt: skip

    child = zygote.Popen(args("run"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (markers / "ready").exists():
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "the worker never reached the point"
            time.sleep(0.01)
        child.kill()  # SIGKILL
        child.communicate(timeout=60)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate(timeout=60)
    assert child.returncode == -9
    assert sorted(effects_of(effects)) == ["fast", "slow"]
    if node == "idem":  # the row never left: both calls issued, unknown outcomes
        assert store.statuses("w") == {"call_fast": "issued", "call_slow": "issued"}

    resumed = zygote.run(args("resume"), capture_output=True, text=True, timeout=180)
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads(resumed.stdout.strip().splitlines()[-1]) == ["charged fast", "charged slow"]
    charged = sorted(effects_of(effects))
    if node == "stock":  # the control: without the ledger both run again
        assert charged == ["fast", "fast", "slow", "slow"]
    else:
        assert charged == ["fast", "slow"], "each effect exactly once"
        assert set(store.statuses("w").values()) == {"completed"}
