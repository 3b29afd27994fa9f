"""PostgreSQL refusing the saver's statements on a lock, a conflict or a timeout
(``postgres/contention.py``): typed errors, nothing written, and no outcome lost.

Another session holds a table lock (``LOCK TABLE ... IN EXCLUSIVE MODE``, which blocks
writes) while the saver's connection runs with ``lock_timeout`` or ``statement_timeout``
set in its DSN's ``options`` (as a user sets them):

* a claim refused so raises :class:`DatabaseLockedError` / :class:`StatementTimeoutError`
  (never a raw psycopg error), and reading the table back after the other session rolled
  back shows nothing was written;
* a checkpoint write refused so, on the async saver and the sync direct path, the same,
  and no checkpoint is stored;
* an outcome refused so is retried while the lock is held and recorded once it is
  released; held longer than ``outcome_retry_seconds``, the caller gets the typed error
  saying it is kept, and the saver's next statement records it (a single connection of
  the user's too: the connection is still good);
* a release refused so is run again before the next statement (the claim does not stay
  live for its lease);
* a serialization failure (``repeatable read`` in the DSN, a concurrent update of the
  outcome's row) is retried and recorded;
* a whole sync graph whose tool's outcome meets ``lock_timeout`` completes, the tool run
  once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from langchain_core.messages import AIMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.prebuilt import create_react_agent
from pg_blocking import charge_intent, table_locked, with_setting
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, ConnectionPool
from tool_node_helpers import Counter, ai_calls, cfg, scripted_model, tool_messages

from langgraph_idem_saver import (
    AsyncPostgresSaver,
    ConnectionClosedError,
    DatabaseLockedError,
    IdempotentToolNode,
    IdemSaverError,
    Outcome,
    StatementTimeoutError,
)
from langgraph_idem_saver.ledger import CallStatus
from langgraph_idem_saver.owners import make_owner
from langgraph_idem_saver.postgres import PostgresSaver

OWNER = "host:1:contention"
KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
CONFIG: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
TIMEOUTS = {"lock_timeout": DatabaseLockedError, "statement_timeout": StatementTimeoutError}


def count(dsn: str, table: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(f"SELECT count(*) FROM {table}").fetchone()
    assert row is not None
    return int(row[0])


@asynccontextmanager
async def pooled_saver(dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=KWARGS) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver


async def record(saver: AsyncPostgresSaver, key: str = "k") -> None:
    type_, data = saver.serde.dumps_typed("charged")
    await saver.record_outcome("t", key, owner=OWNER, outcome=Outcome.completed(type_, data))


# --- nothing written, typed --------------------------------------------------------------


@pytest.mark.parametrize("setting", sorted(TIMEOUTS))
async def test_a_claim_refused_on_a_lock_is_typed_and_writes_nothing(
    pg_dsn: str, setting: str
) -> None:
    async with pooled_saver(with_setting(pg_dsn, setting, "200ms")) as saver:
        locked = table_locked(pg_dsn, "idem_tool_calls")
        with locked, pytest.raises(TIMEOUTS[setting], match="nothing was written") as raised:
            await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=60)
        assert isinstance(raised.value.__cause__, psycopg.errors.OperationalError)
        assert count(pg_dsn, "idem_tool_calls") == 0  # read back: no claim
        [again] = await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=60)
        assert again.claimed  # retryable, as the error says


async def test_a_checkpoint_write_past_statement_timeout_is_typed_and_writes_nothing(
    pg_dsn: str,
) -> None:
    async with pooled_saver(with_setting(pg_dsn, "statement_timeout", "200ms")) as saver:
        locked = table_locked(pg_dsn, "idem_checkpoints")
        with locked, pytest.raises(StatementTimeoutError) as raised:
            await saver.aput(CONFIG, empty_checkpoint(), {}, {})
        assert isinstance(raised.value, TimeoutError)
        assert await saver.aget_tuple(CONFIG) is None
        assert count(pg_dsn, "idem_checkpoints") == 0


@pytest.mark.parametrize("setting", sorted(TIMEOUTS))
def test_the_sync_direct_path_types_a_lock_and_a_timeout(pg_dsn: str, setting: str) -> None:
    dsn = with_setting(pg_dsn, setting, "200ms")
    error = TIMEOUTS[setting]
    with (
        ConnectionPool(dsn, kwargs=KWARGS, min_size=1, max_size=2) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        with table_locked(pg_dsn, "idem_checkpoints"), pytest.raises(error):
            saver.put(CONFIG, empty_checkpoint(), {}, {})
        assert saver.get_tuple(CONFIG) is None
        # the ledger, on the saver's loop
        with table_locked(pg_dsn, "idem_tool_calls"), pytest.raises(error):
            asyncio.run(saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=60))
    assert count(pg_dsn, "idem_checkpoints") == 0
    assert count(pg_dsn, "idem_tool_calls") == 0


def test_a_deadlock_and_a_serialization_failure_are_typed_as_locked() -> None:
    saver = AsyncPostgresSaver(AsyncConnectionPool("", open=False))
    for exc in (psycopg.errors.DeadlockDetected("d"), psycopg.errors.SerializationFailure("s")):
        error = saver._typed_error(exc, None)
        assert isinstance(error, DatabaseLockedError), exc
        assert isinstance(error, IdemSaverError)
        assert "nothing was written" in str(error)


def saver_blocked(dsn: str, application_name: str) -> None:
    """Return once a backend named ``application_name`` waits on a lock (10 s at most)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = %s"
    )
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(query, (application_name,)).fetchone() == (0,):
            assert time.monotonic() < deadline, "the saver's write never waited on the row"
            time.sleep(0.01)


# --- no outcome lost ---------------------------------------------------------------------


async def release_after(other: psycopg.Connection[Any], seconds: float) -> None:
    await asyncio.sleep(seconds)
    await asyncio.to_thread(other.rollback)


@pytest.mark.parametrize("setting", sorted(TIMEOUTS))
async def test_an_outcome_refused_on_a_lock_is_retried_until_recorded(
    pg_dsn: str, setting: str
) -> None:
    async with pooled_saver(with_setting(pg_dsn, setting, "100ms")) as saver:
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        with table_locked(pg_dsn, "idem_tool_calls") as other:
            releasing = asyncio.create_task(release_after(other, 0.8))  # > a few timeouts
            await asyncio.wait_for(record(saver), 30)  # no error: retried
            await releasing
        entry = await saver.aget_entry("t", "k")
    assert entry is not None and entry.status is CallStatus.COMPLETED


@pytest.mark.parametrize("conn", ["pool", "users_connection"])
async def test_an_outcome_refused_longer_than_its_retries_is_kept_and_written_next(
    pg_dsn: str, conn: str
) -> None:
    dsn = with_setting(pg_dsn, "lock_timeout", "100ms")
    async with (
        AsyncConnectionPool(dsn, min_size=1, max_size=2, kwargs=KWARGS) as pool,
        await psycopg.AsyncConnection.connect(dsn, autocommit=True) as single,
    ):
        saver = AsyncPostgresSaver(pool if conn == "pool" else single)
        await saver.setup()
        saver.outcome_retry_seconds = 0.4
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        with table_locked(pg_dsn, "idem_tool_calls"):
            with pytest.raises(DatabaseLockedError, match="kept by the saver"):
                await record(saver)
            assert count(pg_dsn, "idem_tool_calls WHERE status = 'issued'") == 1
        entry = await saver.aget_entry("t", "k")  # the held outcome is written first
    assert entry is not None and entry.status is CallStatus.COMPLETED


async def test_a_release_refused_on_a_lock_is_run_again_before_the_next_statement(
    pg_dsn: str,
) -> None:
    async with pooled_saver(with_setting(pg_dsn, "lock_timeout", "100ms")) as saver:
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        with table_locked(pg_dsn, "idem_tool_calls"), pytest.raises(DatabaseLockedError):
            await saver.arelease("t", "k", owner=OWNER)
        assert await saver.aget_entry("t", "k") is None  # released before this read


async def test_a_serialization_failure_on_an_outcome_is_retried_until_recorded(
    pg_dsn: str,
) -> None:
    dsn = with_setting(pg_dsn, "default_transaction_isolation", r"repeatable\ read")
    name = f"contention-serial-{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(dsn, application_name=name)
    async with pooled_saver(dsn) as saver:
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
            await other.execute("UPDATE idem_tool_calls SET error = NULL WHERE key = 'k'")
            writing = asyncio.create_task(record(saver))  # waits on the row, then conflicts
            await asyncio.to_thread(saver_blocked, pg_dsn, name)
            await other.commit()
            await asyncio.wait_for(writing, 30)
        entry = await saver.aget_entry("t", "k")
    assert entry is not None and entry.status is CallStatus.COMPLETED


def test_a_sync_graphs_outcome_meeting_lock_timeout_is_recorded(pg_dsn: str) -> None:
    fx = Counter()
    other = psycopg.connect(pg_dsn)

    @tool
    def charge(amount: int) -> str:
        """Charge the customer; another session locks the ledger's table meanwhile."""
        other.execute("LOCK TABLE idem_tool_calls IN EXCLUSIVE MODE")
        threading.Timer(0.8, other.rollback).start()
        fx.bump(amount)
        return f"charged {amount}"

    dsn = with_setting(pg_dsn, "lock_timeout", "100ms")
    model = scripted_model(ai_calls(("charge", {"amount": 5}, "k1")), AIMessage("ok", id="ai-ok"))
    try:
        with (
            ConnectionPool(dsn, kwargs=KWARGS, min_size=1, max_size=2) as pool,
            PostgresSaver(pool) as saver,
        ):
            saver.setup()
            graph = create_react_agent(model, IdempotentToolNode([charge]), checkpointer=saver)
            started = time.monotonic()
            out = graph.invoke({"messages": [("user", "pay")]}, cfg("t"))
            assert time.monotonic() - started >= 0.8  # it did wait for the lock
            assert tool_messages(out)[-1].content == "charged 5"
            entries = asyncio.run(saver.alist_entries("t"))
            assert [e.status for e in entries if e.tool_name != "__model__"] == [
                CallStatus.COMPLETED
            ]
    finally:
        other.close()
    assert fx.calls == [5]


# --- a claim whose second round is refused -----------------------------------------------


def blocked(dsn: str, application_name: str) -> None:
    """Return once a backend named ``application_name`` waits on a lock (10 s at most)."""
    saver_blocked(dsn, application_name)


async def test_a_claims_second_round_refused_on_a_lock_undoes_its_first_round(
    pg_dsn: str,
) -> None:
    """guarantees.md, "Locks and timeouts": a claim whose first statement committed some
    rows and left others to a second statement (a rival committed their keys after the
    first one's snapshot) and whose second statement the server refuses: the caller is
    told nothing was written, so the rows the first statement committed must not stay
    live claims of ours for their lease (our own retry would wait on them): they are
    undone before the saver's next statement, as after a lost connection.

    The scenario, all real: another session moves a row into ``k2``'s key and holds it
    uncommitted, so the first statement waits on it; a third session queues a SHARE lock
    on the table behind that statement; the mover commits, the first statement ends
    (``k1`` committed, ``k2`` unseen), and the second statement then waits on the SHARE
    lock past ``lock_timeout``."""
    name = f"contention-rounds-{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(with_setting(pg_dsn, "lock_timeout", "2s"), application_name=name)
    k1, k2 = charge_intent("k1"), charge_intent("k2")
    async with pooled_saver(dsn) as saver:
        staged = dataclasses.replace(k2, scope="staging")
        await saver.aclaim([staged], owner="rival", lease_seconds=300)
        share_dsn = make_conninfo(pg_dsn, application_name=f"{name}-share")
        async with (
            await psycopg.AsyncConnection.connect(pg_dsn) as mover,
            await psycopg.AsyncConnection.connect(share_dsn) as sharer,
        ):
            await mover.execute("UPDATE idem_tool_calls SET scope = 't' WHERE key = 'k2'")
            claiming = asyncio.create_task(saver.aclaim([k1, k2], owner=OWNER, lease_seconds=300))
            await asyncio.to_thread(blocked, pg_dsn, name)  # the first statement, on k2
            sharing = asyncio.create_task(
                sharer.execute("LOCK TABLE idem_tool_calls IN SHARE MODE")
            )
            await asyncio.to_thread(blocked, pg_dsn, f"{name}-share")
            await mover.commit()
            await sharing  # granted once the first statement committed
            with pytest.raises(DatabaseLockedError, match="nothing was written"):
                await claiming
            # the scenario happened: the first statement did commit k1
            assert count(pg_dsn, "idem_tool_calls WHERE key = 'k1'") == 1
            await sharer.rollback()
        assert await saver.aget_entry("t", "k1") is None  # undone before this read
        first, second = await saver.aclaim([k1, k2], owner=OWNER, lease_seconds=300)
        assert first.claimed and not second.claimed  # k1 ours again; k2 the rival's


async def test_a_claim_chosen_to_break_a_real_deadlock_is_typed_and_writes_nothing(
    pg_dsn: str,
) -> None:
    """README and guarantees.md: a deadlock (40P01) raises ``DatabaseLockedError``,
    nothing written - with a real deadlock, not a constructed exception. Another session
    moves rows into ``k2``'s and then ``k1``'s keys, uncommitted; the claim of ``[k1, k2]``
    inserts ``k1`` and waits on ``k2`` while the other session waits on ``k1``. The
    saver's session checks for the deadlock first (its ``deadlock_timeout`` is the
    shorter), so it is the one the server fails."""
    name = f"contention-deadlock-{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(with_setting(pg_dsn, "deadlock_timeout", "1500ms"), application_name=name)
    k1, k2 = charge_intent("k1"), charge_intent("k2")
    async with pooled_saver(dsn) as saver:
        staged = [dataclasses.replace(i, scope="staging") for i in (k1, k2)]
        await saver.aclaim(staged, owner="rival", lease_seconds=300)
        async with await psycopg.AsyncConnection.connect(pg_dsn) as other:
            await other.execute("SET deadlock_timeout = '60s'")
            move = "UPDATE idem_tool_calls SET scope = 't' WHERE scope = 'staging' AND key = %s"
            await other.execute(move, ("k2",))
            claiming = asyncio.create_task(saver.aclaim([k1, k2], owner=OWNER, lease_seconds=300))
            await asyncio.to_thread(blocked, pg_dsn, name)  # k1 inserted, waiting on k2
            moving = asyncio.create_task(other.execute(move, ("k1",)))  # waits on k1
            with pytest.raises(DatabaseLockedError, match="deadlock") as raised:
                await claiming
            assert isinstance(raised.value.__cause__, psycopg.errors.DeadlockDetected)
            await moving  # the other session goes on
            await other.rollback()
        # nothing of the claim was written: no row of ours under either key
        assert count(pg_dsn, "idem_tool_calls WHERE scope = 't'") == 0
        first, second = await saver.aclaim([k1, k2], owner=OWNER, lease_seconds=300)
        assert first.claimed and second.claimed  # retryable, as the error says


# --- an outcome still held when the sync saver closes ------------------------------------


async def recorded(saver: PostgresSaver, owner: str, outcome: Outcome) -> None:
    await saver.record_outcome("t", "k", owner=owner, outcome=outcome)


@pytest.mark.parametrize("lock_released", [True, False])
def test_an_outcome_still_held_when_the_sync_saver_closes_is_written_or_given_up(
    pg_dsn: str, lock_released: bool
) -> None:
    """guarantees.md, "No wait on yourself": an outcome refused on a lock past its retries
    is held until the saver's next statement; if the saver is closed first, its close
    writes it (the lock gone) or gives it up (this process then reads the call as an
    unknown outcome at once) - it is never dropped leaving a live claim of this process
    for the lease, on which the same process's retry would wait and raise
    ``ToolCallInProgress`` naming itself."""
    owner = make_owner()
    dsn = with_setting(pg_dsn, "lock_timeout", "100ms")
    with ConnectionPool(dsn, kwargs=KWARGS, min_size=1, max_size=2) as pool:
        saver = PostgresSaver(pool)
        try:
            saver.setup()
            saver.saver.outcome_retry_seconds = 0.3
            asyncio.run(saver.aclaim([charge_intent("k")], owner=owner, lease_seconds=300))
            type_, data = saver.serde.dumps_typed("charged")
            outcome = Outcome.completed(type_, data)
            with table_locked(pg_dsn, "idem_tool_calls") as other:
                with pytest.raises(DatabaseLockedError, match="kept by the saver"):
                    asyncio.run(recorded(saver, owner, outcome))
                if lock_released:
                    other.rollback()
                saver.close()  # before any next statement of the saver
        finally:
            saver.close()
        with PostgresSaver(pool) as again:
            entry = asyncio.run(again.aget_entry("t", "k"))
    assert entry is not None
    if lock_released:
        assert entry.status is CallStatus.COMPLETED  # written by the close
    else:
        assert entry.status is CallStatus.ISSUED and entry.is_unknown()  # given up: no wait


def refused(dsn: str, application_name: str) -> None:
    """Return once no backend named ``application_name`` waits on a lock (10 s at most)."""
    query = (
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
        "AND application_name = %s"
    )
    deadline = time.monotonic() + 10
    with psycopg.connect(dsn, autocommit=True) as conn:
        while conn.execute(query, (application_name,)).fetchone() != (0,):
            assert time.monotonic() < deadline, "the saver's write never stopped waiting"
            time.sleep(0.005)


async def test_an_outcome_retried_on_a_lock_gives_up_at_once_when_the_users_connection_dies(
    pg_dsn: str,
) -> None:
    """An outcome refused on a lock is retried on the user's own connection (still good
    after a lock); if that connection is then lost, the saver can never write it (the
    connection is not its to replace), so it gives the outcome up at once - it does not
    go on retrying a dead connection for the rest of ``outcome_retry_seconds``."""
    name = f"contention-dies-{uuid.uuid4().hex[:8]}"
    dsn = make_conninfo(with_setting(pg_dsn, "lock_timeout", "100ms"), application_name=name)
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as single:
        saver = AsyncPostgresSaver(single)
        await saver.setup()
        saver.outcome_retry_seconds = 20.0
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        with table_locked(pg_dsn, "idem_tool_calls"):
            writing = asyncio.create_task(record(saver))
            await asyncio.to_thread(blocked, pg_dsn, name)  # the first try, on the lock
            await asyncio.to_thread(refused, pg_dsn, name)  # ... refused: now retrying
            with psycopg.connect(pg_dsn, autocommit=True) as admin:
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    (name,),
                )
            started = time.monotonic()
            with pytest.raises(IdemSaverError, match="could not be recorded"):
                await asyncio.wait_for(writing, 30)
            assert time.monotonic() - started < 5  # not the 20 s of retries


# --- an exhausted pool is not a lost connection ------------------------------------------


async def test_an_exhausted_async_pool_is_waited_for_never_bypassed(pg_dsn: str) -> None:
    """guarantees.md, "Reconnecting": the saver runs a call on a connection of its own
    only for a minute after a *lost* connection. A pool whose connections are all in use
    (its ``max_size`` reached) lost none: a call that gets none within the pool's
    ``timeout`` raises ``ConnectionClosedError`` after that one timeout, and neither it
    nor the calls after it open connections beyond the pool's ``max_size`` (they did: a
    pool timeout armed the after-a-loss bridge, and the call's retry ran on its own)."""
    name = f"contention-exhausted-{uuid.uuid4().hex[:8]}"
    kwargs = {**KWARGS, "application_name": name}
    async with AsyncConnectionPool(
        pg_dsn, kwargs=kwargs, min_size=1, max_size=1, timeout=1.0
    ) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        held = await pool.getconn()
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionClosedError, match="pool's timeout"):
                await saver.aput(CONFIG, empty_checkpoint(), {}, {})
            assert time.monotonic() - started < 1.9  # one timeout, not a retry's
            with pytest.raises(ConnectionClosedError, match="pool's timeout"):
                await saver.aget_tuple(CONFIG)  # no bridge armed for the next call
            assert count_backends(pg_dsn, name) == 1  # the pool's one alone
        finally:
            await pool.putconn(held)
        assert await saver.aget_tuple(CONFIG) is None  # the pool's connection, back


def count_backends(dsn: str, application_name: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
            (application_name,),
        ).fetchone()
    assert row is not None
    return int(row[0])
