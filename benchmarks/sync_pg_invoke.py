#!/usr/bin/env python
"""The sync PostgreSQL ``graph.invoke`` (bench.py's ``sync_invoke`` row), ours against
LangGraph's ``PostgresSaver``, call by call and round trip by round trip (issue #41).

The workload is bench.py's: ``loop_graph(10)``, ``graph.invoke(..., durability="sync")``,
a fresh thread id per invoke, each saver on one psycopg ``Connection`` opened with
bench's ``POOL_KWARGS`` (autocommit, ``prepare_threshold=0``, ``dict_row``), in a schema
of its own on a throwaway ``pgserver`` (durable defaults: fsync on) or ``--dsn``.

``--counts`` (the default part): for one invoke of each saver, every checkpointer method
LangGraph calls (wrapped on the saver instance: its calls, wall time, CPU time of the
thread that made it) and, inside each, psycopg's round trips (``Connection.wait`` calls:
one per blocking exchange with the server) and statements (``execute``/``executemany``/
``BEGIN``/``COMMIT``, by first words). Then, for a batch of ``--batch`` invokes of one saver
at a time, what the server did: WAL bytes (``pg_current_wal_lsn()``), WAL records and
fsyncs (``pg_stat_wal``) and committed transactions (``pg_stat_database``), per invoke
(the sessions' stats flushed first: one ``SELECT 1`` each, more than a second later).

``--timing``: whole invokes, the savers interleaved (the order alternating each round),
wall time, the process's CPU time and the calling thread's CPU time, medians printed
with the ratio official / ours (> 1: ours is faster).

    python benchmarks/sync_pg_invoke.py                    # counts, then timing
    python benchmarks/sync_pg_invoke.py --only counts
    python benchmarks/sync_pg_invoke.py --only timing --rounds 200
    python benchmarks/sync_pg_invoke.py --only server-cpu --reps 500

``--server-cpu``: the statements of one invoke of each saver replayed ``--reps`` times (a
fresh thread id each) on its session with ``synchronous_commit=off``, each kind timed on
the server backend's CPU clock (``/proc/<pid>/stat``: same host only; 10 ms ticks, so
use hundreds of reps). ``--base DIR`` adds the package at another commit as a third
saver, ``base`` (importable from ``DIR`` as ``lis_base``; ``sync_sqlite_cpu.py`` says
how to make one), to every part: before/after in one process.
"""

from __future__ import annotations

import argparse
import collections
import functools
import gc
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from bench import POOL_KWARGS, loop_graph
from psycopg.conninfo import conninfo_to_dict, make_conninfo

STEPS = 10
METHODS = (
    "get_tuple",
    "put",
    "put_writes",
    "list",
    "get_next_version",
    "get_delta_channel_history",
    "delete_thread",
)

# --- psycopg tracing (this script only) ------------------------------------------------

_tag = threading.local()


class Tally:
    """Per (label, method): calls, wall ns, thread CPU ns, round trips, statements."""

    def __init__(self) -> None:
        self.calls: collections.Counter[tuple[str, str]] = collections.Counter()
        self.wall: collections.Counter[tuple[str, str]] = collections.Counter()
        self.cpu: collections.Counter[tuple[str, str]] = collections.Counter()
        self.trips: collections.Counter[tuple[str, str]] = collections.Counter()
        self.statements: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.threads: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.on = False
        self.label = ""
        self.capture: list[tuple[str, str, Any, Any, dict[str, Any]]] | None = None

    def where(self) -> tuple[str, str] | None:
        """The saver call being made on this thread; (label, "(outside)") for a round trip
        outside any (another thread of the saver's, e.g. its loop)."""
        if not self.on:
            return None
        return getattr(_tag, "value", None) or (self.label, "(outside)")


TALLY = Tally()


def _words(query: Any) -> str:
    text = query if isinstance(query, str) else getattr(query, "as_string", lambda: str(query))
    if callable(text):
        try:
            text = text(None)
        except Exception:
            text = str(query)
    if isinstance(text, bytes):
        text = text.decode()
    words = " ".join(str(text).split())
    return words[:70]


def install_tracing() -> None:
    """Count round trips and statements per tagged saver call, on every psycopg sync
    connection of this process (patched here, in the benchmark only)."""
    wait = psycopg.Connection.wait
    execute = psycopg.Cursor.execute
    executemany = psycopg.Cursor.executemany
    exec_command = psycopg.Connection._exec_command

    def traced_wait(self: Any, gen: Any, *args: Any, **kwargs: Any) -> Any:
        where = TALLY.where()
        if where is not None:
            TALLY.trips[where] += 1
        return wait(self, gen, *args, **kwargs)

    def traced_execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        where = TALLY.where()
        if where is not None:
            TALLY.statements[(*where, "execute: " + _words(query))] += 1
            if TALLY.capture is not None:
                params = args[0] if args else kwargs.get("params")
                TALLY.capture.append((where[1], "execute", query, params, dict(kwargs)))
        return execute(self, query, *args, **kwargs)

    def traced_executemany(self: Any, query: Any, params: Any, *args: Any, **kwargs: Any) -> Any:
        where = TALLY.where()
        params = list(params)
        if where is not None:
            key = (*where, f"executemany x{len(params)}: " + _words(query))
            TALLY.statements[key] += 1
            if TALLY.capture is not None:
                TALLY.capture.append((where[1], "executemany", query, params, dict(kwargs)))
        return executemany(self, query, params, *args, **kwargs)

    def traced_command(self: Any, command: Any, *args: Any, **kwargs: Any) -> Any:
        where = TALLY.where()
        if where is not None:
            TALLY.statements[(*where, "command: " + _words(command))] += 1
        return exec_command(self, command, *args, **kwargs)

    psycopg.Connection.wait = traced_wait  # type: ignore[method-assign]
    psycopg.Cursor.execute = traced_execute  # type: ignore[method-assign]
    psycopg.Cursor.executemany = traced_executemany  # type: ignore[method-assign]
    psycopg.Connection._exec_command = traced_command  # type: ignore[method-assign]


def wrap_methods(label: str, saver: Any) -> None:
    """Tag every call of ``METHODS`` on ``saver`` (the instance) with (label, method)."""
    for name in METHODS:
        inner = getattr(saver, name, None)
        if inner is None:
            continue

        def tagged(*args: Any, __inner: Any = inner, __name: str = name, **kwargs: Any) -> Any:
            if not TALLY.on:
                return __inner(*args, **kwargs)
            key = (label, __name)
            outer = getattr(_tag, "value", None)
            _tag.value = key if outer is None else outer
            c0, w0 = time.thread_time_ns(), time.perf_counter_ns()
            try:
                out = __inner(*args, **kwargs)
                if __name == "list":
                    out = list(out)  # a generator: consumed here, inside the tag
                return out
            finally:
                if outer is None:
                    TALLY.calls[key] += 1
                    TALLY.wall[key] += time.perf_counter_ns() - w0
                    TALLY.cpu[key] += time.thread_time_ns() - c0
                    main = threading.current_thread() is threading.main_thread()
                    TALLY.threads[(label, __name, "main" if main else "worker")] += 1
                _tag.value = outer

        functools.update_wrapper(tagged, inner)
        setattr(saver, name, tagged)


# --- the server ------------------------------------------------------------------------


@contextmanager
def server(dsn: str | None) -> Iterator[str]:
    if dsn:
        yield dsn
        return
    import pgserver

    srv = pgserver.get_server(tempfile.mkdtemp(prefix="idem-invoke-pg-"), cleanup_mode="delete")
    try:
        yield str(srv.get_uri())
    finally:
        srv.cleanup()


def new_schema(base: str, name: str) -> str:
    schema = f"inv_{name}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    options = conninfo_to_dict(base).get("options") or ""
    return make_conninfo(base, options=f"{options} -c search_path={schema}".strip())


def open_savers(stack: ExitStack, base: str, base_ref: str | None) -> dict[str, Any]:
    from langgraph.checkpoint.postgres import PostgresSaver as Official

    from langgraph_idem_saver.postgres import PostgresSaver as Ours

    classes: dict[str, Any] = {"official": Official, "ours": Ours}
    if base_ref:  # a folder holding another copy of the package as lis_base
        import importlib

        sys.path.insert(0, base_ref)
        classes["base"] = importlib.import_module("lis_base.postgres").PostgresSaver
    savers = {}
    for label, cls in classes.items():
        conn = stack.enter_context(
            psycopg.Connection.connect(new_schema(base, label), **POOL_KWARGS)
        )
        saver = cls(conn) if label == "official" else stack.enter_context(cls(conn))
        saver.setup()
        savers[label] = saver
    return savers


def invoker(saver: Any) -> Callable[[], None]:
    graph = loop_graph(STEPS).compile(checkpointer=saver)

    def invoke() -> None:
        thread = {"configurable": {"thread_id": f"g-{uuid.uuid4().hex}"}}
        out = graph.invoke({"count": 0, "log": []}, thread, durability="sync")
        assert out["count"] == STEPS

    return invoke


SERVER_SQL = """
SELECT pg_current_wal_lsn(), w.wal_records, w.wal_fpi, w.wal_bytes, w.wal_write, w.wal_sync,
       d.xact_commit, d.xact_rollback, d.tup_inserted, d.tup_updated
FROM pg_stat_wal w, pg_stat_database d WHERE d.datname = current_database()
"""


def server_stats(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    row = conn.execute(SERVER_SQL).fetchone()
    assert row is not None
    keys = ("lsn", "records", "fpi", "bytes", "wal_write", "wal_sync", "commits", "rollbacks")
    keys += ("tup_inserted", "tup_updated")
    return dict(zip(keys, row, strict=True))


def backend_cpu_ms(pid: int) -> float:
    """utime + stime of a server backend (same host only), ms."""
    import os

    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / os.sysconf("SC_CLK_TCK")


def counts(base: str, savers: dict[str, Any], batch: int) -> None:
    invokes = {label: invoker(s) for label, s in savers.items()}
    for invoke in invokes.values():  # warm: prepared statements, imports
        for _ in range(3):
            invoke()
    for label, invoke in invokes.items():
        TALLY.label, TALLY.on = label, True
        invoke()
        TALLY.on = False
    print(f"\n## One {STEPS}-step invoke: per saver method (calls, round trips, thread CPU)")
    print(f"{'saver':<9} {'method':<18} {'calls':>5} {'trips':>6} {'wall us':>9} {'cpu us':>9}")
    for label in savers:
        total = collections.Counter[str]()
        for (lab, name), n in sorted(TALLY.calls.items()):
            if lab != label:
                continue
            trips = TALLY.trips[(lab, name)]
            wall, cpu = TALLY.wall[(lab, name)] / 1e3, TALLY.cpu[(lab, name)] / 1e3
            total["calls"] += n
            total["trips"] += trips
            print(f"{lab:<9} {name:<18} {n:>5} {trips:>6} {wall:>9.0f} {cpu:>9.0f}")
        outside = TALLY.trips[(label, "(outside)")]
        print(f"{label:<9} {'(outside a call)':<18} {'':>5} {outside:>6}")
        print(f"{label:<9} {'(all)':<18} {total['calls']:>5} {total['trips'] + outside:>6}")
    print("\n## Statements per invoke (first words)")
    for (lab, name, words), n in sorted(TALLY.statements.items()):
        print(f"{lab:<9} {name:<12} {n:>3}  {words}")
    print("\n## Threads the calls ran on")
    for (lab, name, where), n in sorted(TALLY.threads.items()):
        print(f"{lab:<9} {name:<12} {where:<7} {n}")

    print(f"\n## Server side, per invoke (batches of {batch}, one saver at a time)")
    with psycopg.connect(base, autocommit=True) as probe:
        for label, invoke in invokes.items():
            conns = [savers[label].conn]
            pid = conns[0].info.backend_pid
            time.sleep(1.1)
            for c in conns:
                c.execute("SELECT 1")  # flush this session's pending stats
            time.sleep(0.2)
            before = server_stats(probe)
            cpu0, proc0, wall0 = backend_cpu_ms(pid), time.process_time(), time.perf_counter()
            for _ in range(batch):
                invoke()
            cpu1, proc1, wall1 = backend_cpu_ms(pid), time.process_time(), time.perf_counter()
            time.sleep(1.1)
            for c in conns:
                c.execute("SELECT 1")
            time.sleep(0.2)
            after = server_stats(probe)
            wal = probe.execute(
                "SELECT pg_wal_lsn_diff(%s, %s)", (after["lsn"], before["lsn"])
            ).fetchone()
            assert wal is not None
            per = {k: (after[k] - before[k]) / batch for k in after if k != "lsn"}
            # the probe's own 2 reads and the flushing SELECT 1 are a few commits per batch
            print(
                f"{label:<9} WAL {float(wal[0]) / batch:>8.0f} B  records {per['records']:>6.1f}"
                f"  fpi {per['fpi']:>5.1f}  wal_write {per['wal_write']:>5.1f}"
                f"  wal_sync (fsync) {per['wal_sync']:>5.1f}  commits {per['commits']:>5.1f}"
                f"  rows ins {per['tup_inserted']:>5.1f} upd {per['tup_updated']:>4.1f}"
            )
            print(
                f"{'':<9} backend CPU {(cpu1 - cpu0) * 1000 / batch:>7.0f} us"
                f"  this process CPU {(proc1 - proc0) * 1e6 / batch:>7.0f} us"
                f"  wall {(wall1 - wall0) * 1e6 / batch:>7.0f} us  (per invoke)"
            )


def timing(savers: dict[str, Any], rounds: int, per_round: int) -> None:
    invokes = {label: invoker(s) for label, s in savers.items()}
    labels = list(invokes)
    for invoke in invokes.values():
        for _ in range(5):
            invoke()
    wall: dict[str, list[float]] = {lab: [] for lab in labels}
    proc: dict[str, list[float]] = {lab: [] for lab in labels}
    thr: dict[str, list[float]] = {lab: [] for lab in labels}
    for r in range(rounds):
        order = labels if r % 2 == 0 else labels[::-1]
        for lab in order:
            gc.collect()
            invoke = invokes[lab]
            for _ in range(per_round):
                p0, t0, w0 = time.process_time_ns(), time.thread_time_ns(), time.perf_counter_ns()
                invoke()
                w1, t1, p1 = time.perf_counter_ns(), time.thread_time_ns(), time.process_time_ns()
                wall[lab].append((w1 - w0) / 1e3)
                proc[lab].append((p1 - p0) / 1e3)
                thr[lab].append((t1 - t0) / 1e3)
    print(f"\n## Whole invokes, {rounds} rounds x {per_round}, interleaved: medians, us")
    print(f"{'saver':<9} {'wall':>9} {'proc CPU':>9} {'thread CPU':>10}")
    for lab in labels:
        print(
            f"{lab:<9} {statistics.median(wall[lab]):>9.0f} {statistics.median(proc[lab]):>9.0f}"
            f" {statistics.median(thr[lab]):>10.0f}"
        )
    for lab in labels:
        if lab == "official":
            continue
        ratios = [
            statistics.median(m["official"]) / statistics.median(m[lab]) for m in (wall, proc, thr)
        ]
        print(
            f"official / {lab}: wall {ratios[0]:.3f}x  proc CPU {ratios[1]:.3f}x"
            f"  thread CPU {ratios[2]:.3f}x"
        )


def _swap(params: Any, old: str, new: str) -> Any:
    if isinstance(params, str):
        return new if params == old else params
    if isinstance(params, list | tuple):
        return type(params)(_swap(p, old, new) for p in params)
    if isinstance(params, dict):
        return {k: _swap(v, old, new) for k, v in params.items()}
    return params


def server_cpu(base: str, savers: dict[str, Any], reps: int) -> None:
    """Replay the statements of one invoke ``reps`` times (a fresh thread id each) on
    each saver's session, ``synchronous_commit=off`` (the fsync waits are the same 23 an
    invoke both ways; this is the backend's CPU), each kind of statement timed on the
    backend's CPU clock; the savers interleaved (the order rotating each rep)."""
    print(f"\n## Server CPU per statement kind: one invoke's statements replayed x{reps}")
    captured: dict[str, tuple[str, list[Any]]] = {}
    for label, saver in savers.items():
        tid = f"cap-{uuid.uuid4().hex}"
        TALLY.capture, TALLY.label, TALLY.on = [], label, True
        loop_graph(STEPS).compile(checkpointer=saver).invoke(
            {"count": 0, "log": []}, {"configurable": {"thread_id": tid}}, durability="sync"
        )
        TALLY.on = False
        captured[label], TALLY.capture = (tid, TALLY.capture), None
    kinds: collections.Counter[tuple[str, str]] = collections.Counter()
    spent: collections.Counter[tuple[str, str]] = collections.Counter()
    labels = list(savers)
    for r in range(reps):
        k = r % len(labels)
        for label in labels[k:] + labels[:k]:
            conn = savers[label].conn
            pid = conn.info.backend_pid
            tid, statements = captured[label]
            new = f"rep-{uuid.uuid4().hex}"
            for method, how, query, params, kwargs in statements:
                kwargs = {k: v for k, v in kwargs.items() if k in ("prepare",)}
                kind = (label, f"{method} {how} {_words(query)[:28]}")
                p = _swap(params, tid, new)
                with conn.cursor(binary=True) as cur:
                    c0 = backend_cpu_ms(pid)
                    if how == "execute":
                        cur.execute(query, p, **kwargs)
                    else:
                        cur.executemany(query, p, **kwargs)
                    spent[kind] += backend_cpu_ms(pid) - c0
                kinds[kind] += 1
    for label in labels:
        total = 0.0
        for (lab, kind), n in sorted(kinds.items()):
            if lab != label:
                continue
            total += spent[(lab, kind)]
            each = spent[(lab, kind)] * 1000 / n
            print(f"{label:<9} {kind:<60} x{n // reps:>2}/invoke  {each:>6.0f} us each")
        print(f"{label:<9} {'(all, per invoke)':<60}      {total * 1000 / reps:>9.0f} us")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dsn", default=None)
    ap.add_argument("--only", choices=("counts", "timing", "server-cpu"), default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--batch", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--per-round", type=int, default=2)
    ap.add_argument(
        "--base",
        default=None,
        help="a folder holding another copy of the package as lis_base (a third saver)",
    )
    args = ap.parse_args()
    install_tracing()
    import os

    print(f"load average: {os.getloadavg()}")
    with server(args.dsn) as base, ExitStack() as stack:
        savers = open_savers(stack, base, args.base)
        for label, saver in savers.items():
            wrap_methods(label, saver)
        if args.only in (None, "counts"):
            counts(base, savers, args.batch)
        if args.only == "server-cpu":
            for saver in savers.values():
                saver.conn.execute("SET synchronous_commit = off")
            server_cpu(base, savers, args.reps)
        if args.only in (None, "timing"):
            timing(savers, args.rounds, args.per_round)
    print(f"load average: {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
