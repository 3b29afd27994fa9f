#!/usr/bin/env python
"""Several worker processes sharing one PostgreSQL: the safe stack against the stock one.

Each worker is a process of its own running a ``create_agent`` agent turn after turn,
each turn on a new thread: the model (a fake: the only fake) asks for ``--calls`` parallel
calls of a no-op tool, the tools run, the model answers. The stacks, each on its own
schema of the same server: ``ours`` (our ``AsyncPostgresSaver`` + ``IdempotencyMiddleware``:
every call claimed in the ledger before it runs), ``stock`` (LangGraph's
``AsyncPostgresSaver``, no middleware) and ``floor`` (stock + ``floor_ledger.py``: only the
writes the ledger protocol cannot do without - what any implementation of it pays).
Widths 1, 2, 4, 8 (``--widths``), the stacks at each width one after the other, each
worker for ``--seconds`` once all are started.

Per stack and width: throughput (turns/s over all workers; a turn is three supersteps:
model, tools, model), p50/p99 turn latency, claim conflicts (``idem_tool_calls.conflicts``
summed: must be 0 for distinct threads), the server connections seen at most during the
run, the transactions committed and WAL flushes a turn (the server's own counters), and
a PNG chart (``--png``) beside the printed table.

Usage::

    python benchmarks/scale_out.py                    # widths 1,2,4,8, 10 s each
    python benchmarks/scale_out.py --widths 1,2,4,8 --seconds 5 --rounds 4 --stacks stock,ours,floor
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
import threading
import time
import uuid
from typing import Any

import psycopg
from psycopg.conninfo import make_conninfo

# "ours-norecord": the middleware without recorded model responses (record_model=False):
# the tool ledger alone, to show what the model's records cost; "ours-saver": our saver
# without the middleware (no ledger): what the saver alone costs against LangGraph's;
# "floor": stock + the protocol's unavoidable writes alone (floor_ledger.py)
STACKS = ("stock", "ours", "floor")
ALL_STACKS = ("stock", "ours", "floor", "ours-norecord", "ours-saver")


# --- the worker (a process of its own) ------------------------------------------------


async def worker(dsn: str, stack: str, calls: int, seconds: float) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    class Model(GenericFakeChatModel):
        """Asks for ``calls`` parallel calls, then answers once their results are in."""

        def bind_tools(self, tools: Any, **kwargs: Any) -> Model:  # type: ignore[override]
            return self

        def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
            if isinstance(messages[-1], ToolMessage):
                message = AIMessage("done")
            else:
                turn = uuid.uuid4().hex[:8]
                message = AIMessage(
                    "",
                    tool_calls=[
                        {"name": "noop", "args": {"n": i}, "id": f"c{turn}{i}", "type": "tool_call"}
                        for i in range(calls)
                    ],
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

    @tool
    async def noop(n: int) -> str:
        """Does nothing."""
        return f"ok {n}"

    if stack.startswith("ours"):
        from langgraph_idem_saver.middleware import IdempotencyMiddleware
        from langgraph_idem_saver.postgres import AsyncPostgresSaver as Saver

        middleware: list[Any] = []
        if stack != "ours-saver":
            middleware.append(IdempotencyMiddleware(record_model=stack == "ours"))
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as Saver  # type: ignore[assignment]

        middleware = []
    latencies: list[float] = []
    async with Saver.from_conn_string(dsn) as saver:
        if stack == "floor":
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from floor_ledger import FloorLedgerMiddleware

            middleware = [FloorLedgerMiddleware(saver)]
        agent = create_agent(
            Model(messages=iter([])), tools=[noop], middleware=middleware, checkpointer=saver
        )
        tag = uuid.uuid4().hex[:8]
        await agent.ainvoke({"messages": [("user", "warm")]}, {"configurable": {"thread_id": tag}})
        print("ready", flush=True)
        sys.stdin.readline()  # go
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            config = {"configurable": {"thread_id": f"{tag}-{i}"}}
            out = await agent.ainvoke({"messages": [("user", "go")]}, config)
            assert out["messages"][-1].content == "done"
            latencies.append(time.perf_counter() - t0)
            i += 1
    return {"latencies": latencies}


# --- the driver --------------------------------------------------------------------


def new_schema(base: str, name: str) -> str:
    schema = f"scale_{name}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    return make_conninfo(base, options=f"-c search_path={schema}")


async def set_up(dsns: dict[str, str]) -> None:
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as Official

    from langgraph_idem_saver.postgres import AsyncPostgresSaver as Ours

    for stack, dsn in dsns.items():
        cls = Official if stack in ("stock", "floor") else Ours
        async with cls.from_conn_string(dsn) as saver:  # type: ignore[attr-defined]
            await saver.setup()
    if "floor" in dsns:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from floor_ledger import FLOOR_TABLES

        with psycopg.connect(dsns["floor"], autocommit=True) as conn:
            for statement in FLOOR_TABLES:
                conn.execute(statement)


def run_width(dsn: str, base: str, stack: str, width: int, args: argparse.Namespace) -> dict:
    """``width`` workers of ``stack`` at once; their latencies and the connections seen."""
    cmd = [sys.executable, __file__, "--worker", dsn, stack, str(args.calls), str(args.seconds)]
    procs = [
        subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        for _ in range(width)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        seen = [0]
        done = threading.Event()

        def watch() -> None:
            with psycopg.connect(base, autocommit=True) as conn:
                while not done.is_set():
                    row = conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE backend_type = "
                        "'client backend' AND datname = current_database()"
                    ).fetchone()
                    seen[0] = max(seen[0], int(row[0]) - 1 if row else 0)  # not ours
                    done.wait(0.2)

        watcher = threading.Thread(target=watch)
        before = server_counts(base)
        watcher.start()
        t0 = time.perf_counter()
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        results = [json.loads(p.communicate(timeout=args.seconds * 4 + 120)[0]) for p in procs]
        wall = time.perf_counter() - t0
        done.set()
        watcher.join()
        after = server_counts(base)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    lat = sorted(x for r in results for x in r["latencies"])
    return {
        "stack": stack,
        "width": width,
        "turns": len(lat),
        "turns_per_s": len(lat) / max(wall, args.seconds),
        "p50_ms": 1000 * statistics.median(lat),
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))],
        "connections": seen[0],
        # the server's work a turn (the watcher's own reads, 5 a second, included)
        "commits_per_turn": (after[0] - before[0]) / max(len(lat), 1),
        "wal_syncs_per_turn": (after[1] - before[1]) / max(len(lat), 1),
    }


def server_counts(base: str) -> tuple[int, int]:
    """Transactions committed in the database and WAL flushes of the server, so far."""
    with psycopg.connect(base, autocommit=True) as conn:
        commits = conn.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        syncs = conn.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()
    return int(commits[0]) if commits else 0, int(syncs[0]) if syncs else 0


def conflicts(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute("SELECT COALESCE(SUM(conflicts), 0) FROM idem_tool_calls").fetchone()
    return int(row[0]) if row else 0


def ratios_of(runs: list[dict[str, Any]], mine: list[dict[str, Any]], base: str) -> list[float]:
    """``mine``'s turns/s over ``base``'s, round by round (the two side by side)."""
    out = []
    for r in mine:
        at = (r["width"], r["round"], base)
        other = [o for o in runs if (o["width"], o["round"], o["stack"]) == at]
        if r["stack"] != base and other:
            out.append(r["turns_per_s"] / other[0]["turns_per_s"])
    return out


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row a width and stack: the medians of its rounds, and the median (and range)
    of the ratio to stock (and, for ``ours``, to floor) taken round by round (side by
    side on a shared host)."""
    rows = []
    for width, stack in dict.fromkeys((r["width"], r["stack"]) for r in runs):
        mine = [r for r in runs if r["width"] == width and r["stack"] == stack]
        row: dict[str, Any] = {"width": width, "stack": stack, "rounds": len(mine)}
        for key in ("turns_per_s", "p50_ms", "p99_ms", "commits_per_turn", "wal_syncs_per_turn"):
            row[key] = statistics.median(r[key] for r in mine)
        row["connections"] = max(r["connections"] for r in mine)
        found = [r["conflicts"] for r in mine if r["conflicts"] is not None]
        row["conflicts"] = sum(found) if found else None
        ratios = ratios_of(runs, mine, "stock")
        row["ratio"] = statistics.median(ratios) if ratios else None
        row["ratio_min"] = min(ratios) if ratios else None
        row["ratio_max"] = max(ratios) if ratios else None
        to_floor = ratios_of(runs, mine, "floor") if stack.startswith("ours") else []
        row["ratio_floor"] = statistics.median(to_floor) if to_floor else None
        row["ratio_floor_min"] = min(to_floor) if to_floor else None
        row["ratio_floor_max"] = max(to_floor) if to_floor else None
        rows.append(row)
    return rows


def chart(rows: list[dict], path: str, cores: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for stack in dict.fromkeys(r["stack"] for r in rows):
        mine = [r for r in rows if r["stack"] == stack]
        widths = [r["width"] for r in mine]
        (line,) = a.plot(widths, [r["turns_per_s"] for r in mine], marker="o", label=stack)
        color = line.get_color()  # one color a stack in both charts
        b.plot(widths, [r["p50_ms"] for r in mine], marker="o", color=color, label=f"{stack} p50")
        b.plot(
            widths,
            [r["p99_ms"] for r in mine],
            marker="x",
            linestyle="--",
            color=color,
            label=f"{stack} p99",
        )
    for ax in (a, b):
        ax.axvline(cores, color="grey", linestyle=":", label=f"{cores} cores")
        ax.set_xlabel("worker processes")
        ax.set_xticks(sorted({r["width"] for r in rows}))
        ax.legend()
    a.set_ylabel("agent turns / s (all workers)")
    b.set_ylabel("turn latency (ms)")
    fig.suptitle("create_agent workers sharing one PostgreSQL: ours (ledger), floor, stock")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        dsn, stack, calls, seconds = sys.argv[2:6]
        out = asyncio.run(worker(dsn, stack, int(calls), float(seconds)))
        print(json.dumps(out), flush=True)
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--widths", default="1,2,4,8")
    parser.add_argument("--calls", type=int, default=4, help="parallel tool calls a turn")
    parser.add_argument("--seconds", type=float, default=10.0, help="per worker, per run")
    parser.add_argument("--dsn", help="a PostgreSQL server (else a throwaway, durable one)")
    parser.add_argument("--png", default="scale_out.png")
    parser.add_argument("--stacks", default=",".join(STACKS), help=",".join(ALL_STACKS))
    parser.add_argument("--json", help="also write the rows here")
    parser.add_argument(
        "--rounds", type=int, default=1, help="runs a width, the stacks' order alternating"
    )
    args = parser.parse_args()
    server = None
    base = args.dsn or os.environ.get("IDEM_SAVER_PG_DSN")
    if not base:
        import pgserver

        server = pgserver.get_server(
            tempfile.mkdtemp(prefix="idem-scale-pg-"), cleanup_mode="delete"
        )
        base = str(server.get_uri())
    stacks = [st for st in args.stacks.split(",") if st in ALL_STACKS]
    runs: list[dict[str, Any]] = []
    try:
        for width in [int(w) for w in args.widths.split(",")]:
            for round_ in range(args.rounds):
                # fresh schemas per width and round; the stacks' order alternates
                dsns = {stack: new_schema(base, stack.replace("-", "_")) for stack in stacks}
                asyncio.run(set_up(dsns))
                for stack in stacks if round_ % 2 == 0 else stacks[::-1]:
                    row = run_width(dsns[stack], base, stack, width, args)
                    row["round"] = round_
                    row["conflicts"] = conflicts(dsns[stack]) if stack.startswith("ours") else None
                    runs.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    finally:
        if server is not None:
            server.cleanup()
    rows = summary(runs)
    cores = os.cpu_count() or 1
    print(
        f"\n{'width':>5} {'stack':<13} {'turns/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
        f"{'conns':>5} {'conflicts':>9} {'commits':>7} {'syncs':>5}  /stock (range)  /floor (range)"
    )
    for r in rows:
        ratio = ""
        if r["ratio"] is not None:
            ratio = f"{r['ratio']:.2f}x ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
        if r["ratio_floor"] is not None:
            ratio += f"  {r['ratio_floor']:.2f}x "
            ratio += f"({r['ratio_floor_min']:.2f}-{r['ratio_floor_max']:.2f})"
        conflicts_of = "" if r["conflicts"] is None else str(r["conflicts"])
        print(
            f"{r['width']:>5} {r['stack']:<13} {r['turns_per_s']:>8.1f} {r['p50_ms']:>8.1f} "
            f"{r['p99_ms']:>8.1f} {r['connections']:>5} {conflicts_of:>9} "
            f"{r['commits_per_turn']:>7.1f} {r['wal_syncs_per_turn']:>5.1f}  {ratio}"
        )
    print(f"host: {cores} cores, load average {os.getloadavg()[0]:.1f}")
    chart(rows, args.png, cores)
    if args.json:
        with open(args.json, "w") as f:
            out = {"rows": rows, "runs": runs, "cores": cores, "calls": args.calls}
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
