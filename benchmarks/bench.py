#!/usr/bin/env python
"""Ours vs LangGraph's savers, both backends, every configuration, in one run.

One process, one workload per row, the two savers side by side in interleaved rounds
(``_harness.interleaved``), medians printed with the ratio official / ours (> 1: ours is
faster). Configurations: ``sqlite`` (a temp file per saver, each saver's own
``from_conn_string``), ``pg`` (one connection each) and ``pg-pool`` (a psycopg
``AsyncConnectionPool`` of 8, autocommit, ``prepare_threshold=0``, ``dict_row``). The
PostgreSQL server is ``--dsn``/``$IDEM_SAVER_PG_DSN`` or a throwaway ``pgserver`` with its
default, durable settings; each saver gets its own schema. The read rows run in every
database state of ``db_states.py`` (``--states``, fresh first: created by ``setup()`` just
before; right after ``aimport_langgraph``; aged: ``--aged-copies`` copies of the read
thread, then ``ANALYZE``), both savers on the same state, the state printed with each
row; prepared statements on.

Every saver is opened on one ``AsyncExitStack`` per configuration. Besides the rows, the
run prints the raw floor of each configuration (an INSERT + commit of a 5 KB row with the
same driver and settings), what a 200-turn chat leaves on disk with each saver
(``storage``: one message appended a turn, so LangGraph's savers store the whole list at
every turn and ours a delta) and, with ``--explain``, the generic plan of each of our
PostgreSQL reads.

Usage::

    python benchmarks/bench.py --quick             # < 1 min
    python benchmarks/bench.py                     # full run (~5 min)
    python benchmarks/bench.py --configs sqlite --only aput,reads --json out.json
    python benchmarks/bench.py --only ledger --repeat 7   # 7 fresh processes, each
                                                          # ratio's median and range
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import operator
import os
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack, ExitStack, closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, cast

import aiosqlite
import psycopg
from _harness import (
    WITH_MSGS,
    ConvSim,
    Payloads,
    Prepare,
    aput_writes_prepare,
    delta_specs,
    env_base,
    interleaved,
    package_version,
    populate_delta_threads,
    tool_call_message,
    tools_graph,
    write_json,
)
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as OfficialPostgres
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSqlite
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from typing_extensions import TypedDict

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from db_states import AGED_COPIES, STATES, prepare_state, statistics_note
from ledger_bytecodes import ledger_bytecodes
from ledger_floor import TOOL_STEP_CALLS, postgres_floor_us, ratio_at_floor, sqlite_floor_us
from repeat import run_repeated

from langgraph_idem_saver import AsyncSqliteSaver as OursSqlite
from langgraph_idem_saver.postgres import AsyncPostgresSaver as OursPostgres
from langgraph_idem_saver.postgres import sql as pg_sql

LABELS = ["official", "ours"]
CONFIGS = ("sqlite", "pg", "pg-pool")
POOL_KWARGS = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
GAPS: dict[str, float] = {}  # pool_gap's medians (µs), filled by the pg-pool reads


@dataclass(frozen=True)
class Profile:
    """How much of everything one run does."""

    name: str
    long_thread: int  # checkpoints of the read thread
    fill_threads: int  # the aged state: copies of the read thread as other threads
    window: int = 20  # messages in the list channel (~5.6 KB serialized)
    msg_bytes: int = 256
    warmup: int = 10
    rounds: int = 10
    per_round: int = 10
    parallel: int = 8  # threads written at once
    calls: int = 50  # parallel tool calls of one step
    graph_rounds: int = 6
    budget_s: float = 20.0
    delta: bool = True


# the ledger rows' stacks: LangGraph's saver + stock ToolNode, ours + stock ToolNode,
# ours + IdempotentToolNode (the safe stack: "ours", so ``ratio`` is official / safe)
STACKS = {
    "official": ("official", "stock"),
    "ours+stock": ("ours", "stock"),
    "ours": ("ours", "idem"),
}

PROFILES = {
    "quick": Profile(
        "quick", 200, 10, warmup=3, rounds=3, per_round=6, graph_rounds=1, budget_s=2.0, delta=False
    ),
    "full": Profile("full", 1000, 100),
}


@dataclass
class Row:
    """One measured row: per-call samples (ns) of each saver in one configuration."""

    config: str
    key: str
    title: str
    samples: dict[str, list[int]]
    scale: int = 1  # calls per sample (per-call times are sample / scale)
    notes: dict[str, Any] = field(default_factory=dict)
    # the database state (db_states.py): the read rows run in each; the other rows on
    # databases setup() created for the run
    state: str = "fresh"

    def median_us(self, label: str) -> float:
        return statistics.median(self.samples[label]) / 1000.0 / self.scale

    @property
    def ratio(self) -> float:
        """official / ours: above 1.0 ours is faster."""
        return self.median_us("official") / self.median_us("ours")

    @property
    def ledger_us(self) -> float | None:
        """Ledger rows: what IdempotentToolNode adds per call over the stock node on our
        saver (ours - ours+stock); None for other rows."""
        if "ours+stock" not in self.samples:
            return None
        return self.median_us("ours") - self.median_us("ours+stock")

    def to_json(self) -> dict[str, Any]:
        return {
            "config": self.config,
            "key": self.key,
            "title": self.title,
            "state": self.state,
            "median_us": {lab: self.median_us(lab) for lab in self.samples},
            "n": {lab: len(s) for lab, s in self.samples.items()},
            "ratio": self.ratio,
            **self.notes,
        }


_WORDS = (
    "the a to of and in that is for it on with as was be by this are or from at an not "
    "order invoice payment customer account refund shipping delivery address product "
    "price total status update request support ticket message agent tool result error "
    "please thanks check confirm cancel review details number date time amount balance"
)


class Sim(ConvSim):
    """The list channel gets a new version on every step without growing."""

    payloads = Payloads(_WORDS)


class GrowingSim(Sim):
    """The list channel grows by one message a step (the same objects, as a reducer)."""

    def next(self, changed: tuple[str, ...]) -> tuple[Any, Any, Any, Any]:
        if "messages" in changed:
            keep = list(self.values["messages"])
            out = super().next(changed)
            self.values["messages"] = [*keep, self.values["messages"][-1]]
            out[1]["channel_values"]["messages"] = self.values["messages"]
            return out
        return super().next(changed)


# --------------------------------------------------------------------------------------
# Opening savers (one AsyncExitStack per configuration)
# --------------------------------------------------------------------------------------


def start_server(stack: AsyncExitStack) -> str:
    """A throwaway PostgreSQL (durable defaults), stopped when ``stack`` closes."""
    import pgserver

    server = pgserver.get_server(tempfile.mkdtemp(prefix="idem-bench-pg-"), cleanup_mode="delete")
    stack.callback(server.cleanup)
    return str(server.get_uri())


def new_schema(base: str, name: str) -> str:
    schema = f"bench_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    options = conninfo_to_dict(base).get("options") or ""
    return make_conninfo(base, options=f"{options} -c search_path={schema}".strip())


def new_dbs(config: str, tag: str, tmp: str, pg_base: str | None) -> dict[str, str]:
    """Empty databases for ``config``, one a saver: files, or schemas on ``pg_base``."""
    if config == "sqlite":
        return {lab: os.path.join(tmp, f"{tag}-{lab}-{uuid.uuid4().hex[:6]}.db") for lab in LABELS}
    assert pg_base is not None
    return {lab: new_schema(pg_base, f"{tag}_{lab}") for lab in LABELS}


async def open_savers(stack: AsyncExitStack, config: str, where: dict[str, str]) -> dict[str, Any]:
    """label -> saver for ``config``; ``where`` holds each label's file path or DSN."""
    classes = {
        "sqlite": (OfficialSqlite, OursSqlite),
        "pg": (OfficialPostgres, OursPostgres),
        "pg-pool": (OfficialPostgres, OursPostgres),
    }[config]
    savers = {}
    for label, cls in zip(LABELS, classes, strict=True):
        if config == "pg-pool":
            pool = AsyncConnectionPool(
                where[label], min_size=8, max_size=8, kwargs=POOL_KWARGS, open=False
            )
            await stack.enter_async_context(pool)
            await pool.wait()
            saver = cls(pool)
        else:
            saver = await stack.enter_async_context(cls.from_conn_string(where[label]))
        await saver.setup()
        savers[label] = saver
    return savers


# --------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------


async def timed(
    config: str,
    key: str,
    title: str,
    prepare: Prepare,
    prof: Profile,
    scale: int = 1,
    labels: list[str] = LABELS,
) -> Row:
    samples = await interleaved(
        labels, prepare, prof.warmup, prof.rounds, prof.per_round, prof.budget_s
    )
    return Row(config, key, title, samples, scale)


def aput_stream(savers: dict[str, Any], sim_cls: type[Sim], prof: Profile, tag: str) -> Prepare:
    sims = {
        lab: sim_cls(s, f"w-{tag}", prof.window, prof.msg_bytes, 1) for lab, s in savers.items()
    }

    def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
        return lambda: sims[lab].put(WITH_MSGS)

    return prepare


def parallel_aput(savers: dict[str, Any], prof: Profile) -> Prepare:
    sims = {
        lab: [Sim(s, f"par-{i}", prof.window, prof.msg_bytes, i) for i in range(prof.parallel)]
        for lab, s in savers.items()
    }

    def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
        async def run() -> None:
            await asyncio.gather(*(sim.put(WITH_MSGS) for sim in sims[lab]))

        return run

    return prepare


def reader(savers: dict[str, Any], thread: str, limit: int | None) -> Prepare:
    """``aget_tuple`` of the latest checkpoint, or ``alist(limit=...)`` consumed."""
    cfg = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}

    def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
        saver = savers[lab]
        if limit is None:
            return lambda: saver.aget_tuple(cfg)

        async def run() -> None:
            got = [t async for t in saver.alist(cfg, limit=limit)]
            assert len(got) == limit, len(got)

        return run

    return prepare


def tool_step(savers: dict[str, Any], calls: int) -> Prepare:
    """One graph step with ``calls`` parallel calls on each of ``STACKS`` (durability
    sync, a fresh thread per invoke)."""
    graphs = {lab: tools_graph(node, savers[saver]) for lab, (saver, node) in STACKS.items()}
    count = dict.fromkeys(STACKS, 0)

    def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
        count[lab] += 1
        tag = f"{lab}-{count[lab]}-{uuid.uuid4().hex[:6]}"
        inp = {"messages": [tool_call_message(calls, tag)]}
        cfg = {"configurable": {"thread_id": f"step-{tag}"}}
        return lambda: graphs[lab].ainvoke(inp, cfg, durability="sync")

    return prepare


class Agentish(TypedDict):
    messages: list[Any]  # a plain channel: each step re-emits the whole list
    count: int


E2E_STEPS = 20


def e2e_graph(window: list[Any], fresh: list[Any]) -> StateGraph:
    """``E2E_STEPS`` supersteps of one node that returns the whole 20-message list with
    one message rotated in: a list re-versioned on every step without growing, as an agent
    node that returns its full state writes it."""

    def step(state: Agentish) -> dict[str, Any]:
        n = state["count"]
        return {"messages": [*state["messages"][1:], fresh[n % len(fresh)]], "count": n + 1}

    g = StateGraph(Agentish)
    g.add_node("agent", step)
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", lambda s: "agent" if s["count"] < E2E_STEPS else END)
    return g


def e2e_specs(savers: dict[str, Any], prof: Profile) -> list[tuple[str, str, Prepare]]:
    """(key, title, prepare) of the end-to-end rows: the graph under each durability."""
    rng = random.Random(5)
    window = [Sim.payloads.ai(rng, prof.msg_bytes) for _ in range(prof.window)]
    fresh = [Sim.payloads.ai(rng, prof.msg_bytes) for _ in range(8)]
    graphs = {lab: e2e_graph(window, fresh).compile(checkpointer=s) for lab, s in savers.items()}
    specs = []
    for durability in ("sync", "async", "exit"):

        def prepare(lab: str, durability: str = durability) -> Callable[[], Awaitable[Any]]:
            cfg = {"configurable": {"thread_id": f"e2e-{uuid.uuid4().hex}"}}
            inp = {"messages": window, "count": 0}
            return lambda: graphs[lab].ainvoke(inp, cfg, durability=durability)

        title = f"graph.ainvoke, {E2E_STEPS} supersteps, durability {durability}"
        specs.append((f"graph_{durability}", title, prepare))
    return specs


async def pool_gap(pool_saver: Any, dsn: str, prof: Profile) -> dict[str, float]:
    """Issue #16's pool target: our ``aget_tuple`` through the pool against our saver on
    one connection, on the same database, interleaved; and the same statement sent by
    hand through each, which is what the pool itself costs (check-out, return, and the
    next call landing on another of its server processes). Medians in µs."""
    cfg = {"configurable": {"thread_id": "long", "checkpoint_ns": ""}}
    params = {"thread_id": "long", "ns": "", "checkpoint_id": None}  # ours sends this
    pool = pool_saver.conn
    async with OursPostgres.from_conn_string(dsn) as single:

        async def by_hand(conn: Any) -> None:
            async with conn.cursor(binary=True) as cur:
                await cur.execute(pg_sql.SELECT_TUPLE_CALL, params)
                await cur.fetchone()

        async def by_hand_pooled() -> None:
            async with pool.connection() as conn:
                await by_hand(conn)

        calls: dict[str, Callable[[], Awaitable[Any]]] = {
            "ours, one connection": lambda: single.aget_tuple(cfg),
            "ours, pool": lambda: pool_saver.aget_tuple(cfg),
            "statement, one connection": lambda: by_hand(single.conn),
            "statement, pool": by_hand_pooled,
        }
        samples = await interleaved(
            list(calls), lambda lab: calls[lab], prof.warmup, prof.rounds * 3, prof.per_round
        )
    return {lab: statistics.median(v) / 1000.0 for lab, v in samples.items()}


STORAGE_TURNS = 200  # checkpoints of the storage probe's chat


RETAIN_THREADS, RETAIN_TURNS = 100, 10  # chats of the memory probe


class ChatState(TypedDict):
    messages: Annotated[list[Any], add_messages]


async def retained_objects(config: str, where: dict[str, str]) -> dict[str, int]:
    """Objects still alive once ``RETAIN_THREADS`` chats of ``RETAIN_TURNS`` turns (a
    graph with ``add_messages``) have ended, the saver still open: what the saver keeps
    in memory after its runs (counted by the garbage collector, which walks them all on
    every full collection)."""

    def reply(state: ChatState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"echo {state['messages'][-1].content} " * 8)]}

    counts: dict[str, int] = {}
    for label in LABELS:
        async with AsyncExitStack() as stack:
            saver = (await open_savers(stack, config, where))[label]
            builder = StateGraph(ChatState)
            builder.add_node("reply", reply)
            builder.add_edge(START, "reply")
            graph = builder.compile(checkpointer=saver)
            await graph.ainvoke({"messages": [HumanMessage("warm up")]}, chat_config("warm"))
            gc.collect()
            before = len(gc.get_objects())
            for thread in range(RETAIN_THREADS):
                for turn in range(RETAIN_TURNS):
                    text = f"turn {turn} " * 8
                    await graph.ainvoke({"messages": [HumanMessage(text)]}, chat_config(thread))
            # aiosqlite's worker thread holds its last job until the next one
            await saver.aget_tuple(chat_config("warm"))
            gc.collect()
            counts[label] = len(gc.get_objects()) - before
    return counts


def chat_config(thread: object) -> Any:
    return {"configurable": {"thread_id": f"retain-{thread}"}}


async def storage_bytes(config: str, where: dict[str, str]) -> dict[str, int]:
    """What a chat of ``STORAGE_TURNS`` turns, one message appended per turn (GrowingSim,
    starting from one message), leaves on disk with each saver: the SQLite file after a
    WAL checkpoint, or on Postgres every table of the saver's schema with its indexes and
    TOAST (``pg_total_relation_size``; TOAST compresses large values)."""
    sizes: dict[str, int] = {}
    for label in LABELS:
        async with AsyncExitStack() as stack:
            saver = (await open_savers(stack, config, where))[label]
            sim = GrowingSim(saver, "storage", 1, 256, 7)
            for _ in range(STORAGE_TURNS):
                await sim.put(WITH_MSGS)
        if config == "sqlite":
            with closing(sqlite3.connect(where[label])) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            sizes[label] = os.path.getsize(where[label])
        else:
            with psycopg.connect(where[label], autocommit=True) as conn:
                row = conn.execute(
                    "SELECT sum(pg_total_relation_size(c.oid)) FROM pg_class AS c "
                    "JOIN pg_namespace AS n ON n.oid = c.relnamespace "
                    "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
                ).fetchone()
            sizes[label] = int(row[0]) if row and row[0] is not None else 0
    return sizes


async def bench_config(
    config: str, where: dict[str, str], prof: Profile, only: set[str], pg_base: str | None
) -> list[Row]:
    rows: list[Row] = []
    async with AsyncExitStack() as stack:
        savers = await open_savers(stack, config, where)
        if "aput" in only:
            for key, title, prep in (
                (
                    "aput_reversioned",
                    "aput, list re-versioned",
                    aput_stream(savers, Sim, prof, "r"),
                ),
                ("aput_growing", "aput, growing list", aput_stream(savers, GrowingSim, prof, "g")),
                (
                    "aput_parallel",
                    f"aput, {prof.parallel} threads at once (per call)",
                    parallel_aput(savers, prof),
                ),
                ("aput_writes", "aput_writes", await aput_writes_prepare(Sim, savers, prof)),
            ):
                scale = prof.parallel if key == "aput_parallel" else 1
                rows.append(await timed(config, key, title, prep, prof, scale))
        if "graph" in only:
            graph_prof = Profile(
                "graph", 0, 0, warmup=2, rounds=prof.graph_rounds, per_round=2,
                budget_s=prof.budget_s,
            )  # fmt: skip
            for key, title, prep in e2e_specs(savers, prof):
                rows.append(await timed(config, key, title, prep, graph_prof))
        if "ledger" in only:
            for calls in (1, prof.calls):
                # short and noisy (a few fsyncs each): twice the rounds of the graph rows,
                # more invocations per round (the 50-call step moved 0.67-0.80x between
                # runs with 12 samples per stack; 48 now)
                graph_prof = Profile(
                    "graph",
                    0,
                    0,
                    warmup=2,
                    rounds=2 * prof.graph_rounds,
                    per_round=4 if calls > 1 else 10,
                    budget_s=prof.budget_s,
                )
                title = "a lone tool call" if calls == 1 else f"one step, {calls} tool calls"
                rows.append(
                    await timed(
                        config,
                        f"tool_step_{calls}",
                        f"graph step: {title} (per call)",
                        tool_step(savers, calls),
                        graph_prof,
                        calls,
                        list(STACKS),
                    )
                )
        if "delta" in only and prof.delta and config != "pg-pool":
            graphs = {lab: await populate_delta_threads(s) for lab, s in savers.items()}
            for key, title, prep in delta_specs(graphs):
                rows.append(await timed(config, key, title, prep, prof))
    return rows


async def read_rows(
    config: str, where: dict[str, str], prof: Profile, state: str, gap: bool = False
) -> list[Row]:
    """The read rows of ``config`` on the databases of one state (``db_states``)."""
    n = prof.long_thread
    stats = statistics_note(config, where["ours"])
    rows = []
    async with AsyncExitStack() as stack:
        savers = await open_savers(stack, config, where)
        for key, title, limit in (
            ("aget_tuple", f"aget_tuple, latest of {n}", None),
            ("alist_10", f"alist(limit=10), {n} checkpoints", 10),
        ):
            row = await timed(config, key, title, reader(savers, "long", limit), prof)
            row.state = f"{state} ({stats})"
            rows.append(row)
        if gap:
            GAPS.update(await pool_gap(savers["ours"], where["ours"], prof))
    return rows


# --------------------------------------------------------------------------------------
# The sync savers (the "sync" rows): called as graph.invoke calls them, from a thread
# without an event loop of theirs; ours hop to the private loop of their async saver
# --------------------------------------------------------------------------------------


class Loop(TypedDict):
    count: int
    log: Annotated[list[str], operator.add]


def loop_graph(steps: int) -> Any:
    """One node looping ``steps`` supersteps, each appending a ~200-byte line."""

    def step(state: Loop) -> dict[str, Any]:
        return {"count": state["count"] + 1, "log": [f"step {state['count']}" + "x" * 180]}

    g = StateGraph(Loop)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["count"] < steps else END)
    return g


def sync_tools_graph(kind: str, saver: Any) -> Any:
    """``_harness.tools_graph`` with a sync ``noop`` (``graph.invoke`` runs it in a thread):
    LangGraph's ``ToolNode`` (``stock``) or ours (``idem``), the sync saver's ledger."""
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode

    from langgraph_idem_saver import IdempotentToolNode

    @tool("noop")
    def noop_sync(i: int) -> str:
        """Do nothing (a side-effecting tool as far as the ledger knows)."""
        return "ok"

    node = IdempotentToolNode([noop_sync]) if kind == "idem" else ToolNode([noop_sync])
    g = StateGraph(MsgStateSync)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    return g.compile(checkpointer=saver)


class MsgStateSync(TypedDict):
    messages: Annotated[list[Any], add_messages]


def open_sync_savers(stack: ExitStack, config: str, where: dict[str, str]) -> dict[str, Any]:
    """label -> sync saver: LangGraph's SqliteSaver/PostgresSaver and ours, each on the
    same kind of connection (SQLite ``synchronous=FULL`` both; Postgres ``POOL_KWARGS``)."""
    from langgraph.checkpoint.postgres import PostgresSaver as OfficialSyncPostgres
    from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSyncSqlite

    from langgraph_idem_saver.postgres import PostgresSaver as OursSyncPostgres
    from langgraph_idem_saver.sqlite import SqliteSaver as OursSyncSqlite

    savers: dict[str, Any] = {}
    for label in LABELS:
        if config == "sqlite":
            conn: Any = stack.enter_context(
                closing(sqlite3.connect(where[label], check_same_thread=False))
            )
            conn.execute("PRAGMA synchronous=FULL")
            official, ours = OfficialSyncSqlite, OursSyncSqlite
        else:
            conn = stack.enter_context(psycopg.Connection.connect(where[label], **POOL_KWARGS))
            official, ours = OfficialSyncPostgres, OursSyncPostgres
        saver = official(conn) if label == "official" else stack.enter_context(ours(conn))
        saver.setup()
        savers[label] = saver
    return savers


def sync_specs(savers: dict[str, Any], prof: Profile) -> list[tuple[str, str, Prepare]]:
    """(key, title, prepare) of each sync row; a prepared call runs the sync method."""
    window = [Sim.payloads.ai(random.Random(i), prof.msg_bytes) for i in range(prof.window)]
    state = {lab: {"parent": None, "n": 0, "versions": {}} for lab in savers}
    cfg = {"configurable": {"thread_id": "w", "checkpoint_ns": ""}}

    def put(lab: str) -> Any:
        saver, st = savers[lab], state[lab]
        st["n"] += 1
        checkpoint = empty_checkpoint()
        changed = ["count"] if st["n"] % 2 else ["count", "messages"]
        checkpoint["channel_values"] = {"count": st["n"], "messages": window}
        for ch in changed:
            st["versions"][ch] = saver.get_next_version(st["versions"].get(ch), None)
        checkpoint["channel_versions"] = dict(st["versions"])
        new = {ch: st["versions"][ch] for ch in changed}
        st["parent"] = saver.put(st["parent"] or cfg, checkpoint, {"source": "loop"}, new)

    steps = 10
    graphs = {lab: loop_graph(steps).compile(checkpointer=s) for lab, s in savers.items()}

    def invoke(lab: str) -> Any:
        thread = {"configurable": {"thread_id": f"g-{uuid.uuid4().hex}"}}
        out = graphs[lab].invoke({"count": 0, "log": []}, thread, durability="sync")
        assert out["count"] == steps

    # LangGraph's saver and ToolNode against ours and IdempotentToolNode (the sync ledger)
    tool_graphs = {
        lab: sync_tools_graph("idem" if lab == "ours" else "stock", s) for lab, s in savers.items()
    }

    # run from a thread without an event loop (the timing loop's would be refused by the
    # sync front door): the same hand-off for both stacks
    no_loop = ThreadPoolExecutor(1)

    def tool_step(lab: str) -> Any:
        tag = uuid.uuid4().hex[:10]
        inp = {"messages": [tool_call_message(10, tag)]}
        cfg = {"configurable": {"thread_id": f"s-{tag}"}}
        no_loop.submit(tool_graphs[lab].invoke, inp, cfg).result()

    calls: dict[str, tuple[str, Callable[[str], Any]]] = {
        "sync_put": ("sync put (list every 2nd checkpoint)", put),
        "sync_get_tuple": ("sync get_tuple, latest", lambda lab: savers[lab].get_tuple(cfg)),
        "sync_list_10": ("sync list(limit=10)", lambda lab: list(savers[lab].list(cfg, limit=10))),
        "sync_invoke": (f"sync graph.invoke, {steps}-step loop", invoke),
        "sync_tool_step_10": ("sync graph step, 10 tool calls (the ledger; per step)", tool_step),
    }

    def prepare_of(call: Callable[[str], Any]) -> Prepare:
        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            async def run() -> None:
                call(lab)  # blocks this thread's loop: nothing else runs on it

            return run

        return prepare

    return [(key, title, prepare_of(call)) for key, (title, call) in calls.items()]


def bench_sync(config: str, where: dict[str, str], prof: Profile) -> list[Row]:
    """The sync rows of ``config``, run in a thread of their own (see ``main_async``)."""
    with ExitStack() as stack:
        savers = open_sync_savers(stack, config, where)
        return [
            asyncio.run(timed(config, key, title, prep, prof))
            for key, title, prep in sync_specs(savers, prof)
        ]


# --------------------------------------------------------------------------------------
# Floors and plans
# --------------------------------------------------------------------------------------


async def floor_us(config: str, where: str, n: int = 100) -> float:
    """Median INSERT + commit of one 5 KB row with the configuration's driver/settings."""
    blob = os.urandom(5120)
    ts = []
    if config == "sqlite":
        async with aiosqlite.connect(where) as db:
            await db.execute("PRAGMA journal_mode=WAL")
            await db.execute("PRAGMA synchronous=FULL")
            await db.execute("CREATE TABLE IF NOT EXISTS floor (k INTEGER PRIMARY KEY, v BLOB)")
            for _ in range(n):
                t0 = time.perf_counter_ns()
                await db.execute("INSERT INTO floor (v) VALUES (?)", (blob,))
                await db.commit()
                ts.append(time.perf_counter_ns() - t0)
    else:
        conn = await psycopg.AsyncConnection.connect(where, **POOL_KWARGS)  # type: ignore[arg-type]
        async with conn:
            await conn.execute("CREATE TABLE IF NOT EXISTS floor (k SERIAL PRIMARY KEY, v BYTEA)")
            for _ in range(n):
                t0 = time.perf_counter_ns()
                await conn.execute("INSERT INTO floor (v) VALUES (%s)", (blob,))
                ts.append(time.perf_counter_ns() - t0)
    return statistics.median(ts[n // 10 :]) / 1000.0


def explain_reads(dsn: str, thread: str) -> str:
    """EXPLAIN ANALYZE of our two reads as generic plans (prepared, after five runs)."""
    reads = {
        "aget_tuple (latest)": (pg_sql.SELECT_LATEST_TUPLE, ["thread_id", "ns"], ""),
        "alist(limit=10)": (
            pg_sql.SELECT_TUPLES.format(
                where="WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s",
                limit=pg_sql.LIST_LIMIT,
            ),
            ["thread_id", "ns", "limit"],
            ", 10",
        ),
    }
    out = []
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("SET plan_cache_mode = force_generic_plan")
        for i, (name, (query, params, extra)) in enumerate(reads.items()):
            for n, p in enumerate(params, 1):
                query = query.replace(f"%({p})s", f"${n}")
            types = ", ".join("integer" if p == "limit" else "text" for p in params)
            conn.execute(f"PREPARE r{i} ({types}) AS {query}")
            plan = conn.execute(
                f"EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY ON) "
                f"EXECUTE r{i} ('{thread}', ''{extra})"
            ).fetchall()
            out.append(f"-- {name}\n" + "\n".join(r[0] for r in plan))
    return "\n\n".join(out)


# --------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------


def print_rows(rows: list[Row], floors: dict[str, float]) -> None:
    if not rows:  # e.g. --quick --only delta: the quick profile has no DeltaChannel rows
        print("\nno timed rows (none selected by --only, or only the DeltaChannel rows, which")
        print("the quick profile skips)")
        return
    w = max(len(r.title) for r in rows)
    head = f"{'official':>11} {'ours':>11} {'ratio':>7} {'ours+stock':>11} {'ledger':>9}"
    sw = max(len(r.state) for r in rows)
    print(f"\n{'config':<8} {'state':<{sw}} {'row':<{w}} {head}")
    for r in rows:
        ledger = (
            ""
            if r.ledger_us is None
            else (f"{r.median_us('ours+stock'):>8,.0f} µs {r.ledger_us:>+6,.0f} µs")
        )
        print(
            f"{r.config:<8} {r.state:<{sw}} {r.title:<{w}} {r.median_us('official'):>8,.0f} µs "
            f"{r.median_us('ours'):>8,.0f} µs {r.ratio:>6.2f}x {ledger}"
        )
    for config, us in floors.items():
        print(f"floor ({config}): INSERT + commit of a 5 KB row {us:,.0f} µs")
    for r in rows:  # a lone call's ledger needs one synced commit: the claim
        if r.key == "tool_step_1" and r.ledger_us is not None and r.config in floors:
            beyond = r.ledger_us - floors[r.config]
            print(
                f"ledger of a lone call ({r.config}) beyond its synced commit (the claim): "
                f"{beyond:+,.0f} µs"
            )
    if GAPS:
        ours = GAPS["ours, pool"] - GAPS["ours, one connection"]
        raw = GAPS["statement, pool"] - GAPS["statement, one connection"]
        print(
            f"pool vs one connection, aget_tuple (same database, interleaved): ours "
            f"{GAPS['ours, one connection']:,.0f} -> {GAPS['ours, pool']:,.0f} µs ({ours:+,.0f} "
            f"µs); the same statement by hand {raw:+,.0f} µs; ours beyond the pool's own "
            f"cost {ours - raw:+,.0f} µs"
        )


async def ledger_floors_us(
    config: str, tmp: str, pg_base: str | None, prof: Profile
) -> dict[int, float]:
    """The ledger's floor (``ledger_floor.py``) of a step of 1 and of 50 calls, µs a step,
    on a fresh database (the pool's: one connection of the same settings)."""
    reps = 40 if prof.name == "quick" else 200
    out = {}
    for calls in (1, 50):
        if config == "sqlite":
            path = os.path.join(tmp, f"ledger-floor-{calls}.db")
            out[calls] = await sqlite_floor_us(path, calls, reps)
        else:
            dsn = new_schema(cast(str, pg_base), f"ledger_floor_{calls}")
            out[calls] = await postgres_floor_us(dsn, calls, reps, POOL_KWARGS)
    return out


def print_ledger_floors(rows: list[Row], ledger_floors: dict[str, dict[int, float]]) -> None:
    """Each tool-step row's ledger against the protocol's floor (see ``ledger_floor.py``)."""
    for config, floor in ledger_floors.items():
        print(
            f"ledger floor ({config}): its writes by hand (claim + synced commit, outcomes + "
            f"commit): a lone call {floor[1]:,.0f} µs, a 50-call step {floor[50]:,.0f} µs "
            f"({floor[50] / 50:,.1f} µs a call)"
        )
        for r in rows:
            calls = TOOL_STEP_CALLS.get(r.key)
            if r.config != config or calls is None or r.ledger_us is None:
                continue
            per_call = floor[calls] / calls
            best = ratio_at_floor(
                r.median_us("official"), r.median_us("ours+stock"), floor[calls], calls
            )
            print(
                f"  {r.title} ({config}): ledger {r.ledger_us:+,.0f} µs a call, "
                f"{r.ledger_us - per_call:+,.0f} µs beyond the floor; at the floor the "
                f"ratio would be {best:.2f}x (now {r.ratio:.2f}x)"
            )


def print_bytecodes(bytecodes: dict[str, dict[int, dict[str, float]]]) -> None:
    """The ledger's own Python a call, counted (``ledger_bytecodes.py``): deterministic,
    unlike the rows' times on a noisy host."""
    for config, sizes in bytecodes.items():
        parts = [
            f"{calls} call{'s' if calls > 1 else ''}: stock stack {c['stock']:,.0f}, "
            f"ours {c['ours']:,.0f}, ledger +{c['ledger']:,.0f} "
            f"({c['ledger_calls']:+.1f} Python calls)"
            for calls, c in sizes.items()
        ]
        print(f"bytecodes a tool call on the loop's thread ({config}): " + "; ".join(parts))


async def main_async(args: argparse.Namespace) -> int:
    prof = PROFILES["quick" if args.quick else "full"]
    only = set(args.only.split(","))
    configs = [c for c in args.configs.split(",") if c]
    rows: list[Row] = []
    floors: dict[str, float] = {}
    ledger_floors: dict[str, dict[int, float]] = {}
    bytecodes: dict[str, dict[int, dict[str, float]]] = {}
    storage: dict[str, dict[str, int]] = {}
    retained: dict[str, dict[str, int]] = {}
    plans = ""
    t0 = time.perf_counter()
    async with AsyncExitStack() as outer:
        tmp = tempfile.mkdtemp(prefix="idem-bench-")
        pg_base = None
        if any(c.startswith("pg") for c in configs):
            pg_base = args.dsn or os.environ.get("IDEM_SAVER_PG_DSN") or start_server(outer)
        where: dict[str, dict[str, str]] = {}
        for config in configs:
            if config == "pg-pool" and "pg" in where:
                where[config] = where["pg"]  # the pool reads the same, filled, schemas
                continue
            if config == "sqlite":
                where[config] = {lab: os.path.join(tmp, f"{lab}.db") for lab in LABELS}
            else:
                assert pg_base is not None
                where[config] = {lab: new_schema(pg_base, lab) for lab in LABELS}
            print(f"[{time.perf_counter() - t0:6.1f}s] {config} ready", file=sys.stderr)
        aged: dict[str, dict[str, str]] = {}  # the aged state's databases (plans, pool gap)
        if "reads" in only:
            states = [st for st in args.states.split(",") if st]
            for state in states:
                for config in configs:
                    if config == "pg-pool" and "pg" in configs:
                        continue  # reads the pg state's databases, right after pg
                    dbs = await prepare_state(
                        state,
                        "sqlite" if config == "sqlite" else "pg",
                        lambda tag, c=config: new_dbs(c, tag, tmp, pg_base),
                        open_savers,
                        "long",
                        prof.long_thread,
                        prof.window,
                        prof.msg_bytes,
                        args.aged_copies or prof.fill_threads,
                    )
                    if state == "aged":
                        aged[config] = dbs
                    for c in [config] + (
                        ["pg-pool"] if config == "pg" and "pg-pool" in configs else []
                    ):
                        gap = c == "pg-pool" and state == states[-1]
                        rows += await read_rows(c, dbs, prof, state, gap)
                    print(
                        f"[{time.perf_counter() - t0:6.1f}s] {config} {state} reads done",
                        file=sys.stderr,
                    )
        for config in configs:
            rows += await bench_config(config, where[config], prof, only, pg_base)
            if "sync" in only and config != "pg-pool":
                fresh = (
                    {lab: os.path.join(tmp, f"sync-{lab}.db") for lab in LABELS}
                    if config == "sqlite"
                    else {lab: new_schema(cast(str, pg_base), f"sync_{lab}") for lab in LABELS}
                )
                rows += await asyncio.to_thread(bench_sync, config, fresh, prof)
            if "storage" in only and config != "pg-pool":
                fresh = (
                    {lab: os.path.join(tmp, f"storage-{lab}.db") for lab in LABELS}
                    if config == "sqlite"
                    else {lab: new_schema(cast(str, pg_base), f"storage_{lab}") for lab in LABELS}
                )
                storage[config] = await storage_bytes(config, fresh)
                retained[config] = await retained_objects(config, fresh)
            floor_at = (
                os.path.join(tmp, "floor.db") if config == "sqlite" else where[config]["ours"]
            )
            floors[config] = await floor_us(config, floor_at)
            if "ledger" in only:
                ledger_floors[config] = await ledger_floors_us(config, tmp, pg_base, prof)
            if "bytecodes" in only:
                async with AsyncExitStack() as stack:
                    ours = (await open_savers(stack, config, where[config]))["ours"]
                    bytecodes[config] = await ledger_bytecodes(ours)
            print(f"[{time.perf_counter() - t0:6.1f}s] {config} done", file=sys.stderr)
        if args.explain and "pg" in aged:
            plans = explain_reads(aged["pg"]["ours"], "long")
    print_rows(rows, floors)
    print_ledger_floors(rows, ledger_floors)
    print_bytecodes(bytecodes)
    for config, sizes in storage.items():
        print(
            f"storage ({config}): a {STORAGE_TURNS}-turn chat, one message appended a turn: "
            f"official {sizes['official'] / 1e6:,.2f} MB, ours {sizes['ours'] / 1e6:,.2f} MB "
            f"({sizes['official'] / sizes['ours']:.1f}x smaller)"
        )
    for config, kept in retained.items():
        print(
            f"memory ({config}): objects still alive after {RETAIN_THREADS} chats of "
            f"{RETAIN_TURNS} turns ended: official {kept['official']:,}, ours {kept['ours']:,}"
        )
    if plans:
        print("\n" + plans)
    print(f"\n{prof.name} run: {time.perf_counter() - t0:.0f} s")
    if args.json:
        write_json(
            args.json,
            {
                "profile": prof.__dict__,
                "env": {**env_base(), "langgraph": package_version("langgraph")},
                "rows": [r.to_json() for r in rows],
                "floors_us": floors,
                "ledger_floors_us": ledger_floors,
                "ledger_bytecodes": bytecodes,
                "pool_gap_us": GAPS,
                "storage_bytes": storage,
                "retained_objects": retained,
                "plans": plans,
            },
        )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the < 1 minute profile")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="sqlite,pg,pg-pool")
    parser.add_argument("--only", default="aput,reads,graph,ledger,sync,delta,storage,bytecodes")
    parser.add_argument("--dsn", help="a PostgreSQL server to use (else a throwaway one)")
    parser.add_argument("--explain", action="store_true", help="print our reads' plans")
    parser.add_argument(
        "--states",
        default=",".join(STATES),
        help="database states of the read rows, in order (db_states.py): fresh,imported,aged",
    )
    parser.add_argument(
        "--aged-copies",
        type=int,
        default=None,
        help="the aged state: copies of the read thread as other threads, each as long "
        f"(default: the profile's, full {AGED_COPIES})",
    )
    parser.add_argument("--json", help="also write the numbers here")
    parser.add_argument(
        "--repeat", type=int, default=1, help="N runs, each in a fresh process (repeat.py)"
    )
    args = parser.parse_args()
    if args.repeat > 1:
        return run_repeated(__file__, sys.argv[1:], args.repeat, args.json)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
