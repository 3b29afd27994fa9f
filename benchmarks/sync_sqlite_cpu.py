"""The sync ``SqliteSaver`` rows on the calling thread's CPU clock, interleaved in one process.

Why: ``bench.py``'s sync rows are wall-clock, and on a shared host their ratio moves by
±10-20% between runs (other processes, fsync latency). A read's cost on its own thread's
CPU clock (``time.thread_time_ns``) barely moves with that noise, and neither does the
number of bytecodes it runs, so a change of a few µs can be seen. Each round times every
stack once, in rotating order, ``--batch`` calls at a time; the medians of the rounds
are printed with their spread (the quartiles).

Stacks: LangGraph's ``SqliteSaver`` (``official``), this package's (``ours``) and, with
``--base DIR``, another copy of the package importable from ``DIR`` as ``lis_base`` (the
package at an earlier commit, its imports renamed: see ``--help``), so a before/after is
measured in one process on the same host state. Every saver gets its own file (WAL,
``synchronous=FULL``) filled with the same thread as ``bench.py``'s sync rows: a
20-message list re-versioned every second checkpoint, ``--checkpoints`` of them.

Rows: ``get_tuple`` (latest), ``list`` (``limit=10``, consumed), ``invoke`` (the 10-step
loop graph, ``durability="sync"``, a fresh thread each; also the WAL bytes it appends a
commit, from the ``-wal`` file's size), ``tool_step`` (``bench.py``'s sync step of 10
tool calls: the process's CPU clock, then the wall clock, each step in its own thread
as there), ``bytecodes`` (a call of each read, traced).
``--profile LABEL`` prints cProfile's top functions of that stack's reads.

    python benchmarks/sync_sqlite_cpu.py --rows get_tuple,list --rounds 300
    # before/after: the package at HEAD as lis_base
    mkdir -p /tmp/base && git archive HEAD langgraph_idem_saver | tar x -C /tmp/base \\
      && mv /tmp/base/langgraph_idem_saver /tmp/base/lis_base \\
      && grep -rl langgraph_idem_saver /tmp/base/lis_base \\
         | xargs sed -i 's/langgraph_idem_saver/lis_base/g'
    python benchmarks/sync_sqlite_cpu.py --base /tmp/base
"""

from __future__ import annotations

import argparse
import cProfile
import importlib
import os
import pstats
import random
import sqlite3
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack, closing
from types import FrameType
from typing import Any

from bench import Sim, loop_graph
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver

thread_ns = time.thread_time_ns
CFG = {"configurable": {"thread_id": "w", "checkpoint_ns": ""}}


def open_savers(stack: ExitStack, folder: str, base: str | None) -> dict[str, Any]:
    """label -> sync saver, each on a file of its own (as ``bench.py`` opens them)."""
    kinds: dict[str, Callable[[sqlite3.Connection], Any]] = {"official": OfficialSqliteSaver}
    ours = importlib.import_module("langgraph_idem_saver.sqlite").SqliteSaver
    kinds["ours"] = lambda conn: stack.enter_context(ours(conn))
    if base is not None:
        sys.path.insert(0, base)
        theirs = importlib.import_module("lis_base.sqlite").SqliteSaver
        kinds["base"] = lambda conn: stack.enter_context(theirs(conn))
    savers = {}
    for label, make in kinds.items():
        path = os.path.join(folder, f"{label}.db")
        conn = stack.enter_context(closing(sqlite3.connect(path, check_same_thread=False)))
        conn.execute("PRAGMA synchronous=FULL")
        saver = make(conn)
        saver.setup()
        conn.execute("PRAGMA journal_mode=WAL")  # LangGraph's saver leaves it to the user
        savers[label] = saver
    return savers


def fill(saver: Any, checkpoints: int) -> None:
    """``bench.py``'s sync ``put`` row: the list re-versioned every second checkpoint."""
    window = [Sim.payloads.ai(random.Random(i), 256) for i in range(20)]
    parent = None
    versions: dict[str, Any] = {}
    for n in range(1, checkpoints + 1):
        checkpoint = empty_checkpoint()
        changed = ["count"] if n % 2 else ["count", "messages"]
        checkpoint["channel_values"] = {"count": n, "messages": window}
        for ch in changed:
            versions[ch] = saver.get_next_version(versions.get(ch), None)
        checkpoint["channel_versions"] = dict(versions)
        new = {ch: versions[ch] for ch in changed}
        parent = saver.put(parent or CFG, checkpoint, {"source": "loop"}, new)


def row_calls(rows: list[str], savers: dict[str, Any]) -> dict[str, Callable[[str], Any]]:
    """row -> a call of that row on the stack named."""
    calls: dict[str, Callable[[str], Any]] = {
        "get_tuple": lambda lab: savers[lab].get_tuple(CFG),
        "list": lambda lab: list(savers[lab].list(CFG, limit=10)),
    }
    if "invoke" in rows:
        graphs = {lab: loop_graph(10).compile(checkpointer=s) for lab, s in savers.items()}

        def invoke(lab: str) -> None:
            thread = {"configurable": {"thread_id": f"g-{uuid.uuid4().hex}"}}
            out = graphs[lab].invoke({"count": 0, "log": []}, thread, durability="sync")
            assert out["count"] == 10

        calls["invoke"] = invoke
    if "tool_step" in rows:
        calls["tool_step"] = tool_step_calls(savers)
    return {row: calls[row] for row in rows if row in calls}


def tool_step_calls(savers: dict[str, Any]) -> Callable[[str], Any]:
    """``bench.py``'s sync 10-call tool step: LangGraph's saver + stock ``ToolNode``
    against each package's saver + its ``IdempotentToolNode``, run from a thread
    without an event loop (one worker, as ``bench.py``)."""
    from concurrent.futures import ThreadPoolExecutor

    from _harness import tool_call_message
    from bench import MsgStateSync
    from langchain_core.tools import tool
    from langgraph.graph import END, START, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool("noop")
    def noop_sync(i: int) -> str:
        """Do nothing (a side-effecting tool as far as the ledger knows)."""
        return "ok"

    def graph(lab: str, saver: Any) -> Any:
        if lab == "official":
            node: Any = ToolNode([noop_sync])
        else:
            package = "langgraph_idem_saver" if lab == "ours" else "lis_base"
            node = importlib.import_module(package).IdempotentToolNode([noop_sync])
        g = StateGraph(MsgStateSync)
        g.add_node("tools", node)
        g.add_edge(START, "tools")
        g.add_edge("tools", END)
        return g.compile(checkpointer=saver)

    graphs = {lab: graph(lab, s) for lab, s in savers.items()}
    no_loop = ThreadPoolExecutor(1)

    def step(lab: str) -> None:
        tag = uuid.uuid4().hex[:10]
        inp = {"messages": [tool_call_message(10, tag)]}
        config = {"configurable": {"thread_id": f"s-{tag}"}}
        no_loop.submit(graphs[lab].invoke, inp, config).result()

    return step


def timed(
    call: Callable[[str], Any], labels: list[str], rounds: int, batch: int, clock: Any = thread_ns
) -> dict[str, list[float]]:
    """label -> per-call µs of each round on ``clock`` (rounds interleaved, order
    rotating)."""
    for lab in labels:  # warm: imports, caches, statements
        for _ in range(max(3, batch)):
            call(lab)
    out: dict[str, list[float]] = {lab: [] for lab in labels}
    for r in range(rounds):
        order = labels[r % len(labels) :] + labels[: r % len(labels)]
        if r % 2:
            order.reverse()
        for lab in order:
            t0 = clock()
            for _ in range(batch):
                call(lab)
            out[lab].append((clock() - t0) / batch / 1000)
    return out


def wal_per_commit(saver: Any, call: Callable[[], Any], commits: int, n: int = 20) -> float:
    """WAL bytes appended per commit by ``call`` (median of ``n``; runs the WAL
    checkpointer first so the file only grows)."""
    path = saver.conn.execute("PRAGMA database_list").fetchone()[2] + "-wal"
    grown = []
    for _ in range(n):
        saver.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        before = os.path.getsize(path) if os.path.exists(path) else 0
        call()
        grown.append((os.path.getsize(path) - before) / commits)
    return statistics.median(grown)


def bytecodes(call: Callable[[], Any], n: int = 5) -> float:
    """Bytecodes a call of ``call`` runs on this thread (``sys.settrace``)."""
    count = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "opcode":
            count += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        return local

    call()
    sys.settrace(tracer)
    try:
        for _ in range(n):
            call()
    finally:
        sys.settrace(None)
    return count / n


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", default="get_tuple,list,invoke,bytecodes")
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--checkpoints", type=int, default=300)
    p.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    p.add_argument("--profile", help="a stack label: cProfile of its reads")
    args = p.parse_args()
    rows = args.rows.split(",")
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        savers = open_savers(stack, folder, args.base)
        for saver in savers.values():
            fill(saver, args.checkpoints)
        labels = list(savers)
        calls = row_calls(rows, savers)
        print(f"load average {os.getloadavg()[0]:.1f}; CPU µs a call (median, quartiles)")
        for row, call in calls.items():
            heavy = row in ("invoke", "tool_step")
            rounds = max(10, args.rounds // 20) if heavy else args.rounds
            batch = 1 if heavy else args.batch
            # the tool step runs in several threads: the process's CPU, and the wall
            clocks = {"": thread_ns}
            if row == "tool_step":
                clocks = {" (process CPU)": time.process_time_ns, " (wall)": time.perf_counter_ns}
            for what, clock in clocks.items():
                got = timed(call, labels, rounds, batch, clock)
                med = {lab: statistics.median(v) for lab, v in got.items()}
                for lab, v in got.items():
                    q = statistics.quantiles(v, n=4)
                    ratio = med["official"] / med[lab]
                    print(
                        f"{row + what:24} {lab:9} {med[lab]:9.1f} ({q[0]:.1f}-{q[2]:.1f})"
                        f"  {ratio:.3f}x"
                    )
        if "invoke" in calls:
            for lab, saver in savers.items():
                wal = wal_per_commit(saver, lambda lab=lab: calls["invoke"](lab), 23, 10)
                print(f"invoke WAL {lab:9} {wal / 1024:.1f} KB a commit ({wal / 4096:.2f} pages)")
        if "bytecodes" in rows:
            for row in ("get_tuple", "list"):
                for lab in labels:
                    fn = row_calls([row], savers)[row]
                    print(f"bytecodes {row:10} {lab:9} {bytecodes(lambda f=fn, la=lab: f(la)):.0f}")
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(300):
                calls.get("get_tuple", lambda lab: None)(args.profile)
            prof.disable()
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)


if __name__ == "__main__":
    main()
