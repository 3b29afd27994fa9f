"""Entries a deletion keeps never answer a new conversation silently (issue 36, item 4).

A retention sweep (``delete``) or ``adelete_thread`` removes a thread's checkpoints and
keeps some of its ledger entries: unknown outcomes always, settled ones touched after
``ledger_after``. A new conversation started later on the same thread id is another
conversation: when it asks for the same charge, its call reaches the kept entry (by its
fork slot - the same step of a thread started afresh - or by orphan adoption), which
used to answer it from the old record: the new charge never ran. Now the deleting
transaction marks what it kept (``conversation_ended`` in the entry's history) and the
call is decided explicitly (``on_earlier_call``: asked by default). Real savers, both
backends; the model is the only fake.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command
from resume_worker import InvoiceModel, build_graph

from langgraph_idem_saver import NOT_APPLIED, IdempotentToolNode, TTLConfig

DAY = 86_400.0
PAY = {"messages": [HumanMessage(content="pay invoices inv-1")]}


def cfg(thread_id: str = "T") -> Any:
    return {"configurable": {"thread_id": thread_id}}


class Vendor:
    """The charges that landed; ``fail_after_charge``: the next charge lands, then the
    tool raises (a timeout after the effect); ``fail_before_charge``: the next call
    raises before charging - either way the call's outcome is unknown."""

    def __init__(self) -> None:
        self.charged: list[str] = []
        self.fail_after_charge = False
        self.fail_before_charge = False

    def node(self, **options: Any) -> IdempotentToolNode:
        @tool
        async def charge(invoice: str, amount: int) -> str:
            """Charge an invoice."""
            if self.fail_before_charge:
                self.fail_before_charge = False
                raise ConnectionError("the connection dropped before the request went out")
            self.charged.append(invoice)
            if self.fail_after_charge:
                self.fail_after_charge = False
                raise TimeoutError("the vendor timed out after charging")
            return f"charged {invoice} ${amount}"

        def verify(args: dict[str, Any]) -> Any:
            landed = args["invoice"] in self.charged
            return f"charged {args['invoice']} (verified)" if landed else NOT_APPLIED

        return IdempotentToolNode([charge], verify={"charge": verify}, **options)


def graph_of(saver: Any, vendor: Vendor, **options: Any) -> Any:
    return build_graph(InvoiceModel(), vendor.node(**options), saver)


def told(out: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


async def test_a_swept_threads_kept_entry_asks_before_answering_a_new_conversation(
    saver_factory: Any,
) -> None:
    """The old conversation charged inv-1; a sweep deleted the thread and kept the entry
    (``ledger_after`` longer than ``after``). A new conversation on the thread id asks
    for inv-1: it is asked about (``earlier_call``, reason ``ended_conversation``, the old
    outcome shown), and the answer ``run`` charges again; the entry's history says why."""
    async with saver_factory() as saver:
        vendor = Vendor()
        await graph_of(saver, vendor).ainvoke(PAY, cfg())
        assert vendor.charged == ["inv-1"]
        ttl = TTLConfig(after=timedelta(days=30), ledger_after=timedelta(days=365))
        report = await saver.asweep(time.time() + 60 * DAY, ttl=ttl)
        assert report.threads_deleted == 1 and report.ledger_entries_deleted == 0
        [kept] = await saver.alist_entries("T")
        assert [e["action"] for e in kept.events()] == ["conversation_ended"]

        graph = graph_of(saver, vendor)
        out = await graph.ainvoke(PAY, cfg())
        [question] = out["__interrupt__"]
        asked = question.value
        assert asked["kind"] == "earlier_call" and asked["reason"] == "ended_conversation"
        assert asked["earlier"]["status"] == "completed"
        assert asked["earlier"]["result"] == "charged inv-1 $10"
        assert vendor.charged == ["inv-1"], "nothing ran, nothing answered yet"

        out = await graph.ainvoke(Command(resume={"key": asked["key"], "action": "run"}), cfg())
        assert vendor.charged == ["inv-1", "inv-1"], "the new conversation's charge ran"
        assert told(out) == ["charged inv-1 $10"]
        [entry] = await saver.alist_entries("T")
        assert [e["action"] for e in entry.events()] == ["conversation_ended", "reopened"]
        assert entry.status.value == "completed" and entry.attempts == 2


async def lost_then_ended(saver: Any, vendor: Vendor, error: type[Exception]) -> None:
    """Thread T's charge fails with ``error`` (its outcome unknown to the ledger), then
    the conversation ends (``adelete_thread``)."""
    with pytest.raises(error):
        await graph_of(saver, vendor).ainvoke(PAY, cfg())
    await saver.adelete_thread("T")


async def test_an_unknown_entry_kept_by_adelete_thread_is_settled_then_asked_about(
    saver_factory: Any,
) -> None:
    """``adelete_thread`` keeps an unknown outcome (the charge landed, then the tool
    timed out). A new conversation asking for the same charge gets the old call settled
    on its own (``verify``: it landed), then is asked; answering ``replay`` (the user's
    choice) gives it the verified outcome, and nothing is charged twice."""
    async with saver_factory() as saver:
        vendor = Vendor()
        vendor.fail_after_charge = True
        await lost_then_ended(saver, vendor, TimeoutError)
        [kept] = await saver.alist_entries("T")
        assert kept.status.value == "issued", "an unknown outcome is never forgotten"
        assert [e["action"] for e in kept.events()] == ["conversation_ended"]

        graph = graph_of(saver, vendor)
        out = await graph.ainvoke(PAY, cfg())
        [question] = out["__interrupt__"]
        asked = question.value
        assert asked["reason"] == "ended_conversation"
        assert asked["earlier"]["status"] == "completed", "verify settled the old call first"
        out = await graph.ainvoke(Command(resume={"key": asked["key"], "action": "replay"}), cfg())
        assert vendor.charged == ["inv-1"]
        assert told(out) == ["charged inv-1 (verified)"]


async def test_on_earlier_call_run_runs_a_new_conversations_call_unasked(
    saver_factory: Any,
) -> None:
    """A sweep's ``keep_latest`` ends no conversation (the thread still resumes): it marks
    nothing. After its ``delete``, ``on_earlier_call="run"`` runs the new conversation's
    charge without a question."""
    async with saver_factory() as saver:
        vendor = Vendor()
        await graph_of(saver, vendor).ainvoke(PAY, cfg())
        later = time.time() + 60 * DAY
        await saver.asweep(later, ttl=TTLConfig(after=timedelta(days=30), strategy="keep_latest"))
        [entry] = await saver.alist_entries("T")
        assert entry.events() == [], "keep_latest: the conversation goes on"

        ttl = TTLConfig(after=timedelta(days=30), ledger_after=timedelta(days=365))
        assert (await saver.asweep(later, ttl=ttl)).threads_deleted == 1
        out = await graph_of(saver, vendor, on_earlier_call="run").ainvoke(PAY, cfg())
        assert "__interrupt__" not in out
        assert told(out) == ["charged inv-1 $10"]
        assert vendor.charged == ["inv-1", "inv-1"]


async def test_an_answer_about_another_question_is_not_applied(saver_factory: Any) -> None:
    """The ``earlier_call`` question takes only an answer naming its ``key`` (or, for the
    run's only call, none): another key is skipped and the question asked again, saying
    why - nothing runs on a misplaced answer."""
    async with saver_factory() as saver:
        vendor = Vendor()
        await graph_of(saver, vendor).ainvoke(PAY, cfg())
        ttl = TTLConfig(after=timedelta(days=30), ledger_after=timedelta(days=365))
        await saver.asweep(time.time() + 60 * DAY, ttl=ttl)
        graph = graph_of(saver, vendor)
        [question] = (await graph.ainvoke(PAY, cfg()))["__interrupt__"]
        assert question.value["answer_with"] == {"key": question.value["key"]}

        out = await graph.ainvoke(Command(resume={"key": "another", "action": "run"}), cfg())
        [again] = out["__interrupt__"]
        assert "another" in again.value["previous_answer_ignored"]
        assert vendor.charged == ["inv-1"], "a misplaced answer runs nothing"
        out = await graph.ainvoke(Command(resume={"action": "run"}), cfg())
        assert vendor.charged == ["inv-1", "inv-1"], "the run's only call: a bare answer is its"


async def test_a_kept_unknown_entry_that_did_not_happen_runs_the_new_call_unasked(
    saver_factory: Any,
) -> None:
    """Nothing to guess when the old call did not happen (``verify``: not applied): the
    new conversation's call runs as that entry's next attempt, no question asked, and the
    entry is the new conversation's from then on (``reopened`` after the mark)."""
    async with saver_factory() as saver:
        vendor = Vendor()
        vendor.fail_before_charge = True
        await lost_then_ended(saver, vendor, ConnectionError)

        out = await graph_of(saver, vendor).ainvoke(PAY, cfg())
        assert "__interrupt__" not in out and told(out) == ["charged inv-1 $10"]
        assert vendor.charged == ["inv-1"]
        [entry] = await saver.alist_entries("T")
        assert [e["action"] for e in entry.events()] == ["conversation_ended", "reopened"]
        assert entry.status.value == "completed" and entry.attempts == 2
