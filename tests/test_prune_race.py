"""Deletes and prunes racing writes never leave a delta without its base.

A growing list channel is stored as a delta of an earlier version (``list_deltas.py``).
If a delete or prune removes that earlier version while an ``aput`` is writing a delta
on it, the new checkpoint can only be read as ``CorruptRecordError``. Here writers keep
appending to their threads while pruners and deleters run at the same time, each on its
own connection (SQLite: separate connections to one file; Postgres: savers on a pool, so
the statements really overlap on the server), for a bounded time with seeded choices.
Then every checkpoint that survived must decode to exactly the list its writer wrote,
and no concurrent read may have hit a corrupt record either.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
import time
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
from conftest import backend_resource
from langgraph.checkpoint.base import empty_checkpoint
from pg_server import afresh_dsn
from psycopg_pool import AsyncConnectionPool

from langgraph_idem_saver import AsyncSqliteSaver, CorruptRecordError
from langgraph_idem_saver.postgres import AsyncPostgresSaver

DURATION = 3.0  # seconds of concurrent writing, pruning and deleting per backend
# ...and at least this much work whatever the machine's load (a loaded CI box may give a
# role only a few turns in DURATION): each writer's puts, each maintainer's actions
MIN_PUTS_PER_WRITER = 24
ACTIONS = ["keep_latest", "old_runs", "delete_thread", "prune_delete", "run"]
MIN_ROUNDS_PER_MAINTAINER = 2  # every action this many times, in a seeded order
KEPT = [f"kept-{i}" for i in range(3)]  # pruned (keep_latest) and their old runs deleted
DOOMED = [f"doomed-{i}" for i in range(2)]  # also deleted whole, again and again
RUN_LENGTH = 6  # checkpoints per run id (adelete_for_runs deletes whole runs)
MAINTAINERS = 2
READERS = 1


def config(thread_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}


@dataclass
class Tally:
    """What the tasks did and saw."""

    expected: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    runs: dict[str, list[str]] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)  # each thread's newest checkpoint
    puts: int = 0
    maintenance: dict[str, int] = field(default_factory=dict)
    reads: int = 0
    corrupt_reads: list[str] = field(default_factory=list)


@asynccontextmanager
async def open_savers(backend: str, where: Any, n: int) -> AsyncIterator[tuple[list[Any], Any]]:
    """``n`` savers on one new database, each with its own connection (and its own
    list-delta memory); also yields how to reach the database directly."""
    savers: list[Any]
    async with AsyncExitStack() as stack:
        if backend == "sqlite":
            path = str(Path(where) / "race.sqlite")
            savers = [
                await stack.enter_async_context(AsyncSqliteSaver.from_conn_string(path))
                for _ in range(n)
            ]
            yield savers, path
        else:
            dsn = await afresh_dsn(where)
            pool = await stack.enter_async_context(
                AsyncConnectionPool(
                    dsn, min_size=n, max_size=n, kwargs={"autocommit": True}, open=False
                )
            )
            await pool.wait()
            savers = [AsyncPostgresSaver(pool) for _ in range(n)]
            await savers[0].setup()
            yield savers, dsn


async def writer(saver: Any, thread_id: str, deadline: float, tally: Tally) -> None:
    """Append one item per checkpoint, reusing the previous list's objects (as
    LangGraph's reducers do), so most versions are stored as deltas."""
    items: list[str] = []
    version = None
    parent = config(thread_id)
    step = 0
    while time.monotonic() < deadline or step < MIN_PUTS_PER_WRITER:
        step += 1
        items = [*items, f"{thread_id}:{step}"]
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": items}
        checkpoint["channel_versions"] = {"messages": version}
        run_id = f"{thread_id}:run-{step // RUN_LENGTH}"
        if not tally.runs[thread_id] or tally.runs[thread_id][-1] != run_id:
            tally.runs[thread_id].append(run_id)
        # recorded before the write: a concurrent reader may see it before aput returns
        tally.expected[thread_id, checkpoint["id"]] = list(items)
        parent = await saver.aput(
            parent, checkpoint, {"run_id": run_id, "step": step}, {"messages": version}
        )
        tally.puts += 1
        tally.last[thread_id] = checkpoint["id"]


async def maintainer(saver: Any, seed: int, deadline: float, tally: Tally) -> None:
    """Prune and delete at random (seeded): keep_latest and old runs on every thread,
    whole deletion (adelete_thread, prune "delete", the current run) on the doomed."""
    rng = random.Random(seed)
    done = 0
    while time.monotonic() < deadline or done < MIN_ROUNDS_PER_MAINTAINER * len(ACTIONS):
        # a seeded shuffle of every action per round: each kind is certain to run
        if done % len(ACTIONS) == 0:
            order = rng.sample(ACTIONS, len(ACTIONS))
        action = order[done % len(ACTIONS)]
        done += 1
        if action == "keep_latest":
            await saver.aprune(rng.sample(KEPT + DOOMED, 2), strategy="keep_latest")
        elif action == "old_runs":
            runs = tally.runs[rng.choice(KEPT + DOOMED)]
            if len(runs) > 1:
                await saver.adelete_for_runs(runs[:-1])
        elif action == "delete_thread":
            await saver.adelete_thread(rng.choice(DOOMED))
        elif action == "prune_delete":
            await saver.aprune([rng.choice(DOOMED)], strategy="delete")
        else:  # the run being written right now, heads included
            runs = tally.runs[rng.choice(DOOMED)]
            if runs:
                await saver.adelete_for_runs(runs[-1:])
        tally.maintenance[action] = tally.maintenance.get(action, 0) + 1
        await asyncio.sleep(rng.uniform(0, 0.004))


async def reader(saver: Any, seed: int, deadline: float, tally: Tally) -> None:
    """Read heads and short histories while all that goes on."""
    rng = random.Random(seed)
    while time.monotonic() < deadline:
        thread_id = rng.choice(KEPT + DOOMED)
        try:
            tup = await saver.aget_tuple(config(thread_id))
            history = [t async for t in saver.alist(config(thread_id), limit=3)]
        except CorruptRecordError as exc:
            tally.corrupt_reads.append(str(exc))
            continue
        tally.reads += 1
        for t in ([tup] if tup else []) + history:
            key = (thread_id, t.checkpoint["id"])
            assert t.checkpoint["channel_values"]["messages"] == tally.expected[key], key


def delta_rows(backend: str, db: str) -> int:
    query = "SELECT COUNT(*) FROM idem_blobs WHERE base_version IS NOT NULL"
    if backend == "sqlite":
        with sqlite3.connect(db) as conn:
            return int(conn.execute(query).fetchone()[0])
    with psycopg.connect(db) as conn:
        row = conn.execute(query).fetchone()
        assert row is not None
        return int(row[0])


async def test_deletes_and_prunes_racing_writes_leave_every_checkpoint_readable(
    backend: str, request: pytest.FixtureRequest
) -> None:
    threads = KEPT + DOOMED
    n = len(threads) + MAINTAINERS + READERS
    tally = Tally(runs={t: [] for t in threads})
    async with open_savers(backend, backend_resource(backend, request), n) as (savers, db):
        deadline = time.monotonic() + DURATION
        tasks = [writer(savers[i], t, deadline, tally) for i, t in enumerate(threads)]
        rest = iter(savers[len(threads) :])
        tasks += [maintainer(next(rest), seed, deadline, tally) for seed in range(MAINTAINERS)]
        tasks += [reader(next(rest), 100 + seed, deadline, tally) for seed in range(READERS)]
        await asyncio.gather(*tasks)

        # every checkpoint ever written: gone, or read back whole and exact
        check = savers[-1]
        corrupt: list[tuple[str, str]] = []
        survivors: dict[str, set[str]] = {t: set() for t in threads}
        for (thread_id, checkpoint_id), items in tally.expected.items():
            cfg = config(thread_id)
            cfg["configurable"]["checkpoint_id"] = checkpoint_id
            try:
                tup = await check.aget_tuple(cfg)
            except CorruptRecordError:
                corrupt.append((thread_id, checkpoint_id))
                continue
            if tup is not None:
                assert tup.checkpoint["channel_values"]["messages"] == items
                survivors[thread_id].add(checkpoint_id)
        for thread_id in threads:  # and a thread's whole history lists without error
            if not any(t == thread_id for t, _ in corrupt):
                listed = {t.checkpoint["id"] async for t in check.alist(config(thread_id))}
                assert listed == survivors[thread_id]
        deltas = delta_rows(backend, db)

    summary = (
        f"{tally.puts} puts, maintenance {tally.maintenance}, {tally.reads} reads; "
        f"corrupt: {len(corrupt)} checkpoints, {len(tally.corrupt_reads)} concurrent reads"
    )
    print(summary)
    assert not corrupt and not tally.corrupt_reads, summary
    # the race was really run: writes, deltas and every kind of deletion happened
    assert tally.puts > 50 and deltas > 0, summary
    assert set(tally.maintenance) == set(ACTIONS), summary
    # nothing deletes a kept thread's newest checkpoint: keep_latest keeps the head it
    # found and anything written since, and only older runs are deleted there
    assert all(tally.last[t] in survivors[t] for t in KEPT), summary
