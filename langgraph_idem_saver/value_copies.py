"""Copies of values decoded before: a stored value read again is rebuilt by ``pickle.loads``
of a copy kept in memory instead of by the serializer.

Why: decoding a stored value (LangGraph's ``JsonPlusSerializer`` reviving pydantic
messages) is ~85% of a read, and reads decode the same stored bytes again and again. In a
page of ``alist`` over a list re-versioned without growing, every row's list is a delta of
the same base row; ``get_tuple`` of the same checkpoint (``graph.get_state`` polling, a
server, each resumed ``invoke`` reading a growing list's base) decodes the same bytes each
time. A pickle of the decoded value loads ~4x faster than the serializer decodes it (20
messages: 69 against 289 µs, benchmarks/README.md), equal values, fresh objects at every
level, each message's ``__pydantic_fields_set__`` the same.

Decisions (each pinned in ``tests/test_value_copies*.py``):

* **The serializer decides first, always.** A value is copied only after LangGraph's
  serializer decoded it (its allowlist, strict mode, events and warnings are its own), and
  only when that decode emitted no serde event (``register_serde_event_listener``, the
  public hook: a type strict mode blocked decodes to its raw data, which must go through
  the serializer and its event on every read). Only LangGraph's ``JsonPlusSerializer``
  (or ours, its lossless variant; either inside an ``EncryptedSerializer``) built without
  a custom ext hook, and only its msgpack formats, are cached: another serializer's
  decoding may do anything, and its own reads stay its own.
* **Security: pickles are made here, from those values, and never leave the process.**
  They are never stored in or read from a database; ``pickle.loads`` only ever reads bytes
  this module's pickler wrote a moment before from a value it checked.
* **Plain data and LangChain messages only.** The pickler's ``reducer_override`` refuses
  every object that is not ``dict``/``list``/``tuple``/``set``/``frozenset``/``str``/
  ``int``/``float``/``bool``/``None``/``bytes``/``bytearray`` (exact types) or an exact
  instance of one of ``langchain_core.messages``' ``BaseMessage`` classes that LangGraph
  lists as safe (``SAFE_MSGPACK_TYPES``), or such a class itself. CPython's C pickler
  calls it only for objects outside those builtins (a message and, once a pickle, its
  class): the check runs at C speed. Anything refused is decoded by the serializer on
  every read, and its fingerprint is remembered as refused so it is not tried again.
* **No cost on read-once patterns: a copy is made on second sight.** The first decode of
  some bytes only remembers them - the bytes object read (a reference, not a copy) under
  a fingerprint of its type tag, length, 48 bytes of its middle and its last 48 (~1 µs; a full hash
  of a 20 KB value is ~6 µs, 2% of its decode). A second sight is those very bytes again
  (compared in full, so a fingerprint shared by other bytes is a first sight of those):
  it decodes and pickles (+~60 µs, once); the third sight on is a copy. A read that sees
  every value once (a cold read, an export) pickles nothing. Values under ``MIN_BYTES``
  are not considered (decoded in a few µs: a copy saves nothing). Measured against the
  page's multiplicity (a base its rows share pickled at its first sight): see
  benchmarks/README.md.
* **Keyed by the bytes the serializer reads, with the serializer object.** Equal bytes
  decode to equal values under one serializer, so a copy cannot answer wrong, an
  encrypting serializer included (its ciphertext is the key, and only that serializer
  object's copies answer). A serializer swapped in starts with no copies; a rebinding of
  LangGraph's ``SAFE_MSGPACK_TYPES`` drops them all. On PostgreSQL the bytes are the
  decompressed ones (``postgres/codec.inflate`` runs first).
* **Bounded and thread-safe.** At most ``MAX_ENTRIES`` copies, none above
  ``MAX_ENTRY_BYTES`` (stored bytes plus pickle), ``MAX_TOTAL_BYTES`` in all (least
  recently used dropped first), and ``SEEN_ENTRIES`` values seen once holding at most
  ``SEEN_BYTES``: 5 MB a saver at most; one lock for the maps,
  pickling and unpickling outside it (sync savers are used from many threads). One
  :class:`ValueCopies` a saver (its ``ListDeltaEncoder.copies``, shared by its shallow
  copies, cleared with it after a deletion: what was deleted is not kept here).
"""

from __future__ import annotations

import importlib
import io
import pickle
import threading
from collections import OrderedDict
from typing import Any, Protocol

# private: the list LangGraph's reviver checks each type against, read as its module's
# global when checked (pinned in tests/test_upstream_contracts.py)
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.surrogates import LOSSLESS_TYPE, LosslessJsonPlusSerializer, _custom_hook

__all__ = [
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_TOTAL_BYTES",
    "MIN_BYTES",
    "SEEN_BYTES",
    "SEEN_ENTRIES",
    "Loads",
    "ValueCopies",
    "copyable",
]

MIN_BYTES = 512
MAX_ENTRIES = 64
MAX_ENTRY_BYTES = 256 * 1024
MAX_TOTAL_BYTES = 4 * 1024 * 1024
SEEN_ENTRIES = 256
SEEN_BYTES = 1024 * 1024
_SAMPLE = 48
_REFUSED = object()  # a fingerprint whose value is never copied

# the formats of LangGraph's serializer a copy may stand for (json, pickle: never)
_FORMATS = frozenset({"msgpack", LOSSLESS_TYPE})
_PLAIN: frozenset[type] = frozenset(
    {dict, list, tuple, set, frozenset, str, int, float, bool, type(None), bytes, bytearray}
)


class Loads(Protocol):
    """What the read paths decode with: a serializer, or a :class:`ValueCopies` reader."""

    def loads_typed(self, data: tuple[str, bytes]) -> Any: ...


# --- serde events: a decode that emitted one is never copied ---------------------------

_events = [0]
_listening = threading.Lock()
_listener_registered = False


def _count_event(event: SerdeEvent) -> None:
    _events[0] += 1


def _listen() -> None:
    global _listener_registered
    with _listening:
        if not _listener_registered:
            register_serde_event_listener(_count_event)
            _listener_registered = True


# --- what may be copied ----------------------------------------------------------------


class _Refused(Exception):
    """An object outside plain data and LangChain's messages: the value is not copied."""


def _message_classes(safe: frozenset[tuple[str, ...]]) -> frozenset[type]:
    """The ``BaseMessage`` classes of ``langchain_core.messages`` LangGraph lists as safe."""
    from langchain_core.messages import BaseMessage

    found = set()
    for key in safe:
        if len(key) != 2 or not key[0].startswith("langchain_core.messages."):
            continue
        cls = getattr(importlib.import_module(key[0]), key[1], None)
        if isinstance(cls, type) and issubclass(cls, BaseMessage):
            found.add(cls)
    return frozenset(found)


class _Allowed:
    """The classes copies may hold, for the ``SAFE_MSGPACK_TYPES`` they were made under."""

    def __init__(self, safe: frozenset[tuple[str, ...]]) -> None:
        self.safe = safe
        self.messages = _message_classes(safe)
        self.instances = _PLAIN | self.messages


_allowed: _Allowed | None = None


def _current() -> _Allowed:
    """The allowed classes for LangGraph's current ``SAFE_MSGPACK_TYPES`` (rebuilt when it
    is rebound)."""
    global _allowed
    safe = lg_msgpack.SAFE_MSGPACK_TYPES
    allowed = _allowed
    if allowed is None or allowed.safe is not safe:
        allowed = _allowed = _Allowed(safe)
    return allowed


class _CheckedPickler(pickle.Pickler):
    """A pickler that refuses every object outside :class:`_Allowed` (the C pickler asks
    ``reducer_override`` only about objects that are not exact builtins)."""

    allowed: _Allowed

    def reducer_override(self, obj: Any) -> Any:
        allowed = self.allowed
        if type(obj) in allowed.instances:
            return NotImplemented
        if isinstance(obj, type) and obj in allowed.messages:
            return NotImplemented
        raise _Refused(type(obj).__qualname__)


def copyable(value: Any) -> bytes | None:
    """``value`` pickled, or None when it holds an object outside plain data and messages
    (or does not pickle)."""
    buffer = io.BytesIO()
    pickler = _CheckedPickler(buffer, protocol=pickle.HIGHEST_PROTOCOL)
    pickler.allowed = _current()
    try:
        pickler.dump(value)
    except Exception:  # _Refused, or anything pickle itself refuses: not copied
        return None
    return buffer.getvalue()


def _serde_copyable(serde: Any) -> bool:
    """Whether values ``serde`` decodes may be copied: LangGraph's serializer (ours or its
    own, alone or inside an ``EncryptedSerializer``) without a custom ext hook."""
    if type(serde) is EncryptedSerializer:
        serde = serde.serde
    return type(serde) in (JsonPlusSerializer, LosslessJsonPlusSerializer) and not _custom_hook(
        serde
    )


def _format_copyable(type_: str) -> bool:
    """Whether a stored type tag is one of the serializer's msgpack formats (encrypted or
    not: ``msgpack+aes``)."""
    return type_.split("+", 1)[0] in _FORMATS


# --- the copies --------------------------------------------------------------------------


class _Copy:
    __slots__ = ("data", "pickled", "serde", "size", "type")

    def __init__(self, type_: str, data: bytes, serde: Any, pickled: bytes) -> None:
        self.type = type_
        self.data = data
        self.serde = serde
        self.pickled = pickled
        self.size = len(data) + len(pickled)


class _Reader:
    """``loads_typed`` of one serializer through a :class:`ValueCopies`."""

    __slots__ = ("copies", "formats", "loads", "serde")

    def __init__(self, copies: ValueCopies, serde: Any) -> None:
        self.copies = copies
        self.serde = serde
        self.loads = serde.loads_typed
        self.formats: dict[str, bool] = {}

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if payload is None or len(payload) < MIN_BYTES:
            return self.loads(data)
        ok = self.formats.get(type_)
        if ok is None:
            ok = self.formats[type_] = _format_copyable(type_)
        if not ok:
            return self.loads(data)
        if type(payload) is not bytes:
            payload = bytes(payload)
            data = (type_, payload)
        return self.copies.load(self.serde, self.loads, data)


def _fingerprint(type_: str, data: bytes) -> int:
    """A hint, not an identity: the type tag, the length, 48 bytes from the middle and the
    last 48 (cheap: a full hash of a 20 KB value is ~6 µs)."""
    n = len(data)
    middle = n >> 1
    return hash((type_, n, data[middle : middle + _SAMPLE], data[-_SAMPLE:]))


class ValueCopies:
    """One saver's copies of values it decoded (see the module docstring)."""

    def __init__(
        self,
        *,
        entries: int = MAX_ENTRIES,
        entry_bytes: int = MAX_ENTRY_BYTES,
        total_bytes: int = MAX_TOTAL_BYTES,
        seen: int = SEEN_ENTRIES,
        seen_bytes: int = SEEN_BYTES,
    ) -> None:
        self._max_entries = entries
        self._max_entry_bytes = entry_bytes
        self._max_total = total_bytes
        self._max_seen = seen
        self._max_seen_bytes = seen_bytes
        self._lock = threading.Lock()
        self._copies: OrderedDict[int, _Copy] = OrderedDict()
        # fingerprint -> the bytes seen once (the object read: no copy), or _REFUSED;
        # oldest first (a dict keeps insertion order)
        self._seen: dict[int, bytes | object] = {}
        self._bytes = 0
        self._seen_bytes = 0
        self._reader: tuple[Any, Loads] | None = None
        self._safe: object = None  # the SAFE_MSGPACK_TYPES the copies were made under
        # how values were read: decoded at first sight / at the second and copied /
        # rebuilt from a copy / decoded and refused (not plain data or messages, an
        # event, too large) / decoded again, refused before
        self.counts = {"first": 0, "copied": 0, "hits": 0, "refused": 0, "again": 0}

    def reader(self, serde: Any) -> Loads:
        """What to decode ``serde``'s values with: through these copies when ``serde`` may
        be copied, else ``serde`` itself."""
        last = self._reader
        if last is not None and last[0] is serde:
            return last[1]
        reader: Loads = _Reader(self, serde) if _serde_copyable(serde) else serde
        if reader is not serde:
            _listen()
        self._reader = (serde, reader)
        return reader

    @property
    def size(self) -> tuple[int, int]:
        """(copies held, their bytes: stored bytes and pickles)."""
        with self._lock:
            return len(self._copies), self._bytes

    @property
    def seen_size(self) -> tuple[int, int]:
        """(fingerprints held, the bytes of values seen once they keep alive)."""
        with self._lock:
            return len(self._seen), self._seen_bytes

    def clear(self) -> None:
        """Drop every copy and fingerprint (after a deletion)."""
        with self._lock:
            self._clear()

    def _clear(self) -> None:
        self._copies.clear()
        self._seen.clear()
        self._bytes = self._seen_bytes = 0

    def load(self, serde: Any, loads: Any, stored: tuple[str, bytes]) -> Any:
        """The value ``loads(stored)`` returns: a copy's, from the third sight on. Kept
        short: its first-sight path is added to every cold read (benchmarks/README.md)."""
        type_, data = stored
        key = _fingerprint(type_, data)
        safe = lg_msgpack.SAFE_MSGPACK_TYPES
        with self._lock:
            if safe is not self._safe:  # rebound: every copy was made under another list
                self._clear()
                self._safe = safe
            copy = self._copies.get(key)
            if (
                copy is not None
                and copy.data == data
                and copy.serde is serde
                and copy.type == type_
            ):
                self._copies.move_to_end(key)
                self.counts["hits"] += 1
                pickled = copy.pickled
            else:
                seen = self._seen
                before = seen.get(key)
                if before is None or (before is not _REFUSED and before != data):
                    # first sight (or other bytes under the fingerprint): remember them
                    self.counts["first"] += 1
                    if before is not None:
                        del seen[key]
                        self._seen_bytes -= len(before)  # type: ignore[arg-type]
                    seen[key] = data
                    self._seen_bytes += len(data)
                    if len(seen) > self._max_seen or self._seen_bytes > self._max_seen_bytes:
                        self._trim_seen()
                    return loads(stored)
                if before is _REFUSED:
                    self.counts["again"] += 1
                    return loads(stored)
                pickled = None
        if pickled is not None:
            return pickle.loads(pickled)
        return self._second_sight(key, serde, loads, stored, safe)

    def _trim_seen(self) -> None:
        """Drop the oldest first sights down to the bounds (the lock held)."""
        seen = self._seen
        while len(seen) > self._max_seen or self._seen_bytes > self._max_seen_bytes:
            dropped = seen.pop(next(iter(seen)))
            if dropped is not _REFUSED:
                self._seen_bytes -= len(dropped)  # type: ignore[arg-type]

    def _refuse(self, key: int) -> None:
        """Remember ``key`` as never copied (the lock held)."""
        self._forget_seen(key)
        self._seen[key] = _REFUSED
        self._trim_seen()

    def _forget_seen(self, key: int) -> None:
        old = self._seen.pop(key, None)
        if old is not None and old is not _REFUSED:
            self._seen_bytes -= len(old)  # type: ignore[arg-type]

    def _second_sight(
        self, key: int, serde: Any, loads: Any, stored: tuple[str, bytes], safe: object
    ) -> Any:
        """Decode, and keep a copy unless refused."""
        type_, data = stored
        events = _events[0]
        value = loads(stored)
        pickled = None
        if _events[0] == events and len(data) < self._max_entry_bytes:
            pickled = copyable(value)
        if pickled is None or len(data) + len(pickled) > self._max_entry_bytes:
            with self._lock:
                self.counts["refused"] += 1
                if safe is self._safe:
                    self._refuse(key)
            return value
        entry = _Copy(type_, data, serde, pickled)
        with self._lock:
            if safe is self._safe:
                old = self._copies.pop(key, None)
                if old is not None:
                    self._bytes -= old.size
                self._copies[key] = entry
                self._bytes += entry.size
                self._forget_seen(key)
                self.counts["copied"] += 1
                while len(self._copies) > self._max_entries or self._bytes > self._max_total:
                    _, dropped = self._copies.popitem(last=False)
                    self._bytes -= dropped.size
        return value
