"""What the engine's helpers see of it: an :class:`EngineContext`, and the run's ledger
reached on its own loop.

Adoption, unknown outcomes, earlier entries, nested tasks and the middleware's edit note
each need a few things of the engine - its options and counters, how it stores and
replays a result, its wait on a call running elsewhere - never the whole
``LedgerEngine``. The engine builds one ``EngineContext`` and hands them that; the rest
of a run (ledger, loop, serializer, scope, owner) is on its ``Batch``. Nothing here
imports ``engine.core``, so the helpers need not either.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from langchain_core.messages import ToolCall
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.engine.loops import on_loop, running_loop
from langgraph_idem_saver.engine.options import LedgerOptions
from langgraph_idem_saver.engine.results import as_result, dumps, replayed_result
from langgraph_idem_saver.engine.types import Batch, IdempotencyCounters, Kind, Plan
from langgraph_idem_saver.ledger import LedgerEntry

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class EngineContext:
    """One front door's engine as its helpers use it (``LedgerEngine.context``)."""

    options: LedgerOptions
    counters: IdempotencyCounters
    name: str  # the front door's, in error messages
    messages_key: str
    raw_results: bool  # a task's return values, not tool messages
    await_settled: Callable[[Batch, Plan], Awaitable[None]]
    """``LedgerEngine.await_settled``: wait for a call another owner is running (claimed
    anew when that owner released it)."""

    def dumps(self, batch: Batch, result: Any) -> tuple[str | None, bytes | None]:
        """``result`` as the ledger stores it, with the run's serializer."""
        serde = batch.serde or JsonPlusSerializer()
        return dumps(serde, result, f"a {self.name!r} tool call")

    def set_replay(self, batch: Batch, plan: Plan, entry: LedgerEntry) -> None:
        """``plan`` is answered from ``entry``'s recorded outcome."""
        serde = batch.serde or JsonPlusSerializer()
        plan.kind = Kind.REPLAY
        plan.entry = entry
        plan.result = replayed_result(
            serde, entry, plan.call, self.messages_key, raw=self.raw_results
        )

    def as_result(self, value: Any, call: ToolCall) -> Any:
        """A value someone settled a call with, as the call's answer."""
        return value if self.raw_results else as_result(value, call, self.messages_key)


def on_ledger_loop(batch: Batch, coro: Coroutine[Any, Any, T]) -> Awaitable[T]:
    """``coro`` (a call of the run's ledger) to await on the ledger's own event loop:
    ``coro`` itself when that is this loop (no coroutine around it: a wide step awaits
    two ledger writes a call), else the hop there (``on_loop``)."""
    loop = batch.ledger_loop
    if loop is None or loop is running_loop():
        return coro
    return on_loop(loop, coro)


async def anote_event(
    batch: Batch, entry: LedgerEntry, event: dict[str, Any]
) -> LedgerEntry | None:
    """Append ``event`` (stamped now) to ``entry``'s history and change nothing else,
    guarded by what ``entry`` shows. None: the row changed since, or the ledger keeps no
    history (no operator updates)."""
    ledger = batch.ledger
    if ledger is None:
        return None
    try:
        noted = ledger.aoperator_update(entry, entry, {"at": time.time(), **event})
        return await on_ledger_loop(batch, noted)
    except NotImplementedError:  # a ledger without operator updates: nothing noted
        return None
