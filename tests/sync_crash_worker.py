"""A *synchronous* agent in its own process (``graph.invoke``, no event loop anywhere in
the program), for crash tests of ``SqliteSaver`` / ``PostgresSaver``.

``python tests/sync_crash_worker.py BACKEND DB EFFECTS THREAD DOOR CRASH``:

* ``BACKEND`` ``sqlite`` (``DB`` a file, opened as LangGraph's docs do:
  ``SqliteSaver(sqlite3.connect(DB, check_same_thread=False))``) or ``postgres``
  (``DB`` a DSN, ``PostgresSaver(psycopg.Connection)``);
* ``DOOR`` ``tool_node`` (``create_react_agent`` + ``IdempotentToolNode``),
  ``middleware`` (``create_agent`` + ``IdempotencyMiddleware``) or ``task``
  (``@entrypoint`` + ``@idempotent_task``) - each with a sync tool and a sync ``verify``
  that reads the effects file - or ``stock`` (LangGraph's ``ToolNode``: the control that
  shows the duplicate the others prevent);
* ``CRASH`` ``after_effect`` (the process dies inside the tool charging ``inv-2``, right
  after its effect, with ``os._exit``: no cleanup, no flush) or ``none`` (the resume: run
  to the end and print the outcome as JSON).

Each effect is one fsync'd line in ``EFFECTS``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import record, verify_charge
from resume_rule import resume_input, saved_next
from tool_node_helpers import ToolCallingFakeModel, ai_calls

CRASH_EXIT_CODE = 137
INVOICES = ["inv-1", "inv-2", "inv-3"]


class ChargingModel(ToolCallingFakeModel):
    """Asks for every charge at once (fixed message and call ids), then answers."""

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            calls = [("charge", {"invoice": inv}, f"call_{i}") for i, inv in enumerate(INVOICES)]
            message = ai_calls(*calls, msg_id="ai-charges")
        else:
            message = AIMessage("all charged", id="ai-done")
        return ChatResult(generations=[ChatGeneration(message=message)])


@contextmanager
def open_saver(backend: str, db: str) -> Iterator[Any]:
    if backend == "sqlite":
        from langgraph_idem_saver.sqlite import SqliteSaver

        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            with SqliteSaver(conn) as saver:
                yield saver
        finally:
            conn.close()
    else:
        import psycopg

        from langgraph_idem_saver.postgres import PostgresSaver

        with (
            psycopg.Connection.connect(db, autocommit=True, prepare_threshold=0) as conn,
            PostgresSaver(conn) as saver,
        ):
            saver.setup()
            yield saver


def main(backend: str, db: str, effects: Path, thread: str, door: str, crash: str) -> None:
    def charge_once(invoice: str) -> str:
        record(effects, invoice)
        if crash == "after_effect" and invoice == "inv-2":
            os._exit(CRASH_EXIT_CODE)
        return f"charged {invoice}"

    charged = verify_charge(effects)

    config: Any = {"configurable": {"thread_id": thread}}
    with open_saver(backend, db) as saver:
        if door == "task":
            from langgraph.func import entrypoint

            from langgraph_idem_saver import idempotent_task

            @idempotent_task(verify=charged)
            def charge(invoice: str) -> str:
                return charge_once(invoice)

            @entrypoint(checkpointer=saver)
            def pay(invoices: list[str]) -> list[str]:
                return [charge(i).result() for i in invoices]

            out = pay.invoke(resume_input(saved_next(pay, config), INVOICES), config)
            print(json.dumps(out))
            return

        @tool
        def charge(invoice: str) -> str:  # type: ignore[no-redef]
            """Charge an invoice."""
            return charge_once(invoice)

        model = ChargingModel(messages=iter([]))
        if door in ("tool_node", "stock"):
            from langgraph.prebuilt import ToolNode, create_react_agent

            from langgraph_idem_saver import IdempotentToolNode

            node = (
                ToolNode([charge])
                if door == "stock"
                else IdempotentToolNode([charge], verify={"charge": charged})
            )
            graph: Any = create_react_agent(model, node, checkpointer=saver)
        else:
            from langchain.agents import create_agent

            from langgraph_idem_saver import IdempotencyMiddleware

            middleware = IdempotencyMiddleware(verify={"charge": charged})
            graph = create_agent(model, tools=[charge], middleware=[middleware], checkpointer=saver)
        # not `get_state(config).next`: that live view can look finished (tests/resume_rule.py)
        payload = resume_input(saved_next(graph, config), {"messages": [("user", "pay")]})
        out = graph.invoke(payload, config)
        print(json.dumps([str(m.content) for m in out["messages"]]))


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us
    backend, db, effects, thread, door, crash = sys.argv[1:7]
    main(backend, db, Path(effects), thread, door, crash)
