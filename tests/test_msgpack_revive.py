"""The savers' serializer revives stored objects with LangGraph's own hook, the module of
an imported class taken from ``sys.modules`` (``msgpack_revive.py``): the same values,
the same allowlist, and CPython's import for a module not (fully) imported."""

from __future__ import annotations

import copy
import dataclasses
import datetime
import decimal
import enum
import importlib
import logging
import os
import subprocess
import sys
import threading
import types
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy
import ormsgpack
import pydantic.v1
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.serde import _msgpack as _lg_msgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.serde.types import _DeltaSnapshot
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


# --- the rebuilt hook decides as the serializer's own, whatever was rebound since ----------


class Unregistered(BaseModel):  # in no allowlist: allowed with an event by default
    v: int


class OldStyle(pydantic.v1.BaseModel):  # pydantic v1 (EXT_PYDANTIC_V1)
    v: int


def _ext(code: int, *parts: Any) -> bytes:
    """A stored msgpack value that is one extension object (as a crafted row would be)."""
    return ormsgpack.packb(ormsgpack.Ext(code, ormsgpack.packb(parts)))


EXTS: dict[str, tuple[str, bytes]] = {
    "constructor": JsonPlusSerializer().dumps_typed(uuid.UUID(int=9)),
    "pos args": JsonPlusSerializer().dumps_typed(Pair(1, "p")),
    "kw args": JsonPlusSerializer().dumps_typed(Point(1, [2])),
    "method": JsonPlusSerializer().dumps_typed(datetime.datetime(2026, 11, 27)),
    "pydantic v1": JsonPlusSerializer().dumps_typed(OldStyle(v=1)),
    "pydantic v2": JsonPlusSerializer().dumps_typed(Invoice(number=1, lines=[])),
    "unregistered": JsonPlusSerializer().dumps_typed([Unregistered(v=2)]),
    "numpy": JsonPlusSerializer().dumps_typed(numpy.arange(4, dtype="int16")),
    "delta snapshot": JsonPlusSerializer().dumps_typed(_DeltaSnapshot([AIMessage("d", id="d")])),
    "blocked method": ("msgpack", _ext(3, "builtins", "eval", "1 + 1", "__call__")),
    "no such module": ("msgpack", _ext(0, "idem_no_such_module", "X", 1)),
    "no such name": ("msgpack", _ext(2, "uuid", "NoSuchName", {"a": 1})),
    "failing constructor": ("msgpack", _ext(0, "uuid", "UUID", "not a uuid")),
    "unknown code": ("msgpack", _ext(42, "uuid", "UUID", "x")),
}
ALLOWLISTS: dict[str, Any] = {
    "default": {},
    "strict": {"allowed_msgpack_modules": None},
    "listed": {"allowed_msgpack_modules": [Invoice, Unregistered, OldStyle, Point]},
}


def _observed(
    serde: JsonPlusSerializer, stored: tuple[str, bytes], caplog: pytest.LogCaptureFixture
) -> tuple[str, list[Any], list[str]]:
    """What reading ``stored`` gives: the value (its repr: types all the way down), the
    serde events, the warnings (the warn-once sets emptied first, for both readers)."""
    for seen in (
        jsonplus._warned_unregistered_types,
        jsonplus._warned_blocked_types,
        jsonplus._warned_unreconstructable_types,
    ):
        seen.clear()
    events: list[Any] = []
    unregister = register_serde_event_listener(events.append)
    caplog.clear()
    try:
        with caplog.at_level(logging.WARNING, logger=jsonplus.logger.name):
            value = serde.loads_typed(stored)
    finally:
        unregister()
    return repr(value), events, [r.getMessage() for r in caplog.records]


@pytest.mark.parametrize("allowlist", ALLOWLISTS)
@pytest.mark.parametrize("ext", EXTS)
def test_every_extension_reads_as_langgraphs_with_its_events_and_warnings(
    ext: str, allowlist: str, caplog: pytest.LogCaptureFixture
) -> None:
    stock = JsonPlusSerializer(**ALLOWLISTS[allowlist])
    ours = _lossless(JsonPlusSerializer(**ALLOWLISTS[allowlist]))
    stored = EXTS[ext]
    assert _observed(ours, stored, caplog) == _observed(stock, stored, caplog)


def test_strict_mode_from_the_environment_reads_as_langgraphs(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # what LANGGRAPH_STRICT_MSGPACK=true sets when LangGraph's _msgpack is imported
    monkeypatch.setattr(_lg_msgpack, "STRICT_MSGPACK_ENABLED", True)
    stock, ours = JsonPlusSerializer(), _lossless(JsonPlusSerializer())
    assert stock._allowed_msgpack_modules is None  # the control: strict indeed
    for stored in EXTS.values():
        assert _observed(ours, stored, caplog) == _observed(stock, stored, caplog)


def test_names_rebound_in_jsonplus_after_a_read_are_used_by_the_next(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    ours = _lossless(JsonPlusSerializer())
    stock = JsonPlusSerializer()
    stored = EXTS["failing constructor"]
    assert ours.loads_typed(stored) == "not a uuid"  # the fast hook built, its scope taken
    # a fallback and an event function patched in jsonplus (as tests and tracing do)
    fallbacks: list[str] = []

    def fallback(tup: Any, exc: Exception) -> str:
        fallbacks.append(tup[1])
        return "fb"

    monkeypatch.setattr(jsonplus, "_reconstruction_fallback", fallback)
    assert stock.loads_typed(stored) == "fb" and fallbacks == ["UUID"]  # the control
    assert ours.loads_typed(stored) == "fb" and fallbacks == ["UUID", "UUID"]
    events: list[Any] = []
    monkeypatch.setattr(jsonplus, "emit_serde_event", events.append)
    monkeypatch.setattr(jsonplus, "_warned_unregistered_types", set())
    unregistered = EXTS["unregistered"]
    assert _observed(ours, unregistered, caplog) == _observed(stock, unregistered, caplog)
    assert len(events) == 2  # one each: the patched function was called by both
    # someone's own importlib in jsonplus: called for every revival, as by LangGraph's
    imported: list[str] = []

    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        imported.append(name)
        return importlib.import_module(name, package)

    monkeypatch.setattr(jsonplus, "importlib", types.SimpleNamespace(import_module=import_module))
    assert ours.loads_typed(EXTS["constructor"]) == uuid.UUID(int=9)
    assert imported == ["uuid"]


def test_an_allowlist_replaced_on_the_serializer_decides_as_its_hook_does() -> None:
    stored = EXTS["pydantic v2"]
    ours = _lossless(JsonPlusSerializer(allowed_msgpack_modules=None))
    assert ours.loads_typed(stored) == {"number": 1, "lines": []}  # blocked
    # the private attribute replaced, the hook (which holds the allowlist) kept: LangGraph
    # reads with the hook's, and so do we
    ours._allowed_msgpack_modules = {(Invoice.__module__, "Invoice")}
    assert JsonPlusSerializer.loads_typed(ours, stored) == {"number": 1, "lines": []}
    assert ours.loads_typed(stored) == {"number": 1, "lines": []}


def test_relative_or_empty_names_are_refused_as_importlib_refuses_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    odd = types.ModuleType("odd")
    for name, error in ((".idem_dotted", TypeError), ("", ValueError)):
        monkeypatch.setitem(sys.modules, name, odd)
        with pytest.raises(error):
            importlib.import_module(name)  # the control
        with pytest.raises(error):
            msgpack_revive.MODULES.import_module(name)


def test_a_changed_upstream_hook_fails_the_contract_and_is_used_as_it_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import test_upstream_contracts

    test_upstream_contracts.test_the_reviver_reads_importlib_as_a_jsonplus_global()  # as is

    def changed_factory(allowed_modules: Any) -> Any:
        def ext_hook(code: int, data: bytes) -> Any:  # imports without the global
            from importlib import import_module

            return import_module("uuid").UUID(int=code)

        return ext_hook

    monkeypatch.setattr(jsonplus, "_create_msgpack_ext_hook", changed_factory)
    assert not msgpack_revive.available()
    with pytest.raises(AssertionError, match=r"msgpack_revive\.py"):
        test_upstream_contracts.test_the_reviver_reads_importlib_as_a_jsonplus_global()
    serde = _lossless(JsonPlusSerializer())  # its hook from the changed factory
    assert msgpack_revive.fast_hook(serde) is serde._unpack_ext_hook
    assert serde.loads_typed(EXTS["constructor"]) == uuid.UUID(int=0)


def test_an_encrypted_serializers_inner_one_revives_through_the_fast_hook(
    import_calls: list[str],
) -> None:
    key = b"k" * 16
    stock = EncryptedSerializer.from_pycryptodome_aes(key=key)
    ours = lossless(EncryptedSerializer.from_pycryptodome_aes(key=key))
    assert isinstance(ours, EncryptedSerializer)
    assert type(ours.serde) is LosslessJsonPlusSerializer
    stored = stock.dumps_typed(VALUES[0])
    assert stored[0] == "msgpack+aes"  # encrypted
    assert stock.loads_typed(stored) == VALUES[0]
    assert len(import_calls) == 3  # the control: LangGraph's hook imports each message's
    import_calls.clear()
    assert ours.loads_typed(stored) == VALUES[0]
    assert import_calls == []


def test_threads_reading_while_a_jsonplus_name_is_rebound_read_either_function(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Readers in eight threads while another rebinds ``_reconstruction_fallback`` back
    and forth: each read is the stock answer of one of the two (never an error, never a
    hook half-built)."""
    stored = EXTS["failing constructor"]
    ours = _lossless(JsonPlusSerializer())
    original = jsonplus._reconstruction_fallback

    def other(tup: Any, exc: Exception) -> str:
        return "other"

    answers: list[Any] = []
    errors: list[BaseException] = []
    done = threading.Event()

    def read() -> None:
        try:
            while not done.is_set():
                answers.append(ours.loads_typed(stored))
        except BaseException as exc:  # reported below
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(8)]
    for reader in readers:
        reader.start()
    try:
        for flip in range(400):
            monkeypatch.setattr(
                jsonplus, "_reconstruction_fallback", other if flip % 2 else original
            )
    finally:
        done.set()
        for reader in readers:
            reader.join(30)
    assert errors == [] and answers
    assert set(answers) <= {"not a uuid", "other"}


def test_a_module_without_a_spec_is_taken_as_importlib_takes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bare = types.ModuleType("idem_no_spec")  # as ``__main__`` run as a script: no spec
    bare.__spec__ = None
    monkeypatch.setitem(sys.modules, "idem_no_spec", bare)
    assert importlib.import_module("idem_no_spec") is bare  # the control
    assert msgpack_revive.MODULES.import_module("idem_no_spec") is bare


def test_a_class_read_while_another_thread_imports_its_module_waits_for_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another thread is still running the module's body (the module is in
    ``sys.modules``, its class not defined yet): the read waits for that import, as
    CPython's import makes it wait, and revives the class - not the half module's
    missing name (the raw payload)."""
    gate = types.ModuleType("idem_import_gate")
    gate.started, gate.release = threading.Event(), threading.Event()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "idem_import_gate", gate)
    (tmp_path / "idem_slow_module.py").write_text(
        "import sys\n"
        "gate = sys.modules['idem_import_gate']\n"
        "gate.started.set()\n"
        "assert gate.release.wait(30)\n"
        "class Thing:\n"
        "    def __init__(self, value):\n"
        "        self.value = value\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "idem_slow_module", raising=False)
    stored = ("msgpack", _ext(0, "idem_slow_module", "Thing", 7))
    ours = _lossless(JsonPlusSerializer())
    importer = threading.Thread(target=importlib.import_module, args=("idem_slow_module",))
    importer.start()
    read: list[Any] = []
    reader = threading.Thread(target=lambda: read.append(ours.loads_typed(stored)))
    try:
        assert gate.started.wait(30)  # type: ignore[attr-defined]
        assert "idem_slow_module" in sys.modules  # half imported
        reader.start()
        reader.join(0.3)
        assert reader.is_alive() and read == []  # waiting for the import
    finally:
        gate.release.set()  # type: ignore[attr-defined]
        importer.join(30)
        if reader.ident is not None:
            reader.join(30)
    monkeypatch.delitem(sys.modules, "idem_slow_module")
    assert len(read) == 1 and type(read[0]).__name__ == "Thing" and read[0].value == 7


UPGRADED = """
import sys
from langchain_core.messages import AIMessage
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

real_init = JsonPlusSerializer.__init__

def init(self, *args, **kwargs):  # a LangGraph keeping no '_custom_unpack_ext_hook'
    real_init(self, *args, **kwargs)
    del self._custom_unpack_ext_hook

JsonPlusSerializer.__init__ = init
from langgraph_idem_saver import msgpack_revive
from langgraph_idem_saver.surrogates import lossless

stored = JsonPlusSerializer().dumps_typed([AIMessage("kept", id="k")])
print(msgpack_revive.REVIVES, msgpack_revive.available())
print(lossless(JsonPlusSerializer()).loads_typed(stored)[0].content)
"""


def test_a_langgraph_whose_serializer_keeps_its_hook_elsewhere_reads_as_langgraph() -> None:
    """Checked once at import (no attribute read a call): a serializer without the
    attributes ``fast_hook`` reads leaves the reading to LangGraph's ``loads_typed``,
    instead of an ``AttributeError`` on every read after an upgrade."""
    done = subprocess.run(
        [sys.executable, "-c", UPGRADED], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False", "kept"]


def test_a_serializer_that_has_read_can_still_be_deep_copied() -> None:
    stored = EXTS["pydantic v2"]
    stock, ours = JsonPlusSerializer(), _lossless(JsonPlusSerializer())
    assert ours.loads_typed(stored) == stock.loads_typed(stored)  # the fast hook cached
    assert copy.deepcopy(stock).loads_typed(stored) == stock.loads_typed(stored)  # control
    assert copy.deepcopy(ours).loads_typed(stored) == stock.loads_typed(stored)


STRICT_FROM_ENV = """
from pydantic import BaseModel
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph_idem_saver.surrogates import lossless

class Invoice(BaseModel):  # in __main__, a module without a spec
    number: int

stored = JsonPlusSerializer(allowed_msgpack_modules=True).dumps_typed({"v": Invoice(number=1)})
for serde in (JsonPlusSerializer(), lossless(JsonPlusSerializer())):
    events = []
    unregister = register_serde_event_listener(events.append)
    print(type(serde).__name__, serde._allowed_msgpack_modules, serde.loads_typed(stored), events)
    unregister()
"""


def test_strict_mode_set_in_the_environment_blocks_as_langgraph_does() -> None:
    done = subprocess.run(
        [sys.executable, "-c", STRICT_FROM_ENV],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"},
    )
    assert done.returncode == 0, done.stderr
    stock, ours = done.stdout.splitlines()
    assert stock.startswith("JsonPlusSerializer None {'v': {'number': 1}} [{'kind': 'msgpack_b")
    assert ours == stock.replace("JsonPlusSerializer", "LosslessJsonPlusSerializer", 1)
