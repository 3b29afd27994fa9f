"""Ledger rows through the thread-maintenance API, and the ledger protocol itself.

Part 1 drives real graph runs (the scripted agent of ``resume_worker``) and then
``adelete_thread``, ``adelete_for_runs``, ``acopy_thread`` and ``aprune``: the ledger rows
go with their thread (its unknown outcomes excepted), stay when a run is deleted (the
server's rollback: its effects happened), come along with a fork (a fork replays, it does
not charge again), and survive pruning (pruning checkpoints must never cause a re-run).
Rows of a named namespace are shared by every thread that uses it, so no single thread's
maintenance may copy or delete them.

Part 2 calls the :class:`~langgraph_idem_saver.ledger.ToolCallLedger` methods directly
and checks each one's guard.

Everything runs on the ``saver`` fixture, i.e. on every backend in ``conftest.BACKENDS``.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import replace
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode
from resume_worker import InvoiceModel, build_graph
from tool_node_helpers import cfg

from langgraph_idem_saver import NOT_APPLIED, IdempotentToolNode
from langgraph_idem_saver.errors import ConfigError, LedgerStateError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, LedgerEntry, Outcome
from langgraph_idem_saver.owners import owner_is_dead

# --- part 1: maintenance operations on real graph runs -----------------------------------


def pay(*invoices: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content="pay invoices " + " ".join(invoices))]}


class Effects:
    """The side effects of the ``charge`` tool, in order."""

    def __init__(self) -> None:
        self.charged: list[str] = []

    def tools(self) -> list[Any]:
        @tool
        async def charge(invoice: str, amount: int) -> str:
            """Charge an invoice."""
            self.charged.append(invoice)
            return f"charged {invoice} ${amount}"

        return [charge]


def agent(saver: Any, effects: Effects, *, fixed_ids: bool = False, **node_kwargs: Any) -> Any:
    node = IdempotentToolNode(effects.tools(), **node_kwargs)
    graph = build_graph(InvoiceModel(fixed_ids=fixed_ids), node, saver)
    graph.node_under_test = node
    return graph


def tool_contents(out: dict[str, Any]) -> list[Any]:
    return [m.content for m in out["messages"] if isinstance(m, ToolMessage)]


async def checkpoints(saver: Any, thread_id: str) -> list[Any]:
    return [t async for t in saver.alist(cfg(thread_id))]


async def before_tools(graph: Any, thread_id: str) -> Any:
    """The (newest) snapshot whose next step is the tools node: time travel target."""
    history = [s async for s in graph.aget_state_history(cfg(thread_id))]
    return next(s for s in history if s.next == ("tools",))


async def test_delete_thread_takes_its_ledger_rows_and_only_those(saver: Any) -> None:
    fx = Effects()
    graph = agent(saver, fx)
    await graph.ainvoke(pay("a1", "a2"), cfg("A"))
    await graph.ainvoke(pay("b1"), cfg("B"))
    assert len(await saver.alist_entries("A")) == 2

    await saver.adelete_thread("A")

    assert await saver.alist_entries("A") == []
    assert await checkpoints(saver, "A") == []
    [b_entry] = await saver.alist_entries("B")
    assert (b_entry.thread_id, b_entry.status) == ("B", CallStatus.COMPLETED)
    assert await checkpoints(saver, "B") != []
    assert [e.thread_id for e in await saver.alist_entries()] == ["B"]


@pytest.mark.parametrize("carrier", ["metadata", "configurable"])
async def test_delete_for_runs_takes_the_runs_checkpoints_and_keeps_their_ledger_rows(
    saver: Any, carrier: str
) -> None:
    """``run_id`` set by the caller (LangGraph Platform puts it in the config's metadata
    and configurable) tags both the checkpoints and the ledger rows of that run. Deleting
    the run takes its checkpoints; its ledger rows stay (the effects happened)."""
    fx = Effects()
    graph = agent(saver, fx)
    r1, r2, r3 = (str(uuid.uuid4()) for _ in range(3))

    def run_cfg(thread_id: str, run_id: str) -> dict[str, Any]:
        if carrier == "metadata":
            return {"configurable": {"thread_id": thread_id}, "metadata": {"run_id": run_id}}
        return {"configurable": {"thread_id": thread_id, "run_id": run_id}}

    await graph.ainvoke(pay("t1"), run_cfg("T", r1))
    await graph.ainvoke(pay("t2a", "t2b"), run_cfg("T", r2))
    await graph.ainvoke(pay("u"), run_cfg("U", r3))
    entries = await saver.alist_entries("T")
    assert [e.run_id for e in entries] == [r1, r2, r2], "CallIntent.run_id is the graph's run"
    assert {t.metadata.get("run_id") for t in await checkpoints(saver, "T")} == {r1, r2}

    await saver.adelete_for_runs([r2])

    assert await saver.alist_entries("T") == entries, "a deleted run's calls happened"
    assert {t.metadata.get("run_id") for t in await checkpoints(saver, "T")} == {r1}
    assert [e.run_id for e in await saver.alist_entries("U")] == [r3]
    assert fx.charged == ["t1", "t2a", "t2b", "u"]


class LostReply:
    """A ``charge`` tool whose first charge of ``flaky`` lands and then raises (a timeout
    after the provider took the money), and a ``verify`` hook asking the "provider"."""

    def __init__(self, flaky: str) -> None:
        self.charged: list[str] = []
        self.flaky = flaky

    def tools(self) -> list[Any]:
        @tool
        async def charge(invoice: str, amount: int) -> str:
            """Charge an invoice."""
            self.charged.append(invoice)
            if invoice == self.flaky and self.charged.count(invoice) == 1:
                raise TimeoutError("the provider did not answer in time")
            return f"charged {invoice} ${amount}"

        return [charge]

    def verify(self, args: dict[str, Any]) -> Any:
        if args["invoice"] in self.charged:
            return f"charged {args['invoice']} ${args['amount']}"
        return NOT_APPLIED


@pytest.mark.parametrize("node", ["ours", "stock"])
async def test_a_rolled_back_runs_calls_are_replayed_or_asked_never_run_again(
    saver: Any, node: str
) -> None:
    """What LangGraph's server does on ``multitask_strategy="rollback"``: the run is cut
    off and ``adelete_for_runs`` deletes it; the user's next message asks again. The rolled
    back run charged ``b`` (its reply was lost: an unknown outcome) and ``c`` (completed);
    the redo's model, with new call ids, asks for both again: ``b`` is verified, ``c``
    replayed, neither charged twice. The stock ``ToolNode`` (the control) charges both
    again."""
    fx = LostReply(flaky="b")
    if node == "ours":
        tool_node: Any = IdempotentToolNode(fx.tools(), verify={"charge": fx.verify})
    else:
        tool_node = ToolNode(fx.tools())
    graph = build_graph(InvoiceModel(), tool_node, saver)
    r1, r2, r3 = (str(uuid.uuid4()) for _ in range(3))
    await graph.ainvoke(pay("a"), cfg("T", metadata={"run_id": r1}))
    with pytest.raises(TimeoutError):
        await graph.ainvoke(pay("c", "b"), cfg("T", metadata={"run_id": r2}))
    assert sorted(fx.charged) == ["a", "b", "c"]

    await saver.adelete_for_runs([r2])

    state = await graph.aget_state(cfg("T"))
    assert tool_contents(state.values) == ["charged a $10"], "back to before the run"
    out = await graph.ainvoke(pay("c", "b"), cfg("T", metadata={"run_id": r3}))
    if node == "stock":
        assert sorted(fx.charged) == ["a", "b", "b", "c", "c"], "the control charges again"
        return
    assert sorted(fx.charged) == ["a", "b", "c"], "each charge happened once"
    assert tool_contents(out)[-2:] == ["charged c $10", "charged b $20"]
    entries = {e.args: e for e in await saver.alist_entries("T")}
    assert all(e.status is CallStatus.COMPLETED for e in entries.values())


async def test_delete_thread_keeps_its_unknown_outcomes_and_a_later_call_asks(
    saver: Any,
) -> None:
    """Deleting a thread takes its settled entries; an ``issued`` one (an unknown outcome)
    stays, so the same call made later on a thread of that id is verified, not re-run
    (while a settled call asked again is a new call: the control that the redo does
    reach the tool)."""
    fx = LostReply(flaky="b")
    # on_earlier_call="replay": the user lets a kept entry answer a new conversation once
    # verified (the default asks first: tests/test_ended_conversations.py)
    node = IdempotentToolNode(fx.tools(), verify={"charge": fx.verify}, on_earlier_call="replay")
    graph = build_graph(InvoiceModel(), node, saver)
    with pytest.raises(TimeoutError):
        await graph.ainvoke(pay("c", "b"), cfg("T"))
    before = {e.args: e.status for e in await saver.alist_entries("T")}
    assert sorted(before.values()) == [CallStatus.COMPLETED, CallStatus.ISSUED]

    await saver.adelete_thread("T")

    assert await checkpoints(saver, "T") == []
    [kept] = await saver.alist_entries("T")
    assert kept.status is CallStatus.ISSUED and b'"b"' in kept.args
    await graph.ainvoke(pay("c", "b"), cfg("T"))
    # c's entry went with the thread: asked again, it is a new call; b was verified
    assert sorted(fx.charged) == ["b", "c", "c"], "b asked (verified), not charged again"
    entries = await saver.alist_entries("T")
    assert [e.status for e in entries] == [CallStatus.COMPLETED] * 2


async def test_time_travel_on_the_same_thread_replays(saver: Any) -> None:
    """The control for the fork test below: re-running a past tools step in place."""
    fx = Effects()
    graph = agent(saver, fx)
    first = await graph.ainvoke(pay("x", "y"), cfg("A"))
    target = await before_tools(graph, "A")
    again = await graph.ainvoke(None, target.config)
    assert fx.charged == ["x", "y"]
    assert graph.node_under_test.counters.replayed == 2
    assert tool_contents(again) == tool_contents(first)


async def test_copy_thread_copies_ledger_rows_so_a_fork_replays(saver: Any) -> None:
    fx = Effects()
    graph = agent(saver, fx)
    first = await graph.ainvoke(pay("x", "y"), cfg("A"))
    source_rows = await saver.alist_entries("A")

    await saver.acopy_thread("A", "B")

    copied = await saver.alist_entries("B")
    assert [(e.scope, e.thread_id) for e in copied] == [("B", "B")] * 2
    assert [(e.tool_call_id, e.status, e.result) for e in copied] == [
        (e.tool_call_id, e.status, e.result) for e in source_rows
    ]
    assert await saver.alist_entries("A") == source_rows, "the source keeps its rows"

    # time travel on the fork, through the same tools step: a replay, not a second charge
    target = await before_tools(graph, "B")
    node = graph.node_under_test
    executed_before = node.counters.executed
    forked = await graph.ainvoke(None, target.config)
    assert fx.charged == ["x", "y"], "the fork must not charge again"
    assert node.counters.executed == executed_before
    assert node.counters.replayed == 2
    assert tool_contents(forked) == tool_contents(first)


class FailAfterTools(IdempotentToolNode):
    """Raises once after its tools ran and were recorded: the step's writes are lost, so
    the thread's newest checkpoint still has the tools step pending (as after a crash)."""

    armed = False

    async def _afunc(self, *args: Any, **kwargs: Any) -> Any:
        out = await super()._afunc(*args, **kwargs)
        if self.armed:
            self.armed = False
            raise RuntimeError("lost the step after the tools ran")
        return out


async def test_prune_keep_latest_keeps_ledger_rows_and_resume_replays(saver: Any) -> None:
    fx = Effects()
    node = FailAfterTools(fx.tools())
    graph = build_graph(InvoiceModel(), node, saver)
    await graph.ainvoke(pay("old"), cfg("T"))  # an earlier turn, to have history to prune
    node.armed = True
    with pytest.raises(RuntimeError, match="lost the step"):
        await graph.ainvoke(pay("p1", "p2"), cfg("T"))
    assert fx.charged == ["old", "p1", "p2"]
    rows = await saver.alist_entries("T")
    before = await checkpoints(saver, "T")
    assert (await graph.aget_state(cfg("T"))).next == ("tools",)

    await saver.aprune(["T"], strategy="keep_latest")

    kept = await checkpoints(saver, "T")
    assert 1 <= len(kept) < len(before)
    assert kept[0].config == before[0].config, "the newest checkpoint is kept"
    assert await saver.alist_entries("T") == rows, "pruning keeps every ledger row"
    out = await graph.ainvoke(None, cfg("T"))
    assert fx.charged == ["old", "p1", "p2"], "resuming the kept checkpoint did not re-run"
    assert node.counters.replayed == 2
    assert tool_contents(out)[-2:] == ["charged p1 $10", "charged p2 $20"]


async def test_prune_delete_keeps_ledger_rows_so_a_rerun_replays(saver: Any) -> None:
    fx = Effects()
    # a deterministic model: asked again, it emits the same message (same message and
    # tool call ids): the same calls
    graph = agent(saver, fx, fixed_ids=True)
    first = await graph.ainvoke(pay("d1", "d2"), cfg("T"))
    rows = await saver.alist_entries("T")

    await saver.aprune(["T"], strategy="delete")

    assert await checkpoints(saver, "T") == []
    assert await saver.alist_entries("T") == rows, "pruning keeps every ledger row"
    again = await graph.ainvoke(pay("d1", "d2"), cfg("T"))
    assert fx.charged == ["d1", "d2"], "the same calls after pruning are replayed"
    assert graph.node_under_test.counters.replayed == 2
    assert tool_contents(again) == tool_contents(first)


async def test_namespace_rows_are_shared_and_not_copied_with_a_thread(saver: Any) -> None:
    fx = Effects()
    graph = agent(saver, fx, namespace="tenant-1", key_policy="args")
    await graph.ainvoke(pay("n1"), cfg("A"))
    await graph.ainvoke(pay("n1"), cfg("B"))
    assert fx.charged == ["n1"], "one call across the threads of the namespace"
    [shared] = await saver.alist_entries()
    assert shared.scope == "ns:tenant-1"

    await saver.acopy_thread("A", "C")

    assert await saver.alist_entries() == [shared], "a shared row is not duplicated"
    target = await before_tools(graph, "C")
    await graph.ainvoke(None, target.config)
    assert fx.charged == ["n1"], "the fork finds the shared row"


@pytest.mark.parametrize("operation", ["delete_thread", "delete_for_runs"])
async def test_namespace_rows_survive_maintenance_of_one_thread(saver: Any, operation: str) -> None:
    """A namespace row is the memory of a call for *every* thread in the namespace;
    deleting the thread (or run) that happened to issue it must not let another thread
    run the same call again."""
    fx = Effects()
    graph = agent(saver, fx, namespace="tenant-1", key_policy="args")
    run_a = str(uuid.uuid4())
    await graph.ainvoke(pay("n1"), cfg("A", metadata={"run_id": run_a}))
    await graph.ainvoke(pay("n1"), cfg("B"))
    assert fx.charged == ["n1"]

    if operation == "delete_thread":
        await saver.adelete_thread("A")
    else:
        await saver.adelete_for_runs([run_a])

    assert await checkpoints(saver, "A") == []
    assert [e.scope for e in await saver.alist_entries()] == ["ns:tenant-1"]
    await graph.ainvoke(pay("n1"), cfg("D"))
    assert fx.charged == ["n1"], "another thread of the namespace still replays the call"


# --- part 2: the ledger protocol, method by method -------------------------------------------


def intent(key: str, *, thread: str = "t", args: bytes = b'{"a":1}', **kw: Any) -> CallIntent:
    return CallIntent(
        scope=kw.pop("scope", thread),
        key=key,
        thread_id=thread,
        agent_path=kw.pop("agent_path", "tools"),
        tool_name=kw.pop("tool_name", "charge"),
        args_hash=kw.pop("args_hash", f"h-{args.decode()}"),
        args=args,
        tool_call_id=kw.pop("tool_call_id", f"call-{key}"),
        **kw,
    )


ME, OTHER = "host-a:1:me", "host-b:2:other"


async def claim_one(saver: Any, key: str, owner: str = ME, lease: float = 60.0) -> LedgerEntry:
    [outcome] = await saver.aclaim([intent(key)], owner=owner, lease_seconds=lease)
    assert outcome.claimed
    return outcome.entry


async def test_aclaim_claims_a_batch_in_one_call_and_returns_existing_rows(saver: Any) -> None:
    batch = [intent("k1", run_id="r"), intent("k2"), intent("k3", args=b'{"a":3}')]
    outcomes = await saver.aclaim(batch, owner=ME, lease_seconds=60)
    assert [o.claimed for o in outcomes] == [True, True, True]
    for o, i in zip(outcomes, batch, strict=True):
        e = o.entry
        assert (e.scope, e.key, e.tool_call_id, e.args, e.run_id) == (
            i.scope,
            i.key,
            i.tool_call_id,
            i.args,
            i.run_id,
        )
        assert (e.status, e.attempts, e.replays, e.conflicts, e.owner) == (
            CallStatus.ISSUED,
            1,
            0,
            0,
            ME,
        )
        assert e.lease_expires_at > e.issued_at
    await saver.record_outcome("t", "k2", owner=ME, outcome=Outcome.completed("json", b'"ok"'))
    finished = await saver.aget_entry("t", "k2")

    # a second batch: two existing keys (one issued, one completed) and a new one
    again = await saver.aclaim(
        [intent("k1", tool_call_id="other-id"), intent("k2"), intent("k4")],
        owner=OTHER,
        lease_seconds=60,
    )
    assert [o.claimed for o in again] == [False, False, True]
    assert again[0].entry == outcomes[0].entry, "the existing row, unchanged"
    assert again[1].entry == finished
    assert again[2].entry.owner == OTHER
    assert [e.key for e in await saver.alist_entries("t")] == ["k1", "k2", "k3", "k4"]


async def test_an_outcome_is_recorded_only_by_the_owner_of_an_issued_row(saver: Any) -> None:
    """``record_outcome``'s guard, on both backends: a foreign owner, a missing row and a
    second outcome are refused with ``LedgerStateError`` naming the entry's state, and
    leave the row as it was."""
    await claim_one(saver, "k")
    outcome = Outcome.completed("json", b'"r"')
    with pytest.raises(LedgerStateError, match=f"entry is issued \\(owner '{ME}'\\)"):
        await saver.record_outcome("t", "k", owner=OTHER, outcome=outcome)
    assert (await saver.aget_entry("t", "k")).status is CallStatus.ISSUED
    with pytest.raises(LedgerStateError, match="entry is missing"):
        await saver.record_outcome("t", "missing", owner=ME, outcome=outcome)
    assert await saver.record_outcome("t", "k", owner=ME, outcome=outcome) is None
    done = await saver.aget_entry("t", "k")
    assert (done.status, done.result_type, done.result) == (CallStatus.COMPLETED, "json", b'"r"')
    assert done.finished_at is not None
    with pytest.raises(LedgerStateError, match="entry is completed"):  # recorded once
        await saver.record_outcome("t", "k", owner=ME, outcome=Outcome.failed("late"))
    assert await saver.aget_entry("t", "k") == done
    failed_claim = await claim_one(saver, "f")
    await saver.record_outcome("t", "f", owner=ME, outcome=Outcome.failed("boom"))
    failed = await saver.aget_entry("t", "f")
    assert (failed.status, failed.error, failed.attempts) == (
        CallStatus.FAILED,
        "boom",
        failed_claim.attempts,
    )


def test_an_issued_status_is_not_an_outcome() -> None:
    """An ``issued`` entry is a claim: an ``Outcome`` of it (or of a plain string) is
    refused with a typed ``ConfigError`` when it is made, before any ledger sees it."""
    with pytest.raises(ConfigError, match="an issued entry is a claim"):
        Outcome(CallStatus.ISSUED)
    with pytest.raises(ConfigError, match="got 'completed'"):
        Outcome("completed")  # type: ignore[arg-type]
    assert Outcome.completed("json", b"1") == Outcome(CallStatus.COMPLETED, "json", b"1")
    assert Outcome.failed("boom") == Outcome(CallStatus.FAILED, None, None, "boom")
    assert not hasattr(Outcome.failed("boom"), "__dict__"), "slotted"
    with pytest.raises(AttributeError):  # frozen: a recorded outcome cannot change
        Outcome.failed("boom").status = CallStatus.COMPLETED  # type: ignore[misc]


async def test_areclaim_is_guarded_by_attempts_and_owner(saver: Any) -> None:
    entry = await claim_one(saver, "k", owner="deadhost:1:x", lease=0.01)
    assert await saver.areclaim(replace(entry, attempts=7), owner=ME, lease_seconds=60) is None
    mine = await saver.areclaim(entry, owner=ME, lease_seconds=60)
    assert mine is not None
    assert (mine.attempts, mine.owner, mine.status) == (2, ME, CallStatus.ISSUED)
    assert mine.lease_expires_at > entry.lease_expires_at
    # a second resumer that read the same (attempts == 1) row loses
    stale = await saver.areclaim(entry, owner=OTHER, lease_seconds=60)
    assert stale is None
    assert (await saver.aget_entry("t", "k")).owner == ME
    # the new owner may finish; the old one may not
    with pytest.raises(LedgerStateError):
        await saver.record_outcome(
            "t", "k", owner="deadhost:1:x", outcome=Outcome.completed(None, None)
        )
    await saver.record_outcome("t", "k", owner=ME, outcome=Outcome.completed(None, None))
    assert await saver.areclaim(mine, owner=OTHER, lease_seconds=60) is None


async def test_areclaim_from_a_stale_read_cannot_take_a_fresh_live_claim(saver: Any) -> None:
    """ABA: resumer R3 read an unknown row (attempts 1) and decided to re-run it. Before it
    acts, R1 reclaims it (attempts 2) and releases it unstarted (its step was aborted),
    and R4 claims the now free key afresh - attempts is 1 again, R4 is running the tool.
    R3's guarded reclaim must not take R4's live claim (R4 would then run it twice)."""
    read_by_r3 = await claim_one(saver, "k", owner="deadhost:1:x", lease=0.01)
    await asyncio.sleep(0.02)
    r1 = await saver.areclaim(read_by_r3, owner="h:1:r1", lease_seconds=60)
    assert r1 is not None
    assert await saver.arelease("t", "k", owner="h:1:r1")
    r4 = await claim_one(saver, "k", owner="h:4:r4")
    assert r4.attempts == read_by_r3.attempts == 1

    stolen = await saver.areclaim(read_by_r3, owner="h:3:r3", lease_seconds=60)
    assert stolen is None, "a reclaim based on a stale read took over a live claim"
    assert (await saver.aget_entry("t", "k")).owner == "h:4:r4"


async def test_arelease_drops_only_our_issued_row(saver: Any) -> None:
    await claim_one(saver, "k")
    assert await saver.arelease("t", "k", owner=OTHER) is False
    assert await saver.aget_entry("t", "k") is not None
    assert await saver.arelease("t", "k", owner=ME) is True
    assert await saver.aget_entry("t", "k") is None
    assert await saver.arelease("t", "k", owner=ME) is False
    await claim_one(saver, "k")  # the key is free again
    await saver.record_outcome("t", "k", owner=ME, outcome=Outcome.completed(None, None))
    assert await saver.arelease("t", "k", owner=ME) is False, "a recorded outcome stays"
    assert (await saver.aget_entry("t", "k")).status is CallStatus.COMPLETED


async def test_aadopt_succeeds_once(saver: Any) -> None:
    await claim_one(saver, "k")
    adopted = await saver.aadopt("t", "k", tool_call_id="new-1")
    assert adopted is not None and adopted.adopted_by == "new-1"
    assert await saver.aadopt("t", "k", tool_call_id="new-2") is None
    assert (await saver.aget_entry("t", "k")).adopted_by == "new-1"
    [same_call] = await saver.afind_orphans("t", "tools", "charge", 'h-{"a":1}')
    assert same_call.adopted_by == "new-1", "the signature lookup says who adopted it"
    assert await saver.aadopt("t", "missing", tool_call_id="x") is None


async def test_alist_unknown_lists_expired_leases(saver: Any) -> None:
    await claim_one(saver, "expired", owner=OTHER, lease=0.05)
    await claim_one(saver, "live", owner=OTHER, lease=600)
    await claim_one(saver, "done", owner=ME, lease=0.05)
    await saver.record_outcome("t", "done", owner=ME, outcome=Outcome.completed(None, None))
    await asyncio.sleep(0.1)
    assert [e.key for e in await saver.alist_unknown()] == ["expired"]
    later = time.time() + 3600
    assert [e.key for e in await saver.alist_unknown(now=later)] == ["expired", "live"]
    assert all(e.is_unknown(later) for e in await saver.alist_unknown(now=later))


def exited_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


async def test_alist_unknown_lists_claims_of_dead_owners(saver: Any) -> None:
    """A claim whose owner names a process of this host that has exited is an unknown
    outcome at once (``LedgerEntry.is_unknown``; the tool node acts on it without
    waiting for the lease), so the operator's list of unknowns must show it too."""
    dead = f"{socket.gethostname()}:{exited_pid()}:0123456789ab"
    assert owner_is_dead(dead)
    gone = await claim_one(saver, "dead-owner", owner=dead, lease=600)
    await claim_one(saver, "alive-owner", owner=f"{socket.gethostname()}:1:init", lease=600)
    assert gone.is_unknown()
    unknown = await saver.alist_unknown()
    assert [e.key for e in unknown] == ["dead-owner"]


async def test_aresolve_is_guarded_by_attempts_and_owner(saver: Any) -> None:
    read = await claim_one(saver, "k", owner="deadhost:1:x", lease=0.01)
    outcome = Outcome.completed("json", b'"v"')
    assert await saver.aresolve(replace(read, attempts=2), outcome) is None
    mine = await saver.areclaim(read, owner=ME, lease_seconds=60)
    assert mine is not None
    assert await saver.aresolve(read, outcome) is None, "stale"
    settled = await saver.aresolve(mine, outcome)
    assert settled is not None
    assert (settled.status, settled.result, settled.attempts) == (CallStatus.COMPLETED, b'"v"', 2)
    assert await saver.aresolve(mine, outcome) is None, "settled once"
    dead = await claim_one(saver, "f", owner="deadhost:1:x", lease=0.01)
    failed = await saver.aresolve(dead, Outcome.failed("operator: no"))
    assert failed is not None and (failed.status, failed.error) == (
        CallStatus.FAILED,
        "operator: no",
    )
    assert await saver.aresolve(replace(mine, key="missing"), outcome) is None


async def test_anote_replay_counts_replays_and_conflicts(saver: Any) -> None:
    await claim_one(saver, "k")
    await saver.anote_replay("t", "k")
    await saver.anote_replay("t", "k")
    await saver.anote_replay("t", "k", conflict=True)
    entry = await saver.aget_entry("t", "k")
    assert (entry.replays, entry.conflicts) == (2, 1)
    await saver.anote_replay("t", "missing")  # nothing to count: no error, no row
    assert await saver.aget_entry("t", "missing") is None
