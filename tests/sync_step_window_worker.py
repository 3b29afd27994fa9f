"""A sync ``graph.invoke`` step of two calls in its own process, killed (SIGKILL, by the
test) while the first call's outcome row waits for its sibling
(``sync_step_writes.SyncStepWrites``: a row waits until the step's last ledgered call
returned, at most ``WINDOW``), then resumed in a fresh process.

``python tests/sync_step_window_worker.py BACKEND DB EFFECTS MARKERS THREAD NODE PHASE``:

* ``BACKEND`` ``sqlite`` (``DB`` a file) or ``postgres`` (``DB`` a DSN), each over the
  user's own connection, as LangGraph's docs open them;
* ``NODE`` ``idem`` (``IdempotentToolNode`` with a ``verify`` reading the effects file) or
  ``stock`` (LangGraph's ``ToolNode``: the control that shows the duplicate);
* ``PHASE`` ``run``: ``charge("fast")`` records its effect and returns; ``charge("slow")``
  records its effect, waits until ``fast`` has returned - for ``idem``, until its row was
  handed and waits unsent (the window set to 60 s, so the row surely waits) - then writes
  ``MARKERS/ready`` and hangs until the test kills the process. ``resume``: run the thread
  to its end (the default window) and print the tool messages as JSON.

Each effect is one fsync'd line in ``EFFECTS`` (``effects_file.record``).
"""

from __future__ import annotations

import json
import sqlite3
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from effects_file import effects_of, record, verify_charge
from resume_rule import resume_input, saved_next
from tool_node_helpers import ai_calls, tool_graph, tool_messages

from langgraph_idem_saver.sync_step_writes import SyncStepWrites

CALLS = [("charge", {"invoice": "fast"}, "call_fast"), ("charge", {"invoice": "slow"}, "call_slow")]


@contextmanager
def open_saver(backend: str, db: str) -> Iterator[Any]:
    if backend == "sqlite":
        from langgraph_idem_saver.sqlite import SqliteSaver

        conn = sqlite3.connect(db, check_same_thread=False)
        try:
            with SqliteSaver(conn) as saver:
                saver.setup()
                yield saver
        finally:
            conn.close()
        return
    import psycopg

    from langgraph_idem_saver.postgres import PostgresSaver

    with (
        psycopg.Connection.connect(db, autocommit=True, prepare_threshold=0) as conn,
        PostgresSaver(conn) as saver,
    ):
        saver.setup()
        yield saver


def wait_for(done: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"never saw {what}")
        time.sleep(0.005)


def main(
    backend: str, db: str, effects: Path, markers: Path, thread: str, node: str, phase: str
) -> None:
    handed = markers / "handed"
    if phase == "run" and node == "idem":
        SyncStepWrites.WINDOW = 60.0  # the row waits for its sibling: the point under test
        real_hand = SyncStepWrites.hand

        def hand(writes: SyncStepWrites, plan: Any, result: Any) -> bool:
            taken = real_hand(writes, plan, result)
            if taken:
                handed.write_text("yes")  # waiting unsent (the sibling has not returned)
            return taken

        SyncStepWrites.hand = hand  # type: ignore[method-assign]

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        record(effects, invoice)
        if phase == "run" and invoice == "slow":
            if node == "idem":
                wait_for(handed.exists, "fast's row handed")
            else:  # stock: fast returns right after its effect
                wait_for(lambda: "fast" in effects_of(effects), "fast's effect")
                time.sleep(0.2)
            (markers / "ready").write_text("yes")
            time.sleep(600)  # killed here
        return f"charged {invoice}"

    with open_saver(backend, db) as saver:
        if node == "stock":
            from langgraph.prebuilt import ToolNode

            tools: Any = ToolNode([charge])
        else:
            from langgraph_idem_saver import IdempotentToolNode

            tools = IdempotentToolNode([charge], verify={"charge": verify_charge(effects)})
        graph = tool_graph(tools, saver)
        config: Any = {"configurable": {"thread_id": thread}}
        first = {"messages": [ai_calls(*CALLS, msg_id="ai-window")]}
        out = graph.invoke(resume_input(saved_next(graph, config), first), config)
        print(json.dumps(sorted(str(m.content) for m in tool_messages(out))))


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us
    main(*sys.argv[1:3], Path(sys.argv[3]), Path(sys.argv[4]), *sys.argv[5:8])
