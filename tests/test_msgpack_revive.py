"""The savers' serializer revives stored objects with LangGraph's own hook, the module of
an imported class taken from ``sys.modules`` (``msgpack_revive.py``): the same values,
the same allowlist, and CPython's import for a module not (fully) imported."""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import importlib
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Send
from pydantic import BaseModel

from langgraph_idem_saver import msgpack_revive
from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer, lossless


class Color(enum.Enum):
    RED = "red"


@dataclasses.dataclass
class Point:
    x: int
    y: list[int]


class Pair(NamedTuple):
    a: int
    b: str


class Invoice(BaseModel):
    number: int
    lines: list[str]


VALUES: list[Any] = [
    [
        HumanMessage("hi", id="h1"),
        AIMessage(
            "yes",
            id="a1",
            tool_calls=[{"name": "t", "args": {"x": 1}, "id": "c1", "type": "tool_call"}],
            usage_metadata={"input_tokens": 1, "output_tokens": 2, "total_tokens": 3},
        ),
        ToolMessage("done", tool_call_id="c1", id="t1"),
    ],
    {"when": datetime.datetime(2026, 11, 27, 23, 0, tzinfo=datetime.timezone.utc)},
    {"id": uuid.UUID(int=7), "amount": decimal.Decimal("1.10"), "tags": {"a", "b"}},
    [Color.RED, Point(1, [2, 3]), Pair(1, "x"), Invoice(number=3, lines=["l"])],
    [Send("node", {"arg": 1}), datetime.date(2026, 1, 2), datetime.timedelta(seconds=5)],
    {"nested": {"deep": [AIMessage("inner", id="i1")]}},
]


def _lossless(serde: JsonPlusSerializer) -> LosslessJsonPlusSerializer:
    copy = lossless(serde)
    assert type(copy) is LosslessJsonPlusSerializer
    return copy


@pytest.fixture
def import_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The names ``importlib.import_module`` is called with while the test runs."""
    calls: list[str] = []
    real = importlib.import_module

    def counting(name: str, package: str | None = None) -> types.ModuleType:
        calls.append(name)
        return real(name, package)

    monkeypatch.setattr(importlib, "import_module", counting)
    yield calls


@pytest.mark.parametrize("value", VALUES)
def test_the_same_values_and_types_as_langgraphs_serializer(value: Any) -> None:
    stock = JsonPlusSerializer()
    stored = stock.dumps_typed(value)
    assert stored[0] == "msgpack"
    ours = _lossless(JsonPlusSerializer()).loads_typed(stored)
    theirs = stock.loads_typed(stored)
    assert ours == theirs == value
    assert repr(ours) == repr(theirs)  # the same types all the way down


def test_an_imported_module_is_not_imported_again(import_calls: list[str]) -> None:
    stock = JsonPlusSerializer()
    stored = stock.dumps_typed(VALUES[0])
    stock.loads_typed(stored)
    assert len(import_calls) == 3  # the control: LangGraph's hook imports each message's
    import_calls.clear()
    assert _lossless(JsonPlusSerializer()).loads_typed(stored) == VALUES[0]
    assert import_calls == []


def test_a_module_not_imported_or_mid_import_goes_through_importlib(
    import_calls: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    modules = msgpack_revive.MODULES
    monkeypatch.delitem(sys.modules, "json.tool", raising=False)
    assert modules.import_module("json.tool").__name__ == "json.tool"
    assert import_calls == ["json.tool"]
    # another thread still initializing it: CPython's import waits for that thread
    half = types.ModuleType("idem_half_imported")
    half.__spec__ = importlib.machinery.ModuleSpec("idem_half_imported", None)
    half.__spec__._initializing = True  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "idem_half_imported", half)
    assert modules.import_module("idem_half_imported") is half
    assert import_calls[-1] == "idem_half_imported"
    # None in sys.modules (an import halted on purpose) raises as importlib does
    monkeypatch.setitem(sys.modules, "idem_halted", None)
    with pytest.raises(ModuleNotFoundError):
        modules.import_module("idem_halted")
    # relative names and a package: importlib's own answer
    assert modules.import_module(".decoder", "json") is sys.modules["json.decoder"]


def test_the_allowlist_still_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    invoice = Invoice(number=1, lines=["a"])
    stored = JsonPlusSerializer().dumps_typed({"v": invoice})
    strict = _lossless(JsonPlusSerializer(allowed_msgpack_modules=None))
    # blocked: the raw fields come back, as from LangGraph's strict serializer
    blocked = JsonPlusSerializer(allowed_msgpack_modules=None).loads_typed(stored)
    assert strict.loads_typed(stored) == blocked == {"v": {"number": 1, "lines": ["a"]}}
    allowed = strict.with_msgpack_allowlist([Invoice])
    assert allowed is not strict
    assert allowed.loads_typed(stored) == {"v": invoice}  # the copy's own hook
    assert strict.loads_typed(stored) == blocked  # the original's unchanged


def test_a_custom_hook_is_used_as_given() -> None:
    seen: list[int] = []

    def hook(code: int, data: bytes) -> Any:
        seen.append(code)
        return "custom"

    serde = JsonPlusSerializer(__unpack_ext_hook__=hook)
    stored = serde.dumps_typed([AIMessage("x", id="a")])
    assert _lossless(serde).loads_typed(stored) == ["custom"]
    assert seen == [5]  # pydantic v2


def test_a_hook_set_by_hand_is_used_as_it_is() -> None:
    serde = _lossless(JsonPlusSerializer())
    stored = serde.dumps_typed([AIMessage("x", id="a")])
    assert serde.loads_typed(stored) == [AIMessage("x", id="a")]  # the fast hook cached

    def by_hand(code: int, data: bytes) -> Any:
        return "by hand"

    serde._unpack_ext_hook = by_hand  # a private attribute, replaced without the flag
    assert serde.loads_typed(stored) == ["by hand"]
