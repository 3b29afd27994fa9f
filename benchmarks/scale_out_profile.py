#!/usr/bin/env python
"""Where one worker's agent turn goes: ``scale_out.py``'s worker, one process, profiled.

Runs ``--turns`` turns of each stack (``stock``, ``ours``, ``floor``: see scale_out.py;
``ours-before``: ours with each sibling call's claim made as before ``StepLookup.inert``,
a read and then the claim) in
this process, interleaved in blocks of ``--block`` turns so that a shared host's noise
falls on all of them, and prints per turn: the statements the worker sent (counted at
psycopg's cursor, by their first words), the transactions committed and WAL flushes (the
server's counters), the worker's CPU (``time.process_time``), and with ``--profile`` the
functions with the most own time and the package's functions with the most cumulative
time (cProfile over each stack's measured turns).

Usage::

    python benchmarks/scale_out_profile.py --turns 200 --profile
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import cProfile
import io
import os
import pstats
import re
import sys
import tempfile
import time
import uuid
from typing import Any

import psycopg

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale_out import new_schema, server_counts, set_up

STATEMENTS: collections.Counter[str] = collections.Counter()


def count_statements() -> None:
    """Count every statement a psycopg async cursor sends, by its first words."""
    execute, executemany = psycopg.AsyncCursor.execute, psycopg.AsyncCursor.executemany
    labels: dict[str, str] = {}

    def note(query: Any, n: int) -> None:
        text = query if isinstance(query, str) else str(getattr(query, "_obj", query))
        label = labels.get(text)
        if label is None:
            words = re.sub(r"\s+", " ", text).strip()
            if words.startswith("WITH u AS"):
                label = "claim (WITH u AS ... INSERT idem_tool_calls)"
            else:
                label = " ".join(words.split(" ")[:4])[:60]
            label = labels[text] = label
        STATEMENTS[label] += n

    async def counted(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        note(query, 1)
        return await execute(self, query, *args, **kwargs)

    async def counted_many(self: Any, query: Any, params: Any, *args: Any, **kw: Any) -> Any:
        params = list(params)
        note(query, len(params))
        return await executemany(self, query, params, *args, **kw)

    psycopg.AsyncCursor.execute = counted  # type: ignore[method-assign]
    psycopg.AsyncCursor.executemany = counted_many  # type: ignore[method-assign]


async def agent_of(stack: str, dsn: str, calls: int, stack_cm: Any) -> Any:
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, ToolMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool

    class Model(GenericFakeChatModel):
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

    middleware: list[Any] = []
    if stack.startswith("ours"):
        from langgraph_idem_saver.middleware import IdempotencyMiddleware
        from langgraph_idem_saver.postgres import AsyncPostgresSaver as Ours

        saver = await stack_cm.enter_async_context(Ours.from_conn_string(dsn))
        middleware.append(IdempotencyMiddleware())
    else:
        from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as Official

        saver = await stack_cm.enter_async_context(Official.from_conn_string(dsn))
        if stack == "floor":
            from floor_ledger import FloorLedgerMiddleware

            middleware.append(FloorLedgerMiddleware(saver))
    agent = create_agent(
        Model(messages=iter([])), tools=[noop], middleware=middleware, checkpointer=saver
    )
    return agent, saver


async def run(args: argparse.Namespace, base: str) -> None:
    import contextlib

    stacks = args.stacks.split(",")
    dsns = {stack: new_schema(base, stack.replace("-", "_")) for stack in stacks}
    await set_up(dsns)
    count_statements()
    from langgraph_idem_saver.engine import adoption

    sibling_keys = adoption.sibling_keys
    totals = {s: collections.Counter[str]() for s in stacks}
    profilers = {s: cProfile.Profile() for s in stacks}
    async with contextlib.AsyncExitStack() as cm:
        built = {s: await agent_of(s, dsns[s], args.calls, cm) for s in stacks}
        agents = {s: agent for s, (agent, _) in built.items()}

        async def flush() -> None:
            # a backend's counters reach the server's views once a second at most, or
            # 10 s after it went idle: each connection flushes its own now
            for _, saver in built.values():
                await saver.conn.execute("SELECT pg_stat_force_next_flush()")

        for s, agent in agents.items():  # warm: imports, prepared statements
            for i in range(5):
                await agent.ainvoke(
                    {"messages": [("user", "go")]}, {"configurable": {"thread_id": f"w{s}{i}"}}
                )
        done = 0
        while done < args.turns:
            for s, agent in agents.items():
                STATEMENTS.clear()
                await flush()
                before = server_counts(base)
                cpu, wall = time.process_time(), time.perf_counter()
                if args.profile:
                    profilers[s].enable()
                if s == "ours-before":  # A/B: each call of a message claimed as before
                    adoption.sibling_keys = lambda *a: frozenset()
                for _ in range(args.block):
                    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
                    await agent.ainvoke({"messages": [("user", "go")]}, config)
                profilers[s].disable()
                adoption.sibling_keys = sibling_keys
                cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
                await flush()
                after = server_counts(base)
                t = totals[s]
                t["turns"] += args.block
                t["cpu_us"] += int(cpu * 1e6)
                t["wall_us"] += int(wall * 1e6)
                # the before read's own two, the flushes' own one each
                t["commits"] += after[0] - before[0] - 2 - len(stacks)
                t["syncs"] += after[1] - before[1]
                STATEMENTS.pop("SELECT pg_stat_force_next_flush()", None)  # the flushes'
                for label, n in STATEMENTS.items():
                    t["stmt:" + label] += n
            done += args.block
    for s in stacks:
        t = totals[s]
        n = t["turns"]
        print(
            f"\n{s}: {n} turns; a turn: {t['wall_us'] / n / 1000:.1f} ms wall, "
            f"{t['cpu_us'] / n / 1000:.1f} ms worker CPU, {t['commits'] / n:.1f} transactions, "
            f"{t['syncs'] / n:.1f} WAL flushes, "
            f"{sum(v for k, v in t.items() if k.startswith('stmt:')) / n:.1f} statements:"
        )
        for k, v in sorted(t.items(), key=lambda kv: -kv[1]):
            if k.startswith("stmt:"):
                print(f"    {v / n:5.2f}  {k[5:]}")
    if args.profile:
        for s in stacks:
            turns = totals[s]["turns"]
            out = io.StringIO()
            stats = pstats.Stats(profilers[s], stream=out)
            stats.sort_stats("cumulative").print_stats(args.only, args.top)
            print(f"\ncProfile of {s} ({turns} turns; divide the times by it):")
            print(out.getvalue())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--block", type=int, default=20, help="turns of a stack in a row")
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--stacks", default="stock,ours,floor")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--only",
        default="langgraph_idem_saver|floor_ledger|middleware|postgres",
        help="a regex of the profiled functions to list (by cumulative time)",
    )
    parser.add_argument("--dsn", help="a PostgreSQL server (else a throwaway, durable one)")
    args = parser.parse_args()
    server = None
    base = args.dsn or os.environ.get("IDEM_SAVER_PG_DSN")
    if not base:
        import pgserver

        server = pgserver.get_server(
            tempfile.mkdtemp(prefix="idem-scale-pg-"), cleanup_mode="delete"
        )
        base = str(server.get_uri())
    try:
        asyncio.run(run(args, base))
    finally:
        if server is not None:
            server.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
