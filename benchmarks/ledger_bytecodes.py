"""The ledger's own Python, counted: bytecodes the event loop's thread runs per tool call.

Why count: the ledger rows' times move ±10-40% with this host's noise (its fsync most), so
a change of a few µs a call cannot be seen in them; a count of executed bytecodes can.
Each step runs with ``sys.settrace`` (``f_trace_opcodes``) on the loop's thread - our
``IdempotentToolNode`` and LangGraph's stock ``ToolNode``, both on our saver, so what is
left after the subtraction is the ledger's Python (the engine, the front door, the
ledger methods of the saver), not the checkpoint writes both stacks make. The database's
own work (aiosqlite's worker thread, the Postgres server) is not counted: the floor
(``ledger_floor.py``) is that. Deterministic up to the group commit's batching, which
timing decides (a few bytecodes a call). Compare two commits by running both; the count
of the stock stack shows how much LangChain and LangGraph spend per call beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

from _harness import tool_call_message, tools_graph

Tracer = Callable[[FrameType, str, Any], Any]


def _counter(
    by_code: Counter[CodeType] | None = None,
) -> tuple[Tracer, Callable[[], tuple[int, int]]]:
    """A tracer counting bytecodes and Python calls, and a reader of its totals; with
    ``by_code``, each bytecode is also filed under the code object that ran it."""
    opcodes = 0
    calls = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal opcodes
        if event == "opcode":
            opcodes += 1
            if by_code is not None:
                by_code[frame.f_code] += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal calls
        calls += 1
        frame.f_trace_opcodes = True
        return local

    return tracer, lambda: (opcodes, calls)


async def step_bytecodes(
    saver: Any, kind: str, calls: int, steps: int, by_code: Counter[CodeType] | None = None
) -> tuple[float, float]:
    """Bytecodes and Python calls per tool call of ``steps`` fresh steps of ``calls``
    parallel calls (``kind``: ``"stock"`` or ``"idem"``), after two untraced ones
    (with ``by_code``: the step's bytecodes filed under their code objects, summed)."""
    graph = tools_graph(kind, saver)

    async def step() -> None:
        tag = f"bc-{kind}-{uuid.uuid4().hex[:8]}"
        cfg = {"configurable": {"thread_id": tag}}
        await graph.ainvoke({"messages": [tool_call_message(calls, tag)]}, cfg, durability="sync")

    for _ in range(2):  # imports, caches and prepared statements warm
        await step()
    tracer, totals = _counter(by_code)
    sys.settrace(tracer)
    try:
        for _ in range(steps):
            await step()
    finally:
        sys.settrace(None)
    opcodes, pycalls = totals()
    return opcodes / steps / calls, pycalls / steps / calls


async def ledger_bytecodes(
    saver: Any, sizes: tuple[int, ...] = (1, 50), steps: int = 4
) -> dict[int, dict[str, float]]:
    """Per step size: bytecodes a call of the stock stack, of ours, and the ledger's
    (ours − stock), and the ledger's Python calls a call."""
    out: dict[int, dict[str, float]] = {}
    for calls in sizes:
        n = max(steps, 20 // calls)  # a lone call: more steps, the same order of work
        stock, stock_calls = await step_bytecodes(saver, "stock", calls, n)
        ours, ours_calls = await step_bytecodes(saver, "idem", calls, n)
        out[calls] = {
            "stock": stock,
            "ours": ours,
            "ledger": ours - stock,
            "ledger_calls": ours_calls - stock_calls,
        }
    return out


def _where(code: CodeType) -> str:
    """``module-ish path:function`` of a code object, short enough to print."""
    path = code.co_filename
    for mark in ("site-packages/", "langgraph_idem_saver/"):
        if mark in path:
            path = path.split(mark, 1)[1]
            break
    return f"{path}:{code.co_qualname}"


async def by_function(saver: Any, calls: int = 50, steps: int = 4) -> list[tuple[str, float]]:
    """Ours minus the stock stack, bytecodes a call filed by function (largest first):
    where the ledger's Python is spent."""
    stock: Counter[CodeType] = Counter()
    ours: Counter[CodeType] = Counter()
    await step_bytecodes(saver, "stock", calls, steps, stock)
    await step_bytecodes(saver, "idem", calls, steps, ours)
    diff: Counter[str] = Counter()
    for code, n in ours.items():
        diff[_where(code)] += n
    for code, n in stock.items():
        diff[_where(code)] -= n
    per = steps * calls
    return sorted(((k, v / per) for k, v in diff.items() if v), key=lambda kv: -abs(kv[1]))


async def _main(calls: int, steps: int, top: int) -> None:
    from langgraph_idem_saver import AsyncSqliteSaver

    with tempfile.TemporaryDirectory(prefix="ledger-bytecodes-") as tmp:
        async with AsyncSqliteSaver.from_conn_string(os.path.join(tmp, "ours.db")) as saver:
            await saver.setup()
            got = await ledger_bytecodes(saver, sizes=(1, calls), steps=steps)
            for n, c in got.items():
                print(
                    f"{n} call(s): stock {c['stock']:,.0f}, ours {c['ours']:,.0f}, "
                    f"ledger +{c['ledger']:,.0f} ({c['ledger_calls']:+.1f} Python calls)"
                )
            rows = await by_function(saver, calls, steps)
            print(f"the ledger's bytecodes a call of a {calls}-call step, by function:")
            for where, n in rows[:top]:
                print(f"{n:+9.1f}  {where}")
            print(f"{sum(n for _, n in rows):+9.1f}  (all)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--top", type=int, default=60, help="functions printed")
    args = parser.parse_args()
    asyncio.run(_main(args.calls, args.steps, args.top))
