"""``IdempotencyMiddleware`` on LangChain 1.x ``create_agent``: replay, unknown outcomes,
read-only tools, composition with other middlewares, and real crashes.

The in-process tests run on both backends; the crash tests kill a real child process
(``tests/agent_crash_worker.py``) inside a tool or between steps and resume it in a fresh
one, with the stock agent (no middleware) through the same harness as the control.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest
import zygote
from langchain.agents import create_agent
from langchain.agents.middleware import (
    HumanInTheLoopMiddleware,
    ToolCallLimitMiddleware,
    ToolRetryMiddleware,
)
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command
from pg_server import fresh_dsn
from tool_node_helpers import (
    Counter,
    cfg,
    intent_for,
    plant_completed,
    plant_unknown,
    scripted_model,
)

from langgraph_idem_saver import NOT_APPLIED, CallStatus, ConfigError
from langgraph_idem_saver.middleware import IdempotencyMiddleware

WORKER = Path(__file__).resolve().parent / "agent_crash_worker.py"


async def tool_entries(saver: Any, thread: str) -> list[Any]:
    """A thread's ledger entries of tool calls (recorded model answers, ``__model__``,
    are tests/test_model_record.py's)."""
    return [e for e in await saver.alist_entries(thread) if e.tool_name != "__model__"]


def charges(effects: Counter, *, fail_once: type[BaseException] | None = None) -> Any:
    failures = {"left": 1 if fail_once else 0}

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.bump(invoice)
        if fail_once is not None and failures["left"]:
            failures["left"] -= 1
            raise fail_once("reply lost")
        return f"charged {invoice}"

    return charge


def turn(*invoices: str) -> list[AIMessage]:
    """The model's two messages: the charges (fixed ids), then the answer."""
    calls = [
        {"name": "charge", "args": {"invoice": inv}, "id": f"call_{i}", "type": "tool_call"}
        for i, inv in enumerate(invoices)
    ]
    return [AIMessage("", id="ai-charges", tool_calls=calls), AIMessage("done", id="ai-done")]


def call_of(invoice: str, i: int = 0) -> dict[str, Any]:
    return {"name": "charge", "args": {"invoice": invoice}, "id": f"call_{i}", "type": "tool_call"}


def tool_texts(out: dict[str, Any]) -> list[str]:
    return [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]


async def test_calls_are_recorded_and_replayed(saver: Any) -> None:
    fx = Counter()
    mw = IdempotencyMiddleware()
    agent = create_agent(
        scripted_model(*turn("inv-1", "inv-2")),
        tools=[charges(fx)],
        middleware=[mw],
        checkpointer=saver,
    )
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert sorted(tool_texts(out)) == ["charged inv-1", "charged inv-2"]
    entries = await tool_entries(saver, "t")
    assert {e.status for e in entries} == {CallStatus.COMPLETED} and len(entries) == 2
    assert {e.agent_path for e in entries} == {"tools"}
    assert mw.counters.executed == 2


async def test_a_completed_call_is_replayed_not_run(saver: Any) -> None:
    """The process that ran the tool died before LangGraph saved its result."""
    fx = Counter()
    intent = intent_for("t", call_of("inv-1"), checkpoint_ns="tools:x", message_id="ai-charges")
    await plant_completed(
        saver, intent, ToolMessage("charged inv-1 (earlier)", tool_call_id="call_0")
    )
    mw = IdempotencyMiddleware()
    agent = create_agent(
        scripted_model(*turn("inv-1")), tools=[charges(fx)], middleware=[mw], checkpointer=saver
    )
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert tool_texts(out) == ["charged inv-1 (earlier)"] and len(fx) == 0
    assert mw.counters.replayed == 1


async def test_unknown_outcome_interrupts_and_the_answer_is_recorded(saver: Any) -> None:
    fx = Counter()
    intent = intent_for("t", call_of("inv-1"), checkpoint_ns="tools:x", message_id="ai-charges")
    planted = await plant_unknown(saver, intent)
    agent = create_agent(
        scripted_model(*turn("inv-1")),
        tools=[charges(fx)],
        middleware=[IdempotencyMiddleware()],
        checkpointer=saver,
    )
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    [question] = out["__interrupt__"]
    assert question.value["key"] == planted.key and question.value["agent_path"] == "tools"
    answer = {"action": "completed", "result": "found on the dashboard"}  # sole call: no key
    out = await agent.ainvoke(Command(resume=answer), cfg("t"))
    assert tool_texts(out) == ["found on the dashboard"] and len(fx) == 0


async def test_read_only_by_tool_metadata_skips_the_ledger(saver: Any) -> None:
    @tool
    def lookup(invoice: str) -> str:
        """Look an invoice up."""
        return f"{invoice}: open"

    lookup.metadata = {"read_only": True}
    model = scripted_model(
        AIMessage(
            "",
            id="a1",
            tool_calls=[
                {"name": "lookup", "args": {"invoice": "i"}, "id": "l1", "type": "tool_call"}
            ],
        ),
        AIMessage("ok", id="a2"),
    )
    mw = IdempotencyMiddleware()
    agent = create_agent(model, tools=[lookup], middleware=[mw], checkpointer=saver)
    await agent.ainvoke({"messages": [("user", "look")]}, cfg("t"))
    assert await tool_entries(saver, "t") == [] and mw.counters.read_only == 1


def test_per_tool_options_must_name_the_agents_tools() -> None:
    with pytest.raises(ConfigError, match="does not have"):
        mw = IdempotencyMiddleware(verify={"chrage": lambda a: NOT_APPLIED})
        agent = create_agent(
            scripted_model(*turn("inv-1")), tools=[charges(Counter())], middleware=[mw]
        )
        agent.invoke({"messages": [("user", "pay")]}, cfg("t"))


async def test_retry_middleware_outside_retries_as_attempts_of_one_call(saver: Any) -> None:
    """ToolRetryMiddleware listed first (outermost): each retry passes through the ledger;
    the failed attempt is an unknown outcome that verify settles - charged once."""
    fx = Counter()
    asked: list[Any] = []

    def charged(args: dict[str, Any]) -> Any:
        asked.append(args)
        return (
            f"charged {args['invoice']} (verified)" if args["invoice"] in fx.calls else NOT_APPLIED
        )

    retry = ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
    agent = create_agent(
        scripted_model(*turn("inv-1")),
        tools=[charges(fx, fail_once=ConnectionResetError)],
        middleware=[retry, IdempotencyMiddleware(verify={"charge": charged})],
        checkpointer=saver,
    )
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert fx.calls == ["inv-1"] and len(asked) == 1
    assert tool_texts(out) == ["charged inv-1 (verified)"]
    [entry] = await tool_entries(saver, "t")
    assert entry.status is CallStatus.COMPLETED


@pytest.mark.parametrize("order", ["hitl_first", "ledger_first"])
async def test_human_in_the_loop_in_either_order(saver: Any, order: str) -> None:
    fx = Counter()
    hitl = HumanInTheLoopMiddleware(interrupt_on={"charge": True})
    ledger = IdempotencyMiddleware()
    middleware = [hitl, ledger] if order == "hitl_first" else [ledger, hitl]
    agent = create_agent(
        scripted_model(*turn("inv-1")),
        tools=[charges(fx)],
        middleware=middleware,
        checkpointer=saver,
    )
    out = await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert out["__interrupt__"] and len(fx) == 0  # asked before anything ran
    out = await agent.ainvoke(Command(resume={"decisions": [{"type": "approve"}]}), cfg("t"))
    assert tool_texts(out) == ["charged inv-1"] and fx.calls == ["inv-1"]
    [entry] = await tool_entries(saver, "t")
    assert entry.status is CallStatus.COMPLETED


async def test_tool_call_limit_composes(saver: Any) -> None:
    fx = Counter()
    limit = ToolCallLimitMiddleware(tool_name="charge", run_limit=1)
    agent = create_agent(
        scripted_model(*turn("inv-1", "inv-2")),
        tools=[charges(fx)],
        middleware=[limit, IdempotencyMiddleware()],
        checkpointer=saver,
    )
    await agent.ainvoke({"messages": [("user", "pay")]}, cfg("t"))
    assert len(fx) == 1  # the limit blocked the second call before it reached the ledger
    assert [e.status for e in await tool_entries(saver, "t")] == [CallStatus.COMPLETED]


# --- real crashes --------------------------------------------------------------------------


def worker_cmd(tmp: Path, mode: str, durability: str, crash: str, db: str | None) -> list[str]:
    database = db or str(tmp / "agent.db")
    return [sys.executable, str(WORKER), database, str(tmp / "fx"), "t", mode, durability, crash]


def run_worker(
    tmp: Path, mode: str, durability: str, crash: str, calls: int, db: str | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CALLS": str(calls)}
    cmd = worker_cmd(tmp, mode, durability, crash, db)
    return zygote.run(cmd, env=env, capture_output=True, text=True, timeout=120)


# every durability where the effect landed unrecorded (the case that duplicates); the other
# crash points once per call shape (they are settled by the same code whatever the mode)
CRASHES = [
    *[("after_effect", d, c) for d in ("sync", "async", "exit") for c in (1, 3)],
    ("before_effect", "exit", 3),
    ("before_effect", "sync", 1),
    ("after_tools", "async", 3),
    ("after_tools", "exit", 1),
    # the tools' writes are saved, the checkpoint after them is not: LangGraph's live state
    # then looks finished (no `next`), ending on a tool message; the resume must finish it
    *[("checkpoint_lost", d, 3) for d in ("sync", "async")],
]


@pytest.mark.parametrize(("crash", "durability", "calls"), CRASHES)
def test_crash_and_resume_charges_each_invoice_once(
    tmp_path: Path, durability: str, crash: str, calls: int
) -> None:
    died = run_worker(tmp_path, "ours", durability, crash, calls)
    assert died.returncode == 137, died.stderr[-2000:]
    resumed = run_worker(tmp_path, "ours", durability, "none", calls)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    effects = Tally((tmp_path / "fx").read_text().splitlines())
    assert effects == dict.fromkeys([f"inv-{i + 1}" for i in range(calls)], 1)
    uncrashed = tmp_path / "uncrashed"
    uncrashed.mkdir()
    plain = run_worker(uncrashed, "ours", durability, "none", calls)
    assert plain.returncode == 0, plain.stderr[-2000:]
    assert json.loads(resumed.stdout)[-1] == json.loads(plain.stdout)[-1] == "all charged"


def test_the_stock_agent_charges_twice_in_the_same_harness(tmp_path: Path) -> None:
    """The control: without the middleware the same crash charges again on resume."""
    assert run_worker(tmp_path, "stock", "sync", "after_effect", 1).returncode == 137
    assert run_worker(tmp_path, "stock", "sync", "none", 1).returncode == 0
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-1": 2}


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_crash_and_resume_on_postgres(tmp_path: Path, pg_server_dsn: str, durability: str) -> None:
    db = fresh_dsn(pg_server_dsn)
    assert run_worker(tmp_path, "ours", durability, "after_effect", 3, db).returncode == 137
    resumed = run_worker(tmp_path, "ours", durability, "none", 3, db)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-1": 1, "inv-2": 1, "inv-3": 1}


@pytest.mark.parametrize("resumers", [2, 8])
def test_concurrent_resumers_charge_once(
    tmp_path: Path, backend: str, resumers: int, request: pytest.FixtureRequest
) -> None:
    """After a crash, several processes resume the thread at once."""
    db = fresh_dsn(request.getfixturevalue("pg_server_dsn")) if backend == "postgres" else None
    assert run_worker(tmp_path, "ours", "sync", "after_effect", 3, db).returncode == 137
    env = {**os.environ, "CALLS": "3"}
    procs = [
        zygote.Popen(
            worker_cmd(tmp_path, "ours", "sync", "none", db),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(resumers)
    ]
    try:
        outs = [p.communicate(timeout=180) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert [p.returncode for p in procs] == [0] * resumers, [e[-1500:] for _, e in outs]
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-1": 1, "inv-2": 1, "inv-3": 1}
    # each effect once (above) is the guarantee; the thread itself finishes. A resumer's own
    # last read may land on a sibling fork LangGraph made (no compare-and-swap on checkpoints)
    assert any(json.loads(o)[-1] == "all charged" for o, _ in outs)
