"""A model call's input digest is part of its record's key: it must not change between
versions, or a record written before an upgrade would not be found after it, and a
re-run step would ask the model again.

The digests below were computed by the package before ``plain`` took its fast path for
exact JSON types (at ``8d6c57e``); inputs that go through every branch of ``plain``
(messages with odd ``additional_kwargs``, bytes, sets, tuples, NaN and infinity, non-text
keys, enums, a ``str`` subclass, dataclasses, pydantic models and classes, a tool and a
tool dict, callables and types, plain objects, nesting past the depth limit, a lone
surrogate) must keep them.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.tools import tool
from pydantic import BaseModel

from langgraph_idem_saver.model_record import input_digest


@tool
def charge(invoice: str, amount: float = 1.0) -> str:
    """Charge an invoice."""
    return invoice


class Fmt(BaseModel):
    answer: str
    score: float = 0.5


@dataclasses.dataclass
class Opt:
    k: int
    tags: tuple[int, ...]


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Text(str):
    pass


# named by a module of their own: the digests do not depend on how pytest imports this file
for kind in (Fmt, Opt, Color, Level, Text):
    kind.__module__ = "digest_corpus"


def deep() -> dict[str, Any]:
    value: dict[str, Any] = {"a": 1}
    for _ in range(30):
        value = {"n": [value]}
    return value


def corpus() -> list[dict[str, Any]]:
    call = {"name": "charge", "args": {"invoice": "inv-1", "amount": 2.5}, "id": "c1"}
    odd: dict[Any, Any] = {"k": (1, 2), "b": b"\x00\xff", "s": {3, 1}, 7: "int key"}
    odd |= {None: "none key", True: "t"}
    messages = [
        SystemMessage("be brief", id="s"),
        HumanMessage("pay inv-1", id="h1"),
        AIMessage("", id="a1", tool_calls=[{**call, "type": "tool_call"}], additional_kwargs=odd),
        ToolMessage(
            "charged", tool_call_id="c1", id="t1", artifact={"x": float("nan"), "y": float("inf")}
        ),
        HumanMessage([{"type": "text", "text": "\u00fcn\u00ef \ud800"}], id="h2"),
    ]
    settings = {"temperature": 0.2, "stop": ("a", "b"), "opt": Opt(1, (2, 3))}
    settings |= {"color": Color.RED, "level": Level.HIGH, "s": Text("sub")}
    return [
        {
            "messages": messages,
            "tools": [charge],
            "tool_choice": "auto",
            "response_format": Fmt,
            "settings": settings,
            "model": {"class": "x", "params": {}},
        },
        {
            "messages": messages[:2],
            "tools": [],
            "tool_choice": None,
            "response_format": Fmt(answer="a"),
            "settings": deep(),
            "model": None,
        },
        {
            "messages": [HumanMessage("x")],
            "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
            "fn": len,
            "t": int,
            "o": object(),
        },
    ]


BEFORE = [
    "9e29e0ded3b2b937140e9b8c26ad2bbf6a1a20204edd8bf9a8c45d98027e5ee1",
    "26829799824b8c7774eafdf24ab291baf2cae9c0b61b6d6af5bc21174cc9bfa2",
    "558f2fa3526d0805ef5343c9264717d53b115d392751d0f2b445514070344818",
]


def test_input_digests_are_those_earlier_versions_wrote() -> None:
    assert [input_digest(parts) for parts in corpus()] == BEFORE


def test_the_digest_still_tells_inputs_apart() -> None:
    """The control: the corpus's inputs, each changed in one leaf, digest otherwise."""
    first = corpus()[0]
    changed = [
        {**first, "settings": {**first["settings"], "temperature": 0.3}},
        {**first, "settings": {**first["settings"], "s": Text("sub2")}},
        {**first, "messages": [*first["messages"][:-1], HumanMessage("other", id="h2")]},
        {**first, "tools": []},
    ]
    assert len({input_digest(parts) for parts in changed} | {BEFORE[0]}) == len(changed) + 1
