"""A step's keys computed at once are the keys computed call by call.

``engine.intents.key_calls`` keys a wide step's calls together (``keys.step_texts``,
``step_hashes``, ``step_tool_call_keys``): one encoder pass a call and the checks for
NULs and lone surrogates once over the step. A call claimed by one release and resumed by
another must find its key, so every text and digest here is compared with the per-call
functions (``canonical_args``, ``storable_call_id``, ``args_hash``, ``builtin_key``,
pinned by ``test_keys_stable.py``), on arguments and ids with quotes, escapes, line
separators, emoji and lone surrogates; and a bad call raises what it raised call by call.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.keys import (
    args_hash,
    builtin_key,
    canonical_args,
    step_hashes,
    step_texts,
    step_tool_call_keys,
    storable_call_id,
)

PIECES = ["a", "Zoë", '"q"', "\\", "\n", "\u2028", "\U0001f600", "\x7f", "\u00e9", "/", "\t"]
SURROGATES = ["\ud800", "\udfff", "x\ud83d"]


def text(rng: random.Random, odd: bool) -> str:
    pieces = PIECES + (SURROGATES if odd else [])
    return "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 6)))


def value(rng: random.Random, odd: bool, depth: int = 0) -> Any:
    kind = rng.randrange(6 if depth < 3 else 4)
    if kind == 0:
        return text(rng, odd)
    if kind == 1:
        return rng.choice([0, -7, 12.5, 1e300, True, False, None])
    if kind == 2:
        return rng.randrange(-(10**20), 10**20)
    if kind == 3:
        return {}
    if kind == 4:
        return [value(rng, odd, depth + 1) for _ in range(rng.randrange(4))]
    return {text(rng, odd): value(rng, odd, depth + 1) for _ in range(rng.randrange(4))}


def calls_of(rng: random.Random, odd_args: bool, n: int) -> list[dict[str, Any]]:
    return [
        {
            "name": "send",
            "args": {"to": value(rng, odd_args), "n": i},
            "id": f"c{i}{text(rng, False)}",
        }
        for i in range(n)
    ]


@pytest.mark.parametrize("odd_args", [False, True], ids=["utf8", "lone-surrogates"])
@pytest.mark.parametrize("seed", range(20))
def test_a_steps_texts_hashes_and_keys_are_those_of_each_call(seed: int, odd_args: bool) -> None:
    rng = random.Random(seed)
    calls = calls_of(rng, odd_args, rng.randrange(1, 12))
    ids, texts = step_texts(calls)
    assert ids == [storable_call_id(str(c["id"]), c["name"]) for c in calls]
    assert texts == [canonical_args(c["args"]) for c in calls]
    assert step_hashes(texts) == [args_hash(t) for t in texts]
    for agent_path in ("", "tools", 'sup|re\u2028s "x"', "a\ud800b"):
        messages = [rng.choice(["", "m-1", "ai-\U0001f600", 'q"\\', "\udc00"]) for _ in calls]
        one_by_one = [
            builtin_key(
                "tool_call",
                agent_path=agent_path,
                tool_call_id=i,
                message_id=m,
                tool_name="send",
                canonical=t,
            )
            for i, t, m in zip(ids, texts, messages, strict=True)
        ]
        assert step_tool_call_keys(agent_path, ids, messages) == one_by_one


def error_of(fn: Any, *args: Any, **kwargs: Any) -> str:
    with pytest.raises(SerializationError) as caught:
        fn(*args, **kwargs)
    return str(caught.value)


circular: dict[str, Any] = {"a": 1}
circular["self"] = circular


@pytest.mark.parametrize(
    "bad",
    [
        {"name": "send", "args": {"x": float("nan")}, "id": "c-nan"},
        {"name": "send", "args": {"x": object()}, "id": "c-object"},
        {"name": "send", "args": circular, "id": "c-circular"},
        {"name": "send", "args": {"x": "\ud83d\ude00"}, "id": "c-split-pair"},
        {"name": "send", "args": {}, "id": "c\x00nul"},
        {"name": "send", "args": {}, "id": "c\ud800"},
    ],
    ids=["nan", "object", "circular", "split-pair", "nul-id", "surrogate-id"],
)
def test_a_bad_call_of_a_step_raises_what_it_raises_alone(bad: dict[str, Any]) -> None:
    good = {"name": "send", "args": {"to": "a"}, "id": "c-good"}

    def alone() -> None:
        name, call_id = bad["name"], str(bad["id"])
        canonical_args(bad["args"], tool_name=name, tool_call_id=call_id)
        storable_call_id(call_id, name)

    assert error_of(step_texts, [good, bad, good]) == error_of(alone)
