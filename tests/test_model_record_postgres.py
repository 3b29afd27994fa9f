"""Recorded model answers on PostgreSQL, where a record is one commit
(``answer_records``): a fresh model call costs one read and one write - the ``completed``
entry, never an ``issued`` claim first - a re-run step is replayed from it, and two runs
of one step at once go on with the first answer recorded. (The crash tests of recorded
answers on PostgreSQL are in ``test_durable_model.py``; the one-commit record on SQLite
in ``test_model_record_sqlite.py``; the claim-and-outcome fallback of other ledgers in
``test_model_record.py``.)"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from test_model_record import (
    USER,
    FakeModel,
    Losing,
    agent_of,
    cfg,
    charge_tool,
    front_of,
    lose_a_run,
    model_entries,
    two_runs_at_once,
)

from langgraph_idem_saver.ledger import CallStatus
from langgraph_idem_saver.model_record import ModelRecorder
from langgraph_idem_saver.postgres import AsyncPostgresSaver


class LosingPostgresSaver(Losing, AsyncPostgresSaver):
    pass


def ledger_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ledger statements every async cursor executes from now on (the table named)."""
    seen: list[str] = []
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        text = " ".join(str(query).split())
        if "idem_tool_calls" in text:
            seen.append(text[:40])
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    return seen


async def test_a_fresh_model_call_is_one_read_and_one_write(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model step's ledger statements: the read (is it recorded?) and the record's
    INSERT - no claim before it, no outcome after it."""
    recorder = ModelRecorder()
    per_call: list[list[str]] = []
    acall = recorder.acall

    async def counted(*args: Any, **kwargs: Any) -> Any:
        before = len(seen)
        answer = await acall(*args, **kwargs)
        per_call.append([text.split(" FROM ")[0][:20] for text in seen[before:]])
        return answer

    monkeypatch.setattr(recorder, "acall", counted)
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        model, effects = FakeModel(asked=[]), []
        agent, mw = agent_of(model, saver, charge_tool(effects))
        mw.model_recorder = recorder
        seen = ledger_statements(monkeypatch)
        out = await agent.ainvoke(USER, cfg())
        entries = await model_entries(saver)
    assert out["messages"][-1].content == "done: 2"
    assert recorder.counts.recorded == 2
    assert per_call == [["SELECT scope, key, t", "INSERT INTO idem_too"]] * 2, per_call
    assert [e.status for e in entries] == [CallStatus.COMPLETED] * 2
    assert all(e.attempts == 1 and e.finished_at is not None for e in entries)


@pytest.mark.parametrize("front", ["agent", "graph"])
async def test_a_re_run_model_step_is_replayed(front: str, pg_dsn: str) -> None:
    model, effects = FakeModel(asked=[]), []
    async with LosingPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        graph = front_of(front, model, saver, effects)
        await lose_a_run(graph, saver, cfg())
        assert len(model.asked) == 2  # the calls, then the answer
        out = await graph.ainvoke(USER, cfg(), durability="exit")
        assert len(model.asked) == 2  # both steps replayed
        assert sorted(effects) == ["inv-1", "inv-2"]
        assert out["messages"][-1].content == "done: 2"
        assert [e.replays for e in await model_entries(saver)] == [1, 1]


async def test_two_runs_of_one_step_at_once_go_on_with_the_first_record(pg_dsn: str) -> None:
    """Both runs ask the model; the second INSERT finds the first's record and goes on
    with it: the same tool-call ids in both, each charge made once."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        await two_runs_at_once(saver)
        assert all(e.status is CallStatus.COMPLETED for e in await model_entries(saver))
