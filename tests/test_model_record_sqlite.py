"""Recorded model answers on SQLite, where a record is one commit (``answer_records``) as
on PostgreSQL: ``arecord_answer`` inserts the ``completed`` entry in one transaction,
committed as the saver's ``synchronous`` setting says (synced under FULL, where the old
claim-and-outcome path synced its claim and left its outcome unsynced); a fresh model
call costs one read and one write, never an ``issued`` claim first; the sync saver and
``ToolLedger`` forward the one-commit record to their async saver. (The claim-and-outcome
fallback, for a ledger that cannot record an answer so, is tested in
``test_model_record.py``.)"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from test_answer_records import ANSWER, check_a_taken_key_is_left_as_it_is, intent
from test_model_record import (
    USER,
    FakeModel,
    agent_of,
    cfg,
    charge_tool,
    model_entries,
    two_runs_at_once,
)

from langgraph_idem_saver import AsyncSqliteSaver, SqliteSaver, ToolLedger
from langgraph_idem_saver.answer_records import AnswerRecorder, AnswerRecords
from langgraph_idem_saver.ledger import CallStatus
from langgraph_idem_saver.ledger_policy import SEALED_ARGS
from langgraph_idem_saver.model_record import MODEL_TOOL_NAME
from langgraph_idem_saver.saver_base import IdemSaverBase


async def traced(saver: AsyncSqliteSaver) -> list[str]:
    """Every statement the saver's connection runs from now on."""
    seen: list[str] = []
    await saver.conn._execute(lambda: saver.conn._conn.set_trace_callback(seen.append))
    return seen


@pytest.mark.parametrize("synchronous", ["FULL", "NORMAL"])
async def test_an_answer_is_one_statement_committed_as_the_setting_says(
    tmp_path: Path, synchronous: Any
) -> None:
    """One transaction holding one INSERT, with no switch of ``synchronous``: under FULL
    the record is synced (a claim's durability), under NORMAL it is committed as the old
    path's outcome was (NORMAL)."""
    path = str(tmp_path / "s.db")
    async with AsyncSqliteSaver.from_conn_string(path, synchronous=synchronous) as saver:
        assert isinstance(saver, AnswerRecords)
        seen = await traced(saver)
        recorded, entry = await saver.arecord_answer(
            intent(), owner="me", lease_seconds=60, result_type="bytes", result=ANSWER
        )
        statements = [" ".join(s.split())[:27] for s in seen]
        level = await saver.conn._execute(
            lambda: saver.conn._conn.execute("PRAGMA synchronous").fetchone()[0]
        )
        stored = await saver.aget_entry("t", "k")
    assert recorded
    assert statements == ["BEGIN IMMEDIATE", "INSERT INTO idem_tool_calls", "COMMIT"], seen
    assert level == {"FULL": 2, "NORMAL": 1}[synchronous]  # the commit ran at this level
    assert stored == entry
    assert entry.status is CallStatus.COMPLETED and entry.result == ANSWER
    assert entry.owner == "me" and entry.attempts == 1 and entry.finished_at is not None


async def test_a_key_taken_is_left_as_it_is_and_its_entry_returned(tmp_path: Path) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        await check_a_taken_key_is_left_as_it_is(saver)


async def test_args_are_sealed_when_the_serializer_encrypts(tmp_path: Path) -> None:
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    path = str(tmp_path / "s.db")
    async with AsyncSqliteSaver.from_conn_string(path, serde=serde) as saver:
        _, entry = await saver.arecord_answer(
            intent(), owner="me", lease_seconds=60, result_type="bytes", result=ANSWER
        )
        assert entry == await saver.aget_entry("t", "k")
    assert entry.args == intent().args  # in clear for the caller
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT args FROM idem_tool_calls WHERE key = 'k'").fetchone()
    assert row is not None and bytes(row[0]).startswith(SEALED_ARGS)


async def test_a_fresh_model_call_is_one_read_and_one_write(tmp_path: Path) -> None:
    """The ledger statements of a run: per model call, the read (is it recorded?) and
    the record's INSERT - no ``issued`` claim before it, no outcome ``UPDATE`` after it
    (the tool calls' claims and outcomes are the other INSERTs and UPDATEs)."""
    model, effects = FakeModel(asked=[]), []
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        agent, mw = agent_of(model, saver, charge_tool(effects))
        await agent.ainvoke(USER, cfg("warm"))  # the connection's first statements
        seen = await traced(saver)
        out = await agent.ainvoke(USER, cfg())
        entries = await model_entries(saver)
    ledger = [" ".join(s.split()) for s in seen if "idem_tool_calls" in s]
    inserts = [s for s in ledger if s.startswith("INSERT")]
    assert out["messages"][-1].content == "done: 2"
    assert mw.model_recorder.counts.recorded == 4
    answers = [s for s in inserts if f"'{MODEL_TOOL_NAME}'" in s]
    assert len(answers) == 2 and all("'completed'" in s for s in answers), inserts
    assert not any("'issued'" in s for s in answers), "no claim before a record"
    assert sum("'issued'" in s for s in inserts) == 2, inserts  # the two tool calls' claims
    updates = [s for s in ledger if s.startswith("UPDATE")]
    assert len(updates) == 2, updates  # the two tool calls' outcomes: none for an answer
    assert [e.status for e in entries] == [CallStatus.COMPLETED] * 2
    assert all(e.attempts == 1 and e.finished_at is not None for e in entries)


@contextmanager
def model_claims_seen(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How often the savers' ``arecord_answer`` ran, and how many claims were made under
    the model's tool name (the fallback's first write), wrapping the real methods."""
    seen = {"answers": 0, "model_claims": 0}
    record, claim = AnswerRecords.arecord_answer, IdemSaverBase.aclaim

    async def arecord_answer(self: Any, *args: Any, **kwargs: Any) -> Any:
        seen["answers"] += 1
        return await record(self, *args, **kwargs)

    async def aclaim(self: Any, intents: Any, *args: Any, **kwargs: Any) -> Any:
        seen["model_claims"] += sum(i.tool_name == MODEL_TOOL_NAME for i in intents)
        return await claim(self, intents, *args, **kwargs)

    monkeypatch.setattr(AnswerRecords, "arecord_answer", arecord_answer)
    monkeypatch.setattr(IdemSaverBase, "aclaim", aclaim)
    yield seen


def test_the_sync_saver_forwards_the_one_commit_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, effects = FakeModel(asked=[]), []
    with SqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        assert isinstance(saver, AnswerRecorder)
        agent, mw = agent_of(model, saver, charge_tool(effects))
        with model_claims_seen(monkeypatch) as seen:
            out = agent.invoke(USER, cfg())
    assert out["messages"][-1].content == "done: 2"
    assert mw.model_recorder.counts.recorded == 2
    assert seen == {"answers": 2, "model_claims": 0}


async def test_a_tool_ledger_forwards_the_one_commit_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model, effects = FakeModel(asked=[]), []
    async with ToolLedger(str(tmp_path / "l.db")) as ledger:
        assert isinstance(ledger, AnswerRecorder)
        agent, mw = agent_of(model, InMemorySaver(), charge_tool(effects), ledger=ledger)
        with model_claims_seen(monkeypatch) as seen:
            out = await agent.ainvoke(USER, cfg())
        entries = await model_entries(ledger)
    assert out["messages"][-1].content == "done: 2"
    assert mw.model_recorder.counts.recorded == 2
    assert seen == {"answers": 2, "model_claims": 0}
    assert [e.status for e in entries] == [CallStatus.COMPLETED] * 2


async def test_two_runs_of_one_step_at_once_go_on_with_the_first_record(tmp_path: Path) -> None:
    """Both runs ask the model; the second INSERT finds the first's record and goes on
    with it: the same tool-call ids in both, each charge made once."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "s.db")) as saver:
        await two_runs_at_once(saver)
        assert all(e.status is CallStatus.COMPLETED for e in await model_entries(saver))
