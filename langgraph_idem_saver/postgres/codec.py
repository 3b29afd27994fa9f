"""Values as :class:`AsyncPostgresSaver` stores them: serialized with ``serde``,
zlib-compressed when that pays, and rows read back into ``CheckpointTuple`` s (list
deltas resolved). Mixed into the saver; the SQL that returns the rows is in ``sql.py``.
Every stored value read is decompressed (``inflate``), then decoded through the saver's
``ValueCopies`` (``value_copies.py``: bytes decoded twice before are rebuilt from a copy).
"""

from __future__ import annotations

import threading
import zlib
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import CheckpointTuple

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.list_deltas import resolve_delta
from langgraph_idem_saver.saver_codec import (
    check_versions,
    decode_checkpoint,
    decode_json,
    decode_typed,
)
from langgraph_idem_saver.saver_config import stored_tuple
from langgraph_idem_saver.value_copies import dropped_with_copies

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol

    from langgraph_idem_saver.list_deltas import ListDeltaEncoder
    from langgraph_idem_saver.value_copies import Loads

# Values whose serialized form reaches this size are compressed by the client (zlib level
# 1) before they are sent. PostgreSQL would otherwise compress them itself (TOAST, pglz,
# from ~2 KB on), at several times the CPU cost, on the one machine every worker shares:
# a 25 KB message list costs ~0.5 ms of server CPU with pglz, ~0.08 ms of client CPU with
# zlib, and ends up smaller. The marker is a type prefix, so uncompressed rows (and
# rows written with compression off) read back unchanged.
COMPRESS_MIN_BYTES = 2048
ZLIB_PREFIX = "zlib:"

# The last values decompressed, by their compressed bytes: a page of ``alist`` over a list
# re-versioned without growing holds the same base in every row (each version a delta of
# it), and so did decompress it once a row - a tenth of our ``alist(limit=10)``'s time on
# the benchmark's thread (benchmarks/README.md). Equal compressed bytes are equal values,
# so the cache cannot answer wrong; it keeps bytes only (never a decoded, mutable value),
# at most ``_INFLATED_ENTRIES`` of them, each at most ``_INFLATED_MAX_BYTES``; dropped
# with every saver's value copies after a deletion (a deleted value is kept nowhere).
_INFLATED: OrderedDict[bytes, bytes] = OrderedDict()
_INFLATED_LOCK = threading.Lock()  # the sync savers decode on their callers' threads
_INFLATED_ENTRIES = 16
_INFLATED_MAX_BYTES = 256 * 1024


def forget_inflated() -> None:
    """Drop every value decompressed (after a deletion: ``ValueCopies.clear``)."""
    with _INFLATED_LOCK:
        _INFLATED.clear()


dropped_with_copies(forget_inflated)


def inflate(data: bytes) -> bytes:
    """``zlib.decompress(data)``, from the cache of the last values decompressed."""
    with _INFLATED_LOCK:
        hit = _INFLATED.get(data)
        if hit is not None:
            _INFLATED.move_to_end(data)
            return hit
    out = zlib.decompress(data)
    if len(out) <= _INFLATED_MAX_BYTES:
        with _INFLATED_LOCK:
            _INFLATED[data] = out
            while len(_INFLATED) > _INFLATED_ENTRIES:
                _INFLATED.popitem(last=False)
    return out


class PostgresCodec:
    """Encoding and decoding of stored values (mixed into :class:`AsyncPostgresSaver`)."""

    # values serialized to at least this many bytes are stored zlib-compressed (level 1)
    # when that saves 10% or more; None stores everything as serialized
    compress_min_bytes: int | None = COMPRESS_MIN_BYTES

    if TYPE_CHECKING:
        serde: SerializerProtocol
        _deltas: ListDeltaEncoder

    def _dump(self, value: Any) -> tuple[str, bytes]:
        """``serde.dumps_typed``, zlib-compressed when that pays (see COMPRESS_MIN_BYTES)."""
        return self._pack(*self.serde.dumps_typed(value))

    def _pack(self, type_: str, data: bytes) -> tuple[str, bytes]:
        """Serialized ``(type, data)`` as stored: zlib-compressed when that pays."""
        limit = self.compress_min_bytes
        if limit is not None and len(data) >= limit:
            packed = zlib.compress(data, 1)
            if len(packed) <= len(data) * 0.9:
                return ZLIB_PREFIX + type_, packed
        return type_, data

    def _unpack(
        self, type_: str, data: bytes | None, what: str, **location: Any
    ) -> tuple[str, bytes | None]:
        """A stored ``(type, data)`` as ``serde`` wrote it: decompressed if it was."""
        if type_.startswith(ZLIB_PREFIX):
            try:
                data = inflate(bytes(data or b""))
            except zlib.error as exc:
                raise CorruptRecordError(what, location=location, cause=exc) from exc
            type_ = type_[len(ZLIB_PREFIX) :]
        return type_, data

    def _reader(self) -> Loads:
        """What stored values are decoded with: the serializer, through the saver's copies."""
        return self._deltas.copies.reader(self.serde)

    def _load(self, type_: str, data: bytes | None, what: str, **location: Any) -> Any:
        """Decode a stored value (decompressing it first if it was compressed)."""
        return decode_typed(
            self._reader(), *self._unpack(type_, data, what, **location), what, **location
        )

    def _row_to_tuple(self, row: Sequence[Any], *, loading: bool = False) -> CheckpointTuple:
        """Build a CheckpointTuple from a row; ``loading`` when a graph resumes from it
        (its list values may then serve as the bases of the next deltas)."""
        (
            thread_id,
            ns,
            checkpoint_id,
            parent_id,
            type_,
            data,
            metadata,
            metadata_exact,
            blobs,
            writes,
        ) = row
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        checkpoint = decode_checkpoint(  # no message in it: the serializer's own
            self.serde, *self._unpack(type_, data, "checkpoint", **where), **where
        )
        values: dict[str, Any] = {}
        blobs = blobs or ()
        if blobs and blobs[0][0] is None:  # first, the row's channel_versions column
            column = decode_json(str(blobs[0][1], "utf-8"), "channel_versions", **where)
            own_versions = checkpoint.get("channel_versions") or {}
            if column != own_versions:
                check_versions(column, own_versions, **where)
            blobs = blobs[1:]
        # one row per stored version: each channel's own first, then (for a delta) the
        # versions it extends, by depth
        chains: dict[str, list[tuple[str, bytes | None, str | None, str | None]]] = {}
        for channel_b, btype_b, blob, version_b, base_b in blobs:
            chains.setdefault(bytes(channel_b).decode(), []).append(
                (
                    bytes(btype_b).decode(),
                    blob,
                    None if version_b is None else bytes(version_b).decode(),
                    None if base_b is None else bytes(base_b).decode(),
                )
            )
        for channel, chain in chains.items():
            btype, blob, version, base_version = chain[0]
            own = None
            if base_version is None:
                values[channel] = self._load(btype, blob, "channel value", channel=channel, **where)
                depth = 0
            else:
                values[channel], depth, own = self._resolve_delta(chain, channel=channel, **where)
            value = values[channel]
            if loading and version is not None:
                self._deltas.loaded(thread_id, ns, channel, version, value, depth, own)
        pending = []
        for task_b, channel_b, wtype_b, value in writes or ():
            task_id = bytes(task_b).decode()
            channel = bytes(channel_b).decode()
            pending.append(
                (
                    task_id,
                    channel,
                    self._load(
                        bytes(wtype_b).decode(),
                        value,
                        "pending write",
                        task_id=task_id,
                        channel=channel,
                        **where,
                    ),
                )
            )
        if metadata_exact is not None:
            metadata = decode_json(metadata_exact, "metadata", **where)
        if not isinstance(metadata, dict):
            raise CorruptRecordError(
                "metadata", location=where, cause=TypeError("metadata is not a JSON object")
            )
        return stored_tuple(
            thread_id, ns, checkpoint_id, parent_id, checkpoint, values, metadata, pending
        )

    def _resolve(
        self, chain: list[tuple[str, bytes | None, str | None, str | None]], **where: Any
    ) -> tuple[Any, int]:
        """A delta's value: its chain (as SELECT_TUPLES returns it) resolved to a list,
        and its depth. A base the chain lacks is reported as corrupt."""
        value, depth, _ = self._resolve_delta(chain, **where)
        return value, depth

    def _resolve_delta(
        self, chain: list[tuple[str, bytes | None, str | None, str | None]], **where: Any
    ) -> tuple[Any, int, tuple[int, str] | None]:
        """``_resolve``, and what ``ListDeltaEncoder.loaded`` takes as ``own``."""
        by_version = {version: (t, b, base) for t, b, version, base in chain[1:]}

        def fetch_base(version: str) -> tuple[str, bytes | None, str | None] | None:
            row = by_version.get(version)
            if row is None:
                return None
            type_, blob, base = row
            return (*self._unpack(type_, blob, "channel value", **where), base)

        type_, blob, _, base_version = chain[0]
        type_, data = self._unpack(type_, blob, "channel value (delta)", **where)
        return resolve_delta(self._reader(), type_, data, base_version, fetch_base, **where)
