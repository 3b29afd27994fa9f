"""A ``create_agent`` agent in its own process, for crash tests of ``IdempotencyMiddleware``.

``python tests/agent_crash_worker.py DB EFFECTS THREAD MODE DURABILITY CRASH``:

* ``MODE`` ``ours`` (with the middleware and a ``verify`` hook that reads the effects
  file) or ``stock`` (plain ``create_agent``: the control that shows the duplicate);
* ``CRASH`` ``after_effect`` (the process dies inside the tool, right after its effect),
  ``before_effect`` (inside the tool, before it), ``after_tools`` (in the next model call,
  after every tool returned), ``checkpoint_lost`` (in the saver, as it starts to write the
  checkpoint after the tools: their writes are saved, that checkpoint never lands - what
  durability ``"async"`` leaves when the process dies before it lands) or ``none`` (run
  to the end: the resume).

Each effect is one fsync'd line in ``EFFECTS``; the process dies with ``os._exit`` - no
cleanup, no flush, as a SIGKILL would leave it. Prints the final messages as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import record, verify_charge
from resume_rule import asaved_next, resume_input
from tool_node_helpers import ToolCallingFakeModel, ai_calls

from langgraph_idem_saver import AsyncSqliteSaver, ToolCallInProgress
from langgraph_idem_saver.middleware import IdempotencyMiddleware

CRASH_EXIT_CODE = 137
INVOICES = ["inv-1", "inv-2", "inv-3"]
AFTER_TOOLS_STEP = 2  # -1 input, 0 start, 1 the model asked for the charges, 2 they ran


class CrashingModel(ToolCallingFakeModel):
    """Asks for the charges (fixed message and call ids), then answers; may die first."""

    crash_on_answer: bool = False

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> Any:
        from langchain_core.outputs import ChatGeneration, ChatResult

        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            invoices = INVOICES[: int(os.environ["CALLS"])]
            calls = [("charge", {"invoice": inv}, f"call_{i}") for i, inv in enumerate(invoices)]
            message = ai_calls(*calls, msg_id="ai-charges")
        else:
            if self.crash_on_answer:
                os._exit(CRASH_EXIT_CODE)
            message = AIMessage("all charged", id="ai-done")
        return ChatResult(generations=[ChatGeneration(message=message)])


async def until_written(saver: Any, config: Any, tasks: int) -> None:
    """Wait (a bounded time) until ``tasks`` tasks' writes on ``config``'s checkpoint are
    saved: LangGraph may start the next checkpoint while the last writes are in flight."""
    for _ in range(500):
        saved = await saver.aget_tuple(config)
        if saved is not None and len({w[0] for w in saved.pending_writes or []}) >= tasks:
            return
        await asyncio.sleep(0.02)


def dying_on_checkpoint(saver_class: type, step: int) -> Any:
    """The real saver, dying as it starts to write the checkpoint of ``step``: the tasks
    before it finished and their writes are saved, the checkpoint after them never lands."""

    class Dying(saver_class):  # type: ignore[misc,valid-type]
        async def aput(self, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
            if metadata.get("step") == step:
                await until_written(self, config, int(os.environ["CALLS"]))
                os._exit(CRASH_EXIT_CODE)
            return await super().aput(config, checkpoint, metadata, versions)

    return Dying


async def main(db: str, effects: Path, thread: str, mode: str, durability: str, crash: str) -> None:
    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        if crash == "before_effect":
            os._exit(CRASH_EXIT_CODE)
        record(effects, invoice)
        if crash == "after_effect":
            os._exit(CRASH_EXIT_CODE)
        return f"charged {invoice}"

    charged = verify_charge(effects)

    model = CrashingModel(messages=iter([]), crash_on_answer=crash == "after_tools")
    middleware = [IdempotencyMiddleware(verify={"charge": charged})] if mode == "ours" else []
    opener: Any = AsyncSqliteSaver
    if db.startswith(("postgresql:", "postgres:")) or "dbname=" in db:  # a DSN
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    if crash == "checkpoint_lost":
        opener = dying_on_checkpoint(opener, AFTER_TOOLS_STEP)
    async with opener.from_conn_string(db) as saver:
        agent = create_agent(model, tools=[charge], middleware=middleware, checkpointer=saver)
        config = {"configurable": {"thread_id": thread}}
        for attempt in range(60):  # concurrent resumers: wait out another's live claim
            next_tasks = await asaved_next(agent, config)
            if next_tasks == ():
                break  # finished (by this or another resumer)
            # not `aget_state(config).next`: that live view looks finished when the tasks
            # finished and the checkpoint after them was lost (tests/resume_rule.py)
            payload = resume_input(next_tasks, {"messages": [("user", "pay")]})
            try:
                await agent.ainvoke(payload, config, durability=durability)  # type: ignore[arg-type]
            except ToolCallInProgress:
                await asyncio.sleep(0.2 + 0.05 * attempt)
        out = (await agent.aget_state(config)).values
    print(json.dumps([str(m.content) for m in out["messages"]]))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    db, effects, thread, mode, durability, crash = sys.argv[1:7]
    asyncio.run(main(db, Path(effects), thread, mode, durability, crash))
