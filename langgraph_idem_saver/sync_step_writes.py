"""A sync step's outcomes, handed from the tools' threads to the ledger's loop.

In a sync ``graph.invoke`` each tool call runs in a thread of ``ToolNode``'s executor,
and the ledger lives on its own event loop in another thread. Waiting there for its own
outcome's commit, each call is a hop to that loop and a wakeup back, and the step's
calls reach the group commit one by one. Here, as in an async step
(``LedgerEngine.outcomes_at_end``), each call's thread serializes its result (a result
the serializer refuses fails that call only), hands the row to the step's
:class:`StepWrites` on the ledger's loop (its state is only touched there; the rows of
calls finishing together wake the loop once, ``SyncStepWrites.drain``) and returns; the
rows that reach the loop in one iteration go as one write. ``IdempotentToolNode._func``
then awaits every outcome of the step with one hop (``LedgerEngine.aoutcomes`` on the
ledger's loop), so the node still returns only once every outcome is committed
(``docs/guarantees.md``).

Once the step's end began collecting stops: a call that finishes later (the step left by
an exception while siblings still run) records its own outcome, as before.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from langgraph_idem_saver.engine.loops import on_loop, run_private
from langgraph_idem_saver.engine.step_writes import StepWrites
from langgraph_idem_saver.engine.types import Batch, Plan
from langgraph_idem_saver.held_outcomes import OutcomeParams
from langgraph_idem_saver.ledger import CallStatus

_COMPLETED, _FAILED = CallStatus.COMPLETED.value, CallStatus.FAILED.value

T = TypeVar("T")


class SyncStepWrites(StepWrites):
    """:class:`StepWrites` fed from other threads (see the module)."""

    __slots__ = ("closed", "handed", "lock", "waiting")

    def __init__(self, batch: Batch, loop: asyncio.AbstractEventLoop, name: str) -> None:
        super().__init__(batch, loop, name)
        self.lock = threading.Lock()
        self.closed = False  # the step's end began: no more rows taken
        self.handed = 0  # rows handed to the loop (read by the node's thread)
        # rows handed, not yet taken on the loop; a drain is scheduled while it is not
        # empty (one wakeup of the loop for the rows of calls finishing together)
        self.waiting: list[tuple[Plan, OutcomeParams]] = []

    def hand(self, plan: Plan, result: Any) -> bool:
        """In a call's thread: serialize ``result`` (raising the ``SerializationError``
        of that call when the serializer refuses it) and hand its row to the loop.
        False when the step's end already began, or the ledger's loop closed: the caller
        records it itself (through the loop: a closed one is ``on_loop``'s typed error).

        The first row of a burst schedules the loop's :meth:`drain` (under the lock,
        so before any :meth:`close` returns); the rows handed before it runs join it,
        without waking the loop again (each wakeup is a write to its self-pipe, made
        while the other calls' threads wait for this lock)."""
        row = self.row_of(plan, result)
        with self.lock:
            if self.closed or self.loop.is_closed():
                return False
            waiting = self.waiting
            if not waiting:
                try:
                    self.loop.call_soon_threadsafe(self.drain)
                except RuntimeError:  # the loop closed since is_closed(): not taken
                    return False
            waiting.append((plan, row))
            self.handed += 1
        return True

    def drain(self) -> None:
        """On the loop: take every row handed so far (one write for them, ``take``)."""
        with self.lock:
            rows, self.waiting = self.waiting, []
        for plan, row in rows:
            self.take(plan, row)

    def close(self) -> int:
        """In the node's thread, at the step's end: stop taking rows; how many were
        handed (every one is queued on the loop before anything scheduled after this)."""
        with self.lock:
            self.closed = True
            return self.handed


def sync_writes(batch: Batch, name: str) -> SyncStepWrites | None:
    """The step's writes when its outcomes can go to the ledger's loop from the calls'
    threads: a ledger on a running loop, and a call of the step to run; else None (each
    call awaits its own outcome, on a private loop)."""
    loop = batch.ledger_loop
    if batch.ledger is None or loop is None or loop.is_closed() or not loop.is_running():
        return None
    if not batch.all_plans:
        return None
    return SyncStepWrites(batch, loop, name)


def wait_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run on ``loop`` (the ledger's), this thread blocked until it is done: the
    step's end, pure ledger work (no hook, no ``interrupt()``), so no private loop in
    this thread - ~100 against ~300 µs a hop through ``run_private``. The task runs in a
    copy of this thread's context (``call_soon_threadsafe`` copies it), as through
    ``on_loop``. A loop that stopped raises ``on_loop``'s ``ConfigError``."""
    if loop.is_closed() or not loop.is_running():
        return run_private(on_loop(loop, coro))
    return asyncio.run_coroutine_threadsafe(coro, loop).result()
