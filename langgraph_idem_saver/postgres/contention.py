"""PostgreSQL refusing a call for another session's sake, or for time: ``lock_timeout``
(55P03), a deadlock (40P01), a serialization failure (40001), ``statement_timeout`` or an
operator's cancel (57014) - typed as :class:`DatabaseLockedError` /
:class:`StatementTimeoutError` for both the async saver and the sync paths
(``PostgresConnection._typed_error`` asks :func:`contention_error`).

Each leaves nothing written: the server fails the statement, and with it the call's
transaction (ours, or the savepoint of ours inside a transaction of the user's), before
any commit - PostgreSQL disarms ``statement_timeout`` before it commits a statement, so a
timed-out statement is never half-committed under autocommit either. The connection stays
usable. So these are *retryable*; the ledger retries an outcome's write on them as after a
lost connection, then holds it (``held_writes.py``): an outcome a timeout hit is never lost.

A cancellation of the caller's own (``asyncio`` cancelling the task) is not one of these:
psycopg cancels the statement on the server and re-raises the ``CancelledError``.
"""

from __future__ import annotations

from langgraph_idem_saver.errors import DatabaseLockedError, StatementTimeoutError

# what the server says, by SQLSTATE, and what a caller should know
_LOCKED = {
    "55P03": "a lock it needed was held past lock_timeout",
    "40P01": "it was chosen to break a deadlock with another session",
    "40001": "of a concurrent update (a serialization failure, repeatable read or serializable)",
}

# the typed errors a retry can cure, the database and the connection unharmed
TRANSIENT: tuple[type[Exception], ...] = (DatabaseLockedError, StatementTimeoutError)


def contention_error(
    exc: BaseException, sqlstate: str, *, in_users_transaction: bool = False
) -> Exception | None:
    """The typed error for a call PostgreSQL failed on a lock, a conflict or a timeout;
    None for any other error. ``in_users_transaction``: the call ran inside a transaction
    of the user's (joined, or as a savepoint of it), which the failure leaves failed (or
    rolled back to the savepoint, in a snapshot that may fail the same way again): only
    the user can end it, so "retry it" alone would not be true."""
    if in_users_transaction:
        rolled_back = (
            "it ran inside a transaction of yours, which this failure aborted (or rolled "
            "back to a savepoint)"
        )
        retry = "roll your transaction back, then retry it"
    else:
        rolled_back = "its transaction was rolled back"
        retry = "retry it"
    why = _LOCKED.get(sqlstate)
    if why is not None:
        return DatabaseLockedError(
            f"PostgreSQL refused the call: {why} ({exc}); {rolled_back}, nothing was "
            f"written: {retry}"
        )
    if sqlstate == "57014":  # query_canceled: statement_timeout, or pg_cancel_backend
        return StatementTimeoutError(
            f"PostgreSQL cancelled the statement ({exc}): statement_timeout, or an operator's "
            f"pg_cancel_backend; {rolled_back}, nothing was written: {retry} "
            "(or raise statement_timeout for the saver's connection)"
        )
    return None
