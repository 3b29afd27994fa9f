#!/usr/bin/env python
"""Side-by-side benchmark of the *synchronous* savers: ``langgraph_idem_saver.SqliteSaver``
vs LangGraph's ``langgraph.checkpoint.sqlite.SqliteSaver`` (and, with ``--pg DSN``,
``PostgresSaver`` vs LangGraph's), called as ``graph.invoke`` calls them: from plain
threads, no event loop.

Ours runs the async saver on a private loop thread, so every call pays a thread hop
(what this benchmark shows next to the storage work). Both savers run in one process on
fresh databases, interleaved round by round (official, ours, ours, official, ...) so
machine noise hits both columns alike; the median per call is reported, speedup =
official / ours.

Usage::

    python benchmarks/bench_sync.py --quick              # smoke run, ~10-20 s
    python benchmarks/bench_sync.py                      # ~1 min
    python benchmarks/bench_sync.py --pg postgresql://... # also PostgreSQL (fresh schemas)
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from operator import add
from pathlib import Path
from typing import Annotated, Any

from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.graph import END, START, StateGraph
from typing_extensions import TypedDict

Opener = Callable[[], Any]


@contextmanager
def sqlite_savers(tmp: Path) -> Iterator[dict[str, Any]]:
    from langgraph.checkpoint.sqlite import SqliteSaver as Official

    from langgraph_idem_saver.sqlite import SqliteSaver as Ours

    with ExitStack() as stack:
        conns = {
            side: stack.enter_context(
                _closing(sqlite3.connect(tmp / f"{side}.db", check_same_thread=False))
            )
            for side in ("official", "ours")
        }
        official = Official(conns["official"])
        official.setup()
        ours = stack.enter_context(Ours(conns["ours"]))
        ours.setup()
        yield {"official": official, "ours": ours}


@contextmanager
def postgres_savers(base_dsn: str) -> Iterator[dict[str, Any]]:
    """Each side on a fresh schema of ``base_dsn`` (dropped after)."""
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver as Official
    from psycopg.conninfo import conninfo_to_dict, make_conninfo
    from psycopg.rows import dict_row

    from langgraph_idem_saver.postgres import PostgresSaver as Ours

    schemas = {side: f"bench_sync_{side}_{uuid.uuid4().hex[:8]}" for side in ("official", "ours")}
    options = conninfo_to_dict(base_dsn).get("options") or ""
    dsns = {
        side: make_conninfo(base_dsn, options=f"{options} -c search_path={schema}".strip())
        for side, schema in schemas.items()
    }
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with psycopg.connect(base_dsn, autocommit=True) as admin:
        for schema in schemas.values():
            admin.execute(f'CREATE SCHEMA "{schema}"')
        try:
            with ExitStack() as stack:
                official_conn = stack.enter_context(
                    psycopg.Connection.connect(dsns["official"], **kwargs)
                )
                official = Official(official_conn)
                official.setup()
                ours_conn = stack.enter_context(psycopg.Connection.connect(dsns["ours"], **kwargs))
                ours = stack.enter_context(Ours(ours_conn))
                ours.setup()
                yield {"official": official, "ours": ours}
        finally:
            for schema in schemas.values():
                admin.execute(f'DROP SCHEMA "{schema}" CASCADE')


@contextmanager
def _closing(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    try:
        yield conn
    finally:
        conn.close()


def messages(n: int, rng: random.Random) -> list[AIMessage]:
    words = ["invoice", "charge", "refund", "order", "ship", "customer", "total", "due"]
    return [
        AIMessage(" ".join(rng.choice(words) for _ in range(150)), id=f"m{i}") for i in range(n)
    ]


class Loop(TypedDict):
    count: int
    log: Annotated[list[str], add]


def loop_graph(steps: int) -> Any:
    def step(state: Loop) -> dict[str, Any]:
        return {"count": state["count"] + 1, "log": [f"step {state['count']}" + "x" * 180]}

    g = StateGraph(Loop)
    g.add_node("step", step)
    g.add_edge(START, "step")
    g.add_conditional_edges("step", lambda s: "step" if s["count"] < steps else END)
    return g


def interleave(
    savers: dict[str, Any], make: Callable[[str, Any], Callable[[], Any]], rounds: int, per: int
) -> dict[str, list[float]]:
    """Time ``per`` calls of each side per round, alternating the order every round."""
    samples: dict[str, list[float]] = {side: [] for side in savers}
    calls = {side: make(side, saver) for side, saver in savers.items()}
    for side in savers:  # warm-up
        for _ in range(3):
            calls[side]()
    order = list(savers)
    for r in range(rounds):
        for side in order if r % 2 == 0 else reversed(order):
            for _ in range(per):
                t0 = time.perf_counter()
                calls[side]()
                samples[side].append(time.perf_counter() - t0)
    return samples


def bench(savers: dict[str, Any], quick: bool) -> list[tuple[str, float, float]]:
    rng = random.Random(7)
    rounds, per = (4, 10) if quick else (10, 25)
    rows: list[tuple[str, float, float]] = []
    window = messages(20, rng)

    def putter(side: str, saver: Any) -> Callable[[], Any]:
        state: dict[str, Any] = {"parent": None, "n": 0, "versions": {}}

        def put() -> None:
            state["n"] += 1
            config = state["parent"] or {"configurable": {"thread_id": "w", "checkpoint_ns": ""}}
            checkpoint = empty_checkpoint()
            changed = ["count"] if state["n"] % 2 else ["count", "messages"]
            checkpoint["channel_values"] = {"count": state["n"], "messages": window}
            for ch in changed:
                state["versions"][ch] = saver.get_next_version(state["versions"].get(ch), None)
            checkpoint["channel_versions"] = dict(state["versions"])
            new = {ch: state["versions"][ch] for ch in changed}
            state["parent"] = saver.put(config, checkpoint, {"source": "loop"}, new)

        return put

    rows.append(
        ("put (messages every 2nd checkpoint)", *_medians(interleave(savers, putter, rounds, per)))
    )

    def getter(side: str, saver: Any) -> Callable[[], Any]:
        return lambda: saver.get_tuple({"configurable": {"thread_id": "w"}})

    rows.append(("get_tuple latest", *_medians(interleave(savers, getter, rounds, per))))

    def lister(side: str, saver: Any) -> Callable[[], Any]:
        return lambda: list(saver.list({"configurable": {"thread_id": "w"}}, limit=10))

    rows.append(("list (10 newest)", *_medians(interleave(savers, lister, rounds, per))))

    steps = 10
    builder = loop_graph(steps)
    graphs = {side: builder.compile(checkpointer=saver) for side, saver in savers.items()}
    runs = {side: 0 for side in savers}

    def invoker(side: str, saver: Any) -> Callable[[], Any]:
        def run() -> None:
            runs[side] += 1
            config: Any = {"configurable": {"thread_id": f"g{runs[side]}"}}
            out = graphs[side].invoke({"count": 0, "log": []}, config, durability="sync")
            assert out["count"] == steps

        return run

    g_rounds, g_per = (2, 3) if quick else (6, 5)
    rows.append(
        (
            f"graph.invoke ({steps}-step loop, durability=sync)",
            *_medians(interleave(savers, invoker, g_rounds, g_per)),
        )
    )
    return rows


def _medians(samples: dict[str, list[float]]) -> tuple[float, float]:
    return statistics.median(samples["official"]), statistics.median(samples["ours"])


def show(title: str, rows: list[tuple[str, float, float]]) -> None:
    print(f"\n{title}")
    print(f"| {'row':<48} | {'official':>10} | {'ours':>10} | speedup |")
    print(f"|{'-' * 50}|{'-' * 12}|{'-' * 12}|---------|")
    for name, official, ours in rows:
        print(
            f"| {name:<48} | {official * 1e6:>7.0f} µs | {ours * 1e6:>7.0f} µs | "
            f"{official / ours:>6.2f}× |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run")
    ap.add_argument("--pg", metavar="DSN", help="also PostgreSQL (in fresh schemas, dropped after)")
    args = ap.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="bench-sync-") as tmp,
        sqlite_savers(Path(tmp)) as savers,
    ):
        show("SQLite (sync, synchronous=FULL both)", bench(savers, args.quick))
    if args.pg:
        with postgres_savers(args.pg) as savers:
            show("PostgreSQL (sync)", bench(savers, args.quick))


if __name__ == "__main__":
    main()
