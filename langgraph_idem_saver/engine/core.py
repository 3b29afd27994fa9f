"""``LedgerEngine``: the ledger protocol, once, for every front door.

One run of a front door (a ``ToolNode`` step, one ``create_agent`` tool call, one
``@task`` call) goes through these steps, each a method below or a function of a sibling
module::

    plan      add_call()            which calls are ledgered (read-only tools are not)
    key       aprepare()            canonical args, the key, the intent - before any write
              intents.key_calls()   (pure: no ledger read or write)
    adopt     adoption.aadopt_orphans   a call whose message was lost gets its entry back
    claim     aclaim()              ONE transaction: an ``issued`` row per new call
    settle    asettle()             replay / conflict / wait / unknown outcome:
              unknown.adecide()         operator approval -> verify -> policy -> interrupt
              unknown.aapply()          record the decision
    run       running()             the front door runs the tool inside it (outcomes.py)
    finish    afinish()             ``completed``/``failed`` with the result, committed
              outcomes_at_end()     (a whole step) each call's write started, all awaited
              araised()             the tool raised: unknown outcome (or released)
              acancelled()          cancelled mid-run: unknown outcome, lease ended now
    answer    aanswer()             a call not run: replayed, settled, or its twin's

A front door builds a :class:`Batch` of :class:`Plan` s, calls :meth:`aprepare`, runs the
calls planned ``Kind.RUN`` and reports each outcome. Nothing here knows ``ToolNode``
beyond its ``ToolInvocationError`` (arguments refused before the tool ran: no effect).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import operator
import threading
import time
from itertools import compress
from typing import Any, cast

from langchain_core.callbacks.manager import adispatch_custom_event
from langchain_core.messages import ToolCall
from langchain_core.runnables import RunnableConfig
from langgraph.constants import CONFIG_KEY_CHECKPOINTER
from langgraph.errors import GraphBubbleUp
from langgraph.prebuilt.tool_node import ToolInvocationError

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.checkpointer_unwrap import describe, ledger_in
from langgraph_idem_saver.engine.context import EngineContext, on_ledger_loop
from langgraph_idem_saver.engine.earlier import (
    adecide_earlier,
    areopen,
    closed_superseded,
    raise_changed,
)
from langgraph_idem_saver.engine.forks import siblings_refused
from langgraph_idem_saver.engine.loops import awaiting
from langgraph_idem_saver.engine.options import LedgerOptions
from langgraph_idem_saver.engine.outcomes import Running, StepOutcomes
from langgraph_idem_saver.engine.prepare import aprepare
from langgraph_idem_saver.engine.results import outcome_of, retarget
from langgraph_idem_saver.engine.step_writes import StepWrites, await_step_writes
from langgraph_idem_saver.engine.types import (
    Batch,
    IdempotencyConflict,
    IdempotencyCounters,
    Kind,
    NoLedgerError,
    NotAppliedError,
    Plan,
    ToolCallInProgress,
    intents_of,
    live,
)
from langgraph_idem_saver.engine.unknown import aapply, adecide
from langgraph_idem_saver.engine.wide_step import all_claimed, plan_distinct, plan_each
from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    ClaimOutcome,
    LedgerEntry,
    Outcome,
    ToolCallLedger,
)
from langgraph_idem_saver.owners import make_owner, minted_here

_NAME = operator.itemgetter("name")
_ID = operator.itemgetter("id")
_OWNED, _STARTED = operator.attrgetter("owned"), operator.attrgetter("started")

REPLAY_EVENT = "idem_saver_replay"
"""Name of the custom callback event sent for every replayed call (see
:func:`announce_replay`): ``astream_events`` shows it as ``on_custom_event``."""


async def announce_replay(call: ToolCall, key: str, recorded: str) -> None:
    """Tell tracing and streaming users that a call was answered from the ledger.

    A replayed call never reaches the tool, so no ``on_tool_start``/``on_tool_end`` fires;
    this custom event (``{"tool", "tool_call_id", "args", "key", "recorded"}``) stands
    in for them, under the run of the node or task that replayed it. Outside a run (no
    callback context) there is nobody to tell, and nothing is sent.
    """
    data = {
        "tool": call["name"],
        "tool_call_id": call.get("id"),
        "args": call.get("args"),
        "key": key,
        "recorded": recorded,
    }
    with contextlib.suppress(RuntimeError):  # no parent run: called outside a runnable
        await adispatch_custom_event(REPLAY_EVENT, data)


def settle_future(plan: Plan, *, result: Any = None, exc: BaseException | None = None) -> None:
    """Publish a call's outcome to calls of the same step that share its key."""
    if plan.outcome is None or plan.outcome.done():
        return
    if exc is not None:
        plan.outcome.set_exception(exc)
    else:
        plan.outcome.set_result(result)


class LedgerEngine:
    """The ledger protocol for one front door: its options, owner id and counters."""

    def __init__(
        self,
        options: LedgerOptions,
        *,
        name: str,
        messages_key: str = "messages",
        raw_results: bool = False,
    ) -> None:
        self.options = options
        self.name = name
        self.messages_key = messages_key
        # results are plain values (a task's return value), not tool messages: recorded,
        # replayed and answered as they are
        self.raw_results = raw_results
        self.counters = IdempotencyCounters()
        # what adoption, unknown outcomes, earlier entries and nested tasks use of it
        self.context = EngineContext(
            options, self.counters, name, messages_key, raw_results, self.await_settled
        )
        self._owner_lock = threading.Lock()
        self._owner_id = make_owner()
        # lease ends still being written after a second cancellation (``acancelled``)
        self._background: set[asyncio.Future[None]] = set()

    @property
    def owner(self) -> str:
        """``host:pid:nonce``, renewed after ``fork`` so children never share claims.

        Read by the tool threads of a sync ``invoke`` at once: the check and the renewal
        happen under a lock, and the id is one attribute, so no thread sees half of it.
        """
        owner = self._owner_id
        if minted_here(owner):
            return owner
        with self._owner_lock:
            if not minted_here(self._owner_id):
                self._owner_id = make_owner()
            return self._owner_id

    def had_no_effect(self, tool_name: str, exc: BaseException) -> bool:
        """Whether an exception from running a call proves its tool did nothing final:
        an ``interrupt()`` (or other LangGraph control flow), arguments refused before the
        tool ran, or an exception the tool or the user declared "not applied"."""
        safe = (GraphBubbleUp, ToolInvocationError, NotAppliedError)
        return isinstance(exc, safe + self.options.not_applied_for(tool_name))

    def find_ledger(self, config: RunnableConfig) -> ToolCallLedger:
        """``ledger=`` if given, else the graph's checkpointer when it is a ledger or wraps
        one (LangGraph's Agent Server wraps it: ``checkpointer_unwrap``)."""
        if self.options.ledger is not None:
            return self.options.ledger
        checkpointer = config.get("configurable", {}).get(CONFIG_KEY_CHECKPOINTER)
        found_ledger = ledger_in(checkpointer)
        if found_ledger is not None:
            return found_ledger
        found = describe(checkpointer)
        raise NoLedgerError(
            f"{self.name!r} needs a ToolCallLedger, found {found}: compile the graph with a "
            "checkpointer that implements it (e.g. langgraph_idem_saver.AsyncSqliteSaver) "
            "or pass ledger=... . Refusing to run side-effecting tools unprotected."
        )

    # --- planning --------------------------------------------------------------------------

    def add_call(
        self, batch: Batch, call: ToolCall, *, tool: Any = None, known: bool = True
    ) -> Plan:
        """Plan one call: ledgered, or skipped (read-only, or a tool nobody registered -
        which never runs: the front door answers with an error)."""
        plan = Plan(call=call)
        if known:
            name = call["name"]
            read_only = batch.read_only.get(name)  # asked once per tool of a step
            if read_only is None:
                read_only = self._read_only(batch, name, tool)
            if read_only:
                self.counters.bump("read_only")
            else:
                plan.kind = Kind.PENDING
        batch.add(plan)
        return plan

    def add_calls(self, batch: Batch, calls: list[ToolCall], tools: dict[str, Any]) -> None:
        """:meth:`add_call` for every call of a step, ``tools`` by name (a name not in it
        is unknown): the kind asked once a tool; a step of ledgered calls with ids of
        their own planned at once (``wide_step``), any other call by call."""
        kinds = {
            name: Kind.PENDING
            if (tool := tools.get(name)) is not None and not self._read_only(batch, name, tool)
            else Kind.SKIP
            for name in dict.fromkeys(map(_NAME, calls))
        }
        ids = list(map(str, map(_ID, calls)))
        if not plan_distinct(batch, calls, ids, kinds):
            plan_each(batch, calls, ids, kinds, tools, self.counters)

    def _read_only(self, batch: Batch, name: str, tool: Any) -> bool:
        """``options.is_read_only`` for a tool not asked about yet this step, kept for the
        step (a wide step repeats one tool 50 times; its options and metadata do not
        change within the step): ``add_call`` reads the kept answer itself."""
        found = batch.read_only[name] = self.options.is_read_only(name, tool)
        return found

    def note_state(self, batch: Batch, pairs: list[tuple[str, str]] | None) -> None:
        """What the run's state shows: every (tool call id, message id) of its messages,
        oldest first, or None when no state is visible (adoption is then skipped)."""
        if pairs is None:
            return
        batch.known_ids = set(dict(pairs))
        batch.pairs = list(pairs)
        if not batch.origins and len(batch.known_ids) == len(set(pairs)):
            batch.origins = dict(pairs)  # each id in one message (C: a wide step's state)
            return
        for call_id, message_id in pairs:
            if batch.origins.setdefault(call_id, message_id) != message_id:
                batch.reused_ids.add(call_id)
                batch.origins[call_id] = message_id  # the newest message wins

    @telemetry.traced_prepare
    async def aprepare(self, batch: Batch, config: RunnableConfig) -> None:
        """Keys, adoption, one claim, settling: after it each ledgered plan knows whether
        to run (``Kind.RUN``) or what to answer (``engine.prepare``)."""
        await aprepare(self, batch, config)

    # --- claim and settle ------------------------------------------------------------------

    async def aclaim(self, batch: Batch, plans: list[Plan]) -> None:
        """ONE ``aclaim`` for all calls of the step that have no entry yet."""
        if not plans:
            return
        assert batch.ledger is not None
        outcomes = await on_ledger_loop(
            batch,
            batch.ledger.aclaim(
                intents_of(plans),
                owner=batch.owner,
                lease_seconds=self.options.lease_seconds,
            ),
        )
        await self.aclaimed(batch, plans, outcomes)

    async def aclaimed(self, batch: Batch, plans: list[Plan], outcomes: list[ClaimOutcome]) -> None:
        """Take the claim's outcome for each plan; claim again the calls a sibling's fork
        slot refused (at their next occurrence)."""
        if all_claimed(plans, outcomes):  # a fresh step: every plan at once
            return
        refused = False
        for plan, outcome in zip(plans, outcomes, strict=True):
            plan.entry = outcome.entry
            plan.ledger_key = outcome.entry.key
            if outcome.claimed:
                plan.kind, plan.owned = Kind.RUN, True
            else:
                refused = True
        if not refused:  # a fresh step: each entry is its own claim, nothing to look at
            return
        # a fork slot held by an identical call of this branch: claim the next occurrence;
        # held by another branch: that is this call (see ``forks``), settled below
        again = siblings_refused(plans)
        for plan in plans:
            entry, intent = plan.entry, plan.intent
            if entry is not None and intent is not None and entry.key != intent.key:
                self.counters.bump("adopted")
        if again:
            await self.aclaim(batch, again)

    async def asettle(self, batch: Batch, plans: list[Plan]) -> None:
        """Decide what to do with calls that already had an entry.

        Order matters: conflicts first (nothing else is sound), then wait for calls
        running elsewhere, then unknown outcomes - all decisions (verify hooks and
        ``interrupt()`` calls, in call order) before any ledger write, so that a node
        re-entered after an interrupt makes the same ``interrupt()`` calls in the same
        order and LangGraph matches each resume value to the right call.
        """
        if not plans:
            return  # a fresh step: every call claimed, nothing had an entry
        assert batch.ledger is not None
        for plan in plans:
            entry, intent = plan.entry, plan.intent
            assert entry is not None and intent is not None
            if plan.superseded:
                continue  # other arguments by design: a lost call this one replaced
            if entry.args_hash != intent.args_hash or entry.tool_name != intent.tool_name:
                await on_ledger_loop(
                    batch, batch.ledger.anote_replay(batch.scope, entry.key, conflict=True)
                )
                self.counters.bump("conflicts")
                raise IdempotencyConflict(
                    f"tool call {intent.tool_call_id!r} to {intent.tool_name!r} maps to ledger "
                    f"key {entry.key!r} in scope {batch.scope!r}, which records a call to "
                    f"{entry.tool_name!r} (id {entry.tool_call_id!r}) with different arguments;"
                    " refusing to replay or run it"
                )

        busy = [p for p in plans if live(cast(LedgerEntry, p.entry))]
        if busy:
            await asyncio.gather(*(self.await_settled(batch, p) for p in busy))

        unknown: list[Plan] = []
        for plan in plans:
            if plan.kind is not Kind.PENDING:
                continue  # claimed while waiting (the owner released it)
            entry = cast(LedgerEntry, plan.entry)
            if entry.status is CallStatus.ISSUED:
                if not entry.is_unknown():
                    raise ToolCallInProgress(
                        f"tool call {plan.call['id']!r} to {plan.call['name']!r} (key "
                        f"{entry.key!r}) is being run by {entry.owner!r}; it did not finish "
                        f"within {self.options.wait_seconds}s. Retry later."
                    )
                unknown.append(plan)
            elif closed_superseded(entry) and not plan.superseded:
                # a lost call that did not happen answers nothing: this call (its very
                # arguments) runs it as its next attempt (engine/earlier.py)
                if not await areopen(self.context, batch, plan, "not applied; superseded"):
                    raise_changed(plan)
            else:
                self.context.set_replay(batch, plan, entry)

        sole = sum(p.kind is not Kind.SKIP for p in batch.all_plans) == 1
        context = self.context
        decisions = [(plan, await adecide(context, batch, plan, sole=sole)) for plan in unknown]
        for plan, decision in decisions:
            await aapply(context, batch, plan, decision)
        # a settled entry not proven to be the call (reworded, or of an ended
        # conversation): on_earlier_call decides, never a guess (engine/earlier.py)
        fresh = await adecide_earlier(context, batch, plans, sole=sole)
        # replaced a lost call that did not happen: now a call of its own
        fresh += [p for p in unknown if p.kind is Kind.PENDING and p.entry is None]
        fresh = list(dict.fromkeys(fresh))  # a reworded call decided "run" is in both
        if fresh:
            await self.aclaim(batch, fresh)
            await self.asettle(batch, [p for p in fresh if p.kind is Kind.PENDING])

    async def await_settled(self, batch: Batch, plan: Plan) -> None:
        """Poll a call another owner is running until it finishes, lapses or vanishes."""
        assert batch.ledger is not None
        deadline = time.monotonic() + self.options.wait_seconds
        entry = cast(LedgerEntry, plan.entry)
        while live(entry) and time.monotonic() < deadline:
            await asyncio.sleep(self.options.poll_seconds)
            fresh = await on_ledger_loop(batch, batch.ledger.aget_entry(batch.scope, entry.key))
            if fresh is None:
                # The owner released its claim (its tool was interrupted): claim it anew.
                intent = cast(CallIntent, plan.intent)
                if entry.key != intent.key:
                    raise ToolCallInProgress(f"adopted entry {entry.key!r} vanished; retry")
                await self.aclaim(batch, [plan])
                if plan.kind is Kind.RUN:
                    return
                fresh = cast(LedgerEntry, plan.entry)
            entry = fresh
        plan.entry = entry

    @telemetry.traced_answer
    async def aanswer(self, batch: Batch, plan: Plan) -> Any:
        """The result of a call that is not run: settled, replayed, or its twin's."""
        ledger = cast(ToolCallLedger, batch.ledger)
        if plan.kind is Kind.RETURN:
            return plan.result
        if plan.kind is Kind.REPLAY:
            entry = cast(LedgerEntry, plan.entry)
            await on_ledger_loop(batch, ledger.anote_replay(batch.scope, entry.key))
            self.counters.bump("replayed")
            await announce_replay(plan.call, entry.key, entry.status.value)
            return plan.result
        if plan.kind is Kind.FOLLOW:
            leader = cast(Plan, plan.leader)
            published = cast(concurrent.futures.Future[Any], leader.outcome)
            leader_result = await asyncio.wrap_future(published)
            if leader.ledger_key is not None:
                await on_ledger_loop(batch, ledger.anote_replay(batch.scope, leader.ledger_key))
            self.counters.bump("replayed")
            await announce_replay(plan.call, leader.ledger_key or "", "same step")
            return retarget(leader_result, {str(leader.call["id"])}, plan.call, self.messages_key)
        raise RuntimeError(  # pragma: no cover - planning always decides
            f"unplanned tool call {plan.call['id']!r} ({plan.kind})"
        )

    async def afinish(self, batch: Batch, plan: Plan, result: Any) -> Any:
        """Record what the tool returned; an error ToolMessage is a ``failed`` call.

        Exceptions that escape ``ToolNode`` (not handled by ``handle_tool_errors``, or
        ``interrupt()`` inside the tool) never get here: the claim is released instead,
        because the tool reported that it did not complete and LangGraph will run it
        again on retry/resume. Cancellation releases nothing: the effect may have
        happened, so after the lease the call is an unknown outcome. A result the
        serializer refuses raises its ``SerializationError`` with the claim abandoned, as
        :meth:`araised` does: the tool ran, so a retry is asked, never made to wait.

        Committed when this returns - or, inside :meth:`outcomes_at_end`, written and
        awaited with the step's other outcomes at the block's end.
        """
        try:
            if self.finish_in_step(batch, plan, result):
                return result
            result_type, data = self.context.dumps(batch, result)
        except SerializationError as exc:  # the tool ran: its effect may have landed
            await self.araised(batch, plan, exc)
            raise
        await self.arecord(batch, plan, outcome_of(result, result_type, data))
        return result

    def finish_in_step(self, batch: Batch, plan: Plan, result: Any) -> bool:
        """:meth:`afinish` inside :meth:`outcomes_at_end`, with no coroutine: the outcome
        handed to the step's writes (sent this loop iteration, awaited with the step's);
        False outside such a block, where the caller awaits :meth:`afinish`."""
        writes = batch.outcomes
        if writes is None:
            return False
        writes.finish(plan, result)
        return True

    @telemetry.traced_outcomes
    async def arecord(self, batch: Batch, plan: Plan, outcome: Outcome) -> None:
        """Commit a call's own outcome (not inside :meth:`outcomes_at_end`); timed as
        :meth:`aoutcomes` is for a step's, and only it: in a wide step ``afinish`` runs
        50 times, and a wrapper around it would be a coroutine more each time."""
        record, key = cast(ToolCallLedger, batch.ledger).record_outcome, cast(str, plan.ledger_key)
        await on_ledger_loop(
            batch, awaiting(record, batch.scope, key, owner=batch.owner, outcome=outcome)
        )
        self.recorded(plan)

    def recorded(self, plan: Plan) -> None:
        """``plan``'s outcome is committed: its claim is no longer this run's to release."""
        plan.owned = False
        self.counters.bump("executed")

    def outcomes_at_end(self, batch: Batch) -> StepOutcomes:
        """Around a front door's run of a whole step's calls: each :meth:`afinish` starts
        its outcome's write and returns, and the block's end awaits them all (see
        :class:`StepOutcomes`)."""
        return StepOutcomes(self, batch)

    @telemetry.traced_outcomes
    async def aoutcomes(self, outcomes: StepWrites, *, raising: bool) -> None:
        """Await every outcome handed over by :meth:`afinish` in a block of
        :meth:`outcomes_at_end`: each is committed, or its error is raised - the first
        one, after all were awaited - when ``raising``."""
        await await_step_writes(outcomes, self.counters, raising=raising)

    def running(self, batch: Batch, plan: Plan) -> Running:
        """Around a front door's run of a ``Kind.RUN`` call's tool: marks it started, and
        an exception (:meth:`araised`) or a cancellation (:meth:`acancelled`) that ends
        the run settles its claim before propagating. Async front doors only: a sync tool
        runs in its thread, where nothing cancels it."""
        return Running(self, batch, plan)

    async def araised(self, batch: Batch, plan: Plan, exc: BaseException) -> None:
        """A started call raised instead of returning (``handle_tool_errors`` let it out).

        Unless the exception proves nothing happened (:meth:`had_no_effect`), the call
        is an unknown outcome: a timeout or a reset connection often comes *after* the
        effect landed. The claim is abandoned, not released - the row stays ``issued``
        with its lease ended and the error kept - so the next attempt (a ``RetryPolicy``
        retry, or the user's resume) goes through verify -> policy -> human, as after a
        crash, and never re-runs it silently.
        """
        if self.had_no_effect(plan.call["name"], exc):
            await self.arelease(batch, plan)
            return
        await self.aabandon(batch, plan, f"{type(exc).__name__}: {exc}"[:2000])

    async def acancelled(self, batch: Batch, plan: Plan) -> None:
        """A started call was cancelled mid-run: a timeout around ``ainvoke``, a cancelled
        task, or LangGraph cancelling the step's other tasks after one raised.

        The effect may have landed, so this is an unknown outcome, as in :meth:`araised`.
        This process is alive, though: left to its lease, the user's own retry would wait
        ``wait_seconds`` on a call nobody runs and then raise ``ToolCallInProgress``. The
        lease is ended now. The write is shielded, so the unwinding cancellation cannot
        cut it short; cancelled again while waiting, it finishes in the background.
        """
        write = asyncio.ensure_future(
            self.aabandon(batch, plan, "CancelledError: cancelled while the tool ran")
        )
        self._background.add(write)
        write.add_done_callback(self._background.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(write)

    async def aabandon(self, batch: Batch, plan: Plan, error: str) -> None:
        """End the lease of a started call whose outcome is unknown, keeping ``error``."""
        if not plan.owned or plan.ledger_key is None or batch.ledger is None:
            return
        plan.owned = False
        await on_ledger_loop(
            batch,
            batch.ledger.aabandon(
                batch.scope, plan.ledger_key, owner=batch.owner or self.owner, error=error
            ),
        )
        self.counters.bump("abandoned")

    # --- ledger plumbing -------------------------------------------------------------------

    async def arelease(self, batch: Batch, plan: Plan) -> None:
        if not plan.owned or plan.ledger_key is None or batch.ledger is None:
            return
        plan.owned = False
        release = getattr(batch.ledger, "arelease", None)
        if release is None:  # pragma: no cover - ledgers predating arelease
            return  # safe default: the claim lapses into an unknown outcome
        owner = batch.owner or self.owner  # the owner it claimed with
        if await on_ledger_loop(batch, release(batch.scope, plan.ledger_key, owner=owner)):
            self.counters.bump("released")

    async def arelease_unstarted(self, batch: Batch) -> None:
        """Drop claims of calls that never reached their tool (the step was aborted)."""
        plans = batch.all_plans  # owned > started: owned and not started (C, a wide step)
        for plan in compress(plans, map(operator.gt, map(_OWNED, plans), map(_STARTED, plans))):
            await self.arelease(batch, plan)
