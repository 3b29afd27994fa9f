"""Reading and settling the ledger from application code (the CLI is built on this).

Backend-neutral: every function takes any :class:`ToolCallLedger` (our savers are one).

* :func:`aentries` / :func:`aunknown_outcomes` - what happened, per thread or everywhere;
* :func:`astats` - counters: executed, replayed, unknown, in progress, failed, conflicts;
* :func:`aresolve_unknown` - settle a call whose outcome is unknown, as an operator who
  checked the outside world: it happened (with this result), it failed, or it did not
  happen and may be run again. Refuses an entry that is not unknown (unless forced: a
  claim held by a process on another host that is gone), or that changed since it was
  read (another resumer or operator got there first);
* :func:`aretry_failed` - reopen a failed call whose failure was transient;
* :func:`astale_claims` - live claims older than a threshold (a host that may be gone).

Every decision is appended to the entry's audit trail (``LedgerEntry.events()``) and
keeps its attempt count.
"""

from __future__ import annotations

import dataclasses
import getpass
import json
import os
import socket
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from typing import Any, Literal

from langchain_core.messages import ToolMessage

from langgraph_idem_saver import telemetry
from langgraph_idem_saver.engine.results import loads_recorded
from langgraph_idem_saver.errors import CorruptRecordError, LedgerStateError
from langgraph_idem_saver.ledger import (
    CallStatus,
    LedgerEntry,
    LedgerStats,
    ToolCallLedger,
)
from langgraph_idem_saver.owners import RERUN_APPROVED

Resolution = Literal["completed", "failed", "rerun"]


async def aentries(
    ledger: ToolCallLedger, thread_id: str | None = None, *, agent_path: str | None = None
) -> list[LedgerEntry]:
    """A thread's entries (or one agent's within it, or all entries), oldest first."""
    return await ledger.alist_entries(thread_id, agent_path=agent_path)


async def aunknown_outcomes(ledger: ToolCallLedger) -> list[LedgerEntry]:
    """Calls that were issued, never finished, and whose claim has lapsed."""
    return await ledger.alist_unknown()


MODEL_ANSWER = "__model__"  # model_record.MODEL_TOOL_NAME (a test holds them equal)


def stats_of(entries: Iterable[LedgerEntry], *, now: float | None = None) -> LedgerStats:
    """Counters over entries' tool calls. ``executed`` counts tool executions (attempts
    that ran to an outcome), ``replayed`` the times a recorded result was returned instead
    of running; recorded model answers are left out."""
    now = time.time() if now is None else now
    stats = LedgerStats()
    by_status: Counter[str] = Counter()
    for e in entries:
        if e.tool_name == MODEL_ANSWER:
            continue  # a recorded model answer (model_record.py), not a tool call
        by_status[e.status.value] += 1
        stats.replayed += e.replays
        stats.conflicts += e.conflicts
        if e.status is CallStatus.ISSUED:
            # approved for a re-run: settled, as alist_unknown says; the next resume runs it
            if e.is_unknown(now) and not e.rerun_approved():
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
    return loads_recorded(ledger.serde, entry, "tool call result")


def operator_name() -> str:
    """Who is deciding, for the audit trail: ``user@host`` of this process."""
    try:
        user = getpass.getuser()
    except Exception:  # no passwd entry (containers)
        user = f"uid{os.getuid()}" if hasattr(os, "getuid") else "unknown"
    return f"{user}@{socket.gethostname()}"


@telemetry.traced_resolution
async def aresolve_unknown(
    ledger: ToolCallLedger,
    entry: LedgerEntry,
    resolution: Resolution,
    *,
    result: Any = None,
    error: str | None = None,
    force: bool = False,
    by: str | None = None,
    note: str | None = None,
) -> LedgerEntry:
    """Settle an unknown outcome, as read in ``entry``.

    * ``"completed"``: the effect happened; ``result`` becomes the tool's answer (a
      ToolMessage, or any content for one), replayed on resume.
    * ``"failed"``: the call failed; ``error`` is replayed to the model as an error.
    * ``"rerun"``: the effect did not happen; the next resume runs the tool again, as the
      call's next attempt (the row, its attempt count and its history are kept).

    ``force=True`` also settles a claim whose lease is still running: for a process the
    operator knows is gone but that cannot be seen as dead from here (a replaced pod on
    another host). Each decision is appended to the entry's audit trail
    (:meth:`LedgerEntry.events`: when, ``by`` whom, what, which attempt, the previous
    owner). Raises :class:`LedgerStateError` when the entry is not an unknown outcome
    (without ``force``), or changed since ``entry`` was read.
    """
    current = await ledger.aget_entry(entry.scope, entry.key)
    settleable = current is not None and (
        current.is_unknown() or (force and current.status is CallStatus.ISSUED)
    )
    if current is None or not settleable:
        state = "gone" if current is None else current.status.value
        if current is not None and current.status is CallStatus.ISSUED:
            state = (
                f"issued and still leased by {current.owner} (its process may be running "
                "it; force=True / --force breaks the claim)"
            )
        raise LedgerStateError(
            f"entry {entry.key[:12]} ({entry.tool_name}) is not an unknown outcome: {state}"
        )
    _check_unchanged(current, entry)
    if resolution not in ("completed", "failed", "rerun"):
        raise ValueError(f"resolution must be completed, failed or rerun, got {resolution!r}")
    event = _event(current, resolution, by=by, note=note, forced=force and not current.is_unknown())
    if resolution == "rerun":
        return await _aapprove_rerun(ledger, current, event)
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
    else:
        err = error or "failed (settled by an operator)"
        message = ToolMessage(
            content=f"Error: {err}",
            name=entry.tool_name,
            tool_call_id=entry.tool_call_id,
            status="error",
        )
        status = CallStatus.FAILED
    result_type, data = ledger.serde.dumps_typed(message)
    rewritten = dataclasses.replace(
        current,
        status=status,
        result_type=result_type,
        result=data,
        error=err,
        finished_at=time.time(),
    )
    settled = await ledger.aoperator_update(current, rewritten, event)
    if settled is None:
        raise LedgerStateError(f"entry {entry.key[:12]} changed while being settled")
    return settled


async def aretry_failed(
    ledger: ToolCallLedger,
    entry: LedgerEntry,
    *,
    by: str | None = None,
    note: str | None = None,
) -> LedgerEntry:
    """Let a ``failed`` call run again: its failure was transient.

    A failed entry answers every later call with the same key from the ledger (under
    ``key_policy="args"`` that is every call with the same arguments). This reopens it:
    the next call or resume runs the tool as the entry's next attempt, keeping its
    attempt count and audit trail. Raises :class:`LedgerStateError` for an entry that
    is not ``failed`` or changed since it was read.
    """
    current = await ledger.aget_entry(entry.scope, entry.key)
    if current is None or current.status is not CallStatus.FAILED:
        state = "gone" if current is None else current.status.value
        raise LedgerStateError(f"entry {entry.key[:12]} ({entry.tool_name}) is not failed: {state}")
    _check_unchanged(current, entry)
    return await _aapprove_rerun(ledger, current, _event(current, "retry", by=by, note=note))


async def _aapprove_rerun(
    ledger: ToolCallLedger, current: LedgerEntry, event: dict[str, Any]
) -> LedgerEntry:
    """Mark the entry "issued, approved for a re-run": its lease is over and its owner
    says so, so the next resume reclaims it (attempts + 1) and runs the tool unasked."""
    rewritten = dataclasses.replace(
        current,
        status=CallStatus.ISSUED,
        owner=f"{RERUN_APPROVED}{uuid.uuid4().hex[:12]}",
        lease_expires_at=0.0,
        result_type=None,
        result=None,
        finished_at=None,
    )
    approved = await ledger.aoperator_update(current, rewritten, event)
    if approved is None:
        raise LedgerStateError(f"entry {current.key[:12]} changed while being released")
    return approved


def _check_unchanged(current: LedgerEntry, seen: LedgerEntry) -> None:
    if (current.attempts, current.owner) != (seen.attempts, seen.owner):
        raise LedgerStateError(
            f"entry {seen.key[:12]} ({seen.tool_name}) changed since it was read; look at it again"
        )


def _event(
    entry: LedgerEntry, action: str, *, by: str | None, note: str | None, forced: bool = False
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "at": time.time(),
        "by": by or operator_name(),
        "action": action,
        "attempt": entry.attempts,
        "status_before": entry.status.value,
        "owner_before": entry.owner,
    }
    if forced:
        event["forced"] = True
    if note:
        event["note"] = note
    return event


async def astale_claims(ledger: ToolCallLedger, *, older_than: float) -> list[LedgerEntry]:
    """Live claims (``issued``, lease running, owner not known dead) older than
    ``older_than`` seconds: a process on another host that may be gone. Settle one with
    ``aresolve_unknown(..., force=True)`` once you know its process is dead."""
    now = time.time()
    return [
        e
        for e in await ledger.alist_issued()
        if not e.is_unknown(now) and e.issued_at <= now - older_than
    ]
