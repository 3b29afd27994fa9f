"""A ``create_agent`` agent whose one charge dies by SIGKILL right after its effect, for
``tests/test_middleware_answers.py``: an answer stored in the task must not be applied
again to the call's next attempt.

``python tests/answer_crash_worker.py DB EFFECTS PHASE [ANSWER_JSON]``

* ``first``: start the thread; the charge's process dies after the effect (attempt 1
  becomes an unknown outcome);
* ``ask``: run the thread again and print the pending unknown-outcome payload;
* ``answer``: resume with ``Command(resume=ANSWER)`` (the answer, as a plain value LangGraph
  stores in the checkpoint's pending writes); a ``rerun`` runs attempt 2, which dies
  after its effect too;
* ``resume``: run the thread again (``ainvoke(None)``, what an application does after a
  crash) and print the pending payload (or the final tool messages).

Each effect is one fsync'd line; a phase that dies prints nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.types import Command

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tool_node_helpers import ToolCallingFakeModel

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.middleware import IdempotencyMiddleware

CONFIG: Any = {"configurable": {"thread_id": "t"}}


class Model(ToolCallingFakeModel):
    """Asks for one charge (fixed ids) until a tool message answers it, then says done."""

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        from langchain_core.outputs import ChatGeneration, ChatResult

        if any(isinstance(m, ToolMessage) for m in messages):
            message = AIMessage("done", id="ai-done")
        else:
            call = {"name": "charge", "args": {"invoice": "inv-1"}, "id": "call_1"}
            message = AIMessage("", id="ai-1", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


async def main(db: str, effects: Path, phase: str, answer: Any) -> None:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        with effects.open("a") as f:
            f.write(invoice + "\n")
            f.flush()
            os.fsync(f.fileno())
        if phase in ("first", "answer"):
            os.kill(os.getpid(), signal.SIGKILL)
        return f"charged {invoice}"

    model = Model(messages=iter([]))
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        agent = create_agent(
            model, tools=[charge], middleware=[IdempotencyMiddleware()], checkpointer=saver
        )
        if phase == "first":
            await agent.ainvoke({"messages": [("user", "pay")]}, CONFIG)
        elif phase == "answer":
            await agent.ainvoke(Command(resume=answer), CONFIG)
        else:
            out = await agent.ainvoke(None, CONFIG)
            pending = [q.value for q in out.get("__interrupt__", ())]
            tools = [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)]
            print(json.dumps({"pending": pending, "tools": tools}, default=str))


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    db, effects, phase = sys.argv[1:4]
    answer = json.loads(sys.argv[4]) if len(sys.argv) > 4 else None
    asyncio.run(main(db, Path(effects), phase, answer))
