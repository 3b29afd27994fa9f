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
import gc
import json
import os
import platform
import random
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

perf_ns = time.perf_counter_ns

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
_WORDS = _WORDS_TEXT.split()


def text(rng: random.Random, nbytes: int) -> str:
    """English-ish text of about ``nbytes`` characters (compresses like prose)."""
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


# --------------------------------------------------------------------------------------
# Synthetic checkpoint stream (for the aput / read rows)
# --------------------------------------------------------------------------------------


class ConvSim:
    """Produces realistic (config, checkpoint, metadata, new_versions) tuples.

    Channels: ``messages`` (a sliding window of ``window`` ~1 KB messages, so the
    checkpoint size stays constant across the measurement), ``count`` (int),
    ``status`` (short str), and the trigger channels ``branch:to:agent`` /
    ``branch:to:tools``. Only the channels that changed in a step get a new version
    (from ``saver.get_next_version``) and appear in ``new_versions``.
    """

    def __init__(self, saver: Any, thread_id: str, window: int, msg_bytes: int, seed: int) -> None:
        self.saver = saver
        self.thread_id = thread_id
        self.rng = random.Random(seed)
        self.msg_bytes = msg_bytes
        self.step = -1
        self.parent_id: str | None = None
        self.cp = empty_checkpoint()
        msgs = []
        for i in range(window):
            msgs.append(human(self.rng, msg_bytes) if i % 2 == 0 else ai(self.rng, msg_bytes))
        self.values: dict[str, Any] = {
            "messages": msgs,
            "count": 0,
            "status": "running",
            "branch:to:agent": None,
            "branch:to:tools": None,
        }
        self.versions: dict[str, Any] = {}
        for ch in self.values:
            self.versions[ch] = saver.get_next_version(None, None)

    def config(self) -> dict:
        c: dict[str, Any] = {"thread_id": self.thread_id, "checkpoint_ns": ""}
        if self.parent_id is not None:
            c["checkpoint_id"] = self.parent_id
        return {"configurable": c}

    def next(self, changed: tuple[str, ...]) -> tuple[dict, dict, dict, dict]:
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
        md = {"source": "loop", "step": self.step, "parents": {}, "writes": None}
        cfg = self.config()
        return cfg, cp, md, new_versions

    async def put(self, changed: tuple[str, ...]) -> dict:
        cfg, cp, md, nv = self.next(changed)
        out = await self.saver.aput(cfg, cp, md, nv)
        self.parent_id = cp["id"]
        return out


# changed-channel patterns
SMALL = ("count", "status", "branch:to:agent")
WITH_MSGS = ("messages", "branch:to:tools")
MIXED = (WITH_MSGS, SMALL)  # alternate: messages change on every other checkpoint


# --------------------------------------------------------------------------------------
# Measurement helpers
# --------------------------------------------------------------------------------------


def summarize(samples_ns: list[int]) -> dict:
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
    ctxs: dict[str, Any],
    prepare: Callable[[Any], Callable[[], Awaitable[Any]]],
    warmup: int,
    rounds: int,
    per_round: int,
    budget_s: float | None = None,
) -> dict[str, list[int]]:
    """Time ``await prepare(ctx)()`` per call; preparation is not timed.

    Backends alternate order each round (A B, B A, ...) to spread drift evenly. If
    ``budget_s`` is exceeded, stop after the current round (at least 2 rounds), so a
    pathologically slow backend cannot blow the run time; both keep equal counts.
    """
    t_begin = time.perf_counter()
    labels = list(ctxs)
    for lab in labels:
        for _ in range(warmup):
            await prepare(ctxs[lab])()
    samples: dict[str, list[int]] = {lab: [] for lab in labels}
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for lab in order:
            ctx = ctxs[lab]
            gc.collect()
            buf = samples[lab]
            for _ in range(per_round):
                fn = prepare(ctx)
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
    unit: str  # "us" (lower is better), "MB" (lower is better), "s"
    official: dict
    ours: dict
    extra: dict = field(default_factory=dict)

    def value(self, side: str) -> float:
        d = self.official if side == "official" else self.ours
        return d["median_us"] if self.unit == "us" else d["value"]

    @property
    def speedup(self) -> float:
        """official / ours: > 1 means ours is faster (or smaller)."""
        o = self.value("ours")
        return self.value("official") / o if o else float("inf")


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
            ctr = {lab: 0 for lab in sims}

            def prepare(
                lab: str,
                sims: dict[str, ConvSim] = sims,
                patterns: tuple[tuple[str, ...], ...] = patterns,
                ctr: dict[str, int] = ctr,
            ) -> Callable[[], Awaitable[Any]]:
                sim = sims[lab]
                pat = patterns[ctr[lab] % len(patterns)]
                ctr[lab] += 1
                cfg, cp, md, nv = sim.next(pat)

                async def run() -> None:
                    await sim.saver.aput(cfg, cp, md, nv)
                    sim.parent_id = cp["id"]

                return run

            samples = await interleaved(
                {lab: lab for lab in sims},
                prepare,
                prof.warmup,
                prof.rounds,
                prof.per_round,
                prof.budget_s,
            )
        finally:
            for b in backends.values():
                await b.__aexit__(None, None, None)
        rows.append(
            Row(key, title, "us", summarize(samples["official"]), summarize(samples["ours"]))
        )
    return rows


async def bench_aput_writes(classes: dict[str, type], tmp: str, prof: Profile) -> Row:
    backends = {lab: Backend(lab, cls, tmp, "writes") for lab, cls in classes.items()}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs = {}
        for lab, b in backends.items():
            sim = ConvSim(b.saver, "t-writes", prof.window, prof.msg_bytes, seed=2)
            cfgs[lab] = (b.saver, await sim.put(SMALL))
        rng = random.Random(3)
        msg = ai(rng, prof.msg_bytes)

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            saver, cfg = cfgs[lab]
            writes = [("messages", [msg]), ("count", 7), ("branch:to:tools", None)]
            task_id = str(uuid.uuid4())
            return lambda: saver.aput_writes(cfg, writes, task_id, "~__pregel_pull, agent")

        samples = await interleaved(
            {lab: lab for lab in backends},
            prepare,
            prof.warmup,
            prof.rounds,
            prof.per_round,
            prof.budget_s,
        )
    finally:
        for b in backends.values():
            await b.__aexit__(None, None, None)
    return Row(
        "aput_writes",
        "aput_writes (task writes 3 channels)",
        "us",
        summarize(samples["official"]),
        summarize(samples["ours"]),
    )


async def populate(saver: Any, thread_id: str, n: int, prof: Profile, seed: int) -> list[dict]:
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


async def bench_reads(classes: dict[str, type], tmp: str, prof: Profile) -> tuple[list[Row], dict]:
    backends = {lab: Backend(lab, cls, tmp, "reads") for lab, cls in classes.items()}
    pop_info: dict[str, Any] = {}
    for b in backends.values():
        await b.__aenter__()
    try:
        cfgs: dict[str, dict[str, list[dict]]] = {}
        for lab, b in backends.items():
            t0 = perf_ns()
            # a few unrelated threads around the two measured ones
            await populate(b.saver, "t-other-a", 50, prof, seed=10)
            short = await populate(b.saver, "t-short", prof.short_thread, prof, seed=11)
            long_ = await populate(b.saver, "t-long", prof.long_thread, prof, seed=12)
            await populate(b.saver, "t-other-b", 50, prof, seed=13)
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

        def latest(thread: str) -> Callable[[str], Callable[[], Awaitable[Any]]]:
            cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
            return lambda lab: lambda: saver_of[lab].aget_tuple(cfg)

        def by_id(lab: str) -> Callable[[], Awaitable[Any]]:
            long_ = cfgs[lab]["long"]
            cfg = long_[len(long_) // 2]
            return lambda: saver_of[lab].aget_tuple(cfg)

        def listing(lab: str) -> Callable[[], Awaitable[Any]]:
            cfg = {"configurable": {"thread_id": "t-long", "checkpoint_ns": ""}}

            async def run() -> None:
                n = 0
                async for _ in saver_of[lab].alist(cfg, limit=10):
                    n += 1
                assert n == 10, n

            return run

        # sanity: both return the right latest checkpoint with its pending writes
        for lab in backends:
            for kind, thread in (("short", "t-short"), ("long", "t-long")):
                tup = await latest(thread)(lab)()
                want = cfgs[lab][kind][-1]["configurable"]["checkpoint_id"]
                got = tup.config["configurable"]["checkpoint_id"]
                assert got == want, (lab, kind, got, want)
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
            ("aget_tuple_by_id", f"aget_tuple by id (middle of {prof.long_thread})", by_id),
            ("alist_10", f"alist(limit=10) ({prof.long_thread}-ckpt thread)", listing),
        ]
        # pre-warm every read path on both backends first, so that the first row measured
        # does not pay for cold page caches left behind by the population phase
        for _key, _title, prep in specs:
            for lab in backends:
                for _ in range(5):
                    await prep(lab)()
        for key, title, prep in specs:
            per = prof.read_per_round if key != "alist_10" else max(5, prof.read_per_round // 4)
            samples = await interleaved(
                {lab: lab for lab in backends},
                prep,
                prof.warmup // 2,
                prof.read_rounds,
                per,
                prof.budget_s,
            )
            rows.append(
                Row(key, title, "us", summarize(samples["official"]), summarize(samples["ours"]))
            )
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
            {lab: lab for lab in backends},
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


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def fmt(row: Row, side: str) -> str:
    v = row.value(side)
    if row.unit == "us":
        if v >= 10_000:
            return f"{v / 1000:,.1f} ms"
        return f"{v:,.0f} µs"
    if row.unit == "MB":
        return f"{v:,.2f} MB"
    return f"{v:,.2f} s"


def spread(row: Row, side: str) -> str:
    d = row.official if side == "official" else row.ours
    if "p10_us" not in d:
        return ""
    return f"[{d['p10_us']:,.0f}–{d['p90_us']:,.0f}]"


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
    print()
    print(f"ours = {ours_impl}")
    print("median per call; [p10–p90]; speedup = official / ours (>1: ours faster/smaller)")
    w = max(len(r.title) for r in rows)
    hdr = f"{'benchmark':<{w}}  {'official':>10} {'':>15}  {'ours':>10} {'':>15}  {'speedup':>8}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r.title:<{w}}  {fmt(r, 'official'):>10} {spread(r, 'official'):>15}  "
            f"{fmt(r, 'ours'):>10} {spread(r, 'ours'):>15}  {r.speedup:>7.2f}x"
        )


def env_info(ours_cls: type) -> dict:
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


ALL_BENCHES = ("aput", "writes", "reads", "graph", "chat")


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
    tmp = tempfile.mkdtemp(prefix="bench_sqlite_", dir=args.tmpdir)
    load_before = os.getloadavg()
    if load_before[0] > 0.5 * (os.cpu_count() or 1):
        print(
            f"WARNING: load average {load_before[0]:.2f} on {os.cpu_count()} CPUs: other "
            "processes are busy; expect noisy numbers (fsync-bound rows especially)",
            file=sys.stderr,
        )
    t_start = time.perf_counter()
    rows: list[Row] = []
    extra: dict[str, Any] = {}
    try:

        def step(name: str) -> None:
            print(
                f"[{time.perf_counter() - t_start:6.1f}s] {name} ...", file=sys.stderr, flush=True
            )

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
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"kept temp files in {tmp}", file=sys.stderr)
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()

    print_table(rows, ours_impl)
    by_key = {r.key: r for r in rows}
    targets = evaluate_targets(by_key, prof)
    if "populate" in extra:
        p = extra["populate"]
        print(
            f"\npopulate {p['official']['checkpoints']} ckpts (+writes): "
            f"official {p['official']['seconds']:.2f}s, ours {p['ours']['seconds']:.2f}s"
        )
    if "chat_file_mb" in by_key:
        r = by_key["chat_file_mb"]
        for side, d in (("official", r.official), ("ours", r.ours)):
            print(
                f"chat {side}: {d['checkpoints']} checkpoints; bytes while open "
                f"{d['bytes_open']}, after close {d['bytes_closed']}, "
                f"after wal_checkpoint {d['bytes_after_wal_checkpoint']}"
            )
    if "aget_tuple_10" in by_key and "aget_tuple_long" in by_key:
        a, b = by_key["aget_tuple_10"], by_key["aget_tuple_long"]
        r_off = b.value("official") / a.value("official")
        r_ours = b.value("ours") / a.value("ours")
        print(f"aget_tuple long/short ratio: official {r_off:.2f}, ours {r_ours:.2f}")
    print(f"connection pragmas: {PRAGMAS}")
    print("\ntargets:")
    for t in targets:
        print(f"  [{'MET' if t['met'] else 'NOT MET'}] {t['target']}: {t['value']}")
    print(
        f"\ntotal benchmark time {elapsed:.1f}s ({prof.name}); load average before "
        f"{load_before[0]:.2f}, after {load_after[0]:.2f} ({os.cpu_count()} CPUs)"
    )

    if args.json:
        payload = {
            "profile": prof.__dict__,
            "ours_impl": ours_impl,
            "env": env_info(ours_cls),
            "elapsed_s": elapsed,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "rows": [
                {
                    "key": r.key,
                    "title": r.title,
                    "unit": r.unit,
                    "official": r.official,
                    "ours": r.ours,
                    "speedup_official_over_ours": r.speedup,
                    **({"extra": r.extra} if r.extra else {}),
                }
                for r in rows
            ],
            "targets": targets,
            "pragmas": PRAGMAS,
            "synchronous_override": SYNCHRONOUS_OVERRIDE,
            **extra,
        }
        with open(args.json, "w") as fh:
            json.dump(payload, fh, indent=2, default=str)
        print(f"wrote {args.json}")
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
