"""The sync ``SqliteSaver``'s checkpoint calls of one 10-step ``graph.invoke``, on the CPU
clock of the thread that makes them, against LangGraph's ``SqliteSaver``.

Why: in ``graph.invoke(..., durability="sync")`` LangGraph makes the ``put`` and
``put_writes`` calls on its background executor's threads, not on the caller's, so the
caller's CPU clock (``sync_sqlite_cpu.py``'s ``invoke`` row) does not see them, and the
process's clock mixes them with the graph's own work and the GIL hand-offs. Here the
calls one invoke makes (captured once, from an ``InMemorySaver``: 1 ``get_tuple``,
12 ``put``, 11 ``put_writes``) are replayed in order on each saver, on a fresh thread id
each round, from this thread: each kind of call timed on ``time.thread_time_ns``, the
stacks interleaved (rotating order) in one process, the medians of the rounds printed.
The same objects are replayed, so a growing list is stored as a delta as in the graph.

Stacks: ``official``, ``ours`` and, with ``--base DIR``, the package at another commit
importable as ``lis_base`` (see ``sync_sqlite_cpu.py`` for how to make one).
``--bytecodes LABEL`` counts that stack's bytecodes a call, filed by function.
``--invoke`` times whole ``graph.invoke`` calls instead (the 10-step loop graph,
``durability="sync"``, a fresh thread each) on the *process's* CPU clock, which sees the
executor threads' ``put``/``put_writes`` too; the stacks interleaved as above.

    python benchmarks/sync_write_cpu.py --rounds 300 --synchronous NORMAL
    python benchmarks/sync_write_cpu.py --bytecodes ours --only put
    python benchmarks/sync_write_cpu.py --invoke --rounds 100

``--sql-shapes`` times the statements of a ``put`` alone (no saver, no Python around
them), on one file of this package's schema, in several shapes: as the loop graph's put
writes them (the delta's base probed, three value rows by ``executemany``, the checkpoint
row, the commit), the same rows as one multi-row ``INSERT``, one value row, the
checkpoint row alone (LangGraph's one row a put), and with ``idem_blobs`` created
``WITHOUT ROWID`` (a second file); the shapes interleaved, thread CPU, 12 puts a round.

    python benchmarks/sync_write_cpu.py --sql-shapes --rounds 200
"""

from __future__ import annotations

import argparse
import collections
import gc
import importlib
import json
import os
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

from bench import loop_graph
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver

Call = tuple[str, tuple[Any, ...], dict[str, Any]]


def captured_calls() -> list[Call]:
    """The checkpointer calls of one 10-step ``invoke`` (``durability="sync"``), in order."""
    calls: list[Call] = []

    class Capturing(InMemorySaver):
        def put(self, *a: Any, **k: Any) -> Any:
            calls.append(("put", a, k))
            return super().put(*a, **k)

        def put_writes(self, *a: Any, **k: Any) -> None:
            calls.append(("put_writes", a, k))
            super().put_writes(*a, **k)

        def get_tuple(self, *a: Any, **k: Any) -> Any:
            calls.append(("get_tuple", a, k))
            return super().get_tuple(*a, **k)

    graph = loop_graph(10).compile(checkpointer=Capturing())
    graph.invoke({"count": 0, "log": []}, {"configurable": {"thread_id": "t"}}, durability="sync")
    return calls


def open_savers(stack: ExitStack, folder: str, base: str | None, sync: str) -> dict[str, Any]:
    """label -> sync saver, each on a file of its own (WAL, the ``synchronous`` given)."""
    makers: dict[str, Callable[[sqlite3.Connection], Any]] = {"official": OfficialSqliteSaver}
    ours = importlib.import_module("langgraph_idem_saver.sqlite").SqliteSaver
    makers["ours"] = lambda conn: stack.enter_context(ours(conn, synchronous=sync))
    if base is not None:
        sys.path.insert(0, base)
        theirs = importlib.import_module("lis_base.sqlite").SqliteSaver
        makers["base"] = lambda conn: stack.enter_context(theirs(conn, synchronous=sync))
    savers = {}
    for label, make in makers.items():
        path = os.path.join(folder, f"{label}.db")
        conn = stack.enter_context(closing(sqlite3.connect(path, check_same_thread=False)))
        conn.execute(f"PRAGMA synchronous={sync}")
        saver = make(conn)
        saver.setup()
        conn.execute("PRAGMA journal_mode=WAL")
        savers[label] = saver
    return savers


def replay(saver: Any, calls: list[Call], out: collections.Counter[str] | None = None) -> None:
    """``calls`` on ``saver`` for a new thread id; each kind's thread CPU added to ``out``."""
    thread = uuid.uuid4().hex
    for name, args, kwargs in calls:
        config = dict(args[0])
        config["configurable"] = {**args[0]["configurable"], "thread_id": thread}
        method = getattr(saver, name)
        t0 = time.thread_time_ns()
        method(config, *args[1:], **kwargs)
        if out is not None:
            out[name] += time.thread_time_ns() - t0


def bytecodes(run: Callable[[], None], n: int = 5) -> tuple[float, collections.Counter[str]]:
    """Bytecodes a ``run`` and, filed by function, where they ran (``sys.settrace``)."""
    where: collections.Counter[str] = collections.Counter()

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        code = frame.f_code
        where[f"{code.co_filename.rsplit('site-packages/', 1)[-1]}:{code.co_name}"] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        frame.f_trace_opcodes = True
        frame.f_trace_lines = False
        return local

    run()
    sys.settrace(tracer)
    try:
        for _ in range(n):
            run()
    finally:
        sys.settrace(None)
    return where.total() / n, where


def invokes(savers: dict[str, Any], rounds: int) -> dict[str, list[float]]:
    """label -> µs of process CPU an invoke, a round each (stacks alternating, order
    rotating; the collector run between rounds, not inside one)."""
    graphs = {lab: loop_graph(10).compile(checkpointer=s) for lab, s in savers.items()}

    def invoke(lab: str) -> None:
        thread = {"configurable": {"thread_id": uuid.uuid4().hex}}
        out = graphs[lab].invoke({"count": 0, "log": []}, thread, durability="sync")
        assert out["count"] == 10

    labels = list(savers)
    for lab in labels:  # warm
        for _ in range(5):
            invoke(lab)
    got: dict[str, list[float]] = {lab: [] for lab in labels}
    gc.disable()
    try:
        for r in range(rounds):
            order = labels[r % len(labels) :] + labels[: r % len(labels)]
            for lab in order if r % 2 else order[::-1]:
                t0 = time.process_time_ns()
                invoke(lab)
                got[lab].append((time.process_time_ns() - t0) / 1000)
            gc.collect()
    finally:
        gc.enable()
    return got


SHAPES = ["probe+3 rows", "probe+3 rows, one INSERT", "probe+1 row", "checkpoint row only"]


def sql_shapes(rounds: int, folder: str) -> dict[str, list[float]]:
    """shape -> µs of thread CPU a put's statements and commit (see the docstring)."""
    from langgraph_idem_saver.sqlite import sql

    blob_table = "PRIMARY KEY (thread_id, checkpoint_ns, channel, version)\n    )"
    conns: dict[str, sqlite3.Connection] = {}
    for label, schema in (("", sql.MIGRATIONS), (" WITHOUT ROWID", None)):
        conn = sqlite3.connect(os.path.join(folder, f"shapes{len(conns)}.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        for migration in schema or [
            m.replace(blob_table, blob_table + " WITHOUT ROWID") for m in sql.MIGRATIONS
        ]:
            conn.executescript(migration)
        conns[label] = conn
    columns = "(thread_id, checkpoint_ns, channel, version, type, blob, base_version)"
    three_in_one = f"INSERT OR REPLACE INTO idem_blobs {columns} VALUES " + ",".join(
        ["(?, ?, ?, ?, ?, ?, ?)"] * 3
    )
    shapes = [*SHAPES, "probe+3 rows WITHOUT ROWID"]

    def put(shape: str, thread: str, step: int) -> int:
        conn = conns[" WITHOUT ROWID" if shape.endswith("ROWID") else ""]
        version, base = f"{step:032}.0.1234567890123456", f"{step - 1:032}.0.1234567890123456"
        versions = json.dumps({"count": version, "log": version, "branch:to:step": version})
        checkpoint = (thread, "", uuid.uuid4().hex, None, None, "msgpack", b"c" * 300,
                      '{"parents":{},"source":"loop","step":1}', versions)  # fmt: skip
        rows = [
            (thread, "", "count", version, "msgpack", b"\x01", None),
            (thread, "", "log", version, "msgpack", b"l" * 200, base),
            (thread, "", "branch:to:step", version, "null", b"", None),
        ]
        t0 = time.thread_time_ns()
        conn.execute("BEGIN IMMEDIATE")
        if shape != "checkpoint row only":
            conn.execute(sql.BLOB_EXISTS, (thread, "", "log", base)).fetchone()
        if shape == "probe+3 rows, one INSERT":
            conn.execute(three_in_one, [v for row in rows for v in row])
        elif shape == "probe+1 row":
            conn.execute(sql.UPSERT_BLOB, rows[1])
        elif shape != "checkpoint row only":
            conn.executemany(sql.UPSERT_BLOB, rows)
        conn.execute(sql.UPSERT_CHECKPOINT, checkpoint)
        conn.execute("COMMIT")
        return time.thread_time_ns() - t0

    got: dict[str, list[float]] = {shape: [] for shape in shapes}
    for r in range(rounds):
        thread = uuid.uuid4().hex
        for step in range(12):
            for shape in shapes if r % 2 else shapes[::-1]:
                got[shape].append(put(shape, thread + shape, step) / 1000)
    for conn in conns.values():
        conn.close()
    return got


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=200)
    p.add_argument("--synchronous", default="NORMAL", choices=["NORMAL", "FULL"])
    p.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    p.add_argument("--bytecodes", help="a stack label: its bytecodes a call, by function")
    p.add_argument("--only", help="one kind of call: get_tuple, put or put_writes")
    p.add_argument("--invoke", action="store_true", help="whole invokes, process CPU")
    p.add_argument("--sql-shapes", action="store_true", help="a put's statements alone")
    args = p.parse_args()
    if args.sql_shapes:
        with tempfile.TemporaryDirectory() as folder:
            got_shapes = sql_shapes(args.rounds, folder)
        print(f"load average {os.getloadavg()[0]:.1f}; µs of thread CPU a put's SQL (median)")
        for shape, values in got_shapes.items():
            print(f"{shape:28} {statistics.median(values):7.1f}")
        return
    if args.invoke:
        with ExitStack() as stack:
            folder = stack.enter_context(tempfile.TemporaryDirectory())
            savers = open_savers(stack, folder, args.base, args.synchronous)
            got_invokes = invokes(savers, args.rounds)
        official = statistics.median(got_invokes["official"])
        print(f"load average {os.getloadavg()[0]:.1f}; µs of process CPU an invoke (median)")
        for lab, values in got_invokes.items():
            mine = statistics.median(values)
            print(f"invoke {lab:9} {mine:9.1f} ({official / mine:.3f}x)")
        return
    calls = captured_calls()
    if args.only:
        calls = [c for c in calls if c[0] == args.only]
    kinds = collections.Counter(name for name, _, _ in calls)
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory())
        savers = open_savers(stack, folder, args.base, args.synchronous)
        labels = list(savers)
        for saver in savers.values():  # warm: statements, caches
            for _ in range(20):
                replay(saver, calls)
        if args.bytecodes:
            total, where = bytecodes(lambda: replay(savers[args.bytecodes], calls))
            print(f"{args.bytecodes}: {total:.0f} bytecodes for {dict(kinds)}")
            for name, count in where.most_common(30):
                print(f"{count / 5:8.0f}  {name}")
            return
        got: dict[str, dict[str, list[float]]] = {
            lab: collections.defaultdict(list) for lab in labels
        }
        gc.disable()  # a full collection lands on whichever stack crosses the threshold
        try:
            for r in range(args.rounds):
                order = labels[r % len(labels) :] + labels[: r % len(labels)]
                for lab in order if r % 2 else order[::-1]:
                    out: collections.Counter[str] = collections.Counter()
                    replay(savers[lab], calls, out)
                    for name, ns in out.items():
                        got[lab][name].append(ns / kinds[name] / 1000)
                if r % 20 == 19:
                    gc.collect()
        finally:
            gc.enable()
    print(f"load average {os.getloadavg()[0]:.1f}; µs of thread CPU a call (median of rounds)")
    for name in kinds:
        official = statistics.median(got["official"][name])
        cells = [f"official {official:6.1f}"]
        for lab in labels[1:]:
            mine = statistics.median(got[lab][name])
            cells.append(f"{lab} {mine:6.1f} ({official / mine:.3f}x)")
        print(f"{name:11} x{kinds[name]:<3} " + "  ".join(cells))


if __name__ == "__main__":
    main()
