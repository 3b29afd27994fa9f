"""What the savers' read-side methods return (``sqlite/inspect.py``, ``postgres/inspect.py``).

One module for both backends, so a caller (the ``idem-saver`` CLI, a dashboard) reads
either database the same way and never needs SQL of its own. Also the input checks
those methods share: ids and prefixes a database cannot hold as text are refused with
:class:`ConfigError` before any query runs, never as a driver error.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.retention import RowCounts
from langgraph_idem_saver.saver_config import storable_text


@dataclass(frozen=True)
class ThreadSummary:
    """One thread, aggregated in SQL: nothing but its latest root checkpoint is decoded.

    ``checkpoints`` counts the root namespace (what a thread's history shows by default);
    ``subgraph_checkpoints`` those of every other namespace (subgraphs, tool tasks).
    """

    thread_id: str
    checkpoints: int
    subgraph_checkpoints: int
    head_id: str | None  # the latest root checkpoint
    head: dict[str, Any] | None  # that checkpoint as stored (no channel values), decoded
    head_writes: int
    head_interrupted: bool  # it holds an ``__interrupt__`` write
    head_error: bool  # it holds an ``__error__`` write
    ledger_entries: int


@dataclass(frozen=True)
class CheckpointRow:
    """A checkpoint as a history lists it, without its channel values."""

    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: dict[str, Any]
    pending_writes: int


@dataclass(frozen=True)
class CheckpointHistory:
    """A page of one namespace's checkpoints, newest first, and how many there are."""

    total: int
    rows: list[CheckpointRow]


@dataclass(frozen=True)
class CheckpointNode:
    """A checkpoint's place in its thread's history, for planning a prune."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_checkpoint_id: str | None
    metadata: str  # JSON text, parsed only when DeltaChannel ancestry is needed
    writes: int


DeletedCounts = RowCounts
"""What :meth:`adelete_checkpoints` removed: rows of the three checkpoint tables, the
same counts a retention sweep takes of a thread (one definition for both)."""


@dataclass(frozen=True)
class StorageCounts:
    """Row counts of every table (ledger entries by state: ``inspection.astats``), the
    schema version, and the size on disk (None where the backend cannot tell)."""

    threads: int
    checkpoints: int
    blobs: int
    writes: int
    ledger_entries: int
    schema_version: int | None
    size_bytes: int | None


# The part of THREAD_SUMMARIES both dialects share: given ``t`` (per thread: root and
# subgraph checkpoint counts, the root head's id), the head's checkpoint and what its
# writes say (count, interrupted, failed). Each backend's inspect.py prefixes its ``t``.
THREAD_HEADS_SQL = """SELECT t.thread_id, t.root, t.sub, t.head, c.type, c.checkpoint,
    (SELECT COUNT(*) FROM idem_writes AS w WHERE w.thread_id = t.thread_id
        AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head),
    EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
        AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head AND w.channel = '__interrupt__'),
    EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = t.thread_id
        AND w.checkpoint_ns = '' AND w.checkpoint_id = t.head AND w.channel = '__error__')
FROM t LEFT JOIN idem_checkpoints AS c
  ON c.thread_id = t.thread_id AND c.checkpoint_ns = '' AND c.checkpoint_id = t.head
"""

# the columns of StorageCounts both dialects read alike (Postgres adds the size)
TABLE_COUNTS_COLUMNS = """(SELECT COUNT(DISTINCT thread_id) FROM idem_checkpoints),
       (SELECT COUNT(*) FROM idem_checkpoints),
       (SELECT COUNT(*) FROM idem_blobs),
       (SELECT COUNT(*) FROM idem_writes),
       (SELECT COUNT(*) FROM idem_tool_calls),
       (SELECT MAX(v) FROM idem_saver_migrations)"""


def parse_metadata(text: Any) -> dict[str, Any]:
    """Stored metadata JSON as a dict (``{}`` for anything else: a listing never fails
    on one odd row; ``aget_tuple`` is the strict reader)."""
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def decode_head(
    serde: SerializerProtocol, type_: str | None, data: bytes | None
) -> dict[str, Any] | None:
    """A stored checkpoint (without channel values), or None when it cannot be decoded:
    a summary shows such a thread as ``unknown`` rather than failing the whole list."""
    if type_ is None:
        return None
    try:
        value = serde.loads_typed((type_, data if data is not None else b""))
    except Exception:
        return None
    return value if isinstance(value, dict) else None


def thread_summaries(
    serde: SerializerProtocol, rows: Sequence[Sequence[Any]], ledger: dict[str, int]
) -> list[ThreadSummary]:
    """:class:`ThreadSummary` rows from rows of the backends' ``THREAD_SUMMARIES``,
    plus the threads that have ledger entries only."""
    out = []
    for thread_id, root, sub, head_id, type_, data, writes, interrupted, errored in rows:
        out.append(
            ThreadSummary(
                thread_id=thread_id,
                checkpoints=int(root or 0),
                subgraph_checkpoints=int(sub or 0),
                head_id=head_id,
                head=decode_head(serde, type_, data),
                head_writes=int(writes or 0),
                head_interrupted=bool(interrupted),
                head_error=bool(errored),
                ledger_entries=int(ledger.get(thread_id, 0)),
            )
        )
    seen = {s.thread_id for s in out}
    out += [
        ThreadSummary(t, 0, 0, None, None, 0, False, False, int(n))
        for t, n in ledger.items()
        if t not in seen
    ]
    return out


def checked_text(value: str, what: str) -> str:
    """``value`` if both databases can hold it as text; :class:`ConfigError` otherwise."""
    if not isinstance(value, str):
        raise ConfigError(f"{what} must be a str, got {type(value).__name__}")
    if "\x00" in value:
        raise ConfigError(f"{what} must not contain NUL (\\x00) characters")
    return storable_text(value, what)


def checked_limit(limit: int | None) -> int | None:
    """A row limit: None (all) or an int >= 0."""
    if limit is None:
        return None
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
        raise ConfigError(f"limit must be None or an int >= 0, got {limit!r}")
    return limit


def checked_keys(keys: Any) -> list[tuple[str, str, str]]:
    """``(thread_id, checkpoint_ns, checkpoint_id)`` triples, each part checked."""
    out = []
    for key in keys:
        if not isinstance(key, (tuple, list)) or len(key) != 3:
            raise ConfigError(
                f"a checkpoint key is (thread_id, checkpoint_ns, checkpoint_id), got {key!r}"
            )
        t, ns, cid = key
        out.append(
            (
                checked_text(t, "thread_id"),
                checked_text(ns, "checkpoint_ns"),
                checked_text(cid, "checkpoint_id"),
            )
        )
    return out


__all__ = [
    "TABLE_COUNTS_COLUMNS",
    "THREAD_HEADS_SQL",
    "CheckpointHistory",
    "CheckpointNode",
    "CheckpointRow",
    "DeletedCounts",
    "StorageCounts",
    "ThreadSummary",
    "checked_keys",
    "checked_limit",
    "checked_text",
    "decode_head",
    "parse_metadata",
    "thread_summaries",
]
