"""Append-only storage of growing list channels (``messages``): store what was added.

A conversation's ``messages`` channel gets a new version every turn, and each version is
the previous list plus a message or two. Storing every version whole costs O(N²) over a
thread; LangGraph's own savers do, and it dominates their files (97% of a 200-turn chat).

We store a new version of a list channel as a **delta** - the appended items plus the
version it extends (``base_version``) - when the saver itself wrote that base version
recently and the new list starts with *the very same objects* (an identity check, O(n)
pointer comparisons, no serialization). A list re-versioned without growing (the same
objects, nothing appended: a node that returns the whole list) is stored as its last
version was when that was a delta (the same row again: no serialization, the chain no
deeper), or as a delta of no items when it was whole. LangGraph's reducers (``add_messages``,
``operator.add``) build the new list from the old one's objects, so in a running graph
this is the common case. Anything else - a list rebuilt from deserialized objects, a
replaced or removed message (a different object at that index), a list subclass - is
stored whole. Every ``MAX_CHAIN`` deltas a whole snapshot is stored, so a read resolves at
most ``MAX_CHAIN`` small rows; reads and deletes treat a delta's base as referenced.

Values are treated as immutable, as LangGraph requires of state: a message mutated *in
place* after it was checkpointed would be missed by the identity check. (In-place
mutation of graph state is already unsupported by LangGraph: it changes older
checkpoints' values in memory too.)

What is remembered keeps nothing alive. A list of objects that take weak references
(messages do) is remembered as weak references to its items: while the run that holds
the list goes on, its items live and the identity check works; once the run ends,
LangGraph drops its state, the items are freed as they would be without this saver, and
the entry, dead, is dropped. (Held strongly, up to ``CACHE_SIZE`` finished conversations
stayed in memory for as long as the saver lived - 25,000 objects after 300 ten-turn chats
- and every full garbage collection walked them.) A list with an item that cannot be
weakly referenced (a string, a number, a dict, a tuple) is remembered as a copy, as
before: bounded by ``CACHE_SIZE`` entries. So are the bytes of a version stored as a
delta (its appended items), up to ``KEEP_ROW_BYTES`` an entry. A new run needs nothing
from a finished one: it resumes by reading its checkpoint, which remembers what it loaded
(``loaded``).
"""

from __future__ import annotations

import itertools
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from operator import is_
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.saver_codec import decode_typed
from langgraph_idem_saver.value_copies import Loads, ValueCopies

MAX_CHAIN = 16
CACHE_SIZE = 512
# the bytes of a delta row kept to store the same list re-versioned again (per entry)
KEEP_ROW_BYTES = 64 * 1024

ChannelKey = tuple[str, str, str]  # thread_id, checkpoint_ns, channel


@dataclass(slots=True, eq=False)
class EncodedBlob:
    """One ``(channel, version)`` row to write: whole value, delta, or ``empty``.

    Never changed once made, but not frozen: a frozen dataclass's ``__init__`` sets each
    field through ``object.__setattr__`` (~3 µs a blob against ~0.6 µs, three or four
    blobs a put); nothing hashes or compares one (``eq=False``)."""

    channel: str
    version: str
    type: str
    data: bytes | None
    base_version: str | None = None
    # what to remember for the next delta once this row is committed: the items, and
    # how to hold them (``_held``) when known already
    items: list[Any] | None = None
    depth: int = 0
    held: tuple[list[Any], bool] | None = None
    # the serializer that wrote ``data``: a row is stored again only by the same one
    serde: SerializerProtocol | None = None


@dataclass(slots=True, eq=False)
class _Written:
    """A remembered list version: ``held`` is its items, or weak references to them
    (``weak``). Never changed once made (not frozen only because one is made on every
    resume, and a frozen dataclass's ``__init__`` costs a ``__setattr__`` call a field)."""

    version: str
    held: list[Any]
    weak: bool
    depth: int
    # how this version was stored, when as a delta of at most KEEP_ROW_BYTES: (type,
    # data, base version, the serializer that wrote data) - the row the same list
    # re-versioned is stored as again, while the saver keeps that serializer
    row: tuple[str, bytes, str, SerializerProtocol] | None = None
    # a version read back as a delta: how many items its own row appends, and its
    # base - the row above is built from them (by the serializer writing then) when the
    # list is re-versioned without growing, so a chain does not deepen on every resume.
    # A count, not the items: what is remembered keeps nothing alive
    own: tuple[int, str] | None = None

    def starts(self, value: list[Any]) -> bool:
        """Whether ``value`` is this version plus any items: the very same objects first.

        No item added is a list re-versioned without growing (a node returning the whole
        list, or ``add_messages`` merging an empty update): see ``ListDeltaEncoder.encode``.
        A dead reference reads as None, which no weakly held item can be (None takes no
        weak reference): a None in ``value`` never matches one."""
        held = self.held
        if len(value) < len(held):
            return False
        # the same tests as ``ref() is item is not None`` / ``a is b`` a pair, in C (map
        # over ``operator.is_``: no Python frame an item)
        if self.weak:
            alive = list(map(_DEREF, held))
            return all(map(is_, alive, value)) and not any(map(is_, alive, _NONES))
        return all(map(is_, held, value))

    def extended(self, value: list[Any]) -> tuple[list[Any], bool]:
        """How to hold ``value``, which :meth:`starts` with this version: this version's
        references, and new ones for the items appended."""
        if self.weak:
            added, weak = _held(value[len(self.held) :])
            if weak:
                return self.held + added, True
        return _held(value)

    def dead(self) -> bool:
        """Its items are gone (the run holding the list ended): no list can extend it."""
        return self.weak and self.held[-1]() is None


# calls a weak reference (its referent, or None once dead); None, as often as asked
_DEREF = weakref.ref.__call__
_NONES = itertools.repeat(None)
# exact types whose objects take no weak reference: a list starting with one is copied
# without raising and catching a TypeError (a ``str`` log's every put)
_NO_WEAKREF = frozenset({str, int, float, bool, bytes, tuple, list, dict, type(None)})


def _held(items: list[Any]) -> tuple[list[Any], bool]:
    """Weak references to ``items`` when every one takes them (``weakref.ref`` of an
    object that has one returns it: no new object), else a copy of the list."""
    if items and type(items[0]) in _NO_WEAKREF:  # what ``weakref.ref`` would refuse first
        return list(items), False
    try:
        return list(map(weakref.ref, items)), True
    except TypeError:  # an item that takes no weak reference (str, int, dict, tuple...)
        return list(items), False


class ListDeltaEncoder:
    """Encodes channel values for ``aput``, remembering recent list versions per channel.

    Shared by shallow copies of a saver (``with_allowlist``). Bounded (LRU) so a server
    with many threads does not hold every conversation in memory. ``copies``: the saver's
    copies of values its reads decoded (``value_copies.py``), which live as long as this
    memory and are dropped with it after a deletion.
    """

    def __init__(self, max_entries: int = CACHE_SIZE) -> None:
        self._recent: OrderedDict[ChannelKey, _Written] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self.copies = ValueCopies()

    def encode(
        self,
        serde: SerializerProtocol,
        thread_id: str,
        ns: str,
        values: dict[str, Any],
        new_versions: dict[str, Any],
    ) -> list[EncodedBlob]:
        blobs = []
        for channel, version in new_versions.items():
            if channel not in values:
                blobs.append(EncodedBlob(channel, str(version), "empty", None))
                continue
            value = values[channel]
            if type(value) is not list:
                blobs.append(EncodedBlob(channel, str(version), *serde.dumps_typed(value)))
                continue
            with self._lock:
                prev = self._recent.get((thread_id, ns, channel))
            if prev is None or prev.version == str(version) or not prev.starts(value):
                prev = None
            row = None if prev is None else prev.row
            same = prev is not None and len(value) == len(prev.held)
            if same and row is None and prev is not None and prev.own is not None:
                # a version read back as a delta, re-versioned without growing: its own
                # items against its base again, written by this serializer
                count, base = prev.own
                row = (*serde.dumps_typed(value[len(value) - count :]), base, serde)
            if prev is not None and same and row and row[3] is serde:
                # the same list again, its last version a delta: that very row (same
                # base, same bytes) - nothing serialized, the chain no deeper. Only from
                # the serializer that wrote it: one swapped in since (encrypting, say)
                # writes its own bytes, as for any other row
                type_, data, base, _ = row
                again = (list(value), prev.depth, prev.extended(value), serde)
                blobs.append(EncodedBlob(channel, str(version), type_, data, base, *again))
            elif prev is not None and prev.depth < MAX_CHAIN:
                # the items appended (none: the same list again, its last version whole)
                type_, data = serde.dumps_typed(value[len(prev.held) :])
                blobs.append(
                    EncodedBlob(
                        channel,
                        str(version),
                        type_,
                        data,
                        prev.version,
                        list(value),
                        prev.depth + 1,
                        prev.extended(value),
                        serde,
                    )
                )
            else:
                blobs.append(
                    EncodedBlob(
                        channel, str(version), *serde.dumps_typed(value), None, list(value), 0
                    )
                )
        return blobs

    def whole(self, serde: SerializerProtocol, blob: EncodedBlob) -> EncodedBlob:
        """The same row stored whole (its delta's base turned out to be gone)."""
        assert blob.items is not None
        return EncodedBlob(
            blob.channel,
            blob.version,
            *serde.dumps_typed(blob.items),
            None,
            blob.items,
            0,
            blob.held,
        )

    def remember(self, thread_id: str, ns: str, blobs: list[EncodedBlob]) -> None:
        """After the commit: these versions may now serve as bases."""
        with self._lock:
            recent = self._recent
            for blob in blobs:
                key = (thread_id, ns, blob.channel)
                items = blob.items
                if not items:
                    # not a list, or an empty one: a delta of [] saves nothing and would
                    # cost every read of the next version a probe for its base
                    recent.pop(key, None)
                    continue
                held = blob.held or _held(items)
                row = None
                base, data, serde = blob.base_version, blob.data, blob.serde
                if (
                    base is not None
                    and data is not None
                    and serde is not None
                    and len(data) <= KEEP_ROW_BYTES
                ):
                    row = (blob.type, data, base, serde)  # a delta row: kept to store again
                recent[key] = _Written(blob.version, *held, blob.depth, row)  # _keep inline
                recent.move_to_end(key)
            self._trim()

    def loaded(
        self,
        thread_id: str,
        ns: str,
        channel: str,
        version: str,
        value: Any,
        depth: int,
        own: tuple[int, str] | None = None,
    ) -> None:
        """A list version was read to resume from: LangGraph's channel will hold these
        very objects, so the next version it writes can be stored as a delta of this one.
        (``remember`` of its row, without building one: a read of every graph's resume.)

        ``own``: when the version is stored as a delta, how many items it appends and
        the version it extends. The same list re-versioned after the resume is then that
        delta again (the chain no deeper), as after a version this saver wrote: without
        it every resume of a list re-versioned without growing (a node returning the
        whole list) added one hop to every later read, up to ``MAX_CHAIN``."""
        if type(value) is not list:
            return
        key = (thread_id, ns, channel)
        kept = own if own is not None and 0 <= own[0] <= len(value) else None
        with self._lock:
            if value:
                self._keep(key, _Written(version, *_held(value), depth, None, kept))
            else:  # an empty list: as remember() drops it
                self._recent.pop(key, None)
            self._trim()

    def _keep(self, key: ChannelKey, written: _Written) -> None:
        """Remember ``written`` as the newest entry (the lock held)."""
        self._recent[key] = written
        self._recent.move_to_end(key)

    def _trim(self) -> None:
        """Bound the cache (the lock held): the least recently written entries first, and
        the dead ones among the oldest few (so a put never walks the whole cache)."""
        recent = self._recent
        while len(recent) > self._max:
            recent.popitem(last=False)
        # ``dead()`` of each, inline (every put comes here)
        oldest = itertools.islice(recent.items(), 4)
        for key in [k for k, w in oldest if w.weak and w.held[-1]() is None]:
            del recent[key]

    def forget(self, thread_ids: Any = None) -> None:
        """Drop remembered versions (all, or of these threads) after deletions, and every
        copy of a decoded value (a deleted value is not kept in memory)."""
        self.copies.clear()
        with self._lock:
            if thread_ids is None:
                self._recent.clear()
                return
            wanted = {str(t) for t in thread_ids}
            for key in [k for k in self._recent if k[0] in wanted]:
                del self._recent[key]


def resolve_value(
    serde: Loads,
    type_: str,
    data: bytes | None,
    base_version: str | None,
    fetch_base: Callable[[str], tuple[str, bytes | None, str | None] | None],
    **where: Any,
) -> tuple[Any, int]:
    """Decode a stored channel value, following delta rows back to a whole one.

    ``serde``: the saver's serializer, or its ``ValueCopies.reader`` (each stored row,
    base or delta, decoded or copied on its own: a base many versions share is copied).

    ``fetch_base(version)`` returns ``(type, data, base_version)`` of that version's row,
    or None when it is missing - a corrupt chain, reported as such. Returns the value and
    the number of deltas followed (the chain depth of this version).
    """
    value, depth, _ = resolve_delta(serde, type_, data, base_version, fetch_base, **where)
    return value, depth


def resolve_delta(
    serde: Loads,
    type_: str,
    data: bytes | None,
    base_version: str | None,
    fetch_base: Callable[[str], tuple[str, bytes | None, str | None] | None],
    **where: Any,
) -> tuple[Any, int, tuple[int, str] | None]:
    """:func:`resolve_value`, and for a delta what :meth:`ListDeltaEncoder.loaded`
    takes as ``own``: how many items the version's own row appends, and its base."""
    own_base = base_version
    parts = []
    seen = 0
    while base_version is not None:
        parts.append(decode_typed(serde, type_, data, "channel value (delta)", **where))
        row = fetch_base(base_version)
        seen += 1
        if row is None or seen > MAX_CHAIN * 4:
            raise CorruptRecordError(
                "channel value",
                location={**where, "missing_base_version": base_version},
                cause=LookupError("the version this delta extends is not stored"),
            )
        type_, data, base_version = row
    value = decode_typed(serde, type_, data, "channel value", **where)
    if parts:
        if not isinstance(value, list) or not all(isinstance(p, list) for p in parts):
            raise CorruptRecordError(
                "channel value", location=where, cause=TypeError("a delta chain of non-lists")
            )
        value = list(value)
        for part in reversed(parts):
            value.extend(part)
    own = None if own_base is None else (len(parts[0]), own_base)
    return value, len(parts), own
