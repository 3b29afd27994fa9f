"""A step's outcomes refused at once by the ledger: the step fails with the refusal.

Inside ``LedgerEngine.outcomes_at_end`` a ``ToolNode`` step's outcomes are sent once a
loop iteration from a loop callback (``engine.step_writes.StepWrites.send``), through
``ToolCallLedger.record_outcome_rows`` - for a ledger written elsewhere, its default, a
``record_outcome`` each. A ledger may refuse an outcome when it is handed over, before
any write starts (raising from ``record_outcome`` itself rather than from what it
returns). Raised in a loop callback, that refusal went to the loop's exception handler:
the node returned as if every outcome were committed, and the call stayed ``issued``
(an unknown outcome at the next run). Here the refusal fails the step - the refused
call's own error, after the other outcomes of the step are committed. And a refused
row's answer (why it was refused, read back) is its own: a failed read does not answer
the rows written beside it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode
from langgraph_idem_saver.errors import ConnectionClosedError, LedgerStateError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, LedgerEntry, Outcome, ToolCallLedger


@tool
async def send(to: str) -> str:
    """Send a message (a no-op)."""
    return f"sent to {to}"


class ChecksEachOutcome(AsyncSqliteSaver):
    """A ledger written elsewhere, over a real SQLite saver: ``ToolCallLedger``'s default
    ``record_outcome_rows`` (a ``record_outcome`` a row), and a ``record_outcome`` that
    refuses the result naming ``refuse`` before any write starts."""

    record_outcome_rows = ToolCallLedger.record_outcome_rows  # type: ignore[assignment]

    def record_outcome(
        self, scope: str, key: str, *, owner: str, outcome: Outcome
    ) -> Awaitable[None]:
        if outcome.result is not None and b"refuse" in outcome.result:
            raise LedgerStateError(f"outcome of {key!r} refused at once")
        return super().record_outcome(scope, key, owner=owner, outcome=outcome)


class RefusesEveryRow(AsyncSqliteSaver):
    """A ledger whose own ``record_outcome_rows`` refuses its rows before writing."""

    def record_outcome_rows(
        self, rows: Sequence[tuple[Any, ...]]
    ) -> Awaitable[list[Exception | None]]:
        raise LedgerStateError(f"{len(rows)} outcome(s) refused at once")


@pytest.fixture
async def loop_errors() -> AsyncIterator[list[dict[str, Any]]]:
    """What reaches the running loop's exception handler during the test."""
    seen: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    before = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: seen.append(context))
    try:
        yield seen
    finally:
        loop.set_exception_handler(before)


async def statuses(saver: Any) -> dict[str, CallStatus]:
    """Each entry's status, by tool call id."""
    return {e.tool_call_id: e.status for e in await saver.alist_entries("t")}


async def test_an_outcome_refused_at_once_fails_its_step_and_the_others_land(
    tmp_path: Path, loop_errors: list[dict[str, Any]]
) -> None:
    """``record_outcome`` raising for the first call of a step: the step raises that
    error, the second call's outcome (handed over in the same loop iteration) is
    committed all the same, and nothing reaches the loop's exception handler."""
    async with ChecksEachOutcome.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        graph = tool_graph(IdempotentToolNode([send]), saver)
        message = ai_calls(("send", {"to": "refuse"}, "c1"), ("send", {"to": "b"}, "c2"))
        with pytest.raises(LedgerStateError, match="refused at once"):
            await graph.ainvoke({"messages": [message]}, cfg("t"))
        assert await statuses(saver) == {"c1": CallStatus.ISSUED, "c2": CallStatus.COMPLETED}
    assert loop_errors == []


async def test_rows_refused_at_once_fail_the_step(
    tmp_path: Path, loop_errors: list[dict[str, Any]]
) -> None:
    """A ledger's ``record_outcome_rows`` raising instead of answering: the step raises
    its error (every call of those rows is left ``issued``), not the loop's handler."""
    async with RefusesEveryRow.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        graph = tool_graph(IdempotentToolNode([send]), saver)
        message = ai_calls(("send", {"to": "a"}, "c1"), ("send", {"to": "b"}, "c2"))
        with pytest.raises(LedgerStateError, match="outcome\\(s\\) refused at once"):
            await graph.ainvoke({"messages": [message]}, cfg("t"))
        assert await statuses(saver) == {"c1": CallStatus.ISSUED, "c2": CallStatus.ISSUED}
    assert loop_errors == []


class LosesItsReads(AsyncSqliteSaver):
    """A saver whose read of an entry fails (its connection lost after a write)."""

    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        raise ConnectionClosedError(f"lost before reading {key!r}")


def intent(i: int) -> CallIntent:
    return CallIntent(
        scope="t", key=f"k{i}", thread_id="t", agent_path="tools", tool_name="send",
        args_hash=f"d{i}", args=b"{}", tool_call_id=f"c{i}",
    )  # fmt: skip


async def test_a_refused_rows_failed_read_is_its_answer_alone(tmp_path: Path) -> None:
    """``record_outcome_rows`` reads a refused row's entry to say why; that read failing
    is the refused row's answer, and the row written beside it is answered None (it was
    answered with the read's error as well, so the step took a committed outcome for a
    failed one)."""
    async with LosesItsReads.from_conn_string(str(tmp_path / "db.sqlite")) as saver:
        await saver.aclaim([intent(0), intent(1)], owner="me", lease_seconds=60)
        rows = [
            (status, "bytes", b"r", None, 1.0, "t", f"k{i}", owner)
            for i, status, owner in ((0, "completed", "me"), (1, "completed", "thief"))
        ]
        errors = await saver.record_outcome_rows(rows)
        assert errors[0] is None
        assert isinstance(errors[1], ConnectionClosedError) and "'k1'" in str(errors[1])
        assert {e.key: e.status for e in await saver.alist_entries("t")} == {
            "k0": CallStatus.COMPLETED,
            "k1": CallStatus.ISSUED,
        }
