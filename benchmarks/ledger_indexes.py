"""What each index of the SQLite ledger costs a tool call, and what its reads cost without it.

The ledger table ``idem_tool_calls`` has five b-trees beside its rows: the primary key
``(scope, key)``, ``idem_tool_calls_thread (thread_id, issued_at)``,
``idem_tool_calls_signature (scope, agent_path, tool_name, args_hash)``, the partial
``idem_tool_calls_issued (lease_expires_at) WHERE status = 'issued'`` and the partial
unique ``idem_tool_calls_fork_slot``. This builds one ledger of ``--rows`` rows (50-call
steps, each a thread of its own, results of ~200 bytes) and copies it once per variant:

* ``current``: the schema as shipped;
* ``no_issued``: without ``idem_tool_calls_issued`` (PostgreSQL dropped it, migration 6);
* ``thread_partial``: ``idem_tool_calls_thread`` only of rows whose scope is not their
  thread (a thread's own rows are the primary key's prefix ``scope = thread_id``);
* ``no_signature``: without ``idem_tool_calls_signature`` (for scale only: adoption's
  read has no other access path).

It then prints, per variant, the worker CPU a row of a 50-call step's writes (the claim's
``INSERT``s in one statement and its synced commit, the outcomes' ``UPDATE`` in one
statement and their commit; the variants in alternating rounds, ``time.thread_time_ns``),
and the time and plan of the reads that use the index a variant drops or narrows.

    python benchmarks/ledger_indexes.py [--rows 200000] [--rounds 20]

``--paths``: instead, on the shipped schema, the claim (adoption read, ``INSERT``s,
entries built, synced commit) and the outcomes of a 50-call step as the saver writes
them (``ledger_batch``: one statement each, the read's pairs bound, ``records_over``)
against a statement a row (the JSON read, ``records_of``), alternating, worker µs a row.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
import uuid
from itertools import repeat
from typing import Any

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.backend import INTENT_COLUMNS, Claims, step_params
from langgraph_idem_saver.ledger import LedgerEntry, StepLookup, records_of
from langgraph_idem_saver.ledger_queries import LedgerSql
from langgraph_idem_saver.sqlite import ledger_batch, sql
from langgraph_idem_saver.sqlite.ledger_store import _each_matched

AT_ONCE = ledger_batch.AT_ONCE

OWNER = "bench-host:1:0123abcd-0123456789ab"
RESULT = b"\xc7\xb9\x05\x94" + b"r" * 196  # a serialized ToolMessage is ~200 bytes
CALLS = 50
VARIANTS = {
    "current": [],
    "no_issued": ["DROP INDEX idem_tool_calls_issued"],
    "thread_partial": [
        "DROP INDEX idem_tool_calls_thread",
        "CREATE INDEX idem_tool_calls_thread ON idem_tool_calls (thread_id, issued_at) "
        "WHERE scope <> thread_id",
    ],
    "no_signature": ["DROP INDEX idem_tool_calls_signature"],
}
LEDGER = LedgerSql(sql)
# the reads of the indexes a variant drops or narrows, as the saver sends them
READS = {
    "no_issued": {
        "alist_issued (SELECT_ISSUED)": (LEDGER.SELECT_ISSUED, ()),
        "asweep's issued count": (
            "SELECT COUNT(*) FROM idem_tool_calls WHERE status = 'issued' AND issued_at < ?",
            (time.time(),),
        ),
    },
    "thread_partial": {
        "alist_entries(thread) as shipped": (LEDGER.SELECT_ENTRIES_OF_THREAD, ("{thread}",)),
        "alist_entries(thread) rewritten": (
            "SELECT * FROM idem_tool_calls WHERE rowid IN ("
            "SELECT rowid FROM idem_tool_calls WHERE scope = ?1 AND thread_id = ?1 UNION ALL "
            "SELECT rowid FROM idem_tool_calls WHERE thread_id = ?1 AND scope <> thread_id) "
            "ORDER BY rowid",
            ("{thread}",),
        ),
        "inspect's rows per thread": (
            "SELECT thread_id, COUNT(*) FROM idem_tool_calls GROUP BY thread_id",
            (),
        ),
    },
}


def digest(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def step_rows(thread: str) -> list[tuple[Any, ...]]:
    position, branch = digest(thread, "position"), str(uuid.uuid4())
    return [
        (thread, digest(thread, i), thread, "tools", "noop", digest("args", i),
         b'{"i":%d}' % i, f"call_{thread}_{i}", None, position, branch, i)
        for i in range(CALLS)
    ]  # fmt: skip


def write_step(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> tuple[float, float]:
    """A step's claim (synced) and outcomes, as the saver writes them: worker µs a row."""
    now = time.time()
    t0 = time.thread_time_ns()
    conn.execute("BEGIN IMMEDIATE")
    inserted = ledger_batch.claim_inserted(conn, rows, (OWNER, now, now + 300))
    conn.execute("COMMIT")
    t1 = time.thread_time_ns()
    assert inserted == [1] * len(rows)
    outcomes = [("completed", "msgpack", RESULT, None, now, r[0], r[1], OWNER) for r in rows]
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    matched = ledger_batch.outcomes_matched(conn, outcomes, lambda c, r: [])
    conn.execute("COMMIT")
    conn.execute("PRAGMA synchronous = FULL")
    t2 = time.thread_time_ns()
    assert matched == [True] * len(rows)
    return (t1 - t0) / 1000 / len(rows), (t2 - t1) / 1000 / len(rows)


def claim_paths(conn: sqlite3.Connection, thread: str, at_once: bool) -> tuple[float, float]:
    """A step's claim and outcomes through the saver's functions, the one-statement
    paths on or off (``ledger_batch.AT_ONCE``, the adoption read, the entries)."""
    rows = step_rows(thread)
    lookup = StepLookup(thread, "tools", [(r[4], r[5]) for r in rows], [(rows[0][9], "noop")])
    now = time.time()
    ledger_batch.AT_ONCE = at_once
    claims = Claims(rows, OWNER, now, now + 300)
    t0 = time.thread_time_ns()
    conn.execute("BEGIN IMMEDIATE")
    if at_once:
        found = conn.execute(*ledger_batch.step_candidates(lookup)).fetchall()
        inserted = ledger_batch.claim_inserted(conn, rows, (OWNER, now, now + 300))
        entries = claims.issued_entries()
    else:
        found = conn.execute(sql.SELECT_STEP_CANDIDATES, step_params(lookup)).fetchall()
        params = map(tuple.__add__, rows, repeat((OWNER, now, now + 300)))
        inserted = [c.rowcount for c in map(conn.execute, repeat(sql.INSERT_ISSUED), params)]
        columns: dict[str, Any] = {k: repeat(v) for k, v in claims._issued_columns.items()}
        columns.update(zip(INTENT_COLUMNS, zip(*rows, strict=True), strict=True))
        entries = records_of(LedgerEntry, columns, len(rows))
    conn.execute("COMMIT")
    t1 = time.thread_time_ns()
    assert not found and inserted == [1] * len(rows) and len(entries) == len(rows)
    outcomes = [("completed", "msgpack", RESULT, None, now, r[0], r[1], OWNER) for r in rows]
    conn.execute("PRAGMA synchronous = NORMAL")
    conn.execute("BEGIN IMMEDIATE")
    matched = ledger_batch.outcomes_matched(conn, outcomes, _each_matched)
    conn.execute("COMMIT")
    conn.execute("PRAGMA synchronous = FULL")
    t2 = time.thread_time_ns()
    ledger_batch.AT_ONCE = AT_ONCE
    assert matched == [True] * len(rows)
    return (t1 - t0) / 1000 / len(rows), (t2 - t1) / 1000 / len(rows)


def paths(tmp: str, rows: int, rounds: int) -> None:
    """``--paths`` (see the module)."""
    path = os.path.join(tmp, "paths.db")
    asyncio.run(create(path))
    conn = connect(path)
    for i in range(rows // CALLS):
        write_step(conn, step_rows(f"fill-{i:07d}"))
    samples: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    for r in range(rounds):
        for at_once in (True, False) if r % 2 else (False, True):
            for _ in range(3):
                samples[at_once].append(claim_paths(conn, f"step-{uuid.uuid4().hex[:8]}", at_once))
    conn.close()
    print(f"worker CPU a row of a 50-call step on {rows:,} rows (medians), µs: claim + outcome")
    for at_once, got in samples.items():
        claim = statistics.median(c for c, _ in got)
        finish = statistics.median(f for _, f in got)
        total = statistics.median(c + f for c, f in got)
        name = "one statement" if at_once else "a statement a row"
        print(f"  {name:>18}: {claim:6.2f} + {finish:6.2f} = {total:6.2f}")


def connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("PRAGMA synchronous = FULL")
    return conn


async def create(path: str) -> None:
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--paths", action="store_true", help="the statement paths, not indexes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ledger-indexes-") as tmp:
        if args.paths:
            paths(tmp, args.rows, args.rounds)
            return
        base = os.path.join(tmp, "base.db")
        asyncio.run(create(base))
        conn = connect(base)
        t0 = time.perf_counter()
        for i in range(args.rows // CALLS):
            write_step(conn, step_rows(f"fill-{i:07d}"))
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        print(f"{args.rows:,} rows written in {time.perf_counter() - t0:.0f} s")
        conns = {}
        for name, statements in VARIANTS.items():
            path = os.path.join(tmp, f"{name}.db")
            shutil.copy(base, path)
            conns[name] = connect(path)
            for statement in statements:
                conns[name].execute(statement)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in conns}
        names = list(conns)
        for r in range(args.rounds):
            for name in names if r % 2 else names[::-1]:
                for _ in range(3):
                    thread = f"step-{uuid.uuid4().hex[:8]}"
                    samples[name].append(write_step(conns[name], step_rows(thread)))
        print("worker CPU a row of a 50-call step (medians), µs: claim + outcome = total")
        for name, got in samples.items():
            claim = statistics.median(c for c, _ in got)
            finish = statistics.median(f for _, f in got)
            total = statistics.median(c + f for c, f in got)
            print(f"  {name:>15}: {claim:6.2f} + {finish:6.2f} = {total:6.2f}")
        thread = "fill-0000123"
        for variant, reads in READS.items():
            for title, (query, params) in reads.items():
                params = tuple(thread if p == "{thread}" else p for p in params)
                for name in ("current", variant):
                    conn = conns[name]
                    plan = "; ".join(
                        r[3] for r in conn.execute(f"EXPLAIN QUERY PLAN {query}", params)
                    )
                    times = []
                    for _ in range(5):
                        t = time.perf_counter()
                        n = len(conn.execute(query, params).fetchall())
                        times.append(time.perf_counter() - t)
                    ms = statistics.median(times) * 1000
                    print(f"  {title} on {name}: {ms:8.2f} ms ({n} rows) - {plan}")
        for conn in conns.values():
            conn.close()


if __name__ == "__main__":
    main()
