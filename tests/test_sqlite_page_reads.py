"""SQLite reads a page of ``alist`` in statements a page, not a row (sqlite/reads.py): the
count does not grow with the page, each lookup probes a primary key, the rows' values are
decoded on their own (no object shared between tuples), and a value that cannot be
resolved is still a typed error naming its row."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_idem_saver import AsyncSqliteSaver, CorruptRecordError
from langgraph_idem_saver.sqlite import sql
from langgraph_idem_saver.sqlite.sync_saver import SqliteSaver

WINDOW = [AIMessage(content=f"message {i} " + "x" * 200, id=f"m{i}") for i in range(20)]


def fill(saver: Any, thread: str, checkpoints: int) -> None:
    """A thread whose 20-message list is re-versioned (the same objects) every second
    checkpoint, a counter every checkpoint, and one pending write per checkpoint."""
    config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    versions: dict[str, Any] = {}
    for i in range(1, checkpoints + 1):
        checkpoint = empty_checkpoint()
        changed = ["count"] if i % 2 else ["count", "messages"]
        checkpoint["channel_values"] = {"count": i, "messages": WINDOW}
        for channel in changed:
            versions[channel] = saver.get_next_version(versions.get(channel), None)
        checkpoint["channel_versions"] = dict(versions)
        new = {channel: versions[channel] for channel in changed}
        config = saver.put(config, checkpoint, {"step": i}, new)
        saver.put_writes(config, [("count", i)], f"task-{i}")


def statements_of(saver: SqliteSaver, call: Any) -> list[str]:
    seen: list[str] = []
    saver.conn.set_trace_callback(seen.append)
    try:
        call()
    finally:
        saver.conn.set_trace_callback(None)
    return seen


def test_a_page_costs_the_same_statements_whatever_its_rows(tmp_path: Path) -> None:
    """Per page: the rows, their blobs (with each delta's base), their writes, inside
    one read transaction - five statements for a page of 3 as for a page of 30 (row by
    row it was three more a row). Every tuple keeps its own values and writes."""
    with SqliteSaver.from_conn_string(str(tmp_path / "p.db")) as saver:
        fill(saver, "t", 40)
        config: Any = {"configurable": {"thread_id": "t"}}
        counts = {}
        for limit in (3, 30):
            tuples: list[Any] = []
            seen = statements_of(saver, lambda: tuples.extend(saver.list(config, limit=limit)))  # noqa: B023
            counts[limit] = len(seen)
            assert len(tuples) == limit
            for tup in tuples:
                step = tup.metadata["step"]
                assert tup.checkpoint["channel_values"] == {"count": step, "messages": WINDOW}
                assert tup.pending_writes == [(f"task-{step}", "count", step)]
        assert counts[3] == counts[30] == 5, counts


def test_tuples_of_a_page_share_no_object(tmp_path: Path) -> None:
    """Two checkpoints naming the same list version (fetched once) still get lists and
    messages of their own, as LangGraph's savers return them."""
    with SqliteSaver.from_conn_string(str(tmp_path / "p.db")) as saver:
        fill(saver, "t", 5)  # the newest two: the version the fourth wrote
        first, second = list(saver.list({"configurable": {"thread_id": "t"}}, limit=2))
        a = first.checkpoint["channel_versions"]["messages"]
        assert a == second.checkpoint["channel_versions"]["messages"]
        one, other = first.checkpoint["channel_values"], second.checkpoint["channel_values"]
        assert one["messages"] == other["messages"] == WINDOW
        assert one["messages"] is not other["messages"]
        assert all(x is not y for x, y in zip(one["messages"], other["messages"], strict=True))


def test_page_lookups_probe_primary_keys(tmp_path: Path) -> None:
    """The page's blobs and writes are found by primary-key probes, never by walking
    the thread's rows (which grows with its history)."""
    db = tmp_path / "plan.db"
    with SqliteSaver.from_conn_string(str(db)) as saver:
        fill(saver, "t", 30)
    with sqlite3.connect(db) as conn:
        texts = [r[0] for r in conn.execute("SELECT channel_versions FROM idem_checkpoints")]
        ids = [r[0] for r in conn.execute("SELECT checkpoint_id FROM idem_checkpoints")]

        def plan(query: str, params: tuple[Any, ...]) -> str:
            return "\n".join(r[-1] for r in conn.execute("EXPLAIN QUERY PLAN " + query, params))

        blobs = plan(sql.SELECT_BLOBS_FOR_PAGE, ("[" + ",".join(texts[:10]) + "]", "t", ""))
        assert blobs.count("channel=? AND version=?") == 2, blobs  # the value, its base
        writes = plan(sql.SELECT_WRITES_FOR_CHECKPOINTS, ("t", "", str(ids[:10])))
        assert "checkpoint_id=?" in writes, writes


async def test_a_missing_base_in_a_page_is_corrupt_naming_its_row(tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    with SqliteSaver.from_conn_string(str(db)) as saver:
        fill(saver, "t", 6)
    with sqlite3.connect(db) as conn:
        [(base,)] = conn.execute(
            "SELECT DISTINCT base_version FROM idem_blobs WHERE base_version IS NOT NULL"
        ).fetchall()
        conn.execute("DELETE FROM idem_blobs WHERE version = ?", (base,))
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        with pytest.raises(CorruptRecordError, match="missing_base_version") as caught:
            [t async for t in saver.alist({"configurable": {"thread_id": "t"}}, limit=4)]
        assert caught.value.location["thread_id"] == "t"
        assert caught.value.location["channel"] == "messages"


def test_get_tuple_reads_a_deltas_base_with_it(tmp_path: Path) -> None:
    """The latest checkpoint's list is a delta (re-versioned without growing): its base
    comes with it, in the blob statement - the checkpoint, its blobs, its writes, inside
    one read transaction."""
    with SqliteSaver.from_conn_string(str(tmp_path / "g.db")) as saver:
        fill(saver, "t", 6)
        got: list[Any] = []
        seen = statements_of(saver, lambda: got.append(saver.get_tuple(cfg_of("t"))))
        assert [s.split()[0].upper() for s in seen] == [
            "BEGIN",
            "SELECT",
            "SELECT",
            "SELECT",
            "COMMIT",
        ]
        assert got[0].checkpoint["channel_values"] == {"count": 6, "messages": WINDOW}
        assert got[0].pending_writes == [("task-6", "count", 6)]


def cfg_of(thread: str) -> Any:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
