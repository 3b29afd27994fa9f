"""A step's ledger cost does not grow with its number of calls (issue 16).

The ledger of a ``ToolNode`` step reads what adoption looks at (every call signature and
fork-slot position of the step) and, when that finds nothing, claims every call - both
in ONE trip (``aclaim_step``) - and records the outcomes of the calls that finish
together (one transaction). Counted here
as trips to the database - SQLite hand-offs to the connection's worker, Postgres
connection uses - made by a ledger kept apart from the checkpointer, so that nothing
else is counted: a step of 1 call and a step of 50 make as many.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any

from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph, tool_messages

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome, StepLookup, ToolCallLedger

# the one method each backend goes through for every trip to its database
TRIP = {"sqlite": "_call", "postgres": "_execute"}


@tool
async def send(to: str) -> str:
    """Send a message (a no-op)."""
    return f"sent to {to}"


@contextmanager
def count_trips(saver: Any, backend: str) -> Iterator[Callable[[], int]]:
    """Count the database trips ``saver`` makes inside the block."""
    name = TRIP[backend]
    original = getattr(saver, name)
    trips = 0

    async def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal trips
        trips += 1
        return await original(*args, **kwargs)

    setattr(saver, name, counted)
    try:
        yield lambda: trips
    finally:
        delattr(saver, name)  # the instance attribute goes: the class method is back


async def step_trips(graph: Any, ledger: Any, backend: str, thread: str, n: int, turn: str) -> int:
    """Run one tools step of ``n`` parallel calls; the ledger trips it made."""
    calls = [("send", {"to": f"user-{i}"}, f"{turn}-{i}") for i in range(n)]
    with count_trips(ledger, backend) as trips:
        out = await graph.ainvoke({"messages": [ai_calls(*calls)]}, cfg(thread))
    assert [m.content for m in tool_messages(out)[-n:]] == [f"sent to user-{i}" for i in range(n)]
    return trips()


async def test_a_step_of_50_calls_costs_the_ledger_as_many_trips_as_one_call(
    saver_factory: Any, backend: str
) -> None:
    """Fresh calls, then the same calls asked again under new ids (the look-up then
    finds an entry for each signature): equal counts for 1 and 50 calls, both times."""
    async with saver_factory() as checkpointer, saver_factory() as ledger:
        graph = tool_graph(IdempotentToolNode([send], ledger=ledger), checkpointer)
        await ledger.setup()
        counts = {
            n: [await step_trips(graph, ledger, backend, f"t{n}", n, turn) for turn in "ab"]
            for n in (1, 50)
        }
        assert counts[1] == counts[50], counts
        assert counts[1][0] == 2  # look-up with the claim, outcomes
        assert len(await ledger.alist_entries("t50")) == 100  # each call claimed and run
        assert all(e.status.value == "completed" for e in await ledger.alist_entries("t50"))


def planted(i: int, *, tool: str, digest: str, path: str = "tools", at: str | None = None) -> Any:
    """The intent of a call ``c<i>`` of thread ``t`` (a fork slot when ``at`` is given)."""
    return CallIntent(
        scope="t", key=f"k{i}", thread_id="t", agent_path=path, tool_name=tool,
        args_hash=digest, args=b"{}", tool_call_id=f"c{i}", position=at,
        branch=None if at is None else "b", occurrence=i,
    )  # fmt: skip


async def test_the_one_read_finds_what_the_reads_per_call_find(saver: Any) -> None:
    """``afind_step_candidates`` (one read) returns, per signature and per spot, exactly
    the lists of ``afind_orphans``/``afind_at_position`` (the default of ledgers written
    before it): the same entries, oldest first, nothing of another agent, spot or tool."""
    await saver.aclaim(
        [
            planted(0, tool="send", digest="h1", at="p1"),
            planted(1, tool="send", digest="h2", at="p1"),
            planted(2, tool="send", digest="h1"),
            planted(3, tool="send", digest="h1", path="other"),  # another agent
            planted(4, tool="charge", digest="h1", at="p1"),  # another tool
            planted(5, tool="send", digest="h3", at="p2"),  # another position
            planted(6, tool="send", digest="h2", at="p1"),
        ],
        owner="someone",
        lease_seconds=60,
    )
    signatures = [("send", "h1"), ("send", "h2"), ("charge", "h9")]
    spots = [("p1", "send"), ("p3", "send")]
    lookup = StepLookup("t", "tools", signatures, spots)
    one_read = await saver.afind_step_candidates(lookup)
    per_call = await ToolCallLedger.afind_step_candidates(saver, lookup)
    assert one_read == per_call

    def keys(found: dict[tuple[str, str], list[Any]]) -> dict[tuple[str, str], list[str]]:
        return {spot: [e.key for e in entries] for spot, entries in found.items()}

    assert keys(one_read.by_signature) == {
        ("send", "h1"): ["k0", "k2"],
        ("send", "h2"): ["k1", "k6"],
        ("charge", "h9"): [],
    }
    assert keys(one_read.at_position) == {("p1", "send"): ["k0", "k1", "k6"], ("p3", "send"): []}


async def test_a_step_claim_writes_nothing_when_adoption_has_something_to_look_at(
    saver: Any,
) -> None:
    """``aclaim_step`` in one trip: nothing found - the calls are claimed (as ``aclaim``);
    something found - exactly what ``afind_step_candidates`` finds, and nothing written.
    The default of other ledgers (two calls) answers the same."""
    for i in (0, 5):  # two entries of one signature and spot: found oldest first
        await saver.aclaim(
            [planted(i, tool="send", digest="h1", at="p1")], owner="x", lease_seconds=9
        )
    fresh = [planted(i, tool="send", digest=f"n{i}", at="p2") for i in (1, 2)]
    found_nothing = StepLookup("t", "tools", [("send", "n1"), ("send", "n2")], [("p2", "send")])
    step = await saver.aclaim_step(fresh, found_nothing, owner="me", lease_seconds=9)
    assert not step.candidates.any()
    assert step.claimed is not None and [c.claimed for c in step.claimed] == [True, True]
    assert [c.entry.key for c in step.claimed] == ["k1", "k2"]

    again = [planted(i, tool="send", digest=d, at="p1") for i, d in ((3, "h1"), (4, "h9"))]
    finds = StepLookup("t", "tools", [("send", "h1"), ("send", "h9")], [("p1", "send")])
    # the saver's one trip, then ToolCallLedger's default
    for claim_step in (saver.aclaim_step, partial(ToolCallLedger.aclaim_step, saver)):
        step = await claim_step(again, finds, owner="me", lease_seconds=9)
        assert step.claimed is None
        assert step.candidates == await saver.afind_step_candidates(finds)
        assert [e.key for e in step.candidates.by_signature["send", "h1"]] == ["k0", "k5"]
        assert [e.key for e in step.candidates.at_position["p1", "send"]] == ["k0", "k5"]
        assert sorted(e.key for e in await saver.alist_entries("t")) == ["k0", "k1", "k2", "k5"]


async def test_a_claim_of_450_calls_returns_every_entry_and_all_outcomes_land(saver: Any) -> None:
    """A claim larger than one read-back statement holds (SQLite: 200 keys per read;
    Postgres: one statement) returns every call's own entry, in order; the 450 outcomes
    recorded together are all written."""
    intents = [planted(i, tool="send", digest=f"d{i}", at="p") for i in range(450)]
    claimed = await saver.aclaim(intents, owner="me", lease_seconds=60)
    assert [c.entry.key for c in claimed] == [f"k{i}" for i in range(450)]
    assert all(c.claimed for c in claimed)
    outcomes = [Outcome.completed("bytes", str(i).encode()) for i in range(450)]
    recorded = await asyncio.gather(
        *(saver.record_outcome("t", f"k{i}", owner="me", outcome=o) for i, o in enumerate(outcomes))
    )
    assert recorded == [None] * 450
    finished = {e.key: e for e in await saver.alist_entries("t")}
    assert [finished[f"k{i}"].result for i in range(450)] == [str(i).encode() for i in range(450)]
    assert all(e.status is CallStatus.COMPLETED for e in finished.values())


async def test_outcomes_finishing_together_are_refused_one_by_one(saver: Any) -> None:
    """Outcomes recorded together share a batch; one that is not ours to record (another
    owner's claim, a missing row) is refused alone with ``LedgerStateError`` naming the
    entry's state, and the others are written."""
    intents = [planted(i, tool="send", digest=f"d{i}", at="p") for i in range(6)]
    await saver.aclaim(intents, owner="me", lease_seconds=60)

    def record(i: int, owner: str = "me") -> Any:
        outcome = Outcome.completed("bytes", str(i).encode())
        return saver.record_outcome("t", f"k{i}", owner=owner, outcome=outcome)

    *recorded, refused_theirs, refused_missing = await asyncio.gather(
        record(0), record(1), record(2, owner="thief"), record(9), return_exceptions=True
    )
    assert recorded == [None, None]
    assert [type(e).__name__ for e in (refused_theirs, refused_missing)] == ["LedgerStateError"] * 2
    assert "issued (owner 'me')" in str(refused_theirs) and "missing" in str(refused_missing)
    entries = {e.key: e for e in await saver.alist_entries("t")}
    assert [(entries[k].status, entries[k].result) for k in ("k0", "k1")] == [
        (CallStatus.COMPLETED, b"0"),
        (CallStatus.COMPLETED, b"1"),
    ]
    assert entries["k2"].status is CallStatus.ISSUED and entries["k2"].result is None


async def test_outcome_rows_recorded_together_are_refused_one_by_one(saver: Any) -> None:
    """``record_outcome_rows`` (a step's outcomes of one loop iteration, as rows): the
    rows not ours to record (another owner's claim, a missing row) are answered with
    ``LedgerStateError`` naming the entry's state, the others are written - the same
    answers from the saver's one write and from ``ToolCallLedger``'s default (a
    ``record_outcome`` each)."""
    intents = [planted(i, tool="send", digest=f"d{i}", at="p") for i in range(8)]
    await saver.aclaim(intents, owner="me", lease_seconds=60)

    def row(i: int, owner: str = "me", status: str = "completed") -> tuple[Any, ...]:
        error = "boom" if status == "failed" else None
        return (status, "bytes", str(i).encode(), error, 1.0, "t", f"k{i}", owner)

    for record_rows, first in (
        (saver.record_outcome_rows, 0),
        (partial(ToolCallLedger.record_outcome_rows, saver), 4),
    ):
        rows = [row(first), row(first + 1, status="failed"), row(first + 2, owner="thief"), row(9)]
        written = record_rows(rows)
        assert await completed_soon_all(saver, [f"k{first}", f"k{first + 1}"])  # under way
        errors = await written
        assert errors[:2] == [None, None]
        assert [type(e).__name__ for e in errors[2:]] == ["LedgerStateError"] * 2
        assert "issued (owner 'me')" in str(errors[2]) and "missing" in str(errors[3])
        entries = {e.key: e for e in await saver.alist_entries("t")}
        assert (entries[f"k{first}"].status, entries[f"k{first}"].result) == (
            CallStatus.COMPLETED,
            str(first).encode(),
        )
        assert (entries[f"k{first + 1}"].status, entries[f"k{first + 1}"].error) == (
            CallStatus.FAILED,
            "boom",
        )
        assert entries[f"k{first + 2}"].status is CallStatus.ISSUED


async def completed_soon_all(saver: Any, keys: list[str]) -> bool:
    """Whether every key of ``keys`` is settled within a few seconds, nobody awaiting."""
    for _ in range(500):
        entries = {e.key: e.status for e in await saver.alist_entries("t")}
        if all(entries.get(k) is not CallStatus.ISSUED for k in keys):
            return True
        await asyncio.sleep(0.01)
    return False


async def test_the_engine_records_outcomes_without_reading_the_rows_back(
    saver_factory: Any, backend: str
) -> None:
    """A 50-call step's outcomes go straight to the backend's group commit as rows
    (``_finish_all_soon``: sent once a loop iteration, awaited at the node's end), with
    no row read back: the 50 calls of a no-op tool finish in one loop iteration, so their
    outcomes are one batch."""
    async with saver_factory() as saver:
        graph = tool_graph(IdempotentToolNode([send]), saver)
        soon: list[str] = []
        batches: list[int] = []
        original_soon = saver._finish_all_soon

        def spied_soon(rows: list[tuple[Any, ...]]) -> Any:
            soon.extend(row[6] for row in rows)  # the keys
            batches.append(len(rows))
            return original_soon(rows)

        saver._finish_all_soon = spied_soon
        await step_trips(graph, saver, backend, "t", 50, "a")
        assert len(set(soon)) == 50
        assert batches == [50]
        assert all(e.status is CallStatus.COMPLETED for e in await saver.alist_entries("t"))
