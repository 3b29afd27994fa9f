"""``with_allowlist`` returns a shallow copy (LangGraph calls it when compiling a graph
with registered types): the copy must share the connection, the ledger and the setup."""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.ledger import CallIntent
from langgraph_idem_saver.owners import make_owner


async def test_the_allowlisted_copy_shares_storage_and_ledger(saver: Any) -> None:
    # strict msgpack (as under LANGGRAPH_STRICT_MSGPACK): adding types makes a copy
    saver.serde = JsonPlusSerializer(allowed_msgpack_modules=None)
    clone = saver.with_allowlist([("my_app.models", "Invoice")])
    assert clone is not saver and clone.serde is not saver.serde
    assert clone.conn is saver.conn
    config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"x": [1, 2]}
    checkpoint["channel_versions"] = {"x": clone.get_next_version(None, None)}
    stored = await clone.aput(
        config, checkpoint, {"source": "input"}, checkpoint["channel_versions"]
    )
    seen = await saver.aget_tuple(stored)
    assert seen is not None and seen.checkpoint["channel_values"] == {"x": [1, 2]}

    intent = CallIntent("t", "k", "t", "tools", "charge", "h", b"{}", "call_1")
    [claim] = await clone.aclaim([intent], owner=make_owner(), lease_seconds=60)
    assert claim.claimed
    [again] = await saver.aclaim([intent], owner=make_owner(), lease_seconds=60)
    assert not again.claimed, "one ledger: the original sees the copy's claim"
