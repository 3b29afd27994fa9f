"""The ``run`` and ``finish`` steps' context managers: around one call's tool, and
around a whole step's outcomes.

They see the engine only through two small protocols (what ends a started call, what
awaits a step's outcomes), so nothing here imports ``LedgerEngine``.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from langgraph_idem_saver.call_context import in_call
from langgraph_idem_saver.engine.loops import running_loop
from langgraph_idem_saver.engine.step_writes import StepWrites
from langgraph_idem_saver.engine.types import Batch, Plan


class EndsCalls(Protocol):
    """What settles a started call's claim when its run ends without a result."""

    async def araised(self, batch: Batch, plan: Plan, exc: BaseException) -> None: ...

    async def acancelled(self, batch: Batch, plan: Plan) -> None: ...


class AwaitsOutcomes(Protocol):
    """What awaits a step's outcome writes (traced by the engine)."""

    name: str  # the front door's, in error messages

    async def aoutcomes(self, outcomes: StepWrites, *, raising: bool) -> None: ...


class Running(in_call):
    """``LedgerEngine.running``'s context manager: a class, not an
    ``asynccontextmanager``, because it is entered once per tool call and stays alive
    while the tool runs - a generator-based one is four more objects a call (the async
    generator, its manager, the event loop's weak reference to it...) for the garbage
    collector to walk and promote, in steps of 50 parallel calls. It is the call's
    :class:`in_call` too (``current_call()``, the span), rather than holding one: one
    object a call, not two."""

    __slots__ = ("engine",)

    def __init__(self, engine: EndsCalls, batch: Batch, plan: Plan) -> None:
        self.engine, self.batch, self.plan = engine, batch, plan

    async def __aenter__(self) -> None:
        self.plan.started = True
        self.__enter__()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:  # the exception, if any, propagates
        self.__exit__(exc_type, exc, tb)
        if exc is not None:
            await ended(self.engine, self.batch, self.plan, exc)


async def ended(engine: EndsCalls, batch: Batch, plan: Plan, exc: BaseException) -> None:
    """A started call's run ended with ``exc``: an exception settles its claim
    (``araised``), a cancellation ends its lease (``acancelled``); anything else (a
    ``KeyboardInterrupt``) leaves it to its lease. The caller re-raises ``exc``."""
    if isinstance(exc, Exception):
        await engine.araised(batch, plan, exc)
    elif isinstance(exc, asyncio.CancelledError):
        await engine.acancelled(batch, plan)


class StepOutcomes:
    """``LedgerEngine.outcomes_at_end``'s context manager.

    A wide step's calls each record an outcome; awaited by the call that made it, every
    outcome is a wakeup of its call's task and a future for the group commit to resolve.
    Inside this block :meth:`LedgerEngine.afinish` hands the outcome to the step's
    :class:`~langgraph_idem_saver.engine.step_writes.StepWrites` and returns: the calls
    that finish in one loop iteration are sent as one write at the start of the next
    (so each outcome is still committed as soon as its call finished), and the block's
    end awaits them all, so the front door still returns only once every outcome of the
    step is committed (``docs/guarantees.md``).

    Only when the ledger's coroutines run on this loop (not through a hop to another).
    At the block's end collecting stops first: a call that finishes later (the block
    left by an exception while siblings still run) awaits its own outcome. The first
    outcome error is raised after all were awaited; when the block itself raised, its
    exception wins.
    """

    __slots__ = ("batch", "engine")

    def __init__(self, engine: AwaitsOutcomes, batch: Batch) -> None:
        self.engine, self.batch = engine, batch

    async def __aenter__(self) -> None:
        batch = self.batch
        loop = batch.ledger_loop
        here = running_loop()
        if batch.ledger is not None and here is not None and (loop is None or loop is here):
            batch.outcomes = StepWrites(batch, here, self.engine.name)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        outcomes, self.batch.outcomes = self.batch.outcomes, None
        if outcomes is not None and (outcomes.rows is not None or outcomes.sent):
            await self.engine.aoutcomes(outcomes, raising=exc is None)
