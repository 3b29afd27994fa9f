"""The database states ``bench.py``'s read rows are measured in, both savers on the same one.

A read's plan depends on what PostgreSQL knows of the tables, and a benchmark that only
ever reuses a filled, analyzed database never sees the others. So each read row runs in
every state, in this order:

* ``fresh`` - the schema (SQLite: the file) created by ``setup()`` just before, the read
  thread written into it, nothing analyzed (on PostgreSQL autovacuum is turned off on
  the schema's tables for the run, so no statistics appear while it is measured): a new
  deployment, a CI database.
* ``imported`` - LangGraph's saver writes the thread into the schema / file, ours
  imports it there (``aimport_langgraph``), nothing analyzed: the day one switches. Both
  savers read the same thread in the same database, each from its own tables.
* ``aged`` - ``fresh`` plus ``--aged-copies`` copies of the read thread as other threads
  (default 100: 100,000 checkpoints a saver with the full profile's 1,000-checkpoint
  thread; 200 for the 200,000 the issue names), then ``VACUUM (ANALYZE)`` (SQLite:
  ``ANALYZE``).

The read thread is a 20-message list re-versioned at every checkpoint without growing
(the very same message objects: a node returning the whole list), one task's write a
checkpoint - the workload whose reads walk a delta chain.
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

import psycopg
from _harness import WITH_MSGS, ConvSim, Payloads

STATES = ("fresh", "imported", "aged")
AGED_COPIES = 100

_WORDS = (
    "the a to of and in that is for it on with as was be by this are or from at an not "
    "order invoice payment customer account refund shipping delivery address product "
    "price total status update request support ticket message agent tool result error"
)


class SameListSim(ConvSim):
    """The list channel gets a new version on every step: the same objects, not grown."""

    payloads = Payloads(_WORDS)

    def next(self, changed: tuple[str, ...]) -> tuple[Any, Any, Any, Any]:
        kept = self.values["messages"]
        out = super().next(changed)
        if "messages" in changed:
            self.values["messages"] = list(kept)
            out[1]["channel_values"]["messages"] = self.values["messages"]
        return out


async def populate_same_list(saver: Any, thread: str, n: int, window: int, msg_bytes: int) -> None:
    """``n`` checkpoints of ``thread`` (the list re-versioned on each), one write each."""
    sim = SameListSim(saver, thread, window, msg_bytes, 7)
    write = sim.payloads.ai(random.Random(8), 200)
    for i in range(n):
        cfg = await sim.put(WITH_MSGS)
        await saver.aput_writes(cfg, [("messages", [write])], f"task-{i}", "~__pregel_pull, agent")


def _schema_tables(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
    ).fetchall()
    return [r[0] for r in rows]


def autovacuum_off(dsn: str) -> None:
    """No statistics appear on this schema's tables during the run (fresh, imported)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in _schema_tables(conn):
            conn.execute(f'ALTER TABLE "{table}" SET (autovacuum_enabled = off)')


def fill_postgres(dsn: str, thread: str, copies: int) -> None:
    """Copy ``thread``'s rows as ``copies`` other threads (every table with a thread_id,
    whatever the saver's schema), then ANALYZE: reads must not grow with the table."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        schema = conn.execute("SELECT current_schema()").fetchone()[0]  # type: ignore[index]
        tables = conn.execute(
            "SELECT table_name FROM information_schema.columns "
            "WHERE table_schema = %s AND column_name = 'thread_id'",
            (schema,),
        ).fetchall()
        for (table,) in tables:
            cols = [
                r[0]
                for r in conn.execute(
                    "SELECT column_name FROM information_schema.columns WHERE table_schema = %s "
                    "AND table_name = %s AND is_generated = 'NEVER' AND identity_generation "
                    "IS NULL ORDER BY ordinal_position",
                    (schema, table),
                )
            ]
            picked = ", ".join(
                "'other-' || g || thread_id" if c == "thread_id" else c for c in cols
            )
            conn.execute(
                f"INSERT INTO {table} ({', '.join(cols)}) SELECT {picked} "
                f"FROM {table}, generate_series(1, %s) AS g WHERE thread_id = %s",
                (copies, thread),
            )
        # VACUUM too, and a CHECKPOINT: the copies are hundreds of MB of WAL and dirty
        # pages; left to autovacuum and the checkpointer they ran during the rows measured
        # after the reads (the pg 50-call ledger row measured 0.57x in a full run, 0.75x
        # alone)
        conn.execute("VACUUM (ANALYZE)")
        with contextlib.suppress(psycopg.errors.InsufficientPrivilege):  # a --dsn user
            conn.execute("CHECKPOINT")
    os.sync()  # and the kernel's dirty pages: their write-back slowed every fsync after


def fill_sqlite(path: str, thread: str, copies: int) -> None:
    """``fill_postgres`` for a SQLite file: the copies, then ``ANALYZE``."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if "thread_id" in {c[1] for c in conn.execute(f'PRAGMA table_info("{r[0]}")')}
        ]
        series = "WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < ?)"
        for table in tables:
            cols = [c[1] for c in conn.execute(f'PRAGMA table_info("{table}")')]
            picked = ", ".join(
                "'other-' || g.n || thread_id" if c == "thread_id" else c for c in cols
            )
            conn.execute(
                f"{series} INSERT INTO {table} ({', '.join(cols)}) SELECT {picked} "
                f"FROM {table}, g WHERE thread_id = ?",
                (copies, thread),
            )
        conn.commit()
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.commit()


def statistics_note(config: str, where: str) -> str:
    """What the planner knows of our checkpoints table: ``no stats`` or ``analyzed``."""
    if config == "sqlite":
        with contextlib.closing(sqlite3.connect(where)) as conn:
            known = (
                conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_stat1'").fetchone()
                and conn.execute(
                    "SELECT 1 FROM sqlite_stat1 WHERE tbl = 'idem_checkpoints'"
                ).fetchone()
            )
        return "analyzed" if known else "no stats"
    with psycopg.connect(where, autocommit=True) as conn:
        row = conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'idem_checkpoints'::regclass"
        ).fetchone()
    return "no stats" if row is None or row[0] < 0 else "analyzed"


OpenSavers = Callable[[AsyncExitStack, str, dict[str, str]], Awaitable[dict[str, Any]]]


async def prepare_state(
    state: str,
    config: str,
    new_where: Callable[[str], dict[str, str]],
    open_savers: OpenSavers,
    thread: str,
    n: int,
    window: int,
    msg_bytes: int,
    aged_copies: int,
) -> dict[str, str]:
    """The databases (label -> file or DSN) of ``state`` for ``config``, the read thread
    written. ``new_where(tag)``: fresh, empty ones (two: one a saver; ``imported``
    uses the first for both)."""
    where = new_where(state)
    if state == "imported":
        where = {label: where["official"] for label in where}
    async with AsyncExitStack() as stack:
        savers = await open_savers(stack, config, where)
        if config != "sqlite":
            for dsn in set(where.values()):
                autovacuum_off(dsn)
        if state == "imported":
            await populate_same_list(savers["official"], thread, n, window, msg_bytes)
            await savers["ours"].aimport_langgraph(verify=False)
        else:
            for saver in savers.values():
                await populate_same_list(saver, thread, n, window, msg_bytes)
    if state == "aged":
        for db in where.values():
            if config == "sqlite":
                fill_sqlite(db, thread, aged_copies)
            else:
                fill_postgres(db, thread, aged_copies)
    return where
