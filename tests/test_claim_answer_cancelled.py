"""A claim that commits while its caller is being cancelled, on PostgreSQL.

LangGraph cancels a step's other tasks when one raises (a lost connection, for one). A
task cancelled while its claim statement is in flight: psycopg cancels the statement on
the server, but one that had already committed - its answer in transit - is a claim its
caller never learned of. No tool runs under it; left alone, it is a live claim of this
very process for ``lease_seconds`` (300 by default): the user's own retry waits
``wait_seconds`` on it and raises ``ToolCallInProgress``, again and again. The saver holds
it as it holds a claim whose answer a lost connection took (``held_writes``): undone
before its next statement (a re-claim: its row kept, its lease ended - asked at once).

:class:`HoldingProxy` makes that moment happen on cue: it holds the server's answer to
one request until the test has cancelled the caller, with the row already committed.
Each test runs a control with the hold disabled, which shows the failure it guards.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pg_blocking import charge_intent
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from tool_node_helpers import Counter, ai_calls, cfg, scripted_model

from langgraph_idem_saver import AsyncPostgresSaver, CallStatus, ToolCallInProgress
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.postgres.held_writes import PostgresHeldWrites

OWNER = "host:1:owner"  # another machine's owner: never read as dead here


class HoldingProxy:
    """A TCP proxy to a PostgreSQL server that holds back the answer to one request.

    :meth:`hold_answer_to` arms it: the answer to the next request whose bytes contain
    every marker is held (``held`` is set once it arrived) until :meth:`release`.
    Everything else, psycopg's cancel requests included, passes through as it is."""

    def __init__(self, dsn: str) -> None:
        params = conninfo_to_dict(dsn)
        self.base = dsn
        self.host = str(params.get("host") or "/tmp")
        self.port = int(params.get("port") or 5432)
        self.listen_port = 0
        self.held = asyncio.Event()
        self._markers: tuple[bytes, ...] | None = None
        self._release = asyncio.Event()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def dsn(self) -> str:
        return make_conninfo(self.base, host="127.0.0.1", port=str(self.listen_port))

    def hold_answer_to(self, *markers: bytes) -> None:
        self._markers = markers

    def release(self) -> None:
        self._release.set()

    async def __aenter__(self) -> HoldingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.listen_port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release()
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(Exception):
            await self._server.wait_closed()

    async def _upstream(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.host.startswith("/"):
            path = Path(self.host) / f".s.PGSQL.{self.port}"
            return await asyncio.open_unix_connection(str(path))
        return await asyncio.open_connection(self.host, self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await self._upstream()
        except OSError:
            writer.close()
            self._tasks.discard(task)
            return
        holding = asyncio.Event()  # this connection's next answer is held

        async def upstream() -> None:
            while data := await reader.read(65536):
                markers = self._markers
                if markers is not None and all(m in data for m in markers):
                    self._markers = None
                    holding.set()
                up_writer.write(data)
                await up_writer.drain()

        async def downstream() -> None:
            while data := await up_reader.read(65536):
                if holding.is_set():
                    holding.clear()
                    self.held.set()
                    await self._release.wait()
                writer.write(data)
                await writer.drain()

        pumps = [asyncio.ensure_future(upstream()), asyncio.ensure_future(downstream())]
        try:
            with contextlib.suppress(Exception):
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            for w in (writer, up_writer):
                w.close()
            self._tasks.discard(task)


@pytest.fixture
async def proxy(pg_dsn: str) -> AsyncIterator[HoldingProxy]:
    async with HoldingProxy(pg_dsn) as p:
        yield p


def without_the_hold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a statement cut short by a cancellation holds nothing (a lost
    connection still does), as the saver did before."""
    hold_claims, hold_lost = PostgresHeldWrites._hold_claims_lost, PostgresHeldWrites._hold_lost

    def claims_unless_cut(self: Any, claims: Any, *, lost: bool = True) -> None:
        if lost:
            hold_claims(self, claims)

    def unless_cut(self: Any, query: str, params: Any, *, lost: bool = True) -> None:
        if lost:
            hold_lost(self, query, params)

    monkeypatch.setattr(PostgresHeldWrites, "_hold_claims_lost", claims_unless_cut)
    monkeypatch.setattr(PostgresHeldWrites, "_hold_lost", unless_cut)


async def until_committed(dsn: str, query: str, params: tuple[Any, ...]) -> None:
    """Wait until ``query`` finds a row, read on a connection of its own."""
    deadline = time.monotonic() + 30
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        while (await (await conn.execute(query, params)).fetchone()) is None:
            assert time.monotonic() < deadline, f"never committed: {query} {params}"
            await asyncio.sleep(0.02)


async def cancelled_as_it_commits(
    proxy: HoldingProxy, dsn: str, work: Any, committed: str, params: tuple[Any, ...]
) -> None:
    """Run ``work``; once the answer to its statement is held and ``committed`` finds
    its row, cancel it, then let the answer through: the caller gets CancelledError."""
    task = asyncio.ensure_future(work)
    try:
        await asyncio.wait_for(proxy.held.wait(), 30)
        await until_committed(dsn, committed, params)
        task.cancel()
        await asyncio.sleep(0.2)  # psycopg's cancel request reaches the idle backend
    finally:
        proxy.release()
    with pytest.raises(asyncio.CancelledError):
        await task


HOLD = pytest.mark.parametrize("hold", [True, False], ids=["held", "control"])


@HOLD
async def test_a_claim_committed_as_its_caller_was_cancelled_is_undone(
    proxy: HoldingProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, hold: bool
) -> None:
    """The claim committed, its caller was cancelled before it learned so: undone before
    the saver's next statement, so the same call is claimed again at once. The control
    (nothing held) leaves a live claim of a call nobody runs for the whole lease."""
    if not hold:
        without_the_hold(monkeypatch)
    async with AsyncPostgresSaver.from_conn_string(proxy.dsn) as saver:
        await saver.setup()
        proxy.hold_answer_to(b"k-cut")
        claim = saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
        found = "SELECT 1 FROM idem_tool_calls WHERE key = %s"
        await cancelled_as_it_commits(proxy, pg_dsn, claim, found, ("k-cut",))
        entry = await saver.aget_entry("t", "k-cut")
        if not hold:
            assert entry is not None and entry.status is CallStatus.ISSUED
            assert not entry.is_unknown()  # live: a retry would wait on it
            return
        assert entry is None  # undone first
        [again] = await saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
    assert again.claimed


@HOLD
async def test_a_reclaim_committed_as_its_caller_was_cancelled_is_asked_at_once(
    proxy: HoldingProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, hold: bool
) -> None:
    """A re-claim of an unknown outcome (``verify`` said it did not happen) committed,
    its caller cancelled: the row stays (an earlier attempt may have happened), its
    lease ended before the next statement - unknown at once, asked again, never a live
    claim nobody runs (the control)."""
    if not hold:
        without_the_hold(monkeypatch)
    async with AsyncPostgresSaver.from_conn_string(proxy.dsn) as saver:
        await saver.setup()
        await saver.aclaim([charge_intent("k-again")], owner=OWNER, lease_seconds=0.05)
        await asyncio.sleep(0.1)
        entry = await saver.aget_entry("t", "k-again")
        assert entry is not None and entry.is_unknown()
        proxy.hold_answer_to(b"k-again")
        reclaim = saver.areclaim(entry, owner="host:2:other", lease_seconds=300)
        found = "SELECT 1 FROM idem_tool_calls WHERE key = %s AND attempts = 2"
        await cancelled_as_it_commits(proxy, pg_dsn, reclaim, found, ("k-again",))
        after = await saver.aget_entry("t", "k-again")
    assert after is not None and after.status is CallStatus.ISSUED and after.attempts == 2
    if not hold:
        assert not after.is_unknown()  # live for 300 s: a retry would wait on it
        return
    assert after.is_unknown() and "re-claim" in (after.error or "")


@HOLD
async def test_an_agent_cancelled_as_its_claim_commits_runs_the_call_on_retry(
    proxy: HoldingProxy, pg_dsn: str, monkeypatch: pytest.MonkeyPatch, hold: bool
) -> None:
    """``create_agent`` + ``IdempotencyMiddleware``: the run is cancelled while its tool
    call's claim commits. The user's retry in the same process runs the call, once, and
    finishes; the control raises ``ToolCallInProgress`` (this process's own claim, live,
    that nobody runs) and the effect never happens."""
    if not hold:
        without_the_hold(monkeypatch)
    effects = Counter()

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.bump(invoice)
        return f"charged {invoice}"

    calls = ai_calls(("charge", {"invoice": "inv-1"}, "call_held"))
    script = [calls, AIMessage("done", id="ai-done")]
    async with AsyncPostgresSaver.from_conn_string(proxy.dsn) as saver:
        await saver.setup()
        agent = create_agent(
            scripted_model(*script),
            tools=[charge],
            middleware=[IdempotencyMiddleware(record_model=False, wait_seconds=1)],
            checkpointer=saver,
        )
        proxy.hold_answer_to(b"tool_call_id", b"call_held")  # the claim's rows
        run = agent.ainvoke({"messages": [("user", "go")]}, cfg("t"), durability="sync")
        found = "SELECT 1 FROM idem_tool_calls WHERE tool_call_id = %s"
        await cancelled_as_it_commits(proxy, pg_dsn, run, found, ("call_held",))
        assert effects.calls == []  # cancelled before its tool ran
        if not hold:
            with pytest.raises(ToolCallInProgress):
                await agent.ainvoke(None, cfg("t"))
            assert effects.calls == []
            return
        out = await agent.ainvoke(None, cfg("t"))
    assert out["messages"][-1].content == "done"
    assert effects.calls == ["inv-1"]
