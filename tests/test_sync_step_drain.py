"""A sync step's calls wake the ledger's loop once for their rows
(``SyncStepWrites.arm``): the rows handed while it is pending join it, and go to the
ledger as one write. Real parts: our sync ``SqliteSaver`` on a SQLite file, a graph step
of ten sync tools; the ledger's loop is held busy from the first call until the tenth row
is handed, so which rows find the ``arm`` pending does not depend on timing. Then many
short tools finishing in a random order, every outcome committed when the node returns,
and the checks shown to see a row left behind."""

from __future__ import annotations

import contextlib
import random
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_step_writes import SyncStepWrites

CALLS = 10


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    conn = sqlite3.connect(tmp_path / "drain.db", check_same_thread=False)
    try:
        with SqliteSaver(conn) as s:
            s.setup()
            yield s
    finally:
        conn.close()


def test_rows_handed_while_the_loop_is_busy_go_as_one_wakeup_and_one_write(
    saver: SqliteSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop = saver._runtime.loop
    free = threading.Event()  # the ledger's loop is held until every row is handed
    held = threading.Event()

    def hold_the_loop() -> None:
        held.set()
        assert free.wait(30), "the ten rows were never handed"

    first = threading.Lock()

    @tool
    def charge(amount: int) -> str:
        """Charge the customer (a sync tool): the first to run holds the ledger's loop
        (after the claim), and each returns once it is held."""
        if first.acquire(blocking=False):
            loop.call_soon_threadsafe(hold_the_loop)
        assert held.wait(30)
        return f"charged {amount}"

    counts = {"hand": 0, "arm": 0, "wakeups": 0, "rows": []}
    real_hand, real_arm = SyncStepWrites.hand, SyncStepWrites.arm

    def hand(self: SyncStepWrites, plan: Any, result: Any) -> bool:
        handing.on = True
        try:
            taken = real_hand(self, plan, result)
        finally:
            handing.on = False
        with lock:
            counts["hand"] += 1
            if counts["hand"] == CALLS:
                free.set()
        return taken

    def arm(self: SyncStepWrites) -> None:
        counts["arm"] += 1
        real_arm(self)

    lock = threading.Lock()
    handing = threading.local()  # in a call's thread, inside ``hand``
    real_wake = loop.call_soon_threadsafe

    def wake(callback: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(handing, "on", False):
            with lock:
                counts["wakeups"] += 1
        return real_wake(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", wake)
    monkeypatch.setattr(SyncStepWrites, "hand", hand)
    monkeypatch.setattr(SyncStepWrites, "arm", arm)
    real_rows = SqliteSaver.record_outcome_rows

    def record_outcome_rows(self: SqliteSaver, rows: Any) -> Any:
        counts["rows"].append(len(rows))  # type: ignore[attr-defined]
        return real_rows(self, rows)

    monkeypatch.setattr(SqliteSaver, "record_outcome_rows", record_outcome_rows)
    graph = tool_graph(IdempotentToolNode([charge]), saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(CALLS)]
    graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))

    assert counts["hand"] == CALLS
    # one wakeup of the loop for the ten rows (a call_soon_threadsafe each before): the
    # tenth, the step's last, finds the first row's ``arm`` still pending
    assert counts["wakeups"] == 1 and counts["arm"] == 1
    assert counts["rows"] == [CALLS]  # and one write
    with sqlite3.connect(tmp_path / "drain.db") as conn:  # committed when invoke returned
        statuses = conn.execute(
            "SELECT status, COUNT(*) FROM idem_tool_calls WHERE thread_id = 't' GROUP BY 1"
        ).fetchall()
    assert statuses == [("completed", CALLS)]


# --- many short sync tools finishing in a random order: no outcome left behind ---------

STEPS, WIDTH = 8, 24


def _statuses(db: Path, thread_id: str) -> dict[str, str]:
    """Each call's ledger status, read by another connection (what is committed)."""
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute(
            "SELECT tool_call_id, status FROM idem_tool_calls WHERE thread_id = ?", (thread_id,)
        ).fetchall()
    return dict(rows)


class Observed:
    """Every step's writes, and the rows each handed and sent to the ledger (a row left
    behind stays handed and never sent, its call ``issued`` when the node returned)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, hand: Any = None, send: Any = None) -> None:
        self.lock = threading.Lock()
        self.handed = self.drained = 0  # drained: rows sent to the ledger
        self.steps: list[SyncStepWrites] = []
        real_hand = hand or SyncStepWrites.hand
        real_close = SyncStepWrites.close
        real_rows = SqliteSaver.record_outcome_rows

        def counted_hand(writes: SyncStepWrites, plan: Any, result: Any) -> bool:
            taken: bool = real_hand(writes, plan, result)
            with self.lock:
                self.handed += taken
            return taken

        def counted_rows(saver: SqliteSaver, rows: Any) -> Any:
            self.drained += len(rows)  # on the ledger's loop only
            return real_rows(saver, rows)

        def recorded_close(writes: SyncStepWrites) -> int:
            self.steps.append(writes)
            return real_close(writes)

        monkeypatch.setattr(SyncStepWrites, "hand", counted_hand)
        monkeypatch.setattr(SqliteSaver, "record_outcome_rows", counted_rows)
        monkeypatch.setattr(SyncStepWrites, "close", recorded_close)
        if send is not None:
            monkeypatch.setattr(SyncStepWrites, "send", send)


def _stress_tools(
    db: Path, thread: dict[str, str], failing: set[int], returned: set[int]
) -> list[Any]:
    rng = random.Random(41)
    pauses = [rng.choice((0.0, 0.0, 0.0, 0.0003, 0.001, 0.003)) for _ in range(STEPS * WIDTH)]

    @tool
    def work(i: int) -> str:
        """A short sync tool: its claim and its siblings' are committed before it runs
        (siblings may have finished already)."""
        statuses = _statuses(db, thread["id"])
        assert len(statuses) == WIDTH and statuses[f"c{i}"] == "issued", statuses
        time.sleep(pauses[i])  # the finishing order: random, fixed by the seed
        if i in failing:
            raise RuntimeError(f"tool {i} failed")
        returned.add(i)
        return f"done {i}"

    return [work]


def test_many_short_sync_tools_every_outcome_committed_before_the_node_returns(
    saver: SqliteSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "drain.db"
    observed = Observed(monkeypatch)
    thread: dict[str, str] = {}
    failing = {3 * WIDTH + 5}  # one step raises from one call: its siblings still recorded
    returned: set[int] = set()  # calls whose tool returned (a raise cancels those not begun)
    tools = _stress_tools(db, thread, failing, returned)
    graph = tool_graph(IdempotentToolNode(tools), saver)
    for step in range(STEPS):
        thread["id"] = f"stress-{step}"
        numbers = range(step * WIDTH, (step + 1) * WIDTH)
        message = ai_calls(*[("work", {"i": i}, f"c{i}") for i in numbers])
        if failing & set(numbers):
            with pytest.raises(RuntimeError, match="failed"):
                graph.invoke({"messages": [message]}, cfg(thread["id"]))
        else:
            graph.invoke({"messages": [message]}, cfg(thread["id"]))
        statuses = _statuses(db, thread["id"])  # read as the node returned
        expected = {f"c{i}": "completed" for i in numbers if i in returned}
        assert {c: statuses.get(c) for c in expected} == expected, (step, statuses)
        if failing & set(numbers):  # the raise cancels the calls not begun (released)
            assert statuses[f"c{min(failing)}"] == "issued"  # raised: abandoned
            assert len(statuses) == len(expected) + 1, statuses
        else:
            assert len(expected) == WIDTH
    assert len(observed.steps) == STEPS
    assert observed.handed == len(returned) == observed.drained
    assert all(not writes.waiting for writes in observed.steps)


def test_the_stress_check_sees_a_lost_row(
    saver: SqliteSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: a ``send`` that keeps only the first of the rows waiting (the others
    dropped) leaves their calls ``issued`` when the node returned, and the checks above
    see it. The ledger's loop is held until every row is handed, so one send finds them
    all."""
    db = tmp_path / "drain.db"
    loop = saver._runtime.loop
    free, held, first = threading.Event(), threading.Event(), threading.Lock()
    real_send = SyncStepWrites.send

    def send_losing_rows(writes: SyncStepWrites) -> None:
        with writes.lock:
            del writes.waiting[1:]  # the bug
        real_send(writes)

    observed = Observed(monkeypatch, send=send_losing_rows)
    real_hand = SyncStepWrites.hand  # the counting one

    def hand(writes: SyncStepWrites, plan: Any, result: Any) -> bool:
        taken = real_hand(writes, plan, result)
        if observed.handed == WIDTH:
            free.set()
        return taken

    monkeypatch.setattr(SyncStepWrites, "hand", hand)

    def hold_the_loop() -> None:
        held.set()
        assert free.wait(30), "the rows were never handed"

    @tool
    def late(i: int) -> str:
        """The first call to run holds the ledger's loop; each returns once it is held."""
        if first.acquire(blocking=False):
            loop.call_soon_threadsafe(hold_the_loop)
        assert held.wait(30)
        return f"done {i}"

    graph = tool_graph(IdempotentToolNode([late]), saver)
    message = ai_calls(*[("late", {"i": i}, f"c{i}") for i in range(WIDTH)])
    graph.invoke({"messages": [message]}, cfg("lost"))
    statuses = _statuses(db, "lost")
    assert list(statuses.values()).count("completed") == 1
    assert list(statuses.values()).count("issued") == WIDTH - 1  # seen: left issued
    assert observed.handed == WIDTH and observed.drained == 1


def test_a_loop_closing_as_a_row_is_handed_leaves_the_row_to_its_call(
    saver: SqliteSaver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ledger's loop closing between ``hand``'s check and its wakeup (simulated: the
    wakeup refused once, as a closed loop refuses it) is not a raw ``RuntimeError`` and
    no stranded row: the call records its outcome itself, through the loop."""
    loop = saver._runtime.loop
    real_wake = loop.call_soon_threadsafe
    refused: list[str] = []

    def wake(callback: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(callback, "__name__", "") in ("arm", "send") and not refused:
            refused.append("wakeup")
            raise RuntimeError("Event loop is closed")
        return real_wake(callback, *args, **kwargs)

    monkeypatch.setattr(loop, "call_soon_threadsafe", wake)
    observed = Observed(monkeypatch)

    @tool
    def charge(amount: int) -> str:
        """Charge the customer (a sync tool)."""
        return f"charged {amount}"

    graph = tool_graph(IdempotentToolNode([charge]), saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(4)]
    graph.invoke({"messages": [ai_calls(*calls)]}, cfg("closing"))
    assert refused == ["wakeup"]
    assert observed.handed == observed.drained == 3  # one left to its call
    assert all(not writes.waiting for writes in observed.steps)
    assert set(_statuses(tmp_path / "drain.db", "closing").values()) == {"completed"}
