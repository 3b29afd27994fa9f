"""Answers to the unknown-outcome interrupt that cannot loop or go stale.

* An answer that names the ``key`` but no ``attempt`` is never applied to a later attempt
  of the same call: after a SIGKILL (``answer_crash_worker.py``) LangGraph hands the task
  its stored answer again, and a stale ``rerun`` used to charge once more.
* Every payload says exactly what to send (``answer_with``: the key and attempt to copy,
  ``how_to_answer``): an answer by interrupt id that copies it is applied to the call
  that interrupt asked about at once, with several calls asked in one task; a bare one
  there is refused with the reason, and the new payload says again what to send.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import zygote
from langchain_core.tools import tool
from langgraph.types import Command
from tool_node_helpers import (
    Counter,
    ai_calls,
    cfg,
    intent_for,
    plant_unknown,
    tool_graph,
    tool_messages,
)

from langgraph_idem_saver import CallStatus, IdempotentToolNode

WORKER = Path(__file__).resolve().parent / "answer_crash_worker.py"
KILLED = -9


def phase(tmp: Path, name: str, answer: Any = None) -> Any:
    cmd = [sys.executable, str(WORKER), str(tmp / "agent.db"), str(tmp / "fx"), name]
    if answer is not None:
        cmd.append(json.dumps(answer))
    return zygote.run(cmd, capture_output=True, text=True, timeout=120, env=os.environ)


def printed(done: Any) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_a_key_only_answer_is_not_applied_again_to_the_next_attempt(tmp_path: Path) -> None:
    """Attempt 1 dies after its charge; the human answers ``rerun`` naming the key only;
    attempt 2 dies after its charge too. LangGraph stores that answer in the checkpoint's
    pending writes and hands it back when the thread is run again: it must not re-run
    attempt 2 (a third charge) - the human is asked about attempt 2, told why."""
    assert phase(tmp_path, "first").returncode == KILLED
    [question] = printed(phase(tmp_path, "ask"))["pending"]
    assert question["attempt"] == 1 and question["answer_with"] == {
        "key": question["key"],
        "attempt": 1,
    }
    careless = {"action": "rerun", "key": question["key"]}  # names no attempt
    assert phase(tmp_path, "answer", careless).returncode == KILLED
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-1": 2}
    again = printed(phase(tmp_path, "resume"))
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-1": 2}  # no third
    [asked] = again["pending"]
    assert asked["attempt"] == 2 and asked["answer_with"]["attempt"] == 2
    assert "no 'attempt'; this is attempt 2" in asked["previous_answer_ignored"]


def vendor(effects: Counter) -> Any:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.bump(invoice)
        return f"charged {invoice}"

    return charge


CALLS = [("charge", {"invoice": "inv-1"}, "c1"), ("charge", {"invoice": "inv-2"}, "c2")]


async def two_unknown(saver: Any) -> Any:
    """Two calls of one ToolNode step (one task), both unknown outcomes."""
    message = ai_calls(*CALLS, msg_id="ai-step")
    for name, args, call_id in CALLS:
        call = {"name": name, "args": args, "id": call_id}
        await plant_unknown(
            saver, intent_for("t", call, message_id="ai-step", checkpoint_ns="tools:x")
        )
    graph = tool_graph(IdempotentToolNode([vendor(Counter())]), saver)
    return graph, message


async def test_an_answer_by_id_copying_answer_with_applies_to_the_call_it_asked_about(
    saver: Any,
) -> None:
    graph, message = await two_unknown(saver)
    out = await graph.ainvoke({"messages": [message]}, cfg("t"))
    for expected in ("c1", "c2"):
        [question] = out["__interrupt__"]
        payload = question.value
        assert payload["tool_call_id"] == expected and "previous_answer_ignored" not in payload
        assert "answer_with (required here)" in payload["how_to_answer"]
        answer = {"action": "completed", "result": f"found {expected}", **payload["answer_with"]}
        out = await graph.ainvoke(Command(resume={question.id: answer}), cfg("t"))
    assert [m.content for m in tool_messages(out)] == ["found c1", "found c2"]
    entries = await saver.alist_entries("t")
    assert {e.status for e in entries} == {CallStatus.COMPLETED}


async def test_a_bare_answer_by_id_for_one_of_several_calls_is_refused_saying_what_to_send(
    saver: Any,
) -> None:
    graph, message = await two_unknown(saver)
    out = await graph.ainvoke({"messages": [message]}, cfg("t"))
    [question] = out["__interrupt__"]
    out = await graph.ainvoke(Command(resume={question.id: {"action": "rerun"}}), cfg("t"))
    [again] = out["__interrupt__"]
    assert again.value["tool_call_id"] == "c1"  # the same call, asked again, not run
    assert "must name the interrupt's 'key' and 'attempt'" in again.value["previous_answer_ignored"]
    assert again.value["answer_with"] == question.value["answer_with"]
    assert await saver.alist_entries("t") and all(
        e.status is CallStatus.ISSUED for e in await saver.alist_entries("t")
    )
