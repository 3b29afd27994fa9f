"""The blob of one channel version with the chain of bases its delta extends, as SQL.

Both reads that load channel values in one statement (``sql.SELECT_TUPLES`` and
``delta_history_sql.delta_history_sql``) embed it as a ``CROSS JOIN LATERAL`` subquery, so
the walk is written once: each step is a primary-key probe (``LATERAL ... LIMIT 1``: a
plain join there gets planned as a scan of the channel's blobs), ordered by depth.
"""

from __future__ import annotations

from langgraph_idem_saver.list_deltas import MAX_CHAIN

# bases followed at most: a longer chain is corrupt (reported by resolve_value)
CHAIN_LIMIT = 4 * MAX_CHAIN + 1

_BLOB_CHAIN = """WITH RECURSIVE blobs (version, type, blob, base_version, depth) AS (
    (SELECT bl.version, bl.type, bl.blob, bl.base_version, 0
     FROM idem_blobs AS bl
     WHERE bl.thread_id = {thread_id} AND bl.checkpoint_ns = {ns}
       AND bl.channel = {channel} AND bl.version = {version}
     LIMIT 1)
    UNION ALL
    SELECT bl.version, bl.type, bl.blob, bl.base_version, bs.depth + 1
    FROM blobs AS bs CROSS JOIN LATERAL (
        SELECT x.version, x.type, x.blob, x.base_version FROM idem_blobs AS x
        WHERE x.thread_id = {thread_id} AND x.checkpoint_ns = {ns}
          AND x.channel = {channel} AND x.version = bs.base_version
        LIMIT 1
    ) AS bl
    WHERE bs.base_version IS NOT NULL AND bs.depth < {limit}
)
SELECT * FROM blobs"""


def blob_chain_sql(*, thread_id: str, ns: str, channel: str, version: str) -> str:
    """The subquery yielding ``(version, type, blob, base_version, depth)`` rows for the
    blob of ``channel`` at ``version`` and its bases; each argument is an SQL expression
    of the enclosing query (a column or a parameter)."""
    return _BLOB_CHAIN.format(
        thread_id=thread_id, ns=ns, channel=channel, version=version, limit=CHAIN_LIMIT
    )
