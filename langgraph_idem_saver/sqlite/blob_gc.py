"""Deleting the channel values (``idem_blobs`` rows) no remaining checkpoint needs.

Shared by the saver (``aprune``'s ``keep_latest``, ``adelete_for_runs``) and by
inspection's ``adelete_checkpoints`` (``idem-saver prune --before``): each deletes
checkpoints, then the values only they referenced.

A remaining checkpoint whose ``channel_versions`` column is not an object of versions
(edited by hand) stops the collection with :class:`CorruptRecordError` naming it, before
anything is deleted: what it references cannot be known, so nothing may be called dead.
"""

from __future__ import annotations

import sqlite3

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.saver_codec import decode_json
from langgraph_idem_saver.sqlite import sql


def collect_blobs(conn: sqlite3.Connection, thread_id: str) -> None:
    """Delete the thread's blobs that no remaining checkpoint references, directly or as
    the base of a referenced delta."""
    live: set[tuple[str, str, str]] = set()
    for ns, checkpoint_id, versions in conn.execute(sql.SELECT_LIVE_VERSIONS, (thread_id,)):
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": checkpoint_id}
        named = decode_json(versions, "channel_versions", **where)
        if type(named) is not dict or any(type(v) is not str for v in named.values()):
            why = TypeError(f"holds {type(named).__name__}, not an object of versions")
            raise CorruptRecordError("channel_versions", location=where, cause=why)
        for channel, version in named.items():
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
