"""Reading and settling the ledger from application code (the CLI is built on this).

Backend-neutral: every function takes any :class:`ToolCallLedger` (our savers are one).

* :func:`aentries` / :func:`aunknown_outcomes` - what happened, per thread or everywhere;
* :func:`astats` - counters: executed, replayed, unknown, in progress, failed, conflicts;
* :func:`aresolve_unknown` - settle a call whose outcome is unknown, as an operator who
  checked the outside world: it happened (with this result), it failed, or it did not
  happen and may be run again. Refuses an entry that is not unknown, or that changed
  since it was read (another resumer or operator got there first).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

from langchain_core.messages import ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.errors import CorruptRecordError, LedgerStateError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, LedgerStats, ToolCallLedger

Resolution = Literal["completed", "failed", "rerun"]


async def aentries(
    ledger: ToolCallLedger, thread_id: str | None = None, *, agent_path: str | None = None
) -> list[LedgerEntry]:
    """A thread's entries (or one agent's within it, or all entries), oldest first."""
    return await ledger.alist_entries(thread_id, agent_path=agent_path)


async def aunknown_outcomes(ledger: ToolCallLedger) -> list[LedgerEntry]:
    """Calls that were issued, never finished, and whose claim has lapsed."""
    return await ledger.alist_unknown()


def stats_of(entries: Iterable[LedgerEntry], *, now: float | None = None) -> LedgerStats:
    """Counters over entries. ``executed`` counts tool executions (attempts that ran to an
    outcome), ``replayed`` the times a recorded result was returned instead of running."""
    now = time.time() if now is None else now
    stats = LedgerStats()
    by_status: Counter[str] = Counter()
    for e in entries:
        by_status[e.status.value] += 1
        stats.replayed += e.replays
        stats.conflicts += e.conflicts
        if e.status is CallStatus.ISSUED:
            if e.is_unknown(now):
                stats.unknown += 1
            else:
                stats.in_progress += 1
        else:
            stats.executed += 1
            if e.status is CallStatus.FAILED:
                stats.failed += 1
    stats.by_status = dict(by_status)
    return stats


async def astats(ledger: ToolCallLedger, thread_id: str | None = None) -> LedgerStats:
    """Counters for one thread, or for the whole ledger."""
    return stats_of(await ledger.alist_entries(thread_id))


def decode_args(entry: LedgerEntry) -> Any:
    """The model-emitted arguments of a call, as recorded (canonical JSON)."""
    try:
        return json.loads(entry.args)
    except ValueError as exc:
        raise CorruptRecordError(
            "tool call args", location={"scope": entry.scope, "key": entry.key}, cause=exc
        ) from exc


def decode_result(ledger: ToolCallLedger, entry: LedgerEntry) -> Any:
    """The recorded result of a finished call (a ToolMessage or a Command), or None."""
    if entry.result is None or entry.result_type is None:
        return None
    serde = getattr(ledger, "serde", None) or JsonPlusSerializer()
    try:
        return serde.loads_typed((entry.result_type, entry.result))
    except Exception as exc:
        raise CorruptRecordError(
            "tool call result", location={"scope": entry.scope, "key": entry.key}, cause=exc
        ) from exc


async def aresolve_unknown(
    ledger: ToolCallLedger,
    entry: LedgerEntry,
    resolution: Resolution,
    *,
    result: Any = None,
    error: str | None = None,
) -> LedgerEntry | None:
    """Settle an unknown outcome, as read in ``entry``.

    * ``"completed"``: the effect happened; ``result`` becomes the tool's answer (a
      ToolMessage, or any content for one), replayed on resume.
    * ``"failed"``: the call failed; ``error`` is replayed to the model as an error.
    * ``"rerun"``: the effect did not happen; the claim is dropped and the next resume
      runs the tool again.

    Returns the settled entry (None for ``"rerun"``, whose row is gone). Raises
    :class:`LedgerStateError` when the entry is not an unknown outcome or changed
    since ``entry`` was read.
    """
    current = await ledger.aget_entry(entry.scope, entry.key)
    if current is None or not current.is_unknown():
        state = "gone" if current is None else current.status.value
        if current is not None and current.status is CallStatus.ISSUED:
            state = "issued and still leased (its process may be running it)"
        raise LedgerStateError(
            f"entry {entry.key[:12]} ({entry.tool_name}) is not an unknown outcome: {state}"
        )
    if (current.attempts, current.owner) != (entry.attempts, entry.owner):
        raise LedgerStateError(
            f"entry {entry.key[:12]} ({entry.tool_name}) changed since it was read; "
            "look at it again"
        )
    if resolution == "rerun":
        if not await ledger.arelease(entry.scope, entry.key, owner=entry.owner):
            raise LedgerStateError(f"entry {entry.key[:12]} changed while being released")
        return None
    if resolution == "completed":
        message = (
            result
            if isinstance(result, ToolMessage)
            else ToolMessage(
                content=result if isinstance(result, (str, list)) else json.dumps(result),
                name=entry.tool_name,
                tool_call_id=entry.tool_call_id,
            )
        )
        status, err = CallStatus.COMPLETED, None
    elif resolution == "failed":
        err = error or "failed (settled by an operator)"
        message = ToolMessage(
            content=f"Error: {err}",
            name=entry.tool_name,
            tool_call_id=entry.tool_call_id,
            status="error",
        )
        status = CallStatus.FAILED
    else:
        raise ValueError(f"resolution must be completed, failed or rerun, got {resolution!r}")
    serde = getattr(ledger, "serde", None) or JsonPlusSerializer()
    result_type, data = serde.dumps_typed(message)
    settled = await ledger.aresolve(
        entry.scope,
        entry.key,
        status=status,
        result_type=result_type,
        result=data,
        error=err,
        expected_attempts=entry.attempts,
        expected_owner=entry.owner,
    )
    if settled is None:
        raise LedgerStateError(f"entry {entry.key[:12]} changed while being settled")
    return settled
