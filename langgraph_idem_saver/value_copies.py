"""Copies of values decoded before: a stored value read again is rebuilt by ``pickle.loads``
of a copy kept in memory instead of by the serializer.

Why: decoding a stored value (LangGraph's ``JsonPlusSerializer`` reviving pydantic
messages) is ~85% of a read, and reads decode the same stored bytes again and again. In a
page of ``alist`` over a list re-versioned without growing, every row's list is a delta of
the same base row; ``get_tuple`` of the same checkpoint (``graph.get_state`` polling, a
server, each resumed ``invoke`` reading a growing list's base) decodes the same bytes each
time. A pickle of the decoded value loads ~4x faster than the serializer decodes it (20
messages, 10 KB: 69 against 289 µs, benchmarks/README.md), equal values, fresh objects at
every level, each message's ``__pydantic_fields_set__`` the same.

Decisions (each pinned in ``tests/test_value_copies*.py``):

* **The serializer decides first, always.** A value is copied only after LangGraph's
  serializer decoded it (its allowlist, strict mode, events and warnings are its own), and
  only when that decode emitted no serde event (``register_serde_event_listener``, the
  public hook, counted on the decoding thread alone: a type strict mode blocked decodes
  to its raw data, which must go through the serializer and its event on every read),
  and only when every object its bytes build is of a type LangGraph lists as safe
  (``SAFE_MSGPACK_TYPES``): an allowed type whose module cannot be imported yet decodes
  to its raw data without an event, and to the object once it can - not a function of
  the bytes (one more unpack of the bytes on the second sight, ~37 µs for the 20-message
  list, no object built). Only LangGraph's ``JsonPlusSerializer``
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
  every read, and marked so it is not tried again. A readable (not encrypted) value whose
  bytes name no ``langchain_core.messages`` module is not considered at all: plain data
  decodes at C speed (ormsgpack), as fast as a pickle loads.
* **Nothing pickled on read-once patterns: a copy is made on second sight.** The first
  decode of some bytes only remembers them: the bytes object read (a reference, not a
  copy; values up to ``SEEN_MAX_BYTES``) in a bucket of its length and seven of its
  bytes, under the lock (+0.4 µs a first sight, 2026-11-28 against 32d9f9e: the bound
  below holds whatever the threads). A second sight is those very bytes again, compared
  in full (other bytes in the bucket are a first sight of those): it decodes, pickles
  (+~60 µs) and checks the types its bytes build (+~37 µs), once; the third sight on is
  a copy. A read that sees every value once (a cold read, an export) pickles nothing,
  but pays the first sight: +16 µs a cold read of a 20-message list (2%,
  benchmarks/README.md). Tried: hashing the bytes in full (no cheaper), a bucket without
  the bytes (other bytes in it: a wasted pickle).
  Values under ``MIN_BYTES`` are not considered (decoded in a few µs).
* **Keyed by the bytes the serializer reads, with the serializer object.** Equal bytes
  decode to equal values under one serializer, so a copy cannot answer wrong, an
  encrypting serializer included (its ciphertext is the key, and only that serializer
  object's copies answer, while it holds the same ``cipher``). A serializer swapped in
  starts with no copies; a rebinding of LangGraph's ``SAFE_MSGPACK_TYPES`` drops them
  all. On PostgreSQL the bytes are the decompressed ones (``postgres/codec.inflate`` runs
  first).
* **Bounded and thread-safe.** At most ``MAX_ENTRIES`` copies, none above
  ``MAX_ENTRY_BYTES`` (stored bytes plus pickle), ``MAX_TOTAL_BYTES`` in all (least
  recently used dropped first), and ``SEEN_ENTRIES`` values seen once of at most
  ``SEEN_MAX_BYTES`` each: at most 5 MB a saver (3 MB of copies, 2 MB of first sights),
  however many threads read, a few hundred KB for the benchmark's lists. One lock for the
  copies, pickling and unpickling outside it (sync
  savers are used from many threads). One :class:`ValueCopies` a saver (its
  ``ListDeltaEncoder.copies``, shared by its shallow copies, cleared with it after a
  deletion through this saver, as are the process-wide caches registered with
  :func:`dropped_with_copies` - PostgreSQL's decompressed values: what was deleted is not
  kept here. Not cleared: what a read in flight at that moment (its rows fetched before
  the deletion committed, decoded after the clear) keeps of what it read - a first sight
  of each value, a copy of bytes it met twice, a decompressed value - until evicted by
  later reads of other values (``SEEN_ENTRIES``, ``MAX_ENTRIES``, 16 decompressed). Telling
  such a read apart would take a deletion count read before its SQL, in each backend's
  read paths; keyed by bytes, a copy never answers a row that is no longer stored -
  another process's deletion included).
"""

from __future__ import annotations

import importlib
import io
import pickle
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import ormsgpack

# private: the list LangGraph's reviver checks each type against, read as its module's
# global when checked (pinned in tests/test_upstream_contracts.py)
from langgraph.checkpoint.serde import _msgpack as lg_msgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.event_hooks import SerdeEvent, register_serde_event_listener
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.surrogates import (
    EXT_DICT,
    EXT_STR,
    LOSSLESS_TYPE,
    LosslessJsonPlusSerializer,
    _custom_hook,
)

__all__ = [
    "MAX_ENTRIES",
    "MAX_ENTRY_BYTES",
    "MAX_TOTAL_BYTES",
    "MIN_BYTES",
    "SEEN_ENTRIES",
    "SEEN_MAX_BYTES",
    "Loads",
    "ValueCopies",
    "copyable",
    "dropped_with_copies",
]

MIN_BYTES = 512
MAX_ENTRIES = 64
MAX_ENTRY_BYTES = 128 * 1024
MAX_TOTAL_BYTES = 3 * 1024 * 1024
SEEN_ENTRIES = 32
SEEN_MAX_BYTES = 64 * 1024  # a value read once is remembered only up to this size
_REFUSED = object()  # a bucket whose value is never copied
# a clear msgpack value without a LangChain message decodes at C speed (ormsgpack): a copy
# saves nothing there, and its first sight would cost more than its decode
_MESSAGES = b"langchain_core.messages."
_CLEAR = "clear"  # a fingerprint whose value is never copied

# the formats of LangGraph's serializer a copy may stand for (json, pickle: never)
_FORMATS = frozenset({"msgpack", LOSSLESS_TYPE})
_PLAIN: frozenset[type] = frozenset(
    {dict, list, tuple, set, frozenset, str, int, float, bool, type(None), bytes, bytearray}
)


class Loads(Protocol):
    """What the read paths decode with: a serializer, or a :class:`ValueCopies` reader."""

    def loads_typed(self, data: tuple[str, bytes]) -> Any: ...


# --- serde events: a decode that emitted one is never copied ---------------------------

# counted a thread: events are emitted on the thread that decodes, and another thread's
# event (or a lost increment of a shared count) must not be taken for this decode's
_events = threading.local()
_listening = threading.Lock()
_listener_registered = False


def _events_here() -> int:
    """How many serde events this thread's decodes emitted so far."""
    n: int = getattr(_events, "n", 0)
    return n


def _count_event(event: SerdeEvent) -> None:
    _events.n = getattr(_events, "n", 0) + 1


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


def _format_copyable(type_: str) -> bool | str:
    """Whether a stored type tag is one of the serializer's msgpack formats: ``_CLEAR``
    when its bytes are readable (not encrypted: ``msgpack+aes`` is)."""
    base, _, cipher = type_.partition("+")
    if base not in _FORMATS:
        return False
    return True if cipher else _CLEAR


# LangGraph's ext codes whose data starts with the (module, name) of the type it builds
# (constructor calls, pydantic models); any other code (a method call, a numpy array, a
# delta snapshot, one LangGraph adds later) builds no type LangGraph lists: not copied
_NAMED_CODES = frozenset(
    {
        jsonplus.EXT_CONSTRUCTOR_SINGLE_ARG,
        jsonplus.EXT_CONSTRUCTOR_POS_ARGS,
        jsonplus.EXT_CONSTRUCTOR_KW_ARGS,
        jsonplus.EXT_PYDANTIC_V1,
        jsonplus.EXT_PYDANTIC_V2,
    }
)


def _builds_only_safe_types(serde: Any, type_: str, data: bytes) -> bool:
    """Whether every object ``data`` asks the reviver to build is of a type LangGraph
    lists as safe (``SAFE_MSGPACK_TYPES``). Any other type, allowed, revives to raw data
    when its module cannot be imported (``_reconstruction_fallback``, no event) and to
    the object once it can: such a decode is not a function of the bytes alone, and is
    never copied. Read on the second sight only (one more unpack, no object built)."""
    base, _, cipher = type_.partition("+")
    if cipher:  # an EncryptedSerializer's value: its clear bytes
        decrypt = getattr(getattr(serde, "cipher", None), "decrypt", None)
        try:
            data = decrypt(cipher, data)  # type: ignore[misc]
        except Exception:  # no cipher, or it changed: not copied (the value is returned)
            return False
    safe = lg_msgpack.SAFE_MSGPACK_TYPES
    ours = base == LOSSLESS_TYPE  # our two codes: text and dicts, no type built
    only_safe = True

    def hook(code: int, payload: bytes) -> None:
        nonlocal only_safe
        if ours and code == EXT_STR:
            return None
        inner = ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        if ours and code == EXT_DICT:
            return None
        if (
            code not in _NAMED_CODES
            or not isinstance(inner, list)
            or len(inner) < 2
            or not isinstance(inner[0], str)
            or not isinstance(inner[1], str)
            or (inner[0], inner[1]) not in safe
        ):
            only_safe = False
        return None

    try:
        ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
    except Exception:  # the serializer read it; anything odd here: not copied
        return False
    return only_safe


# --- the copies --------------------------------------------------------------------------

# process-wide caches of stored bytes (postgres/codec's decompressed values) dropped
# whenever a saver's copies are, after a deletion: a deleted value is kept nowhere
_DROPPED_WITH_COPIES: list[Callable[[], None]] = []


def dropped_with_copies(drop: Callable[[], None]) -> None:
    """Run ``drop`` whenever :meth:`ValueCopies.clear` runs (after every deletion through
    a saver: ``ListDeltaEncoder.forget``)."""
    if drop not in _DROPPED_WITH_COPIES:
        _DROPPED_WITH_COPIES.append(drop)


class _Copy:
    __slots__ = ("cipher", "data", "pickled", "serde", "size", "type")

    def __init__(self, type_: str, data: bytes, serde: Any, pickled: bytes) -> None:
        self.type = type_
        self.data = data
        self.serde = serde
        # an EncryptedSerializer's cipher: one replaced on it (a rotated key) reads for itself
        self.cipher = getattr(serde, "cipher", None)
        self.pickled = pickled
        self.size = len(data) + len(pickled)


class _Reader:
    """``loads_typed`` of one serializer through a :class:`ValueCopies`."""

    __slots__ = ("copies", "formats", "loads", "serde")

    def __init__(self, copies: ValueCopies, serde: Any) -> None:
        self.copies = copies
        self.serde = serde
        self.loads = serde.loads_typed
        self.formats: dict[str, bool | str] = {}

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if payload is None or len(payload) < MIN_BYTES:
            return self.loads(data)
        ok = self.formats.get(type_)
        if ok is None:
            ok = self.formats[type_] = _format_copyable(type_)
        if not ok or (ok is _CLEAR and _MESSAGES not in payload):
            return self.loads(data)
        if type(payload) is not bytes:
            payload = bytes(payload)
            data = (type_, payload)
        # the first sight inline (it is on every cold read): a bucket of the length and
        # seven bytes (two bytes alone: 68% of a cold scan's values met a recent one's
        # bucket, each then compared in full); a bucket seen or copied before takes the
        # full path
        copies = self.copies
        n = len(payload)
        key = (
            n
            | payload[n >> 2] << 32
            | payload[n // 3] << 40
            | payload[n >> 1] << 48
            | payload[(2 * n) // 3] << 56
            | payload[(3 * n) >> 2] << 64
            | payload[-40] << 72
            | payload[-9] << 80
        )
        if key in copies._copies or key in copies._seen:
            return copies.load(self.serde, self.loads, data, key)
        if n <= copies._max_seen_bytes:  # ``_first_sight``, inline (every cold read)
            with copies._lock:
                seen = copies._seen
                if len(seen) >= copies._max_seen:
                    copies._trim_seen()
                seen[key] = payload  # the object read, kept: a second sight is exact
            copies.counts["first"] += 1
        return self.loads(data)


class ValueCopies:
    """One saver's copies of values it decoded (see the module docstring)."""

    def __init__(
        self,
        *,
        entries: int = MAX_ENTRIES,
        entry_bytes: int = MAX_ENTRY_BYTES,
        total_bytes: int = MAX_TOTAL_BYTES,
        seen: int = SEEN_ENTRIES,
        seen_bytes: int = SEEN_MAX_BYTES,
    ) -> None:
        self._max_entries = entries
        self._max_entry_bytes = entry_bytes
        self._max_total = total_bytes
        self._max_seen = seen
        self._max_seen_bytes = seen_bytes
        self._lock = threading.Lock()
        self._copies: OrderedDict[int, _Copy] = OrderedDict()
        # a bucket (length and seven bytes) -> the bytes last read there once (the object
        # read, not a copy), or _REFUSED; oldest first (a dict keeps insertion order)
        self._seen: dict[int, bytes | object] = {}
        self._bytes = 0
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
    def seen_size(self) -> int:
        """How many hashes of values read are remembered."""
        with self._lock:
            return len(self._seen)

    def clear(self) -> None:
        """Drop every copy and fingerprint (after a deletion), and the process-wide
        caches of stored bytes registered with :func:`dropped_with_copies`."""
        with self._lock:
            self._clear()
        for drop in _DROPPED_WITH_COPIES:
            drop()

    def _clear(self) -> None:
        self._copies.clear()
        self._seen.clear()
        self._bytes = 0

    def load(self, serde: Any, loads: Any, stored: tuple[str, bytes], key: int) -> Any:
        """The value ``loads(stored)`` returns, for bytes whose bucket ``key`` was seen or
        copied before: a copy's from the third sight on (the bytes compared in full)."""
        data = stored[1]
        copy = self._copies.get(key)
        if (
            copy is not None
            and copy.data == data
            and copy.serde is serde
            and copy.cipher is getattr(serde, "cipher", None)
            and copy.type == stored[0]
            and self._safe is lg_msgpack.SAFE_MSGPACK_TYPES
        ):
            with self._lock:
                if key in self._copies:
                    self._copies.move_to_end(key)
                self.counts["hits"] += 1
            return pickle.loads(copy.pickled)
        seen = self._seen
        before = seen.get(key)
        if before is not None and (before is data or before == data):
            return self._second_sight(key, serde, loads, stored)
        if before is _REFUSED:
            self.counts["again"] += 1
        elif len(data) <= self._max_seen_bytes:  # other bytes in the bucket: theirs now
            self._first_sight(key, data)
        return loads(stored)

    def _first_sight(self, key: int, data: bytes) -> None:
        """Remember ``data`` (the bytes object read) in its bucket, under the lock so the
        bound holds whatever the threads: at ``SEEN_ENTRIES`` the oldest are dropped
        first (``_trim_seen``). The lock costs ~0.4 µs, against the decode of a value of
        ``MIN_BYTES`` or more that follows it (tens of µs at least)."""
        with self._lock:
            seen = self._seen
            if len(seen) >= self._max_seen:
                self._trim_seen()
            seen[key] = data
        self.counts["first"] += 1

    def _trim_seen(self) -> None:
        """Drop the oldest first sights down to half ``SEEN_ENTRIES`` (the lock held; by
        halves, so it runs once every ``SEEN_ENTRIES / 2`` first sights)."""
        seen = self._seen
        while len(seen) > self._max_seen // 2:
            del seen[next(iter(seen))]

    def _second_sight(self, key: int, serde: Any, loads: Any, stored: tuple[str, bytes]) -> Any:
        """Decode, and keep a copy unless refused."""
        type_, data = stored
        safe = lg_msgpack.SAFE_MSGPACK_TYPES
        events = _events_here()
        value = loads(stored)
        pickled = None
        if _events_here() == events and len(data) < self._max_entry_bytes:
            pickled = copyable(value)
            if pickled is not None and not _builds_only_safe_types(serde, type_, data):
                pickled = None
        with self._lock:
            if safe is not self._safe:  # rebound (or the first copy): start over
                self._clear()
                self._safe = safe
            if pickled is None or len(data) + len(pickled) > self._max_entry_bytes:
                self.counts["refused"] += 1
                if key not in self._seen and len(self._seen) >= self._max_seen:
                    self._trim_seen()  # cleared meanwhile, and full again: the bound holds
                self._seen[key] = _REFUSED  # never tried again
                return value
            entry = _Copy(type_, data, serde, pickled)
            self._seen.pop(key, None)
            old = self._copies.pop(key, None)
            if old is not None:
                self._bytes -= old.size
            self._copies[key] = entry
            self._bytes += entry.size
            self.counts["copied"] += 1
            while len(self._copies) > self._max_entries or self._bytes > self._max_total:
                _, dropped = self._copies.popitem(last=False)
                self._bytes -= dropped.size
        return value
