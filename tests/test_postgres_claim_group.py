"""Claims submitted together share one transaction on PostgreSQL (``postgres/claim_group.py``):
the parallel calls ``IdempotencyMiddleware`` claims one at a time commit together, each
claim answered as it would be alone (a repeated key finds the claim before it), and a
claim that fails fails alone. Transactions are told apart by the rows' ``xmin`` (the id
of the transaction that inserted them)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from langgraph_idem_saver.errors import IdemSaverError
from langgraph_idem_saver.ledger import CallIntent
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.postgres import AsyncPostgresSaver


@pytest.fixture
async def saver(pg_dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as s:
        await s.setup()
        yield s


def intent(key: str, *, thread: str = "t", call_id: str | None = None) -> CallIntent:
    return CallIntent(
        scope=thread, key=key, thread_id=thread, agent_path="tools", tool_name="send",
        args_hash=f"h-{key}", args=b"{}", tool_call_id=call_id or f"c-{key}",
    )  # fmt: skip


def transactions_of(dsn: str, thread: str) -> dict[str, str]:
    """key -> the id of the transaction that inserted the thread's row."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT key, xmin::text FROM idem_tool_calls WHERE thread_id = %s", (thread,)
        ).fetchall()
    return {key: xid for key, xid in rows}


async def test_claims_made_at_once_commit_in_one_transaction(
    saver: AsyncPostgresSaver, pg_dsn: str
) -> None:
    claims = [saver.aclaim([intent(f"k{i}")], owner="me", lease_seconds=60) for i in range(4)]
    outcomes = await asyncio.gather(*claims)
    assert all(o.claimed for [o] in outcomes)
    assert [o.entry.key for [o] in outcomes] == ["k0", "k1", "k2", "k3"]
    assert len(set(transactions_of(pg_dsn, "t").values())) == 1
    # a claim alone still commits by itself: the next one is another transaction
    [alone] = await saver.aclaim([intent("k4")], owner="me", lease_seconds=60)
    assert alone.claimed
    assert len(set(transactions_of(pg_dsn, "t").values())) == 2


async def test_a_key_claimed_twice_in_one_transaction_is_claimed_once(
    saver: AsyncPostgresSaver,
) -> None:
    """Each claim sees the claims before it, as one statement later on its own would: the
    second claim of a key gets the first's entry, not a second row."""
    first, second = await asyncio.gather(
        saver.aclaim([intent("k", call_id="first")], owner="a", lease_seconds=60),
        saver.aclaim([intent("k", call_id="second")], owner="b", lease_seconds=60),
    )
    assert first[0].claimed and not second[0].claimed
    assert second[0].entry.owner == "a" and second[0].entry.tool_call_id == "first"
    assert [e.owner for e in await saver.alist_entries("t")] == ["a"]


async def test_a_failing_claim_fails_alone(saver: AsyncPostgresSaver) -> None:
    """A claim PostgreSQL refuses (text with a NUL) rolls the shared transaction back;
    the batch is sent again claim by claim: the others are claimed, it gets its typed
    error and claims nothing."""
    good, bad, other = await asyncio.gather(
        saver.aclaim([intent("k1")], owner="me", lease_seconds=60),
        saver.aclaim([intent("k2", call_id="bad\x00id")], owner="me", lease_seconds=60),
        saver.aclaim([intent("k3")], owner="me", lease_seconds=60),
        return_exceptions=True,
    )
    assert isinstance(bad, IdemSaverError), bad
    assert not isinstance(good, BaseException) and good[0].claimed
    assert not isinstance(other, BaseException) and other[0].claimed
    assert sorted(e.key for e in await saver.alist_entries("t")) == ["k1", "k3"]


@tool
async def noop(n: int) -> str:
    """Does nothing."""
    return f"ok {n}"


class FourCalls(GenericFakeChatModel):
    """Asks for four parallel calls of ``noop``, then answers."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> FourCalls:
        return self

    def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            return ChatResult(generations=[ChatGeneration(message=AIMessage("done"))])
        turn = uuid.uuid4().hex[:8]
        calls = [
            {"name": "noop", "args": {"n": i}, "id": f"c{turn}{i}", "type": "tool_call"}
            for i in range(4)
        ]
        return ChatResult(generations=[ChatGeneration(message=AIMessage("", tool_calls=calls))])


async def test_the_middlewares_parallel_calls_share_their_claims_commits(
    saver: AsyncPostgresSaver, pg_dsn: str
) -> None:
    """``create_agent`` runs a message's four calls in four tool tasks, each claimed by the
    middleware alone: the first claim inserts its row, the three others find it at their
    step's position (adoption's read) and claim again: the four rows in two transactions
    (three or four when each claim commits alone), each call still run once. Measured on
    the second turn: the first also prepares the saver's statements between the claims."""
    agent = create_agent(
        FourCalls(messages=iter([])),
        tools=[noop],
        middleware=[IdempotencyMiddleware(record_model=False)],
        checkpointer=saver,
    )
    await agent.ainvoke({"messages": [("user", "go")]}, {"configurable": {"thread_id": "warm"}})
    config: Any = {"configurable": {"thread_id": "agent"}}
    out = await agent.ainvoke({"messages": [("user", "go")]}, config)
    assert out["messages"][-1].content == "done"
    assert sorted(m.content for m in out["messages"] if isinstance(m, ToolMessage)) == [
        f"ok {i}" for i in range(4)
    ]
    rows = transactions_of(pg_dsn, "agent")
    assert len(rows) == 4
    assert len(set(rows.values())) <= 2, rows
