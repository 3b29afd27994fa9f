"""A step's outcome rows on PostgreSQL go to the outcomes' group commit as ONE item
(``PostgresLedgerStore._finish_all_soon``): one future for the rows instead of one each,
sent at once, and in one statement with any single outcome pending beside them
(``PostgresHeldWrites._finish_all`` flattens the batch and answers each item in kind).

Real parts: our ``AsyncPostgresSaver`` (what a sync ``PostgresSaver`` runs its ledger
through) on a real PostgreSQL; the statements counted at psycopg's cursor; the rows read
back as committed.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from pg_blocking import table_locked, with_setting
from tool_node_helpers import intent_for

from langgraph_idem_saver.errors import DatabaseLockedError, LedgerStateError
from langgraph_idem_saver.ledger import CallIntent, Outcome
from langgraph_idem_saver.postgres import AsyncPostgresSaver

ME, OTHER = "host:1:me", "host:2:other"


@pytest.fixture
async def saver(pg_dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as s:
        yield s


def intents(thread: str, n: int) -> list[CallIntent]:
    return [
        intent_for(thread, {"name": "charge", "args": {"i": i}, "id": f"{thread}{i}"})
        for i in range(n)
    ]


def row(intent: CallIntent, owner: str = ME) -> tuple[Any, ...]:
    """An outcome row (``held_outcomes.OutcomeParams``) of ``intent``'s call, completed."""
    return ("completed", "json", b'"ok"', None, time.time(), intent.scope, intent.key, owner)


def counted(monkeypatch: pytest.MonkeyPatch, saver: AsyncPostgresSaver) -> dict[str, int]:
    """Outcome statements sent (``idem_finish_*``) and single outcomes submitted."""
    counts = {"statements": 0, "single": 0}
    real_execute = psycopg.AsyncCursor.execute

    async def execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if "idem_finish_" in str(query):
            counts["statements"] += 1
        return await real_execute(cur, query, *args, **kwargs)

    real_single = saver._finish_soon

    def single(outcome: tuple[Any, ...]) -> Any:
        counts["single"] += 1
        return real_single(outcome)

    monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
    monkeypatch.setattr(saver, "_finish_soon", single)
    return counts


async def statuses(saver: AsyncPostgresSaver, thread: str) -> dict[str, str]:
    entries = await saver.alist_entries(thread_id=thread)
    return {e.tool_call_id: e.status.value for e in entries}


async def test_a_steps_rows_go_as_one_item_and_one_statement(
    saver: AsyncPostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    step = intents("s", 10)
    await saver.aclaim(step, owner=ME, lease_seconds=60)
    counts = counted(monkeypatch, saver)
    answers = await saver.record_outcome_rows([row(i) for i in step])
    assert answers == [None] * 10
    assert counts == {"statements": 1, "single": 0}  # no future a row
    assert await statuses(saver, "s") == {f"s{i}": "completed" for i in range(10)}


async def test_a_single_outcome_and_a_steps_rows_share_a_statement_each_answered(
    saver: AsyncPostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A single outcome submitted first (its write waits a loop iteration for siblings)
    and a step's rows submitted in the same iteration go in one statement; each gets its
    own answer - the step's row that is not ours to finish (claimed by another owner) its
    ``LedgerStateError``, the others None."""
    lone, step = intents("one", 1), intents("step", 4)
    await saver.aclaim(lone + step[:3], owner=ME, lease_seconds=60)
    await saver.aclaim(step[3:], owner=OTHER, lease_seconds=60)
    counts = counted(monkeypatch, saver)
    outcome = Outcome.completed("json", b'"ok"')
    single = saver.record_outcome(lone[0].scope, lone[0].key, owner=ME, outcome=outcome)
    rows = saver.record_outcome_rows([row(i) for i in step])
    answers = await rows
    await single
    assert counts["statements"] == 1
    assert answers[:3] == [None] * 3
    assert isinstance(answers[3], LedgerStateError)
    assert await statuses(saver, "one") == {"one0": "completed"}
    assert await statuses(saver, "step") == {
        "step0": "completed", "step1": "completed", "step2": "completed", "step3": "issued"
    }  # fmt: skip


async def test_rows_submitted_while_a_write_is_in_flight_join_the_next_one(
    saver: AsyncPostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two steps' rows, the second submitted while the first's statement runs: two
    statements (one a batch, as before), every row answered and committed."""
    first, second = intents("a", 3), intents("b", 3)
    await saver.aclaim(first + second, owner=ME, lease_seconds=60)
    counts = counted(monkeypatch, saver)
    one = asyncio.ensure_future(saver.record_outcome_rows([row(i) for i in first]))
    await asyncio.sleep(0)  # the first batch's task has started its statement
    two = saver.record_outcome_rows([row(i) for i in second])
    assert await one == [None] * 3 and await two == [None] * 3
    assert counts["statements"] == 2
    assert set((await statuses(saver, "a")).values()) == {"completed"}
    assert set((await statuses(saver, "b")).values()) == {"completed"}


async def test_a_steps_rows_and_a_single_outcome_refused_on_a_lock_are_kept_and_written_next(
    pg_dsn: str,
) -> None:
    """The flattened batch keeps ``_finish_rows``' path through contention: a step's rows
    and a single outcome in one write that meets ``lock_timeout`` past
    ``outcome_retry_seconds`` each get the typed error naming all four calls as kept, none
    is written while the lock holds, and every one is written before the next statement."""
    dsn = with_setting(pg_dsn, "lock_timeout", "100ms")
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        saver.outcome_retry_seconds = 0.4
        lone, step = intents("lk", 1), intents("st", 3)
        await saver.aclaim(lone + step, owner=ME, lease_seconds=300)
        outcome = Outcome.completed("json", b'"ok"')
        with table_locked(pg_dsn, "idem_tool_calls"):
            single = saver.record_outcome(lone[0].scope, lone[0].key, owner=ME, outcome=outcome)
            rows = saver.record_outcome_rows([row(i) for i in step])
            raised = await asyncio.gather(single, rows, return_exceptions=True)
            for error in raised:  # each caller its own answer: the write's typed error
                assert isinstance(error, DatabaseLockedError), error
                assert "outcome of 4 tool call(s) is kept by the saver" in str(error)
            # read with a connection of the test's own (a read of the saver's would
            # first write what it holds, and wait on the lock)
            with psycopg.connect(pg_dsn, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT status, count(*) FROM idem_tool_calls"
                    " WHERE thread_id IN ('lk', 'st') GROUP BY status"
                ).fetchall()
            assert found == [("issued", 4)]
        # the next statement writes what is held first
        assert await statuses(saver, "st") == {f"st{i}": "completed" for i in range(3)}
        assert await statuses(saver, "lk") == {"lk0": "completed"}
