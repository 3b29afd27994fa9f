"""A sync step's calls finishing together wake the ledger's loop once
(``SyncStepWrites.drain``): the rows handed while a drain is pending join it, and go to
the ledger as one write. Real parts: our sync ``SqliteSaver`` on a SQLite file, a graph
step of ten sync tools; the ledger's loop is held busy from the first call until the tenth
row is handed, so which rows find a drain pending does not depend on timing."""

from __future__ import annotations

import sqlite3
import threading
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


def test_rows_handed_while_the_loop_is_busy_go_as_one_drain_and_one_write(
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

    counts = {"hand": 0, "drain": 0, "wakeups": 0, "rows": []}
    real_hand, real_drain = SyncStepWrites.hand, SyncStepWrites.drain

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

    def drain(self: SyncStepWrites) -> None:
        counts["drain"] += 1
        real_drain(self)

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
    monkeypatch.setattr(SyncStepWrites, "drain", drain)
    real_send = SyncStepWrites.send

    def send(self: SyncStepWrites) -> None:
        if self.rows:  # a write of these rows (StepWrites.send)
            counts["rows"].append(len(self.rows))  # type: ignore[attr-defined]
        real_send(self)

    monkeypatch.setattr(SyncStepWrites, "send", send)
    graph = tool_graph(IdempotentToolNode([charge]), saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(CALLS)]
    graph.invoke({"messages": [ai_calls(*calls)]}, cfg("t"))

    assert counts["hand"] == CALLS
    # one wakeup of the loop for the ten rows (a call_soon_threadsafe each before)
    assert counts["wakeups"] == 1 and counts["drain"] == 1
    assert counts["rows"] == [CALLS]  # and one write
    with sqlite3.connect(tmp_path / "drain.db") as conn:  # committed when invoke returned
        statuses = conn.execute(
            "SELECT status, COUNT(*) FROM idem_tool_calls WHERE thread_id = 't' GROUP BY 1"
        ).fetchall()
    assert statuses == [("completed", CALLS)]
