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

Usage::

    python benchmarks/bench_postgres.py            # full run (~2-4 min)
    python benchmarks/bench_postgres.py --quick    # smoke run (< 1 min)
    python benchmarks/bench_postgres.py --json results.json
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as OfficialSaver
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langgraph_idem_saver.postgres import AsyncPostgresSaver as OursSaver

perf_ns = time.perf_counter_ns

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
_WORDS = _WORDS_TEXT.split()


def text(rng: random.Random, nbytes: int) -> str:
    out: list[str] = []
    n = 0
    while n < nbytes:
        w = rng.choice(_WORDS)
        out.append(w)
        n += len(w) + 1
    return " ".join(out)[:nbytes]


def human(rng: random.Random, nbytes: int) -> HumanMessage:
    return HumanMessage(content=text(rng, nbytes), id=str(uuid.UUID(int=rng.getrandbits(128))))


def ai(rng: random.Random, nbytes: int) -> AIMessage:
    return AIMessage(
        content=text(rng, nbytes),
        id=str(uuid.UUID(int=rng.getrandbits(128))),
        response_metadata={"model_name": "bench-model", "finish_reason": "stop"},
        usage_metadata={"input_tokens": 812, "output_tokens": 230, "total_tokens": 1042},
    )


def tool_msg(rng: random.Random, nbytes: int) -> ToolMessage:
    return ToolMessage(
        content=text(rng, nbytes),
        tool_call_id=f"call_{rng.getrandbits(48):x}",
        id=str(uuid.UUID(int=rng.getrandbits(128))),
    )


class ConvSim:
    """Realistic (config, checkpoint, metadata, new_versions) tuples for one thread.

    Channels: ``messages`` (a sliding window of ~1 KB messages), ``count``, ``status``
    and two trigger channels; only the channels changed in a step get a new version.
    """

    def __init__(self, saver: Any, thread_id: str, window: int, msg_bytes: int, seed: int) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.rng = random.Random(seed)
        self.msg_bytes = msg_bytes
        self.step = -1
        self.parent_id: str | None = None
        self.cp = empty_checkpoint()
        msgs = [
            human(self.rng, msg_bytes) if i % 2 == 0 else ai(self.rng, msg_bytes)
            for i in range(window)
        ]
        self.values: dict[str, Any] = {
            "messages": msgs,
            "count": 0,
            "status": "running",
            "branch:to:agent": None,
            "branch:to:tools": None,
        }
        self.versions = {ch: saver.get_next_version(None, None) for ch in self.values}

    def config(self) -> dict[str, Any]:
        c: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent_id is not None:
            c["checkpoint_id"] = self.parent_id
        return {"configurable": c}

    def next(self, changed: tuple[str, ...]) -> tuple[Any, Any, Any, Any]:
        self.step += 1
        new_versions = {}
        for ch in changed:
            if ch == "messages":
                msgs = self.values["messages"]
                m = (
                    ai(self.rng, self.msg_bytes)
                    if self.step % 2
                    else tool_msg(self.rng, self.msg_bytes)
                )
                self.values["messages"] = [*msgs[1:], m]
            elif ch == "count":
                self.values["count"] += 1
            elif ch == "status":
                self.values["status"] = f"step-{self.step}"
            v = self.saver.get_next_version(self.versions[ch], None)
            self.versions[ch] = v
            new_versions[ch] = v
        node = "tools" if "branch:to:tools" in changed else "agent"
        cp = {
            "v": self.cp["v"],
            "id": str(uuid6(clock_seq=self.step)),
            "ts": "2025-01-01T00:00:00.000000+00:00",
            "channel_values": dict(self.values),
            "channel_versions": dict(self.versions),
            "versions_seen": {
                "__input__": {},
                "__start__": {"__start__": self.versions["count"]},
                node: {c: self.versions[c] for c in ("messages", "branch:to:" + node)},
            },
            "pending_sends": [],
            "updated_channels": list(changed),
        }
        md = {"source": "loop", "step": self.step, "parents": {}}
        return self.config(), cp, md, new_versions

    async def put(self, changed: tuple[str, ...]) -> Any:
        cfg, cp, md, nv = self.next(changed)
        out = await self.saver.aput(cfg, cp, md, nv)
        self.parent_id = cp["id"]
        return out


SMALL = ("count", "status", "branch:to:agent")
WITH_MSGS = ("messages", "branch:to:tools")
MIXED = (WITH_MSGS, SMALL)

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


# --------------------------------------------------------------------------------------
# Measurement
# --------------------------------------------------------------------------------------


def summarize(samples_ns: list[int]) -> dict[str, Any]:
    s = sorted(samples_ns)
    n = len(s)

    def q(p: float) -> float:
        return s[min(n - 1, max(0, round(p * (n - 1))))] / 1000.0

    return {
        "n": n,
        "median_us": statistics.median(s) / 1000.0,
        "p10_us": q(0.10),
        "p90_us": q(0.90),
        "mean_us": statistics.fmean(s) / 1000.0,
    }


async def interleaved(
    labels: list[str],
    prepare: Callable[[str], Callable[[], Awaitable[Any]]],
    warmup: int,
    rounds: int,
    per_round: int,
    budget_s: float | None = None,
) -> dict[str, list[int]]:
    """Time ``await prepare(label)()`` per call, alternating backend order each round."""
    t_begin = time.perf_counter()
    for lab in labels:
        for _ in range(warmup):
            await prepare(lab)()
    samples: dict[str, list[int]] = {lab: [] for lab in labels}
    for r in range(rounds):
        for lab in labels if r % 2 == 0 else labels[::-1]:
            gc.collect()
            buf = samples[lab]
            for _ in range(per_round):
                fn = prepare(lab)
                t0 = perf_ns()
                await fn()
                buf.append(perf_ns() - t0)
        if budget_s is not None and r >= 1 and time.perf_counter() - t_begin > budget_s:
            break
    return samples


@dataclass
class Row:
    key: str
    title: str
    unit: str  # "us": lower is better; "ops": higher is better
    official: dict[str, Any]
    ours: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def value(self, side: str) -> float:
        d = self.official if side == "official" else self.ours
        return float(d["median_us"] if self.unit == "us" else d["value"])

    @property
    def speedup(self) -> float:
        """> 1 means ours is faster."""
        o, f = self.value("ours"), self.value("official")
        if self.unit == "ops":
            return o / f if f else float("inf")
        return f / o if o else float("inf")


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
        ctr = dict.fromkeys(sims, 0)

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            sim = sims[lab]
            pat = MIXED[ctr[lab] % 2]
            ctr[lab] += 1
            cfg, cp, md, nv = sim.next(pat)

            async def run() -> None:
                await sim.saver.aput(cfg, cp, md, nv)
                sim.parent_id = cp["id"]

            return run

        samples = await interleaved(
            list(sims), prepare, prof.warmup, prof.rounds, prof.per_round, prof.budget_s
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row(
        "aput",
        "aput (messages changed every 2nd ckpt)",
        "us",
        summarize(samples["official"]),
        summarize(samples["ours"]),
    )


async def bench_aput_writes(base: str, prof: Profile) -> Row:
    backends = {lab: Backend(lab, cls, base, "writes") for lab, cls in CLASSES.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs = {}
        for lab, b in backends.items():
            sim = ConvSim(b.saver, "t-writes", prof.window, prof.msg_bytes, seed=2)
            cfgs[lab] = (b.saver, await sim.put(SMALL))
        msg = ai(random.Random(3), prof.msg_bytes)

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            saver, cfg = cfgs[lab]
            writes = [("messages", [msg]), ("count", 7), ("branch:to:tools", None)]
            task_id = str(uuid.uuid4())
            return lambda: saver.aput_writes(cfg, writes, task_id, "~__pregel_pull, agent")

        samples = await interleaved(
            list(backends), prepare, prof.warmup, prof.rounds, prof.per_round, prof.budget_s
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row(
        "aput_writes",
        "aput_writes (3 channels)",
        "us",
        summarize(samples["official"]),
        summarize(samples["ours"]),
    )


async def populate(saver: Any, thread_id: str, n: int, prof: Profile, seed: int) -> list[Any]:
    """n checkpoints (mixed pattern), each followed by one task's writes."""
    sim = ConvSim(saver, thread_id, prof.window, prof.msg_bytes, seed=seed)
    rng = random.Random(seed + 1)
    small_msg = ai(rng, 200)
    cfgs = []
    for i in range(n):
        cfg = await sim.put(MIXED[i % 2])
        await saver.aput_writes(
            cfg,
            [("messages", [small_msg]), ("branch:to:tools", None)],
            str(uuid.UUID(int=rng.getrandbits(128))),
            "~__pregel_pull, agent",
        )
        cfgs.append(cfg)
    return cfgs


async def bench_reads(base: str, prof: Profile) -> tuple[list[Row], dict[str, Any]]:
    backends = {lab: Backend(lab, cls, base, "reads") for lab, cls in CLASSES.items()}
    pop: dict[str, Any] = {}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs: dict[str, dict[str, list[Any]]] = {}
        for lab, b in backends.items():
            t0 = perf_ns()
            await populate(b.saver, "t-other-a", 50, prof, seed=10)
            short = await populate(b.saver, "t-short", prof.short_thread, prof, seed=11)
            long_ = await populate(b.saver, "t-long", prof.long_thread, prof, seed=12)
            await populate(b.saver, "t-other-b", 50, prof, seed=13)
            dt = (perf_ns() - t0) / 1e9
            pop[lab] = {"checkpoints": 100 + prof.short_thread + prof.long_thread, "seconds": dt}
            cfgs[lab] = {"short": short, "long": long_}
            async with await psycopg.AsyncConnection.connect(b.dsn, autocommit=True) as conn:
                await conn.execute("ANALYZE")
        saver_of = {lab: b.saver for lab, b in backends.items()}

        def latest(thread: str) -> Callable[[str], Callable[[], Awaitable[Any]]]:
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            return lambda lab: lambda: saver_of[lab].aget_tuple(cfg)

        def listing(lab: str) -> Callable[[], Awaitable[Any]]:
            cfg = {"configurable": {"thread_id": "t-long", "checkpoint_ns": ""}}

            async def run() -> None:
                n = 0
                async for _ in saver_of[lab].alist(cfg, limit=10):
                    n += 1
                assert n == 10, n

            return run

        for lab in backends:  # sanity: same answer from both
            for kind, thread in (("short", "t-short"), ("long", "t-long")):
                tup = await latest(thread)(lab)()
                want = cfgs[lab][kind][-1]["configurable"]["checkpoint_id"]
                assert tup.config["configurable"]["checkpoint_id"] == want, (lab, kind)
                assert len(tup.pending_writes) == 2, (lab, tup.pending_writes)
                assert len(tup.checkpoint["channel_values"]["messages"]) == prof.window

        rows = []
        specs = [
            (
                "aget_tuple_10",
                f"aget_tuple latest ({prof.short_thread}-ckpt thread)",
                latest("t-short"),
            ),
            (
                "aget_tuple_long",
                f"aget_tuple latest ({prof.long_thread}-ckpt thread)",
                latest("t-long"),
            ),
            ("alist_10", f"alist(limit=10) ({prof.long_thread}-ckpt thread)", listing),
        ]
        for key, title, prep in specs:
            per = prof.read_per_round if key != "alist_10" else max(5, prof.read_per_round // 3)
            samples = await interleaved(
                list(backends), prep, prof.warmup // 2, prof.read_rounds, per, prof.budget_s
            )
            rows.append(
                Row(key, title, "us", summarize(samples["official"]), summarize(samples["ours"]))
            )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return rows, pop


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
        return f"{v / 1000:,.2f} ms" if v >= 10_000 else f"{v:,.0f} µs"
    return f"{v:,.0f}/s"


def spread(row: Row, side: str) -> str:
    d = row.official if side == "official" else row.ours
    if "p10_us" in d:
        return f"[{d['p10_us']:,.0f}–{d['p90_us']:,.0f}]"
    return ""


def print_table(rows: list[Row]) -> None:
    print()
    print("median per call [p10–p90] (or throughput); speedup = ours vs official (>1: ours better)")
    w = max(len(r.title) for r in rows)
    hdr = f"{'benchmark':<{w}}  {'official':>10} {'':>15}  {'ours':>10} {'':>15}  {'speedup':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r.title:<{w}}  {fmt(r, 'official'):>10} {spread(r, 'official'):>15}  "
            f"{fmt(r, 'ours'):>10} {spread(r, 'ours'):>15}  {r.speedup:>7.2f}x"
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
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "langgraph": v("langgraph"),
        "langgraph-checkpoint": v("langgraph-checkpoint"),
        "langgraph-checkpoint-postgres": v("langgraph-checkpoint-postgres"),
        "psycopg": v("psycopg"),
        "libpq": psycopg.pq.version(),
    }


ALL_BENCHES = ("aput", "writes", "reads", "concurrency")


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

    def step(name: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {name} ...", file=sys.stderr, flush=True)

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
    elapsed = time.perf_counter() - t_start

    print(
        f"\nserver: {server_info['version'].split(',')[0]}; fsync={server_info['fsync']}, "
        f"synchronous_commit={server_info['synchronous_commit']}"
    )
    print_table(rows)
    by_key = {r.key: r for r in rows}
    if "populate" in extra:
        p = extra["populate"]
        print(
            f"\npopulate {p['ours']['checkpoints']} ckpts (+writes): "
            f"official {p['official']['seconds']:.2f}s, ours {p['ours']['seconds']:.2f}s"
        )
    if "aget_tuple_10" in by_key and "aget_tuple_long" in by_key:
        a, b = by_key["aget_tuple_10"], by_key["aget_tuple_long"]
        print(
            "aget_tuple long/short ratio: official "
            f"{b.value('official') / a.value('official'):.2f}, "
            f"ours {b.value('ours') / a.value('ours'):.2f}"
        )
    if c := by_key.get(f"conc_{prof.conc_workers}"):
        print(
            f"pool scaling {prof.conc_workers} workers / 1 worker: "
            f"official {c.extra['official_scaling']:.2f}x, ours {c.extra['ours_scaling']:.2f}x"
        )
    targets = evaluate_targets(by_key, prof)
    print("\ntargets:")
    for t in targets:
        print(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")
    print(f"\ntotal benchmark time {elapsed:.1f}s ({prof.name})")

    if args.json:
        payload = {
            "profile": prof.__dict__,
            "env": env_info(),
            "elapsed_s": elapsed,
            "rows": [
                {
                    "key": r.key,
                    "title": r.title,
                    "unit": r.unit,
                    "official": r.official,
                    "ours": r.ours,
                    "speedup": r.speedup,
                    **({"extra": r.extra} if r.extra else {}),
                }
                for r in rows
            ],
            "targets": targets,
            **extra,
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2, default=str)
        print(f"wrote {args.json}")
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
