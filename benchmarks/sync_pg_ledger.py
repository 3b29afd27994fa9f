"""The sync ``PostgresSaver``'s ledger over the user's ``Connection`` / ``ConnectionPool``:
what one ledger claim and its outcome cost, and a 10-call tool step, per call.

    python benchmarks/sync_pg_ledger.py                       # this checkout
    python benchmarks/sync_pg_ledger.py --against OLD_TREE    # A/B against another tree

``OLD_TREE`` is a directory holding another version's ``langgraph_idem_saver`` package
(e.g. ``git archive <commit> langgraph_idem_saver | tar -x -C OLD_TREE``). The two run in
alternating child processes (their order swapped each round) on one throwaway PostgreSQL
(``pgserver``, durable defaults), each on a database schema of its own; a child measures
each configuration in turn, interleaved:

* ``conn``: ``PostgresSaver(conn)`` over a ``Connection`` (autocommit,
  ``prepare_threshold=0``, ``dict_row``, as LangGraph's docs open one);
* ``pool``: ``PostgresSaver(pool)`` over a ``ConnectionPool`` of 4, the same kwargs;
* ``keep``: ``PostgresSaver(conn, keep_session=True)`` (a kept async session in the
  versions that had one; a no-op since the ledger runs on the user's connection).

Rows: ``claim+outcome`` - ``aclaim`` of one call and its ``record_outcome``, driven from a
caller's event loop as the front doors drive them (they hop to the saver's loop), ms per
pair; ``step/call`` - ``graph.invoke`` of one ``IdempotentToolNode`` step with 10
parallel sync tool calls (durability ``sync``), ms per call; ``4 threads`` - four threads
making claim+outcome pairs on one saver at once, ms of wall time per pair (what calls
that take turns - one connection - or run concurrently - a pool - give). Medians per
child; the table shows the range of the children's medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

HOWS = ("conn", "pool", "keep")
CALLS = 10


def new_schema(base: str) -> str:
    schema = f"bench_sync_ledger_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    options = conninfo_to_dict(base).get("options") or ""
    return make_conninfo(base, options=f"{options} -c search_path={schema}".strip())


@contextmanager
def open_saver(dsn: str, how: str) -> Iterator[Any]:
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from langgraph_idem_saver.postgres import PostgresSaver

    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ExitStack() as stack:
        if how == "pool":
            pool = stack.enter_context(ConnectionPool(dsn, kwargs=kwargs, min_size=4, max_size=4))
            pool.wait()
            saver = stack.enter_context(PostgresSaver(pool))
        else:
            conn = stack.enter_context(psycopg.connect(dsn, **kwargs))
            saver = stack.enter_context(PostgresSaver(conn, keep_session=how == "keep"))
        saver.setup()
        yield saver


def claim_and_outcome(saver: Any, n: int) -> list[float]:
    """ms per claim + outcome pair, ``n`` pairs (each a new call)."""
    from langgraph_idem_saver.ledger import CallIntent, Outcome

    async def run() -> list[float]:
        out = []
        for _ in range(n):
            tag = uuid.uuid4().hex
            scope, key = f"t-{tag}", f"k-{tag}"
            intent = CallIntent(scope, key, scope, "tools", "noop", "h", b"{}", f"c-{tag}")
            started = time.perf_counter()
            [claim] = await saver.aclaim([intent], owner="bench", lease_seconds=60)
            assert claim.claimed
            done = Outcome.completed(None, None)
            await saver.record_outcome(scope, key, owner="bench", outcome=done)
            out.append((time.perf_counter() - started) * 1000)
        return out

    return asyncio.run(run())


def claim_and_outcome_threads(saver: Any, n: int, threads: int = 4) -> list[float]:
    """ms of wall time per pair, ``threads`` threads each making ``n`` pairs at once."""
    import threading

    workers = [threading.Thread(target=claim_and_outcome, args=(saver, n)) for _ in range(threads)]
    started = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return [(time.perf_counter() - started) * 1000 / (n * threads)]


def tool_steps(saver: Any, n: int) -> list[float]:
    """ms per tool call of ``n`` graph steps of ``CALLS`` parallel sync calls each."""
    from langchain_core.messages import AIMessage
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph

    from langgraph_idem_saver import IdempotentToolNode

    @tool
    def noop(i: int) -> str:
        """Do nothing (a side-effecting tool as far as the ledger knows)."""
        return "ok"

    g = StateGraph(MessagesState)
    g.add_node("tools", IdempotentToolNode([noop]))
    g.add_edge(START, "tools")
    g.add_edge("tools", END)
    graph = g.compile(checkpointer=saver)
    out = []
    for _ in range(n):
        tag = uuid.uuid4().hex[:10]
        calls = [
            {"name": "noop", "args": {"i": i}, "id": f"c_{tag}_{i}", "type": "tool_call"}
            for i in range(CALLS)
        ]
        msg = AIMessage(content="", id=f"ai-{tag}", tool_calls=calls)
        started = time.perf_counter()
        graph.invoke({"messages": [msg]}, {"configurable": {"thread_id": tag}}, durability="sync")
        out.append((time.perf_counter() - started) * 1000 / CALLS)
    return out


def child(base: str, pairs: int, steps: int) -> dict[str, dict[str, float]]:
    """Each configuration, its rows measured in turn (warmed up first)."""
    savers: dict[str, Any] = {}
    with ExitStack() as stack:
        for how in HOWS:
            savers[how] = stack.enter_context(open_saver(new_schema(base), how))
            claim_and_outcome(savers[how], 3)
            tool_steps(savers[how], 2)
        rows = ("pair", "call", "pair4")
        samples: dict[str, dict[str, list[float]]] = {h: {r: [] for r in rows} for h in HOWS}
        for _ in range(3):  # interleaved: a third of each row per configuration, in turn
            for how in HOWS:
                samples[how]["pair"] += claim_and_outcome(savers[how], pairs // 3)
                samples[how]["call"] += tool_steps(savers[how], steps // 3)
                samples[how]["pair4"] += claim_and_outcome_threads(savers[how], pairs // 6)
    return {
        how: {row: statistics.median(v) for row, v in rows.items()} for how, rows in samples.items()
    }


def run_child(tree: str | None, base: str, pairs: int, steps: int) -> dict[str, Any]:
    env = dict(os.environ)
    if tree is not None:  # its package first (run from a directory without one)
        env["PYTHONPATH"] = tree + os.pathsep + env.get("PYTHONPATH", "")
    else:
        env["PYTHONPATH"] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", base]
    cmd += ["--pairs", str(pairs), "--steps", str(steps)]
    done = subprocess.run(
        cmd, env=env, cwd=tempfile.gettempdir(), capture_output=True, text=True, check=True
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", help="a directory holding another langgraph_idem_saver")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pairs", type=int, default=30)
    parser.add_argument("--steps", type=int, default=9)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.pairs, args.steps)))
        return
    import pgserver

    server = pgserver.get_server(tempfile.mkdtemp(prefix="idem-bench-pg-"), cleanup_mode="delete")
    try:
        base = str(server.get_uri())
        trees: dict[str, str | None] = {"this": None}
        if args.against:
            trees = {"against": os.path.abspath(args.against), "this": None}
        results: dict[str, list[dict[str, Any]]] = {label: [] for label in trees}
        for r in range(args.rounds):
            order = list(trees) if r % 2 == 0 else list(reversed(trees))
            for label in order:
                results[label].append(run_child(trees[label], base, args.pairs, args.steps))
        report(results)
    finally:
        server.cleanup()


def report(results: dict[str, list[dict[str, Any]]]) -> None:
    span: Callable[[list[float]], str] = lambda v: f"{min(v):.2f}-{max(v):.2f}"  # noqa: E731
    print(f"{'tree':8} {'how':5} {'claim+outcome ms':>17} {'step ms/call':>13} {'4 threads':>11}")
    for label, runs in results.items():
        for how in HOWS:
            pairs, calls, four = ([run[how][r] for run in runs] for r in ("pair", "call", "pair4"))
            print(f"{label:8} {how:5} {span(pairs):>17} {span(calls):>13} {span(four):>11}")


if __name__ == "__main__":
    main()
