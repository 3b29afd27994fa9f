"""A model's answer recorded in one commit (``answer_records.AnswerRecords``, on the
PostgreSQL saver): one statement inserts the ``completed`` entry; a key already taken is
left as it is and its entry returned (the winner); the entry returned is the one stored,
args in clear even when the saver's serializer encrypts them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

from langgraph_idem_saver.answer_records import AnswerRecords
from langgraph_idem_saver.ledger import CallIntent, CallStatus
from langgraph_idem_saver.ledger_policy import SEALED_ARGS
from langgraph_idem_saver.postgres import AsyncPostgresSaver

ANSWER = bytes(range(256))


@asynccontextmanager
async def opened(dsn: str, serde: Any = None) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(dsn, serde=serde) as saver:
        await saver.setup()
        yield saver


def intent(key: str = "k") -> CallIntent:
    return CallIntent(
        scope="t", key=key, thread_id="t", agent_path="model", tool_name="__model__",
        args_hash="digest", args=b'{"model_call":"model","step":1}', tool_call_id="model:1",
        run_id="run",
    )  # fmt: skip


def count_statements(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(" ".join(str(query).split())[:40])
        return await original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    return seen


async def test_an_answer_is_one_statement_and_comes_back_as_stored(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with opened(pg_dsn) as saver:
        assert isinstance(saver, AnswerRecords)
        seen = count_statements(monkeypatch)
        recorded, entry = await saver.arecord_answer(
            intent(), owner="me", lease_seconds=60, result_type="bytes", result=ANSWER
        )
        assert recorded
        assert len(seen) == 1 and seen[0].startswith("INSERT INTO idem_tool_calls"), seen
        stored = await saver.aget_entry("t", "k")
    assert stored == entry
    assert entry.status is CallStatus.COMPLETED and entry.result == ANSWER
    assert entry.owner == "me" and entry.attempts == 1 and entry.finished_at is not None


async def check_a_taken_key_is_left_as_it_is(saver: AnswerRecords) -> None:
    """A second record under a key returns the first, unchanged; so does one under an
    ``issued`` claim (a record written as claim and outcome): returned issued, for the
    caller to wait for or take over. (Both backends: the SQLite test calls it too.)"""
    first = await saver.arecord_answer(
        intent(), owner="a", lease_seconds=60, result_type="bytes", result=b"first"
    )
    second = await saver.arecord_answer(
        intent(), owner="b", lease_seconds=60, result_type="bytes", result=b"second"
    )
    assert first[0] and not second[0]
    assert second[1] == first[1] and second[1].result == b"first"
    [claim] = await saver.aclaim([intent("claimed")], owner="c", lease_seconds=60)
    taken = await saver.arecord_answer(
        intent("claimed"), owner="d", lease_seconds=60, result_type="bytes", result=b"x"
    )
    assert not taken[0] and taken[1] == claim.entry
    assert [e.status for e in await saver.alist_entries("t")] == [
        CallStatus.COMPLETED,
        CallStatus.ISSUED,
    ]


async def test_a_key_taken_is_left_as_it_is_and_its_entry_returned(pg_dsn: str) -> None:
    async with opened(pg_dsn) as saver:
        await check_a_taken_key_is_left_as_it_is(saver)


async def test_args_are_sealed_when_the_serializer_encrypts(pg_dsn: str) -> None:
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    async with opened(pg_dsn, serde) as saver:
        _, entry = await saver.arecord_answer(
            intent(), owner="me", lease_seconds=60, result_type="bytes", result=ANSWER
        )
        assert entry == await saver.aget_entry("t", "k")
    assert entry.args == intent().args  # in clear for the caller
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        row = conn.execute("SELECT args FROM idem_tool_calls WHERE key = 'k'").fetchone()
    assert row is not None and bytes(row[0]).startswith(SEALED_ARGS)


async def test_an_answer_commits_after_the_wal_flush(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's transaction keeps the session's ``synchronous_commit`` (on), as a
    claim's does: committed, the answer survives a server crash (observed inside the
    statement's transaction, on a connection not in autocommit)."""
    inside: list[str] = []
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, query, *args, **kwargs)
        if "INSERT INTO idem_tool_calls" in str(query):
            async with self.connection.cursor() as other:  # the same transaction
                await original(other, "SHOW synchronous_commit")
                row = await other.fetchone()
                inside.append(row[0] if row else "")
        return result

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=False) as conn:
        await conn.execute("SET synchronous_commit = on")
        await conn.commit()
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
        recorded, _ = await saver.arecord_answer(
            intent(), owner="me", lease_seconds=60, result_type="bytes", result=ANSWER
        )
        monkeypatch.undo()
        await conn.rollback()  # nothing left open: the record was committed by itself
        assert recorded and inside == ["on"]
        assert await saver.aget_entry("t", "k") is not None
