"""A Functional API workflow in its own process, for crash tests of ``idempotent_task``.

``python tests/task_crash_worker.py DB EFFECTS THREAD MODE DURABILITY CRASH SHAPE``:

* ``DB`` a SQLite file, or a PostgreSQL DSN (then the Postgres saver);

* ``MODE`` ``ours`` (``@idempotent_task`` with a ``verify`` hook reading the effects file)
  or ``stock`` (``@task``: the control);
* ``CRASH`` ``after_effect`` (dies in the first task right after its effect),
  ``between_tasks`` (dies after the first task returned, before the second starts) or
  ``none`` (runs to the end: the resume);
* ``SHAPE`` ``sequence`` (charge a, then charge b) or ``parallel`` (both at once).

A resume sends the input again when the thread has no checkpoint (a crash before the
first one), else continues it with ``None``. Prints the result as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from effects_file import record, verify_charge
from langgraph.func import entrypoint, task
from resume_rule import asaved_next, resume_input

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.task import idempotent_task

CRASH_EXIT_CODE = 137


async def main(
    db: str, effects: Path, thread: str, mode: str, durability: str, crash: str, shape: str
) -> None:
    charged = verify_charge(effects)

    async def charge_body(invoice: str) -> str:
        record(effects, invoice)
        if crash == "after_effect" and invoice == "inv-a":
            os._exit(CRASH_EXIT_CODE)
        return f"charged {invoice}"

    charge = (
        idempotent_task(name="charge", verify=charged)(charge_body)
        if mode == "ours"
        else task(name="charge")(charge_body)
    )

    opener: Any = AsyncSqliteSaver
    if db.startswith(("postgresql:", "postgres:")) or "dbname=" in db:  # a DSN
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    async with opener.from_conn_string(db) as saver:

        @entrypoint(checkpointer=saver)
        async def pay(invoices: list[str]) -> list[str]:
            if shape == "parallel":
                futures = [charge(inv) for inv in invoices]
                return [await f for f in futures]
            results = []
            for inv in invoices:
                results.append(await charge(inv))
                if crash == "between_tasks":
                    await asyncio.sleep(0.3)  # let the background task write finish
                    os._exit(CRASH_EXIT_CODE)
            return results

        config = {"configurable": {"thread_id": thread}}
        # not `aget_state(config).next`: that live view can look finished (resume_rule.py)
        payload = resume_input(await asaved_next(pay, config), ["inv-a", "inv-b"])
        out = await pay.ainvoke(payload, config, durability=durability)  # type: ignore[arg-type]
    print(json.dumps(out))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    db, effects, thread, mode, durability, crash, shape = sys.argv[1:8]
    asyncio.run(main(db, Path(effects), thread, mode, durability, crash, shape))
