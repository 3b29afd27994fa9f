"""A single-call sync front door's outcome, committed from the caller's thread.

``IdempotencyMiddleware.wrap_tool_call`` and a sync ``idempotent_task`` run one call
each. Their outcome was ``run_private(engine.afinish(...))``: a run of the thread's
private loop, a task, and a hop from that loop to the ledger's (``on_loop``) and back,
around what is pure ledger work - no hook, no ``interrupt()``. :func:`finish_blocking`
serializes the result in the caller's thread (as a sync tool step's calls do,
``SyncStepWrites.hand``) and sends the write (``LedgerEngine.arecord``: the same row,
committed, timed and counted the same) to the ledger's loop, this thread blocked on its
future (``sync_step_writes.wait_on``). Anything else - no ledger loop running in another
thread, a result the serializer refuses - goes the earlier way, on the private loop.
``tests/test_sync_middleware_claim_fast.py``/``tests/test_sync_task_claim_fast.py``
run both ways and compare rows.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from langgraph_idem_saver.engine.loops import run_private, running_loop
from langgraph_idem_saver.engine.results import outcome_of
from langgraph_idem_saver.engine.types import Batch, Plan
from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.sync_step_writes import wait_on

if TYPE_CHECKING:
    from langgraph_idem_saver.engine.core import LedgerEngine


def finish_blocking(engine: LedgerEngine, batch: Batch, plan: Plan, result: Any) -> Any:
    """``run_private(engine.afinish(batch, plan, result))`` for a single-call sync front
    door: the same row, committed when this returns, the same errors. A result the
    serializer refuses: ``araised`` on the private loop, then its ``SerializationError``
    (as ``afinish``)."""
    loop = batch.ledger_loop
    if (
        loop is None
        or batch.outcomes is not None
        or loop.is_closed()
        or not loop.is_running()
        or running_loop() is not None
    ):
        return run_private(engine.afinish(batch, plan, result))
    try:
        result_type, data = engine.context.dumps(batch, result)
    except SerializationError as exc:  # the tool ran: its effect may have landed
        run_private(engine.araised(batch, plan, exc))
        raise
    wait_on(loop, engine.arecord(batch, plan, outcome_of(result, result_type, data)))
    return result
