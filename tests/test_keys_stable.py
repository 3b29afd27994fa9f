"""Ledger keys never change from one release to the next.

A call claimed by one release and resumed by the next (a crash, then an upgrade, then the
resume) must be found under the same key, or it would run again. These are the keys and
texts this release computes for one call under every policy, pinned; a change to how
keys are derived (the JSON of the arguments, the digest's parts) fails here first. The
values were computed when keys were built with ``json.dumps`` per call and are unchanged
by the encoders made once (``a51d8f5``, 2026-11-26).
"""

from __future__ import annotations

from typing import Any

from langgraph_idem_saver.keys import (
    KeyContext,
    args_hash,
    canonical_args,
    compute_key,
    fork_position,
)

ARGS: dict[str, Any] = {
    "to": "Zoë <z@example.com>",
    "amount": 12.5,
    "items": [{"b": 1, "a": None}],
    "note": 'line\u2028break "quoted" \U0001f600',
}
CALL = {"name": "charge", "args": ARGS, "id": "call_0"}
CANONICAL = (
    '{"amount":12.5,"items":[{"a":null,"b":1}],"note":"line\u2028break \\"quoted\\" '
    '\U0001f600","to":"Zoë <z@example.com>"}'
)


def context(message_id: str) -> KeyContext:
    return KeyContext(
        "thread-1", "thread-1", "supervisor|tools", "charge", CANONICAL, args_hash(CANONICAL),
        message_id,
    )  # fmt: skip


def test_canonical_arguments_and_their_hash_are_pinned() -> None:
    assert canonical_args(ARGS) == CANONICAL
    assert args_hash(CANONICAL) == (
        "ffbcc00383d5634937b40d5289cd3b35cc5c9c9e5cfb7c84bf8d5d742c675a8c"
    )


def test_the_key_of_every_policy_is_pinned() -> None:
    assert compute_key("tool_call", CALL, context("ai-msg-7")) == (
        "2098a10976dae7e9a61029cb670d67afb766c748582678957c7e45949f0cf658"
    )
    assert compute_key("tool_call", CALL, context("")) == (
        "587a42f97f22861763123476c58f612a13390ac70ba037fbad88dc5f44728cdf"
    )
    assert compute_key("args", CALL, context("ai-msg-7")) == (
        "cc1ba48ef29e3248ff4a34b4c78f4ca8c9aa692adf1fceb2b7cc37321d4a22e0"
    )
    assert compute_key(lambda call, ctx: "vendor-key-42", CALL, context("ai-msg-7")) == (
        "a2782966137543011f4c8a2dbaef55f631655b8c7c4dfdcc9ff9025686d69de8"
    )


def test_the_fork_position_is_pinned() -> None:
    assert fork_position("thread-1", "parent:abc", "tools", 7) == (
        "6ea217e986ddf214eff05d8533b40383c4c3bda27cca6a52a06f0588209f20aa"
    )


def test_the_engine_s_key_for_built_in_policies_is_compute_key_s() -> None:
    """The engine computes ``"tool_call"``/``"args"`` keys with ``builtin_key`` (no
    ``KeyContext`` built): the very keys pinned above."""
    from langgraph_idem_saver.keys import builtin_key

    for policy in ("tool_call", "args"):
        for message_id in ("ai-msg-7", ""):
            assert builtin_key(
                policy,
                agent_path="supervisor|tools",
                tool_call_id="call_0",
                message_id=message_id,
                tool_name="charge",
                canonical=CANONICAL,
            ) == compute_key(policy, CALL, context(message_id))
