"""``PostgresSaver(conn)`` / ``PostgresSaver(pool)`` run the ledger on the user's own
connections (``postgres/borrowed.py``): no connection of the saver's, no connect per call.

* a sync graph with ``IdempotentToolNode``, and a ``create_agent`` +
  ``IdempotencyMiddleware`` graph with parallel tool calls, run and then replay their
  completed calls (time travel to before the tools: nothing runs twice) while the saver
  opens no connection: psycopg's ``Connection.connect`` / ``AsyncConnection.connect``
  (spied, still connecting) are never called after the user's objects exist, and the
  database's server backends, read from ``pg_stat_activity`` while each tool runs, are
  only the user's. The control: a pipelined connection's saver opens a session of its own,
  and both counts see it;
* typed errors: the user's connection lost during a tool (its outcome cannot be written:
  ``ConnectionClosedError``, given up at once), a pool's connections killed (the outcome
  is retried on a fresh pooled connection and recorded), a pool closed during a tool
  (``ConnectionClosedError`` saying so); a checkpoint write on a killed pooled connection
  runs once more on a fresh one - also the background ``put`` of LangGraph's
  ``durability="async"`` caught in flight by the kill (held there on a table lock), which
  made the kill test fail now and then under load;
* two threads on one pool saver run their tool steps at once (both tools inside at the
  same time) and both complete, with their own claims;
* a ledger call cancelled while it waits for a pooled connection runs nothing; one
  cancelled mid-statement is waited for until the statement ends; a statement body that
  would suspend (a bug) is refused;
* a non-autocommit connection commits each ledger call, and a transaction of the user's
  left open on it is refused (``ConfigError``) rather than joined; a pool's ``configure``
  callback applies to the ledger (its ``search_path`` holds the ledger's table).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.prebuilt import create_react_agent
from psycopg.conninfo import make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from tool_node_helpers import Counter, ai_calls, cfg, intent_for, scripted_model, tool_messages

from langgraph_idem_saver import (
    ConfigError,
    ConnectionClosedError,
    IdempotencyMiddleware,
    IdempotentToolNode,
)
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry
from langgraph_idem_saver.postgres import PostgresSaver

KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
POOL_SIZE = 3


@pytest.fixture
def database(pg_server_dsn: str) -> Iterator[tuple[str, str]]:
    """A database of its own (its backends are this test's alone): (name, DSN)."""
    name = f"idem_borrow_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield name, make_conninfo(pg_server_dsn, dbname=name)
    finally:
        with psycopg.connect(pg_server_dsn, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Watch:
    """Connections opened by anyone in this process since watching began, and server
    backends of the database seen (by :meth:`look`) that are not the user's."""

    admin: psycopg.Connection[Any]
    dbname: str
    users: set[int]
    connects: list[str] = field(default_factory=list)
    foreign: set[int] = field(default_factory=set)
    looks: int = 0

    def look(self) -> None:
        rows = self.admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s", (self.dbname,)
        ).fetchall()
        self.foreign |= {pid for (pid,) in rows} - self.users
        self.looks += 1


@contextmanager
def watching(
    monkeypatch: pytest.MonkeyPatch, server_dsn: str, dbname: str, users: set[int]
) -> Iterator[Watch]:
    """Spy on psycopg's connects (they still connect) and read the database's backends
    from a connection to another database (so it is not one of them)."""
    with psycopg.connect(server_dsn, autocommit=True) as admin:
        watch = Watch(admin, dbname, users)
        sync_connect = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]
        async_connect = psycopg.AsyncConnection.connect.__func__  # type: ignore[attr-defined]

        def spy_sync(cls: Any, *args: Any, **kwargs: Any) -> Any:
            watch.connects.append(cls.__name__)
            return sync_connect(cls, *args, **kwargs)

        async def spy_async(cls: Any, *args: Any, **kwargs: Any) -> Any:
            watch.connects.append(cls.__name__)
            return await async_connect(cls, *args, **kwargs)

        monkeypatch.setattr(psycopg.Connection, "connect", classmethod(spy_sync))
        monkeypatch.setattr(psycopg.AsyncConnection, "connect", classmethod(spy_async))
        yield watch


@contextmanager
def users_objects(dsn: str, how: str) -> Iterator[tuple[Any, set[int]]]:
    """The user's ``Connection`` or fixed-size ``ConnectionPool``, and its backends' pids."""
    if how == "conn":
        with psycopg.connect(dsn, **KWARGS) as conn:
            yield conn, {conn.info.backend_pid}
        return
    with ConnectionPool(dsn, kwargs=KWARGS, min_size=POOL_SIZE, max_size=POOL_SIZE) as pool:
        yield pool, pool_pids(pool)


def pool_pids(pool: ConnectionPool[Any]) -> set[int]:
    """The backends' pids of every connection of ``pool`` (all borrowed at once)."""
    pool.wait()
    held = [pool.getconn() for _ in range(pool.max_size)]
    try:
        return {c.info.backend_pid for c in held}
    finally:
        for c in held:
            pool.putconn(c)


def charging(fx: Counter, watch: Watch | None = None) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer (a sync tool)."""
        if watch is not None:
            watch.look()
        fx.bump(amount)
        return f"charged {amount}"

    return charge


def entries(saver: PostgresSaver, thread_id: str) -> list[LedgerEntry]:
    found: list[LedgerEntry] = asyncio.run(saver.alist_entries(thread_id))
    return [e for e in found if e.tool_name != "__model__"]


THREE = (("charge", {"amount": 1}, "c1"), ("charge", {"amount": 2}, "c2"))
THREE += (("charge", {"amount": 3}, "c3"),)


def run_tool_node_and_replay(saver: PostgresSaver, watch: Watch | None) -> Counter:
    """A react agent with ``IdempotentToolNode``: three parallel calls, then a replay."""
    fx = Counter()
    model = scripted_model(ai_calls(*THREE), AIMessage("done", id="ai-done"))
    agent = create_react_agent(model, IdempotentToolNode([charging(fx, watch)]), checkpointer=saver)
    out = agent.invoke({"messages": [("user", "pay")]}, cfg("t"))
    assert sorted(m.content for m in tool_messages(out)) == ["charged 1", "charged 2", "charged 3"]
    before_tools = next(
        s for s in agent.get_state_history(cfg("t")) if s.next and "tools" in s.next
    )
    node = IdempotentToolNode([charging(fx, watch)])
    again = create_react_agent(
        scripted_model(AIMessage("again", id="ai-2")), node, checkpointer=saver
    )
    out = again.invoke(None, before_tools.config)
    assert sorted(m.content for m in tool_messages(out))[-3:] == [
        "charged 1",
        "charged 2",
        "charged 3",
    ]
    assert node.counters.replayed == 3 and node.counters.executed == 0
    return fx


def run_middleware_and_replay(saver: PostgresSaver, watch: Watch | None) -> Counter:
    """``create_agent`` + ``IdempotencyMiddleware``: three parallel calls, then a replay."""
    fx = Counter()
    turn = [ai_calls(*THREE, msg_id="ai-charges"), AIMessage("done", id="ai-done")]
    tools = [charging(fx, watch)]
    agent = create_agent(
        scripted_model(*turn), tools=tools, middleware=[IdempotencyMiddleware()], checkpointer=saver
    )
    out = agent.invoke({"messages": [("user", "pay")]}, cfg("m"))
    assert out["messages"][-1].content == "done"
    before_tools = next(
        s for s in agent.get_state_history(cfg("m")) if s.next and "tools" in s.next
    )
    again = create_agent(
        scripted_model(AIMessage("again", id="ai-2")),
        tools=tools,
        middleware=[IdempotencyMiddleware()],
        checkpointer=saver,
    )
    out = again.invoke(None, before_tools.config)
    assert out["messages"][-1].content == "again"
    return fx


@pytest.mark.parametrize("how", ["conn", "pool"])
def test_tool_steps_open_no_connection_of_the_savers_and_replay(
    pg_server_dsn: str, database: tuple[str, str], how: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, dsn = database
    with (
        users_objects(dsn, how) as (users, pids),
        watching(monkeypatch, pg_server_dsn, name, pids) as watch,
        PostgresSaver(users) as saver,
    ):
        saver.setup()
        node_fx = run_tool_node_and_replay(saver, watch)
        agent_fx = run_middleware_and_replay(saver, watch)
        watch.look()
        assert watch.connects == [] and watch.foreign == set(), "the saver opened nothing"
        assert watch.looks == 7  # each tool ran once (the replays ran none), and the end
    assert sorted(node_fx.calls) == sorted(agent_fx.calls) == [1, 2, 3]
    for thread in ("t", "m"):
        assert [e.status for e in entries_after(dsn, thread)] == [CallStatus.COMPLETED] * 3


def entries_after(dsn: str, thread_id: str) -> list[LedgerEntry]:
    """The thread's entries, read through a new saver over a new connection."""
    with psycopg.connect(dsn, **KWARGS) as conn, PostgresSaver(conn) as saver:
        return entries(saver, thread_id)


def test_the_control_a_pipelined_saver_opens_a_session_and_the_watch_sees_it(
    pg_server_dsn: str, database: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, dsn = database
    with (
        users_objects(dsn, "conn") as (conn, pids),
        watching(monkeypatch, pg_server_dsn, name, pids) as watch,
        conn.pipeline() as pipe,
        PostgresSaver(conn, pipe) as saver,
    ):
        run_tool_node_and_replay(saver, watch)
        assert watch.connects == ["AsyncConnection"] and len(watch.foreign) == 1


# --- typed errors -----------------------------------------------------------------------


def killer(dsn: str, pids: Callable[[], set[int]]) -> Callable[[], None]:
    """Terminate the backends ``pids()`` and wait until they are gone (the signal alone
    returns before they exit: a statement could still run on one meanwhile). All in one
    statement, so they die together (one by one, a write failing on the first could be
    run again, as a lost write is, on one not terminated yet, and lost with it)."""

    def kill() -> None:
        doomed = sorted(pids())
        with psycopg.connect(dsn, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", (doomed,))
            deadline = time.monotonic() + 10
            query = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
            while admin.execute(query, (doomed,)).fetchone() != (0,):
                assert time.monotonic() < deadline, "the backends outlived their termination"
                time.sleep(0.01)

    return kill


def one_call_graph(saver: PostgresSaver, during: Callable[[], None], fx: Counter) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge the customer; something happens to the database meanwhile."""
        during()
        fx.bump(amount)
        return f"charged {amount}"

    model = scripted_model(ai_calls(("charge", {"amount": 5}, "k1")), AIMessage("ok", id="ai-ok"))
    return create_react_agent(model, IdempotentToolNode([charge]), checkpointer=saver)


def test_the_users_connection_lost_during_a_tool_raises_connection_closed(pg_dsn: str) -> None:
    fx = Counter()
    with psycopg.connect(pg_dsn, **KWARGS) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        graph = one_call_graph(saver, killer(pg_dsn, lambda: {conn.info.backend_pid}), fx)
        with pytest.raises(ConnectionClosedError, match="cannot reconnect"):
            graph.invoke({"messages": [("user", "pay")]}, cfg("t"))
    assert fx.calls == [5]


def test_a_pools_connections_killed_during_a_tool_the_outcome_is_still_recorded(
    pg_dsn: str,
) -> None:
    fx = Counter()
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=2, max_size=2) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        pids = pool_pids(pool)
        graph = one_call_graph(saver, killer(pg_dsn, lambda: pids), fx)
        # durability "sync": no checkpoint write is in flight when the tool kills (under
        # "async", LangGraph's default, one can be, by chance: the next test makes it so)
        out = graph.invoke({"messages": [("user", "pay")]}, cfg("t"), durability="sync")
        assert tool_messages(out)[-1].content == "charged 5"
        [entry] = entries(saver, "t")
        assert entry.status is CallStatus.COMPLETED and fx.calls == [5]


def blocked_on_a_lock(dsn: str, pids: set[int]) -> int:
    """The pid of the first of ``pids`` to wait on a lock (10 s at most)."""
    with psycopg.connect(dsn, autocommit=True) as admin:
        deadline = time.monotonic() + 10
        query = "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = ANY(%s)"
        while (row := admin.execute(query, (sorted(pids),)).fetchone()) is None:
            assert time.monotonic() < deadline, "no statement ever waited on the lock"
            time.sleep(0.01)
    return int(row[0])


def test_a_checkpoint_put_in_flight_when_the_pools_connections_are_killed_is_rerun(
    pg_dsn: str,
) -> None:
    """The cause of a flaky failure of the test above: LangGraph's ``durability="async"``
    (its default) writes a step's checkpoint in the background while the next step runs,
    so under load that ``put`` could be the statement on a killed connection, and the
    sync direct path did not run a lost write again (the async saver does). Here the
    ``put`` is made to be in flight - held on a table lock - when the tool kills the
    pool's connections (the idle one first, so the put's second try cannot land on a
    connection about to die), then the lock is released."""
    fx = Counter()
    pool: ConnectionPool[Any] = ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=2, max_size=2)
    with pool, PostgresSaver(pool) as saver, psycopg.connect(pg_dsn) as other:
        saver.setup()
        pids = pool_pids(pool)

        def during() -> None:
            blocked = blocked_on_a_lock(pg_dsn, pids)  # the background put of the model's step
            killer(pg_dsn, lambda: pids - {blocked})()  # the idle ones first: then the
            killer(pg_dsn, lambda: {blocked})()  # put's retry finds no live one to lose
            other.rollback()  # the lock released: the put may run again

        other.execute("LOCK TABLE idem_checkpoints IN EXCLUSIVE MODE")
        graph = one_call_graph(saver, during, fx)
        out = graph.invoke({"messages": [("user", "pay")]}, cfg("t"))
        assert tool_messages(out)[-1].content == "charged 5"
        [entry] = entries(saver, "t")
        assert entry.status is CallStatus.COMPLETED and fx.calls == [5]
        # every checkpoint of the run is stored: the latest one holds the whole run
        latest = saver.get_tuple(cfg("t"))
        assert latest is not None
        assert tool_messages(latest.checkpoint["channel_values"])[-1].content == "charged 5"


@pytest.mark.parametrize("call", ["put", "put_writes"])
def test_a_checkpoint_write_on_a_killed_pooled_connection_runs_again(
    pg_dsn: str, call: str
) -> None:
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=2, max_size=2) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        stored = saver.put(cfg("t"), empty_checkpoint(), {"step": -1}, {})
        killer(pg_dsn, lambda: pool_pids(pool))()  # the pool still holds them, dead
        if call == "put":
            saver.put(stored, empty_checkpoint(), {"step": 0}, {})
            assert len(list(saver.list(cfg("t")))) == 2
        else:
            saver.put_writes(stored, [("v", 1)], "task-1")
            found = saver.get_tuple(stored)
            assert found is not None and found.pending_writes == [("task-1", "v", 1)]


def test_a_pool_closed_during_a_tool_raises_connection_closed(pg_dsn: str) -> None:
    fx = Counter()
    pool: ConnectionPool[Any] = ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=2)
    with pool, PostgresSaver(pool) as saver:
        saver.setup()
        graph = one_call_graph(saver, pool.close, fx)
        with pytest.raises(ConnectionClosedError, match="pool is closed"):
            graph.invoke({"messages": [("user", "pay")]}, cfg("t"))
    assert fx.calls == [5]


# --- concurrency, cancellation, transactions, session settings ---------------------------


def test_two_threads_on_one_pool_saver_run_tool_steps_at_once(pg_dsn: str) -> None:
    inside = threading.Barrier(2, timeout=30)  # both tools running at the same time
    fx = Counter()

    @tool
    def charge(amount: int) -> str:
        """Charge the customer (waits for the other thread's tool)."""
        inside.wait()
        fx.bump(amount)
        return f"charged {amount}"

    def step(thread_id: str, amount: int) -> None:
        graph = create_react_agent(
            scripted_model(
                ai_calls(("charge", {"amount": amount}, f"c-{thread_id}")),
                AIMessage("done", id=f"ai-done-{thread_id}"),
            ),
            IdempotentToolNode([charge]),
            checkpointer=saver,
        )
        out = graph.invoke({"messages": [("user", "pay")]}, cfg(thread_id))
        results[thread_id] = tool_messages(out)[-1].content

    results: dict[str, str] = {}
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=2, max_size=4) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        threads = [threading.Thread(target=step, args=(t, a)) for t, a in (("a", 1), ("b", 2))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert results == {"a": "charged 1", "b": "charged 2"}
        [a], [b] = entries(saver, "a"), entries(saver, "b")
    assert {a.status, b.status} == {CallStatus.COMPLETED}
    assert (a.scope, a.key) != (b.scope, b.key) and sorted(fx.calls) == [1, 2]


def test_a_ledger_call_cancelled_while_waiting_for_a_pooled_connection_runs_nothing(
    pg_dsn: str,
) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=1, timeout=10) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        held = pool.getconn()  # the pool exhausted: the claim waits for its connection
        started = time.monotonic()
        claiming = saver.saver.aclaim([intent], owner="a", lease_seconds=60)
        with pytest.raises(asyncio.TimeoutError):
            saver._call(asyncio.wait_for(claiming, 0.5))  # on the saver's loop
        assert time.monotonic() - started < 5, "the cancelled call was not waited for"
        pool.putconn(held)  # the abandoned call now gets the connection, and runs nothing
        time.sleep(0.5)
        [claim] = asyncio.run(saver.aclaim([intent], owner="b", lease_seconds=60))
        assert claim.claimed, "the cancelled claim committed nothing"


def test_a_non_autocommit_connection_commits_each_ledger_call(pg_dsn: str) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        psycopg.connect(pg_dsn, autocommit=False) as conn,
        PostgresSaver(conn) as saver,
        psycopg.connect(pg_dsn, autocommit=True) as other,
    ):
        [claim] = asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        assert claim.claimed
        assert conn.info.transaction_status is psycopg.pq.TransactionStatus.IDLE
        seen = other.execute("SELECT status FROM idem_tool_calls").fetchall()
        assert seen == [("issued",)]


def test_a_pools_configure_callback_applies_to_the_ledger(
    database: tuple[str, str],
) -> None:
    _, dsn = database
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute("CREATE SCHEMA app")

    def configure(conn: psycopg.Connection[Any]) -> None:
        conn.execute("SET search_path TO app")

    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        ConnectionPool(dsn, kwargs=KWARGS, configure=configure, min_size=1, max_size=2) as pool,
        PostgresSaver(pool) as saver,
    ):
        [claim] = asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        assert claim.claimed
    with psycopg.connect(dsn, autocommit=True) as admin:
        assert admin.execute("SELECT count(*) FROM app.idem_tool_calls").fetchone() == (1,)
        found = admin.execute("SELECT to_regclass('public.idem_tool_calls')").fetchone()
        assert found == (None,)


def test_a_transaction_left_open_on_the_users_connection_is_refused(pg_dsn: str) -> None:
    """Joined to it, the ledger's writes would be a savepoint committed only when the user
    commits: a claim not durable before its tool runs. Refused with a typed error."""
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with psycopg.connect(pg_dsn, autocommit=False) as conn, PostgresSaver(conn) as saver:
        saver.setup()
        conn.execute("SELECT 1")  # the user's own transaction, left open
        with pytest.raises(ConfigError, match="transaction of yours open"):
            asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        conn.commit()
        [claim] = asyncio.run(saver.aclaim([intent], owner="a", lease_seconds=60))
        assert claim.claimed


def test_a_ledger_call_cancelled_mid_statement_is_waited_for(pg_dsn: str) -> None:
    """The claim's statement waits on a lock another session holds for a second; the caller
    gives up after 0.3 s, but its cancellation returns only once the statement has ended
    (the caller never moves on while the call may still write), and the saver goes on."""
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=2) as pool,
        PostgresSaver(pool) as saver,
        psycopg.connect(pg_dsn) as blocker,
    ):
        saver.setup()
        blocker.execute("LOCK TABLE idem_tool_calls IN ACCESS EXCLUSIVE MODE")
        release = threading.Timer(1.0, blocker.rollback)
        release.start()
        started = time.monotonic()
        # on the saver's loop, as the engine runs there for a sync front door (a caller on
        # another loop stops waiting at once: the hop between loops does not wait)
        claiming = saver.saver.aclaim([intent], owner="a", lease_seconds=60)
        with pytest.raises(asyncio.TimeoutError):
            saver._call(asyncio.wait_for(claiming, 0.3))
        waited = time.monotonic() - started
        release.join()
        assert waited >= 0.9, f"returned after {waited:.2f} s, before the statement ended"
        # the claim's one statement ran (autocommit): as a cancellation landing just after it
        read = "SELECT owner FROM idem_tool_calls WHERE scope = %s AND key = %s"
        assert blocker.execute(read, (intent.scope, intent.key)).fetchall() == [("a",)]
        blocker.rollback()
        # its caller never learned it: undone before the saver's next statement, nothing
        # ran under it (tests/test_claim_answer_cancelled.py)
        assert asyncio.run(saver.aget_entry(intent.scope, intent.key)) is None
        other = intent_for("t", {"name": "charge", "args": {"n": 2}, "id": "c2"})
        [claim] = asyncio.run(saver.aclaim([other], owner="b", lease_seconds=60))
        assert claim.claimed


def test_a_statement_body_that_suspends_is_refused() -> None:
    """The borrowed cursor's methods return at once, so a body is driven without a loop;
    one awaiting anything else (a bug) is refused, not run half-way on the loop."""
    from langgraph_idem_saver.postgres.borrowed import drive

    async def returns() -> int:
        return 3

    async def suspends() -> None:
        await asyncio.sleep(0)

    assert drive(returns()) == 3
    with pytest.raises(RuntimeError, match="awaited something other than its cursor"):
        drive(suspends())
