"""A claim or re-claim whose caller was cancelled, undone on SQLite.

LangGraph cancels a step's other tasks when one raises. Every SQLite write goes through
the saver's group commit (:mod:`~langgraph_idem_saver.group_commit`): a claim submitted
before its caller is cancelled - still queued, or in the transaction being committed - is
committed all the same, and its caller never learns it: no tool runs under it. Left
alone it is a live claim of this process for the whole lease: the same process's retry
waits ``wait_seconds`` on it and raises ``ToolCallInProgress`` until the lease ends.

So the cancelled caller submits an undo (``SqliteLedgerStore._undo_cut_short``), which
the group commit commits after the claim (batches run one at a time, in order; an undo
queued with its claim runs after it in the same transaction): a claim's rows deleted, a
re-claim's lease ended (its row kept: an earlier attempt may have happened - asked at
once). Each undo names the claim by its owner and its own ``issued_at`` and touches only
an ``issued`` row: never another claim of the call, never an outcome. PostgreSQL does the
same through ``postgres/held_writes.py`` (a statement there can be cancelled on the
server; here a submitted write always runs).

A release or an abandon needs nothing: submitted, it is committed all the same.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import time
from collections.abc import Callable

from langgraph_idem_saver.backend import Claims, Guarded

LOG = logging.getLogger(__name__)

Undo = Callable[[sqlite3.Connection], None]

UNCLAIM = """
DELETE FROM idem_tool_calls
WHERE scope = ? AND key = ? AND status = 'issued' AND owner = ? AND issued_at = ?
"""
END_LEASE = """
UPDATE idem_tool_calls SET lease_expires_at = ?, error = ?
WHERE scope = ? AND key = ? AND status = 'issued' AND owner = ? AND issued_at = ?
"""
RECLAIM_CUT = "CancelledError: the re-claim's caller was cancelled; no tool ran under it"


def unclaim(claims: Claims) -> Undo:
    """The rows ``claims`` inserted, deleted (a row it was refused is another claim's)."""
    rows = [(row[0], row[1], claims.owner, claims.issued_at) for row in claims.rows]

    def undo(conn: sqlite3.Connection) -> None:
        conn.executemany(UNCLAIM, rows)

    return undo


def end_lease(reclaim: Guarded) -> Undo:
    """The re-claim ``reclaim`` (``RECLAIM_ENTRY``'s parameters: owner, issued_at, lease,
    scope, key, ...) with its lease ended now."""
    owner, issued_at, _, scope, key = reclaim.params[:5]

    def undo(conn: sqlite3.Connection) -> None:
        conn.execute(END_LEASE, (time.time(), RECLAIM_CUT, scope, key, owner, issued_at))

    return undo


def logged(future: asyncio.Future[tuple[bool, object]]) -> None:
    """An undo's answer, read (nobody awaits it): a failure is logged - the claim then
    stays as it was committed, an unknown outcome once its lease ends."""
    if future.cancelled():
        return
    error: object = future.exception()
    if error is None:
        ok, value = future.result()
        error = None if ok else value
    if error is not None:
        LOG.warning("a cancelled caller's claim could not be undone: %r", error)
