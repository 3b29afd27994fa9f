"""Copying one of LangGraph's checkpoints into our saver, and checking the copy.

Used by :func:`langgraph_idem_saver.import_langgraph.aimport_langgraph`, which reads the
rows; here each checkpoint goes through the saver's own ``aput`` with what a live run
would have passed (so our storage format is what a live run writes), its pending writes
are stored as LangGraph's saver stored them (each at its index, values re-serialized by
ours), and the copy is read back and compared with its source.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any, cast

from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.errors import ImportLayoutError, ImportVerificationError
from langgraph_idem_saver.import_rows import ImportReport, SourceRow
from langgraph_idem_saver.saver_checkpoints import CheckpointMethods
from langgraph_idem_saver.saver_codec import decode_typed
from langgraph_idem_saver.saver_config import make_config

# one pending write to store: task id, task path, index, channel, decoded value
Write = tuple[str, str, int, str, Any]


class Copier:
    """Writes source rows through the saver, keeping what a live run would have kept."""

    def __init__(self, saver: CheckpointMethods, report: ImportReport, verify: bool) -> None:
        self.saver = saver
        self.report = report
        self.verify = verify
        # per (thread, namespace) being copied: versions of its checkpoints (for the
        # parent's), and the last list of each channel (to share its objects)
        self._scope: tuple[str, str] | None = None
        self._versions: dict[str, dict[str, Any]] = {}
        self._lists: dict[str, list[Any]] = {}

    def written(self) -> int:
        """How many checkpoints and writes this copier has written (grows when it writes)."""
        return self.report.checkpoints_imported + self.report.writes_imported

    async def acopy(
        self, row: SourceRow, *, present: set[tuple[str, int]] | None, into: str
    ) -> None:
        """Copy ``row`` under thread id ``into`` (the staging id of its thread, renamed to
        its own once the whole thread is in: :mod:`langgraph_idem_saver.import_langgraph`).
        ``present``: the (task id, index) of its writes in our tables when the checkpoint
        is there already (then only writes it lacks are copied), else None."""
        report = self.report
        report.checkpoints_found += 1
        report.count_thread(row.thread_id)
        scope = (row.thread_id, row.checkpoint_ns)
        if scope != self._scope:
            self._scope, self._versions, self._lists = scope, {}, {}
        if present is not None:  # not even decoded: a child of it is written as after a
            # resume; writes LangGraph's saver added to it since (a task that finished
            # there, an answer) are staged with the thread's other changes
            report.checkpoints_present += 1
            await self._acopy_new_writes(row, present, into)
            return
        versions = dict(row.checkpoint.get("channel_versions") or {})
        values = self._share_prefixes(dict(row.checkpoint.get("channel_values") or {}))
        parent_versions = self._versions.get(row.parent_id or "")
        self._versions[row.checkpoint_id] = versions
        writes = self._decoded_writes(row)
        if writes:
            await self.saver._insert_writes(
                [
                    (into, row.checkpoint_ns, row.checkpoint_id, *w[:4], *self.saver._dump(w[4]))
                    for w in writes
                ]
            )
        new_versions = (
            {ch: v for ch, v in versions.items() if ch in values}
            if parent_versions is None
            else {ch: v for ch, v in versions.items() if parent_versions.get(ch) != v}
        )
        parent: dict[str, Any] = {"thread_id": into, "checkpoint_ns": row.checkpoint_ns}
        if row.parent_id is not None:
            parent["checkpoint_id"] = row.parent_id
        checkpoint = cast(Checkpoint, {**row.checkpoint, "channel_values": values})
        await self.saver.aput(
            {"configurable": parent},
            checkpoint,
            cast(CheckpointMetadata, row.metadata),
            new_versions,
        )
        report.checkpoints_imported += 1
        report.values_written += len(new_versions)
        report.writes_imported += len(writes)
        if self.verify:
            got = await self._averify(row, into, writes, new_versions)
            report.verified += 1
            # reading it back made the saver remember the objects it read as the base of
            # the next delta (as when a graph resumes): build the next lists from those
            for channel, value in got.checkpoint["channel_values"].items():
                if type(value) is list:
                    self._lists[channel] = value

    async def _acopy_new_writes(
        self, row: SourceRow, present: set[tuple[str, int]], into: str
    ) -> None:
        new = [w for w in row.writes if (w.task_id, w.idx) not in present]
        if not new:
            return
        writes = self._decoded_writes(replace(row, writes=new))
        await self.saver._insert_writes(
            [
                (into, row.checkpoint_ns, row.checkpoint_id, *w[:4], *self.saver._dump(w[4]))
                for w in writes
            ]
        )
        self.report.writes_imported += len(writes)

    def _share_prefixes(self, values: dict[str, Any]) -> dict[str, Any]:
        """Lists that extend the previous checkpoint's list are rebuilt from its very
        objects, so our saver stores the appended items only (``list_deltas``), as it
        would have in a live run; equal values, fewer bytes."""
        for channel, value in values.items():
            prev = self._lists.get(channel)
            if (
                type(value) is list
                and type(prev) is list
                and len(value) > len(prev)
                and value[: len(prev)] == prev
            ):
                values[channel] = value = prev + value[len(prev) :]
            if type(value) is list:
                self._lists[channel] = value
            else:
                self._lists.pop(channel, None)
        return values

    def _decoded_writes(self, row: SourceRow) -> list[Write]:
        """The checkpoint's pending writes, each at the index LangGraph's saver stored it
        at, in the order both savers read them back (task path, task id, index).

        Kept as stored, not replayed through ``aput_writes``: one task's writes come from
        several ``put_writes`` calls (an interrupt, then its answer, then the task's
        result), so its ordinary indexes need not start at 0 nor follow each other, and
        the special ones (``WRITES_IDX_MAP``: error, scheduled, interrupt, resume) sit
        beside them. What LangGraph's ``put_writes`` never writes - a special channel at
        another index, an ordinary one at a negative index - is refused."""
        for w in row.writes:
            special = WRITES_IDX_MAP.get(w.channel)
            if (special is not None and w.idx != special) or (special is None and w.idx < 0):
                ws = [x for x in row.writes if (x.task_id, x.task_path) == (w.task_id, w.task_path)]
                raise ImportLayoutError(
                    f"pending writes of task {w.task_id!r} at {row.where} have indexes "
                    f"{[x.idx for x in ws]} for channels {[x.channel for x in ws]}: "
                    f"{w.channel!r} at index {w.idx}, where LangGraph's put_writes never "
                    "writes it; nothing of that thread was imported"
                )
        ordered = sorted(row.writes, key=lambda w: (w.task_path, w.task_id, w.idx))
        return [
            (
                w.task_id,
                w.task_path,
                w.idx,
                w.channel,
                decode_typed(
                    self.saver.serde,
                    w.type or "",
                    w.value,
                    "pending write",
                    task_id=w.task_id,
                    channel=w.channel,
                    **row.where,
                ),
            )
            for w in ordered
        ]

    async def _averify(
        self, row: SourceRow, into: str, writes: list[Write], new_versions: dict[str, Any]
    ) -> CheckpointTuple:
        got = await self.saver.aget_tuple(make_config(into, row.checkpoint_ns, row.checkpoint_id))
        expected = _as_stored(row.checkpoint, got, new_versions)
        pending = [(task_id, channel, value) for task_id, _, _, channel, value in writes]
        differs = _difference(row, expected, got, pending, self.saver.serde)
        if differs:
            raise ImportVerificationError(
                f"checkpoint {row.where} read back from our tables differs from LangGraph's "
                f"row in its {differs}; the import stopped there, and nothing of that "
                "thread was imported"
            )
        assert got is not None  # _difference said so
        return got


def _as_stored(
    checkpoint: dict[str, Any], got: CheckpointTuple | None, new_versions: dict[str, Any]
) -> dict[str, Any]:
    """The source checkpoint as our storage returns it. We keep one value per (channel,
    version), as LangGraph's Postgres saver does; its SQLite saver keeps values per
    checkpoint, and leaves out a ``DeltaChannel`` snapshot in the checkpoints after it
    that still have its version. Ours returns that value there: it was stored, and
    checked, with the earlier checkpoint (a channel not in ``new_versions``)."""
    if got is None:
        return checkpoint
    values = checkpoint.get("channel_values") or {}
    carried = {
        channel: value
        for channel, value in got.checkpoint["channel_values"].items()
        if channel not in values and channel not in new_versions
    }
    if not carried:
        return checkpoint
    return {**checkpoint, "channel_values": {**values, **carried}}


def _difference(
    row: SourceRow,
    expected: dict[str, Any],
    got: CheckpointTuple | None,
    writes: Sequence[tuple[str, str, Any]],
    serde: SerializerProtocol,
) -> str:
    """The first part of the copy that differs from the source ('' when none does)."""
    if got is None:
        return "existence (it is missing)"
    parent = got.parent_config["configurable"]["checkpoint_id"] if got.parent_config else None
    for part, ours, theirs in (
        ("checkpoint", got.checkpoint, expected),
        ("metadata", got.metadata, row.metadata),
        ("parent checkpoint id", parent, row.parent_id),
        ("pending writes", list(got.pending_writes or []), list(writes)),
    ):
        if not _same(ours, theirs, serde):
            return part
    return ""


def _same(ours: Any, theirs: Any, serde: SerializerProtocol) -> bool:
    """Equal, part by part; a part that is not equal to itself (a NaN inside a value)
    counts as the same when it serializes to the same bytes."""
    if ours == theirs:
        return True
    if isinstance(ours, dict) and isinstance(theirs, dict):
        return ours.keys() == theirs.keys() and all(_same(ours[k], theirs[k], serde) for k in ours)
    if isinstance(ours, (list, tuple)) and type(ours) is type(theirs) and len(ours) == len(theirs):
        return all(_same(a, b, serde) for a, b in zip(ours, theirs, strict=True))
    try:
        return serde.dumps_typed(ours) == serde.dumps_typed(theirs)
    except Exception:  # not serializable: then they differ, and the caller says where
        return False
