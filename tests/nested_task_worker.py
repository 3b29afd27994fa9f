"""A Functional API workflow with nested ``idempotent_task`` s, in its own process
(``tests/test_nested_tasks.py``, issue 36 item 5).

``python tests/nested_task_worker.py '<json scenario>'``: ``pay(["inv-1", "inv-2"])``
calls ``settle(inv)`` for each invoice; ``settle`` (ledgered, no ``verify``: an unknown
outcome of it goes to a human) awaits ``charge(inv)`` then ``notify(inv)``, both ledgered
with a ``verify`` hook that asks the "vendor" (the effects file). With ``crash`` set, the
process dies inside ``notify(crash)``, before its effect (``os._exit``, as a SIGKILL
leaves it).

A resume continues the thread (or re-sends the input when nothing was saved) and answers
every interrupt as the issue's human did: the charge of the invoice asked about landed,
so the call "completed". Prints ``{"result", "asked", "counters"}`` as JSON.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from effects_file import effects_of, record
from langgraph.func import entrypoint
from langgraph.types import Command
from resume_rule import asaved_next, resume_input

from langgraph_idem_saver import NOT_APPLIED, AsyncSqliteSaver
from langgraph_idem_saver.task import idempotent_task

CRASH_EXIT_CODE = 137
INVOICES = ["inv-1", "inv-2"]


async def main(scenario: dict[str, Any]) -> dict[str, Any]:
    effects = Path(scenario["effects"])
    crash = scenario.get("crash")

    def landed(what: str) -> Any:
        def verify(args: dict[str, Any]) -> Any:
            line = f"{what} {args['invoice']}"
            return f"{line} (verified)" if line in effects_of(effects) else NOT_APPLIED

        return verify

    @idempotent_task(verify=landed("charge"))
    async def charge(invoice: str) -> str:
        record(effects, f"charge {invoice}")
        return f"charge {invoice}"

    @idempotent_task(verify=landed("notify"))
    async def notify(invoice: str) -> str:
        if invoice == crash:
            os._exit(CRASH_EXIT_CODE)
        record(effects, f"notify {invoice}")
        return f"notify {invoice}"

    @idempotent_task
    async def settle(invoice: str) -> list[str]:
        return [await charge(invoice), await notify(invoice)]

    opener: Any = AsyncSqliteSaver
    if scenario.get("dsn"):
        from langgraph_idem_saver.postgres import AsyncPostgresSaver

        opener = AsyncPostgresSaver
    async with opener.from_conn_string(scenario.get("dsn") or scenario["db"]) as saver:

        @entrypoint(checkpointer=saver)
        async def pay(invoices: list[str]) -> list[list[str]]:
            return [await settle(inv) for inv in invoices]

        config: Any = {"configurable": {"thread_id": "t"}}
        durability = scenario.get("durability", "sync")
        payload = resume_input(await asaved_next(pay, config), INVOICES)
        out = await pay.ainvoke(payload, config, durability=durability, version="v2")
        asked: list[Any] = []
        while out.interrupts:
            asked += [i.value for i in out.interrupts]
            answers = {
                i.id: {
                    "key": i.value["key"],
                    "attempt": i.value["attempt"],
                    "action": "completed",
                    "result": [f"charge {i.value['args']['invoice']}", "(checked by hand)"],
                }
                for i in out.interrupts
            }
            out = await pay.ainvoke(Command(resume=answers), config, version="v2")
    counters = {t.__name__: t.counters.as_dict() for t in (settle, charge, notify)}
    return {"result": out.value, "asked": asked, "counters": counters}


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    print(json.dumps(asyncio.run(main(json.loads(sys.argv[1])))), flush=True)
