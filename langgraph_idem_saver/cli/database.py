"""Opening what ``--db`` names: a SQLite file or a PostgreSQL DSN, as one of our savers.

Read-only unless a command writes, and never creating a database: a read must work on a
read-only file, in a read-only directory, or in a read-only PostgreSQL session.
"""

from __future__ import annotations

import re
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from langgraph_idem_saver.cli.common import EXIT_USAGE, CliError
from langgraph_idem_saver.errors import ReadOnlyDatabaseError
from langgraph_idem_saver.sqlite.files import (
    SqliteTarget,
    error_kind,
    open_error,
    read_only_uris,
)

if TYPE_CHECKING:
    from langgraph_idem_saver.postgres import AsyncPostgresSaver
    from langgraph_idem_saver.sqlite import AsyncSqliteSaver

    Saver = AsyncSqliteSaver | AsyncPostgresSaver

SQLITE_MAGIC = b"SQLite format 3\x00"


@dataclass(frozen=True)
class Db:
    """An open database: the saver (every read and write goes through its public
    methods), which backend, and how to name it in output (a DSN without password)."""

    saver: Saver
    backend: str
    database: str


def redact_dsn(dsn: str) -> str:
    """A DSN safe to print: the password replaced."""
    dsn = re.sub(r"(://[^:/@]+:)[^@]*@", r"\1***@", dsn)
    return re.sub(r"(password\s*=\s*)('[^']*'|\S+)", r"\1***", dsn)


def is_postgres_target(target: str) -> bool:
    """A PostgreSQL URL, or a libpq ``key=value`` conninfo string (not an existing file)."""
    if target.startswith(("postgresql://", "postgres://")):
        return True
    return bool(re.match(r"^\s*[A-Za-z_]+\s*=", target)) and not Path(target).exists()


@asynccontextmanager
async def open_database(target: str, *, write: bool = False) -> AsyncIterator[Db]:
    """A :class:`Db` for a SQLite path or a PostgreSQL DSN.

    Read-only unless ``write``; never creates a database either way.
    """
    if is_postgres_target(target):
        async with _open_postgres(target, write=write) as db:
            yield db
    else:
        async with _open_sqlite(target, write=write) as db:
            yield db


@asynccontextmanager
async def _open_sqlite(target: str, *, write: bool) -> AsyncIterator[Db]:
    import aiosqlite

    from langgraph_idem_saver.sqlite import AsyncSqliteSaver

    path = Path(target).expanduser()
    if not path.exists():
        raise CliError(f"no such database file: {target} (not creating one)")
    if path.is_dir():
        raise CliError(f"{target} is a directory, not a database file", EXIT_USAGE)
    try:
        with path.open("rb") as f:
            header = f.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise CliError(f"cannot read {target}: {exc.strerror or exc}") from None
    if header != SQLITE_MAGIC:
        raise CliError(f"{target} is not a SQLite database", EXIT_USAGE)
    # never creates the file; reads: mode=ro, or immutable=1 where mode=ro cannot open it
    where = SqliteTarget(str(path.resolve()), read_only=not write)
    uris = [(path.resolve().as_uri() + "?mode=rw", False)] if write else read_only_uris(path)
    immutable = False
    for attempt, (uri, immutable) in enumerate(uris, 1):  # noqa: B007 (used after the loop)
        try:
            conn = await aiosqlite.connect(uri, uri=True, isolation_level=None)
        except sqlite3.Error as exc:
            raise CliError(f"cannot open {target}: {exc}") from None
        try:
            ours = await AsyncSqliteSaver.ais_idem_database(conn)
            break
        except sqlite3.DatabaseError as exc:
            await conn.close()
            if error_kind(exc) in ("readonly", "cantopen"):
                if attempt < len(uris):
                    continue  # mode=ro cannot read this WAL database here: immutable=1 next
                raise open_error(where, exc) from None
            raise CliError(f"{target} is not a usable SQLite database: {exc}", EXIT_USAGE) from None
    if immutable and Path(f"{path}-wal").exists():
        print(
            f"idem-saver: note: {target}-wal cannot be read from this read-only directory; "
            "showing the database without its latest transactions",
            file=sys.stderr,
        )
    try:
        if not ours:
            raise CliError(
                f"{target} is a SQLite database without langgraph-idem-saver tables "
                "(idem_saver_migrations missing): wrong file?",
                EXIT_USAGE,
            )
        saver = AsyncSqliteSaver(conn)  # finds mode=ro / immutable=1 in the URI itself
        try:
            await saver.setup()
        except ReadOnlyDatabaseError as exc:
            if write:
                raise
            raise CliError(f"{exc} (read commands never write)") from None
        yield Db(saver, "sqlite", str(path))
    finally:
        await conn.close()


@asynccontextmanager
async def _open_postgres(dsn: str, *, write: bool) -> AsyncIterator[Db]:
    try:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict, make_conninfo
        from psycopg.rows import dict_row

        from langgraph_idem_saver.postgres import AsyncPostgresSaver
    except ImportError:
        raise CliError(
            "PostgreSQL needs the postgres extra: pip install 'langgraph-idem-saver[postgres]'"
        ) from None
    shown = redact_dsn(dsn)
    try:
        params = conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as exc:
        raise CliError(f"bad PostgreSQL DSN {shown}: {exc}", EXIT_USAGE) from None
    if not write:  # every transaction of this session is read-only
        options = str(params.get("options") or "")
        params["options"] = f"{options} -c default_transaction_read_only=on".strip()
    try:
        conn = await psycopg.AsyncConnection.connect(
            make_conninfo("", **params), autocommit=True, prepare_threshold=0, row_factory=dict_row
        )
    except psycopg.ProgrammingError as exc:
        raise CliError(f"bad PostgreSQL DSN {shown}: {exc}", EXIT_USAGE) from None
    except psycopg.OperationalError as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CliError(f"cannot connect to PostgreSQL at {shown}: {first}") from None
    async with conn:
        if not await AsyncPostgresSaver.ais_idem_database(conn):
            raise CliError(
                f"no langgraph-idem-saver tables in {shown} (idem_saver_migrations not on the "
                "search_path): wrong database or schema?",
                EXIT_USAGE,
            )
        saver = AsyncPostgresSaver(conn)
        try:
            await saver.setup()
        except (psycopg.errors.ReadOnlySqlTransaction, ReadOnlyDatabaseError):
            raise CliError(
                f"{shown} needs a schema upgrade; open it once with the application "
                "(read commands never write)"
            ) from None
        yield Db(saver, "postgres", shown)
