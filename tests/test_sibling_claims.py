"""A ``create_agent`` message's sibling calls: each claimed in ONE statement on Postgres.

``create_agent`` sends each call of a message through ``IdempotencyMiddleware`` on its own.
The first call's claim reads what adoption looks at (its signature, its fork slot) and
inserts its row; a sibling's read then finds that row at the same fork slot. Such a row -
under the key of another call of this very message, adopted by nobody - is a call of the
state, which adoption never takes (``adoption._maybe_orphan``): it is passed as
``StepLookup.inert`` and does not hold the claim back, so the sibling's claim is one
statement instead of a read and then a claim. Anything else found (an orphan, an adopted
row) still stops the claim for adoption to decide first.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from tool_node_helpers import Counter, cfg, scripted_model

from langgraph_idem_saver import CallStatus
from langgraph_idem_saver.engine import adoption
from langgraph_idem_saver.engine.types import Batch
from langgraph_idem_saver.keys import tool_call_keys
from langgraph_idem_saver.ledger import CallIntent, StepLookup
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.postgres import AsyncPostgresSaver
from langgraph_idem_saver.postgres import ledger_sql as sql


@pytest.fixture
async def saver(pg_dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as s:
        await s.setup()
        yield s


@contextmanager
def claim_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """The claim statements any async psycopg cursor sends inside the block, by kind."""
    seen = {"with_lookup": 0, "plain": 0}
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if query == sql.CLAIM_STEP_UNLESS_FOUND:
            seen["with_lookup"] += 1
        elif query == sql.CLAIM_STEP:
            seen["plain"] += 1
        return await original(self, query, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", execute)
        yield seen


def four_calls(effects: Counter) -> tuple[Any, list[AIMessage]]:
    @tool
    async def send(to: str) -> str:
        """Send a message."""
        effects.bump(to)
        return f"sent to {to}"

    calls = [
        {"name": "send", "args": {"to": f"u{i}"}, "id": f"call_{i}", "type": "tool_call"}
        for i in range(4)
    ]
    return send, [AIMessage("", id="ai-sends", tool_calls=calls), AIMessage("done", id="ai-done")]


async def run_turn(saver: AsyncPostgresSaver, thread: str) -> Counter:
    effects = Counter()
    send, script = four_calls(effects)
    agent = create_agent(
        scripted_model(*script),
        tools=[send],
        middleware=[IdempotencyMiddleware(record_model=False)],
        checkpointer=saver,
    )
    out = await agent.ainvoke({"messages": [("user", "go")]}, cfg(thread))
    assert out["messages"][-1].content == "done"
    return effects


async def test_each_call_of_a_four_call_message_is_one_claim_statement(
    saver: AsyncPostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Four claim statements for four calls, none sent again; with the siblings' keys
    withheld (the control: the claim as it was), the three siblings each take a second,
    plain claim after their read found the first call's row - seven in all."""
    with claim_statements(monkeypatch) as seen:
        effects = await run_turn(saver, "fast")
    assert seen == {"with_lookup": 4, "plain": 0}
    assert sorted(effects.calls) == ["u0", "u1", "u2", "u3"]  # each run once
    entries = await saver.alist_entries("fast")
    assert len(entries) == 4 and {e.status for e in entries} == {CallStatus.COMPLETED}

    with monkeypatch.context() as patch, claim_statements(monkeypatch) as seen:
        patch.setattr(adoption, "sibling_keys", lambda *args: frozenset())
        effects = await run_turn(saver, "control")
    assert seen == {"with_lookup": 4, "plain": 3}  # the first to claim found nothing
    assert sorted(effects.calls) == ["u0", "u1", "u2", "u3"]  # each run once


def planted(i: int, *, key: str, digest: str = "h") -> CallIntent:
    return CallIntent(
        scope="t", key=key, thread_id="t", agent_path="tools", tool_name="send",
        args_hash=f"{digest}{i}", args=b"{}", tool_call_id=f"c{i}", position="p",
        branch="b", occurrence=i,
    )  # fmt: skip


async def test_only_inert_rows_found_do_not_hold_the_claim_back(saver: AsyncPostgresSaver) -> None:
    """Found alone, rows under inert keys adopted by nobody let the claim through in the
    same statement (no candidates returned); an inert key's row that was adopted, or any
    row not inert beside them, stops it: nothing written, everything found returned."""
    await saver.aclaim([planted(0, key="sib0")], owner="me", lease_seconds=9)
    spot = [("p", "send")]
    lookup = StepLookup("t", "tools", [("send", "h1")], spot, frozenset({"sib0"}))
    step = await saver.aclaim_step([planted(1, key="k1")], lookup, owner="me", lease_seconds=9)
    assert step.claimed is not None and [c.claimed for c in step.claimed] == [True]
    assert not step.candidates.any()

    # the same row found without it being inert: adoption looks first, nothing claimed
    plain = StepLookup("t", "tools", [("send", "h2")], spot)
    step = await saver.aclaim_step([planted(2, key="k2")], plain, owner="me", lease_seconds=9)
    assert step.claimed is None
    assert [e.key for e in step.candidates.at_position["p", "send"]] == ["sib0", "k1"]

    # an inert key's row adopted by a call: adoption's to look at
    assert await saver.aadopt("t", "sib0", tool_call_id="c7", previous=None) is not None
    lookup = StepLookup("t", "tools", [("send", "h3")], spot, frozenset({"sib0", "k1"}))
    step = await saver.aclaim_step([planted(3, key="k3")], lookup, owner="me", lease_seconds=9)
    assert step.claimed is None
    assert [e.key for e in step.candidates.at_position["p", "send"]] == ["sib0", "k1"]

    # an inert row beside one that is not: adoption's to look at, all of it returned
    lookup = StepLookup("t", "tools", [("send", "h4")], spot, frozenset({"k1"}))
    step = await saver.aclaim_step([planted(4, key="k4")], lookup, owner="me", lease_seconds=9)
    assert step.claimed is None
    assert sorted(e.key for e in await saver.alist_entries("t")) == ["k1", "sib0"]


def test_sibling_keys_are_the_other_calls_of_the_message_never_the_calls_own() -> None:
    """The inert keys of a call: every key the other calls of its message may be recorded
    under; not its own keys, not calls of other messages, not an id found in several
    messages (which message it means is adoption's to decide)."""
    batch = Batch(sync=False)
    pairs = [("a0", "m-old"), ("c0", "m1"), ("c1", "m1"), ("c2", "m1"), ("a0", "m1")]
    batch.known_ids = {c for c, _ in pairs}
    batch.pairs = pairs
    for call_id, message_id in pairs:
        if batch.origins.setdefault(call_id, message_id) != message_id:
            batch.reused_ids.add(call_id)
            batch.origins[call_id] = message_id
    keys = adoption.sibling_keys(batch, {"c0"}, "tools")
    assert keys == tool_call_keys("tools", "c1", "m1") | tool_call_keys("tools", "c2", "m1")
    assert not keys & tool_call_keys("tools", "c0", "m1")
    assert adoption.sibling_keys(batch, {"c0", "c1"}, "tools") == tool_call_keys(
        "tools", "c2", "m1"
    )
    assert adoption.sibling_keys(batch, {"unknown"}, "tools") == frozenset()
