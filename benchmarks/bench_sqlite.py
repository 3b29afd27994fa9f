#!/usr/bin/env python
"""Side-by-side benchmark: langgraph_idem_saver.AsyncSqliteSaver vs the official
``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver``.

Both savers run in ONE process, on fresh temporary files, with the same workload.
Micro-benchmarks are interleaved (official, ours, ours, official, ...) in rounds so
that noise from other processes on the machine hits both columns alike.

Usage::

    python benchmarks/bench_sqlite.py            # full run (~2-3 min)
    python benchmarks/bench_sqlite.py --quick    # smoke run (< 30 s)
    python benchmarks/bench_sqlite.py --json results.json

``--ours official`` puts the official saver in both columns (to sanity-check the
harness: every speedup should then be ~1.0x). ``--ours auto`` (the default) uses
our saver if it imports and falls back to the official one with a warning.

See benchmarks/README.md for what each row means.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import sqlite3
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any

from _harness import (
    MIXED,
    SMALL,
    WITH_MSGS,
    Payloads,
    Row,
    aput_prepare,
    aput_writes_prepare,
    bench_tmpdir,
    check_latest,
    delta_specs,
    env_base,
    fmt_us,
    interleaved,
    load_average_checked,
    load_summary,
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
    summarize,
    write_json,
)
from _harness import ConvSim as _ConvSim
from _harness import print_table as _print_table
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass
class Profile:
    name: str
    # micro-benchmarks: warm-up calls per backend, rounds, calls per backend per round
    warmup: int
    rounds: int
    per_round: int
    # read benchmarks
    short_thread: int
    long_thread: int
    read_rounds: int
    read_per_round: int
    # graph loop
    graph_steps: int
    graph_warmup: int
    graph_rounds: int
    graph_per_round: int
    # chat / file size
    chat_turns: int
    # sliding window of messages held in the "messages" channel for the aput rows
    window: int = 20
    msg_bytes: int = 1000
    # wall-clock cap per micro-benchmark row (both backends together), seconds
    budget_s: float = 12.0


FULL = Profile(
    name="full",
    warmup=50,
    rounds=40,
    per_round=25,
    short_thread=10,
    long_thread=5000,
    read_rounds=20,
    read_per_round=50,
    graph_steps=20,
    graph_warmup=3,
    graph_rounds=40,
    graph_per_round=1,
    chat_turns=200,
)

QUICK = Profile(
    name="quick",
    warmup=10,
    rounds=6,
    per_round=10,
    short_thread=10,
    long_thread=1000,
    read_rounds=4,
    read_per_round=20,
    graph_steps=20,
    graph_warmup=1,
    graph_rounds=6,
    graph_per_round=1,
    chat_turns=200,
    budget_s=1.5,
)

# --------------------------------------------------------------------------------------
# Deterministic payloads
# --------------------------------------------------------------------------------------

_WORDS_TEXT = (
    "the a of to and in is it you that he was for on are with as his they be at one "
    "have this from or had by hot word but what some we can out other were all there "
    "when up use your how said an each she which do their time if will way about "
    "many then them write would like so these her long make thing see him two has "
    "look more day could go come did number sound no most people my over know water "
    "than call first who may down side been now find checkpoint graph agent tool "
    "invoice refund customer order shipping database transaction latency throughput "
)


PAYLOADS = Payloads(_WORDS_TEXT)
human, ai, tool_msg = PAYLOADS.human, PAYLOADS.ai, PAYLOADS.tool_msg


# --------------------------------------------------------------------------------------
# Backends
# --------------------------------------------------------------------------------------


def resolve_ours(mode: str) -> tuple[type, str]:
    if mode == "official":
        return OfficialSaver, "official (forced by --ours official)"
    try:
        from langgraph_idem_saver import AsyncSqliteSaver as Ours  # type: ignore
    except Exception as e:
        if mode == "package":
            raise
        print(
            f"WARNING: cannot import langgraph_idem_saver.AsyncSqliteSaver ({e!r}); "
            "using the OFFICIAL saver in the 'ours' column (speedups will be ~1.0x).",
            file=sys.stderr,
        )
        return OfficialSaver, "official (fallback: ours not importable)"
    return Ours, f"{Ours.__module__}.{Ours.__qualname__}"


class Backend:
    """One saver opened on a fresh temp file."""

    def __init__(self, label: str, cls: type, tmpdir: str, tag: str) -> None:
        self.label = label
        self.cls = cls
        self.path = os.path.join(tmpdir, f"{label}-{tag}.sqlite")
        self._cm: Any = None
        self.saver: Any = None

    async def __aenter__(self) -> Backend:
        self._cm = self.cls.from_conn_string(self.path)
        self.saver = await self._cm.__aenter__()
        setup = getattr(self.saver, "setup", None)
        if setup is not None:
            res = setup()
            if asyncio.iscoroutine(res):
                await res
        if SYNCHRONOUS_OVERRIDE:
            conn = _aiosqlite_conn(self.saver)
            if conn is None:
                raise RuntimeError(f"--synchronous: no aiosqlite connection on {self.label}")
            await conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS_OVERRIDE}")
        if self.label not in PRAGMAS:
            PRAGMAS[self.label] = await conn_pragmas(self.saver)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._cm.__aexit__(*exc)
        self.saver = None


PRAGMAS: dict[str, dict] = {}
SYNCHRONOUS_OVERRIDE: str | None = None  # diagnostic: --synchronous


def _aiosqlite_conn(saver: Any) -> Any:
    import aiosqlite

    for v in vars(saver).values():
        if isinstance(v, aiosqlite.Connection):
            return v
    return None


async def conn_pragmas(saver: Any) -> dict:
    """Best effort: the durability-relevant PRAGMAs of the saver's own connection."""
    conn = _aiosqlite_conn(saver)
    if conn is None:
        return {"note": "no aiosqlite.Connection attribute found"}
    out = {}
    for name in ("journal_mode", "synchronous", "cache_size", "mmap_size", "page_size"):
        try:
            async with conn.execute(f"PRAGMA {name}") as cur:
                row = await cur.fetchone()
            out[name] = row[0] if row else None
        except Exception as e:
            out[name] = f"error: {e}"
    return out


def file_bytes(path: str) -> dict[str, int]:
    sizes = {}
    for suffix in ("", "-wal", "-shm", "-journal"):
        p = path + suffix
        if os.path.exists(p):
            sizes[suffix or "db"] = os.path.getsize(p)
    return sizes


def checkpoint_wal(path: str) -> None:
    con = sqlite3.connect(path)
    try:
        con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        con.close()


class ConvSim(_ConvSim):
    """The shared synthetic checkpoint stream (see ``_harness.ConvSim``) on these payloads."""

    payloads = PAYLOADS
    metadata_extra = {"writes": None}  # noqa: RUF012


# --------------------------------------------------------------------------------------
# Benchmarks
# --------------------------------------------------------------------------------------


async def bench_aput(classes: dict[str, type], tmp: str, prof: Profile) -> list[Row]:
    rows = []
    variants = [
        ("aput", "aput (mixed: messages every 2nd ckpt)", MIXED),
        ("aput_small", "aput (only small channels changed)", (SMALL,)),
        ("aput_msgs", "aput (messages channel changed)", (WITH_MSGS,)),
    ]
    for key, title, patterns in variants:
        backends = {lab: Backend(lab, cls, tmp, key) for lab, cls in classes.items()}
        for b in backends.values():
            await b.__aenter__()
        try:
            sims = {
                lab: ConvSim(b.saver, "t-aput", prof.window, prof.msg_bytes, seed=1)
                for lab, b in backends.items()
            }
            samples = await interleaved(
                list(sims),
                aput_prepare(sims, patterns),
                prof.warmup,
                prof.rounds,
                prof.per_round,
                prof.budget_s,
            )
        finally:
            for b in backends.values():
                await b.__aexit__(None, None, None)
        rows.append(Row.from_samples(key, title, samples))
    return rows


async def bench_aput_writes(classes: dict[str, type], tmp: str, prof: Profile) -> Row:
    backends = {lab: Backend(lab, cls, tmp, "writes") for lab, cls in classes.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        saver_of = {lab: b.saver for lab, b in backends.items()}
        prepare = await aput_writes_prepare(ConvSim, saver_of, prof)
        samples = await interleaved(
            list(backends),
            prepare,
            prof.warmup,
            prof.rounds,
            prof.per_round,
            prof.budget_s,
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row.from_samples("aput_writes", "aput_writes (task writes 3 channels)", samples)


async def bench_reads(classes: dict[str, type], tmp: str, prof: Profile) -> tuple[list[Row], dict]:
    backends = {lab: Backend(lab, cls, tmp, "reads") for lab, cls in classes.items()}
    pop_info: dict[str, Any] = {}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs: dict[str, dict[str, list[dict]]] = {}
        for lab, b in backends.items():
            t0 = perf_ns()
            short, long_ = await populate_read_threads(ConvSim, b.saver, prof)
            dt = (perf_ns() - t0) / 1e9
            n_ck = 100 + prof.short_thread + prof.long_thread
            pop_info[lab] = {
                "checkpoints": n_ck,
                "seconds": round(dt, 3),
                "ckpt_plus_writes_per_s": round(n_ck / dt, 1),
                "file_bytes": file_bytes(b.path),
            }
            cfgs[lab] = {"short": short, "long": long_}
        saver_of = {lab: b.saver for lab, b in backends.items()}

        def by_id(lab: str) -> Callable[[], Awaitable[Any]]:
            long_ = cfgs[lab]["long"]
            cfg = long_[len(long_) // 2]
            return lambda: saver_of[lab].aget_tuple(cfg)

        # sanity: both return the right latest checkpoint with its pending writes
        await check_latest(saver_of, cfgs, prof.window)

        rows = []
        specs = read_specs(prof, saver_of, by_id)
        # pre-warm every read path on both backends first, so that the first row measured
        # does not pay for cold page caches left behind by the population phase
        for _key, _title, prep in specs:
            for lab in backends:
                for _ in range(5):
                    await prep(lab)()
        for key, title, prep in specs:
            per = prof.read_per_round if key != "alist_10" else max(5, prof.read_per_round // 4)
            samples = await interleaved(
                list(backends),
                prep,
                prof.warmup // 2,
                prof.read_rounds,
                per,
                prof.budget_s,
            )
            rows.append(Row.from_samples(key, title, samples))
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return rows, pop_info


# --- compiled graphs ------------------------------------------------------------------


class LoopState(TypedDict):
    messages: Annotated[list, add_messages]
    count: int


def build_loop_graph(steps: int) -> Any:
    def counter(state: LoopState) -> dict:
        c = state["count"] + 1
        return {
            "count": c,
            "messages": [AIMessage(content=f"step {c}: " + "x" * 180, id=f"m-{c}")],
        }

    def route(state: LoopState) -> str:
        return "counter" if state["count"] < steps else END

    g = StateGraph(LoopState)
    g.add_node("counter", counter)
    g.add_edge(START, "counter")
    g.add_conditional_edges("counter", route, ["counter", END])
    return g


class ChatState(TypedDict):
    messages: Annotated[list, add_messages]


def build_chat_graph(msg_bytes: int) -> Any:
    rng = random.Random(99)

    def agent(state: ChatState) -> dict:
        return {"messages": [ai(rng, msg_bytes)]}

    g = StateGraph(ChatState)
    g.add_node("agent", agent)
    g.add_edge(START, "agent")
    g.add_edge("agent", END)
    return g


async def bench_graph_loop(classes: dict[str, type], tmp: str, prof: Profile) -> Row:
    builder = build_loop_graph(prof.graph_steps)
    backends = {lab: Backend(lab, cls, tmp, "loop") for lab, cls in classes.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        graphs = {lab: builder.compile(checkpointer=b.saver) for lab, b in backends.items()}
        n = {lab: 0 for lab in backends}

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            n[lab] += 1
            cfg = {
                "configurable": {"thread_id": f"loop-{n[lab]}"},
                "recursion_limit": 4 * prof.graph_steps + 10,
            }
            inp = {"messages": [HumanMessage(content="count to twenty", id="h0")], "count": 0}

            async def run() -> None:
                out = await graphs[lab].ainvoke(inp, cfg, durability="sync")
                assert out["count"] == prof.graph_steps, out["count"]

            return run

        samples = await interleaved(
            list(backends),
            prepare,
            prof.graph_warmup,
            prof.graph_rounds,
            prof.graph_per_round,
            prof.budget_s * 2,
        )
        # checkpoints per run, for the record
        ck = 0
        b0 = next(iter(backends.values()))
        async for _ in b0.saver.alist({"configurable": {"thread_id": "loop-1"}}):
            ck += 1
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row(
        "graph_loop",
        f"graph: {prof.graph_steps}-superstep loop, durability=sync",
        "us",
        summarize(samples["official"]),
        summarize(samples["ours"]),
        extra={"checkpoints_per_run": ck},
    )


async def bench_chat(classes: dict[str, type], tmp: str, prof: Profile) -> list[Row]:
    """N turns (human + AI ~1 KB each) through a compiled graph; file size after.

    Both backends run the same conversation, alternating turn by turn (order swapped
    every turn) so disk/CPU noise hits both alike.
    """
    builder = build_chat_graph(prof.msg_bytes)
    backends = {lab: Backend(lab, cls, tmp, "chat") for lab, cls in classes.items()}
    for b in backends.values():
        await b.__aenter__()
    labels = list(backends)
    turn_ns: dict[str, list[int]] = {lab: [] for lab in labels}
    res: dict[str, dict] = {}
    try:
        graphs = {lab: builder.compile(checkpointer=b.saver) for lab, b in backends.items()}
        rngs = {lab: random.Random(7) for lab in labels}
        cfg = {"configurable": {"thread_id": "chat-1"}}
        for t in range(prof.chat_turns):
            for lab in labels if t % 2 == 0 else labels[::-1]:
                inp = {"messages": [human(rngs[lab], prof.msg_bytes)]}
                t0 = perf_ns()
                await graphs[lab].ainvoke(inp, cfg, durability="sync")
                turn_ns[lab].append(perf_ns() - t0)
        for lab, b in backends.items():
            state = await graphs[lab].aget_state(cfg)
            assert len(state.values["messages"]) == 2 * prof.chat_turns
            n_ck = 0
            async for _ in b.saver.alist(cfg):
                n_ck += 1
            res[lab] = {"checkpoints": n_ck, "bytes_open": file_bytes(b.path)}
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    for lab, b in backends.items():
        res[lab]["bytes_closed"] = file_bytes(b.path)
        checkpoint_wal(b.path)
        after = file_bytes(b.path)
        ts = turn_ns[lab]
        res[lab].update(
            {
                "total_s": sum(ts) / 1e9,
                "first10_turn_us": statistics.median(ts[:10]) / 1000.0,
                "last10_turn_us": statistics.median(ts[-10:]) / 1000.0,
                "bytes_after_wal_checkpoint": after,
                "mb": (after.get("db", 0) + after.get("-wal", 0)) / 1e6,
            }
        )
        for sfx in ("", "-wal", "-shm"):
            if os.path.exists(b.path + sfx):
                os.remove(b.path + sfx)
    o, u = res["official"], res["ours"]
    t = prof.chat_turns
    return [
        Row(
            "chat_file_mb",
            f"file size after {t}-turn chat (db+wal)",
            "MB",
            {"value": o["mb"], **o},
            {"value": u["mb"], **u},
        ),
        Row(
            "chat_total_s",
            f"{t}-turn chat total wall time",
            "s",
            {"value": o["total_s"]},
            {"value": u["total_s"]},
        ),
        Row(
            "chat_last_turn",
            f"chat turn latency, last 10 of {t} turns",
            "us",
            {"median_us": o["last10_turn_us"], "first10_turn_us": o["first10_turn_us"]},
            {"median_us": u["last10_turn_us"], "first10_turn_us": u["first10_turn_us"]},
        ),
    ]


async def bench_delta(classes: dict[str, type], tmp: str, prof: Profile) -> list[Row]:
    """Load the latest state of a 100- and a 1,000-step DeltaChannel thread (no snapshot:
    the whole thread is walked). Official: two statements, streaming and decoding every
    ancestor's checkpoint; ours: one recursive statement that reads no checkpoint blob."""
    backends = {lab: Backend(lab, cls, tmp, "delta") for lab, cls in classes.items()}
    for b in backends.values():
        await b.__aenter__()
    rows = []
    try:
        graphs = {lab: await populate_delta_threads(b.saver) for lab, b in backends.items()}
        for key, title, prep in delta_specs(graphs):
            samples = await interleaved(
                list(backends),
                prep,
                prof.warmup // 5,
                prof.read_rounds,
                max(2, prof.read_per_round // 10),
                prof.budget_s,
            )
            rows.append(Row.from_samples(key, title, samples))
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return rows


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def fmt(row: Row, side: str) -> str:
    v = row.value(side)
    if row.unit == "us":
        return fmt_us(v)
    if row.unit == "MB":
        return f"{v:,.2f} MB"
    return f"{v:,.2f} s"


def evaluate_targets(rows: dict[str, Row], prof: Profile) -> list[dict]:
    out = []
    r = rows.get("aput")
    if r:
        out.append(
            {
                "target": "aput >= 1.7x official (mixed row, medians)",
                "value": f"{r.speedup:.2f}x",
                "met": r.speedup >= 1.7,
            }
        )
    a, b = rows.get("aget_tuple_10"), rows.get("aget_tuple_long")
    if a and b:
        ratio = b.value("ours") / a.value("ours")
        out.append(
            {
                "target": (
                    f"ours aget_tuple flat: latest@{prof.long_thread} / "
                    f"latest@{prof.short_thread} <= 1.3"
                ),
                "value": f"{ratio:.2f}",
                "met": ratio <= 1.3,
            }
        )
    f = rows.get("chat_file_mb")
    if f:
        frac = f.value("ours") / f.value("official")
        out.append(
            {
                "target": f"file size after {prof.chat_turns} turns <= 1/10 official",
                "value": f"{frac:.3f} (1/{1 / frac:.1f})" if frac else "0",
                "met": frac <= 0.1,
            }
        )
    return out


def print_table(rows: list[Row], ours_impl: str) -> None:
    _print_table(
        rows,
        fmt,
        f"ours = {ours_impl}",
        "median per call; [p10–p90]; speedup = official / ours (>1: ours faster/smaller)",
    )


def env_info(ours_cls: type) -> dict:
    v = package_version
    return {
        **env_base(),
        "sqlite": sqlite3.sqlite_version,
        "langgraph": v("langgraph"),
        "langgraph-checkpoint": v("langgraph-checkpoint"),
        "langgraph-checkpoint-sqlite": v("langgraph-checkpoint-sqlite"),
        "aiosqlite": v("aiosqlite"),
        "langgraph-idem-saver": v("langgraph-idem-saver"),
        "ours_module_file": sys.modules.get(ours_cls.__module__).__file__
        if ours_cls.__module__ in sys.modules
        else None,
    }


ALL_BENCHES = ("aput", "writes", "reads", "graph", "chat", "delta")


async def main_async(args: argparse.Namespace) -> int:
    prof = QUICK if args.quick else FULL
    if args.long_thread:
        prof.long_thread = args.long_thread
    if args.turns:
        prof.chat_turns = args.turns
    ours_cls, ours_impl = resolve_ours(args.ours)
    global SYNCHRONOUS_OVERRIDE
    SYNCHRONOUS_OVERRIDE = args.synchronous
    classes = {"official": OfficialSaver, "ours": ours_cls}
    only = set(args.only.split(",")) if args.only else set(ALL_BENCHES)
    load_before = load_average_checked()
    t_start = time.perf_counter()
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    step = stepper(t_start)
    with bench_tmpdir("bench_sqlite_", args.tmpdir, args.keep) as tmp:
        if "aput" in only:
            step("aput")
            rows += await bench_aput(classes, tmp, prof)
        if "writes" in only:
            step("aput_writes")
            rows.append(await bench_aput_writes(classes, tmp, prof))
        if "reads" in only:
            step(f"populate {prof.long_thread}-ckpt thread + reads")
            r, pop = await bench_reads(classes, tmp, prof)
            rows += r
            extra["populate"] = pop
        if "graph" in only:
            step("graph loop")
            rows.append(await bench_graph_loop(classes, tmp, prof))
        if "chat" in only:
            step(f"{prof.chat_turns}-turn chat")
            rows += await bench_chat(classes, tmp, prof)
        if "delta" in only:
            step("DeltaChannel threads (100 and 1,000 steps) + loads")
            rows += await bench_delta(classes, tmp, prof)
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()

    print_table(rows, ours_impl)
    by_key = {r.key: r for r in rows}
    targets = evaluate_targets(by_key, prof)
    print_populate(extra)
    if "chat_file_mb" in by_key:
        r = by_key["chat_file_mb"]
        for side, d in (("official", r.official), ("ours", r.ours)):
            print(
                f"chat {side}: {d['checkpoints']} checkpoints; bytes while open "
                f"{d['bytes_open']}, after close {d['bytes_closed']}, "
                f"after wal_checkpoint {d['bytes_after_wal_checkpoint']}"
            )
    print_long_short(by_key)
    print_delta_flatness(by_key)
    print(f"connection pragmas: {PRAGMAS}")
    print_targets(targets)
    print(load_summary(elapsed, prof.name, load_before, load_after))

    if args.json:
        payload = {
            "profile": prof.__dict__,
            "ours_impl": ours_impl,
            "env": env_info(ours_cls),
            "elapsed_s": elapsed,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "rows": [r.to_json("speedup_official_over_ours") for r in rows],
            "targets": targets,
            "pragmas": PRAGMAS,
            "synchronous_override": SYNCHRONOUS_OVERRIDE,
            **extra,
        }
        write_json(args.json, payload)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run, < 30 s")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument(
        "--ours",
        choices=("auto", "package", "official"),
        default="auto",
        help="auto: ours if importable else official; package: require ours; "
        "official: official in both columns (harness self-check)",
    )
    ap.add_argument("--only", help=f"comma-separated subset of {','.join(ALL_BENCHES)}")
    ap.add_argument("--long-thread", type=int, help="checkpoints in the long thread (default 5000)")
    ap.add_argument("--turns", type=int, help="chat turns for the file-size row (default 200)")
    ap.add_argument("--tmpdir", help="where to create the temp files (default: system temp)")
    ap.add_argument(
        "--synchronous",
        choices=("NORMAL", "OFF", "FULL"),
        help="diagnostic: force this PRAGMA synchronous on BOTH connections after setup "
        "(default: each saver's own setting, FULL for both)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the temp databases")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
