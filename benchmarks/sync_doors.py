"""The caller's CPU of the two single-call sync front doors, per call.

What: ``IdempotencyMiddleware.wrap_tool_call`` (a ``create_agent`` agent run with sync
``agent.invoke``) and the sync branch of ``idempotent_task`` (an ``entrypoint`` run with
``flow.invoke``), each a fresh call (a new thread id each run: claim, run, outcome).
For each door the thread CPU (``time.thread_time``) of the thread the door runs in,
from the door's entry to its return, less the CPU of what it wraps (the middleware's
``handler``, the task's body): the door's own work - keys, claim, outcome, and the
event-loop hops between them. Beside it, the process CPU a run (every thread: the
graph's, the ledger loop's) and the wall clock, to see work that moved rather than went.

Stacks: this package (``ours``) and, with ``--base DIR``, another copy of it importable
from ``DIR`` as ``lis_base`` (``base``: the package before a change, its imports
renamed; see ``benchmarks/sync_tool_step.py`` for the recipe), run in rotating order in
one process, on a SQLite file and on PostgreSQL (``--dsn``, else a throwaway server).

    python benchmarks/sync_doors.py --backends sqlite,pg --base /tmp/base

Measured 2026-11-28, a shared host (load average 5), 400 fresh calls a door and stack,
the door's thread CPU in µs a call, median: both doors claiming from the caller's thread
and committing the outcome from there (40d9383) against the private loop for both
(cf98b13): SQLite middleware 826 against 1585, task 647 against 1386; PostgreSQL
middleware 848 against 1669, task 707 against 1469. A run's process CPU (every thread)
moved by less than the noise (e.g. SQLite task 9.7 against 10.8 ms a run).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import itertools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.func import entrypoint


class Model(GenericFakeChatModel):
    """A scripted model, forever: one charge, then "done"."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Model:  # type: ignore[override]
        return self


def model() -> Model:
    call = {"name": "charge", "args": {"invoice": "x"}, "id": "call_1", "type": "tool_call"}
    turn = [AIMessage("", id="ai-1", tool_calls=[call]), AIMessage("done", id="ai-2")]
    return Model(messages=itertools.cycle(turn))


class Samples:
    """CPU of one door's calls: the door's own (less what it wraps), and the wrapped."""

    def __init__(self) -> None:
        self.door: list[float] = []
        self.inner = 0.0

    def inner_timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.inner += time.thread_time() - t0

        return timed

    def door_timed(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            self.inner = 0.0
            t0 = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.door.append(time.thread_time() - t0 - self.inner)

        return timed


def middleware_run(pkg: str, saver: Any) -> tuple[Callable[[], None], Samples]:
    base = importlib.import_module(f"{pkg}.middleware").IdempotencyMiddleware
    samples = Samples()

    class Timed(base):  # type: ignore[misc, valid-type]
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            timed = samples.door_timed(super().wrap_tool_call)
            return timed(request, samples.inner_timed(handler))

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        return f"charged {invoice}"

    agent = create_agent(
        model(), tools=[charge], middleware=[Timed(record_model=False)], checkpointer=saver
    )

    def run() -> None:
        cfg = {"configurable": {"thread_id": f"m-{uuid.uuid4().hex[:10]}"}}
        agent.invoke({"messages": [("user", "pay")]}, cfg)

    return run, samples


def task_run(pkg: str, saver: Any) -> tuple[Callable[[], None], Samples]:
    idempotent_task = importlib.import_module(f"{pkg}.task").idempotent_task
    samples = Samples()

    @samples.inner_timed
    def body(invoice: str) -> str:
        return f"charged {invoice}"

    @idempotent_task(name="charge")
    def charge(invoice: str) -> str:
        return body(invoice)

    charge.func = samples.door_timed(charge.func)

    @entrypoint(checkpointer=saver)
    def flow(invoice: str) -> str:
        return str(charge(invoice).result())

    def run() -> None:
        flow.invoke("x", {"configurable": {"thread_id": f"t-{uuid.uuid4().hex[:10]}"}})

    return run, samples


def open_saver(stack: ExitStack, pkg: str, backend: str, where: str) -> Any:
    if backend == "sqlite":
        saver_class = importlib.import_module(f"{pkg}.sqlite").SqliteSaver
    else:
        saver_class = importlib.import_module(f"{pkg}.postgres").PostgresSaver
    return stack.enter_context(saver_class.from_conn_string(where))


def measure(backend: str, labels: list[str], rounds: int, batch: int, dsn: str | None) -> None:
    with ExitStack() as stack:
        folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="idem-doors"))
        if backend == "sqlite":

            def where(label: str) -> str:
                return os.path.join(folder, f"{label}.db")
        else:
            sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
            from pg_server import fresh_dsn, throwaway_server

            server = dsn or throwaway_server("idem-doors").get_uri()

            def where(label: str) -> str:
                return fresh_dsn(server)

        pkgs = {"ours": "langgraph_idem_saver", "base": "lis_base"}
        runs: dict[tuple[str, str], tuple[Callable[[], None], Samples]] = {}
        for label in labels:
            saver = open_saver(stack, pkgs[label], backend, where(label))
            runs[("middleware", label)] = middleware_run(pkgs[label], saver)
            runs[("task", label)] = task_run(pkgs[label], saver)
        caller = stack.enter_context(ThreadPoolExecutor(1))  # no loop, as a program's thread
        for run, _ in runs.values():  # warm: imports, prepared statements, plans
            for _ in range(5):
                caller.submit(run).result()
        for _, samples in runs.values():
            samples.door.clear()
        process: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        wall: dict[tuple[str, str], list[float]] = {k: [] for k in runs}
        keys = list(runs)
        for r in range(rounds):
            for key in keys[r % len(keys) :] + keys[: r % len(keys)]:
                run = runs[key][0]
                cpu0, wall0 = time.process_time(), time.perf_counter()
                for _ in range(batch):
                    caller.submit(run).result()
                process[key].append((time.process_time() - cpu0) / batch * 1e6)
                wall[key].append((time.perf_counter() - wall0) / batch * 1e6)
        print(
            f"\n== {backend}: {rounds * batch} fresh calls a door and stack, "
            f"load average {os.getloadavg()[0]:.1f}"
        )
        print("µs a call, median [quartiles]: the door's thread CPU (less what it wraps);")
        print("a run's process CPU (every thread) and wall clock, medians of the rounds")
        for (door, label), (_, samples) in runs.items():
            door_us = [s * 1e6 for s in samples.door]
            q = statistics.quantiles(door_us, n=4)
            print(
                f"  {door:10} {label:5} door {statistics.median(door_us):6.0f} "
                f"[{q[0]:.0f}-{q[2]:.0f}]  process {statistics.median(process[(door, label)]):6.0f}"
                f"  wall {statistics.median(wall[(door, label)]):6.0f}"
            )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backends", default="sqlite,pg")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--batch", type=int, default=10, help="calls a door runs in a row")
    p.add_argument("--base", help="a folder holding another copy of the package as lis_base")
    p.add_argument("--dsn", help="a PostgreSQL server to use (default: a throwaway one)")
    args = p.parse_args()
    labels = ["ours"]
    if args.base:
        sys.path.insert(0, args.base)
        labels.append("base")
    for backend in args.backends.split(","):
        measure(backend, labels, args.rounds, args.batch, args.dsn)


if __name__ == "__main__":
    main()
