"""The server's checkpointer: our saver, holding checkpoints and the tool-call ledger.

``langgraph.json`` names :func:`generate_checkpointer`; the server enters it (once per
event-loop thread it runs graphs on) and wraps what it yields (the front doors find the
ledger through that wrapper). It is
imported by the server under a module name of its own, so a graph module that imported
it would get a second copy: keep the two apart, as here.

``$IDEM_SAVER_POSTGRES_DSN`` (any libpq DSN) selects PostgreSQL, for a deployment: many
workers, one database. Without it, SQLite: ``$IDEM_SAVER_SQLITE``, by default
``agent.sqlite`` beside this module, for ``langgraph dev``. ``$IDEM_SAVER_TTL_DAYS`` sets
a thread TTL that ``asweep()`` applies (run it on a schedule; the server never calls it).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from pathlib import Path

from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_idem_saver import AsyncSqliteSaver, TTLConfig

HERE = Path(__file__).resolve().parent


def sqlite_path() -> str:
    """The SQLite file the saver opens when no PostgreSQL DSN is set."""
    return os.environ.get("IDEM_SAVER_SQLITE") or str(HERE / "agent.sqlite")


def ttl() -> TTLConfig | None:
    """``$IDEM_SAVER_TTL_DAYS`` as a TTL (idle threads deleted by ``asweep()``)."""
    days = os.environ.get("IDEM_SAVER_TTL_DAYS")
    return TTLConfig(after=timedelta(days=float(days))) if days else None


@asynccontextmanager
async def generate_checkpointer() -> AsyncIterator[BaseCheckpointSaver[str]]:
    """Open the saver for the server's lifetime. The server never calls ``setup()``
    on a custom checkpointer, so it is called here (it creates or migrates the
    tables once; calling it again is cheap)."""
    dsn = os.environ.get("IDEM_SAVER_POSTGRES_DSN")
    if dsn:
        from langgraph_idem_saver import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(dsn, ttl=ttl()) as pg_saver:
            await pg_saver.setup()
            yield pg_saver
    else:
        async with AsyncSqliteSaver.from_conn_string(sqlite_path(), ttl=ttl()) as sqlite_saver:
            await sqlite_saver.setup()
            yield sqlite_saver
