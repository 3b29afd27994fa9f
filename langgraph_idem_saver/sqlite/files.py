"""Where a SQLite database lives, and why it cannot be opened or written.

SQLite reports a bad path as ``unable to open database file`` and a read-only one as
``attempt to write a readonly database``, naming no file, and a read-only *file* opens
without complaint (SQLite falls back to read-only) until the first write. This module
turns those into the package's typed errors, each naming the path and what to do:

* a missing directory, or a directory given as the path: :class:`ConfigError`;
* a read-only file, a directory in which SQLite cannot create its ``-wal``/``-shm``
  (or ``-journal``) files, a read-only file system, a connection opened read-only:
  :class:`ReadOnlyDatabaseError`;
* a file or directory this process may not even read: :class:`DatabasePermissionError`;
* a file that is not SQLite: :class:`NotADatabaseError` (that one only).

It also picks how the command line opens a database read-only (:func:`read_only_uri`).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from langgraph_idem_saver.errors import (
    ConfigError,
    DatabasePermissionError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
)
from langgraph_idem_saver.sqlite.runner import connect_arguments

_TRUE = ("1", "yes", "true", "on")


@dataclass(frozen=True)
class SqliteTarget:
    """What a saver was pointed at.

    ``path`` is the database file (absolute; None for an in-memory or temporary
    database); ``read_only`` whether the caller asked for a read-only connection
    (``mode=ro`` or ``immutable=1`` in a ``file:`` URI; None when unknown).
    """

    path: str | None
    read_only: bool | None = False

    @property
    def shown(self) -> str:
        """How messages name the database."""
        return self.path if self.path else "the in-memory SQLite database"


def parse_target(database: str, uri: bool) -> SqliteTarget:
    """The file and read-only request behind ``sqlite3.connect(database, uri=uri)``."""
    if not (uri and database.startswith("file:")):
        if database in ("", ":memory:"):
            return SqliteTarget(None)
        return SqliteTarget(os.path.abspath(database))
    parts = urlsplit(database)
    query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
    read_only = query.get("mode") == "ro" or query.get("immutable", "").lower() in _TRUE
    path = unquote(parts.path)
    if query.get("mode") == "memory" or path in ("", ":memory:"):
        return SqliteTarget(None, read_only)
    return SqliteTarget(os.path.abspath(path), read_only)


def target_of_connection(conn: Any) -> SqliteTarget:
    """The target of an ``aiosqlite.Connection``, from the arguments it was opened with
    (``runner.connect_arguments``); ``read_only`` is None when they cannot be found, so
    nothing is refused on a guess."""
    found = connect_arguments(conn)
    if found is None:
        return SqliteTarget(None, None)
    database, kwargs = found
    if isinstance(database, bytes):
        database = database.decode("utf-8", "replace")
    return parse_target(os.fspath(database), bool(kwargs.get("uri")))


def error_kind(exc: BaseException) -> str:
    """``readonly``, ``cantopen``, ``notadb``, ``full`` or ``other`` for a ``sqlite3`` error
    (by its error code where Python exposes it - 3.11+ - else by SQLite's message)."""
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    msg = str(exc)
    if name.startswith("SQLITE_READONLY") or "readonly database" in msg:
        return "readonly"
    if name.startswith("SQLITE_CANTOPEN") or "unable to open database" in msg:
        return "cantopen"
    if name.startswith(("SQLITE_NOTADB", "SQLITE_CORRUPT")) or (
        "not a database" in msg or "malformed" in msg
    ):
        return "notadb"
    if name.startswith("SQLITE_FULL") or "database or disk is full" in msg:
        return "full"
    return "other"


def _exists(path: str) -> bool:
    return os.path.lexists(path)


def open_error(target: SqliteTarget, exc: BaseException) -> Exception:
    """The typed error for a database that failed to open (or to be read at all)."""
    kind = error_kind(exc)
    if kind == "notadb":
        return NotADatabaseError(
            f"{target.shown} is not a SQLite database (or is damaged): {exc}; nothing was changed"
        )
    path = target.path
    if path is None:
        return ConfigError(f"cannot open {target.shown}: {exc}")
    parent = os.path.dirname(path)
    if os.path.isdir(path):
        return ConfigError(
            f"{path} is a directory, not a SQLite database file: give a file path "
            f"(e.g. {os.path.join(path, 'agent.db')})"
        )
    if not os.path.isdir(parent):
        missing = parent
        while missing != os.path.dirname(missing) and not _exists(os.path.dirname(missing)):
            missing = os.path.dirname(missing)
        what = "is not a directory" if _exists(parent) else "does not exist"
        return ConfigError(
            f"cannot open SQLite database {path}: directory {parent} {what} "
            f"(the saver creates the file, not its directories)"
            + (f"; {missing} is the first missing one" if missing != parent else "")
        )
    if not os.access(parent, os.X_OK):
        return DatabasePermissionError(
            f"cannot open SQLite database {path}: this process may not enter directory "
            f"{parent} (permission denied)",
            path=path,
        )
    if not _exists(path):
        if target.read_only:
            return ConfigError(
                f"no SQLite database at {path} (opened read-only, so none was created)"
            )
        if not os.access(parent, os.W_OK):
            return ReadOnlyDatabaseError(
                f"cannot create SQLite database {path}: directory {parent} is not "
                "writable by this process",
                path=path,
            )
    elif not os.access(path, os.R_OK):
        return DatabasePermissionError(
            f"cannot open SQLite database {path}: this process may not read it (permission denied)",
            path=path,
        )
    if kind == "readonly":
        if target.read_only and not os.access(parent, os.W_OK):
            name = os.path.basename(path)
            return ReadOnlyDatabaseError(
                f"cannot read SQLite database {path} read-only: it is in WAL mode and "
                f"directory {parent} is not writable, so SQLite cannot create {name}-shm to "
                f"read it; open it as '{Path(path).as_uri()}?immutable=1' (exact while no "
                "process can write that directory)",
                path=path,
            )
        return read_only_error(target, exc)
    return ConfigError(f"cannot open SQLite database {path}: {exc}")


def read_only_reason(target: SqliteTarget) -> str | None:
    """Why this process cannot write ``target`` (None when nothing stops it).

    A write needs the file writable and, in WAL mode, the ``-wal`` and ``-shm`` files
    beside it: existing and writable, or a writable directory to create them in.
    """
    path = target.path
    if path is None:
        return None
    if target.read_only:
        return "the connection was opened read-only (mode=ro or immutable=1 in its URI)"
    if _exists(path) and not os.access(path, os.W_OK):
        return "the file is read-only for this process (permissions or a read-only file system)"
    parent = os.path.dirname(path)
    companions = all(os.access(path + suffix, os.W_OK) for suffix in ("-wal", "-shm"))
    if not os.access(parent, os.W_OK) and not companions:
        name = os.path.basename(path)
        return (
            f"directory {parent} is not writable by this process, so SQLite cannot create "
            f"{name}-wal and {name}-shm (or {name}-journal) beside the database"
        )
    return None


def read_only_error(
    target: SqliteTarget, exc: BaseException | None = None, *, at_open: bool = False
) -> ReadOnlyDatabaseError:
    """The :class:`ReadOnlyDatabaseError` for ``target``, saying why and what to do."""
    reason = read_only_reason(target) or (
        f"SQLite refused the write ({exc})" if exc is not None else "it is read-only"
    )
    if at_open:
        what = f"cannot use SQLite database {target.shown} for writing: {reason}"
    else:
        what = f"cannot write SQLite database {target.shown}: {reason}; nothing was written"
    if target.path and not target.read_only:
        uri = Path(target.path).as_uri()
        what += (
            f". Fix the permissions, or open it read-only on purpose "
            f"('{uri}?mode=ro', or '{uri}?immutable=1' when its directory is read-only)"
        )
    return ReadOnlyDatabaseError(what, path=target.path)


def read_only_uris(path: Path) -> list[tuple[str, bool]]:
    """``file:`` URIs that open ``path`` read-only without ever creating it, to try in
    order, each with whether it is ``immutable``.

    ``mode=ro`` while the directory is writable: SQLite may create the ``-wal``/``-shm``
    files a WAL database needs to be read consistently alongside a live writer.
    ``immutable=1`` when the directory is not writable: a WAL database cannot be opened
    ``mode=ro`` there unless its ``-shm`` exists, and no process without write access to
    the directory can be writing it (it could not create a ``-wal`` or ``-journal``
    either), so reading the file as it stands is exact. When a ``-wal`` file is there,
    ``mode=ro`` is tried first, as it reads the ``-wal`` too.
    """
    resolved = path.resolve()
    uri = resolved.as_uri()
    if os.access(resolved.parent, os.W_OK):
        return [(uri + "?mode=ro", False)]
    if _exists(f"{resolved}-wal"):
        return [(uri + "?mode=ro", False), (uri + "?immutable=1", True)]
    return [(uri + "?immutable=1", True)]


__all__ = [
    "SqliteTarget",
    "error_kind",
    "open_error",
    "parse_target",
    "read_only_error",
    "read_only_reason",
    "read_only_uris",
    "target_of_connection",
]
