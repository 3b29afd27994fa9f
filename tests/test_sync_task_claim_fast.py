"""A sync ``idempotent_task`` claims from the caller's thread (``engine.prepare.
prepare_blocking``) and commits its outcome from there (``engine.finish.
finish_blocking``), and does what the claim and the outcome on the thread's private loop
(``run_private(engine.aprepare)``, ``run_private(engine.afinish)``) did.

The test runs the same flows twice in one process on a real database - SQLite file and
PostgreSQL - as shipped and with the earlier path forced, and compares the ledger rows
(every column but the owner, the clock's and the history's timestamps), what the flows
returned or raised, and what the hooks saw (``verify``, ``current_call()``). A fresh
call of the shipped run must run nothing on the private loop; a call that found an entry
(a replay, an unknown outcome for ``verify``) goes on there as before.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.func import entrypoint
from pg_server import fresh_dsn

from langgraph_idem_saver import NOT_APPLIED, current_call, task
from langgraph_idem_saver.engine import loops
from langgraph_idem_saver.engine.core import LedgerEngine
from langgraph_idem_saver.engine.types import Batch, Plan
from langgraph_idem_saver.task import idempotent_task

COLUMNS = (
    "scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id, "
    "status, attempts, replays, conflicts, result_type, result, error, adopted_by, "
    "position, occurrence"
)


class PrivateRuns:
    """How many times each thread ran its private loop (``loops.run_private``)."""

    def __init__(self) -> None:
        self.local = threading.local()

    def count(self) -> int:
        return int(getattr(self.local, "n", 0))

    def bump(self) -> None:
        self.local.n = self.count() + 1

    def around(self, door: Callable[..., Any], seen: list[tuple[str, int]]) -> Any:
        """``door`` counting its thread's private-loop runs into ``seen`` (its name and
        arguments, the count), whether it returns or raises."""

        @functools.wraps(door)
        def counted(*args: Any) -> Any:
            before = self.count()
            try:
                return door(*args)
            finally:
                seen.append((f"{door.__name__}{args}", self.count() - before))

        return counted


@pytest.fixture
def private_runs(monkeypatch: pytest.MonkeyPatch) -> PrivateRuns:
    runs = PrivateRuns()
    real = loops._private_loop

    def counted() -> Any:
        runs.bump()
        return real()

    monkeypatch.setattr(loops, "_private_loop", counted)
    return runs


@contextmanager
def sync_saver(backend: str, where: Any, name: str) -> Iterator[tuple[Any, Any]]:
    """A sync saver of ``backend`` on a fresh database, and what ``ledger_rows`` reads."""
    if backend == "sqlite":
        from langgraph_idem_saver import SqliteSaver

        db: Any = str(Path(where) / f"{name}.db")
        opened: Any = SqliteSaver.from_conn_string(db)
    else:
        from langgraph_idem_saver.postgres import PostgresSaver

        db = fresh_dsn(where)
        opened = PostgresSaver.from_conn_string(db)
    with opened as saver:
        yield saver, (backend, db)


def ledger_rows(db: tuple[str, Any]) -> list[tuple[Any, ...]]:
    """Every ledger row, every column but the owner and the clock's, and the actions of
    its history (``edited``, ``orchestrates``...; not their timestamps)."""
    backend, where = db
    query = f"SELECT {COLUMNS}, history FROM idem_tool_calls ORDER BY thread_id, tool_name, key"
    if backend == "sqlite":
        with sqlite3.connect(where) as read:
            found = read.execute(query).fetchall()
    else:
        import psycopg

        with psycopg.connect(where) as conn:
            found = conn.execute(query).fetchall()
    rows = []
    for *columns, history in found:
        events = json.loads(history) if isinstance(history, str) else history or []
        actions = tuple(e.get("action") for e in events if isinstance(e, dict))
        rows.append((*(bytes(v) if isinstance(v, memoryview) else v for v in columns), actions))
    return rows


def backend_where(backend: str, request: pytest.FixtureRequest) -> Any:
    if backend == "sqlite":
        return request.getfixturevalue("tmp_path")
    return request.getfixturevalue("pg_server_dsn")


def general_prepare(engine: LedgerEngine, batch: Batch, config: Any) -> None:
    """The earlier path: the whole preparation on the thread's private loop."""
    loops.run_private(engine.aprepare(batch, config))


def general_finish(engine: LedgerEngine, batch: Batch, plan: Plan, result: Any) -> Any:
    """The earlier path: the outcome on the thread's private loop."""
    return loops.run_private(engine.afinish(batch, plan, result))


class Unstorable:
    """A value the serializer refuses."""


def run_flows(
    backend: str, where: Any, name: str, runs: PrivateRuns
) -> tuple[list[tuple[Any, ...]], list[Any], list[tuple[str, int]]]:
    """The flows: fresh calls, nested calls, a replay, an unknown outcome ``verify``
    settles, a value the serializer refuses. What the ledger holds, what the flows and
    hooks saw, and each task call's private-loop runs."""
    seen: list[Any] = []
    doors: list[tuple[str, int]] = []
    effects: list[str] = []
    flaky_left = {"n": 1}

    def counted(wrapped: Any) -> Any:
        wrapped.func = runs.around(wrapped.func, doors)
        return wrapped

    @counted
    @idempotent_task
    def charge(invoice: str, amount: int = 10) -> str:
        effects.append(invoice)
        seen.append(("key", current_call().key))  # the hook sees its call
        return f"charged {invoice} {amount}"

    def verified(args: dict[str, Any]) -> Any:
        seen.append(("verify", args["invoice"]))
        return f"verified {args['invoice']}" if args["invoice"] in effects else NOT_APPLIED

    @counted
    @idempotent_task(verify=verified)
    def flaky(invoice: str) -> str:
        effects.append(invoice)
        if flaky_left["n"]:
            flaky_left["n"] -= 1
            raise RuntimeError("reply lost")
        return f"charged {invoice}"

    @counted
    @idempotent_task
    def outer(n: int) -> int:
        return int(charge(f"in-{n}").result() != "") + int(charge(f"in2-{n}").result() != "")

    @counted
    @idempotent_task
    def unstorable(n: int) -> Any:
        return Unstorable()

    with sync_saver(backend, where, name) as (saver, db):

        @entrypoint(checkpointer=saver)
        def pay(invoices: list[str]) -> list[str]:
            return [str(charge(i).result()) for i in invoices]

        @entrypoint(checkpointer=saver)
        def nest(n: int) -> int:
            return int(outer(n).result())

        @entrypoint(checkpointer=saver)
        def risky(invoice: str) -> str:
            return str(flaky(invoice).result())

        @entrypoint(checkpointer=saver)
        def store(n: int) -> Any:
            return unstorable(n).result()

        def invoke(flow: Any, arg: Any, thread: str) -> Any:
            try:
                return flow.invoke(arg, {"configurable": {"thread_id": thread}})
            except Exception as exc:  # what it raised, as seen
                return (type(exc).__name__, str(exc)[:60])

        with ThreadPoolExecutor(1) as caller:  # one thread, as a program's main thread
            for flow, arg, thread in [
                (pay, ["a", "b"], "t1"),  # fresh
                (pay, ["a", "c"], "t1"),  # a replayed, c fresh
                (nest, 1, "t2"),  # nested: outer marked once, inner calls fresh
                (risky, "r", "t3"),  # raised: unknown outcome
                (risky, "r", "t3"),  # found: verify settles it
                (store, 1, "t4"),  # refused by the serializer: abandoned, raised
            ]:
                seen.append(caller.submit(invoke, flow, arg, thread).result())
    seen.append(sorted(effects))
    return ledger_rows(db), seen, doors


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sync_task_fast_path_writes_what_the_private_loop_wrote(
    backend: str,
    request: pytest.FixtureRequest,
    private_runs: PrivateRuns,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    where = backend_where(backend, request)
    shipped = run_flows(backend, where, "shipped", private_runs)
    monkeypatch.setattr(task, "prepare_blocking", general_prepare)
    monkeypatch.setattr(task, "finish_blocking", general_finish)
    forced = run_flows(backend, where, "general", private_runs)

    rows, seen, doors = shipped
    assert rows == forced[0]
    assert seen == forced[1]
    assert len(rows) == 3 + 3 + 1 + 1  # t1 a b c; t2 outer and its two; t3 r; t4
    assert {(r[4], r[-1]) for r in rows if r[2] == "t2"} == {
        ("outer", ("orchestrates",)),  # marked once, before its first inner claim
        ("charge", ()),
    }
    assert {(r[2], r[4], r[9]) for r in rows} >= {
        ("t3", "flaky", "completed"),  # verify settled it
        ("t4", "unstorable", "issued"),  # abandoned: an unknown outcome, kept
    }
    assert ("verify", "r") in seen
    assert seen[-2][0] == "SerializationError"
    # shipped: a fresh call ran nothing on the private loop, claim and outcome alike
    assert doors == [
        ("charge('a',)", 0),
        ("charge('b',)", 0),
        ("charge('a',)", 2),  # found: the replay goes on on the private loop, answered there
        ("charge('c',)", 0),
        ("charge('in-1',)", 1),  # marks its caller, which orchestrates (once)
        ("charge('in2-1',)", 0),
        ("outer(1,)", 0),
        ("flaky('r',)", 1),  # raised: araised, on the private loop as before
        ("flaky('r',)", 2),  # found: verify settles it, answered there
        ("unstorable(1,)", 1),  # refused by the serializer: araised, then raised
    ]
    # forced: the earlier path, claim and outcome on the private loop every time
    assert [n for _, n in forced[2]] == [2, 2, 2, 2, 3, 2, 2, 2, 2, 2]
