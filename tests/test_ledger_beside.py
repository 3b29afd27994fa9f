"""A ``ToolLedger`` beside a checkpointer that is not ours (docs/guarantees.md, "A ledger
beside any checkpointer").

Crash tests run ``tests/ledger_beside_worker.py`` as separate processes: the first is
killed (SIGKILL, by itself, right after the first charge's effect), a fresh one resumes
the thread. Checkpointers: LangGraph's own ``AsyncSqliteSaver`` (``SqliteSaver`` under
``graph.invoke``) and ``InMemorySaver`` (the fresh process has lost everything, as a
server without persistence after a restart). All three front doors; the ledger on a
SQLite file and on PostgreSQL; the same graphs without the ledger as the control that
shows the duplicate. The process-local restart (a new graph, checkpointer and ledger
object in the same process) runs in this process.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import ledger_beside_worker as worker
import pytest
import zygote
from effects_file import effects_of
from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from pg_server import fresh_dsn
from tool_node_helpers import ai_calls, tool_graph

from langgraph_idem_saver import (
    ConfigError,
    ConnectionClosedError,
    IdempotentToolNode,
    NotADatabaseError,
    ToolLedger,
)
from langgraph_idem_saver.ledger import CallStatus

WORKER = Path(worker.__file__)
DOORS = ["tool_node", "middleware", "task"]
CHECKPOINTERS = ["official_sqlite", "memory"]
ONCE = {"inv-1": 1, "inv-2": 1}
FINISHED = {
    "tool_node": "done: charged inv-1; charged inv-2",
    "middleware": "done: charged inv-1; charged inv-2",
    "task": ["charged inv-1", "charged inv-2"],
}


def run_phase(scenario: dict[str, Any], phase: str) -> tuple[int, dict[str, Any] | None, str]:
    proc = zygote.run(
        [sys.executable, str(WORKER), json.dumps({**scenario, "phase": phase})],
        capture_output=True,
        text=True,
        timeout=180,
    )
    lines = proc.stdout.strip().splitlines()
    payload = json.loads(lines[-1]) if proc.returncode == 0 and lines else None
    return proc.returncode, payload, proc.stderr[-3000:]


def kill_then_resume(tmp_path: Path, **scenario: Any) -> dict[str, Any]:
    """The run is killed inside the first charge; a fresh process resumes."""
    scenario = {
        "checkpoints": str(tmp_path / "checkpoints.db"),
        "effects": str(tmp_path / "effects"),
        "thread": "t1",
        **scenario,
    }
    code, _, err = run_phase(scenario, "run")
    assert code == -signal.SIGKILL, f"the run should have been killed in the tool: {err}"
    assert "inv-1" in effects_of(Path(scenario["effects"])), "killed after the effect"
    code, payload, err = run_phase(scenario, "resume")
    assert code == 0, err
    assert payload is not None
    return payload


def ledger_target(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        return fresh_dsn(request.getfixturevalue("pg_server_dsn"))
    return str(tmp_path / "ledger.db")


@pytest.mark.parametrize(
    ("door", "checkpointer", "ledger_backend"),
    list(itertools.product(DOORS, CHECKPOINTERS, ["sqlite", "postgres"])),
)
def test_killed_in_a_tool_beside_a_foreign_checkpointer_charges_once(
    tmp_path: Path,
    request: pytest.FixtureRequest,
    door: str,
    checkpointer: str,
    ledger_backend: str,
) -> None:
    resumed = kill_then_resume(
        tmp_path,
        door=door,
        checkpointer=checkpointer,
        mode="ours",
        ledger=ledger_target(ledger_backend, tmp_path, request),
    )
    assert dict(Counter(resumed["effects"])) == ONCE, "every invoice charged exactly once"
    assert resumed["outcome"] == FINISHED[door], "the thread finished as an uncrashed run"
    assert resumed["ledger"] == [["completed", "inv-1"], ["completed", "inv-2"]]


@pytest.mark.parametrize("door", DOORS)
def test_killed_beside_langgraphs_postgres_saver_in_the_same_schema_charges_once(
    tmp_path: Path, pg_server_dsn: str, door: str
) -> None:
    """LangGraph's ``AsyncPostgresSaver`` and the ledger in one schema (their tables do
    not meet: ours are ``idem_*``)."""
    dsn = fresh_dsn(pg_server_dsn)
    resumed = kill_then_resume(
        tmp_path,
        door=door,
        checkpointer="official_postgres",
        checkpoints=dsn,
        mode="ours",
        ledger=dsn,
    )
    assert dict(Counter(resumed["effects"])) == ONCE
    assert resumed["outcome"] == FINISHED[door]
    assert resumed["ledger"] == [["completed", "inv-1"], ["completed", "inv-2"]]


@pytest.mark.parametrize(("door", "checkpointer"), list(itertools.product(DOORS, CHECKPOINTERS)))
def test_sync_invoke_killed_in_a_tool_charges_once(
    tmp_path: Path, door: str, checkpointer: str
) -> None:
    """``graph.invoke`` with the ledger opened by ``with``; durability ``exit`` (the crash
    loses the model's message too: the resumed model asks again under new ids, and
    adoption reads LangGraph's sync ``SqliteSaver``, which has no async methods)."""
    resumed = kill_then_resume(
        tmp_path,
        door=door,
        checkpointer=checkpointer,
        mode="ours",
        ledger=str(tmp_path / "ledger.db"),
        sync=True,
        durability="exit",
    )
    assert dict(Counter(resumed["effects"])) == ONCE
    assert resumed["outcome"] == FINISHED[door]


@pytest.mark.parametrize(("door", "checkpointer"), list(itertools.product(DOORS, CHECKPOINTERS)))
def test_control_without_the_ledger_charges_twice(
    tmp_path: Path, door: str, checkpointer: str
) -> None:
    """The same graphs and crash without the ledger: the harness can see a duplicate."""
    resumed = kill_then_resume(tmp_path, door=door, checkpointer=checkpointer, mode="stock")
    charges = Counter(resumed["effects"])
    assert charges["inv-1"] == 2, f"the stock stack charges the killed call again: {charges}"
    assert resumed["outcome"] == FINISHED[door]


# --- a process-local restart beside InMemorySaver -------------------------------------------


def scenario_for(tmp_path: Path, door: str, mode: str) -> dict[str, Any]:
    return {
        "door": door,
        "checkpointer": "memory",
        "mode": mode,
        "ledger": str(tmp_path / "ledger.db"),
        "effects": str(tmp_path / "effects"),
        "thread": "t1",
    }


@pytest.mark.parametrize(("door", "mode"), list(itertools.product(DOORS, ["ours", "stock"])))
async def test_process_local_restart_after_a_tool_raised(
    tmp_path: Path, door: str, mode: str
) -> None:
    """The first charge raises after its effect; the graph, its InMemorySaver and the
    ledger object are then dropped (the checkpoints are lost) and new ones, built in
    the same process, get the same request on the same thread."""
    scenario = scenario_for(tmp_path, door, mode)
    with pytest.raises(ConnectionResetError):
        await worker.arun({**scenario, "phase": "run", "fail": "raise"})
    again = await worker.arun({**scenario, "phase": "resume"})
    charges = Counter(again["effects"])
    if mode == "ours":
        assert dict(charges) == ONCE, "verify found the charge: not sent again"
    else:
        assert charges["inv-1"] == 2, "the control charges again"
    assert again["outcome"] == FINISHED[door]


@pytest.mark.parametrize(("door", "mode"), list(itertools.product(DOORS, ["ours", "stock"])))
async def test_process_local_restart_after_the_run_finished(
    tmp_path: Path, door: str, mode: str
) -> None:
    """The run finished; its InMemorySaver is lost; the client sends the request again on
    the same thread: the ledger replays every charge, the control makes them again."""
    scenario = scenario_for(tmp_path, door, mode)
    first = await worker.arun({**scenario, "phase": "run", "fail": "none"})
    assert first["outcome"] == FINISHED[door]
    again = await worker.arun({**scenario, "phase": "resume"})
    charges = Counter(again["effects"])
    assert dict(charges) == (ONCE if mode == "ours" else {"inv-1": 2, "inv-2": 2})
    assert again["outcome"] == FINISHED[door]


# --- lifetime ------------------------------------------------------------------------------


@tool
def send(to: str) -> str:
    """Send a message."""
    return f"sent to {to}"


def send_graph(ledger: ToolLedger) -> Any:
    return tool_graph(IdempotentToolNode([send], ledger=ledger), InMemorySaver())


def send_input(call_id: str = "c1") -> dict[str, Any]:
    return {"messages": [HumanMessage("hi"), ai_calls(("send", {"to": "ann"}, call_id))]}


async def test_async_with_opens_on_the_running_loop_and_closes(tmp_path: Path) -> None:
    async with ToolLedger(str(tmp_path / "l.db")) as ledger:
        assert ledger.loop is asyncio.get_running_loop()
        out = await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
        assert out["messages"][-1].content == "sent to ann"
        [entry] = await ledger.alist_entries("t")
        assert entry.status is CallStatus.COMPLETED
    assert ledger.closed
    with pytest.raises(ConnectionClosedError):
        await ledger.alist_entries("t")


def test_with_opens_on_its_own_thread_for_sync_invoke(tmp_path: Path) -> None:
    with ToolLedger(str(tmp_path / "l.db")) as ledger:
        assert ledger.loop is not None and ledger.loop.is_running()
        out = send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
        assert out["messages"][-1].content == "sent to ann"
        again = send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
        assert again["messages"][-1].content == "sent to ann"
        [entry] = asyncio.run(ledger.alist_entries("t"))
        assert (entry.status, entry.replays) == (CallStatus.COMPLETED, 1)
    assert ledger.closed
    with pytest.raises(ConnectionClosedError):
        asyncio.run(ledger.alist_entries("t"))


def test_unopened_ledger_opens_on_first_use_sync(tmp_path: Path) -> None:
    """Built at import time (as a graph module the Agent Server loads), used as is."""
    ledger = ToolLedger.from_conn_string(str(tmp_path / "l.db"))
    assert ledger.loop is None
    out = send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
    assert out["messages"][-1].content == "sent to ann"
    assert ledger.loop is not None
    ledger.close()
    ledger.close()  # idempotent
    with pytest.raises(ConnectionClosedError):
        send_graph(ledger).invoke(send_input("c2"), {"configurable": {"thread_id": "t"}})


async def test_unopened_ledger_opens_on_first_use_async(tmp_path: Path) -> None:
    ledger = ToolLedger.from_conn_string(str(tmp_path / "l.db"))
    graph = send_graph(ledger)
    config = {"configurable": {"thread_id": "t"}}
    await asyncio.gather(
        graph.ainvoke(send_input("c1"), config),
        send_graph(ledger).ainvoke(send_input("c2"), {"configurable": {"thread_id": "u"}}),
    )
    assert [e.status for e in await ledger.alist_entries()] == [CallStatus.COMPLETED] * 2
    await ledger.aclose()
    with pytest.raises(ConnectionClosedError):
        await graph.ainvoke(send_input("c3"), config)


def test_the_ledger_is_no_checkpointer(tmp_path: Path) -> None:
    """It exposes the ledger only: no checkpoint method, no retention."""
    ledger = ToolLedger(str(tmp_path / "l.db"))
    assert not isinstance(ledger, BaseCheckpointSaver)
    for name in ("aget_tuple", "aput", "alist", "asweep", "sweep", "ttl"):
        assert not hasattr(ledger, name)


async def test_sqlite_ledger_syncs_every_commit(tmp_path: Path) -> None:
    """No checkpoint write shares its database to sync an outcome: each commit syncs."""
    async with ToolLedger(str(tmp_path / "l.db")) as ledger:
        saver = ledger._saver
        assert saver is not None
        assert saver.synchronous == "EXTRA"  # type: ignore[attr-defined]
        level = await saver._run(  # type: ignore[attr-defined]
            lambda c: c.execute("PRAGMA synchronous").fetchone()[0]
        )
        assert level == 3  # EXTRA


async def test_copy_and_delete_thread_carry_the_ledger_rows(tmp_path: Path) -> None:
    """The checkpointer copies or deletes a thread without this database: these do its
    ledger rows (a copied thread resumed mid-step then replays, never re-runs)."""
    async with ToolLedger(str(tmp_path / "l.db")) as ledger:
        await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "a"}})
        await ledger.acopy_thread("a", "b")
        [copied] = await ledger.alist_entries("b")
        assert copied.status is CallStatus.COMPLETED
        out = await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "b"}})
        assert out["messages"][-1].content == "sent to ann"
        assert (await ledger.alist_entries("b"))[0].replays == 1
        await ledger.adelete_thread("b")
        assert await ledger.alist_entries("b") == []
        assert len(await ledger.alist_entries("a")) == 1


async def test_no_import_warning_beside_langgraphs_tables(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """LangGraph's own saver and the ledger in one file: the ledger does not offer to
    import the checkpointer's threads (our saver on that file does: the control)."""
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as OfficialSaver

    from langgraph_idem_saver import AsyncSqliteSaver

    path = str(tmp_path / "shared.db")
    async with OfficialSaver.from_conn_string(path) as official, ToolLedger(path) as ledger:
        graph = tool_graph(IdempotentToolNode([send], ledger=ledger), official)
        await graph.ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
    caplog.set_level(logging.WARNING, logger="langgraph_idem_saver.import")
    async with ToolLedger(path) as ledger:
        assert len(await ledger.alist_entries("t")) == 1
    assert not [r for r in caplog.records if "import" in r.getMessage().lower()]
    async with AsyncSqliteSaver.from_conn_string(path):
        pass
    assert [r for r in caplog.records if "LangGraph's own checkpoint tables" in r.getMessage()]


# --- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "conn_string",
    [
        "",
        "   ",
        42,
        None,
        b"ledger.db",
        "redis://localhost:6379/0",
        "mongodb://localhost:27017",
        ":memory:",
        "file::memory:?cache=shared",
        "file:ledger?mode=memory",
        "ledger\x00.db",
    ],
)
def test_what_is_not_a_file_or_dsn_is_refused(conn_string: Any) -> None:
    with pytest.raises(ConfigError):
        ToolLedger(conn_string)


def test_bad_synchronous_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        ToolLedger(str(tmp_path / "l.db"), synchronous="OFF")  # type: ignore[arg-type]


async def test_bad_paths_are_typed_errors_when_it_opens(tmp_path: Path) -> None:
    with pytest.raises(ConfigError):
        await ToolLedger(str(tmp_path / "missing" / "l.db")).aopen()
    with pytest.raises(ConfigError):
        await ToolLedger(str(tmp_path)).aopen()
    not_sqlite = tmp_path / "notes.txt"
    not_sqlite.write_text("not a database, just some text that is long enough " * 40)
    with pytest.raises(NotADatabaseError):
        await ToolLedger(str(not_sqlite)).aopen()
    with pytest.raises(ConfigError):  # first use of an unopened one: the same error
        await ToolLedger(str(tmp_path / "missing" / "l.db")).alist_entries()
    assert not (tmp_path / "missing").exists()


async def test_bad_dsns_are_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="bad PostgreSQL connection string") as info:
        await ToolLedger("postgresql://u:secret@[::1").aopen()
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="bogus_option"):
        await ToolLedger("bogus_option=1 dbname=x").aopen()
    with pytest.raises(ConnectionClosedError):  # nothing listens on port 1
        await ToolLedger("postgresql://u@127.0.0.1:1/db?connect_timeout=2").aopen()


async def test_postgres_ledger_round_trip(pg_server_dsn: str) -> None:
    dsn = fresh_dsn(pg_server_dsn)
    assert ToolLedger(dsn).backend == "postgres"
    async with ToolLedger(dsn) as ledger:
        await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
        [entry] = await ledger.alist_entries("t")
        assert entry.status is CallStatus.COMPLETED


async def test_open_twice_and_reopen_after_close_are_refused(tmp_path: Path) -> None:
    ledger = ToolLedger(str(tmp_path / "l.db"))
    async with ledger:
        with pytest.raises(ConfigError):
            await ledger.aopen()
        with pytest.raises(ConfigError):
            ledger.open()
        with pytest.raises(ConfigError):  # opened on this loop: closed here, by aclose()
            ledger.close()
        assert not ledger.closed
    with pytest.raises(ConnectionClosedError):
        await ledger.aopen()
    with pytest.raises(ConnectionClosedError):
        ledger.open()


def test_a_closed_ledger_refuses_a_node(tmp_path: Path) -> None:
    """A front door given a closed ledger raises the typed error, and runs nothing."""
    ran: list[str] = []

    @tool
    def charge(invoice: str) -> str:
        """Charge."""
        ran.append(invoice)
        return "charged"

    ledger = ToolLedger(str(tmp_path / "l.db"))
    ledger.close()
    graph = tool_graph(IdempotentToolNode([charge], ledger=ledger), InMemorySaver())
    message = AIMessage(
        "",
        tool_calls=[{"name": "charge", "args": {"invoice": "i"}, "id": "c", "type": "tool_call"}],
    )
    with pytest.raises(ConnectionClosedError):
        graph.invoke({"messages": [message]}, {"configurable": {"thread_id": "t"}})
    assert ran == []


# --- what needs our checkpointer is refused -----------------------------------------------


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_a_sweep_on_the_ledgers_database_is_refused(
    tmp_path: Path, request: pytest.FixtureRequest, backend: str
) -> None:
    """Retention removes an entry once no checkpoint of its thread remains; a ledger's
    database holds none (they are in the other store), so a sweep there is refused and
    removes nothing, even run by a saver opened on that database by hand."""
    from langgraph_idem_saver import AsyncSqliteSaver, TTLConfig

    target = ledger_target(backend, tmp_path, request)
    async with ToolLedger(target) as ledger:
        await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
    opener: Any = AsyncSqliteSaver
    if backend == "postgres":
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    ttl = TTLConfig(after=timedelta(seconds=1))
    async with opener.from_conn_string(target) as saver:
        for dry_run in (True, False):
            with pytest.raises(ConfigError, match="ToolLedger"):
                await saver.asweep(time.time() + 86_400, ttl=ttl, dry_run=dry_run)
        assert len(await saver.alist_entries("t")) == 1
    if backend == "postgres":
        return
    other = str(tmp_path / "ours.db")
    async with AsyncSqliteSaver.from_conn_string(other) as saver:
        await send_graph_on(saver).ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
        await saver.aprune(["t"], strategy="delete")  # checkpoints gone, entries kept
        assert len(await saver.alist_entries("t")) == 1
        report = await saver.asweep(time.time() + 86_400, ttl=ttl)
        assert report.ledger_entries_deleted == 1, "the control: a saver's own sweep removes it"


def send_graph_on(saver: Any) -> Any:
    return tool_graph(IdempotentToolNode([send]), saver)


def test_cli_prune_older_than_on_a_ledger_database_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from langgraph_idem_saver.cli import main

    path = str(tmp_path / "ledger.db")
    with ToolLedger(path) as ledger:
        send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
    code = main(["--db", path, "prune", "--older-than", "1s", "--apply"])
    err = capsys.readouterr().err
    assert code != 0 and "ToolLedger" in err
    with ToolLedger(path) as ledger:
        assert len(asyncio.run(ledger.alist_entries("t"))) == 1


async def test_cli_pending_lists_the_ledgers_unknown_outcomes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's tools read a ledger's database as any of ours."""
    from langgraph_idem_saver.cli import main

    scenario = {**scenario_for(tmp_path, "tool_node", "ours"), "phase": "run", "fail": "raise"}
    with pytest.raises(ConnectionResetError):
        await worker.arun(scenario)
    code = await asyncio.to_thread(main, ["--db", scenario["ledger"], "pending", "--json"])
    out = capsys.readouterr().out
    assert code == 0
    pending = json.loads(out)
    rows = pending if isinstance(pending, list) else pending.get("entries", pending)
    assert "inv-1" in json.dumps(rows) and "ConnectionResetError" in json.dumps(rows)


def test_a_foreign_checkpointer_without_ledger_still_refuses(tmp_path: Path) -> None:
    from langgraph_idem_saver import NoLedgerError

    graph = tool_graph(IdempotentToolNode([send]), InMemorySaver())
    with pytest.raises(NoLedgerError):
        graph.invoke(send_input(), {"configurable": {"thread_id": "t"}})


async def test_history_of_a_sync_only_checkpointer_is_read_with_list(tmp_path: Path) -> None:
    """LangGraph's sync ``SqliteSaver`` has no async methods: adoption reads its ``list``
    in a thread; a checkpointer that can do neither raises, nothing is guessed."""
    from langgraph.checkpoint.sqlite import SqliteSaver

    from langgraph_idem_saver.engine.history import alist_saved

    config: Any = {"configurable": {"thread_id": "t"}}
    with SqliteSaver.from_conn_string(str(tmp_path / "cp.db")) as official:
        graph = tool_graph(ToolNode([send]), official)
        graph.invoke(send_input(), config)
        with pytest.raises(NotImplementedError):
            [t async for t in official.alist(config)]
        listed = [t async for t in alist_saved(official, config)]
        assert [t.checkpoint["id"] for t in listed] == [
            t.checkpoint["id"] for t in official.list(config)
        ]
        assert len(listed) >= 2
    memory = InMemorySaver()
    tool_graph(ToolNode([send]), memory).invoke(send_input(), config)
    assert len([t async for t in alist_saved(memory, config)]) == len(list(memory.list(config)))
    with pytest.raises(NotImplementedError):
        [t async for t in alist_saved(BaseCheckpointSaver(), config)]


CLOSES_AT_EXIT = """
import sys
from langchain_core.messages import AIMessage
from langgraph.checkpoint.memory import InMemorySaver
sys.path.insert(0, {tests!r})
from tool_node_helpers import tool_graph
from langchain_core.tools import tool
from langgraph_idem_saver import IdempotentToolNode, ToolLedger

@tool
def send(to: str) -> str:
    "Send."
    return "sent"

ledger = ToolLedger({path!r})
graph = tool_graph(IdempotentToolNode([send], ledger=ledger), InMemorySaver())
call = {{"name": "send", "args": {{"to": "a"}}, "id": "c1", "type": "tool_call"}}
config = {{"configurable": {{"thread_id": "t"}}}}
graph.invoke({{"messages": [AIMessage("", tool_calls=[call])]}}, config)
print("ran")
"""


def test_an_unclosed_ledger_is_closed_at_exit(tmp_path: Path) -> None:
    """Never closed by the program: its thread and connection end with the interpreter
    (SQLite removes its write-ahead log when the last connection closes)."""
    path = tmp_path / "l.db"
    script = CLOSES_AT_EXIT.format(tests=str(Path(__file__).parent), path=str(path))
    # fresh interpreters, not zygote children: their exit tears down every module, which a
    # zygote child skips for the preloaded ones (this package's among them)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0 and proc.stdout.strip() == "ran", proc.stderr[-2000:]
    assert path.exists() and not Path(f"{path}-wal").exists(), "closed: the WAL is gone"
    # the control: the same program leaving with os._exit closes nothing, and the WAL stays
    other = tmp_path / "l2.db"
    script = CLOSES_AT_EXIT.format(tests=str(Path(__file__).parent), path=str(other))
    proc = subprocess.run(
        [sys.executable, "-c", script + "import os; os._exit(0)\n"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0 and Path(f"{other}-wal").exists(), proc.stderr[-2000:]


def test_the_guarantees_section_names_tests_that_exist() -> None:
    """Each test ``docs/guarantees.md`` names for this section is defined here."""
    import ast
    import re

    doc = (Path(__file__).parents[1] / "docs" / "guarantees.md").read_text()
    section = doc.split("## A ledger beside any checkpointer", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`(tests/test_ledger_beside\w*\.py)::(\w+)`", section))
    defined = set()
    for file in {file for file, _ in named}:
        tree = ast.parse((Path(__file__).parents[1] / file).read_text())
        defined |= {
            (file, n.name)
            for n in tree.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
    assert len(named) >= 10 and named <= defined, sorted(named - defined)


async def test_an_encrypting_serializer_keeps_args_and_results_out_of_the_file(
    tmp_path: Path,
) -> None:
    """``serde=EncryptedSerializer(...)`` encrypts what the ledger records, as on our
    savers: neither the arguments nor the result are in the file in clear."""
    import sqlite3

    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    path = tmp_path / "l.db"
    async with ToolLedger(str(path), serde=serde) as ledger:
        out = await send_graph(ledger).ainvoke(send_input(), {"configurable": {"thread_id": "t"}})
        assert out["messages"][-1].content == "sent to ann"
        [entry] = await ledger.alist_entries("t")
        assert json.loads(entry.args) == {"to": "ann"}, "read back decrypted"
    with sqlite3.connect(path) as conn:
        rows = conn.execute("SELECT args, result FROM idem_tool_calls").fetchall()
    assert len(rows) == 1
    assert all(b"ann" not in bytes(value) for value in rows[0]), "nothing in clear"


def test_cli_threads_on_a_ledgers_database_finds_no_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from langgraph_idem_saver.cli import main

    path = str(tmp_path / "ledger.db")
    with ToolLedger(path) as ledger:
        send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
    assert main(["--db", path, "--json", "threads"]) == 0
    [thread] = json.loads(capsys.readouterr().out)["threads"]
    assert (thread["thread_id"], thread["status"]) == ("t", "empty")
    assert (thread["checkpoints"], thread["ledger_entries"]) == (0, 1)
    assert main(["--db", path, "--json", "ledger", "t"]) == 0
    assert "ann" in capsys.readouterr().out


def test_close_from_another_thread_closes_on_the_ledgers_loop(tmp_path: Path) -> None:
    """Opened with ``aopen`` on a loop another thread runs: ``close()`` from here closes it
    there (the connection belongs to that loop)."""
    import threading

    loop = asyncio.new_event_loop()
    runner = threading.Thread(target=loop.run_forever, daemon=True)
    runner.start()
    try:
        ledger = ToolLedger(str(tmp_path / "l.db"))
        asyncio.run_coroutine_threadsafe(ledger.aopen(), loop).result(30)
        assert ledger.loop is loop
        out = send_graph(ledger).invoke(send_input(), {"configurable": {"thread_id": "t"}})
        assert out["messages"][-1].content == "sent to ann", "sync invoke hops to that loop"
        ledger.close()
        assert ledger.closed
        with pytest.raises(ConnectionClosedError):
            asyncio.run(ledger.alist_entries())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        runner.join(10)
        loop.close()


async def test_ledgers_opening_together_on_a_fresh_postgres_schema(pg_server_dsn: str) -> None:
    """Workers starting at once: each marks the database, none fails on the race."""
    dsn = fresh_dsn(pg_server_dsn)
    ledgers = [ToolLedger(dsn) for _ in range(4)]
    await asyncio.gather(*(ledger.aopen() for ledger in ledgers))
    try:
        assert [await ledger.alist_entries() for ledger in ledgers] == [[]] * 4
    finally:
        await asyncio.gather(*(ledger.aclose() for ledger in ledgers))


@pytest.mark.parametrize("door", DOORS)
async def test_a_thread_deleted_from_both_starts_a_new_conversation(
    tmp_path: Path, door: str
) -> None:
    """The checkpointer forgot the thread on purpose and the ledger was told
    (``ledger.adelete_thread``): the same request on that thread id is a new one and
    runs. Not told, the ledger answers it from the old entries
    (``test_process_local_restart_after_the_run_finished``)."""
    scenario = scenario_for(tmp_path, door, "ours")
    first = await worker.arun({**scenario, "phase": "run", "fail": "none"})
    assert first["outcome"] == FINISHED[door]
    async with ToolLedger(scenario["ledger"]) as ledger:
        await ledger.adelete_thread("t1")
        assert [e for e in await ledger.alist_entries("t1") if e.tool_name == "charge"] == []
    again = await worker.arun({**scenario, "phase": "resume"})
    assert dict(Counter(again["effects"])) == {"inv-1": 2, "inv-2": 2}
    assert again["outcome"] == FINISHED[door]
