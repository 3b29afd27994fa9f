"""Deleting the channel values (``idem_blobs`` rows) no remaining checkpoint of some
threads references: ``sql.COLLECT_BLOBS``, after a check that every remaining
checkpoint's ``channel_versions`` column says what it references.

Why the check: the collection reads the column as the checkpoint's references. One
edited by hand into another shape would fail the statement with a driver error (an
array or a scalar: ``jsonb_each_text`` raises) or, holding numbers, reference nothing,
and the values its checkpoint still names would be deleted (no repair could bring them
back). So a column that is not an object of strings stops the collection with
:class:`CorruptRecordError` naming the row, in the caller's transaction, before anything
is deleted. Shared by the saver (``aprune``, ``adelete_for_runs``) and inspection's
``adelete_checkpoints`` (``idem-saver prune --before``), as on SQLite
(``sqlite/blob_gc.py``).
"""

from __future__ import annotations

from typing import Any

from psycopg import AsyncCursor

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.postgres import sql

# the first remaining checkpoint of the threads whose column is not an object of strings
# (CASE: jsonb_each raises on a non-object, so it only sees objects); a thread at a time
# through its primary key (so no plan made while the table was small scans it:
# tests/test_postgres_specific.py)
SELECT_CORRUPT_VERSIONS = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id
FROM unnest(%(threads)s::text[]) AS t (id)
CROSS JOIN LATERAL (
    SELECT thread_id, checkpoint_ns, checkpoint_id FROM idem_checkpoints
    WHERE thread_id = t.id
      AND CASE WHEN jsonb_typeof(channel_versions) <> 'object' THEN TRUE
          ELSE EXISTS (SELECT 1 FROM jsonb_each(channel_versions) AS v
                       WHERE jsonb_typeof(v.value) <> 'string') END
    LIMIT 1) AS c
LIMIT 1
"""


async def acollect_blobs(cur: AsyncCursor[Any], threads: list[str]) -> int:
    """Delete the unreferenced blobs of ``threads`` (in the caller's transaction, under
    its thread locks); how many. :class:`CorruptRecordError` first, deleting nothing,
    when a remaining checkpoint's column cannot say what it references."""
    await cur.execute(SELECT_CORRUPT_VERSIONS, {"threads": threads}, prepare=False)
    found = await cur.fetchone()
    if found is not None:
        thread_id, ns, checkpoint_id = found
        raise CorruptRecordError(
            "channel_versions",
            location={"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id},
            cause=TypeError("not an object of versions: what it references is unknown"),
        )
    await cur.execute(sql.COLLECT_BLOBS, {"threads": threads}, prepare=False)
    return cur.rowcount
