"""The ``idem-saver`` command line, against databases filled by real graph runs.

Most cases call :func:`langgraph_idem_saver.cli.main` in-process (capsys); a few go
through ``python -m langgraph_idem_saver`` in a subprocess, as a user would. Every
database is filled by :func:`fill`, which takes any saver: parametrized over
:data:`CLI_BACKENDS` (conftest's ``BACKENDS``; Postgres too when a server can be had).
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import os
import shlex
import shutil
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import zygote
from conftest import BACKENDS, REPO_ROOT
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from tool_node_helpers import ai_calls, cfg, intent_for, plant_completed, tool_graph
from unprivileged import listing, make_writable_again, os_refuses_write, run_unprivileged

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode
from langgraph_idem_saver.cli import (
    checkpoint_time,
    diff_messages,
    head_status,
    is_postgres_target,
    main,
    parse_when,
    redact_dsn,
)
from langgraph_idem_saver.demo import ScriptedModel
from langgraph_idem_saver.owners import make_owner

try:
    from pg_server import afresh_dsn, postgres_available
except ImportError:  # pragma: no cover - psycopg not installed
    afresh_dsn = None

    def postgres_available() -> bool:
        return False


# Postgres runs here as soon as a server can be had, whether or not conftest lists it yet.
CLI_BACKENDS = list(dict.fromkeys([*BACKENDS, *(["postgres"] if postgres_available() else [])]))

UNKNOWN_CALL = {"name": "charge", "args": {"invoice": "inv-9", "amount": 9}, "id": "call_u"}
LEDGER_ONLY_CALL = {"name": "charge", "args": {"invoice": "inv-0", "amount": 1}, "id": "call_0"}


# --- filling a database -------------------------------------------------------------------


@dataclass
class Facts:
    """What :func:`fill` put in the database, for the assertions."""

    target: str = ""
    unknown_key: str = ""
    done_keys: list[str] = field(default_factory=list)
    checkpoints: dict[str, int] = field(default_factory=dict)
    done_head: str = ""
    done_first_tools: str = ""  # the checkpoint after the model asked for the tools


def dead_owner() -> str:
    """An owner string naming a process of this host that has exited."""
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    host, _, nonce = make_owner().split(":")
    return f"{host}:{child.pid}:{nonce}"


@tool
def charge(invoice: str, amount: int) -> str:
    """Charge the customer's card for an invoice."""
    return f"charged {invoice}: ${amount}"


async def fill(saver: Any) -> Facts:
    """Four threads, through real graph runs on ``saver`` (any backend):

    * ``t-done``: a ReAct agent paid two invoices and answered (ledger: 2 completed);
    * ``t-pending``: the same agent stopped before its tools step (``interrupt_before``);
    * ``t-unknown``: a tool node met a call whose process died (an unknown outcome) and
      interrupted to ask a human;
    * ``t-ledger-only``: a completed ledger entry and no checkpoint.
    """
    facts = Facts()
    model = ScriptedModel(
        calls=[{"invoice": "inv-1", "amount": 100}, {"invoice": "inv-2", "amount": 200}]
    )
    agent = create_react_agent(model, IdempotentToolNode([charge]), checkpointer=saver)
    await agent.ainvoke({"messages": [HumanMessage("pay my invoices")]}, cfg("t-done"))
    stopped = create_react_agent(
        model, IdempotentToolNode([charge]), checkpointer=saver, interrupt_before=["tools"]
    )
    await stopped.ainvoke({"messages": [HumanMessage("pay them")]}, cfg("t-pending"))

    [outcome] = await saver.aclaim(
        [intent_for("t-unknown", UNKNOWN_CALL, checkpoint_ns="tools:x")],
        owner=dead_owner(),
        lease_seconds=3600,
    )
    facts.unknown_key = outcome.entry.key
    graph = tool_graph(IdempotentToolNode([charge]), saver)
    await graph.ainvoke(
        {"messages": [ai_calls(("charge", UNKNOWN_CALL["args"], "call_u"))]}, cfg("t-unknown")
    )
    await plant_completed(
        saver,
        intent_for("t-ledger-only", LEDGER_ONLY_CALL),
        ToolMessage("charged inv-0", tool_call_id="call_0"),
    )

    facts.done_keys = [e.key for e in await saver.alist_entries("t-done")]
    for thread in ("t-done", "t-pending", "t-unknown"):
        history = [t async for t in saver.alist(cfg(thread))]
        facts.checkpoints[thread] = len(history)
    history = [t async for t in saver.alist(cfg("t-done"))]
    facts.done_head = history[0].config["configurable"]["checkpoint_id"]
    for tup in history:  # newest first: the first with a pending tools step, from the end
        messages = tup.checkpoint["channel_values"].get("messages", [])
        if messages and isinstance(messages[-1], AIMessage) and messages[-1].tool_calls:
            facts.done_first_tools = tup.config["configurable"]["checkpoint_id"]
    return facts


@asynccontextmanager
async def open_backend(backend: str, target: str) -> AsyncIterator[Any]:
    if backend == "sqlite":
        async with AsyncSqliteSaver.from_conn_string(target) as saver:
            yield saver
    elif backend == "postgres":
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        async with AsyncPostgresSaver.from_conn_string(target) as saver:
            yield saver
    else:  # pragma: no cover
        raise ValueError(backend)


async def new_target(backend: str, directory: Path) -> str:
    """A new, empty database of ``backend``: a file path, or a DSN of a fresh schema."""
    if backend == "sqlite":
        return str(directory / f"cli-{uuid.uuid4().hex[:8]}.sqlite")
    assert afresh_dsn is not None
    return await afresh_dsn()


def make_filled(backend: str, directory: Path) -> Facts:
    async def go() -> Facts:
        target = await new_target(backend, directory)
        async with open_backend(backend, target) as saver:
            facts = await fill(saver)
        facts.target = target
        return facts

    return asyncio.run(go())


@pytest.fixture(autouse=True)
def wide_output(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables as wide as the rows (the width of captured output is COLUMNS, which a
    parallel test runner may set to 80): the assertions read whole cells."""
    monkeypatch.setenv("COLUMNS", "200")


@pytest.fixture(scope="module", params=CLI_BACKENDS)
def filled(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Facts:
    """One filled database per backend, shared by the tests that only read it."""
    return make_filled(request.param, tmp_path_factory.mktemp("cli"))


@pytest.fixture
def fresh(filled: Facts, tmp_path: Path) -> Facts:
    """A filled database of the same backend that a test may change."""
    if is_postgres_target(filled.target):
        return make_filled("postgres", tmp_path)
    copy = tmp_path / "copy.sqlite"
    shutil.copyfile(filled.target, copy)
    return Facts(**{**filled.__dict__, "target": str(copy)})


@pytest.fixture
def sqlite_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Facts]:
    """A filled SQLite database (file-specific cases)."""
    yield make_filled("sqlite", tmp_path_factory.mktemp("cli-sqlite"))


# --- running the CLI ----------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys: pytest.CaptureFixture[str], db: str, *argv: str) -> Any:
    code, out, err = run(capsys, "--db", db, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def run_module(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [sys.executable, "-m", "langgraph_idem_saver", *argv],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=120,
    )


def digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


# --- the read commands --------------------------------------------------------------------


def test_threads_status_counts_and_unknowns(
    filled: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    doc = run_json(capsys, filled.target, "threads")
    by_id = {t["thread_id"]: t for t in doc["threads"]}
    assert set(by_id) == {"t-done", "t-pending", "t-unknown", "t-ledger-only"}
    assert set(doc["threads"][0]) == {
        "thread_id",
        "checkpoints",
        "subgraph_checkpoints",
        "last_checkpoint_id",
        "updated_at",
        "status",
        "next",
        "ledger_entries",
        "unknown_outcomes",
    }
    assert [(by_id[t]["status"], by_id[t]["unknown_outcomes"]) for t in sorted(by_id)] == [
        ("done", 0),
        ("empty", 0),
        ("pending", 0),
        ("interrupted", 1),
    ]
    assert by_id["t-unknown"]["next"] == ["tools"]
    assert by_id["t-pending"]["next"], "a resume would run the tools step"
    for thread, n in filled.checkpoints.items():
        assert by_id[thread]["checkpoints"] == n
    assert by_id["t-done"]["last_checkpoint_id"] == filled.done_head
    assert by_id["t-done"]["ledger_entries"] == 2
    updated = datetime.fromisoformat(by_id["t-done"]["updated_at"])
    assert abs(updated - datetime.now(timezone.utc)) < timedelta(minutes=10)

    code, out, _ = run(capsys, "--db", filled.target, "threads")
    assert code == 0
    assert "interrupted" in out and "t-ledger-only" in out


def test_history_newest_first_with_limit(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, filled.target, "history", "t-done")
    assert doc["total"] == filled.checkpoints["t-done"] == len(doc["checkpoints"])
    steps = [c["step"] for c in doc["checkpoints"]]
    assert steps == sorted(steps, reverse=True) and steps[-1] == -1
    assert doc["checkpoints"][0]["checkpoint_id"] == filled.done_head
    assert doc["checkpoints"][-1]["source"] == "input"
    chain = doc["checkpoints"]
    assert all(
        a["parent_checkpoint_id"] == b["checkpoint_id"] for a, b in itertools.pairwise(chain)
    )
    limited = run_json(capsys, filled.target, "history", "t-done", "--limit", "2")
    assert len(limited["checkpoints"]) == 2 and limited["total"] == doc["total"]
    code, out, _ = run(capsys, "--db", filled.target, "history", "t-done", "--limit", "2")
    assert code == 0 and "newest 2 shown" in out


def test_show_decodes_messages(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, filled.target, "show", "t-done")
    assert doc["checkpoint_id"] == filled.done_head and doc["status"] == "done"
    messages = doc["channels"]["messages"]
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["args"] for c in messages[1]["tool_calls"]] == [
        {"invoice": "inv-1", "amount": 100},
        {"invoice": "inv-2", "amount": 200},
    ]
    assert messages[2]["content"] == "charged inv-1: $100"
    assert messages[2]["tool_call_id"] == messages[1]["tool_calls"][0]["id"]
    assert not any(k.startswith("branch:") for k in doc["channels"])

    # an older checkpoint, by a unique prefix of its id
    older = run_json(
        capsys, filled.target, "show", "t-done", "--checkpoint", filled.done_first_tools[:20]
    )
    assert older["checkpoint_id"] == filled.done_first_tools
    assert [m["role"] for m in older["channels"]["messages"]] == ["user", "assistant"]
    assert older["status"] == "pending" and older["next"] == ["tools"]

    code, out, _ = run(capsys, "--db", filled.target, "show", "t-done")
    assert code == 0
    assert "assistant" in out and "charge(" in out and "charged inv-2" in out


def test_show_an_interrupted_thread(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, filled.target, "show", "t-unknown")
    assert doc["status"] == "interrupted"
    [write] = [w for w in doc["pending_writes"] if w["channel"] == "__interrupt__"]
    assert filled.unknown_key in json.dumps(write["value"])


def test_diff_reports_appended_messages(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(
        capsys,
        filled.target,
        "diff",
        "t-done",
        "--from",
        filled.done_first_tools,
        "--to",
        filled.done_head[:20],
    )
    assert (doc["from"], doc["to"]) == (filled.done_first_tools, filled.done_head)
    appended = doc["messages"]["messages"]["appended"]
    assert [m["role"] for m in appended] == ["tool", "tool", "assistant"]
    assert doc["messages"]["messages"]["removed"] == []
    assert doc["added"] == {} and doc["removed"] == [] and doc["changed"] == {}
    # default: the latest checkpoint against its parent
    last = run_json(capsys, filled.target, "diff", "t-done")
    assert last["to"] == filled.done_head
    assert [m["content"] for m in last["messages"]["messages"]["appended"]] == [
        "done: 2 tool results"
    ]
    code, out, _ = run(capsys, "--db", filled.target, "diff", "t-done")
    assert code == 0 and "1 appended" in out


def test_ledger_lists_every_call(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, filled.target, "ledger", "t-done")
    entries = doc["entries"]
    assert [e["key"] for e in entries] == filled.done_keys
    assert [e["state"] for e in entries] == ["completed", "completed"]
    assert [e["args"] for e in entries] == [
        {"invoice": "inv-1", "amount": 100},
        {"invoice": "inv-2", "amount": 200},
    ]
    assert entries[0]["result"] == "charged inv-1: $100"
    assert entries[0]["key_short"] == entries[0]["key"][:12]
    assert entries[0]["attempts"] == 1 and entries[0]["replays"] == 0
    assert entries[0]["finished_at"] >= entries[0]["issued_at"]
    assert run_json(capsys, filled.target, "ledger", "t-done", "--agent", "tools")["entries"]
    assert run_json(capsys, filled.target, "ledger", "t-done", "--agent", "nope")["entries"] == []
    assert run_json(capsys, filled.target, "ledger", "t-pending")["entries"] == []

    code, out, _ = run(capsys, "--db", filled.target, "ledger", "t-done")
    assert code == 0 and filled.done_keys[0][:12] in out and "completed" in out


def backend_of(target: str) -> str:
    return "postgres" if is_postgres_target(target) else "sqlite"


def test_ledger_agent_matches_the_agent_and_paths_under_it(
    fresh: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--agent researcher`` lists the calls of ``researcher|tools`` (a new user saw "no
    ledger entries" there), never those of ``researcher2`` or a mere name prefix."""
    nested = {**LEDGER_ONLY_CALL, "id": "call_r"}
    other = {**LEDGER_ONLY_CALL, "id": "call_r2"}

    async def plant() -> list[str]:
        async with open_backend(backend_of(fresh.target), fresh.target) as saver:
            keys = []
            for call, ns in ((nested, "researcher:a|tools:b"), (other, "researcher2:c|tools:d")):
                entry = await plant_completed(
                    saver,
                    intent_for("t-done", call, checkpoint_ns=ns),
                    ToolMessage("done", tool_call_id=call["id"]),
                )
                keys.append(entry.key)
            return keys

    nested_key, other_key = asyncio.run(plant())
    for agent in ("researcher", "researcher|tools"):
        doc = run_json(capsys, fresh.target, "ledger", "t-done", "--agent", agent)
        assert [(e["key"], e["agent_path"]) for e in doc["entries"]] == [
            (nested_key, "researcher|tools")
        ], agent
    assert (
        run_json(capsys, fresh.target, "ledger", "t-done", "--agent", "research")["entries"] == []
    )
    doc = run_json(capsys, fresh.target, "ledger", "t-done", "--agent", "researcher2")
    assert [e["key"] for e in doc["entries"]] == [other_key]

    code, out, _ = run(capsys, "--db", fresh.target, "ledger", "t-done", "--agent", "nope")
    assert code == 0
    assert "no ledger entries of agent 'nope'" in out
    assert "researcher|tools" in out and "researcher2|tools" in out, "where the entries are"


def test_ledger_table_shows_the_agent_path(
    filled: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (["ledger", "t-done"], ["pending"]):
        code, out, _ = run(capsys, "--db", filled.target, *argv)
        header = next(line for line in out.splitlines() if " key " in line)
        assert code == 0 and " agent " in header, argv
        assert " tools " in out, "the tool node's agent path"


def test_threads_and_history_count_the_same_checkpoints(
    fresh: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    """A graph with a subgraph: ``threads`` counts the root checkpoints that ``history``
    lists, and shows the subgraph's apart (a new user saw 8 against 3)."""
    from langgraph.graph import START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict):
        n: int

    def bump(state: State) -> State:
        return {"n": state["n"] + 1}

    child = StateGraph(State).add_sequence([("a", bump), ("b", bump)]).add_edge(START, "a")
    parent = StateGraph(State).add_sequence([("child", child.compile())])
    parent.add_edge(START, "child")

    async def run_graph() -> None:
        async with open_backend(backend_of(fresh.target), fresh.target) as saver:
            graph = parent.compile(checkpointer=saver)
            await graph.ainvoke({"n": 0}, cfg("t-sub"))

    asyncio.run(run_graph())
    [thread] = [
        t for t in run_json(capsys, fresh.target, "threads")["threads"] if t["thread_id"] == "t-sub"
    ]
    history = run_json(capsys, fresh.target, "history", "t-sub")
    assert thread["checkpoints"] == history["total"] == len(history["checkpoints"]) == 3
    assert thread["subgraph_checkpoints"] > 0, "the subgraph's own checkpoints, apart"
    code, out, _ = run(capsys, "--db", fresh.target, "threads")
    assert code == 0 and "checkpoints (root)" in out and "subgraph" in out
    code, out, _ = run(capsys, "--db", fresh.target, "history", "t-sub")
    assert code == 0 and "3 checkpoint(s) (root)" in out


@pytest.mark.parametrize(
    "argv",
    [["history", "bad\x00id"], ["ledger", "t-\ud800"], ["resolve", "abcdef\x00", "--rerun"]],
    ids=["nul", "lone-surrogate", "nul-key"],
)
def test_ids_a_database_cannot_hold_are_usage_errors(
    filled: Facts, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    """Never a driver error: the saver refuses the id (ConfigError), exit code 2."""
    code, out, err = run(capsys, "--db", filled.target, *argv)
    assert (code, out) == (2, "")
    assert err.startswith("idem-saver: error: ") and err.count("\n") == 1
    assert "NUL" in err or "lone surrogate" in err


def test_pending_lists_unknown_outcomes(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    [entry] = run_json(capsys, filled.target, "pending")["entries"]
    assert (entry["key"], entry["thread_id"], entry["state"]) == (
        filled.unknown_key,
        "t-unknown",
        "unknown",
    )
    assert entry["args"] == UNKNOWN_CALL["args"] and entry["status"] == "issued"
    code, out, _ = run(capsys, "--db", filled.target, "pending")
    assert code == 0 and filled.unknown_key[:12] in out and "resolve" in out


def test_stats_counts(filled: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, filled.target, "stats")
    assert doc["threads"] == 3
    assert doc["checkpoints"] == sum(filled.checkpoints.values())
    assert doc["blobs"] > 0 and doc["writes"] > 0 and doc["size_bytes"] > 0
    assert doc["ledger"]["total"] == 4
    assert doc["ledger"]["by_status"] == {"completed": 3, "issued": 1}
    assert doc["ledger"]["by_state"] == {
        "completed": 3,
        "failed": 0,
        "unknown": 1,
        "in_progress": 0,
    }
    code, out, _ = run(capsys, "--db", filled.target, "stats")
    assert code == 0 and "checkpoints" in out


def test_read_commands_change_nothing(sqlite_db: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    before = digest(sqlite_db.target)
    for argv in (
        ["threads"],
        ["history", "t-done"],
        ["show", "t-done"],
        ["diff", "t-done"],
        ["ledger", "t-done"],
        ["pending"],
        ["stats"],
        ["prune", "--keep-latest"],
        ["prune", "--before", "2999-01-01"],
    ):
        code, _, err = run(capsys, "--db", sqlite_db.target, *argv)
        assert code == 0, (argv, err)
    assert digest(sqlite_db.target) == before


# --- read-only files and directories ----------------------------------------------------

READ_COMMANDS = [
    ["threads"],
    ["history", "t-done"],
    ["show", "t-done"],
    ["ledger", "t-done"],
    ["pending"],
    ["stats"],
]
# runs cli.main for each command (argv[2], JSON) on database argv[1]: one process for all
CLI_CHILD = r"""
import contextlib, io, json, sys
from langgraph_idem_saver.cli import main
results = []
for argv in json.loads(sys.argv[2]):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*argv, "--db", sys.argv[1], "--json"])
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def cli_unprivileged(db: Path, commands: list[list[str]]) -> list[tuple[int, Any, str]]:
    """Run CLI commands on ``db`` in a child process that obeys file permissions (as root:
    without root's power to override them, see tests/unprivileged.py)."""
    proc = run_unprivileged(["python", "-c", CLI_CHILD, str(db), json.dumps(commands)])
    assert proc.returncode == 0, proc.stderr
    return [
        (code, json.loads(out) if code == 0 else out, err)
        for code, out, err in json.loads(proc.stdout)
    ]


def assert_reads_work(facts: Facts, results: list[tuple[int, Any, str]]) -> None:
    for argv, (code, _, err) in zip(READ_COMMANDS, results, strict=True):
        assert code == 0, (argv, err)
    threads, history, show, ledger, pending, stats = (out for _, out, _ in results)
    assert {t["thread_id"] for t in threads["threads"]} >= {"t-done", "t-pending", "t-unknown"}
    assert history["total"] == facts.checkpoints["t-done"]
    assert show["checkpoint_id"] == facts.done_head
    assert sorted(e["key"] for e in ledger["entries"]) == sorted(facts.done_keys)
    assert [e["key"] for e in pending["entries"]] == [facts.unknown_key]
    assert stats["threads"] == 3


@pytest.fixture
def ro_home(tmp_path: Path) -> Iterator[Path]:
    """A directory for read-only copies, made writable again for pytest to remove."""
    yield tmp_path
    make_writable_again(tmp_path)


def test_read_commands_on_a_read_only_file(sqlite_db: Facts, ro_home: Path) -> None:
    db = ro_home / "agent.sqlite"
    shutil.copyfile(sqlite_db.target, db)
    db.chmod(0o444)
    assert os_refuses_write(db)  # the OS really refuses the child the write
    before = digest(str(db))

    assert_reads_work(sqlite_db, cli_unprivileged(db, READ_COMMANDS))
    assert digest(str(db)) == before
    # mode=ro: a WAL reader may leave SQLite's companions, never another database
    assert {p.name for p in ro_home.iterdir()} <= {db.name, f"{db.name}-wal", f"{db.name}-shm"}

    [(code, out, err), (prune_code, _, prune_err)] = cli_unprivileged(
        db, [["resolve", sqlite_db.unknown_key, "--rerun"], ["prune", "--keep-latest", "--apply"]]
    )
    assert (code, out, prune_code) == (1, "", 1)
    for message in (err, prune_err):
        assert "read-only" in message and str(db) in message and message.count("\n") == 1
    assert digest(str(db)) == before


def test_read_commands_in_a_read_only_directory(sqlite_db: Facts, ro_home: Path) -> None:
    directory = ro_home / "ro"
    directory.mkdir()
    db = directory / "agent.sqlite"
    shutil.copyfile(sqlite_db.target, db)
    directory.chmod(0o555)
    assert os_refuses_write(directory)
    before = listing(directory)

    # mode=ro cannot open a WAL database here; immutable=1 reads it, creating nothing; one
    # child for the reads and the write (nothing in the directory can change in between:
    # the child cannot create or delete a file there)
    *reads, (code, out, err) = cli_unprivileged(
        db, [*READ_COMMANDS, ["resolve", sqlite_db.unknown_key, "--rerun"]]
    )
    assert_reads_work(sqlite_db, reads)
    assert (code, out) == (1, "")
    assert f"directory {directory} is not writable" in err and str(db) in err
    assert listing(directory) == before


# --- resolve ------------------------------------------------------------------------------


def test_resolve_completed_then_refuses_twice(
    fresh: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    prefix = fresh.unknown_key[:8]
    code, out, err = run(
        capsys, "--db", fresh.target, "resolve", prefix, "--completed", "--result", "paid by hand"
    )
    assert code == 0, err
    assert fresh.unknown_key[:12] in out and "completed" in out
    [entry] = run_json(capsys, fresh.target, "ledger", "t-unknown")["entries"]
    assert (entry["state"], entry["result"]) == ("completed", "paid by hand")
    assert run_json(capsys, fresh.target, "pending")["entries"] == []

    code, out, err = run(capsys, "--db", fresh.target, "resolve", prefix, "--rerun")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "not an unknown outcome: completed" in err
    assert "Traceback" not in err


def test_resolve_failed_and_rerun(fresh: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(
        capsys, fresh.target, "resolve", fresh.unknown_key, "--failed", "--error", "declined"
    )
    assert doc == {
        "key": fresh.unknown_key,
        "thread_id": "t-unknown",
        "tool": "charge",
        "resolution": "failed",
        "status": "failed",
    }
    [entry] = run_json(capsys, fresh.target, "ledger", "t-unknown")["entries"]
    assert (entry["state"], entry["error"]) == ("failed", "declined")


def test_resolve_rerun_releases_the_claim(fresh: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    doc = run_json(capsys, fresh.target, "resolve", fresh.unknown_key[:6], "--rerun")
    assert doc["status"] == "released"
    # the row stays, approved for a re-run: its attempts and the decision are kept
    [entry] = run_json(capsys, fresh.target, "ledger", "t-unknown")["entries"]
    assert entry["status"] == "issued" and entry["owner"].startswith("rerun-approved:")
    assert [e["action"] for e in entry["history"]] == ["rerun"]


def test_resolve_refuses_a_changed_entry(fresh: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(
        capsys,
        "--db",
        fresh.target,
        "resolve",
        fresh.unknown_key[:8],
        "--rerun",
        "--expect-attempts",
        "2",
    )
    assert code == 1 and "changed since it was shown" in err
    assert run_json(capsys, fresh.target, "pending")["entries"], "nothing was settled"


def test_resolve_refuses_a_completed_entry(
    filled: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = run(
        capsys, "--db", filled.target, "resolve", filled.done_keys[0][:10], "--failed"
    )
    assert code == 1 and "not an unknown outcome: completed" in err


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["resolve", "abc", "--rerun"], 2, "too short"),
        (["resolve", "ffffffffff", "--rerun"], 1, "no ledger entry"),
        (["resolve", "abcdef"], 2, "one of the arguments"),
        (["resolve", "abcdef", "--completed"], 2, "--completed needs --result"),
        (["resolve", "abcdef", "--rerun", "--result", "x"], 2, "--result goes with"),
        (["resolve", "abcdef", "--rerun", "--thread", "nope"], 1, "unknown thread"),
    ],
)
def test_resolve_bad_input(
    filled: Facts,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    got, out, err = run(capsys, "--db", filled.target, *argv)
    assert (got, out) == (code, "")
    assert message in err and err.startswith("idem-saver: error:") and err.count("\n") == 1


# --- prune --------------------------------------------------------------------------------


def test_prune_keep_latest_dry_run_then_apply(
    fresh: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    stats_before = run_json(capsys, fresh.target, "stats")
    plan = run_json(capsys, fresh.target, "prune", "--keep-latest")
    assert plan["applied"] is False and plan["mode"] == "keep_latest"
    expected = sum(n - 1 for n in fresh.checkpoints.values())
    assert plan["totals"]["delete_checkpoints"] == expected
    assert run_json(capsys, fresh.target, "stats") == stats_before, "a dry run changes nothing"

    code, out, _ = run(capsys, "--db", fresh.target, "prune", "--keep-latest")
    assert code == 0 and "dry run" in out and "would delete" in out

    done = run_json(capsys, fresh.target, "prune", "--keep-latest", "--apply")
    assert done["applied"] is True and done["totals"]["delete_checkpoints"] == expected
    stats = run_json(capsys, fresh.target, "stats")
    assert stats["checkpoints"] == 3 and stats["blobs"] < stats_before["blobs"]
    assert stats["ledger"] == stats_before["ledger"], "ledger entries are never pruned"
    # the state is intact
    show = run_json(capsys, fresh.target, "show", "t-done")
    assert len(show["channels"]["messages"]) == 5
    again = run_json(capsys, fresh.target, "prune", "--keep-latest")
    assert again["totals"]["delete_checkpoints"] == 0


def test_prune_before_a_date_one_thread(fresh: Facts, capsys: pytest.CaptureFixture[str]) -> None:
    past = run_json(capsys, fresh.target, "prune", "--before", "30d", "--apply")
    assert past["totals"]["delete_checkpoints"] == 0, "everything is newer than 30 days"

    future = (datetime.now(timezone.utc) + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    plan = run_json(capsys, fresh.target, "prune", "--before", future, "--thread", "t-done")
    assert plan["mode"] == "before" and [t["thread_id"] for t in plan["threads"]] == ["t-done"]
    assert plan["totals"]["delete_checkpoints"] == fresh.checkpoints["t-done"] - 1

    run_json(capsys, fresh.target, "prune", "--before", future, "--thread", "t-done", "--apply")
    history = run_json(capsys, fresh.target, "history", "t-done")
    assert [c["checkpoint_id"] for c in history["checkpoints"]] == [fresh.done_head]
    assert (
        run_json(capsys, fresh.target, "history", "t-pending")["total"]
        == fresh.checkpoints["t-pending"]
    )
    show = run_json(capsys, fresh.target, "show", "t-done")
    assert [m["role"] for m in show["channels"]["messages"]][-1] == "assistant"
    assert len(run_json(capsys, fresh.target, "ledger", "t-done")["entries"]) == 2


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["prune"], 2, "one of the arguments"),
        (["prune", "--keep-latest", "--before", "1d"], 2, "not allowed with"),
        (["prune", "--before", "last tuesday"], 2, "bad date"),
        (["prune", "--keep-latest", "--thread", "nope"], 1, "unknown thread 'nope'"),
    ],
)
def test_prune_bad_input(
    filled: Facts, capsys: pytest.CaptureFixture[str], argv: list[str], code: int, message: str
) -> None:
    got, _, err = run(capsys, "--db", filled.target, *argv)
    assert got == code and message in err


# --- errors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["history", "nope"], "unknown thread 'nope'"),
        (["show", "nope"], "unknown thread 'nope'"),
        (["diff", "nope"], "unknown thread 'nope'"),
        (["ledger", "nope"], "unknown thread 'nope'"),
        (["show", "t-done", "--checkpoint", "zzzzzzzz"], "no checkpoint 'zzzzzzzz'"),
        (["diff", "t-done", "--from", "zzzz"], "no checkpoint 'zzzz'"),
    ],
)
def test_unknown_thread_or_checkpoint(
    filled: Facts, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = run(capsys, "--db", filled.target, *argv)
    assert (code, out) == (1, "")
    assert message in err and err.count("\n") == 1


def test_missing_file_is_not_created(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.sqlite"
    for argv in (["threads"], ["resolve", "abcdef", "--rerun"], ["prune", "--keep-latest"]):
        code, _, err = run(capsys, "--db", str(missing), *argv)
        assert code == 1 and "no such database file" in err
    assert list(tmp_path.iterdir()) == []


def test_files_that_are_not_our_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello, not a database\n" * 20)
    code, _, err = run(capsys, "--db", str(text), "threads")
    assert code == 2 and "is not a SQLite database" in err

    other = tmp_path / "other.sqlite"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    conn.close()
    before = digest(str(other))
    code, _, err = run(capsys, "--db", str(other), "stats")
    assert code == 2 and "without langgraph-idem-saver tables" in err
    assert digest(str(other)) == before

    code, _, err = run(capsys, "--db", str(tmp_path), "threads")
    assert code == 2 and "is a directory" in err


def test_bad_or_unreachable_dsn(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("psycopg")
    code, _, err = run(capsys, "--db", "bogus_option=1 dbname=x", "threads")
    assert code == 2 and "bad PostgreSQL DSN" in err
    code, _, err = run(capsys, "--db", "postgresql://u:secret@127.0.0.1:1/x", "threads")
    assert code == 1 and "cannot connect to PostgreSQL" in err
    assert "secret" not in err and err.count("\n") == 1


def test_usage_errors(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IDEM_SAVER_DB", raising=False)
    code, _, err = run(capsys, "threads")
    assert code == 2 and "no database" in err
    code, _, err = run(capsys, "--db", "x.sqlite", "frobnicate")
    assert code == 2 and "invalid choice" in err
    code, _, err = run(capsys, "--db", "x.sqlite", "history")
    assert code == 2 and "required" in err
    code, out, _ = run(capsys, "--help")
    assert code == 0 and "pending" in out and "resolve" in out


def test_db_from_the_environment_and_after_the_command(
    filled: Facts, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDEM_SAVER_DB", filled.target)
    code, out, _ = run(capsys, "pending", "--json")
    assert code == 0 and json.loads(out)["entries"][0]["key"] == filled.unknown_key
    monkeypatch.setenv("IDEM_SAVER_DB", "/nonexistent/elsewhere.sqlite")
    code, out, _ = run(capsys, "stats", "--db", filled.target, "--json")
    assert code == 0 and json.loads(out)["threads"] == 3


# --- through the console entry point ------------------------------------------------------


def test_module_entry_point(sqlite_db: Facts, tmp_path: Path) -> None:
    """Two real processes (each ~1 s): a JSON read via $IDEM_SAVER_DB, and an error."""
    proc = run_module("threads", "--json", env={"IDEM_SAVER_DB": sqlite_db.target})
    assert proc.returncode == 0, proc.stderr
    assert {t["thread_id"] for t in json.loads(proc.stdout)["threads"]} >= {"t-done", "t-unknown"}

    proc = run_module("--db", str(tmp_path / "missing.sqlite"), "threads")
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("idem-saver: error: no such database file")
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1


def test_demo_is_still_delegated(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from langgraph_idem_saver import __main__ as entry
    from langgraph_idem_saver import demo

    seen: list[list[str]] = []
    monkeypatch.setattr(demo, "main", lambda argv: seen.append(list(argv)) or 0)
    assert entry.main(["demo", "--db", "somewhere.db"]) == 0
    assert seen == [["--db", "somewhere.db"]]
    monkeypatch.undo()
    with pytest.raises(SystemExit) as exit_info:
        entry.main(["demo", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert exit_info.value.code == 0 and "--db PATH" in help_text
    assert "idem-demo.db" in help_text and "overwritten on each run" in help_text


def test_demo_keeps_its_database_and_the_commands_it_prints_work(tmp_path: Path) -> None:
    """The whole demo in a fresh directory (~10 s: four agent processes), then every
    ``idem-saver`` command it prints, run as printed, from the same directory: the first
    through its own program (the script's shebang, or ``python -m``), the others with the
    same program and their own arguments in a child of the zygote (tests/zygote.py), which
    spares them the imports a fresh interpreter repeats."""
    proc = zygote.run(
        [sys.executable, "-m", "langgraph_idem_saver", "demo"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "idem-demo.db").is_file()
    assert "Database: idem-demo.db (overwritten on each run" in proc.stdout
    tail = proc.stdout.split("== See it with the command line ==", 1)[1]
    assert "kept in idem-demo.db (the next run of the demo overwrites it)" in tail
    commands = [line.strip() for line in tail.splitlines() if line.startswith("  ")]
    assert len(commands) == 3
    assert commands[0].endswith(" threads --db idem-demo.db")
    assert commands[1].endswith(" ledger invoices-idempotent --db idem-demo.db")
    assert commands[2].endswith(" history invoices-idempotent --db idem-demo.db")
    argvs = [shlex.split(command) for command in commands]
    program = argvs[0][:-3]  # `idem-saver`, its script's path, or `python -m langgraph_...`
    assert all(argv[: len(program)] == program for argv in argvs), commands
    if program[1:2] == ["-m"]:
        in_zygote = [sys.executable, *program[1:]]
    else:  # the script, run by this Python (its shebang's)
        script = str(tmp_path / program[0]) if os.sep in program[0] else shutil.which(program[0])
        assert script, program
        in_zygote = [sys.executable, script]
    outputs = []
    for index, argv in enumerate(argvs):
        run = (subprocess.run if index == 0 else zygote.run)(  # the first exactly as printed
            argv if index == 0 else [*in_zygote, *argv[len(program) :]],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "COLUMNS": "200"},
            timeout=120,
        )
        assert run.returncode == 0, (commands[index], run.stderr)
        outputs.append(run.stdout)
    threads, ledger, history = outputs
    assert "invoices-stock" in threads and "invoices-idempotent" in threads
    # three charges (and the model's recorded answers, tool __model__: model_record.py)
    charges = [line for line in ledger.splitlines() if "inv-" in line]
    assert sum("completed" in line for line in charges) == 3 and "inv-2" in ledger
    assert "recorded model answer(s)" in ledger
    assert "5 checkpoint(s)" in history


def test_demo_overwrites_only_its_own_database(tmp_path: Path) -> None:
    from langgraph_idem_saver.demo import DemoError, prepare_db

    previous = tmp_path / "idem-demo.db"

    async def write(path: Path, thread_id: str) -> None:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            await fill_one(saver, thread_id)

    asyncio.run(write(previous, "invoices-idempotent"))
    prepare_db(previous)  # a previous run's database: removed, with its companions
    assert list(tmp_path.iterdir()) == []

    someone_elses = tmp_path / "app.db"
    asyncio.run(write(someone_elses, "customer-42"))
    before = digest(str(someone_elses))
    with pytest.raises(DemoError, match="not a database this demo wrote"):
        prepare_db(someone_elses)
    assert digest(str(someone_elses)) == before

    notes = tmp_path / "notes.txt"
    notes.write_text("not a database")
    with pytest.raises(DemoError, match="not a database this demo wrote"):
        prepare_db(notes)
    assert notes.read_text() == "not a database"
    with pytest.raises(DemoError, match="is a directory"):
        prepare_db(tmp_path)
    with pytest.raises(DemoError, match="does not exist"):
        prepare_db(tmp_path / "missing" / "idem-demo.db")


async def fill_one(saver: Any, thread_id: str) -> None:
    """One checkpoint in ``thread_id``."""
    from langgraph.checkpoint.base import empty_checkpoint

    await saver.aput(cfg(thread_id), empty_checkpoint(), {}, {})


# --- at scale -----------------------------------------------------------------------------


def test_threads_and_stats_are_fast_on_100k_checkpoints(
    sqlite_db: Facts, capsys: pytest.CaptureFixture[str]
) -> None:
    """No checkpoint is deserialized but each thread's latest: 100,000 rows in 1,000 threads."""
    from langgraph.checkpoint.base.id import uuid6

    with sqlite3.connect(sqlite_db.target) as conn:
        head = conn.execute(
            "SELECT type, checkpoint, metadata, channel_versions FROM idem_checkpoints "
            "WHERE thread_id = 't-done' AND checkpoint_id = ?",
            (sqlite_db.done_head,),
        ).fetchone()
        rows = []
        for t in range(1000):
            parent = None
            for step in range(100):
                cid = str(uuid6(clock_seq=step))
                rows.append((f"bulk-{t:04}", "", cid, parent, *head))
                parent = cid
        conn.executemany(
            "INSERT INTO idem_checkpoints (thread_id, checkpoint_ns, checkpoint_id, "
            "parent_checkpoint_id, type, checkpoint, metadata, channel_versions) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            rows,
        )
    conn.close()
    started = time.perf_counter()
    doc = run_json(capsys, sqlite_db.target, "threads")
    stats = run_json(capsys, sqlite_db.target, "stats")
    plan = run_json(capsys, sqlite_db.target, "prune", "--keep-latest")
    elapsed = time.perf_counter() - started
    assert len(doc["threads"]) == 1004 and stats["checkpoints"] == 100_000 + 10
    assert plan["totals"]["delete_checkpoints"] == 1000 * 99 + 7
    assert {t["status"] for t in doc["threads"] if t["thread_id"].startswith("bulk-")} == {"done"}
    assert elapsed < 10, f"threads + stats + prune plan took {elapsed:.1f}s"


# --- pieces -------------------------------------------------------------------------------


def test_checkpoint_time_reads_uuid6_ids() -> None:
    from langgraph.checkpoint.base.id import uuid6

    created = checkpoint_time(str(uuid6(clock_seq=1)))
    assert created is not None
    assert abs(created - datetime.now(timezone.utc)) < timedelta(seconds=5)
    assert checkpoint_time(str(uuid.uuid4())) is None
    assert checkpoint_time("not-an-id") is None and checkpoint_time(None) is None


def test_parse_when() -> None:
    now = datetime(2025, 6, 1, 12, tzinfo=timezone.utc)
    assert parse_when("2025-01-31") == datetime(2025, 1, 31, tzinfo=timezone.utc)
    assert parse_when("2025-01-31T10:00Z") == datetime(2025, 1, 31, 10, tzinfo=timezone.utc)
    assert parse_when("2025-01-31T12:00+02:00") == datetime(2025, 1, 31, 10, tzinfo=timezone.utc)
    assert parse_when("2d", now=now) == now - timedelta(days=2)
    assert parse_when("90m", now=now) == now - timedelta(minutes=90)


def test_head_status_rules() -> None:
    assert head_status(None, interrupted=False, errored=False, exists=False) == ("empty", [])
    head = {"updated_channels": ["messages", "branch:to:tools"]}
    assert head_status(head, interrupted=False, errored=False) == ("pending", ["tools"])
    assert head_status(head, interrupted=True, errored=False)[0] == "interrupted"
    assert head_status(head, interrupted=False, errored=True)[0] == "error"
    assert head_status({"updated_channels": ["messages"]}, interrupted=False, errored=False) == (
        "done",
        [],
    )
    assert head_status({}, interrupted=False, errored=False)[0] == "unknown"


def test_diff_messages_when_history_was_rewritten() -> None:
    def m(i: str, content: str) -> dict[str, Any]:
        return {"id": i, "role": "user", "content": content, "tool_calls": [], "tool_call_id": None}

    old = [m("1", "a"), m("2", "b")]
    assert diff_messages(old, [*old, m("3", "c")])["appended"] == [m("3", "c")]
    rewritten = diff_messages(old, [m("1", "a"), m("2", "B"), m("4", "d")])
    assert rewritten == {"appended": [m("4", "d")], "removed": [], "changed": [m("2", "B")]}
    assert diff_messages(old, [m("2", "b")])["removed"] == [m("1", "a")]


def test_dsn_detection_and_redaction(tmp_path: Path) -> None:
    assert is_postgres_target("postgresql://u@h/db") and is_postgres_target("host=h dbname=d")
    assert not is_postgres_target(str(tmp_path / "app.sqlite"))
    assert redact_dsn("postgresql://u:pw@h/db") == "postgresql://u:***@h/db"
    assert "pw" not in redact_dsn("host=h password=pw dbname=d")
