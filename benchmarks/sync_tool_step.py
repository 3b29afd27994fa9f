"""The sync 10-call tool step (``bench.py``'s ``sync_tool_step_10``), taken apart per step.

Why: on a host shared with other work the row's wall clock moves ±10-20% between runs,
while what a step *does* - its statements, its commits, its CPU - does not. For each
stack this counts, per step: the statements sent by kind and the commits (SQLite: the
``COMMIT``s of the connection, seen by ``sqlite3``'s trace callback, and the synced
ones among them; Postgres: the write statements sent under autocommit, each its own
commit and WAL flush, seen at psycopg's cursor), the process's CPU clock (every thread
of it: the node's, the tools', the ledger's loop), the Postgres server process's CPU
(``/proc`` of the connection's backend) and the wall clock. Stacks run in rotating
order, ``--batch`` steps at a time, in one process.

Stacks: LangGraph's saver + stock ``ToolNode`` (``official``), this package's sync
saver + ``IdempotentToolNode`` (``ours``) and, with ``--base DIR``, another copy of the
package importable from ``DIR`` as ``lis_base`` (``base``: the package before a change,
its imports renamed), so a before/after is measured in one process on one host state:

    rm -rf /tmp/base && mkdir -p /tmp/base && git archive HEAD langgraph_idem_saver \\
      | tar x -C /tmp/base && mv /tmp/base/langgraph_idem_saver /tmp/base/lis_base \\
      && grep -rl langgraph_idem_saver /tmp/base/lis_base \\
         | xargs sed -i 's/langgraph_idem_saver/lis_base/g'
    python benchmarks/sync_tool_step.py --backends sqlite,pg --base /tmp/base
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import sqlite3
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing, contextmanager
from typing import Any

import psycopg
from _harness import tool_call_message
from bench import POOL_KWARGS, MsgStateSync
from langchain_core.tools import tool
from langgraph.graph import END, START, StateGraph
from langgraph.prebuilt import ToolNode

CALLS = 10

# statement kinds, by the statement's opening words
KINDS = [
    ("claim", re.compile(r"WITH u AS|idem_claim", re.I)),
    ("outcome", re.compile(r"idem_finish|UPDATE idem_tool_calls (AS \w+ )?SET status", re.I)),
    (
        "checkpoint",
        re.compile(
            r"INSERT (OR REPLACE )?INTO (idem_)?checkpoints|INTO (idem_|checkpoint_)blobs|"
            r"WITH new_blobs|"
            r"WITH new_rows|idem_put",
            re.I,
        ),
    ),
    ("writes", re.compile(r"INSERT (OR \w+ )?INTO (idem_)?(checkpoint_)?writes", re.I)),
    ("ledger other", re.compile(r"idem_tool_calls", re.I)),
    ("commit", re.compile(r"^\s*COMMIT", re.I)),
    ("begin", re.compile(r"^\s*BEGIN", re.I)),
    ("pragma", re.compile(r"^\s*PRAGMA", re.I)),
    ("read", re.compile(r"^\s*(SELECT|WITH)", re.I)),
]
WRITES = ("claim", "outcome", "checkpoint", "writes", "ledger other")


def kind_of(text: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(text):
            return kind
    return "other"


class Tally:
    """Statements per stack label, counted only while ``on`` (a counting pass: a Python
    callback inside each SQLite statement takes the GIL back mid-statement, which
    inflates the CPU clocks of every thread several-fold, so the timed rounds run
    without it: on SQLite the callback is removed, on Postgres the wrapper only checks
    ``on``)."""

    def __init__(self) -> None:
        self.counts: dict[str, Counter[str]] = defaultdict(Counter)
        self.lock = threading.Lock()
        self.owner: dict[int, str] = {}  # id(connection) -> label
        self.on = False
        self.sqlite: dict[str, tuple[sqlite3.Connection, Callable[[str], None]]] = {}

    def add(self, label: str | None, kind: str) -> None:
        if label is not None:
            with self.lock:
                self.counts[label][kind] += 1

    def counting(self, on: bool) -> None:
        self.on = on
        for conn, seen in self.sqlite.values():
            conn.set_trace_callback(seen if on else None)


TALLY = Tally()


def trace_psycopg() -> None:
    """Every sync cursor's statements counted for the stack whose connection runs them.
    Commits that write (each a WAL flush under ``synchronous_commit``): a write sent
    under autocommit outside a block, and each outermost transaction or pipeline block
    (a pipeline's statements under autocommit commit together, at its sync) that
    wrote."""
    blocks: dict[int, list[int]] = {}  # id(connection) -> [depth, writes inside]
    for name in ("execute", "executemany"):
        real = getattr(psycopg.Cursor, name)

        def traced(self: Any, query: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
            if not TALLY.on:
                return _real(self, query, *args, **kwargs)
            label = TALLY.owner.get(id(self.connection))
            text = query if isinstance(query, str) else str(getattr(query, "_obj", query))
            kind = kind_of(text)
            TALLY.add(label, kind)
            if kind in WRITES:
                block = blocks.get(id(self.connection))
                if block is not None and block[0]:
                    block[1] += 1
                elif self.connection.autocommit:
                    TALLY.add(label, "commits")
            return _real(self, query, *args, **kwargs)

        setattr(psycopg.Cursor, name, traced)

    def counted(real: Any) -> Any:
        @contextmanager
        def block(self: Any, *args: Any, **kwargs: Any) -> Iterator[Any]:
            state = blocks.setdefault(id(self), [0, 0])
            state[0] += 1
            try:
                with real(self, *args, **kwargs) as inner:
                    yield inner
            finally:
                state[0] -= 1
                if not state[0]:
                    if state[1] and TALLY.on:
                        TALLY.add(TALLY.owner.get(id(self)), "commits")
                    state[1] = 0

        return block

    psycopg.Connection.transaction = counted(psycopg.Connection.transaction)  # type: ignore[method-assign]
    psycopg.Connection.pipeline = counted(psycopg.Connection.pipeline)  # type: ignore[method-assign]


def trace_sqlite(conn: sqlite3.Connection, label: str) -> None:
    """``conn``'s statements counted for ``label``; a ``COMMIT`` under
    ``synchronous=FULL`` (the last ``PRAGMA synchronous`` seen) is a synced one."""
    state = {"sync": "FULL"}

    def seen(text: str) -> None:
        kind = kind_of(text)
        TALLY.add(label, kind)
        m = re.match(r"\s*PRAGMA synchronous\s*=\s*(\w+)", text, re.I)
        if m:
            state["sync"] = m.group(1).upper()
        if kind == "commit":
            TALLY.add(label, "commits")
            if state["sync"] in ("FULL", "EXTRA", "2", "3"):
                TALLY.add(label, "synced commits")

    TALLY.sqlite[label] = (conn, seen)


def noop_tool() -> Any:
    @tool("noop")
    def noop_sync(i: int) -> str:
        """Do nothing (a side-effecting tool as far as the ledger knows)."""
        return "ok"

    return noop_sync


def graph_of(label: str, saver: Any) -> Any:
    if label == "official":
        node: Any = ToolNode([noop_tool()])
    else:
        package = "langgraph_idem_saver" if label == "ours" else "lis_base"
        node = importlib.import_module(package).IdempotentToolNode([noop_tool()])
    g = StateGraph(MsgStateSync)
    g.add_node("tools", node)
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    return g.compile(checkpointer=saver)


def open_stacks(
    stack: ExitStack, backend: str, labels: list[str], where: Callable[[str], str]
) -> dict[str, tuple[Any, int | None]]:
    """label -> (saver, the Postgres backend's pid or None), as ``bench.py`` opens them."""
    out: dict[str, tuple[Any, int | None]] = {}
    for label in labels:
        package = {"ours": "langgraph_idem_saver", "base": "lis_base"}.get(label)
        if backend == "sqlite":
            conn: Any = stack.enter_context(
                closing(sqlite3.connect(where(label), check_same_thread=False))
            )
            conn.execute("PRAGMA synchronous=FULL")
            if package is None:
                from langgraph.checkpoint.sqlite import SqliteSaver

                saver = SqliteSaver(conn)
            else:
                cls = importlib.import_module(f"{package}.sqlite").SqliteSaver
                saver = stack.enter_context(cls(conn))
            saver.setup()
            trace_sqlite(conn, label)
            out[label] = (saver, None)
        else:
            conn = stack.enter_context(psycopg.Connection.connect(where(label), **POOL_KWARGS))
            if package is None:
                from langgraph.checkpoint.postgres import PostgresSaver

                saver = PostgresSaver(conn)
            else:
                cls = importlib.import_module(f"{package}.postgres").PostgresSaver
                saver = stack.enter_context(cls(conn))
            saver.setup()
            TALLY.owner[id(conn)] = label
            out[label] = (saver, conn.info.backend_pid)
    return out


class Waits:
    """How long each outcome row waited between its call's return (``hand``) and the
    start of its write (the ``StepWrites.send`` that carried it), per package; counted
    in the counting pass only. This is the time the step's batching adds to a call's
    "returned, outcome not committed" window (the write's own commit comes after)."""

    def __init__(self) -> None:
        self.on = False
        self.handed: dict[int, float] = {}  # id(plan) -> when handed
        self.waits: dict[str, list[float]] = defaultdict(list)
        self.writes: Counter[str] = Counter()

    def install(self, label: str, package: str) -> None:
        sync = importlib.import_module(f"{package}.sync_step_writes").SyncStepWrites
        steps = importlib.import_module(f"{package}.engine.step_writes").StepWrites
        real_hand, real_send = sync.hand, steps.send

        def hand(writes: Any, plan: Any, result: Any) -> bool:
            if self.on:
                self.handed[id(plan)] = time.perf_counter()
            taken: bool = real_hand(writes, plan, result)
            return taken

        def send(writes: Any) -> None:
            if self.on and writes.plans:
                now = time.perf_counter()
                self.writes[label] += 1
                for plan in writes.plans:
                    at = self.handed.pop(id(plan), None)
                    if at is not None:
                        self.waits[label].append((now - at) * 1e3)
            real_send(writes)

        sync.hand = hand
        steps.send = send


WAITS = Waits()


def server_cpu(pid: int | None) -> float:
    """CPU seconds of a local server process (its scheduler's clock, ns), 0 when unknown."""
    if pid is None:
        return 0.0
    with open(f"/proc/{pid}/schedstat") as f:
        return int(f.read().split()[0]) / 1e9


def measure(
    backend: str, labels: list[str], rounds: int, batch: int, counted: int, dsn: str | None
) -> None:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="idem-tool-step"))
        if backend == "sqlite":

            def where(label: str) -> str:
                return os.path.join(folder, f"{label}.db")
        else:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
            from pg_server import fresh_dsn, throwaway_server

            base = dsn or throwaway_server("idem-tool-step").get_uri()

            def where(label: str) -> str:
                return fresh_dsn(base)

        stacks = open_stacks(stack, backend, labels, where)
        graphs = {lab: graph_of(lab, saver) for lab, (saver, _) in stacks.items()}
        no_loop = stack.enter_context(ThreadPoolExecutor(1))

        def step(label: str) -> None:
            tag = uuid.uuid4().hex[:10]
            inp = {"messages": [tool_call_message(CALLS, tag)]}
            cfg = {"configurable": {"thread_id": f"s-{tag}"}}
            no_loop.submit(graphs[label].invoke, inp, cfg).result()

        for label in labels:  # warm: imports, prepared statements, plans
            for _ in range(5):
                step(label)
        TALLY.counts.clear()
        samples: dict[str, dict[str, list[float]]] = {
            lab: {"cpu": [], "server": [], "wall": []} for lab in labels
        }
        for r in range(rounds):
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for label in order:
                pid = stacks[label][1]
                cpu0, srv0, wall0 = time.process_time(), server_cpu(pid), time.perf_counter()
                for _ in range(batch):
                    step(label)
                wall = time.perf_counter() - wall0
                cpu, srv = time.process_time() - cpu0, server_cpu(pid) - srv0
                samples[label]["cpu"].append(cpu / batch * 1e3)
                samples[label]["server"].append(srv / batch * 1e3)
                samples[label]["wall"].append(wall / batch * 1e3)
        TALLY.counting(True)  # the counting pass, untimed
        WAITS.on = True
        for label in labels:
            for _ in range(counted):
                step(label)
        TALLY.counting(False)
        WAITS.on = False
        TALLY.sqlite.clear()  # closed with this backend's stack
        steps = rounds * batch
        print(f"\n== {backend}: {steps} steps a stack, load average {os.getloadavg()[0]:.1f}")
        print("ms a step, median [quartiles] of the rounds; per step: statements, commits")
        for label in labels:
            parts = []
            for what, values in samples[label].items():
                if what == "server" and backend == "sqlite":
                    continue
                q = statistics.quantiles(values, n=4) if len(values) > 1 else values * 3
                parts.append(f"{what} {statistics.median(values):6.2f} [{q[0]:.2f}-{q[2]:.2f}]")
            print(f"  {label:9} " + "  ".join(parts))
            counts = TALLY.counts[label]
            print(
                "            "
                + ", ".join(f"{k} {v / counted:.2f}" for k, v in sorted(counts.items()))
            )
            waits = sorted(WAITS.waits.pop(label, []))
            if waits:
                pick = [waits[int(q * (len(waits) - 1))] for q in (0.5, 0.9)]
                print(
                    f"            outcome writes {WAITS.writes.pop(label) / counted:.2f} a "
                    f"step; a row's wait from its call's return to its write: "
                    f"p50 {pick[0]:.2f} ms, p90 {pick[1]:.2f}, max {waits[-1]:.2f}"
                )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,pg")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--batch", type=int, default=5, help="steps a stack runs in a row")
    p.add_argument("--counted", type=int, default=20, help="steps a stack runs counted")
    p.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    p.add_argument("--dsn", help="a PostgreSQL server to use (default: a throwaway one)")
    args = p.parse_args()
    labels = ["official", "ours"]
    if args.base:
        sys.path.insert(0, args.base)
        labels.append("base")
    trace_psycopg()
    WAITS.install("ours", "langgraph_idem_saver")
    if args.base:
        WAITS.install("base", "lis_base")
    for backend in args.backends.split(","):
        measure(backend, labels, args.rounds, args.batch, args.counted, args.dsn)


if __name__ == "__main__":
    main()
