"""The reads ``value_copies.py`` changes, on the process's CPU clock, every stack interleaved
in one process: LangGraph's savers (``official``), this package (``ours``), this package
with its copies turned off (``nocopy``: the saver's reader is its serializer, nothing else
changed - the change alone, on the same code) and, with ``--base DIR``, another copy of
the package importable from ``DIR`` as ``lis_base`` (see ``sync_sqlite_cpu.py``'s
docstring for how to make one).

Why the CPU clock: on a host shared with other work, wall-clock read rows move by 10-20%
between runs; ``time.process_time_ns`` (this process's CPU, every thread of it: aiosqlite's
worker decodes SQLite's values) barely does. PostgreSQL's own CPU is another process and
not counted: these rows are the client's share, where the decoding is.

Rows (each sample ``--batch`` calls, rounds rotating the stacks' order):

* ``sync_get_tuple`` / ``sync_list`` (SQLite): the sync ``SqliteSaver``'s ``get_tuple``
  (latest) and ``list(limit=10)`` on ``bench.py``'s sync thread (300 checkpoints, the
  list re-versioned every second one), on the calling thread.
* ``alist_sqlite`` / ``alist_pg``: ``alist(limit=10)`` of the newest page of a
  1,000-checkpoint thread whose 20-message list is re-versioned at every checkpoint
  without growing (``bench.py``'s read thread, ``db_states.populate_same_list``) - the
  same page again and again, as ``bench.py`` reads it.
* ``cold_get_tuple`` / ``cold_alist``: a thread whose 20-message list slides by one
  message a checkpoint (every version stored whole, every value different); each call
  reads checkpoints no call read before (``aget_tuple`` by id; a page of ``alist`` before
  an id), so every value is decoded once: what the copies must not make slower.

* ``--micro``: the copies alone (no database, the bench's 20-message list): a first page
  of ten rows sharing one base through fresh copies (the second-sight rule, and the
  page's multiplicity: the base pickled at its first sight, simulated) against ten
  decodes; and the first sight's cost, ``reader.loads_typed`` of a value never seen
  against ``serde.loads_typed``.

    python benchmarks/value_copies_cpu.py --base /tmp/base [--pg] [--micro]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from typing import Any

from _harness import WITH_MSGS
from bench import Sim, new_schema, start_server
from db_states import populate_same_list
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as OfficialPostgres
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSqlite

cpu_ns = time.process_time_ns
WINDOW, MSG_BYTES = 20, 256  # bench.py's read thread


def cfg(thread: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


def classes(backend: str, base: str | None) -> dict[str, Any]:
    """label -> saver class of ``backend`` (``sqlite``/``pg``)."""
    module = "sqlite" if backend == "sqlite" else "postgres"
    ours = getattr(importlib.import_module(f"langgraph_idem_saver.{module}"), _name(backend))
    found = {
        "official": OfficialSqlite if backend == "sqlite" else OfficialPostgres,
        "ours": ours,
        "nocopy": ours,
    }
    if base is not None:
        if base not in sys.path:
            sys.path.insert(0, base)
        found["base"] = getattr(importlib.import_module(f"lis_base.{module}"), _name(backend))
    return found


def _name(backend: str) -> str:
    return "AsyncSqliteSaver" if backend == "sqlite" else "AsyncPostgresSaver"


async def open_savers(
    stack: AsyncExitStack, backend: str, base: str | None, tmp: str, pg: str | None
) -> dict[str, Any]:
    savers = {}
    for label, cls in classes(backend, base).items():
        where = os.path.join(tmp, f"{label}.db") if backend == "sqlite" else new_schema(pg, label)  # type: ignore[arg-type]
        saver = await stack.enter_async_context(cls.from_conn_string(where))
        await saver.setup()
        if label == "nocopy":
            no_copies(saver)
        savers[label] = saver
    return savers


def no_copies(saver: Any) -> None:
    """Turn a saver's copies off: its reader is its serializer (the memo of
    ``ValueCopies.reader``), every value decoded as before the copies."""
    serde = saver.serde
    saver._deltas.copies._reader = (serde, serde)


def sync_rows(args: argparse.Namespace) -> None:
    """The sync ``SqliteSaver`` rows (``sync_sqlite_cpu.py``'s thread and savers)."""
    from contextlib import ExitStack

    import sync_sqlite_cpu as sync

    with ExitStack() as stack, tempfile.TemporaryDirectory() as tmp:
        savers = sync.open_savers(stack, tmp, args.base)
        ours = importlib.import_module("langgraph_idem_saver.sqlite").SqliteSaver
        import sqlite3
        from contextlib import closing

        conn = stack.enter_context(
            closing(sqlite3.connect(os.path.join(tmp, "nocopy.db"), check_same_thread=False))
        )
        conn.execute("PRAGMA synchronous=FULL")
        nocopy = stack.enter_context(ours(conn))
        nocopy.setup()
        conn.execute("PRAGMA journal_mode=WAL")
        no_copies(nocopy.saver)
        savers["nocopy"] = nocopy
        for saver in savers.values():
            sync.fill(saver, args.sync_checkpoints)
        config = sync.CFG
        rows = {
            "sync_get_tuple": lambda s: lambda: s.get_tuple(config),
            "sync_list": lambda s: lambda: list(s.list(config, limit=10)),
        }
        for title, call in rows.items():
            calls = {lab: call(s) for lab, s in savers.items()}
            for _ in range(5):
                for c in calls.values():
                    c()
            samples: dict[str, list[float]] = {lab: [] for lab in calls}
            labels = list(calls)
            for r in range(args.rounds):
                for lab in labels[r % len(labels) :] + labels[: r % len(labels)]:
                    start = time.thread_time_ns()
                    for _ in range(args.batch):
                        calls[lab]()
                    samples[lab].append((time.thread_time_ns() - start) / args.batch / 1000)
            report(title, samples)


async def sliding_thread(saver: Any, thread: str, n: int) -> list[str]:
    """``n`` checkpoints of a sliding 20-message window (each stored whole); their ids."""
    sim, ids = Sim(saver, thread, WINDOW, MSG_BYTES, 11), []
    for _ in range(n):
        config = await sim.put(WITH_MSGS)
        ids.append(config["configurable"]["checkpoint_id"])
    return ids


Call = Callable[[], Awaitable[Any]]


async def interleaved(
    calls: dict[str, Callable[[int], Call]], rounds: int, batch: int
) -> dict[str, list[float]]:
    """µs a call of each label, one sample a round, the labels' order rotating."""
    labels = list(calls)
    samples: dict[str, list[float]] = {lab: [] for lab in labels}
    n = 0
    for r in range(rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        for lab in order:
            work = [calls[lab](n + i) for i in range(batch)]
            start = cpu_ns()
            for call in work:
                await call()
            samples[lab].append((cpu_ns() - start) / batch / 1000)
        n += batch
    return samples


def report(title: str, samples: dict[str, list[float]]) -> None:
    official = statistics.median(samples["official"])
    for lab, values in samples.items():
        q = statistics.quantiles(values, n=4)
        med = statistics.median(values)
        print(f"{title:16} {lab:9} {med:9.1f} ({q[0]:.1f}-{q[2]:.1f})  {official / med:.3f}x")
    if "nocopy" in samples:
        gain = statistics.median(samples["nocopy"]) / statistics.median(samples["ours"])
        print(f"{title:16} the copies: nocopy / ours = {gain:.3f}x")


async def run_backend(backend: str, args: argparse.Namespace, pg: str | None) -> None:
    async with AsyncExitStack() as stack:
        tmp = stack.enter_context(tempfile.TemporaryDirectory())
        savers = await open_savers(stack, backend, args.base, tmp, pg)
        for saver in savers.values():
            await populate_same_list(saver, "long", args.checkpoints, WINDOW, MSG_BYTES)
        offset = args.rounds * args.batch // 10 + 1  # cold_alist's pages: older ids
        cold = 10 * (args.rounds * args.batch + offset + 2)
        ids = {lab: await sliding_thread(s, "cold", cold) for lab, s in savers.items()}

        def page(lab: str) -> Callable[[int], Call]:
            async def call() -> None:
                got = [t async for t in savers[lab].alist(cfg("long"), limit=10)]
                assert len(got) == 10

            return lambda _: call

        def cold_get(lab: str) -> Callable[[int], Call]:
            # newest first, each id once
            return lambda i: lambda: savers[lab].aget_tuple(cfg("cold", ids[lab][-1 - i]))

        def cold_page(lab: str) -> Callable[[int], Call]:
            def call(i: int) -> Call:
                async def run() -> None:
                    before = cfg("cold", ids[lab][-1 - 10 * i])
                    got = [t async for t in savers[lab].alist(cfg("cold"), before=before, limit=10)]
                    assert len(got) == 10

                return run

            return call

        # cold first: the page row's copies are made in its own warm-up
        for title, make, rounds in (
            ("cold_get_tuple", cold_get, args.rounds),
            ("cold_alist", cold_page, args.rounds),
            (f"alist_{backend}", page, args.rounds),
        ):
            if title == "cold_alist":  # pages before the ids cold_get_tuple read
                make = _shifted(make, offset)
            for lab in savers:  # warm-up: imports, statement caches, the page's copies
                for _ in range(3):
                    await page(lab)(0)()
            samples = await interleaved({lab: make(lab) for lab in savers}, rounds, args.batch)
            report(title, samples)


def _shifted(
    make: Callable[[str], Callable[[int], Call]], offset: int
) -> Callable[[str], Callable[[int], Call]]:
    return lambda lab: lambda i: make(lab)(i + offset)


def micro(rounds: int) -> None:
    """The copies' own costs (see the module docstring)."""
    import pickle
    import random

    from langgraph_idem_saver import value_copies
    from langgraph_idem_saver.saver_base import IdemSaverBase

    serde = IdemSaverBase.serde
    rng = random.Random(5)
    p = Sim.payloads
    window = [p.human(rng, MSG_BYTES) if i % 2 else p.ai(rng, MSG_BYTES) for i in range(WINDOW)]
    base = serde.dumps_typed(window)

    def second_sight() -> None:
        reader = value_copies.ValueCopies().reader(serde)
        for _ in range(10):
            reader.loads_typed(base)

    def multiplicity() -> None:  # pickled at first sight, as a page's count would
        pickled = value_copies.copyable(serde.loads_typed(base))
        assert pickled is not None
        for _ in range(9):
            pickle.loads(pickled)

    def decodes() -> None:
        for _ in range(10):
            serde.loads_typed(base)

    distinct = [serde.dumps_typed([*window[1:], p.ai(rng, MSG_BYTES)]) for _ in range(rounds * 20)]
    copies = value_copies.ValueCopies()
    reader = copies.reader(serde)
    firsts = iter(distinct)
    plain = iter(distinct[::-1])
    cases = {
        "page, no copies": decodes,
        "page, 2nd sight": second_sight,
        "page, multiplic.": multiplicity,
        "first sight": lambda: reader.loads_typed(next(firsts)),
        "serializer": lambda: serde.loads_typed(next(plain)),
    }
    samples: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(rounds):
        for name, case in cases.items():
            n = 10 if name in ("first sight", "serializer") else 1
            start = time.thread_time_ns()
            for _ in range(n):
                case()
            samples[name].append((time.thread_time_ns() - start) / n / 1000)
    assert copies.counts["copied"] == 0, copies.counts
    for name, values in samples.items():
        print(f"micro {name:18} {statistics.median(values):9.1f} µs")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    parser.add_argument("--pg", action="store_true", help="also PostgreSQL (pgserver)")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--batch", type=int, default=5)
    parser.add_argument("--checkpoints", type=int, default=1000)
    parser.add_argument("--micro", action="store_true", help="only the copies' own costs")
    parser.add_argument("--sync-checkpoints", type=int, default=300)
    parser.add_argument("--no-sync", action="store_true", help="skip the sync SQLite rows")
    args = parser.parse_args()
    if args.micro:
        micro(args.rounds)
        return
    print(
        f"load average {os.getloadavg()[0]:.1f}; CPU µs a call (median, quartiles), official / each"
    )

    if not args.no_sync:
        sync_rows(args)

    async def both() -> None:
        await run_backend("sqlite", args, None)
        if args.pg:
            async with AsyncExitStack() as stack:
                await run_backend("pg", args, start_server(stack))

    asyncio.run(both())


if __name__ == "__main__":
    main()
