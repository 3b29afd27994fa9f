"""A failed call's error text that no database can hold - a lone surrogate (a tool's error
echoing a model's arguments can carry one) - is a typed ``SerializationError`` on both
backends, and the call stays ``issued`` (an unknown outcome, surfaced at the next run),
never a raw ``UnicodeEncodeError`` and never a silently changed text."""

from __future__ import annotations

from typing import Any

import pytest

from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome


def intent(i: int) -> CallIntent:
    return CallIntent(
        scope="t",
        key=f"k{i}",
        thread_id="t",
        agent_path="tools",
        tool_name="send",
        args_hash=f"h{i}",
        args=b"{}",
        tool_call_id=f"c{i}",
    )


@pytest.mark.parametrize("field", ["error", "result"])
async def test_a_lone_surrogate_in_an_outcome_is_typed_and_leaves_the_call_issued(
    saver: Any, field: str
) -> None:
    await saver.aclaim([intent(0)], owner="me", lease_seconds=60)
    text = "bad \ud800 news"
    if field == "error":
        outcome = Outcome.failed(text, "bytes", b"x")
    else:
        outcome = Outcome.completed(text, b"x")  # the result's type name is text too
    with pytest.raises(SerializationError):
        await saver.record_outcome("t", "k0", owner="me", outcome=outcome)
    [entry] = await saver.alist_entries("t")
    assert entry.status is CallStatus.ISSUED and entry.error is None
