"""A claim that commits while its caller is being cancelled, on SQLite.

LangGraph cancels a step's other tasks when one raises. On SQLite every write goes
through the saver's group commit (``group_commit.py``): a claim submitted before its
caller is cancelled - still queued, or in the transaction being committed - is committed
all the same, and its caller never learns it: no tool runs under it. Left alone it is a
live claim of this very process for ``lease_seconds`` (300 by default): the user's own
retry waits ``wait_seconds`` on it and raises ``ToolCallInProgress``, again and again.
The saver undoes it after its commit (``sqlite/cut_short.py``): a claim's rows deleted, a
re-claim's lease ended (its row kept - asked at once).

:class:`CommitHold` makes that moment happen on cue, in a real SQLite file: a TEMP
trigger on the saver's own connection calls a function that holds the worker thread
inside the claim's transaction (the row inserted, not yet committed) until the test has
cancelled the caller. Each test runs a control with the undo disabled, which shows the
failure it guards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from pg_blocking import charge_intent
from tool_node_helpers import Counter, ai_calls, cfg, scripted_model

from langgraph_idem_saver import AsyncSqliteSaver, CallStatus, ToolCallInProgress
from langgraph_idem_saver.ledger import Outcome
from langgraph_idem_saver.middleware import IdempotencyMiddleware
from langgraph_idem_saver.sqlite.ledger_store import SqliteLedgerStore

OWNER = "host:1:owner"  # another machine's owner: never read as dead here


class CommitHold:
    """Holds the saver's worker thread inside the transaction of one write to
    ``idem_tool_calls``: a TEMP trigger (``event`` ``WHEN`` ``condition``) calls ``hold()``,
    which the first time waits until :meth:`release` (``entered`` set meanwhile)."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self._gate = threading.Event()
        self._armed = True

    def _hold(self, _: Any) -> int:
        if self._armed:  # once: the undo, a retry, fire the trigger too
            self._armed = False
            self.entered.set()
            self._gate.wait(30)
        return 0

    async def arm(self, saver: AsyncSqliteSaver, event: str, condition: str) -> None:
        await saver.conn.create_function("idem_test_hold", 1, self._hold)
        await saver.conn.execute(
            f"CREATE TEMP TRIGGER idem_test_hold {event} ON main.idem_tool_calls "
            f"WHEN {condition} BEGIN SELECT idem_test_hold(NEW.key); END"
        )

    async def held(self) -> None:
        assert await asyncio.to_thread(self.entered.wait, 30), "the write never reached the hold"

    def release(self) -> None:
        self._gate.set()


@pytest.fixture
async def saver(tmp_path: Path) -> AsyncIterator[AsyncSqliteSaver]:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "db.sqlite")) as s:
        await s.setup()
        yield s


@pytest.fixture
def hold() -> Any:
    h = CommitHold()
    yield h
    h.release()  # never leave the worker thread waiting


def without_the_undo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a claim whose caller was cancelled is left as it committed, as the
    saver did before."""
    monkeypatch.setattr(SqliteLedgerStore, "_undo_cut_short", lambda self, body: None)


async def settled(saver: AsyncSqliteSaver) -> None:
    """Wait until every write submitted so far is committed: a write of the group commit
    (a release of a call that does not exist) commits after all of them."""
    assert not await saver.arelease("t", "no-such-call", owner=OWNER)


async def cancelled_in_commit(hold: CommitHold, work: Any) -> None:
    """Run ``work``; once its write is held inside its transaction, cancel it, then let
    the transaction commit: the caller gets CancelledError."""
    task = asyncio.ensure_future(work)
    try:
        await hold.held()
        task.cancel()
        await asyncio.sleep(0.05)
    finally:
        hold.release()
    with pytest.raises(asyncio.CancelledError):
        await task


UNDO = pytest.mark.parametrize("undo", [True, False], ids=["undone", "control"])


@UNDO
async def test_a_claim_committed_as_its_caller_was_cancelled_is_undone(
    saver: AsyncSqliteSaver, hold: CommitHold, monkeypatch: pytest.MonkeyPatch, undo: bool
) -> None:
    """The claim's transaction commits after its caller was cancelled: its row is
    deleted right after, so the same call is claimed again at once. The control leaves a
    live claim of a call nobody runs, for the whole lease."""
    if not undo:
        without_the_undo(monkeypatch)
    await hold.arm(saver, "AFTER INSERT", "NEW.key = 'k-cut'")
    claim = saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
    await cancelled_in_commit(hold, claim)
    await settled(saver)
    entry = await saver.aget_entry("t", "k-cut")
    [again] = await saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
    if not undo:
        assert entry is not None and entry.status is CallStatus.ISSUED
        assert entry.lease_expires_at > time.time() + 200 and not entry.is_unknown()
        assert not again.claimed  # a retry would wait on it, then give up
        return
    assert entry is None
    assert again.claimed


@UNDO
async def test_a_claim_queued_when_its_caller_was_cancelled_is_undone(
    saver: AsyncSqliteSaver, hold: CommitHold, monkeypatch: pytest.MonkeyPatch, undo: bool
) -> None:
    """The same for a claim still queued in the group commit (another write being
    committed) when its caller is cancelled: it is committed with its undo."""
    if not undo:
        without_the_undo(monkeypatch)
    await hold.arm(saver, "AFTER INSERT", "NEW.key = 'k-block'")
    blocker = asyncio.ensure_future(
        saver.aclaim([charge_intent("k-block")], owner=OWNER, lease_seconds=300)
    )
    try:
        await hold.held()
        task = asyncio.ensure_future(
            saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
        )
        deadline = time.monotonic() + 30
        while not saver._group._pending:  # the claim is queued behind the held write
            assert time.monotonic() < deadline, "the claim never reached the group commit"
            await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        hold.release()
    [blocked] = await blocker
    assert blocked.claimed  # the write it queued behind is untouched
    await settled(saver)
    entry = await saver.aget_entry("t", "k-cut")
    if not undo:
        assert entry is not None and entry.status is CallStatus.ISSUED
        assert not entry.is_unknown()  # live for 300 s: a retry would wait on it
        return
    assert entry is None
    kept = await saver.aget_entry("t", "k-block")
    assert kept is not None and kept.status is CallStatus.ISSUED and kept.owner == OWNER


@UNDO
async def test_a_reclaim_committed_as_its_caller_was_cancelled_is_asked_at_once(
    saver: AsyncSqliteSaver, hold: CommitHold, monkeypatch: pytest.MonkeyPatch, undo: bool
) -> None:
    """A re-claim of an unknown outcome committed, its caller cancelled: the row stays
    (an earlier attempt may have happened), its lease ended right after - unknown at
    once, asked again, never a live claim nobody runs (the control)."""
    if not undo:
        without_the_undo(monkeypatch)
    await saver.aclaim([charge_intent("k-again")], owner=OWNER, lease_seconds=0.05)
    await asyncio.sleep(0.1)
    entry = await saver.aget_entry("t", "k-again")
    assert entry is not None and entry.is_unknown()
    await hold.arm(saver, "AFTER UPDATE", "NEW.key = 'k-again' AND NEW.attempts = 2")
    reclaim = saver.areclaim(entry, owner="host:2:other", lease_seconds=300)
    await cancelled_in_commit(hold, reclaim)
    await settled(saver)
    after = await saver.aget_entry("t", "k-again")
    assert after is not None and after.status is CallStatus.ISSUED and after.attempts == 2
    assert after.owner == "host:2:other"
    if not undo:
        assert not after.is_unknown()  # live for 300 s: a retry would wait on it
        return
    assert after.is_unknown() and "re-claim" in (after.error or "")


@UNDO
async def test_an_agent_cancelled_as_its_claim_commits_runs_the_call_on_retry(
    saver: AsyncSqliteSaver, hold: CommitHold, monkeypatch: pytest.MonkeyPatch, undo: bool
) -> None:
    """``create_agent`` + ``IdempotencyMiddleware``: the run is cancelled while its tool
    call's claim commits. The user's retry in the same process runs the call, once, and
    finishes; the control raises ``ToolCallInProgress`` (this process's own claim, live,
    that nobody runs) and the effect never happens."""
    if not undo:
        without_the_undo(monkeypatch)
    effects = Counter()

    @tool
    async def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.bump(invoice)
        return f"charged {invoice}"

    calls = ai_calls(("charge", {"invoice": "inv-1"}, "call_held"))
    agent = create_agent(
        scripted_model(calls, AIMessage("done", id="ai-done")),
        tools=[charge],
        middleware=[IdempotencyMiddleware(record_model=False, wait_seconds=1)],
        checkpointer=saver,
    )
    await hold.arm(saver, "AFTER INSERT", "NEW.tool_call_id = 'call_held'")
    run = agent.ainvoke({"messages": [("user", "go")]}, cfg("t"), durability="sync")
    await cancelled_in_commit(hold, run)
    assert effects.calls == []  # cancelled before its tool ran
    if not undo:
        with pytest.raises(ToolCallInProgress):
            await agent.ainvoke(None, cfg("t"))
        assert effects.calls == []
        return
    out = await agent.ainvoke(None, cfg("t"))
    assert out["messages"][-1].content == "done"
    assert effects.calls == ["inv-1"]


async def test_the_undo_touches_no_other_claim_of_the_call(
    saver: AsyncSqliteSaver, hold: CommitHold
) -> None:
    """A cancelled claim of two calls, one of them already claimed by the same owner
    (an earlier claim, its own ``issued_at``): the undo deletes only the row this claim
    inserted; the earlier claim, refused to this one, stays as it was."""
    [first] = await saver.aclaim([charge_intent("k-held")], owner=OWNER, lease_seconds=300)
    assert first.claimed
    await hold.arm(saver, "AFTER INSERT", "NEW.key = 'k-cut'")
    claim = saver.aclaim(
        [charge_intent("k-held"), charge_intent("k-cut")], owner=OWNER, lease_seconds=300
    )
    await cancelled_in_commit(hold, claim)
    await settled(saver)
    assert await saver.aget_entry("t", "k-cut") is None
    kept = await saver.aget_entry("t", "k-held")
    assert kept == first.entry  # untouched: same owner, its own issued_at, live


async def test_the_undo_never_takes_an_outcome(saver: AsyncSqliteSaver, hold: CommitHold) -> None:
    """An outcome of the claimed call committed before the undo (submitted while the
    claim was being committed): the undo touches only an ``issued`` row, so the outcome
    stays."""
    await hold.arm(saver, "AFTER INSERT", "NEW.key = 'k-cut'")
    task = asyncio.ensure_future(
        saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
    )
    try:
        await hold.held()
        done = Outcome.completed("json", b'"ok"')
        recorded = saver.record_outcome("t", "k-cut", owner=OWNER, outcome=done)
        task.cancel()  # its undo is queued after the outcome
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        hold.release()
    await recorded
    await settled(saver)
    entry = await saver.aget_entry("t", "k-cut")
    assert entry is not None and entry.status is CallStatus.COMPLETED and entry.result == b'"ok"'


async def test_a_failed_undo_leaves_an_unknown_outcome_after_the_lease(
    saver: AsyncSqliteSaver, hold: CommitHold, caplog: pytest.LogCaptureFixture
) -> None:
    """The undo refused by the database (here a trigger aborting the DELETE): it is
    logged, and the claim stays as it committed - an unknown outcome once its lease
    ends: asked, never re-run."""
    await saver.conn.execute(
        "CREATE TEMP TRIGGER idem_test_refuse BEFORE DELETE ON main.idem_tool_calls "
        "BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
    )
    await hold.arm(saver, "AFTER INSERT", "NEW.key = 'k-cut'")
    claim = saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=0.3)
    with caplog.at_level("WARNING", logger="langgraph_idem_saver.sqlite.cut_short"):
        await cancelled_in_commit(hold, claim)
        await settled(saver)
    assert "could not be undone" in caplog.text and "refused by the test" in caplog.text
    entry = await saver.aget_entry("t", "k-cut")
    assert entry is not None and entry.status is CallStatus.ISSUED
    await asyncio.sleep(max(0.0, entry.lease_expires_at - time.time()) + 0.05)
    assert entry.is_unknown()
    [again] = await saver.aclaim([charge_intent("k-cut")], owner=OWNER, lease_seconds=300)
    assert not again.claimed and again.entry.is_unknown()  # asked, not claimed afresh
