"""The PostgreSQL *server* crashes under a running agent; the application lives on.

A server of its own for this module (``pg_restart.CrashableServer``: ``fsync=on``,
``synchronous_commit=on``, as deployed), SIGKILLed - postmaster and backends - and
started again (crash recovery) while the client process keeps running:

* an outcome the process holds is never dropped: written once the server is back,
  before the node returns (retried on a fresh pooled or reopened connection), or held
  and written before the saver's next statement; the same process's retry replays the
  call at once - no ``ToolCallInProgress`` naming itself, no wait for the lease;
* a statement whose answer was lost in transit (``cutting_proxy``): a claim is undone
  before the next statement (no tool ran under it), an outcome is found recorded;
* the ledger agrees with the thread: the server killed right after the first outcome of
  a step is visible leaves no call ``issued`` (outcomes are synced at commit);
* a ``from_conn_string`` saver reopens its connection; one on the user's connection
  raises ``ConnectionClosedError`` and this process reads what it gave up as unknown at
  once;
* worker processes (``db_restart_worker.py``, pool and single connection) running
  ``create_agent`` + ``IdempotencyMiddleware`` with parallel calls through server kills
  at seeded moments: every effect once, every thread finished, nothing left ``issued``,
  no raw driver exception, nothing asked, recovery in seconds - and LangGraph's own
  stack under the same schedule shows what the harness catches.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
from cutting_proxy import CuttingProxy
from db_restart_harness import run_schedule
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pg_blocking import charge_intent
from pg_restart import CrashableServer
from pg_server import afresh_dsn, require_postgres
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from tool_node_helpers import ToolCallingFakeModel, ai_calls

from langgraph_idem_saver import AsyncPostgresSaver, CallStatus, ToolCallInProgress
from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.ledger import Outcome
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.owners import make_owner


@pytest.fixture(autouse=True)
def _postgres_required() -> None:
    """Skipped without a PostgreSQL, except in CI, where that fails (pg_server)."""
    require_postgres()


OWNER = "host:1:owner"


@pytest.fixture(scope="module")
def crashable() -> Iterator[CrashableServer]:
    server = CrashableServer()
    try:
        assert (server.setting("fsync"), server.setting("synchronous_commit")) == ("on", "on")
        yield server
    finally:
        server.cleanup()


@pytest.fixture
async def dsn(crashable: CrashableServer) -> str:
    return await afresh_dsn(crashable.uri)


@asynccontextmanager
async def saver_on(dsn: str, conn: str) -> AsyncIterator[AsyncPostgresSaver]:
    """Our saver on a pool (of 2) or on the connection ``from_conn_string`` owns."""
    if conn == "single":
        async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
            yield saver
        return
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    async with AsyncConnectionPool(dsn, min_size=2, max_size=2, kwargs=kwargs) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.setup()
        yield saver


async def record(saver: AsyncPostgresSaver, key: str, owner: str = OWNER) -> None:
    type_, data = saver.serde.dumps_typed("charged")
    await saver.record_outcome("t", key, owner=owner, outcome=Outcome.completed(type_, data))


async def kill(server: CrashableServer) -> None:
    await asyncio.to_thread(server.kill)


async def start(server: CrashableServer) -> float:
    return await asyncio.to_thread(server.start)


# ------------------------------------------------------------------ an outcome kept


@pytest.mark.parametrize("conn", ["pool", "single"])
async def test_an_outcome_is_written_once_the_server_is_back(
    crashable: CrashableServer, dsn: str, conn: str
) -> None:
    """The server dies before a finished call's outcome is written: the write waits for
    it (retried on a fresh connection) and returns once it is recorded, seconds after
    the server is back."""
    async with saver_on(dsn, conn) as saver:
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        await kill(crashable)
        writing = asyncio.create_task(record(saver, "k"))
        await asyncio.sleep(0.5)
        assert not writing.done()  # retrying, not failed
        back = await start(crashable)
        await asyncio.wait_for(writing, 30)
        recovered = time.time() - back
        entry = await saver.aget_entry("t", "k")
    assert entry is not None and entry.status is CallStatus.COMPLETED
    assert saver.serde.loads_typed((entry.result_type, entry.result)) == "charged"
    print(f"outcome recorded {recovered:.2f} s after the server was back ({conn})")
    assert recovered < 5


@pytest.mark.parametrize("conn", ["pool", "single"])
async def test_an_outcome_held_is_written_before_the_next_statement(
    crashable: CrashableServer, dsn: str, conn: str
) -> None:
    """The server stays down longer than the outcome's retries: the caller gets a typed
    error saying the outcome is kept, and the saver's next statement writes it first."""
    async with saver_on(dsn, conn) as saver:
        saver.outcome_retry_seconds = 0.3
        await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        await kill(crashable)
        with pytest.raises(ConnectionClosedError, match="kept by the saver"):
            await record(saver, "k")
        await start(crashable)
        entry = await asyncio.wait_for(saver.aget_entry("t", "k"), 30)  # a read, first
    assert entry is not None and entry.status is CallStatus.COMPLETED


class ChargingModel(ToolCallingFakeModel):
    """Asks for one charge, then answers."""

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        from langchain_core.outputs import ChatGeneration, ChatResult

        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            call = {"name": "charge", "args": {"invoice": "inv-1"}, "id": "call_1"}
            message = AIMessage("", id="ai-charge", tool_calls=[{**call, "type": "tool_call"}])
        else:
            message = AIMessage("charged", id="ai-done")
        return ChatResult(generations=[ChatGeneration(message=message)])


@pytest.mark.parametrize("conn", ["pool", "single"])
async def test_the_same_process_replays_its_call_after_the_restart(
    crashable: CrashableServer, dsn: str, conn: str
) -> None:
    """The server dies while the tool runs and stays down past the outcome's retries:
    ``ainvoke`` raises a typed error; once the server is back, the same process's retry
    replays the call at once - the effect stays single, no ``ToolCallInProgress``
    naming this process, no wait of ``wait_seconds`` or ``lease_seconds``."""
    effects: list[str] = []
    running, release = asyncio.Event(), asyncio.Event()

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        running.set()
        await release.wait()
        effects.append(invoice)
        return f"charged {invoice}"

    middleware = IdempotencyMiddleware(wait_seconds=30, lease_seconds=300)
    config: Any = {"configurable": {"thread_id": "replayed"}}
    async with saver_on(dsn, conn) as saver:
        saver.outcome_retry_seconds = 0.3
        model = ChargingModel(messages=iter([]))
        agent = create_agent(model, tools=[charge], middleware=[middleware], checkpointer=saver)
        run = asyncio.create_task(agent.ainvoke({"messages": [("user", "pay")]}, config))
        await asyncio.wait_for(running.wait(), 30)
        await kill(crashable)
        release.set()
        with pytest.raises(ConnectionClosedError):
            await asyncio.wait_for(run, 60)
        back = await start(crashable)
        try:
            out = await asyncio.wait_for(agent.ainvoke(None, config), 30)
        except ToolCallInProgress as exc:  # pragma: no cover - the failure this test names
            pytest.fail(f"the process waited on its own call: {exc}")
        took = time.time() - back
        entries = await saver.alist_entries("replayed")
    assert effects == ["inv-1"]
    assert out["messages"][-1].content == "charged"
    assert [e.status for e in entries if e.tool_name == "charge"] == [CallStatus.COMPLETED]
    assert middleware.counters.as_dict()["replayed"] == 1
    print(f"the retry finished {took:.2f} s after the server was back ({conn})")
    assert took < 5


async def test_a_user_connection_keeps_the_typed_error_and_gives_up_at_once(
    crashable: CrashableServer, dsn: str
) -> None:
    """A saver on the user's connection cannot reopen it: after a restart its calls raise
    ConnectionClosedError, an outcome it cannot write is given up, and this process then
    reads that call as an unknown outcome at once (no wait for the lease)."""
    owner = make_owner()  # this process's, as the engine's are
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.aclaim([charge_intent("k")], owner=owner, lease_seconds=300)
        await kill(crashable)
        with pytest.raises(ConnectionClosedError, match="cannot reconnect"):
            await record(saver, "k", owner)
        await start(crashable)
        with pytest.raises(ConnectionClosedError):
            await saver.aget_entry("t", "k")
    async with AsyncPostgresSaver.from_conn_string(dsn) as fresh:
        entry = await fresh.aget_entry("t", "k")
    assert entry is not None and entry.status is CallStatus.ISSUED
    assert entry.lease_expires_at > time.time() + 200  # its lease runs on, in the database
    assert entry.is_unknown()  # but this process gave it up: unknown at once, here


@pytest.mark.parametrize("pipeline", [False, True], ids=["plain", "pipeline"])
async def test_from_conn_string_reopens_its_connection(
    crashable: CrashableServer, dsn: str, pipeline: bool
) -> None:
    """The connection ``from_conn_string`` owns is replaced after a restart (in pipeline
    mode too): a read is run again on the new one, and writes work without a new saver."""
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    def cfg(thread: str) -> Any:
        return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    async with AsyncPostgresSaver.from_conn_string(dsn, pipeline=pipeline) as saver:
        stored = await saver.aput(cfg("a"), generate_checkpoint(), {"step": 1}, {})
        first = saver.conn
        await kill(crashable)
        await start(crashable)
        found = await saver.aget_tuple(cfg("a"))
        assert found is not None and found.config == stored
        assert saver.conn is not first and not saver.conn.closed
        assert (saver.pipe is not None) is pipeline
        after = await saver.aput(cfg("b"), generate_checkpoint(), {"step": 1}, {})
        assert await saver.aget_tuple(after) is not None


# ------------------------------------------------------------- an answer lost in transit


@asynccontextmanager
async def through_proxy(crashable: CrashableServer) -> AsyncIterator[CuttingProxy]:
    proxy = CuttingProxy(crashable.socket_dir)
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.close()


def saver_through(proxy: CuttingProxy, dsn: str) -> Any:
    return AsyncPostgresSaver.from_conn_string(proxy.dsn(dsn))


async def test_a_claim_whose_answer_was_lost_is_undone(
    crashable: CrashableServer, dsn: str
) -> None:
    """The claim committed, its answer never arrived: the caller got a typed error and no
    tool ran. The saver undoes that claim before its next statement, so the same call is
    claimed again at once (not a live claim of this process's for ``lease_seconds``)."""
    async with through_proxy(crashable) as proxy, saver_through(proxy, dsn) as saver:
        await saver.aclaim([charge_intent("warm")], owner=OWNER, lease_seconds=300)  # prepared
        proxy.cut_next_answer()
        with pytest.raises(ConnectionClosedError):
            await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
        assert proxy.cuts == 1
        async with await psycopg.AsyncConnection.connect(dsn) as other:
            cur = await other.execute("SELECT status FROM idem_tool_calls WHERE key = 'k'")
            assert await cur.fetchall() == [("issued",)]  # it did commit
        assert await saver.aget_entry("t", "k") is None  # undone first
        [again] = await saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300)
    assert again.claimed


async def test_an_outcome_whose_answer_was_lost_counts_as_recorded(
    crashable: CrashableServer, dsn: str
) -> None:
    """The outcome committed, its answer never arrived: the retry finds the entry
    recorded as this very outcome and returns normally."""
    async with through_proxy(crashable) as proxy, saver_through(proxy, dsn) as saver:
        intents = [charge_intent("warm"), charge_intent("k")]
        await saver.aclaim(intents, owner=OWNER, lease_seconds=300)
        await record(saver, "warm")  # the outcome's statement prepared
        proxy.cut_next_answer()
        await record(saver, "k")
        assert proxy.cuts == 1
        entry = await saver.aget_entry("t", "k")
    assert entry is not None and entry.status is CallStatus.COMPLETED


# ------------------------------------------------- the ledger agrees with the thread


@pytest.mark.parametrize("conn", ["pool", "single"])
async def test_killed_after_the_first_outcome_is_visible_nothing_stays_issued(
    crashable: CrashableServer, dsn: str, conn: str
) -> None:
    """Three parallel charges; the server is SIGKILLed as soon as the first outcome is
    visible to another session, and started again. The thread finishes (resumed after
    any error, as an application would), every charge ran once, and no call is left
    ``issued``: an outcome visible is an outcome kept (synced at commit), and the
    others are written when the server is back. The check sees ``issued`` rows: the
    claims are listed while the tools run."""
    effects: list[str] = []
    delays = {"inv-0": 0.3, "inv-1": 0.9, "inv-2": 1.5}  # every claim in before an outcome

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        await asyncio.sleep(delays[invoice])
        effects.append(invoice)
        return f"charged {invoice}"

    class ThreeCharges(ToolCallingFakeModel):
        def _generate(
            self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
        ) -> Any:
            from langchain_core.outputs import ChatGeneration, ChatResult

            if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
                calls = [("charge", {"invoice": i}, f"c{n}") for n, i in enumerate(delays)]
                message = ai_calls(*calls, msg_id="ai-charges")
            else:
                message = AIMessage("all charged", id="ai-done")
            return ChatResult(generations=[ChatGeneration(message=message)])

    async def statuses() -> list[str]:
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as watch:
            cur = await watch.execute(
                "SELECT status FROM idem_tool_calls WHERE tool_name = 'charge'"
            )
            return [r[0] for r in await cur.fetchall()]

    config: Any = {"configurable": {"thread_id": f"first-visible-{conn}"}}
    async with saver_on(dsn, conn) as saver:
        agent = create_agent(
            ThreeCharges(messages=iter([])),
            tools=[charge],
            middleware=[IdempotencyMiddleware()],
            checkpointer=saver,
        )
        run = asyncio.create_task(agent.ainvoke({"messages": [("user", "pay")]}, config))
        seen_issued = False
        for _ in range(3000):
            now = await statuses()
            seen_issued = seen_issued or "issued" in now
            if "completed" in now:
                break
            await asyncio.sleep(0.005)
        await kill(crashable)
        await start(crashable)
        assert seen_issued
        for _ in range(20):  # resume after any error until the thread is finished
            with contextlib.suppress(ConnectionClosedError):
                await asyncio.wait_for(run, 60)
            state = await agent.aget_state(config)
            if not state.next and state.values["messages"][-1].content == "all charged":
                break
            run = asyncio.create_task(agent.ainvoke(None, config))
        entries = await saver.alist_entries(config["configurable"]["thread_id"])
    assert sorted(effects) == sorted(delays)
    assert [e.status for e in entries if e.tool_name == "charge"] == [CallStatus.COMPLETED] * 3
    assert "issued" not in await statuses()


# ---------------------------------------------------- worker processes, server killed


@pytest.fixture
def worker_dsns(crashable: CrashableServer) -> Iterator[tuple[str, str]]:
    """A schema for our stack and one for LangGraph's, on the crashable server."""
    from pg_server import fresh_dsn

    yield fresh_dsn(crashable.uri), fresh_dsn(crashable.uri)


def test_workers_live_through_server_kills(
    crashable: CrashableServer, worker_dsns: tuple[str, str]
) -> None:
    """Two worker processes (a pool, a ``from_conn_string`` connection), three threads at
    a time each, three parallel charges a thread, the server SIGKILLed twice at seeded
    moments (new threads start until two seconds after the last restart).
    Ours: every effect once, every thread finished, no call left ``issued``, no raw
    driver exception, no result the process had turned unknown (``verify`` never finds
    the effect it is asked about: only calls cancelled mid-run are asked), and threads
    finishing again within seconds of the restart. LangGraph's stack under the same
    schedule (the control): charges run twice or driver exceptions reach the
    application - the harness sees them."""
    ours_dsn, stock_dsn = worker_dsns
    ours = run_schedule(crashable, {"pool": ours_dsn, "single": ours_dsn}, stack="ours", seed=7)
    print(
        f"ours: {len(ours.restarts)} kills, errors {dict(ours.errors())}, calls cancelled "
        f"mid-run and verified not applied {len(ours.asked())}, "
        f"recovery after restart {[round(r, 2) for r in ours.recovery_seconds()]} s"
    )
    assert ours.returncodes == [0, 0], ours.stderr
    assert len(ours.restarts) == 2
    assert ours.duplicates() == {} and ours.missing() == [], ours.story()
    assert ours.finished() == ours.started() and len(ours.started()) >= 8, ours.story()
    assert ours.raw_driver_errors() == {}
    assert set(ours.errors()) <= {"langgraph_idem_saver.errors.ConnectionClosedError"}
    assert ours.asked_about_done() == []
    assert len(ours.recovery_seconds()) == 2 and max(ours.recovery_seconds()) < 8

    async def left_issued() -> int:
        async with AsyncPostgresSaver.from_conn_string(ours_dsn) as saver:
            return len(await saver.alist_issued())

    assert asyncio.run(left_issued()) == 0

    async def langgraph_tables() -> None:  # once, before its workers start
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as LangGraphSaver

        async with LangGraphSaver.from_conn_string(stock_dsn) as saver:
            await saver.setup()

    asyncio.run(langgraph_tables())
    stock = run_schedule(crashable, {"pool": stock_dsn, "single": stock_dsn}, stack="stock", seed=7)
    print(
        f"LangGraph's stack: duplicates {stock.duplicates()}, raw driver exceptions "
        f"{dict(stock.raw_driver_errors())}"
    )
    assert len(stock.restarts) == 2
    assert stock.duplicates() or stock.raw_driver_errors()
