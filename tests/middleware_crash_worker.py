"""``create_agent`` agents with ``IdempotencyMiddleware`` beside another middleware, in
one process, for the SIGKILL tests of ``tests/test_middleware_kills.py``.

``python tests/middleware_crash_worker.py PHASE CASES_JSON`` - ``CASES_JSON`` maps a case
name to ``[db, effects, scenario, order, crash]``:

* ``scenario``: ``batched`` (``HumanInTheLoopMiddleware`` reviews three charges at once:
  approve inv-1, edit inv-2 from 20 to 25, reject inv-3), ``per_call`` (it reviews one
  charge as it starts; approved), ``retry`` (``ToolRetryMiddleware``; the charge raises
  once after its effect, ``verify`` reads the effects file);
* ``order``: ``ledger_first`` or ``other_first`` (which middleware is listed first), or
  ``stock`` (no ledger: the control that shows the duplicate);
* ``crash``: ``before_effect`` / ``after_effect`` (inside the tool, of the call that
  matters: inv-2 in ``batched``) or ``after_tool`` (in the next model call, after every
  tool returned).

``PHASE`` ``crash``: each case (its own thread, event loop and database) starts its
thread, answers the review, and stops at its point; once every case stopped at its point
or finished (an order refused), the process prints what the finished ones saw and kills
itself with SIGKILL (a real ``kill -9``): every case dies at its point at once.
``PHASE`` ``resume``: finish every case's thread as an application would, a careful human
answering each unknown-outcome interrupt by interrupt id (``completed`` if the payload's
charge is in the effects file, else ``rerun``).

Each effect is one fsync'd line ``invoice amount``. Prints one JSON object: per case what
it saw (``refused`` with the error when the order was refused, the unknown-outcome
payloads' arguments, the final tool messages, the ledger's charge entries).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain.agents.middleware import HumanInTheLoopMiddleware, ToolRetryMiddleware
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import effects_of, record
from resume_rule import asaved_next
from tool_node_helpers import ToolCallingFakeModel

from langgraph_idem_saver import NOT_APPLIED, AsyncSqliteSaver
from langgraph_idem_saver.engine import MiddlewareOrderError
from langgraph_idem_saver.middleware import IdempotencyMiddleware

CHARGES = {"batched": [("inv-1", 10), ("inv-2", 20), ("inv-3", 30)], "per_call": [("inv-1", 10)]}
CHARGES["retry"] = CHARGES["per_call"]
EDITED = ("inv-2", 25)
CONFIG: Any = {"configurable": {"thread_id": "t"}}


STOPPED = threading.Condition()
stopped: set[str] = set()  # cases at their kill point
finished: dict[str, Any] = {}  # cases that ended (their report)


def die(case: str) -> None:
    """Stop this case at its point; the main thread kills the process when all stopped."""
    with STOPPED:
        stopped.add(case)
        STOPPED.notify_all()
    threading.Event().wait()  # never returns: the process dies here


class Model(ToolCallingFakeModel):
    """Asks for the scenario's charges (fixed ids), then answers; may die first."""

    charges: list[tuple[str, int]]
    die_on_answer: str = ""  # the case to stop, if any

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        from langchain_core.outputs import ChatGeneration, ChatResult

        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            calls = [
                {
                    "name": "charge",
                    "args": {"invoice": inv, "amount": amount},
                    "id": f"call_{i + 1}",
                    "type": "tool_call",
                }
                for i, (inv, amount) in enumerate(self.charges)
            ]
            message = AIMessage("", id="ai-charges", tool_calls=calls)
        else:
            if self.die_on_answer:
                die(self.die_on_answer)
            message = AIMessage("done", id="ai-done")
        return ChatResult(generations=[ChatGeneration(message=message)])


def build(db_saver: Any, case: str, effects: Path, scenario: str, order: str, crash: str) -> Any:
    raised = effects.with_suffix(".raised")

    @tool
    def charge(invoice: str, amount: int) -> str:
        """Charge an invoice."""
        target = scenario != "batched" or invoice == "inv-2"
        if target and crash == "before_effect":
            die(case)
        record(effects, f"{invoice} {amount}")
        if target and crash == "after_effect":
            die(case)
        if scenario == "retry" and not raised.exists():
            record(raised, "once")
            raise ConnectionResetError("the reply was lost after the charge")
        return f"charged {invoice} {amount}"

    def verify(args: dict[str, Any]) -> Any:
        line = f"{args['invoice']} {args['amount']}"
        return f"charged {line} (verified)" if line in effects_of(effects) else NOT_APPLIED

    if scenario == "retry":
        other: Any = ToolRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False)
        ours = IdempotencyMiddleware(verify={"charge": verify})
    else:
        other = HumanInTheLoopMiddleware(interrupt_on={"charge": True}, interrupt_mode=scenario)  # type: ignore[arg-type]
        ours = IdempotencyMiddleware()  # a human settles unknown outcomes
    middleware = {"ledger_first": [ours, other], "other_first": [other, ours], "stock": [other]}
    stop = case if crash == "after_tool" else ""
    model = Model(messages=iter([]), charges=CHARGES[scenario], die_on_answer=stop)
    return create_agent(model, tools=[charge], middleware=middleware[order], checkpointer=db_saver)


def review(scenario: str, interrupts: Any) -> Any:
    """The reviewer's answer to HITL's question(s)."""
    if scenario == "batched":
        edit = {"name": "charge", "args": {"invoice": EDITED[0], "amount": EDITED[1]}}
        return {
            "decisions": [
                {"type": "approve"},
                {"type": "edit", "edited_action": edit},
                {"type": "reject", "message": "not this one"},
            ]
        }
    return {q.id: {"type": "approve"} for q in interrupts}


async def crash_run(agent: Any, scenario: str) -> None:
    out = await agent.ainvoke({"messages": [("user", "pay")]}, CONFIG)
    if scenario != "retry":
        out = await agent.ainvoke(Command(resume=review(scenario, out["__interrupt__"])), CONFIG)


async def resume_run(
    agent: Any, effects: Path, scenario: str, seen: list[Any], reviewed: list[Any]
) -> None:
    """Finish the thread as an application would: a careful human answers our questions;
    the reviewer answers HITL's again (an answer given inside a task the kill ended was
    lost with it, so HITL asks again)."""
    for _ in range(20):
        live = await agent.aget_state(CONFIG)
        if live.interrupts:
            answers: dict[str, Any] = {}
            for q in live.interrupts:
                if q.value.get("kind") != "unknown_tool_outcome":
                    reviewed.append(q.value.get("tool_call_id") or "batch")
                    answers[q.id] = (
                        review(scenario, [q]).get(q.id)
                        if scenario == "per_call"
                        else review(scenario, [q])
                    )
                    continue
                args = q.value["args"]
                seen.append(args)
                found = f"{args['invoice']} {args['amount']}" in effects_of(effects)
                answers[q.id] = (
                    {"action": "completed", "result": f"found {args['invoice']} {args['amount']}"}
                    if found
                    else {"action": "rerun"}
                )
            await agent.ainvoke(Command(resume=answers), CONFIG)
        elif await asaved_next(agent, CONFIG):
            await agent.ainvoke(None, CONFIG)
        else:
            return
    raise RuntimeError("the thread did not finish in 20 runs")


async def run_case(case: str, spec: list[str], phase: str) -> dict[str, Any]:
    db, effects, scenario, order, crash = spec
    opener: Any = AsyncSqliteSaver
    if db.startswith(("postgresql:", "postgres:")) or "dbname=" in db:  # a DSN
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    report: dict[str, Any] = {"seen": [], "reviewed": []}
    async with opener.from_conn_string(db) as saver:
        point = crash if phase == "crash" else "none"  # the resume dies nowhere
        agent = build(saver, case, Path(effects), scenario, order, point)
        try:
            if phase == "resume":
                await resume_run(agent, Path(effects), scenario, report["seen"], report["reviewed"])
            else:
                await crash_run(agent, scenario)
        except MiddlewareOrderError as exc:
            report["refused"] = str(exc)
        final = (await agent.aget_state(CONFIG)).values.get("messages", [])
        report["tools"] = {
            m.tool_call_id: str(m.content) for m in final if isinstance(m, ToolMessage)
        }
        report["entries"] = [
            {
                "args": json.loads(e.args),
                "status": e.status.value,
                "attempts": e.attempts,
                "events": e.events(),
            }
            for e in await saver.alist_entries("t")
            if e.tool_name == "charge"
        ]
    return report


def case_thread(case: str, spec: list[str], phase: str) -> None:
    try:
        report = asyncio.run(run_case(case, spec, phase))
    except Exception as exc:  # reported, so the test shows it
        report = {"error": f"{type(exc).__name__}: {exc}"}
    with STOPPED:
        finished[case] = report
        STOPPED.notify_all()


def main(phase: str, cases: dict[str, list[str]]) -> None:
    threads = [
        threading.Thread(target=case_thread, args=(case, spec, phase), daemon=True)
        for case, spec in cases.items()
    ]
    for t in threads:
        t.start()
    with STOPPED:
        STOPPED.wait_for(lambda: len(stopped) + len(finished) == len(cases), timeout=150)
    print(json.dumps({"finished": finished, "stopped": sorted(stopped)}), flush=True)
    if stopped:
        os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    main(sys.argv[1], json.loads(sys.argv[2]))
