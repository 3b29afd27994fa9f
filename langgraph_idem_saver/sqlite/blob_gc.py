"""Deleting the channel values (``idem_blobs`` rows) no remaining checkpoint needs.

Shared by the saver (``aprune``'s ``keep_latest``, ``adelete_for_runs``) and by
inspection's ``adelete_checkpoints`` (``idem-saver prune --before``): each deletes
checkpoints, then the values only they referenced.
"""

from __future__ import annotations

import sqlite3

from langgraph_idem_saver.saver_codec import decode_json
from langgraph_idem_saver.sqlite import sql


def collect_blobs(conn: sqlite3.Connection, thread_id: str) -> None:
    """Delete the thread's blobs that no remaining checkpoint references, directly or as
    the base of a referenced delta."""
    live: set[tuple[str, str, str]] = set()
    for ns, versions in conn.execute(sql.SELECT_LIVE_VERSIONS, (thread_id,)):
        for channel, version in decode_json(
            versions, "channel_versions", thread_id=thread_id
        ).items():
            live.add((ns, channel, version))
    rows = conn.execute(sql.SELECT_BLOB_KEYS, (thread_id,)).fetchall()
    base_of = {(ns, channel, version): base for ns, channel, version, base in rows}
    for ns, channel, version in list(live):
        base = base_of.get((ns, channel, version))
        while base is not None and (ns, channel, base) not in live:
            live.add((ns, channel, base))
            base = base_of.get((ns, channel, base))
    dead = [(thread_id, *key) for key in base_of if key not in live]
    if dead:
        conn.executemany(sql.DELETE_BLOB, dead)
