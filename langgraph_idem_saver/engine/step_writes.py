"""A wide step's outcomes, sent to the ledger as rows once a loop iteration.

Inside ``LedgerEngine.outcomes_at_end`` each finished call of a step hands its outcome
here (:meth:`StepWrites.add`) and goes on. The calls that finish in one iteration of the
event loop - all 50 of a step of quick tools - are sent together at the start of the
next (:meth:`StepWrites.send`: ``ToolCallLedger.record_outcome_rows``, one write, one
future), so each outcome is still under way as soon as its call finished (the group
commit would have gathered the same calls into one transaction), without a
``record_outcome`` call, an ``Outcome``, a write and a future of the group commit for
each call: ~250 bytecodes a call of the loop's thread in a 50-call step
(``benchmarks/ledger_bytecodes.py``). The block's end sends what is left and awaits
every batch (:func:`await_step_writes`), so the node still returns only once every
outcome of the step is committed (``docs/guarantees.md``).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

from langchain_core.messages import ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.engine.results import text_of, unserializable
from langgraph_idem_saver.engine.types import Batch, IdempotencyCounters, Plan
from langgraph_idem_saver.engine.wide_step import all_recorded
from langgraph_idem_saver.held_outcomes import OutcomeParams
from langgraph_idem_saver.ledger import CallStatus, ToolCallLedger, raising

_COMPLETED, _FAILED = CallStatus.COMPLETED.value, CallStatus.FAILED.value

# a batch sent: its calls' plans, and the ledger's answer (an error or None per row)
Sent = tuple[list[Plan], Awaitable[list[Exception | None]]]


class StepWrites:
    """The outcome rows of a step, sent once a loop iteration (see the module)."""

    __slots__ = ("ledger", "loop", "owner", "plans", "rows", "scope", "sent", "serde", "what")

    def __init__(self, batch: Batch, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.ledger: ToolCallLedger = batch.ledger  # type: ignore[assignment]  # claimed
        self.loop, self.scope, self.owner = loop, batch.scope, batch.owner
        self.serde = batch.serde or JsonPlusSerializer()
        self.what = name  # whose result, in a SerializationError
        self.plans: list[Plan] = []
        self.rows: list[OutcomeParams] | None = None  # None: nothing waits to be sent
        self.sent: list[Sent] = []

    def finish(self, plan: Plan, result: Any) -> None:
        """``plan``'s call returned ``result`` (an error ``ToolMessage``: a ``failed``
        call): its outcome row, sent with the others of this loop iteration (``take``,
        inline: once a call of a wide step)."""
        row = self.row_of(plan, result)
        rows = self.rows
        if rows is None:
            rows = self.rows = []
            self.loop.call_soon(self.send)
        self.plans.append(plan)
        rows.append(row)

    def row_of(self, plan: Plan, result: Any) -> OutcomeParams:
        """The outcome row of ``plan``'s call - what ``LedgerPolicy.record_outcome`` builds
        from an ``Outcome``, built directly. The result is serialized now: one the
        serializer refuses fails its own call (``SerializationError``)."""
        try:
            result_type, data = self.serde.dumps_typed(result)
        except Exception as exc:
            raise unserializable(f"a {self.what!r} tool call", exc) from exc
        if isinstance(result, ToolMessage) and result.status == "error":
            status, error = _FAILED, text_of(result.content)
        else:
            status, error = _COMPLETED, None
        return (
            status,
            result_type,
            data,
            error,
            time.time(),
            self.scope,
            plan.ledger_key,
            self.owner,
        )

    def take(self, plan: Plan, row: OutcomeParams) -> None:
        """On the loop: one more row for this iteration's write."""
        rows = self.rows
        if rows is None:
            rows = self.rows = []
            self.loop.call_soon(self.send)
        self.plans.append(plan)
        rows.append(row)

    def send(self) -> None:
        """Send the rows added since the last send, as one write."""
        rows = self.rows
        if rows is None:
            return
        plans, self.plans, self.rows = self.plans, [], None
        try:
            answer = self.ledger.record_outcome_rows(rows)
        except Exception as exc:  # refused at once: raised in a loop callback, it would be
            answer = raising(exc)  # lost, and the step would return with its calls issued
        self.sent.append((plans, answer))

    def __len__(self) -> int:
        return sum(len(plans) for plans, _ in self.sent) + len(self.plans)


async def await_step_writes(
    writes: StepWrites, counters: IdempotencyCounters, *, raising: bool
) -> None:
    """Send what is left and await every batch: each call whose outcome is committed is
    no longer its claim to release, and counted ``executed`` (once a step); the first
    error is raised, after all were awaited, when ``raising``. Cancelled, the batches
    not awaited yet are dropped quietly (``forget``)."""
    writes.send()
    first: Exception | None = None
    executed = 0
    sent = writes.sent
    try:
        for at, (plans, answer) in enumerate(sent):
            try:
                errors: list[Exception | None] = await answer
            except Exception as exc:  # the whole write failed: every call of it
                errors = [exc] * len(plans)
            except BaseException:
                for _, left in sent[at + 1 :]:
                    forget(left)
                raise
            if all_recorded(plans, errors):  # the usual answer: the whole batch at once
                executed += len(plans)
                continue
            for plan, error in zip(plans, errors, strict=True):
                if error is None:
                    plan.owned = False  # as ``LedgerEngine.recorded``
                    executed += 1
                elif first is None:
                    first = error
    finally:
        if executed:
            counters.bump("executed", executed)
    if first is not None and raising:
        raise first


def forget(written: Awaitable[Any]) -> None:
    """Drop an answer nobody will await (its caller was cancelled): the write goes on
    (the group commit's own task), and neither an unawaited coroutine nor an
    unretrieved error is reported for it."""
    if asyncio.iscoroutine(written):
        written.close()
    elif isinstance(written, asyncio.Future):
        written.add_done_callback(_retrieved)


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
