#!/usr/bin/env python
"""Side-by-side benchmark of the tool-call ledger: what ``IdempotentToolNode`` costs.

Two sections, one process, fresh temporary SQLite files, interleaved rounds:

1. **Per-call ledger overhead.** A minimal ``StateGraph`` (START -> tools -> END) whose
   only node is a ``ToolNode`` or an ``IdempotentToolNode`` wrapping an async no-op
   tool, invoked with an ``AIMessage`` carrying 1 or 3 parallel tool calls, on OUR
   ``AsyncSqliteSaver``, ``durability="sync"``. Reported per tool call.
2. **Full ReAct loop.** ``create_react_agent`` driven by a scripted model
   (``langgraph_idem_saver.demo.ScriptedModel``: asks for N calls, then answers), N
   turns per thread. "official" = LangGraph's ``langgraph.checkpoint.sqlite.aio.
   AsyncSqliteSaver`` + stock ``ToolNode``; "safe" = our saver + ``IdempotentToolNode``.
   A third, diagnostic column "ours+stock" (our saver + stock ``ToolNode``) splits the
   difference into "saver" and "ledger" parts. Target: safe >= 1.0x official.

After the timed rows, an untimed pass counts per turn the saver calls and the aiosqlite
worker-thread hand-offs of each stack (``--no-counts`` skips it).

Usage::

    python benchmarks/bench_ledger.py            # full run (~2-3 min)
    python benchmarks/bench_ledger.py --quick    # smoke run (< 30 s)
    python benchmarks/bench_ledger.py --json results.json

See benchmarks/README.md ("bench_ledger.py") for what each row means.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import sqlite3
import statistics
import sys
import time
import traceback
import warnings
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any

from _harness import (
    bench_tmpdir,
    env_base,
    fmt_us,
    interleaved,
    load_average_checked,
    load_summary,
    package_version,
    perf_ns,
    print_targets,
    spread,
    stepper,
    write_json,
)
from _harness import summarize as _summarize
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.prebuilt import ToolNode
from typing_extensions import TypedDict

from langgraph_idem_saver import AsyncSqliteSaver as OurSaver
from langgraph_idem_saver import IdempotencyMiddleware, IdempotentToolNode
from langgraph_idem_saver.demo import ScriptedModel

# create_react_agent moved to langchain.agents in LangGraph 1.0 and warns on every call
warnings.filterwarnings("ignore", message=".*create_react_agent has been moved.*")
from langgraph.prebuilt import create_react_agent  # noqa: E402

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass
class Profile:
    name: str
    # section 1: one graph invocation = one sample
    node_warmup: int
    node_rounds: int
    node_per_round: int
    # section 2: one thread of `turns` turns = one sample
    turns: int
    react_warmup: int
    react_rounds: int
    # wall-clock cap per row (all columns together), seconds; at least 2 rounds run
    node_budget_s: float
    react_budget_s: float


FULL = Profile(
    name="full",
    node_warmup=10,
    node_rounds=20,
    node_per_round=10,
    turns=20,
    react_warmup=1,
    react_rounds=10,
    node_budget_s=10.0,
    react_budget_s=22.0,
)

QUICK = Profile(
    name="quick",
    node_warmup=3,
    node_rounds=6,
    node_per_round=5,
    turns=8,
    react_warmup=1,
    react_rounds=3,
    node_budget_s=2.5,
    react_budget_s=3.5,
)

# (calls per turn, durability, create_react_agent version - or "agent": LangChain 1.x
# create_agent, where the safe stack adds IdempotencyMiddleware instead of the node)
REACT_ROWS: list[tuple[int, str, str]] = [
    (1, "sync", "v2"),
    (3, "sync", "v2"),
    (1, "async", "v2"),
    (3, "async", "v2"),
    (3, "sync", "v1"),
    (1, "sync", "agent"),
    (3, "sync", "agent"),
    (3, "async", "agent"),
]

SYNCHRONOUS_OVERRIDE: str | None = None  # diagnostic: --synchronous
PRAGMAS: dict[str, dict] = {}


# --------------------------------------------------------------------------------------
# Workload pieces
# --------------------------------------------------------------------------------------


@tool
async def noop(i: int) -> str:
    """Do nothing (a side-effecting tool as far as the ledger knows)."""
    return "ok"


class MsgState(TypedDict):
    messages: Annotated[list, add_messages]


def build_tools_graph(node: ToolNode) -> Any:
    g = StateGraph(MsgState)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    return g


def tool_call_message(n: int, tag: str) -> AIMessage:
    return AIMessage(
        content="",
        id=f"ai-{tag}",
        tool_calls=[
            {"name": "noop", "args": {"i": i}, "id": f"call_{tag}_{i}", "type": "tool_call"}
            for i in range(n)
        ],
    )


def make_node(kind: str) -> ToolNode:
    return IdempotentToolNode([noop]) if kind == "idem" else ToolNode([noop])


def make_agent(kind: str, calls: int, saver: Any, version: str) -> Any:
    """The ReAct agent of a stack: ``create_react_agent`` with the stack's tool node, or
    ``create_agent`` with (safe) or without (stock) ``IdempotencyMiddleware``."""
    if version == "agent":
        middleware = [IdempotencyMiddleware()] if kind == "idem" else []
        return create_agent(
            make_model(calls), tools=[noop], middleware=middleware, checkpointer=saver
        )
    return create_react_agent(
        make_model(calls), make_node(kind), checkpointer=saver, version=version
    )


def make_model(calls: int) -> ScriptedModel:
    return ScriptedModel(tool_name="noop", calls=[{"i": i} for i in range(calls)])


# (saver class, tool node kind) per stack of section 2
STACKS: dict[str, tuple[type, str]] = {
    "official": (OfficialSaver, "stock"),
    "ours+stock": (OurSaver, "stock"),
    "safe": (OurSaver, "idem"),
}


class Opened:
    """A saver opened on a fresh temp file through its own ``from_conn_string``."""

    def __init__(self, label: str, cls: type, tmp: str, tag: str) -> None:
        self.label = label
        self.cls = cls
        self.path = os.path.join(tmp, f"{label.replace('+', '_')}-{tag}.sqlite")
        self._cm: Any = None
        self.saver: Any = None

    async def __aenter__(self) -> Opened:
        self._cm = self.cls.from_conn_string(self.path)
        self.saver = await self._cm.__aenter__()
        await self.saver.setup()
        if SYNCHRONOUS_OVERRIDE:
            await self.saver.conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS_OVERRIDE}")
        key = self.cls.__module__
        if key not in PRAGMAS:
            PRAGMAS[key] = await conn_pragmas(self.saver.conn)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._cm.__aexit__(*exc)


async def conn_pragmas(conn: Any) -> dict:
    out = {}
    for name in ("journal_mode", "synchronous"):
        async with conn.execute(f"PRAGMA {name}") as cur:
            row = await cur.fetchone()
        out[name] = row[0] if row else None
    return out


# --------------------------------------------------------------------------------------
# Measurement helpers
# --------------------------------------------------------------------------------------


def summarize(samples_ns: list[int], scale: float = 1.0) -> dict:
    """Median and [p10, p90] in µs, each sample divided by ``scale`` first."""
    return _summarize(samples_ns, scale, with_mean=False)


@dataclass
class Row:
    key: str
    section: str
    title: str
    cols: dict[str, dict]  # label -> summary (µs)
    base: str  # the reference column
    test: str  # the column the ratio is about
    extra: dict = field(default_factory=dict)

    def med(self, col: str) -> float:
        return self.cols[col]["median_us"]

    @property
    def ratio(self) -> float:
        """base / test: > 1 means the test column is faster."""
        return self.med(self.base) / self.med(self.test)


# --------------------------------------------------------------------------------------
# Section 1: per-call ledger overhead (our saver in both columns)
# --------------------------------------------------------------------------------------


async def bench_node(tmp: str, prof: Profile, calls: int) -> Row:
    labels = ["stock", "idem"]
    opened = {lab: Opened(f"node{calls}-{lab}", OurSaver, tmp, "node") for lab in labels}
    for o in opened.values():
        await o.__aenter__()
    try:
        graphs = {
            lab: build_tools_graph(make_node(lab)).compile(checkpointer=o.saver)
            for lab, o in opened.items()
        }
        n = dict.fromkeys(labels, 0)

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            n[lab] += 1
            tag = f"{lab}-{n[lab]}"
            cfg = {"configurable": {"thread_id": f"node-{tag}"}}
            inp = {"messages": [tool_call_message(calls, tag)]}

            async def run() -> None:
                out = await graphs[lab].ainvoke(inp, cfg, durability="sync")
                assert len(out["messages"]) == 1 + calls, out

            return run

        samples = await interleaved(
            labels,
            prepare,
            prof.node_warmup,
            prof.node_rounds,
            prof.node_per_round,
            prof.node_budget_s,
        )
    finally:
        for o in opened.values():
            await o.__aexit__(None, None, None)
    cols = {lab: summarize(samples[lab], scale=calls) for lab in labels}
    invoke = {lab: summarize(samples[lab]) for lab in labels}
    return Row(
        f"node_{calls}",
        "node",
        f"tools node, {calls} parallel call{'s' if calls > 1 else ''} / invoke (per call)",
        cols,
        base="stock",
        test="idem",
        extra={"per_invoke": invoke, "calls": calls},
    )


# --------------------------------------------------------------------------------------
# Section 2: ReAct loop
# --------------------------------------------------------------------------------------


async def run_thread(agent: Any, thread_id: str, turns: int, calls: int, durability: str) -> None:
    cfg = {"configurable": {"thread_id": thread_id}}
    out: Any = None
    for t in range(turns):
        out = await agent.ainvoke(
            {"messages": [HumanMessage(f"turn {t}: do the {calls} things")]},
            cfg,
            durability=durability,
        )
    # human, AI(tool calls), `calls` ToolMessages, AI(answer) per turn
    assert len(out["messages"]) == turns * (3 + calls), len(out["messages"])


async def bench_react(
    tmp: str, prof: Profile, calls: int, durability: str, version: str, stacks: list[str]
) -> Row:
    tag = f"react{calls}{durability}{version}"
    opened = {lab: Opened(lab, STACKS[lab][0], tmp, tag) for lab in stacks}
    for o in opened.values():
        await o.__aenter__()
    try:
        agents = {
            lab: make_agent(STACKS[lab][1], calls, o.saver, version)
            for lab, o in opened.items()
        }
        n = dict.fromkeys(stacks, 0)

        def prepare(lab: str) -> Callable[[], Awaitable[Any]]:
            n[lab] += 1
            tid = f"{tag}-{n[lab]}"
            return lambda: run_thread(agents[lab], tid, prof.turns, calls, durability)

        samples = await interleaved(
            stacks, prepare, prof.react_warmup, prof.react_rounds, 1, prof.react_budget_s
        )
    finally:
        for o in opened.values():
            await o.__aexit__(None, None, None)
    cols = {lab: summarize(samples[lab], scale=prof.turns) for lab in stacks}
    return Row(
        f"react_{calls}_{durability}_{version}",
        "react",
        f"{'create_agent' if version == 'agent' else 'ReAct'} {calls} call"
        f"{'s' if calls > 1 else ''}/turn, durability={durability}"
        f"{'' if version in ('v2', 'agent') else ', version=v1'} (per turn)",
        cols,
        base="official",
        test="safe",
        extra={
            "calls": calls,
            "durability": durability,
            "version": version,
            "turns_per_thread": prof.turns,
        },
    )


# --------------------------------------------------------------------------------------
# Untimed diagnostic: saver calls and aiosqlite hand-offs per turn
# --------------------------------------------------------------------------------------

COUNTED = (
    "aput",
    "aput_writes",
    "aget_tuple",
    "aclaim",
    "afinish",
    "alist_entries",
    "anote_replay",
    "aget_entry",
    "aadopt",
    "arelease",
)


def instrument(saver: Any, counts: collections.Counter) -> None:
    conn = saver.conn
    orig_execute = conn._execute

    async def execute(fn: Any, *a: Any, **k: Any) -> Any:
        counts["hand-offs"] += 1
        return await orig_execute(fn, *a, **k)

    conn._execute = execute
    for name in COUNTED:
        orig = getattr(saver, name, None)
        if orig is None:
            continue

        def wrap(orig: Any = orig, name: str = name) -> Any:
            async def counted(*a: Any, **k: Any) -> Any:
                counts[name] += 1
                return await orig(*a, **k)

            return counted

        setattr(saver, name, wrap())


async def count_react(tmp: str, turns: int, calls: int, version: str) -> dict[str, dict]:
    out = {}
    for lab, (cls, kind) in STACKS.items():
        counts: collections.Counter = collections.Counter()
        async with Opened(lab, cls, tmp, f"count{calls}{version}") as o:
            instrument(o.saver, counts)
            agent = create_react_agent(
                make_model(calls), make_node(kind), checkpointer=o.saver, version=version
            )
            await run_thread(agent, "count", turns, calls, "sync")
        out[lab] = {k: round(v / turns, 2) for k, v in sorted(counts.items())}
    return out


# --------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------


def print_node_rows(rows: list[Row]) -> None:
    if not rows:
        return
    print("\n1. Per-call ledger overhead: our AsyncSqliteSaver in both columns, durability=sync")
    print("   median per tool call (= invoke time / calls); [p10–p90]; ratio = stock / idem")
    w = max(len(r.title) for r in rows)
    hdr = (
        f"{'benchmark':<{w}}  {'ToolNode':>9} {'':>15}  {'Idempotent':>10} {'':>15}  "
        f"{'overhead':>10}  {'ratio':>6}"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        s, i = r.cols["stock"], r.cols["idem"]
        print(
            f"{r.title:<{w}}  {fmt_us(s['median_us']):>9} {spread(s):>15}  "
            f"{fmt_us(i['median_us']):>10} {spread(i):>15}  "
            f"{'+' + fmt_us(i['median_us'] - s['median_us']):>10}  {r.ratio:>5.2f}x"
        )


def print_react_rows(rows: list[Row], stacks: list[str]) -> None:
    if not rows:
        return
    print(
        "\n2. ReAct loop (create_react_agent + ScriptedModel), median per turn; [p10–p90];\n"
        "   speedup = official / safe (>= 1.0: the safe stack is at least as fast)"
    )
    w = max(len(r.title) for r in rows)
    hdr = f"{'benchmark':<{w}}" + "".join(f"  {lab:>10} {'':>15}" for lab in stacks)
    hdr += f"  {'speedup':>8}"
    if "ours+stock" in stacks:
        hdr += f"  {'saver':>6} {'ledger':>6}"
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        line = f"{r.title:<{w}}"
        for lab in stacks:
            d = r.cols[lab]
            line += f"  {fmt_us(d['median_us']):>10} {spread(d):>15}"
        line += f"  {r.ratio:>7.2f}x"
        if "ours+stock" in stacks:
            line += (
                f"  {r.med('official') / r.med('ours+stock'):>5.2f}x"
                f" {r.med('ours+stock') / r.med('safe'):>5.2f}x"
            )
        print(line)
    if "ours+stock" in stacks:
        print(
            "   saver = official / ours+stock (our saver alone, stock ToolNode); "
            "ledger = ours+stock / safe\n   (what IdempotentToolNode costs); "
            "speedup = saver x ledger"
        )


def env_info() -> dict:
    return {
        **env_base(),
        "sqlite": sqlite3.sqlite_version,
        **{
            p: package_version(p)
            for p in (
                "langgraph",
                "langgraph-prebuilt",
                "langgraph-checkpoint",
                "langgraph-checkpoint-sqlite",
                "langchain-core",
                "aiosqlite",
                "langgraph-idem-saver",
            )
        },
    }


def fsync_floor_us(tmp: str, n: int = 50) -> float:
    """Median cost of a bare 4 KB write + fsync in ``tmp`` (the floor under each commit)."""
    path = os.path.join(tmp, "fsync-probe")
    fd = os.open(path, os.O_CREAT | os.O_WRONLY)
    ts = []
    try:
        for _ in range(n):
            os.write(fd, b"x" * 4096)
            t0 = perf_ns()
            os.fsync(fd)
            ts.append(perf_ns() - t0)
    finally:
        os.close(fd)
        os.remove(path)
    return statistics.median(ts) / 1000.0


async def main_async(args: argparse.Namespace) -> int:
    prof = QUICK if args.quick else FULL
    if args.turns:
        prof.turns = args.turns
    global SYNCHRONOUS_OVERRIDE
    SYNCHRONOUS_OVERRIDE = args.synchronous
    stacks = ["official", "safe"] if args.no_diag else ["official", "ours+stock", "safe"]
    react_rows = REACT_ROWS
    only = set(args.only.split(",")) if args.only else {"node", "react", "counts"}
    if args.no_counts:
        only.discard("counts")
    load_before = load_average_checked()
    t_start = time.perf_counter()
    rows: list[Row] = []
    counts: dict[str, Any] = {}
    errors: list[str] = []
    step = stepper(t_start)
    with bench_tmpdir("bench_ledger_", args.tmpdir, args.keep) as tmp:
        fsync_before = fsync_floor_us(tmp)
        try:
            if "node" in only:
                for calls in (1, 3):
                    step(f"tools node, {calls} call(s)")
                    rows.append(await bench_node(tmp, prof, calls))
            if "react" in only:
                for calls, durability, version in react_rows:
                    step(f"ReAct {calls} call(s)/turn, {durability}, {version}")
                    try:
                        rows.append(
                            await bench_react(tmp, prof, calls, durability, version, stacks)
                        )
                    except Exception as exc:  # a failure is a finding: report it, keep going
                        traceback.print_exc()
                        errors.append(f"ReAct {calls}/{durability}/{version}: {exc!r}")
            if "counts" in only:
                step("counting saver calls / hand-offs (untimed)")
                for calls, version in ((1, "v2"), (3, "v2"), (3, "v1")):
                    counts[f"{calls} call(s)/turn, {version}"] = await count_react(
                        tmp, min(prof.turns, 10), calls, version
                    )
        finally:
            fsync_after = fsync_floor_us(tmp)
    elapsed = time.perf_counter() - t_start
    load_after = os.getloadavg()

    node_rows = [r for r in rows if r.section == "node"]
    rrows = [r for r in rows if r.section == "react"]
    print_node_rows(node_rows)
    print_react_rows(rrows, stacks)
    if counts:
        print("\nper turn, sync (untimed pass): saver calls and aiosqlite worker hand-offs")
        for what, by_stack in counts.items():
            print(f"  {what}:")
            for lab, c in by_stack.items():
                print(f"    {lab:<11} " + ", ".join(f"{k} {v:g}" for k, v in c.items()))

    targets = [
        {
            "target": f"safe >= 1.0x official: {r.title}",
            "value": f"{r.ratio:.2f}x",
            "met": r.ratio >= 1.0,
        }
        for r in rrows
    ]
    print(f"\nconnection pragmas: {PRAGMAS}")
    print(
        f"bare fsync (4 KB) in the temp dir: {fsync_before:,.0f} µs before, "
        f"{fsync_after:,.0f} µs after (a floor under every commit)"
    )
    for e in errors:
        print(f"ERROR (row skipped): {e}")
    if targets:
        print_targets(targets)
    print(load_summary(elapsed, prof.name, load_before, load_after))

    if args.json:
        payload = {
            "profile": prof.__dict__,
            "env": env_info(),
            "elapsed_s": elapsed,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "fsync_us": {"before": fsync_before, "after": fsync_after},
            "pragmas": PRAGMAS,
            "synchronous_override": SYNCHRONOUS_OVERRIDE,
            "rows": [
                {
                    "key": r.key,
                    "section": r.section,
                    "title": r.title,
                    "columns": r.cols,
                    "ratio": {"value": r.ratio, "definition": f"{r.base} / {r.test}"},
                    **({"extra": r.extra} if r.extra else {}),
                }
                for r in rows
            ],
            "counts_per_turn": counts,
            "targets": targets,
            "errors": errors,
        }
        write_json(args.json, payload)
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run, < 30 s")
    ap.add_argument("--json", metavar="PATH", help="write results as JSON")
    ap.add_argument("--only", help="comma-separated subset of node,react,counts")
    ap.add_argument("--turns", type=int, help="turns per ReAct thread (default 20, quick 6)")
    ap.add_argument("--no-diag", action="store_true", help="drop the diagnostic ours+stock column")
    ap.add_argument("--no-counts", action="store_true", help="skip the untimed counting pass")
    ap.add_argument(
        "--synchronous",
        choices=("NORMAL", "OFF", "FULL"),
        help="diagnostic: force this PRAGMA synchronous on EVERY connection after setup, "
        "to see the CPU side without the fsync floor (default: each saver's own, FULL)",
    )
    ap.add_argument("--tmpdir", help="where to create the temp files (default: system temp)")
    ap.add_argument("--keep", action="store_true", help="keep the temp databases")
    args = ap.parse_args()
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
