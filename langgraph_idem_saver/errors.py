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
    """A ``RunnableConfig`` lacks a required key or holds one of the wrong type.

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
    """The file or server we were pointed at is not a database we can use."""


class DatabaseLockedError(IdemSaverError):
    """Another process held the database's write lock past the busy timeout.

    Retryable: nothing was written by the failed call.
    """


class ConnectionClosedError(IdemSaverError):
    """The saver's connection was closed (or lost) before or during the call."""


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


class LedgerStateError(IdemSaverError):
    """A ledger transition was refused: the entry is not in the state the call expects
    (e.g. recording an outcome for a claim another process took over)."""
