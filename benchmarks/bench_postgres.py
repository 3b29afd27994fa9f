#!/usr/bin/env python
"""Side-by-side benchmark: langgraph_idem_saver.postgres.AsyncPostgresSaver vs the official
``langgraph.checkpoint.postgres.aio.AsyncPostgresSaver``.

Both savers run in ONE process against the same PostgreSQL server, each in its own
fresh schema, with the same workload. Micro-benchmarks are interleaved (official, ours,
ours, official, ...) in rounds so that noise hits both columns alike.

The server: ``--dsn`` (or ``$IDEM_SAVER_PG_DSN``) if given; otherwise a throwaway
PostgreSQL 16 started with ``pgserver`` (a PyPI wheel) in a temp dir with its default,
durable settings (``fsync=on``, ``synchronous_commit=on``). ``--no-fsync`` turns both
off on the throwaway server (to see the client/CPU side alone).

Rows:

* ``aput``: one checkpoint (messages channel changed on every 2nd), single connection.
* ``aput_writes``: one task's writes (3 channels), single connection.
* ``aget_tuple`` latest of a 10- and a 5,000-checkpoint thread (flatness: ours should
  cost the same on both), and ``alist(limit=10)`` on the 5,000-checkpoint thread.
* ``concurrency``: a pool of 8 connections; 1 worker vs 8 workers (each on its own
  thread) doing aput + aget_tuple; throughput and the 8-vs-1 scaling of each saver.
* ``delta``: ``graph.aget_state`` of the latest checkpoint of a 100- and a 1,000-step
  DeltaChannel thread (no snapshot: the whole chain is walked and replayed).

Usage::

    python benchmarks/bench_postgres.py            # full run (~2-4 min)
    python benchmarks/bench_postgres.py --quick    # smoke run (< 1 min)
    python benchmarks/bench_postgres.py --json results.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from _harness import (
    MIXED,
    Payloads,
    Row,
    aput_prepare,
    aput_writes_prepare,
    check_latest,
    delta_specs,
    env_base,
    fmt_us,
    interleaved,
    package_version,
    perf_ns,
    populate_delta_threads,
    populate_read_threads,
    print_delta_flatness,
    print_long_short,
    print_populate,
    print_targets,
    read_specs,
    stepper,
    write_json,
)
from _harness import ConvSim as _ConvSim
from _harness import print_table as _print_table
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as OfficialSaver
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph_idem_saver.postgres import AsyncPostgresSaver as OursSaver

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass
class Profile:
    name: str
    warmup: int
    rounds: int
    per_round: int
    short_thread: int
    long_thread: int
    read_rounds: int
    read_per_round: int
    conc_workers: int
    conc_ops: int  # total operations per concurrency measurement (split among workers)
    conc_rounds: int
    window: int = 20
    msg_bytes: int = 1000
    budget_s: float = 15.0


FULL = Profile(
    name="full",
    warmup=30,
    rounds=30,
    per_round=20,
    short_thread=10,
    long_thread=5000,
    read_rounds=20,
    read_per_round=30,
    conc_workers=8,
    conc_ops=480,
    conc_rounds=3,
)

QUICK = Profile(
    name="quick",
    warmup=5,
    rounds=6,
    per_round=10,
    short_thread=10,
    long_thread=500,
    read_rounds=4,
    read_per_round=15,
    conc_workers=8,
    conc_ops=160,
    conc_rounds=1,
    budget_s=3.0,
)

# --------------------------------------------------------------------------------------
# Deterministic payloads (same shapes as benchmarks/bench_sqlite.py)
# --------------------------------------------------------------------------------------

_WORDS_TEXT = (
    "the a of to and in is it you that he was for on are with as his they be at one "
    "have this from or had by hot word but what some we can out other were all there "
    "when up use your how said an each she which do their time if will way about many "
    "checkpoint graph agent tool invoice refund customer order shipping database"
)
PAYLOADS = Payloads(_WORDS_TEXT)
ai = PAYLOADS.ai


class ConvSim(_ConvSim):
    """The shared synthetic checkpoint stream (see ``_harness.ConvSim``) on these payloads."""

    payloads = PAYLOADS


# --------------------------------------------------------------------------------------
# Server and backends
# --------------------------------------------------------------------------------------


def start_server(no_fsync: bool) -> tuple[str, Any]:
    import pgserver

    pgdata = tempfile.mkdtemp(prefix="bench-postgres-")
    server = pgserver.get_server(pgdata, cleanup_mode="delete")
    dsn = str(server.get_uri())
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER SYSTEM SET max_connections = 100")
        if no_fsync:
            conn.execute("ALTER SYSTEM SET fsync = off")
            conn.execute("ALTER SYSTEM SET synchronous_commit = off")
        conn.execute("SELECT pg_reload_conf()")
    return dsn, server


def schema_dsn(base: str, tag: str) -> str:
    schema = f"bench_{tag}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    options = conninfo_to_dict(base).get("options") or ""
    return make_conninfo(base, options=f"{options} -c search_path={schema}".strip())


class Backend:
    """One saver on a fresh schema: a single connection, or a pool of ``pool`` conns."""

    def __init__(self, label: str, cls: type, base_dsn: str, tag: str, pool: int = 0) -> None:
        self.label = label
        self.cls = cls
        self.dsn = schema_dsn(base_dsn, f"{label}_{tag}")
        self.pool_size = pool
        self._cm: Any = None
        self.pool: AsyncConnectionPool[Any] | None = None
        self.saver: Any = None

    async def __aenter__(self) -> Backend:
        if self.pool_size:
            self.pool = AsyncConnectionPool(
                self.dsn,
                min_size=self.pool_size,
                max_size=self.pool_size,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            )
            await self.pool.open(wait=True)
            self.saver = self.cls(self.pool)
        else:
            self._cm = self.cls.from_conn_string(self.dsn)
            self.saver = await self._cm.__aenter__()
        await self.saver.setup()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self.pool is not None:
            await self.pool.close()
        else:
            await self._cm.__aexit__(*exc)
        self.saver = None


CLASSES: dict[str, type] = {"official": OfficialSaver, "ours": OursSaver}

# --------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------


async def bench_aput(base: str, prof: Profile) -> Row:
    backends = {lab: Backend(lab, cls, base, "aput") for lab, cls in CLASSES.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        sims = {
            lab: ConvSim(b.saver, "t-aput", prof.window, prof.msg_bytes, seed=1)
            for lab, b in backends.items()
        }
        samples = await interleaved(
            list(sims),
            aput_prepare(sims, MIXED),
            prof.warmup,
            prof.rounds,
            prof.per_round,
            prof.budget_s,
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row.from_samples("aput", "aput (messages changed every 2nd ckpt)", samples)


async def bench_aput_writes(base: str, prof: Profile) -> Row:
    backends = {lab: Backend(lab, cls, base, "writes") for lab, cls in CLASSES.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        saver_of = {lab: b.saver for lab, b in backends.items()}
        prepare = await aput_writes_prepare(ConvSim, saver_of, prof)
        samples = await interleaved(
            list(backends), prepare, prof.warmup, prof.rounds, prof.per_round, prof.budget_s
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row.from_samples("aput_writes", "aput_writes (3 channels)", samples)


async def bench_reads(base: str, prof: Profile) -> tuple[list[Row], dict[str, Any]]:
    backends = {lab: Backend(lab, cls, base, "reads") for lab, cls in CLASSES.items()}
    pop: dict[str, Any] = {}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs: dict[str, dict[str, list[Any]]] = {}
        for lab, b in backends.items():
            t0 = perf_ns()
            short, long_ = await populate_read_threads(ConvSim, b.saver, prof)
            dt = (perf_ns() - t0) / 1e9
            pop[lab] = {"checkpoints": 100 + prof.short_thread + prof.long_thread, "seconds": dt}
            cfgs[lab] = {"short": short, "long": long_}
            async with await psycopg.AsyncConnection.connect(b.dsn, autocommit=True) as conn:
                await conn.execute("ANALYZE")
        saver_of = {lab: b.saver for lab, b in backends.items()}

        await check_latest(saver_of, cfgs, prof.window)  # sanity: same answer from both

        rows = []
        specs = read_specs(prof, saver_of)
        for key, title, prep in specs:
            per = prof.read_per_round if key != "alist_10" else max(5, prof.read_per_round // 3)
            samples = await interleaved(
                list(backends), prep, prof.warmup // 2, prof.read_rounds, per, prof.budget_s
            )
            rows.append(Row.from_samples(key, title, samples))
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return rows, pop


async def bench_delta(base: str, prof: Profile) -> list[Row]:
    """Load the latest state of a 100- and a 1,000-step DeltaChannel thread (no snapshot:
    the whole thread is walked). Official: a paged scan of the namespace's checkpoints by
    id, then a writes query; ours: one recursive statement along the parent ids."""
    backends = {lab: Backend(lab, cls, base, "delta") for lab, cls in CLASSES.items()}
    for b in backends.values():
        await b.__aenter__()
    rows = []
    try:
        graphs = {lab: await populate_delta_threads(b.saver) for lab, b in backends.items()}
        for b in backends.values():
            async with await psycopg.AsyncConnection.connect(b.dsn, autocommit=True) as conn:
                await conn.execute("ANALYZE")
        for key, title, prep in delta_specs(graphs):
            samples = await interleaved(
                list(backends),
                prep,
                max(1, prof.warmup // 5),
                prof.read_rounds,
                max(2, prof.read_per_round // 10),
                prof.budget_s,
            )
            rows.append(Row.from_samples(key, title, samples))
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return rows


async def run_workers(saver: Any, workers: int, total_ops: int, prof: Profile, tag: str) -> float:
    """``workers`` coroutines, each on its own thread, sharing ``total_ops`` steps of
    aput + aget_tuple; returns steps per second."""
    per_worker = total_ops // workers
    sims = [
        ConvSim(saver, f"t-conc-{tag}-{w}-{uuid.uuid4().hex[:6]}", prof.window, prof.msg_bytes, w)
        for w in range(workers)
    ]
    plans = [[sim.next(MIXED[i % 2]) for i in range(per_worker)] for sim in sims]

    async def worker(sim: ConvSim, plan: list[Any]) -> None:
        read_cfg = {"configurable": {"thread_id": sim.thread_id, "checkpoint_ns": ""}}
        parent: str | None = None
        for cfg, cp, md, nv in plan:
            if parent is not None:
                cfg["configurable"]["checkpoint_id"] = parent
            await saver.aput(cfg, cp, md, nv)
            parent = cp["id"]
            await saver.aget_tuple(read_cfg)

    gc.collect()
    t0 = time.perf_counter()
    await asyncio.gather(*(worker(s, p) for s, p in zip(sims, plans, strict=True)))
    return (per_worker * workers) / (time.perf_counter() - t0)


async def bench_concurrency(base: str, prof: Profile) -> list[Row]:
    n = prof.conc_workers
    backends = {lab: Backend(lab, cls, base, "conc", pool=n) for lab, cls in CLASSES.items()}
    for b in backends.values():
        await b.__aenter__()
    results: dict[tuple[str, int], list[float]] = {}
    try:
        for b in backends.values():  # warm-up: prepared statements on every connection
            await run_workers(b.saver, n, n * 4, prof, "warm")
        for r in range(prof.conc_rounds):
            order = list(backends) if r % 2 == 0 else list(backends)[::-1]
            for lab in order:
                for workers in (1, n) if r % 2 == 0 else (n, 1):
                    ops = await run_workers(
                        backends[lab].saver, workers, prof.conc_ops, prof, f"{r}"
                    )
                    results.setdefault((lab, workers), []).append(ops)
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)

    def med(lab: str, workers: int) -> dict[str, Any]:
        vals = results[(lab, workers)]
        return {"value": statistics.median(vals), "samples": vals}

    rows = [
        Row(
            "conc_1",
            "pool: 1 worker (aput+aget_tuple steps/s)",
            "ops",
            med("official", 1),
            med("ours", 1),
        ),
        Row(
            f"conc_{n}",
            f"pool: {n} workers on {n} threads (steps/s)",
            "ops",
            med("official", n),
            med("ours", n),
        ),
    ]
    for lab in backends:
        scale = results and statistics.median(results[(lab, n)]) / statistics.median(
            results[(lab, 1)]
        )
        rows[1].extra[f"{lab}_scaling"] = scale
    return rows


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def fmt(row: Row, side: str) -> str:
    v = row.value(side)
    if row.unit == "us":
        return fmt_us(v, ms_digits=2)
    return f"{v:,.0f}/s"


def print_table(rows: list[Row]) -> None:
    _print_table(
        rows,
        fmt,
        "median per call [p10–p90] (or throughput); speedup = ours vs official (>1: ours better)",
    )


def evaluate_targets(rows: dict[str, Row], prof: Profile) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if r := rows.get("aput"):
        out.append(
            {
                "target": "aput >= 1.3x official",
                "value": f"{r.speedup:.2f}x",
                "met": r.speedup >= 1.3,
            }
        )
    a, b = rows.get("aget_tuple_10"), rows.get("aget_tuple_long")
    if a and b:
        ratio = b.value("ours") / a.value("ours")
        out.append(
            {
                "target": f"ours aget_tuple flat: latest@{prof.long_thread} / "
                f"latest@{prof.short_thread} <= 1.3",
                "value": f"{ratio:.2f}",
                "met": ratio <= 1.3,
            }
        )
    if c := rows.get(f"conc_{prof.conc_workers}"):
        s = c.extra["ours_scaling"]
        out.append(
            {
                "target": f"ours on a pool: {prof.conc_workers} threads >= 2x one thread",
                "value": f"{s:.2f}x (official {c.extra['official_scaling']:.2f}x)",
                "met": s >= 2.0,
            }
        )
    return out


def env_info() -> dict[str, Any]:
    v = package_version
    return {
        **env_base(),
        "langgraph": v("langgraph"),
        "langgraph-checkpoint": v("langgraph-checkpoint"),
        "langgraph-checkpoint-postgres": v("langgraph-checkpoint-postgres"),
        "psycopg": v("psycopg"),
        "libpq": psycopg.pq.version(),
    }


ALL_BENCHES = ("aput", "writes", "reads", "concurrency", "delta")


async def main_async(args: argparse.Namespace) -> int:
    prof = QUICK if args.quick else FULL
    if args.long_thread:
        prof.long_thread = args.long_thread
    only = set(args.only.split(",")) if args.only else set(ALL_BENCHES)
    base = args.dsn or os.environ.get("IDEM_SAVER_PG_DSN")
    server = None
    if not base:
        base, server = start_server(args.no_fsync)
    with psycopg.connect(base, autocommit=True) as conn:
        row = conn.execute(
            "SELECT version(), current_setting('fsync'), current_setting('synchronous_commit')"
        ).fetchone()
    assert row is not None
    server_info = {"version": row[0], "fsync": row[1], "synchronous_commit": row[2]}
    t_start = time.perf_counter()
    rows: list[Row] = []
    extra: dict[str, Any] = {"server": server_info}

    step = stepper(t_start)

    if "aput" in only:
        step("aput")
        rows.append(await bench_aput(base, prof))
    if "writes" in only:
        step("aput_writes")
        rows.append(await bench_aput_writes(base, prof))
    if "reads" in only:
        step(f"populate {prof.long_thread}-ckpt thread + reads")
        r, pop = await bench_reads(base, prof)
        rows += r
        extra["populate"] = pop
    if "concurrency" in only:
        step(f"concurrency (pool of {prof.conc_workers})")
        rows += await bench_concurrency(base, prof)
    if "delta" in only:
        step("DeltaChannel threads (100 and 1,000 steps) + loads")
        rows += await bench_delta(base, prof)
    elapsed = time.perf_counter() - t_start

    print(
        f"\nserver: {server_info['version'].split(',')[0]}; fsync={server_info['fsync']}, "
        f"synchronous_commit={server_info['synchronous_commit']}"
    )
    print_table(rows)
    by_key = {r.key: r for r in rows}
    print_populate(extra)
    print_long_short(by_key)
    print_delta_flatness(by_key)
    if c := by_key.get(f"conc_{prof.conc_workers}"):
        print(
            f"pool scaling {prof.conc_workers} workers / 1 worker: "
            f"official {c.extra['official_scaling']:.2f}x, ours {c.extra['ours_scaling']:.2f}x"
        )
    targets = evaluate_targets(by_key, prof)
    print_targets(targets)
    print(f"\ntotal benchmark time {elapsed:.1f}s ({prof.name})")

    if args.json:
        payload = {
            "profile": prof.__dict__,
            "env": env_info(),
            "elapsed_s": elapsed,
            "rows": [r.to_json("speedup") for r in rows],
            "targets": targets,
            **extra,
        }
        write_json(args.json, payload)
    if server is not None:
        server.cleanup()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument("--dsn", help="use this server (default: $IDEM_SAVER_PG_DSN or pgserver)")
    ap.add_argument(
        "--no-fsync",
        action="store_true",
        help="throwaway server only: fsync=off, synchronous_commit=off",
    )
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(ALL_BENCHES)}")
    ap.add_argument("--long-thread", type=int, help="checkpoints in the long thread (default 5000)")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
