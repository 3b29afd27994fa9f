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

import sys
import uuid
from collections.abc import Callable
from types import FrameType
from typing import Any

from _harness import tool_call_message, tools_graph

Tracer = Callable[[FrameType, str, Any], Any]


def _counter() -> tuple[Tracer, Callable[[], tuple[int, int]]]:
    """A tracer counting bytecodes and Python calls, and a reader of its totals."""
    opcodes = 0
    calls = 0

    def local(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal opcodes
        if event == "opcode":
            opcodes += 1
        return local

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal calls
        calls += 1
        frame.f_trace_opcodes = True
        return local

    return tracer, lambda: (opcodes, calls)


async def step_bytecodes(saver: Any, kind: str, calls: int, steps: int) -> tuple[float, float]:
    """Bytecodes and Python calls per tool call of ``steps`` fresh steps of ``calls``
    parallel calls (``kind``: ``"stock"`` or ``"idem"``), after two untraced ones."""
    graph = tools_graph(kind, saver)

    async def step() -> None:
        tag = f"bc-{kind}-{uuid.uuid4().hex[:8]}"
        cfg = {"configurable": {"thread_id": tag}}
        await graph.ainvoke({"messages": [tool_call_message(calls, tag)]}, cfg, durability="sync")

    for _ in range(2):  # imports, caches and prepared statements warm
        await step()
    tracer, totals = _counter()
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
