"""Nested ledgered tasks: an orchestrating task is re-run, never settled past its inner
tasks.

An ``idempotent_task`` whose body awaits other ``idempotent_task`` s (``settle(inv)``
calling ``charge(inv)`` then ``notify(inv)``) is ledgered too. A crash inside an inner
task leaves *both* entries unknown. Settling the outer one - ``verify``, ``on_unknown``
or a human answering ``completed`` - would replay its recorded value and never call
the inner tasks again: ``notify`` silently skipped. The inner tasks are the ledgered
effects, so the outer one needs no answer of its own: it is re-run, and each inner task
replays its recorded outcome or settles its own unknown one.

So the first time a running task calls a ledgered inner task, the outer task's entry
gets an ``orchestrates`` event in its history (committed before the inner task is
claimed), and an unknown outcome with that event is decided "rerun" without asking
(``unknown.adecide``). The outer task's own code runs again on that re-run: effects
belong in the inner tasks (docs/guarantees.md, "Functional API").
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from dataclasses import dataclass, field

from langgraph_idem_saver.engine.context import anote_event
from langgraph_idem_saver.engine.types import Batch, Plan
from langgraph_idem_saver.ledger import LedgerEntry

ORCHESTRATES = "orchestrates"
"""History event of a task entry whose run called ledgered inner tasks."""


@dataclass
class RunningTask:
    """A ledgered task whose body is running (the contextvar's value while it runs)."""

    batch: Batch
    plan: Plan
    marked: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


RUNNING_TASK: ContextVar[RunningTask | None] = ContextVar("idem_running_task", default=None)
"""The innermost ledgered task running in this context: an inner task sees its caller
(LangGraph runs a task called from a task in the caller's context)."""


def orchestrates(entry: LedgerEntry) -> bool:
    """Whether the entry's run called ledgered inner tasks (re-run it, never settle it)."""
    history = entry.history
    if not history or ORCHESTRATES not in history:
        return False
    return any(e.get("action") == ORCHESTRATES for e in entry.events() if isinstance(e, dict))


async def amark_caller(inner_name: str) -> None:
    """Called by a ledgered task as it starts: mark the ledgered task that called it (if
    any) as an orchestrator, once per run, committed before the inner task is claimed."""
    outer = RUNNING_TASK.get()
    if outer is None:
        return
    with outer.lock:
        if outer.marked:
            return
        outer.marked = True
    plan, batch = outer.plan, outer.batch
    entry = plan.entry
    if entry is None or batch.ledger is None or not plan.owned or orchestrates(entry):
        return  # not ours to mark, or marked on an earlier attempt
    event = {"by": "idem-saver", "action": ORCHESTRATES, "inner": inner_name}
    marked = await anote_event(batch, entry, event)  # None: no operator updates, no mark
    if marked is not None:
        plan.entry = marked
