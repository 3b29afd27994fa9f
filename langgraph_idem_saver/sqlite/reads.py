"""Checkpoint rows read back on SQLite: ``CheckpointTuple``\\s with their channel values
and pending writes, for ``aget_tuple`` (one row) and a page of ``alist`` (many).

**Statements a page, not a row.** A checkpoint's channel values live in ``idem_blobs``
(a delta of a list in one row, its base in another) and its pending writes in
``idem_writes``. Read row by row, a page of ten cost thirty statements beside its own
(each row's blobs, its delta's base, its writes). Here the rows of a page that share a
thread and namespace (all of them, for ``list(config)``) are read together: one statement
for every (channel, version) they name - each fetched once however many rows name it -
with the base each delta extends; a probe for each deeper base (a chain longer than one);
one statement for their writes. Each row is then decoded on its own, from those bytes: no
two tuples share an object, as with LangGraph's savers. The caller runs it all in one
read transaction (a snapshot: ``connection.read_tx``).

**Decoding without wrappers.** A read decodes four values where LangGraph's saver
decodes one (the checkpoint, each channel's blob, a delta's base), so the Python around
each decode counts: values are decoded by the serializer's ``loads_typed`` directly, and
where a row is only built when something fails to decode. Given the saver's
:class:`~langgraph_idem_saver.value_copies.ValueCopies`, each stored value (a checkpoint, a
channel's blob, a delta's base, a write) is decoded through it: bytes decoded twice before
are rebuilt from a copy (``pickle.loads``), fresh objects for every tuple; the serializer
decodes the rest. Every stored value that does
not decode is still a :class:`CorruptRecordError` naming its row, and so is a delta whose
base is not stored, a delta of a non-list, or a row whose ``channel_versions`` column
names other versions than its checkpoint does.

**A corrupt ``channel_versions`` column is its row's error, not the read's.** The column
(the blob keys of the row, a JSON object) is parsed here before SQLite's ``json_each``
sees it: text that is not a JSON object would fail the whole statement ("malformed
JSON") and, valid JSON of another shape, silently name no blob. Such a row reads no blob
and raises :class:`CorruptRecordError` naming it when it is decoded, so the rows of a
page before it are returned and a read that does not need it (another checkpoint of the
thread) never sees it. The parsed column is then compared with the versions its
checkpoint names: one dict comparison, which replaces a check per channel.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.list_deltas import ListDeltaEncoder, resolve_delta
from langgraph_idem_saver.saver_codec import check_versions
from langgraph_idem_saver.saver_config import stored_tuple
from langgraph_idem_saver.sqlite import sql
from langgraph_idem_saver.value_copies import ValueCopies

# a stored value, (type, data, base_version), by (channel, version)
Blobs = dict[tuple[str, str], tuple[str, bytes | None, str | None]]
# a row of ``sql.CHECKPOINT_COLUMNS``
Row = Sequence[Any]
# a row's channel_versions ({channel: version}): the whole column parsed (a row of a
# page), or the pairs of it that name a stored value (one row: SQL's json_each read the
# column); or the error its row raises when decoded (the column is not a JSON object)
Versions = dict[str, Any] | CorruptRecordError
# what a row's tuple is decoded from: the row, its channel_versions, whether they are
# the whole column, the blobs read for it (and its page), its writes
Fetched = tuple[Row, Versions, bool, Blobs, list[Any]]


def stored_versions(row: Row) -> Versions:
    """The row's ``channel_versions`` column as a dict, or the :class:`CorruptRecordError`
    naming the row when it is not a JSON object (malformed, an array, a scalar)."""
    try:
        versions = json.loads(row[7])
    except Exception as exc:
        return _corrupt("channel_versions", row, exc)
    if type(versions) is not dict:
        why = f"decoded to {type(versions).__name__}, not a JSON object"
        return _corrupt("channel_versions", row, TypeError(why))
    return versions


def fetch_tuple(conn: sqlite3.Connection, row: Row) -> Fetched:
    """What the tuple of one ``CHECKPOINT_COLUMNS`` row is decoded from. The column is
    not parsed here: SQL reads it, and ``decode_tuple`` parses it only when the pairs
    found do not account for its checkpoint's versions (a corrupt column among them)."""
    thread_id, ns = row[0], row[1]
    found: dict[str, Any] = {}
    blobs: Blobs = {}
    deeper = False  # a delta whose base the join did not bring, or a base that is a delta
    try:
        cursor = conn.execute(sql.SELECT_BLOBS_FOR_VERSIONS, (row[7], thread_id, ns))
        for channel, version, type_, data, base, base_type, base_data, base_base in cursor:
            found[channel] = version
            blobs[channel, version] = (type_, data, base)
            if base_type is not None:
                blobs[channel, base] = (base_type, base_data, base_base)
                deeper = deeper or base_base is not None
            elif base is not None:
                deeper = True
    except sqlite3.OperationalError as exc:
        if "malformed JSON" not in str(exc):
            raise
        return row, _corrupt("channel_versions", row, exc), False, {}, []
    if deeper:
        _fetch_bases(conn, thread_id, ns, blobs)
    writes = conn.execute(sql.SELECT_WRITES_FOR_CHECKPOINT, row[:3]).fetchall()
    return row, found, False, blobs, writes


def fetch_page(conn: sqlite3.Connection, rows: Sequence[Row]) -> list[Fetched]:
    """What the tuples of ``rows`` (``CHECKPOINT_COLUMNS``) are decoded from, in order."""
    if len(rows) <= 1:
        return [fetch_tuple(conn, row) for row in rows]
    groups: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        groups.setdefault((row[0], row[1]), []).append(row)
    fetched: dict[tuple[str, str, str], Fetched] = {}
    for (thread_id, ns), group in groups.items():
        blobs: Blobs = {}
        parsed = [stored_versions(r) for r in group]
        readable = [r[7] for r, v in zip(group, parsed, strict=True) if type(v) is dict]
        for channel, version, *stored in conn.execute(
            sql.SELECT_BLOBS_FOR_PAGE, ("[" + ",".join(readable) + "]", thread_id, ns)
        ):
            _add(blobs, channel, version, stored)
        _fetch_bases(conn, thread_id, ns, blobs)
        writes: dict[str, list[Any]] = {r[2]: [] for r in group}
        ids = json.dumps(list(writes))
        for checkpoint_id, *write in conn.execute(
            sql.SELECT_WRITES_FOR_CHECKPOINTS, (thread_id, ns, ids)
        ):
            writes[checkpoint_id].append(write)
        for r, v in zip(group, parsed, strict=True):
            fetched[thread_id, ns, r[2]] = (r, v, True, blobs, writes[r[2]])
    return [fetched[row[0], row[1], row[2]] for row in rows]


def _add(blobs: Blobs, channel: str, version: str, stored: list[Any]) -> None:
    """A row of ``SELECT_BLOBS_FOR_*`` into ``blobs``: the value, and its base if any."""
    type_, data, base, base_type, base_data, base_base = stored
    blobs[channel, version] = (type_, data, base)
    if base_type is not None:
        blobs[channel, base] = (base_type, base_data, base_base)


def _fetch_bases(conn: sqlite3.Connection, thread_id: str, ns: str, blobs: Blobs) -> None:
    """Add to ``blobs`` the bases of its deltas that are not in it yet, down to whole
    values (a probe each: chains deeper than one). A base that is not stored stays out:
    the row that needs it is reported corrupt."""
    need = [(c, b) for (c, _), (_, _, b) in blobs.items() if b is not None and (c, b) not in blobs]
    tried: set[tuple[str, str]] = set()
    while need:
        channel, version = key = need.pop()
        if key in blobs or key in tried:
            continue
        tried.add(key)
        found = conn.execute(sql.SELECT_BLOB, (thread_id, ns, channel, version)).fetchone()
        if found is not None:
            blobs[key] = found
            if found[2] is not None:
                need.append((channel, found[2]))


def decode_tuple(
    fetched: Fetched,
    serde: SerializerProtocol,
    deltas: ListDeltaEncoder | None = None,
    copies: ValueCopies | None = None,
) -> CheckpointTuple:
    """The tuple ``fetched`` holds. ``deltas``: the encoder to tell what a resuming graph
    loaded (``aget_tuple``), whose ``copies`` then decode; ``copies``: the saver's copies
    of decoded values, for a read that tells nothing (a page). Run after the read
    transaction: SQLite's own work runs first, before the decoding of the values (most of
    a read) evicts it from the CPU's caches."""
    row, versions, whole, blobs, writes = fetched
    if isinstance(versions, CorruptRecordError):
        raise versions
    (thread_id, ns, checkpoint_id, parent_id, type_, data, metadata, _) = row
    if copies is None and deltas is not None:
        copies = deltas.copies
    reader = serde if copies is None else copies.reader(serde)
    loads = reader.loads_typed
    try:  # the serializer's own: a checkpoint holds no message (its values are blobs)
        checkpoint = serde.loads_typed((type_, data if data is not None else b""))
    except Exception as exc:
        raise _corrupt("checkpoint", row, exc) from exc
    if not isinstance(checkpoint, dict) or "id" not in checkpoint:
        why = f"decoded to {type(checkpoint).__name__}, not a checkpoint dict"
        raise _corrupt("checkpoint", row, TypeError(why))
    try:
        meta = json.loads(metadata)
    except Exception as exc:
        raise _corrupt("metadata", row, exc) from exc
    if type(meta) is not dict:
        raise _corrupt("metadata", row, TypeError(f"decoded to {type(meta).__name__}"))
    pending = []
    for task_id, channel, wtype, value in writes:
        try:
            pending.append((task_id, channel, loads((wtype, value if value is not None else b""))))
        except Exception as exc:
            raise _corrupt("pending write", row, exc, task_id=task_id, channel=channel) from exc
    own_versions = checkpoint.get("channel_versions") or {}
    if whole:
        if versions != own_versions:
            check_versions(versions, own_versions, **_where(row))
    elif versions != own_versions and not _names_all(versions, own_versions):
        # some without a value, or a corrupt column (equal: every version has its value)
        column = stored_versions(row)
        if isinstance(column, CorruptRecordError):
            raise column
        check_versions(column, own_versions, **_where(row))
    values: dict[str, Any] = {}  # last: most of the decoding
    for channel, version in versions.items():
        stored = blobs.get((channel, version))
        if stored is None:  # a version without a stored value (a join leaves it out)
            continue
        btype, blob, base = stored
        if btype == "empty":
            continue
        depth, own = 0, None
        if base is not None:  # a delta: resolved through its bases
            value, depth, own = resolve_delta(
                reader,
                btype,
                blob,
                base,
                lambda v: blobs.get((channel, v)),  # noqa: B023 - called here, at once
                thread_id=thread_id,
                checkpoint_ns=ns,
                checkpoint_id=checkpoint_id,
                channel=channel,
            )
        else:
            try:
                value = loads((btype, blob if blob is not None else b""))
            except Exception as exc:
                raise _corrupt("channel value", row, exc, channel=channel) from exc
        values[channel] = value
        if deltas is not None:
            deltas.loaded(thread_id, ns, channel, version, value, depth, own)
    return stored_tuple(thread_id, ns, checkpoint_id, parent_id, checkpoint, values, meta, pending)


def decode_page(
    rows: Sequence[Fetched], serde: SerializerProtocol, copies: ValueCopies | None = None
) -> Iterable[CheckpointTuple]:
    """The tuples of a page of ``alist``, decoded here (on the worker, after the read
    transaction), through the saver's ``copies`` when given. A row that does not decode
    ends the page: the tuples before it are yielded, then its :class:`CorruptRecordError`
    is raised (as a row-by-row read would)."""
    tuples: list[CheckpointTuple] = []
    for fetched in rows:
        try:
            tuples.append(decode_tuple(fetched, serde, None, copies))
        except CorruptRecordError as exc:
            return _then_raise(tuples, exc)
    return tuples


def _then_raise(
    tuples: list[CheckpointTuple], exc: CorruptRecordError
) -> Iterator[CheckpointTuple]:
    yield from tuples
    raise exc


def _names_all(found: dict[str, Any], own: Any) -> bool:
    """Whether the pairs found with a stored value are exactly the checkpoint's versions
    (most reads): then the column names nothing else worth reading, and is not parsed."""
    if not isinstance(own, dict) or len(found) != len(own):
        return False
    return all(str(own.get(channel)) == version for channel, version in found.items())


def _where(row: Row) -> dict[str, Any]:
    return {"thread_id": row[0], "checkpoint_ns": row[1], "checkpoint_id": row[2]}


def _corrupt(what: str, row: Row, cause: BaseException, **more: Any) -> CorruptRecordError:
    """The error for a stored ``what`` of ``row`` that does not decode."""
    return CorruptRecordError(what, location={**_where(row), **more}, cause=cause)


def decode_metadata(text: str, **where: Any) -> dict[str, Any]:
    """A checkpoint's stored metadata, which must be a JSON object."""
    try:
        metadata = json.loads(text)
    except Exception as exc:
        raise CorruptRecordError("metadata", location=where, cause=exc) from exc
    if not isinstance(metadata, dict):
        raise CorruptRecordError(
            "metadata", location=where, cause=TypeError(f"decoded to {type(metadata).__name__}")
        )
    return metadata


__all__ = [
    "decode_metadata",
    "decode_page",
    "decode_tuple",
    "fetch_page",
    "fetch_tuple",
    "stored_versions",
]
