"""The exercises of the seed chapter ("Checkpointing and resumability"), on our saver.

(a) Kill the process after turn 4 of a conversation - between turns (SIGKILL) or in the
    middle of turn 4's tool call (``os._exit`` after the side effect) - and resume in a
    fresh process: all four turns are intact and the conversation goes on.
(b) The duplicate write test: a mock ``send_email`` asked twice for the same email in
    one thread. Under the default ``key_policy="tool_call"`` these are two logical calls
    (two emails, as a plain ``ToolNode`` would send); under ``key_policy="args"`` - the
    book's idempotency key, a hash of tool and arguments - one email goes out and the
    second call replays it.
(c) The corruption audit: look at the stored versions, reconstruct the session from them,
    delete a middle checkpoint with ``sqlite3`` and check that resume still works.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import zygote
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from resume_worker import (
    CRASH_EXIT_CODE,
    WORKER,
    InvoiceModel,
    build_graph,
    effects_lines,
    run_scenario,
    summarize,
    uncrashed_run,
)
from tool_node_helpers import cfg

from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode

TURNS = [f"pay invoices turn-{k}" for k in range(1, 6)]


def worker_cmd(scenario: dict[str, Any]) -> list[str]:
    return [sys.executable, str(WORKER), json.dumps(scenario)]


def run_child(scenario: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str]:
    proc = zygote.run(worker_cmd(scenario), capture_output=True, text=True, timeout=120)
    lines = proc.stdout.strip().splitlines()
    payload = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc.returncode, payload, proc.stderr[-3000:]


@cache
def baseline(tmp: str) -> list[Any]:
    """Five turns, never interrupted (run in this process: only a reference)."""
    return uncrashed_run(Path(tmp) / "book-baseline", TURNS)


async def read_state(db: str) -> Any:
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        graph = build_graph(InvoiceModel(), IdempotentToolNode([_noop]), saver)
        return await graph.aget_state(cfg("t1"))


@tool
def _noop() -> str:
    """Never called: the graph is only built to read the state."""
    return ""


def humans(messages: list[Any]) -> list[str]:
    return [m.content for m in messages if isinstance(m, HumanMessage)]


# --- (a) kill after turn 4, resume in a fresh process ----------------------------------------


def kill_between_turns(scenario: dict[str, Any], ready: Path) -> int:
    """The child finishes turn 4, says so, and is SIGKILLed while idle."""
    proc = zygote.Popen(
        worker_cmd({**scenario, "phase": "run", "ready_file": str(ready)}),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert proc.poll() is None, f"the child exited early: {proc.communicate()[1]}"
        assert time.monotonic() < deadline, "the child never finished turn 4"
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return proc.returncode


@pytest.mark.parametrize("when", ["between_turns", "mid_turn_4_tool_call"])
def test_kill_after_turn_4_and_resume_in_a_fresh_process(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, when: str
) -> None:
    db, effects = tmp_path / "a.db", tmp_path / "effects"
    scenario: dict[str, Any] = {
        "db": str(db),
        "effects": str(effects),
        "inputs": TURNS,
        "crash_invoice": "turn-4",
    }
    if when == "between_turns":
        code = kill_between_turns({**scenario, "crash_at": "after_turn"}, tmp_path / "ready")
        assert code == -signal.SIGKILL
    else:
        code, _, err = run_child({**scenario, "phase": "run", "crash_at": "after_effect"})
        assert code == CRASH_EXIT_CODE, err
    assert effects_lines(effects) == ["turn-1", "turn-2", "turn-3", "turn-4"]

    # what survived the kill: four turns, the fourth complete or with its tools pending
    state = asyncio.run(read_state(str(db)))
    ref = baseline(str(tmp_path_factory.getbasetemp()))
    assert humans(state.values["messages"]) == TURNS[:4]
    if when == "between_turns":
        assert state.next == ()
        assert summarize(state.values["messages"]) == ref[: len(state.values["messages"])]
    else:
        assert state.next == ("tools",)
        assert summarize(state.values["messages"])[:-2] == ref[: len(state.values["messages"]) - 2]

    code, resumed, err = run_child({**scenario, "phase": "resume"})
    assert code == 0 and resumed is not None and resumed["ok"], err
    assert resumed["messages"] == ref, "all turns intact, and the conversation went on"
    assert Counter(effects_lines(effects)) == {f"turn-{k}": 1 for k in range(1, 6)}


# --- (b) the duplicate write test --------------------------------------------------------------

EMAIL = {"to": "bob@example.com", "subject": "weekly report", "body": "numbers attached"}
ONE_EMAIL = "email bob the weekly report"
TWO_EMAILS = "email bob the weekly report, twice"


def email_agent(saver: Any, outbox: Path, key_policy: str) -> tuple[Any, IdempotentToolNode]:
    @tool
    def send_email(to: str, subject: str, body: str) -> str:
        """Send an email (mock: appends to the outbox file)."""
        with outbox.open("a") as f:
            f.write(json.dumps([to, subject, body]) + "\n")
        return f"sent {subject!r} to {to}"

    call = {"name": "send_email", "args": EMAIL}
    model = InvoiceModel(script={ONE_EMAIL: [call], TWO_EMAILS: [call, call]})
    node = IdempotentToolNode([send_email], key_policy=key_policy)
    return build_graph(model, node, saver), node


@pytest.mark.parametrize(
    ("key_policy", "emails_sent"), [("tool_call", 2), ("args", 1)], ids=["tool_call", "args"]
)
@pytest.mark.parametrize("shape", ["two_turns", "one_batch"])
async def test_duplicate_write(
    saver: Any, tmp_path: Path, key_policy: str, emails_sent: int, shape: str
) -> None:
    outbox = tmp_path / "outbox"
    graph, node = email_agent(saver, outbox, key_policy)
    if shape == "two_turns":  # the user asks twice; the model calls twice (new ids)
        await graph.ainvoke({"messages": [HumanMessage(ONE_EMAIL)]}, cfg("t1"))
        out = await graph.ainvoke({"messages": [HumanMessage(ONE_EMAIL)]}, cfg("t1"))
    else:  # the model asks for the same email twice in one message
        out = await graph.ainvoke({"messages": [HumanMessage(TWO_EMAILS)]}, cfg("t1"))

    results = [m for m in out["messages"] if isinstance(m, ToolMessage)]
    call_ids = [c["id"] for m in out["messages"] for c in getattr(m, "tool_calls", [])]
    assert len(set(call_ids)) == 2, "two distinct tool calls, same arguments"
    assert [m.tool_call_id for m in results] == call_ids, "each call got its answer"
    assert {m.content for m in results} == {"sent 'weekly report' to bob@example.com"}
    assert len(outbox.read_text().splitlines()) == emails_sent
    assert node.counters.executed == emails_sent
    assert node.counters.replayed == 2 - emails_sent
    entries = await saver.alist_entries("t1")
    assert len(entries) == emails_sent
    assert sum(e.replays for e in entries) == 2 - emails_sent


# --- (c) the corruption audit (SQLite file, edited with sqlite3 directly) --------------------


async def audit_run(db: Path, effects: Path, inputs: list[str]) -> dict[str, Any]:
    return await run_scenario(
        {"phase": "resume", "db": str(db), "effects": str(effects), "inputs": inputs}
    )


async def history(db: Path) -> list[Any]:
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = build_graph(InvoiceModel(), IdempotentToolNode([_noop]), saver)
        return [s async for s in graph.aget_state_history(cfg("t1"))]


def test_corruption_audit_delete_a_middle_checkpoint_and_resume(tmp_path: Path) -> None:
    db, effects = tmp_path / "a.db", tmp_path / "effects"
    asyncio.run(audit_run(db, effects, TURNS[:3]))

    # How many versions are there? One per super-step; a turn is five: the input, the
    # START step, the agent asking for the tool, the tools step, the agent answering.
    snapshots = asyncio.run(history(db))
    assert len(snapshots) == 3 * 5
    # Can we reconstruct the session's evolution? Each version extends the one before.
    evolution = [[m.id for m in s.values.get("messages", [])] for s in reversed(snapshots)]
    for older, newer in itertools.pairwise(evolution):
        assert newer[: len(older)] == older
    assert humans(snapshots[0].values["messages"]) == TURNS[:3]

    with sqlite3.connect(db) as conn:
        ids = [r[0] for r in conn.execute("SELECT checkpoint_id FROM idem_checkpoints ORDER BY 1")]
        victim = ids[len(ids) // 2]
        deleted = conn.execute("DELETE FROM idem_checkpoints WHERE checkpoint_id = ?", (victim,))
        assert deleted.rowcount == 1
    conn.close()

    after = asyncio.run(history(db))
    listed = [s.config["configurable"]["checkpoint_id"] for s in after]
    assert listed == [i for i in reversed(ids) if i != victim], "the rest is listed, in order"
    assert after[0].values == snapshots[0].values, "the latest checkpoint is self-contained"

    out = asyncio.run(audit_run(db, effects, TURNS[:4]))
    assert humans_summary(out["messages"]) == TURNS[:4], "a new turn completes"
    assert out["messages"][-1] == ["ai", "done: charged turn-4 $10", []]
    assert Counter(effects_lines(effects)) == {f"turn-{k}": 1 for k in range(1, 5)}
    assert len(asyncio.run(history(db))) == len(after) + 5


def humans_summary(messages: list[Any]) -> list[str]:
    return [m[1] for m in messages if m[0] == "human"]
