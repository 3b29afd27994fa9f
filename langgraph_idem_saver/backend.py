"""The contract between the shared saver code and a backend: what the backend's SQL
provides and the domain objects its ledger hooks receive.

In the manner of DBOS's ``SystemDatabase``: the policy is written once
(:class:`~langgraph_idem_saver.ledger_policy.LedgerPolicy`); a backend gives a ``sql``
module that is a :class:`LedgerStatements` (mypy checks it) and implements narrow hooks
that take these objects, not loose positional lists kept in step by convention.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable
from itertools import repeat
from typing import Any, Protocol

from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from langgraph_idem_saver.json_text import encoder_of
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    LedgerEntry,
    StepLookup,
    records_of,
    records_over,
)

__all__ = [
    "INTENT_COLUMNS",
    "LEDGER_COLUMNS",
    "CheckpointPut",
    "Claims",
    "Guarded",
    "LedgerStatements",
    "ListPage",
    "step_params",
]

# the ledger's columns as every backend selects them: LedgerEntry's fields, in order
LEDGER_COLUMNS = ", ".join(f.name for f in dataclasses.fields(LedgerEntry))
_ENTRY_FIELDS = tuple(f.name for f in dataclasses.fields(LedgerEntry))
# what a claim inserts per call: CallIntent's fields, in order (then owner and lease)
INTENT_COLUMNS = tuple(f.name for f in dataclasses.fields(CallIntent))
# what a claim's INSERT writes beside the intent's columns, owner and lease
_ISSUED_DEFAULTS: dict[str, Any] = {
    "status": CallStatus.ISSUED, "attempts": 1, "replays": 0, "conflicts": 0,
    "finished_at": None, "result_type": None, "result": None, "error": None,
    "adopted_by": None, "history": None,
}  # fmt: skip
# a fork slot's columns, in the order of ``ledger.slot_of``
SLOT_COLUMNS = ("scope", "position", "tool_name", "args_hash", "occurrence")


class LedgerStatements(Protocol):
    """The ledger SQL a backend's ``sql`` module provides (the base's ``_sql``).

    Written once per dialect, bound in the order the base passes parameters (listed per
    statement). ``SELECT_*`` statements and guarded updates yield ``LEDGER_COLUMNS`` rows.
    """

    SELECT_ENTRY: str  # scope, key
    SELECT_ORPHAN_CANDIDATES: str  # scope, agent_path, tool_name, args_hash
    SELECT_AT_POSITION: str  # scope, position, tool_name (oldest first)
    # scope, agent_path, [[tool_name, args_hash], ...], scope, [[position, tool_name], ...]
    # (JSON): the union of both look-ups for a step, each entry once, oldest first
    SELECT_STEP_CANDIDATES: str
    SELECT_ALL_ENTRIES: str  # -
    SELECT_ENTRIES_OF_THREAD: str  # thread_id
    SELECT_ENTRIES_OF_AGENT: str  # thread_id, agent_path
    SELECT_ISSUED: str  # -
    # owner, issued_at, lease_expires_at, scope, key, expected attempts, expected owner
    RECLAIM_ENTRY: str
    RELEASE_ENTRY: str  # scope, key, owner
    ADOPT_ENTRY: str  # tool_call_id, scope, key, previous adopted_by
    ABANDON_ENTRY: str  # lease_expires_at, error, scope, key, owner
    # status, result_type, result, error, finished_at, scope, key, attempts, owner
    RESOLVE_ENTRY: str
    # status, owner, lease_expires_at, result_type, result, error, finished_at, history,
    # then the guard: scope, key, status, attempts, owner
    OPERATOR_UPDATE: str
    NOTE_REPLAY: str  # scope, key
    NOTE_CONFLICT: str  # scope, key
    # INTENT_COLUMNS, owner, issued_at, lease_expires_at, result_type, result, finished_at
    INSERT_ANSWER: str


@dataclasses.dataclass(frozen=True)
class Guarded:
    """A guarded UPDATE of the entry ``(scope, key)``: ``query`` (one of the
    ``LedgerStatements``) with ``params``. ``before_tool_runs``: its commit lets a tool run,
    so it must be durable whatever the backend's setting."""

    query: str
    params: tuple[Any, ...]
    scope: str
    key: str
    before_tool_runs: bool = False


@dataclasses.dataclass(frozen=True)
class Claims:
    """One ``aclaim`` as a backend writes it: per intent a row of ``INTENT_COLUMNS``
    values (args as stored), and the owner and lease all rows share."""

    rows: list[tuple[Any, ...]]
    owner: str
    issued_at: float
    lease_expires_at: float
    # the args in clear, when ``rows`` hold them sealed (an encrypting serializer)
    clear_args: list[bytes] | None = None

    def params(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """One row's INSERT parameters: its intent's columns, owner, issued_at, lease."""
        return (*row, self.owner, self.issued_at, self.lease_expires_at)

    def issued_entry(self, index: int) -> LedgerEntry:
        """The entry the claim of ``rows[index]`` inserted, exactly as ``entry_of`` would
        read it back (args in clear): a backend builds the entries it inserted instead of
        reading them. The columns not in the row are the INSERT's ``issued`` defaults."""
        values = dict(self._issued_columns)  # one copy and one update: ~1.5 µs an entry
        values.update(zip(INTENT_COLUMNS, self.rows[index], strict=True))
        if self.clear_args is not None:
            values["args"] = self.clear_args[index]
        return LedgerEntry._of(values)

    def issued_entries(self) -> list[LedgerEntry]:
        """:meth:`issued_entry` of every row, built at once from the rows' columns (a
        claim that inserted all its rows: a wide step's, 50 entries)."""
        if not self.rows:
            return []
        if self.clear_args is None:  # one dict copied an entry (``records_over``)
            template = dict.fromkeys(_ENTRY_FIELDS)  # every field, in order
            template.update(self._issued_columns)
            return records_over(LedgerEntry, template, INTENT_COLUMNS, self.rows)
        columns: dict[str, Iterable[Any]] = {
            name: repeat(value) for name, value in self._issued_columns.items()
        }
        columns.update(zip(INTENT_COLUMNS, zip(*self.rows, strict=True), strict=True))
        columns["args"] = self.clear_args
        return records_of(LedgerEntry, columns, len(self.rows))

    @functools.cached_property
    def _issued_columns(self) -> dict[str, Any]:
        """What every row of this claim has beside its intent: the ``issued`` defaults,
        the owner and the lease (worked out once per claim, not once per row)."""
        return {
            **_ISSUED_DEFAULTS,
            "owner": self.owner,
            "issued_at": self.issued_at,
            "lease_expires_at": self.lease_expires_at,
        }

    def slot(self, row: tuple[Any, ...]) -> tuple[Any, ...]:
        """The fork slot ``row`` claims, as ``ledger.slot_of`` gives it for an entry."""
        named = dict(zip(INTENT_COLUMNS, row, strict=True))
        return tuple(named[c] for c in SLOT_COLUMNS)


@dataclasses.dataclass(slots=True, eq=False)
class CheckpointPut:
    """One ``aput`` as a backend writes it: the thread and namespace, the parent (the
    config's checkpoint id), the checkpoint, its metadata with the config's merged in
    (``get_checkpoint_metadata``) and the channels with new versions.

    Not frozen, though never changed once built: a frozen dataclass's ``__init__`` sets
    each field through ``object.__setattr__`` (~3 µs against ~0.6 µs, once a put); nothing
    hashes or compares one (``eq=False``: identity, as for any carrier of dicts)."""

    thread_id: str
    ns: str
    parent_id: str | None
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions


@dataclasses.dataclass(frozen=True)
class ListPage:
    """One page of ``alist`` as a backend read it. ``fetched``: the rows the statement
    returned (fewer than asked: the last page); ``last``: the key of the last of them,
    ``(checkpoint_id, thread_id, checkpoint_ns)``, where the next page starts; ``tuples``:
    those that pass the metadata filter (the SQL only narrows), which a backend may
    decode lazily, as they are yielded."""

    fetched: int
    last: tuple[str, str, str] | None
    tuples: Iterable[CheckpointTuple]


_JSON = encoder_of()  # json.dumps's text (json_text.py: without its Python frames)


def step_params(lookup: StepLookup) -> tuple[Any, ...]:
    """``SELECT_STEP_CANDIDATES``' parameters: the signatures and spots go as JSON arrays,
    the one list parameter both dialects can bind."""
    signatures, spots = _JSON(lookup.signatures), _JSON(lookup.spots)
    return (lookup.scope, lookup.agent_path, signatures, lookup.scope, spots)
