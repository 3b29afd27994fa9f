"""A step's preparation (``LedgerEngine.aprepare``) in its parts, and the sync front
door's way through them.

``aprepare`` is keys (sync: ``key_fn`` runs here, in the caller), one claim (a round trip
to the ledger's loop), then adoption and settling (hooks and ``interrupt()``, only for
calls that already had an entry). A sync ``graph.invoke`` ran all of it on the node
thread's private loop, so its claim cost a loop run, a task, and a hop from that loop
(``run_coroutine_threadsafe``, ``wrap_future``, a self-pipe wakeup back) on top of the
ledger's own work. :func:`prepare_blocking` runs the keys in the caller as before, sends
the claim to the ledger's loop and blocks this thread on its future (``wait_on``, as a
sync step's end does), and takes a fresh step's answer (every row inserted) at once;
anything else - an entry found, a fork slot refused, candidates to adopt - continues on
the private loop exactly as ``aprepare`` would, so every hook still runs in the node's
thread and context. ``tests/test_sync_claim_fast.py`` runs both ways and compares rows.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.engine.adoption import aadopt_orphans, aadopt_superseded, step_lookup
from langgraph_idem_saver.engine.context import on_ledger_loop
from langgraph_idem_saver.engine.intents import key_calls, site_of
from langgraph_idem_saver.engine.loops import run_private, running_loop
from langgraph_idem_saver.engine.types import Batch, Kind, Plan, intents_of, of_kind
from langgraph_idem_saver.engine.wide_step import all_claimed
from langgraph_idem_saver.ledger import ClaimOutcome, StepClaim, StepLookup

if TYPE_CHECKING:
    from langgraph_idem_saver.engine.core import LedgerEngine

T = TypeVar("T")


def keyed(
    engine: LedgerEngine, batch: Batch, config: RunnableConfig
) -> tuple[list[Plan], StepLookup | None] | None:
    """The ledger, the site and every pending call's key (a bad argument or ``key_fn``
    fails here, before any claim): the step's leaders to claim and what adoption must
    read with the claim. None: nothing side-effecting, no ledger needed."""
    pending = of_kind(batch.all_plans, Kind.PENDING)
    if not pending:
        return None
    ledger = engine.find_ledger(config)
    batch.ledger = ledger
    batch.ledger_loop = ledger.loop
    batch.serde = ledger.serde
    site = site_of(config, engine.options.namespace, engine.name)
    batch.scope = site.scope
    batch.owner = engine.owner
    step = key_calls(
        pending, site, config, batch.origins, engine.options.policy_for, engine.counters
    )
    return step, step_lookup(batch, step)


async def aprepare(engine: LedgerEngine, batch: Batch, config: RunnableConfig) -> None:
    """``LedgerEngine.aprepare``: keys, one claim, adoption, settling."""
    found = keyed(engine, batch, config)
    if found is not None:
        await aclaimed(engine, batch, config, *found)


async def aclaimed(
    engine: LedgerEngine,
    batch: Batch,
    config: RunnableConfig,
    step: list[Plan],
    lookup: StepLookup | None,
    outcomes: list[ClaimOutcome] | None = None,
    claim: StepClaim | None = None,
) -> None:
    """After the keys: the claim (its answer ``outcomes``/``claim`` when it was made
    elsewhere), then what it found decides - adoption, settling."""
    # Any exception from here on (conflict, interrupt(), timeout) releases the fresh
    # claims of this run: the front door calls ``arelease_unstarted`` in a finally.
    assert batch.ledger is not None
    options = engine.options
    if lookup is None:
        if outcomes is None:
            outcomes = await on_ledger_loop(
                batch,
                batch.ledger.aclaim(
                    intents_of(step), owner=batch.owner, lease_seconds=options.lease_seconds
                ),
            )
        await engine.aclaimed(batch, step, outcomes)
    else:
        if claim is None:
            # one round trip: adoption's read, and the claim when it found nothing
            claim = await on_ledger_loop(
                batch,
                batch.ledger.aclaim_step(
                    intents_of(step), lookup, owner=batch.owner, lease_seconds=options.lease_seconds
                ),
            )
        if claim.claimed is not None:
            await engine.aclaimed(batch, step, claim.claimed)
        else:
            # what the one read found decides first: orphans, then reworded calls
            await aadopt_orphans(engine.context, batch, step, config, claim.candidates)
            await aadopt_superseded(engine.context, batch, step, config, claim.candidates)
            await engine.aclaim(batch, [p for p in step if p.entry is None])
    await engine.asettle(batch, of_kind(step, Kind.PENDING))


def prepare_blocking(engine: LedgerEngine, batch: Batch, config: RunnableConfig) -> None:
    """``run_private(engine.aprepare(batch, config))`` for a sync front door, the same
    rows at the same moments: the claim committed before this returns. When the
    ledger's loop runs in another thread, the claim goes there and this thread waits on
    its future (no private loop); a fresh step is done then. What else the claim found
    goes on through :func:`aclaimed` on the private loop, as before. In the same
    ``idem.claim`` span as ``aprepare`` (``telemetry.claim_span``), opened here."""
    if running_loop() is not None:  # run_private's ConfigError, before any key
        run_private(aprepare(engine, batch, config))
        return
    with telemetry.claim_span(batch):
        _prepare_blocking(engine, batch, config)


def wait_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``sync_step_writes.wait_on``, imported when first called: that module imports the
    engine, which imports this one."""
    from langgraph_idem_saver.sync_step_writes import wait_on as wait

    return wait(loop, coro)


def _prepare_blocking(engine: LedgerEngine, batch: Batch, config: RunnableConfig) -> None:
    found = keyed(engine, batch, config)
    if found is None:
        return
    step, lookup = found
    loop, ledger = batch.ledger_loop, batch.ledger
    assert ledger is not None
    if loop is None or loop.is_closed() or not loop.is_running():
        run_private(aclaimed(engine, batch, config, step, lookup))  # here, or its error
        return
    lease = engine.options.lease_seconds
    if lookup is None:
        outcomes = wait_on(
            loop, ledger.aclaim(intents_of(step), owner=batch.owner, lease_seconds=lease)
        )
        if not all_claimed(step, outcomes):
            run_private(aclaimed(engine, batch, config, step, lookup, outcomes=outcomes))
        return
    claim = wait_on(
        loop, ledger.aclaim_step(intents_of(step), lookup, owner=batch.owner, lease_seconds=lease)
    )
    if claim.claimed is None or not all_claimed(step, claim.claimed):
        run_private(aclaimed(engine, batch, config, step, lookup, claim=claim))
