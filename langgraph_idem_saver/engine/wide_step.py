"""A wide step's per-call work done over its columns: the common case at once.

A ``ToolNode`` step of many new calls - each with its own id and key, none recorded
before, nothing to adopt - is planned, keyed and claimed here with ``map``/``zip`` over
the step's columns (C: no Python frame a call), where the general path runs a loop
iteration a call (``benchmarks/ledger_bytecodes.py`` counts the difference). Each
function takes the step only when its case holds, and returns what the general path
would have made of it; otherwise it returns ``False``/``None`` and the caller's loop
decides, as before. ``tests/test_ledger_wide_step_fast.py`` runs both paths on real
SQLite files and compares every row, plan and intent.
"""

from __future__ import annotations

import operator
from collections import deque
from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import Any

from langchain_core.messages import ToolCall

from langgraph_idem_saver.engine.types import Batch, IdempotencyCounters, Kind, Plan
from langgraph_idem_saver.ledger import CallIntent, ClaimOutcome

_NAME, _CALL = operator.itemgetter("name"), operator.attrgetter("call")
_CLAIMED, _ENTRY = operator.attrgetter("claimed"), operator.attrgetter("entry")
_KEY = operator.attrgetter("key")


def set_each(objects: Iterable[Any], name: str, values: Iterable[Any]) -> None:
    """``setattr(obj, name, value)`` for each object and value, in C (a wide step sets a
    field of 50 plans at once, where a loop is a few bytecodes a plan)."""
    deque(map(setattr, objects, repeat(name), values), maxlen=0)


def plan_distinct(
    batch: Batch, calls: list[ToolCall], ids: list[str], kinds: dict[str, Kind]
) -> bool:
    """``LedgerEngine.add_calls`` for a first batch of calls all ledgered (``kinds``: per
    tool name) under ids of their own: one ``PENDING`` plan a call. False, nothing
    planned, otherwise (:func:`plan_each` plans them)."""
    if Kind.SKIP in kinds.values() or batch.all_plans or len(set(ids)) != len(ids):
        return False
    plans = list(map(Plan, calls, repeat(Kind.PENDING)))
    batch.plans.update(zip(ids, plans, strict=True))
    batch.all_plans.extend(plans)
    return True


def plan_each(
    batch: Batch,
    calls: list[ToolCall],
    ids: list[str],
    kinds: dict[str, Kind],
    tools: dict[str, Any],
    counters: IdempotencyCounters,
) -> None:
    """``LedgerEngine.add_calls`` call by call: a step that skips some calls (read-only,
    counted, or unknown tools) or repeats a call id."""
    for call, call_id in zip(calls, ids, strict=True):
        name = call["name"]
        plan = Plan(call, kinds[name])
        if plan.kind is Kind.SKIP and name in tools:
            counters.bump("read_only")
        if call_id in batch.plans:
            batch.repeats.setdefault(call_id, deque()).append(plan)
        else:
            batch.plans[call_id] = plan
        batch.all_plans.append(plan)


def distinct_calls(
    pending: list[Plan],
    site: Any,
    position: str | None,
    branch: str | None,
    columns: tuple[list[str], list[str], list[str], list[str]],
) -> list[Plan] | None:
    """``intents.key_calls``' loop for a step of ``"tool_call"``-policy calls when no two
    of them share a key (no follower) nor, with a fork point (``position``), a tool and
    arguments (each takes its slot's first occurrence): every call a leader, its intent
    from the step's columns (``ids``, canonical ``texts``, ``digests``, ``keys``), each
    plan keeping the class's ``"tool_call"`` policy. None otherwise: the loop decides."""
    ids, texts, digests, keys = columns
    n = len(pending)
    names = list(map(_NAME, map(_CALL, pending)))
    if len(set(keys)) != n:
        return None
    if position is not None and len(set(zip(names, digests, strict=True))) != n:
        return None
    intents = CallIntent._of_columns(
        {
            "scope": repeat(site.scope), "key": keys, "thread_id": repeat(site.thread_id),
            "agent_path": repeat(site.agent_path), "tool_name": names, "args_hash": digests,
            "args": map(str.encode, texts), "tool_call_id": ids, "run_id": repeat(site.run_id),
            "position": repeat(position), "branch": repeat(branch), "occurrence": repeat(0),
        },
        n,
    )  # fmt: skip
    set_each(pending, "intent", intents)
    return list(pending)


def all_claimed(plans: Sequence[Plan], outcomes: Sequence[ClaimOutcome]) -> bool:
    """``LedgerEngine.aclaimed`` when the claim inserted every row (a fresh step): each
    plan its entry, ``RUN`` and owned. False, nothing set, when some row was refused."""
    if len(outcomes) != len(plans):
        raise ValueError(f"{len(outcomes)} claim outcomes for {len(plans)} calls")
    if list(map(_CLAIMED, outcomes)).count(True) != len(plans):
        return False
    entries = list(map(_ENTRY, outcomes))
    set_each(plans, "entry", entries)
    set_each(plans, "ledger_key", map(_KEY, entries))
    set_each(plans, "kind", repeat(Kind.RUN))
    set_each(plans, "owned", repeat(True))
    return True


def all_recorded(plans: Sequence[Plan], errors: Sequence[Exception | None]) -> bool:
    """``step_writes.await_step_writes`` for a batch whose every outcome was committed:
    no plan owns its claim any more (as ``LedgerEngine.recorded``). False, nothing
    set, when a row has an error."""
    if len(errors) != len(plans) or errors.count(None) != len(plans):
        return False
    set_each(plans, "owned", repeat(False))
    return True
