"""A ``ToolNode`` step's outcomes: written as each call finishes, awaited at the node's end.

``IdempotentToolNode`` runs a step's calls inside ``LedgerEngine.outcomes_at_end``: each
call hands its outcome over as its tool returns and goes on, the outcomes of one loop
iteration are sent as one write (``record_outcome_rows``), and the node awaits them all
before it returns. What ``docs/guarantees.md`` promises is
checked here: every outcome is committed before the node returns, each is under way as
soon as its call finished (a slow sibling does not hold it back), a refused outcome fails
the step once every other outcome is committed, and the node's own exception wins.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from tool_node_helpers import ai_calls, cfg, tool_graph, tool_messages

from langgraph_idem_saver import IdempotentToolNode, PostgresSaver, SqliteSaver, ToolLedger
from langgraph_idem_saver.engine import Batch, LedgerEngine, LedgerOptions
from langgraph_idem_saver.engine.step_writes import StepWrites
from langgraph_idem_saver.engine.types import Plan
from langgraph_idem_saver.errors import LedgerStateError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome


@tool
async def send(to: str) -> str:
    """Send a message (a no-op)."""
    return f"sent to {to}"


def intent(i: int) -> CallIntent:
    return CallIntent(
        scope="t", key=f"k{i}", thread_id="t", agent_path="tools", tool_name="send",
        args_hash=f"d{i}", args=b"{}", tool_call_id=f"c{i}",
    )  # fmt: skip


def record(ledger: Any, i: int, owner: str = "me") -> Any:
    """Start recording call ``k<i>``'s outcome (its result ``str(i)``) as ``owner``."""
    outcome = Outcome.completed("bytes", str(i).encode())
    return ledger.record_outcome("t", f"k{i}", owner=owner, outcome=outcome)


@pytest.fixture(params=["saver", "ToolLedger-on-its-own-loop", "sync-saver"])
async def ledger(request: pytest.FixtureRequest, db: Any) -> AsyncIterator[Any]:
    """A saver on this loop (its own ``record_outcome``), or a ``ToolLedger`` or a sync
    saver over the same kind of database, each on a private loop thread: from this loop
    their ``record_outcome`` starts a task that hops there."""
    if request.param == "saver":
        async with db.open() as saver:
            yield saver
    elif request.param == "sync-saver":
        sync_class = SqliteSaver if db.backend == "sqlite" else PostgresSaver
        with sync_class.from_conn_string(db.where) as sync_saver:
            sync_saver.setup()
            yield sync_saver
    else:
        with ToolLedger(db.where) as standalone:
            yield standalone


async def status_of(saver: Any, key: str) -> CallStatus:
    entry = await saver.aget_entry("t", key)
    assert entry is not None
    return entry.status  # type: ignore[no-any-return]


async def completed_soon(saver: Any, key: str) -> bool:
    """Whether ``key`` becomes ``completed`` within a few seconds, nobody awaiting it."""
    for _ in range(500):
        if await status_of(saver, key) is CallStatus.COMPLETED:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_an_outcome_written_soon_commits_before_anyone_awaits_it(ledger: Any) -> None:
    """The write is under way when ``record_outcome`` returns (the saver's, submitted to
    its group commit; from another loop, a task hopping there): committed with nobody
    awaiting it, and awaiting it afterwards gives None."""
    await ledger.aclaim([intent(0)], owner="me", lease_seconds=60)
    written = record(ledger, 0)
    assert await completed_soon(ledger, "k0")
    assert await written is None
    entry = await ledger.aget_entry("t", "k0")
    assert entry.result == b"0"


async def test_an_outcome_not_ours_is_refused_when_awaited(ledger: Any) -> None:
    """The guard of ``record_outcome`` (issued, to this owner), its error raised when the
    answer is awaited; the entry is left as it was."""
    await ledger.aclaim([intent(0)], owner="me", lease_seconds=60)
    stolen = record(ledger, 0, owner="thief")
    missing = record(ledger, 9)
    with pytest.raises(LedgerStateError, match="issued \\(owner 'me'\\)"):
        await stolen
    with pytest.raises(LedgerStateError, match="missing"):
        await missing
    assert await status_of(ledger, "k0") is CallStatus.ISSUED


async def test_an_outcome_written_soon_sets_a_fresh_saver_up(saver_factory: Any) -> None:
    """Sent to a saver nothing has used yet (no claim set it up), the write sets it up
    first, then is refused by its guard like any other: nothing was claimed."""
    async with saver_factory() as fresh:
        with pytest.raises(LedgerStateError, match="missing"):
            await record(fresh, 0)
        assert await fresh.alist_entries("t") == []


def delay_writes(saver: Any, seconds: float) -> None:
    """Start each batch of outcomes' write ``seconds`` late (its answer with it)."""
    original = saver._finish_all_soon
    loop = asyncio.get_running_loop()

    def late(rows: list[tuple[Any, ...]]) -> asyncio.Future[Any]:
        answer = loop.create_future()

        def start() -> None:
            asyncio.ensure_future(original(rows)).add_done_callback(
                lambda f: (
                    answer.set_exception(f.exception())
                    if f.exception()
                    else answer.set_result(f.result())
                )
            )

        loop.call_later(seconds, start)
        return answer

    saver._finish_all_soon = late


async def test_the_node_returns_only_once_every_outcome_is_committed(saver: Any) -> None:
    """Outcomes whose writes only start 0.2 s after their calls finished: the node's
    update (streamed once the node returned) finds every one of them committed."""
    delay_writes(saver, 0.2)
    graph = tool_graph(IdempotentToolNode([send]), saver)
    calls = [("send", {"to": f"u{i}"}, f"c{i}") for i in range(20)]
    seen: list[set[CallStatus]] = []
    async for update in graph.astream(
        {"messages": [ai_calls(*calls)]}, cfg("t"), stream_mode="updates"
    ):
        if "tools" in update:
            seen.append({e.status for e in await saver.alist_entries("t")})
    assert seen == [{CallStatus.COMPLETED}]
    assert len(await saver.alist_entries("t")) == 20


async def test_a_calls_outcome_is_committed_while_a_slow_sibling_still_runs(saver: Any) -> None:
    """The fast call's outcome does not wait for the step's end: it is committed while
    its sibling is still running."""
    release = asyncio.Event()
    fast_done: list[CallStatus] = []

    @tool
    async def slow(to: str) -> str:
        """A slow send."""
        await release.wait()
        return f"slow to {to}"

    async def watch() -> None:
        entries = []
        while len(entries) < 2:
            entries = await saver.alist_entries("t")
            await asyncio.sleep(0.01)
        fast = next(e for e in entries if e.tool_name == "send")
        assert await completed_soon(saver, fast.key)
        fast_done.append(await status_of(saver, fast.key))
        release.set()

    graph = tool_graph(IdempotentToolNode([send, slow]), saver)
    message = ai_calls(("send", {"to": "a"}, "c1"), ("slow", {"to": "b"}, "c2"))
    watcher = asyncio.ensure_future(watch())
    out = await graph.ainvoke({"messages": [message]}, cfg("t"))
    await watcher
    assert fast_done == [CallStatus.COMPLETED]
    assert [m.content for m in tool_messages(out)] == ["sent to a", "slow to b"]


def refuse_one(saver: Any, content: str) -> None:
    """Record the outcome whose result says ``content`` under another owner: refused."""
    original = saver._finish_all_soon

    def refused(rows: list[tuple[Any, ...]]) -> Any:
        rows = [(*p[:7], "thief") if content.encode() in p[2] else p for p in rows]
        return original(rows)

    saver._finish_all_soon = refused


async def test_a_refused_outcome_fails_the_step_after_every_other_is_committed(
    saver: Any,
) -> None:
    """One outcome of five refused by its guard: the step raises it, and only once the
    other four are committed; the refused call stays ``issued`` (its outcome unknown)."""
    graph = tool_graph(IdempotentToolNode([send]), saver)
    refuse_one(saver, "sent to u2")
    calls = [("send", {"to": f"u{i}"}, f"c{i}") for i in range(5)]
    with pytest.raises(LedgerStateError, match="cannot record the outcome"):
        await graph.ainvoke({"messages": [ai_calls(*calls)]}, cfg("t"))
    by_call = {e.tool_call_id: e.status for e in await saver.alist_entries("t")}
    assert by_call == {
        "c0": CallStatus.COMPLETED,
        "c1": CallStatus.COMPLETED,
        "c2": CallStatus.ISSUED,
        "c3": CallStatus.COMPLETED,
        "c4": CallStatus.COMPLETED,
    }


async def test_the_nodes_own_exception_wins_and_a_late_sibling_records_its_own(
    saver: Any,
) -> None:
    """A call raises (errors not handled) while a sibling still runs: the node raises the
    tool's exception, not the refused outcome of a third call; the sibling, finishing
    after the node left, awaits its own outcome, which is committed."""
    release = asyncio.Event()

    @tool
    async def boom(why: str) -> str:
        """Fail."""
        await asyncio.sleep(0.05)  # after send's outcome was written
        raise ValueError(f"boom: {why}")

    @tool
    async def slow(to: str) -> str:
        """A slow send."""
        await release.wait()
        return f"slow to {to}"

    builder = StateGraph(MessagesState)
    builder.add_node("tools", IdempotentToolNode([send, boom, slow], handle_tool_errors=False))
    builder.add_edge(START, "tools")
    graph = builder.compile(checkpointer=saver)
    refuse_one(saver, "sent to a")
    message = ai_calls(
        ("send", {"to": "a"}, "c1"), ("boom", {"why": "y"}, "c2"), ("slow", {"to": "b"}, "c3")
    )
    with pytest.raises(ValueError, match="boom: y"):
        await graph.ainvoke({"messages": [message]}, cfg("t"))
    release.set()
    slow_key = next(e.key for e in await saver.alist_entries("t") if e.tool_call_id == "c3")
    assert await completed_soon(saver, slow_key)
    by_call = {e.tool_call_id: e for e in await saver.alist_entries("t")}
    assert by_call["c1"].status is CallStatus.ISSUED  # refused, and not raised
    assert by_call["c2"].is_unknown() and by_call["c2"].error == "ValueError: boom: y"


async def test_outcomes_left_unawaited_by_a_cancellation_are_dropped_quietly() -> None:
    """Cancelled while awaiting a step's outcomes, the engine leaves behind neither a
    coroutine never awaited nor an error never retrieved (``forget``), and counts none
    of them as executed."""
    engine = LedgerEngine(LedgerOptions.build(tools={}), name="tools")
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: reported.append(context))
    hanging: asyncio.Future[None] = loop.create_future()
    failed: asyncio.Future[None] = loop.create_future()

    async def written() -> None:
        return None

    left = written()
    answers: list[Any] = [hanging, left, failed]

    class Ledger:  # each send of the step answered by the next of ``answers``
        def record_outcome_rows(self, rows: list[tuple[Any, ...]]) -> Any:
            return answers.pop(0)

    batch = Batch(sync=False)
    batch.ledger = Ledger()  # type: ignore[assignment]
    writes = StepWrites(batch, loop, "tools")
    for i in range(3):  # three loop iterations: three batches of one call
        plan = Plan(call={"name": "send", "args": {}, "id": f"c{i}", "type": "tool_call"})
        plan.ledger_key = f"k{i}"
        writes.finish(plan, f"result {i}")
        writes.send()
    waiting = asyncio.ensure_future(engine.aoutcomes(writes, raising=True))
    await asyncio.sleep(0)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert hanging.cancelled()  # the one being awaited
    # closed: a closed coroutine is never reported as "never awaited"
    assert left.cr_frame is None and inspect.getcoroutinestate(left) == "CORO_CLOSED"
    failed.set_exception(LedgerStateError("refused after the node left"))
    await asyncio.sleep(0)  # its done callbacks run
    del failed, waiting  # the last references: a future not retrieved would report now
    try:
        assert reported == []  # no "Future exception was never retrieved"
    finally:
        loop.set_exception_handler(None)
    assert engine.counters.executed == 0


async def test_a_batch_without_a_ledger_on_this_loop_is_not_collected() -> None:
    """``outcomes_at_end`` collects only when the ledger's coroutines run on this loop:
    a ledger on another loop (a sync saver's) is awaited call by call, through the hop."""
    engine = LedgerEngine(LedgerOptions.build(tools={}), name="tools")
    other = asyncio.new_event_loop()
    try:
        batch = Batch(sync=False)
        async with engine.outcomes_at_end(batch):
            assert batch.outcomes is None  # no ledger yet: nothing claimed
        batch.ledger, batch.ledger_loop = object(), other  # type: ignore[assignment]
        async with engine.outcomes_at_end(batch):
            assert batch.outcomes is None
        batch.ledger_loop = asyncio.get_running_loop()
        async with engine.outcomes_at_end(batch):
            assert isinstance(batch.outcomes, StepWrites) and len(batch.outcomes) == 0
        assert batch.outcomes is None
    finally:
        other.close()
