"""The exception taxonomy of langgraph-idem-saver.

Every error this package raises on purpose derives from :class:`IdemSaverError`, so an
application can catch "anything the checkpointer refused" in one place, and each
subclass names one situation precisely, so it can also catch exactly the one it can
handle (a locked database is retryable; a corrupt row is not).
"""

from __future__ import annotations

from typing import Any


class IdemSaverError(Exception):
    """Base class of every error raised on purpose by langgraph-idem-saver."""


class ConfigError(IdemSaverError, ValueError):
    """A value we were given cannot be used: a ``RunnableConfig`` lacks a required key or
    holds one of the wrong type, or a database path cannot be a database file (its
    directory does not exist, it is a directory, a malformed DSN).

    Subclasses ``ValueError`` so code written against LangGraph's savers (which raise
    ``KeyError``/``ValueError`` here) keeps catching it.
    """


class SchemaVersionError(IdemSaverError):
    """The database was written by a newer version of this package.

    Opening it with an older version could silently misread rows, so we refuse and
    say which versions are involved. Upgrade the package to open it.
    """

    def __init__(self, found: int, supported: int, where: str) -> None:
        self.found = found
        self.supported = supported
        super().__init__(
            f"{where} has schema version {found}, but this langgraph-idem-saver supports "
            f"up to {supported}; it was written by a newer release. Upgrade "
            f"langgraph-idem-saver to open it (nothing was changed)."
        )


class NotADatabaseError(IdemSaverError):
    """The file we were pointed at is not a SQLite database (or is damaged beyond use).

    Only for the file's *contents*: a path we may not open or write raises
    :class:`DatabasePermissionError`, a path that cannot be a database file
    :class:`ConfigError`.
    """


class DatabasePermissionError(IdemSaverError, PermissionError):
    """The operating system denies this process access the database needs (to the file
    or to its directory).

    Not retryable: fix the permissions, or open the database another way. Subclasses
    ``PermissionError`` so code that handles OS permission errors handles this one too;
    ``path`` is the file concerned (None when unknown).
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path


class ReadOnlyDatabaseError(DatabasePermissionError):
    """The database can be read but not written: a read-only file, a directory in which
    SQLite cannot create its ``-wal``/``-shm``/``-journal`` files, a read-only file
    system, a connection opened read-only (``mode=ro``, ``immutable=1``), or a read-only
    PostgreSQL session.

    Raised when the saver opens the database if that can be seen then, otherwise by the
    first write, which has then written nothing.
    """


class DatabaseLockedError(IdemSaverError):
    """Another process held the database's write lock past the busy timeout.

    On PostgreSQL: a lock waited for past ``lock_timeout`` (SQLSTATE 55P03), a deadlock
    the server broke by failing this call (40P01), or a serialization failure under
    ``repeatable read`` / ``serializable`` isolation (40001); the server rolled the
    call's transaction back.

    Retryable: nothing was written by the failed call.
    """


class StatementTimeoutError(IdemSaverError, TimeoutError):
    """PostgreSQL cancelled a statement of the saver's: it ran (or waited for a lock)
    past ``statement_timeout``, or an operator cancelled it (``pg_cancel_backend``);
    SQLSTATE 57014.

    Retryable: the server rolled the call's transaction back, so nothing of it was
    written. Subclasses ``TimeoutError``, as a timeout of the caller's own would be.
    """


class StorageFullError(IdemSaverError, OSError):
    """The database could not grow: its disk is full, or it reached a size limit
    (SQLite's ``max_page_count``; on PostgreSQL, the disk under the data directory).

    Retryable once there is room: the failed call wrote nothing (its transaction was
    rolled back). Subclasses ``OSError``, like the ``ENOSPC`` it usually comes from.
    """


class ConnectionClosedError(IdemSaverError):
    """The saver's connection was closed (or lost) before or during the call, or could
    not be made (a PostgreSQL server that cannot be reached, a database that does not
    exist)."""


class CloseTimeoutError(IdemSaverError, TimeoutError):
    """A sync saver's ``close()`` did not finish within its bound
    (``SyncSaverBase.CLOSE_SECONDS``): something it waits on - an outcome write or a
    checkpoint call held back by another connection's lock - is still running.

    The saver is closed all the same (every later call raises
    :class:`ConnectionClosedError`); its close goes on in the background and ends when
    what blocks it does, never started twice. A tool call whose outcome was not committed
    stays ``issued``: an unknown outcome, surfaced, never re-run. Subclasses
    ``TimeoutError``, as the wait's own timeout would be.
    """


class CorruptRecordError(IdemSaverError):
    """A stored row could not be decoded.

    Names the thread, namespace and checkpoint (or ledger key) so an operator can
    find and repair or delete it; we never return ``None`` or a partial value for a
    row that exists but cannot be read.
    """

    def __init__(self, what: str, *, location: dict[str, Any], cause: BaseException) -> None:
        self.what = what
        self.location = location
        where = ", ".join(f"{k}={v!r}" for k, v in location.items())
        super().__init__(f"corrupt {what} ({where}): {type(cause).__name__}: {cause}")


class SerializationError(IdemSaverError, TypeError):
    """A value could not be serialized, so nothing was written."""


def unencodable_text(exc: UnicodeEncodeError) -> SerializationError:
    """The typed error for text a database cannot hold as UTF-8 (a lone surrogate), met
    when the driver encodes a parameter: nothing of the statement was written."""
    return SerializationError(
        f"the database cannot hold this text: {exc} (a lone surrogate is not UTF-8); "
        "nothing was written"
    )


class LedgerStateError(IdemSaverError):
    """A ledger transition was refused: the entry is not in the state the call expects
    (e.g. recording an outcome for a claim another process took over)."""


class ImportLayoutError(IdemSaverError):
    """LangGraph's own checkpoint tables cannot be imported as they are: a table or column
    an import needs is missing, or rows hold what LangGraph's savers never write.

    Raised before anything is written for a layout problem (nothing was imported), or
    naming the row for a row problem (what was imported before it stays, and a re-run
    after a repair continues from there).
    """


class ImportVerificationError(IdemSaverError):
    """A checkpoint copied from LangGraph's tables did not read back equal to its source.

    Names the thread, namespace and checkpoint and what differed; the import stopped
    there. Usually a serializer that differs from the one LangGraph's saver used.
    """
