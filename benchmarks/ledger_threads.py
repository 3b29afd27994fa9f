"""Where the SQLite ledger's time goes in a tool step, thread by thread.

``bench.py``'s ledger rows give what the ledger adds to a step (ours - ours+stock, per
call) and ``ledger_floor.py`` its writes sent by hand; this splits the ledger's share of
a step by *where* it is spent, on the clock of each thread the step uses:

* ``loop CPU``: the event loop's thread (LangGraph, ToolNode, the engine's Python: keys,
  plans, the result's msgpack and record, the wrappers, the group commit's futures);
* ``worker CPU``: aiosqlite's worker thread (SQLite's b-tree work for the claims and
  outcomes, the statements' Python bodies, the commits' own CPU);
* ``waiting``: the wall time neither thread was running on the CPU for the step - the
  fsync of the synced commits, and the wake-ups of the hand-offs between the two
  threads (and, on a loaded host, the other processes' turns);
* ``young GC`` / ``full GC``: of the loop's CPU, the garbage collector's collections of
  generations 0-1 and of generation 2. A full collection walks the whole heap (~60 ms
  here) every few dozen steps of whichever stack happens to trigger it, so it is a
  lottery between stacks sharing a process; the medians leave it out, as ``bench.py``'s
  medians do.

Each stack - ours + LangGraph's stock ``ToolNode`` (``ours+stock``) and ours +
``IdempotentToolNode`` (``ours``, the safe stack) - runs on the same saver and file, in
alternating rounds, a fresh thread per step, ``durability="sync"``; each cell is the
median per call over the rounds, and the ledger's share is ``ours`` minus ``ours+stock``.
LangGraph's own saver with the stock node (``official``) runs beside them for the ratio.

    python benchmarks/ledger_threads.py [--calls 50] [--rounds 12] [--steps 4] [--base DIR]

``--base DIR``: the package at an earlier commit as ``lis_base`` in ``DIR`` (its imports
renamed, as ``sync_sqlite_cpu.py``'s ``--base``) runs beside, as ``base+stock`` and
``base``, in the same alternating rounds: a before/after in one process, on one host state
(separate runs on a host others load move by more than a change of a few µs a call)::

    mkdir -p /tmp/base && git archive HEAD langgraph_idem_saver | tar x -C /tmp/base \\
      && mv /tmp/base/langgraph_idem_saver /tmp/base/lis_base \\
      && grep -rl langgraph_idem_saver /tmp/base/lis_base \\
         | xargs sed -i 's/langgraph_idem_saver/lis_base/g'

CPU clocks are per thread (``CLOCK_THREAD_CPUTIME_ID``), so other processes on the host
move ``waiting`` and leave the CPU columns alone: on a shared host the CPU columns are the
figures to compare, the wall clock the one a user sees.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
from contextlib import AsyncExitStack
from typing import Any

from _harness import MsgState, noop, tool_call_message, tools_graph
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSqlite
from langgraph.graph import END, START, StateGraph

from langgraph_idem_saver import AsyncSqliteSaver as OursSqlite

STACKS = {
    "official": ("official", "stock"),
    "ours+stock": ("ours", "stock"),
    "ours": ("ours", "idem"),
}
WIDTHS = (8, 9, 11, 8, 9, 15)  # of the printed columns


def worker_clock(saver: Any) -> int:
    """The CPU clock of ``saver``'s aiosqlite worker thread."""
    thread = saver.conn._thread  # aiosqlite's worker (private: a measurement only)
    assert isinstance(thread, threading.Thread) and thread.ident is not None
    return time.pthread_getcpuclockid(thread.ident)


def base_graph(kind: str, saver: Any) -> Any:
    """``tools_graph`` with ``lis_base``'s ``IdempotentToolNode`` (``kind`` ``"idem"``)."""
    if kind != "idem":
        return tools_graph(kind, saver)
    node = importlib.import_module("lis_base").IdempotentToolNode([noop])
    g = StateGraph(MsgState)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    return g.compile(checkpointer=saver)


async def measure(
    calls: int, rounds: int, steps: int, base: bool = False
) -> dict[str, dict[str, float]]:
    """Per stack, the median per call of: wall, loop CPU, worker CPU, waiting (µs)."""
    stacks = dict(STACKS)
    if base:
        stacks |= {"base+stock": ("base", "stock"), "base": ("base", "idem")}
    with tempfile.TemporaryDirectory(prefix="ledger-threads-") as tmp:
        async with AsyncExitStack() as stack:
            savers = {
                "official": await stack.enter_async_context(
                    OfficialSqlite.from_conn_string(os.path.join(tmp, "official.db"))
                ),
                "ours": await stack.enter_async_context(
                    OursSqlite.from_conn_string(os.path.join(tmp, "ours.db"))
                ),
            }
            if base:
                base_saver = importlib.import_module("lis_base").AsyncSqliteSaver
                savers["base"] = await stack.enter_async_context(
                    base_saver.from_conn_string(os.path.join(tmp, "base.db"))
                )
            for saver in savers.values():
                await saver.setup()
            graphs = {
                lab: (base_graph if s == "base" else tools_graph)(node, savers[s])
                for lab, (s, node) in stacks.items()
            }
            clocks = {lab: worker_clock(savers[s]) for lab, (s, _) in stacks.items()}
            samples: dict[str, list[tuple[float, ...]]] = {lab: [] for lab in stacks}
            collecting = [0, 0, 0]  # since: young ns, full ns (of the loop thread's collections)

            def on_gc(phase: str, info: dict[str, Any]) -> None:
                if phase == "start":
                    collecting[2] = time.thread_time_ns()
                else:
                    collecting[info["generation"] == 2] += time.thread_time_ns() - collecting[2]

            async def step(lab: str) -> tuple[float, ...]:
                tag = uuid.uuid4().hex[:8]
                inp = {"messages": [tool_call_message(calls, tag)]}
                cfg = {"configurable": {"thread_id": f"step-{tag}"}}
                clock = clocks[lab]
                collecting[:2] = [0, 0]
                wall, loop = time.perf_counter_ns(), time.thread_time_ns()
                work = time.clock_gettime_ns(clock)
                await graphs[lab].ainvoke(inp, cfg, durability="sync")
                return (
                    (time.perf_counter_ns() - wall) / 1000 / calls,
                    (time.thread_time_ns() - loop) / 1000 / calls,
                    (time.clock_gettime_ns(clock) - work) / 1000 / calls,
                    collecting[0] / 1000 / calls,
                    collecting[1] / 1000 / calls,
                )

            for lab in stacks:  # warm-up
                for _ in range(2):
                    await step(lab)
            order = list(stacks)
            gc.callbacks.append(on_gc)  # only the loop thread allocates what is collected
            try:
                for r in range(rounds):
                    for lab in order if r % 2 else reversed(order):
                        for _ in range(steps):
                            samples[lab].append(await step(lab))
            finally:
                gc.callbacks.remove(on_gc)
    out = {}
    for lab, got in samples.items():
        wall, loop, work, young, _ = (statistics.median(col) for col in zip(*got, strict=True))
        full_mean = statistics.fmean(s[4] for s in got)
        out[lab] = {
            "wall": wall, "loop": loop, "worker": work, "waiting": wall - loop - work,
            "young": young, "full": full_mean,
        }  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    args = parser.parse_args()
    if args.base:
        sys.path.insert(0, args.base)
    load = os.getloadavg()[0]
    got = asyncio.run(measure(args.calls, args.rounds, args.steps, bool(args.base)))
    print(f"a step of {args.calls} tool calls, µs a call (medians; load average {load:.1f})")
    cols = ("wall", "loop", "worker", "waiting", "young", "full")
    print(
        f"{'stack':>11} {'wall':>8} {'loop CPU':>9} {'worker CPU':>11} {'waiting':>8} "
        f"{'young GC':>9} {'full GC (mean)':>15}"
    )
    for lab, v in got.items():
        print(f"{lab:>11} " + " ".join(f"{v[k]:{w}.1f}" for k, w in zip(cols, WIDTHS, strict=True)))
    pairs = [("ledger", "ours", "ours+stock")]
    if args.base:
        pairs.append(("base ledger", "base", "base+stock"))
    for name, ledgered, stock in pairs:
        print(
            f"{name:>11} "
            + " ".join(
                f"{got[ledgered][k] - got[stock][k]:+{w}.1f}"
                for k, w in zip(cols, WIDTHS, strict=True)
            )
        )
    print(f"ratio official / ours: {got['official']['wall'] / got['ours']['wall']:.3f}")


if __name__ == "__main__":
    main()
