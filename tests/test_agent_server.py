"""``examples/agent-server`` on LangGraph's own server (``langgraph dev``), killed for real.

The server runs a copy of the example (its ``checkpointer.py``: our saver, SQLite or
PostgreSQL) with the test graphs of ``agent_server_graphs.py`` beside the example's
``agent``; the test talks to it with ``langgraph_sdk`` only. A tool (or the model, after
the tools returned) SIGKILLs the server's process group at the point under test: before
the charge, after it, after the tools returned; one call or two in parallel. The server
is started again on the same directory and every thread is finished as an SDK user
would (``agent_server_harness.afinish``):

* **the server re-runs the runs by itself** ("Retrying runs left running by a previous
  process"): the test waits for the server to save its runs as running before the kill;
* **the server forgot the threads** (it died before saving them, or runs in a new
  container): its saved state is deleted before the restart; the user creates the
  thread again with its id and resumes it from our checkpoints.

Every charge of ``ours`` (``create_agent`` + ``IdempotencyMiddleware``), ``node``
(``IdempotentToolNode``) and ``asking`` (no ``verify``: the user answers the interrupt)
happens exactly once and every thread ends; ``stock`` (``create_agent`` alone, on the
same server and saver) is the control and charges again. A second test runs the
example's ``agent`` and the ``task`` door unchanged, rolls a run back
(``multitask_strategy="rollback"``: the server cancels it and calls ``adelete_for_runs``:
the redo's charge is the first one's, never made again) and deletes a thread whose call
was cut off (``adelete_thread``: the unknown outcome stays in the ledger).
Every server process is gone when a test ends, however it ends.
"""

from __future__ import annotations

import asyncio
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from agent_server_harness import DevServer, ServerProject, afinish
from pg_server import fresh_dsn

from langgraph_idem_saver import AsyncSqliteSaver, CallStatus

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="langgraph-api needs Python >= 3.11"
)

POINTS = ("before_effect", "after_effect", "after_tools")
LEDGERED = ("ours", "node", "asking")


@dataclass(frozen=True)
class Scenario:
    graph: str
    crash: str
    calls: int
    durability: str = "async"
    thread_id: str = field(default_factory=lambda: str(uuid.uuid4()))

    @property
    def invoices(self) -> list[str]:
        tag = self.thread_id[:8]
        return [f"{tag}-a", f"{tag}-b"][: self.calls]

    @property
    def first_input(self) -> dict[str, Any]:
        return {"messages": [{"role": "user", "content": "pay " + " ".join(self.invoices)}]}

    def __str__(self) -> str:
        return f"{self.graph}/{self.crash}/{self.calls} call(s)/{self.durability}"


# the server saved the runs as running, and re-runs them by itself after the restart
RERUN_BY_SERVER = [
    *(Scenario(g, p, n) for g in ("ours", "stock") for p in POINTS for n in (1, 2)),
    Scenario("node", "after_effect", 2),
    Scenario("asking", "after_effect", 1),
    Scenario("ours", "after_effect", 2, "exit"),
    Scenario("stock", "after_effect", 1, "exit"),
]
# the server forgot the threads: the user starts them again on our checkpoints
FORGOTTEN = [
    *(Scenario("ours", p, n) for p in POINTS for n in (1, 2)),
    Scenario("node", "before_effect", 2),
    Scenario("stock", "after_effect", 2),
    Scenario("stock", "after_tools", 1),
]


@pytest.fixture
def db_env(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The example's database settings (its ``checkpointer.py`` reads them)."""
    if backend == "sqlite":
        return {"IDEM_SAVER_SQLITE": str(tmp_path / "server" / "agent.sqlite")}
    return {"IDEM_SAVER_POSTGRES_DSN": fresh_dsn(request.getfixturevalue("pg_server_dsn"))}


@pytest.fixture
def server(tmp_path: Path, db_env: dict[str, str]) -> Iterator[DevServer]:
    """A dev server on a copy of the example; its process group is SIGKILLed at the end
    however the test ends, and the test checks nothing of it is left."""
    dev = DevServer(ServerProject(tmp_path / "server", db_env))
    try:
        yield dev
    finally:
        dev.stop()
    assert not dev.group_alive(), "a server process outlived the test"


@asynccontextmanager
async def our_saver(db_env: dict[str, str]) -> AsyncIterator[Any]:
    """Our saver on the server's database, to read its ledger after the server stopped."""
    if "IDEM_SAVER_POSTGRES_DSN" in db_env:
        from langgraph_idem_saver import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(
            db_env["IDEM_SAVER_POSTGRES_DSN"]
        ) as pg_saver:
            yield pg_saver
    else:
        async with AsyncSqliteSaver.from_conn_string(db_env["IDEM_SAVER_SQLITE"]) as saver:
            yield saver


def provider_answer(project: ServerProject) -> Any:
    """How a user answers an unknown-outcome interrupt: ask the payment provider."""

    def answer(value: dict[str, Any]) -> dict[str, Any]:
        invoice = value["args"]["invoice"]
        named = {"key": value["key"], "attempt": value["attempt"]}
        if invoice in project.charges():
            return {**named, "action": "completed", "result": f"charged {invoice} $10"}
        return {**named, "action": "rerun"}

    return answer


async def start_parked(client: Any, server: DevServer, scenarios: list[Scenario]) -> None:
    """Start every scenario's run and wait until each stopped at its crash point."""
    for sc in scenarios:
        server.project.plan(sc.thread_id, crash=sc.crash, park=sc.invoices[-1])
        await client.threads.create(thread_id=sc.thread_id)
        await client.runs.create(
            sc.thread_id, sc.graph, input=sc.first_input, durability=sc.durability
        )
    await asyncio.to_thread(server.wait_parked, {sc.thread_id for sc in scenarios})


async def finish_all(client: Any, server: DevServer, scenarios: list[Scenario]) -> None:
    answer = provider_answer(server.project)
    await asyncio.gather(
        *(afinish(client, sc.thread_id, sc.graph, sc.first_input, answer) for sc in scenarios)
    )


async def check(client: Any, server: DevServer, scenarios: list[Scenario]) -> None:
    """Every thread ended with the answer of all its charges; every ledgered charge was
    made once; the control charged the call it was killed in (after its effect) again."""
    charges = Counter(server.project.charges())
    duplicates = []
    for sc in scenarios:
        thread = await client.threads.get(sc.thread_id)
        state = await client.threads.get_state(sc.thread_id)
        assert (thread["status"], state["next"], state["interrupts"]) == ("idle", [], []), sc
        last = state["values"]["messages"][-1]
        assert last["type"] == "ai", (str(sc), last)
        assert last["content"] == "; ".join(f"charged {i} $10" for i in sc.invoices), str(sc)
        counts = [charges[i] for i in sc.invoices]
        if sc.graph in LEDGERED:
            assert counts == [1] * sc.calls, f"{sc}: charged {counts}"
        else:
            assert all(c >= 1 for c in counts), f"{sc}: charged {counts}"
            duplicates += [i for i in sc.invoices if charges[i] > 1]
            if sc.crash == "after_effect":
                assert charges[sc.invoices[-1]] == 2, f"control {sc}: charged {counts}"
    assert duplicates, "the control showed no duplicate: the harness cannot see one"
    stock = [sc for sc in scenarios if sc.graph not in LEDGERED]
    twice = {sc for sc in stock if any(charges[i] > 1 for i in sc.invoices)}
    print(f"control: {len(twice)} of {len(stock)} stock scenarios charged twice")


async def check_ledger(db_env: dict[str, str], scenarios: list[Scenario]) -> None:
    """Our threads' ledgers: one settled (completed) entry per charge, none left open."""
    async with our_saver(db_env) as saver:
        for sc in scenarios:
            entries = await saver.alist_entries(sc.thread_id)
            if sc.graph in LEDGERED:
                assert [e.status for e in entries] == [CallStatus.COMPLETED] * sc.calls, sc
            else:
                assert entries == [], sc


async def test_server_killed_inside_a_tool_charges_each_invoice_once(
    server: DevServer, db_env: dict[str, str]
) -> None:
    from langgraph_sdk import get_client
    from langgraph_sdk.errors import NotFoundError

    started = time.monotonic()
    # first life: every scenario parks at its crash point; the server saves its runs as
    # running; a parked tool kills the server
    server.start()
    async with get_client(url=server.url) as client:
        await start_parked(client, server, RERUN_BY_SERVER)
        await asyncio.to_thread(server.wait_saved, time.time())
        server.kill_from_a_tool()
    # second life: the server re-runs them by itself; the user finishes what is left
    server.start()
    async with get_client(url=server.url) as client:
        asking = next(sc for sc in RERUN_BY_SERVER if sc.graph == "asking")
        runs = await client.runs.list(asking.thread_id)
        for run in runs:
            await client.runs.join(asking.thread_id, run["run_id"])
        runs = await client.runs.list(asking.thread_id)
        # the run the server re-ran stopped on our interrupt: the server calls it a
        # success, the thread is interrupted (README: look at the thread)
        assert [r["status"] for r in runs] == ["success"]
        assert (await client.threads.get(asking.thread_id))["status"] == "interrupted"
        await finish_all(client, server, RERUN_BY_SERVER)
        await check(client, server, RERUN_BY_SERVER)
        # the same life parks the next scenarios, and a tool kills it again
        await start_parked(client, server, FORGOTTEN)
        server.kill_from_a_tool()
    # third life: the server forgot every thread and run
    server.project.forget_server_state()
    server.start()
    async with get_client(url=server.url) as client:
        for sc in FORGOTTEN:
            with pytest.raises(NotFoundError):
                await client.threads.get(sc.thread_id)
        await finish_all(client, server, FORGOTTEN)
        await check(client, server, FORGOTTEN)
    server.stop()
    await check_ledger(db_env, RERUN_BY_SERVER + FORGOTTEN)
    print(f"server crash test: {time.monotonic() - started:.1f} s, {server.starts} starts")


async def test_server_rollback_and_thread_delete_never_charge_twice(
    server: DevServer, db_env: dict[str, str]
) -> None:
    """The example's ``agent`` and the ``task`` door run unchanged. A run cut off after
    its charge is rolled back by a second message (``multitask_strategy="rollback"``):
    the server cancels it and deletes it (``adelete_for_runs``); the second run asks for
    the same charge and gets the first one's (verified), where the control charges
    again. A thread deleted after a cut-off charge (``adelete_thread``) keeps that call's
    unknown outcome in the ledger."""
    from langgraph_sdk import get_client

    server.start(reload=True)  # the README's command, as it is
    project = server.project
    pay = {"messages": [{"role": "user", "content": "pay ex-1 ex-2"}]}
    async with get_client(url=server.url) as client:
        example = await client.threads.create()
        out = await client.runs.wait(example["thread_id"], "agent", input=pay)
        assert out["messages"][-1]["content"] == "charged ex-1 $10; charged ex-2 $10"
        # the server imports the checkpointer module under a name of its own: a graph
        # module that imported it would get a second copy (the example's docstring)
        names = await client.runs.wait(None, "modules", input={})
        assert names == {"checkpointer.py": ["__checkpointer"], "agent.py": ["__agent", "agent"]}
        flow = await client.threads.create()
        got = await client.runs.wait(flow["thread_id"], "task", input={"invoices": ["tk-1"]})
        assert got == ["charged tk-1 $10"]

        async def cut_off(graph: str, thread_id: str, invoice: str) -> dict[str, Any]:
            project.plan(thread_id, hang="after_effect")
            first = {"messages": [{"role": "user", "content": f"pay {invoice}"}]}
            await client.threads.create(thread_id=thread_id)
            run = await client.runs.create(thread_id, graph, input=first)
            for _ in range(600):
                if project.hung(thread_id):
                    return dict(run)
                await asyncio.sleep(0.05)
            raise AssertionError(f"{graph} never reached the charge: {server.log_tail()}")

        async def rolled_back(graph: str, invoice: str) -> None:
            thread_id = str(uuid.uuid4())
            await cut_off(graph, thread_id, invoice)
            again = {"messages": [{"role": "user", "content": f"pay {invoice}"}]}
            await client.runs.wait(thread_id, graph, input=again, multitask_strategy="rollback")
            runs = await client.runs.list(thread_id)
            assert len(runs) == 1, "the first run was rolled back (deleted)"
            state = await client.threads.get_state(thread_id)
            assert state["values"]["messages"][-1]["content"] == f"charged {invoice} $10"

        await rolled_back("ours", "rb-1")
        await rolled_back("stock", "rb-control")

        gone = str(uuid.uuid4())
        run = await cut_off("ours", gone, "del-1")
        await client.runs.cancel(gone, run["run_id"], wait=True)
        await client.threads.delete(gone)
    server.stop()
    charges = Counter(project.charges())
    assert charges == {
        "ex-1": 1,
        "ex-2": 1,
        "tk-1": 1,
        "rb-1": 1,
        "rb-control": 2,  # the control: the stock agent charges again
        "del-1": 1,  # charged, then the run was cancelled and its thread deleted
    }
    async with our_saver(db_env) as saver:
        # the cancelled call's charge landed: deleting the thread kept its unknown outcome
        # (a later identical call asks about it: tests/test_ledger_lifecycle.py)
        [entry] = await saver.alist_entries(gone)
        assert entry.status is CallStatus.ISSUED and "CancelledError" in (entry.error or "")
        assert [t async for t in saver.alist({"configurable": {"thread_id": gone}})] == []
        assert len(await saver.alist_entries(example["thread_id"])) == 2
        assert len(await saver.alist_entries(flow["thread_id"])) == 1


def test_the_dev_server_refuses_a_graph_compiled_with_a_checkpointer(tmp_path: Path) -> None:
    """Why the example's graph has no ``checkpointer=``: ``langgraph dev`` refuses to start
    with a graph that brings its own (the server gives graphs its checkpointer)."""
    project = ServerProject(
        tmp_path / "server",
        {"IDEM_SAVER_SQLITE": str(tmp_path / "agent.sqlite")},
        extra_graphs=("compiled_with_checkpointer",),
    )
    dev = DevServer(project)
    try:
        dev.start(wait=False)
        assert dev.wait_exit() != 0
    finally:
        dev.stop()
    assert "Heads up! Your graph 'compiled_with_checkpointer'" in dev.log_tail(400)
    assert "includes a custom checkpointer" in dev.log_tail(400)
    assert not dev.group_alive()


async def test_the_examples_checkpointer_sets_up_our_saver_with_a_ttl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``checkpointer.py`` yields our saver, its tables set up (the server never calls
    ``setup()``), with the thread TTL of ``$IDEM_SAVER_TTL_DAYS`` that ``asweep()``
    applies."""
    import importlib.util
    from datetime import timedelta

    from agent_server_harness import EXAMPLE

    monkeypatch.setenv("IDEM_SAVER_SQLITE", str(tmp_path / "agent.sqlite"))
    monkeypatch.setenv("IDEM_SAVER_TTL_DAYS", "30")
    monkeypatch.delenv("IDEM_SAVER_POSTGRES_DSN", raising=False)
    spec = importlib.util.spec_from_file_location(
        "example_checkpointer", EXAMPLE / "checkpointer.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with module.generate_checkpointer() as saver:
        assert isinstance(saver, AsyncSqliteSaver)
        assert saver.ttl is not None and saver.ttl.after == timedelta(days=30)
        assert await saver.alist_entries("nothing-yet") == []  # the tables exist
        report = await saver.asweep()
        assert report.threads_deleted == 0
