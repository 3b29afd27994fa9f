"""Copies of decoded values (``value_copies.py``), on their own: a copy equals a fresh
decode of the same bytes in value and in type at every level, shares no object with any
other read, is made only of plain data and LangChain's messages, only on a second sight,
only after the serializer decoded the value without an event, and the copies stay within
their bounds and work from many threads."""

from __future__ import annotations

import datetime
import io
import pickle
import sys
import threading
import uuid
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    HumanMessage,
    RemoveMessage,
    SystemMessage,
    ToolMessage,
)
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.types import Send
from pydantic import BaseModel

from langgraph_idem_saver import value_copies
from langgraph_idem_saver.saver_base import IdemSaverBase
from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer, lossless
from langgraph_idem_saver.value_copies import MIN_BYTES, ValueCopies, copyable

SERDE = IdemSaverBase.serde  # the saver's default: LangGraph's, lossless
PAD = HumanMessage(content="p" * MIN_BYTES, id="pad")  # every value through the copies


def shape(value: Any) -> Any:
    """``value``'s types and contents at every level (messages: their fields, which were
    set, and each field's shape), as comparable data."""
    if isinstance(value, BaseModel):
        fields = {name: shape(getattr(value, name)) for name in type(value).model_fields}
        return (type(value), sorted(value.model_fields_set), fields)
    if type(value) is dict:
        return (dict, [(shape(k), shape(v)) for k, v in value.items()])
    if type(value) in (list, tuple):
        return (type(value), [shape(v) for v in value])
    if type(value) in (set, frozenset):
        return (type(value), sorted(repr(v) for v in value))
    return (type(value), repr(value))


def objects(value: Any, found: set[int] | None = None) -> set[int]:
    """The ids of every mutable object (container, message) ``value`` holds."""
    found = set() if found is None else found
    if isinstance(value, BaseModel):
        found.add(id(value))
        for name in type(value).model_fields:
            objects(getattr(value, name), found)
    elif type(value) is dict:
        found.add(id(value))
        for v in value.values():
            objects(v, found)
    elif type(value) in (list, set, bytearray):
        found.add(id(value))
        for v in value if type(value) is not bytearray else ():
            objects(v, found)
    elif type(value) is tuple:
        for v in value:
            objects(v, found)
    return found


def read_three_times(copies: ValueCopies, serde: Any, stored: tuple[str, bytes]) -> list[Any]:
    reader = copies.reader(serde)
    return [reader.loads_typed(stored) for _ in range(3)]


def read_four_times(copies: ValueCopies, serde: Any, stored: tuple[str, bytes]) -> list[Any]:
    return [*read_three_times(copies, serde, stored), copies.reader(serde).loads_typed(stored)]


# --- values -----------------------------------------------------------------------------

LONE = st.sampled_from(["", "\ud800", "a\udfffb", "é😀", "\x00"])
TEXT = st.builds(lambda a, b: a + b, st.text(max_size=12), LONE)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False)
    | TEXT
    | st.binary(max_size=8)
)
JSONISH = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(TEXT, inner, max_size=3),
    max_leaves=8,
)
ARGS = st.dictionaries(st.text(min_size=1, max_size=6), JSONISH, max_size=3)
CONTENT = TEXT | st.lists(
    st.builds(lambda t: {"type": "text", "text": t}, TEXT) | st.just("plain"), max_size=3
)
IDS = st.text(min_size=1, max_size=8)
TOOL_CALLS = st.lists(
    st.builds(lambda n, a, i: {"name": n, "args": a, "id": i, "type": "tool_call"}, IDS, ARGS, IDS),
    max_size=2,
)
USAGE = st.none() | st.builds(
    lambda i, o: {"input_tokens": i, "output_tokens": o, "total_tokens": i + o},
    st.integers(0, 10**6),
    st.integers(0, 10**6),
)
MESSAGES = st.one_of(
    st.builds(
        lambda c, i, t, u, a, r: AIMessage(
            content=c,
            id=i,
            tool_calls=t,
            usage_metadata=u,
            additional_kwargs=a,
            response_metadata=r,
        ),
        CONTENT,
        IDS,
        TOOL_CALLS,
        USAGE,
        ARGS,
        ARGS,
    ),
    st.builds(
        lambda c, i, n: HumanMessage(content=c, id=i, name=n),
        CONTENT,
        st.none() | IDS,
        st.none() | TEXT,
    ),
    st.builds(
        lambda c, i, a, s: ToolMessage(content=c, tool_call_id=i, artifact=a, status=s),
        CONTENT,
        IDS,
        JSONISH,
        st.sampled_from(["success", "error"]),
    ),
    st.builds(lambda c: SystemMessage(content=c), CONTENT),
    st.builds(lambda c, i: AIMessageChunk(content=c, id=i), TEXT, IDS),
    st.builds(lambda i: RemoveMessage(id=i), IDS),
)
VALUES = st.one_of(
    st.lists(MESSAGES, max_size=5).map(lambda m: [*m, PAD]),
    st.dictionaries(TEXT, JSONISH | MESSAGES, max_size=4).map(lambda d: {**d, "pad": PAD}),
    st.tuples(JSONISH, MESSAGES).map(lambda t: [*t, "p" * MIN_BYTES]),
)


@given(VALUES)
def test_a_copy_is_a_fresh_decode_in_value_and_type_and_shares_nothing(value: Any) -> None:
    stored = SERDE.dumps_typed(value)
    fresh = SERDE.loads_typed(stored)
    copies = ValueCopies()
    reads = read_four_times(copies, SERDE, stored)
    assert copies.counts["first"] == 1 and copies.counts["copied"] == 1
    assert copies.counts["hits"] == 2  # the third and fourth reads: copies
    for got in reads:
        assert got == fresh
        assert shape(got) == shape(fresh)
    seen = [objects(got) for got in [fresh, *reads]]
    for i, mine in enumerate(seen):
        for other in seen[i + 1 :]:
            assert not mine & other, "two reads share an object"


def test_reducer_override_sees_only_messages_and_their_classes() -> None:
    """Why the check costs little: CPython's pickler asks ``reducer_override`` about
    objects that are not exact builtins only - a message, and its class once a pickle."""
    seen: list[Any] = []

    class Recording(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            seen.append(obj)
            return NotImplemented

    a = AIMessage(content="x", tool_calls=[{"name": "t", "args": {"q": [1]}, "id": "c"}])
    b = AIMessage(content=[{"type": "text", "text": "y"}], id="b")
    value = {"m": [a, b], "n": (1, 2.0, None, True, b"x", "s", {3}, frozenset({4}))}
    Recording(io.BytesIO(), protocol=pickle.HIGHEST_PROTOCOL).dump(value)
    assert [type(o) if not isinstance(o, type) else o for o in seen] == [
        AIMessage,
        AIMessage,  # the class, saved once (then memoized)
        AIMessage,
    ]
    assert seen[1] is AIMessage


@pytest.mark.parametrize(
    "outside",
    [
        datetime.datetime(2026, 11, 28, tzinfo=datetime.timezone.utc),
        uuid.UUID(int=7),
        Send("node", {"x": 1}),
    ],
    ids=["datetime", "uuid", "send"],
)
def test_values_outside_plain_data_and_messages_are_never_copied(
    outside: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    pickled = count_pickling(monkeypatch)
    stored = SERDE.dumps_typed([PAD, {"inside": [outside]}])
    copies = ValueCopies()
    reader = copies.reader(SERDE)
    reads = [reader.loads_typed(stored) for _ in range(6)]
    assert all(r == SERDE.loads_typed(stored) for r in reads)
    assert copies.counts["copied"] == copies.counts["hits"] == 0
    assert copies.counts["refused"] == 1  # tried once, on the second sight, never again
    assert pickled == [1]
    assert copyable(outside) is None
    assert copyable(AIMessage("m")) is not None


class Custom(BaseModel):
    name: str


@pytest.mark.parametrize("variant", ["langgraph", "lossless"])
def test_a_value_whose_decode_emits_an_event_goes_through_the_serializer_every_time(
    variant: str,
) -> None:
    """A type strict mode blocks decodes to its raw data (plain data) with an event; every
    read keeps its event: such a value is never copied (LangGraph's serializer, and the
    saver's lossless variant of it, whose reviver is rebuilt from LangGraph's hook)."""
    events: list[Any] = []
    unregister = register_serde_event_listener(events.append)
    try:
        strict: Any = JsonPlusSerializer(allowed_msgpack_modules=None)
        if variant == "lossless":
            strict = lossless(strict)
            assert type(strict) is LosslessJsonPlusSerializer
        stored = strict.dumps_typed([Custom(name="n" * MIN_BYTES)])
        copies = ValueCopies()
        reader = copies.reader(strict)
        reads = [reader.loads_typed(stored) for _ in range(4)]
    finally:
        unregister()
    assert reads == [[{"name": "n" * MIN_BYTES}]] * 4
    assert [e["kind"] for e in events] == ["msgpack_blocked"] * 4
    assert copies.counts["copied"] == copies.counts["hits"] == 0


def count_pickling(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls = [0]
    original = value_copies.copyable

    def counted(value: Any) -> bytes | None:
        calls[0] += 1
        return original(value)

    monkeypatch.setattr(value_copies, "copyable", counted)
    return calls


def test_a_read_once_pattern_pickles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    pickled = count_pickling(monkeypatch)
    copies = ValueCopies()
    reader = copies.reader(SERDE)
    for i in range(50):
        stored = SERDE.dumps_typed([PAD, AIMessage(content=f"only once {i}", id=str(i))])
        reader.loads_typed(stored)
    assert pickled == [0]
    assert copies.counts["first"] == 50 and copies.size == (0, 0)


def test_copies_stay_within_their_bounds() -> None:
    copies = ValueCopies(
        entries=4, total_bytes=40_000, entry_bytes=20_000, seen=8, seen_bytes=9_000
    )
    reader = copies.reader(SERDE)
    for i in range(20):
        stored = SERDE.dumps_typed([PAD, AIMessage(content=f"value {i} " * 50)])
        for _ in range(3):
            reader.loads_typed(stored)
        held, size = copies.size
        assert held <= 4 and size <= 40_000
        assert copies.seen_size <= 8
    assert copies.counts["copied"] == 20
    big = SERDE.dumps_typed([AIMessage(content="x" * 30_000)])
    assert [reader.loads_typed(big) for _ in range(3)] == [SERDE.loads_typed(big)] * 3
    assert copies.counts["copied"] == 20  # over seen_bytes: not even remembered
    assert copies.counts["refused"] == 0
    copies.clear()
    assert copies.size == (0, 0)


def test_values_in_one_bucket_are_told_apart_by_their_bytes() -> None:
    """Two values of the same length, equal where the bucket looks, differing elsewhere:
    each gets its own copy in turn, never the other's value."""
    one = SERDE.dumps_typed([PAD, "x" * 2000])
    n = len(one[1])
    looked_at = {n >> 2, n // 3, n >> 1, (2 * n) // 3, (3 * n) >> 2, n - 40, n - 9}
    j = next(i for i in range(n - 100, 0, -1) if i not in looked_at and one[1][i] == 120)
    other = (one[0], one[1][:j] + b"y" + one[1][j + 1 :])
    assert SERDE.loads_typed(other) != SERDE.loads_typed(one)
    copies = ValueCopies()
    reader = copies.reader(SERDE)
    assert read_three_times(copies, SERDE, one) == [SERDE.loads_typed(one)] * 3
    assert [reader.loads_typed(other) for _ in range(3)] == [SERDE.loads_typed(other)] * 3
    assert [reader.loads_typed(one) for _ in range(3)] == [SERDE.loads_typed(one)] * 3
    # each value got its copy in turn (its second sight replaced the other's)
    assert copies.counts["copied"] == 3 and copies.counts["hits"] == 3


def test_values_without_a_message_are_not_considered() -> None:
    """Plain data decodes at C speed: no first sight recorded, no copy, however often."""
    stored = SERDE.dumps_typed({"plain": ["p" * MIN_BYTES, 1, 2.5, None]})
    copies = ValueCopies()
    assert read_four_times(copies, SERDE, stored) == [SERDE.loads_typed(stored)] * 4
    assert copies.counts == {"first": 0, "copied": 0, "hits": 0, "refused": 0, "again": 0}


def test_copies_answer_only_the_serializer_object_that_decoded_them() -> None:
    """An encrypting serializer: its ciphertext is the key, and a serializer swapped in
    (another key) starts with no copies - it decodes, and here refuses, on its own."""
    sealed = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    other = EncryptedSerializer.from_pycryptodome_aes(key=b"fedcba9876543210")
    value = [PAD, AIMessage(content="secret", id="s")]
    stored = sealed.dumps_typed(value)
    assert "+" in stored[0]
    copies = ValueCopies()
    assert read_three_times(copies, sealed, stored) == [value] * 3
    assert copies.counts["hits"] == 1
    with pytest.raises(ValueError):  # not a copy of what the other key decoded
        copies.reader(other).loads_typed(stored)
    assert copies.counts["hits"] == 1


def test_only_langgraphs_serializer_and_its_msgpack_formats_are_copied() -> None:
    class Own:
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            return "own", pickle.dumps(obj)

        def loads_typed(self, data: tuple[str, bytes]) -> Any:
            return pickle.loads(data[1])

    copies = ValueCopies()
    own = Own()
    assert copies.reader(own) is own
    json_typed = ("json", b'{"a": "' + b"x" * MIN_BYTES + b'"}')
    reads = read_three_times(copies, JsonPlusSerializer(), json_typed)
    assert reads == [{"a": "x" * MIN_BYTES}] * 3 and copies.counts["first"] == 0


def test_a_rebinding_of_langgraphs_safe_types_drops_every_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stored = SERDE.dumps_typed([PAD, AIMessage(content="m", id="m")])
    copies = ValueCopies()
    read_three_times(copies, SERDE, stored)
    assert copies.counts["hits"] == 1
    without = frozenset(k for k in lg_msgpack.SAFE_MSGPACK_TYPES if k[1] != "AIMessage")
    monkeypatch.setattr(lg_msgpack, "SAFE_MSGPACK_TYPES", without)
    events: list[Any] = []
    unregister = register_serde_event_listener(events.append)
    try:
        read_three_times(copies, SERDE, stored)
    finally:
        unregister()
    assert copies.counts["hits"] == 1  # the serializer decoded each read again
    assert len(events) == 3  # its event on each (AIMessage no longer listed as safe)


def test_many_threads_read_through_one_copies() -> None:
    values = [[PAD, AIMessage(content=f"thread value {i}", id=str(i))] for i in range(6)]
    stored = [SERDE.dumps_typed(v) for v in values]
    copies = ValueCopies(entries=4)  # fewer than the values: evictions while reading
    reader = copies.reader(SERDE)
    failures: list[BaseException] = []
    start = threading.Barrier(8)

    def work(seed: int) -> None:
        try:
            start.wait()
            kept: list[Any] = []
            for n in range(300):
                i = (seed + n) % len(values)
                got = reader.loads_typed(stored[i])
                assert got == values[i]
                assert all(got[1] is not k[1] for k in kept)
                kept = [*kept[-3:], got]
        except BaseException as exc:  # reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert copies.counts["hits"] > 0
    assert copies.size[0] <= 4


def test_the_message_classes_are_langchain_cores_safe_ones() -> None:
    allowed = value_copies._current().messages
    assert {AIMessage, HumanMessage, ToolMessage, SystemMessage, RemoveMessage} <= allowed
    assert all(issubclass(c, BaseMessage) for c in allowed)
    assert all(c.__module__.startswith("langchain_core.messages.") for c in allowed)


class Late(BaseModel):
    """A type whose module is not importable when a value is first read."""

    name: str


LATE_MODULE = "value_copies_late_plugin"
Late.__module__ = LATE_MODULE


@pytest.mark.parametrize("variant", ["langgraph", "lossless", "encrypted"])
def test_a_value_the_reviver_could_not_rebuild_is_never_copied(
    variant: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An allowed type whose module cannot be imported yet decodes, without an event, to
    its raw data (LangGraph's reconstruction fallback); once importable, the serializer
    rebuilds the object. A copy of the fallback would keep answering the raw data: such a
    value (any object of a type LangGraph does not list as safe) is never copied."""
    module = ModuleType(LATE_MODULE)
    module.Late = Late  # type: ignore[attr-defined]
    allowed: Any = JsonPlusSerializer(allowed_msgpack_modules=[(LATE_MODULE, "Late")])
    if variant != "langgraph":
        allowed = lossless(allowed)
    if variant == "encrypted":
        allowed = EncryptedSerializer.from_pycryptodome_aes(allowed, key=b"0123456789abcdef")
    monkeypatch.setitem(sys.modules, LATE_MODULE, module)
    stored = allowed.dumps_typed([PAD, Late(name="n")])
    del sys.modules[LATE_MODULE]  # not importable: the fallback
    events: list[Any] = []
    unregister = register_serde_event_listener(events.append)
    copies = ValueCopies()
    try:
        early = read_four_times(copies, allowed, stored)
    finally:
        unregister()
    assert events == [] and [r[1] for r in early] == [{"name": "n"}] * 4
    monkeypatch.setitem(sys.modules, LATE_MODULE, module)  # importable now
    assert copies.reader(allowed).loads_typed(stored) == allowed.loads_typed(stored)
    assert type(copies.reader(allowed).loads_typed(stored)[1]) is Late
    assert copies.counts["copied"] == copies.counts["hits"] == 0


def test_an_event_on_another_thread_does_not_stop_a_copy() -> None:
    """The "no event" check counts the events of the decoding thread only: another
    thread's event (a blocked type it decodes meanwhile) is not this value's."""
    stored = SERDE.dumps_typed([PAD, AIMessage(content="mine", id="m")])
    copies = ValueCopies()
    reader = copies.reader(SERDE)
    assert isinstance(reader, value_copies._Reader)
    decode = reader.loads
    strict: Any = JsonPlusSerializer(allowed_msgpack_modules=None)
    blocked = strict.dumps_typed([Custom(name="c")])

    def decode_while_another_thread_emits(data: tuple[str, bytes]) -> Any:
        value = decode(data)
        other = threading.Thread(target=strict.loads_typed, args=(blocked,))
        other.start()  # its event, during this decode
        other.join()
        return value

    reader.loads = decode_while_another_thread_emits
    assert read_four_times(copies, SERDE, stored) == [SERDE.loads_typed(stored)] * 4
    assert copies.counts["copied"] == 1 and copies.counts["hits"] == 2


def state(value: Any) -> Any:
    """Everything pickle or a reader could lose: each model's ``__dict__``, fields set,
    extra fields and private attributes, exact types, order, and nan/-0.0 as such."""
    if isinstance(value, BaseModel):
        return (
            type(value),
            state(value.__dict__),
            sorted(value.__pydantic_fields_set__),
            state(value.__pydantic_extra__),
            state(value.__pydantic_private__),
        )
    if type(value) is dict:
        return (dict, [(state(k), state(v)) for k, v in value.items()])
    if type(value) in (list, tuple):
        return (type(value), [state(v) for v in value])
    if type(value) in (set, frozenset):
        return (type(value), sorted(map(repr, value)))
    return (type(value), repr(value))


EDGES = {
    "extra fields": (AIMessage(content="x", extra_a={"a": [1]}, extra_b=(1, 2)), True),
    "chunk": (
        AIMessageChunk(
            content="x",
            tool_call_chunks=[
                {"name": "t", "args": '{"a"', "id": "1", "index": 0, "type": "tool_call_chunk"}
            ],
        ),
        True,
    ),
    "artifact": (
        ToolMessage(
            content="x",
            tool_call_id="1",
            artifact={"t": (1, 2), "b": b"\x00", "nan": float("nan"), "neg": -0.0},
        ),
        True,
    ),
    "int and bool keys": (
        HumanMessage(content="x", additional_kwargs={"a": True, "b": 1, 1: "k", 2.5: None}),
        True,
    ),
    "content blocks": (
        AIMessage(content=[{"type": "text", "text": "t", "annotations": []}, "plain"]),
        True,
    ),
    "a datetime in additional_kwargs": (
        AIMessage(content="x", additional_kwargs={"at": datetime.date(2026, 11, 28)}),
        False,
    ),
    "a UUID as an extra field": (AIMessage(content="x", run=uuid.UUID(int=1)), False),
    "an object as artifact": (
        ToolMessage(content="x", tool_call_id="1", artifact=Send("n", 1)),
        False,
    ),
}


@pytest.mark.parametrize("serde_name", ["langgraph", "lossless"])
@pytest.mark.parametrize("edge", list(EDGES))
def test_edge_values_are_faithful_copies_or_refused(serde_name: str, edge: str) -> None:
    message, copied = EDGES[edge]
    serde: Any = JsonPlusSerializer() if serde_name == "langgraph" else SERDE
    stored = serde.dumps_typed([PAD, message, {"k": (1, [2])}])
    expected = state(serde.loads_typed(stored))
    copies = ValueCopies()
    reads = read_four_times(copies, serde, stored)
    assert [state(r) for r in reads] == [expected] * 4
    assert copies.counts["hits"] == (2 if copied else 0)


def test_a_cipher_replaced_on_the_serializer_answers_for_itself() -> None:
    """An ``EncryptedSerializer`` whose ``cipher`` is replaced in place (a rotated key):
    the serializer can no longer read the old ciphertext, and neither can its copies."""
    sealed = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    stored = sealed.dumps_typed([PAD, AIMessage(content="secret", id="s")])
    copies = ValueCopies()
    read_three_times(copies, sealed, stored)
    assert copies.counts["hits"] == 1
    sealed.cipher = EncryptedSerializer.from_pycryptodome_aes(key=b"fedcba9876543210").cipher
    with pytest.raises(ValueError):
        sealed.loads_typed(stored)
    with pytest.raises(ValueError):
        copies.reader(sealed).loads_typed(stored)
    assert copies.counts["hits"] == 1
