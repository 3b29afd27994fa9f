"""The sync savers forward ``record_outcome_rows`` to their async saver: a step's outcome
rows go to the ledger as ONE write (``LedgerPolicy.record_outcome_rows``), not through
``ToolCallLedger``'s default of one ``record_outcome`` a row - from the saver's own loop
(a sync ``graph.invoke`` step) and from another loop (``graph.ainvoke`` over the sync
saver). Real SQLite file, read back with a second connection.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, intent_for, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.errors import IdemSaverError
from langgraph_idem_saver.sqlite import SqliteSaver


@pytest.fixture
def db_file(tmp_path: Path) -> Path:
    return tmp_path / "rows.db"


@pytest.fixture
def saver(db_file: Path) -> Iterator[SqliteSaver]:
    with SqliteSaver.from_conn_string(str(db_file)) as s:
        yield s


def statuses(db_file: Path, thread: str) -> dict[str, str]:
    with sqlite3.connect(db_file) as conn:
        rows = conn.execute(
            "SELECT tool_call_id, status FROM idem_tool_calls WHERE thread_id = ?", (thread,)
        ).fetchall()
    return {str(call_id): str(status) for call_id, status in rows}


def counting(saver: SqliteSaver) -> dict[str, int]:
    """Count the async saver's ``record_outcome`` calls and the rows its
    ``record_outcome_rows`` is handed (both still run)."""
    counts = {"record_outcome": 0, "rows": 0}
    inner: Any = saver.saver
    one, many = inner.record_outcome, inner.record_outcome_rows

    def record_outcome(*args: Any, **kwargs: Any) -> Any:
        counts["record_outcome"] += 1
        return one(*args, **kwargs)

    def record_outcome_rows(rows: Any) -> Any:
        counts["rows"] += len(rows)
        return many(rows)

    inner.record_outcome = record_outcome
    inner.record_outcome_rows = record_outcome_rows
    return counts


def node() -> IdempotentToolNode:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer."""
        return f"charged {amount}"

    return IdempotentToolNode([charge])


def test_a_sync_step_hands_its_outcome_rows_to_the_saver_as_rows(
    saver: SqliteSaver, db_file: Path
) -> None:
    counts = counting(saver)
    calls = [("charge", {"amount": i}, f"c{i}") for i in range(10)]
    tool_graph(node(), saver).invoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    assert statuses(db_file, "t") == {f"c{i}": "completed" for i in range(10)}
    assert counts == {"record_outcome": 0, "rows": 10}


def test_rows_recorded_from_another_loop_hop_to_the_saver_as_one_write(
    saver: SqliteSaver, db_file: Path
) -> None:
    counts = counting(saver)
    intents = [
        intent_for("u", {"name": "charge", "args": {"amount": i}, "id": f"a{i}"}) for i in range(3)
    ]

    async def main() -> list[Exception | None]:
        await saver.aclaim(intents, owner="me", lease_seconds=60)
        rows = [
            ("completed", "json", b"1", None, time.time(), i.scope, i.key, "me") for i in intents
        ]
        rows[2] = (*rows[2][:7], "someone else")  # a row whose claim is not its owner's
        return await saver.record_outcome_rows(rows)

    answers = asyncio.run(main())  # a loop that is not the saver's
    assert answers[:2] == [None, None]
    assert isinstance(answers[2], IdemSaverError), "the refused row's own typed answer"
    assert statuses(db_file, "u") == {"a0": "completed", "a1": "completed", "a2": "issued"}
    assert counts == {"record_outcome": 0, "rows": 3}
