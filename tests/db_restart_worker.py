"""One worker process of the database-restart test (tests/test_db_restart.py).

``python tests/db_restart_worker.py CONFIG`` (``CONFIG``: a JSON object) runs
``config["threads"]`` ``create_agent`` threads (until ``stop``, a file, appears: then no
new one starts), ``lanes`` at a time, each asking for three charges at once (parallel
tool calls, each its own ``Send`` task) and then answering, while the test SIGKILLs and
restarts the PostgreSQL *server* under it. The worker is never killed: it is the
application living through the restart.

* ``stack`` ``ours``: ``AsyncPostgresSaver`` and ``IdempotencyMiddleware`` (its ``verify``
  reads the effects file, and logs what it was asked and found: a call this live
  process finished must never become an unknown outcome); ``stock``: LangGraph's own
  ``AsyncPostgresSaver`` and a plain ``create_agent`` (the control).
* ``conn`` ``pool`` (an ``AsyncConnectionPool``) or ``single`` (``from_conn_string``).
  A stock single connection is dead after a restart: the worker builds a new saver and
  agent then, as its user must (ours reopens its own connection).

Each thread is driven as an application would: resume it (``ainvoke(None)``) after any
error until it is finished. Each effect is one fsync'd line ``thread/invoice`` in
``effects``; every event (a thread finished, an exception and its class, ``verify``
asked) is a JSON line in ``events``. The worker waits for ``go`` (a file) before
starting, so all workers start together, and gives up at ``deadline``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

from langchain.agents import create_agent
from langchain_core.messages import AIMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parent))
from resume_rule import asaved_next, resume_input
from tool_node_helpers import ToolCallingFakeModel

CALLS = 3


class ChargingModel(ToolCallingFakeModel):
    """Asks for three charges of its thread (named by the user message), then answers."""

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        thread = str(messages[0].content)
        if not any(isinstance(m, AIMessage) and m.tool_calls for m in messages):
            calls = [
                {
                    "name": "charge",
                    "args": {"invoice": f"{thread}/inv-{i}"},
                    "id": f"call_{i}",
                    "type": "tool_call",
                }
                for i in range(CALLS)
            ]
            message = AIMessage("", id="ai-charges", tool_calls=calls)
        else:
            message = AIMessage("all charged", id="ai-done")
        return ChatResult(generations=[ChatGeneration(message=message)])


def append(path: Path, line: str, *, sync: bool = False) -> None:
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        if sync:
            os.fsync(f.fileno())


class Worker:
    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.effects = Path(config["effects"])
        self.events = Path(config["events"])
        self.rng = random.Random(config["seed"])
        self.stack: str = config["stack"]
        self.conn: str = config["conn"]
        self.agent: Any = None
        self._close: Any = None
        self._rebuilding = asyncio.Lock()

    def event(self, kind: str, **data: Any) -> None:
        append(
            self.events, json.dumps({"t": time.time(), "pid": os.getpid(), "kind": kind, **data})
        )

    def effects_now(self) -> list[str]:
        return self.effects.read_text().splitlines() if self.effects.exists() else []

    def tools_and_middleware(self) -> tuple[list[Any], list[Any]]:
        delays = self.config["tool_seconds"]
        rng = self.rng

        @tool
        async def charge(invoice: str) -> str:
            """Charge an invoice."""
            await asyncio.sleep(rng.uniform(*delays))
            append(self.effects, invoice, sync=True)
            return f"charged {invoice}"

        if self.stack == "stock":
            return [charge], []
        from langgraph_idem_saver import NOT_APPLIED
        from langgraph_idem_saver.middleware import IdempotencyMiddleware

        def charged(args: dict[str, Any]) -> Any:
            applied = args["invoice"] in self.effects_now()
            self.event("verify", invoice=args["invoice"], applied=applied)
            return f"charged {args['invoice']}" if applied else NOT_APPLIED

        return [charge], [IdempotencyMiddleware(verify={"charge": charged})]

    async def open_saver(self) -> Any:
        """The saver (and what closes it): ours or LangGraph's, on a pool or one connection.
        LangGraph's tables are made by the test beforehand: its ``setup()`` run by two
        workers at once can wait on each other (no lock around its migrations)."""
        from psycopg.rows import dict_row
        from psycopg_pool import AsyncConnectionPool

        dsn = self.config["dsn"]
        if self.stack == "ours":
            from langgraph_idem_saver import AsyncPostgresSaver
        else:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # type: ignore[assignment]
        if self.conn == "pool":
            pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
                dsn,
                min_size=2,
                max_size=4,
                kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
                open=False,
            )
            await pool.open(wait=True)
            saver = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
            return saver, pool.close
        manager = AsyncPostgresSaver.from_conn_string(dsn)
        saver = await manager.__aenter__()

        async def close() -> None:
            with contextlib.suppress(Exception):  # a dead connection may fail to close
                await manager.__aexit__(None, None, None)

        return saver, close

    async def build(self) -> None:
        saver, self._close = await self.open_saver()
        tools, middleware = self.tools_and_middleware()
        self.agent = create_agent(
            ChargingModel(messages=iter([])), tools=tools, middleware=middleware, checkpointer=saver
        )

    async def rebuild(self, agent: Any) -> None:
        """A stock single connection is dead after a restart: a new saver and agent, as
        its user must build by hand (once, whoever of the lanes gets here first)."""
        async with self._rebuilding:
            if self.agent is not agent:
                return
            await self._close()
            while True:
                try:
                    await self.build()
                    return
                except Exception as exc:  # the server still down
                    self.event("error", where="rebuild", type=qualname(exc), text=str(exc)[:200])
                    await asyncio.sleep(0.2)

    async def drive(self, thread: str, deadline: float) -> None:
        config = {"configurable": {"thread_id": thread}}
        while time.monotonic() < deadline:
            agent = self.agent
            try:
                next_tasks = await asaved_next(agent, config)
                if next_tasks == ():
                    self.event("finished", thread=thread)
                    return
                payload = resume_input(next_tasks, {"messages": [("user", thread)]})
                await agent.ainvoke(payload, config)
            except Exception as exc:
                self.event(
                    "error", where="run", thread=thread, type=qualname(exc), text=str(exc)[:300]
                )
                if self.stack == "stock" and self.conn == "single":
                    await self.rebuild(agent)
                await asyncio.sleep(0.1)
        self.event("unfinished", thread=thread)

    async def run(self) -> None:
        await self.build()
        Path(self.config["ready"]).write_text("ready")
        go = Path(self.config["go"])
        while not go.exists():
            await asyncio.sleep(0.01)
        deadline = time.monotonic() + self.config["seconds"]
        lanes = asyncio.Semaphore(self.config["lanes"])

        stop = Path(self.config["stop"])

        async def lane(thread: str) -> None:
            async with lanes:
                if stop.exists():  # the schedule is over: no new thread
                    return
                self.event("started", thread=thread)
                await self.drive(thread, deadline)

        await asyncio.gather(*(lane(t) for t in self.config["threads"]))
        await self._close()


def qualname(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    config = json.loads(sys.argv[1])
    # whatever happens, gone soon after the deadline (the test counts what is unfinished)
    threading.Timer(config["seconds"] + 20, os._exit, (75,)).start()
    asyncio.run(Worker(config).run())
    os._exit(0)  # the timer thread must not keep the process alive
