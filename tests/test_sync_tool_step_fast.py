"""A sync front door's private loop, kept per thread (``engine.loops.run_private``),
does what a fresh loop a call did.

``run_private`` runs a sync step's bookkeeping (the claim, an answer, a raised call's
row) on an event loop of the calling thread. It keeps that loop for the thread's next
call instead of making one (a selector and a socket pair) every time; it closes it and
starts afresh when a call leaves something on it (a pending task, a ``BaseException``),
so what a coroutine left behind never runs later - as when every call closed its loop.

The graph test runs the same steps on a real SQLite file twice in one process: as
shipped (one loop per thread, reused) and with a fresh loop forced for every call (the
earlier path); the ledger rows (every column but the owner and the clock's) and the
tool messages must be the same, and the shipped run must have reused its loop.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph, tool_messages

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.engine import loops
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.sqlite import SqliteSaver

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")

COLUMNS = (
    "scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id, "
    "status, attempts, replays, conflicts, result_type, result, error, adopted_by, "
    "position, occurrence"
)


async def this_loop() -> asyncio.AbstractEventLoop:
    return asyncio.get_running_loop()


def in_thread(fn: Any) -> Any:
    """``fn()`` in a fresh thread that then ends (its private loop with it)."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(fn).result()


def test_one_loop_a_thread_reused() -> None:
    def body() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        return loops.run_private(this_loop()), loops.run_private(this_loop())

    first, second = in_thread(body)
    assert first is second
    other, _ = in_thread(body)
    assert other is not first  # each thread its own


def test_a_thread_ending_closes_its_loop() -> None:
    loop, _ = in_thread(lambda: (loops.run_private(this_loop()), None))
    gc.collect()
    assert loop.is_closed()


def test_context_copied_at_each_call() -> None:
    async def read_and_set() -> str:
        seen = VAR.get()
        VAR.set("set inside")
        return seen

    def body() -> list[str]:
        VAR.set("first")
        seen = [loops.run_private(read_and_set())]
        VAR.set("second")
        seen.append(loops.run_private(read_and_set()))
        seen.append(VAR.get())  # a coroutine's set stays in its task's copy
        return seen

    assert in_thread(body) == ["first", "second", "second"]


def test_a_pending_task_is_abandoned_with_its_loop() -> None:
    ran: list[str] = []

    async def leave_a_task() -> asyncio.AbstractEventLoop:
        async def later() -> None:
            await asyncio.sleep(0.05)
            ran.append("later")

        asyncio.get_running_loop().create_task(later())
        return asyncio.get_running_loop()

    async def wait_a_bit() -> asyncio.AbstractEventLoop:
        await asyncio.sleep(0.1)
        return asyncio.get_running_loop()

    def body() -> tuple[asyncio.AbstractEventLoop, asyncio.AbstractEventLoop]:
        return loops.run_private(leave_a_task()), loops.run_private(wait_a_bit())

    left, next_loop = in_thread(body)
    assert left.is_closed() and next_loop is not left
    assert ran == []  # the task left behind never ran on the next call's loop


def test_an_error_keeps_the_loop_a_base_exception_drops_it() -> None:
    async def fail(exc: BaseException) -> None:
        raise exc

    def body() -> list[asyncio.AbstractEventLoop]:
        seen = [loops.run_private(this_loop())]
        with pytest.raises(ValueError, match="own error"):
            loops.run_private(fail(ValueError("own error")))
        seen.append(loops.run_private(this_loop()))
        with pytest.raises(KeyboardInterrupt):
            loops.run_private(fail(KeyboardInterrupt()))
        seen.append(loops.run_private(this_loop()))
        return seen

    before, after_error, after_interrupt = in_thread(body)
    assert after_error is before
    assert after_interrupt is not before and before.is_closed()


def test_refused_inside_a_running_loop() -> None:
    async def inside() -> None:
        coro = this_loop()
        with pytest.raises(ConfigError, match="event loop"):
            loops.run_private(coro)

    asyncio.run(inside())


# --- a real graph: both paths write the same rows ------------------------------------


def make_tools() -> list[Any]:
    @tool
    def charge(i: int) -> str:
        """Charge (a side effect, as the ledger sees it)."""
        return f"charged {i}"

    @tool
    def refuse(i: int) -> str:
        """Fail."""
        raise ValueError(f"refused {i}")

    return [charge, refuse]


STEPS = [
    ("t1", [("charge", {"i": i}, f"c{i}") for i in range(10)]),
    ("t1", [("charge", {"i": i}, f"c{i}") for i in range(10)]),  # the same: replayed
    ("t2", [("charge", {"i": i % 3}, f"d{i}") for i in range(6)] + [("refuse", {"i": 1}, "f1")]),
]


def run_steps(db: Path) -> tuple[list[tuple[Any, ...]], list[list[tuple[str, str, str]]]]:
    conn = sqlite3.connect(db, check_same_thread=False)
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            graph: Any = tool_graph(
                IdempotentToolNode(make_tools(), handle_tool_errors=True), saver
            )
            messages: list[list[tuple[str, str, str]]] = []
            with ThreadPoolExecutor(1) as caller:  # one thread, as a program's main thread
                for n, (thread, calls) in enumerate(STEPS):
                    msg = ai_calls(*calls, msg_id=f"ai-{thread}-{n if n != 1 else 0}")
                    out = caller.submit(graph.invoke, {"messages": [msg]}, cfg(thread)).result()
                    step = tool_messages(out)[-len(calls) :]  # this step's answers
                    messages.append(
                        [(str(m.tool_call_id), str(m.content), str(m.status)) for m in step]
                    )
    finally:
        conn.close()
    with sqlite3.connect(db) as read:
        rows = read.execute(
            f"SELECT {COLUMNS} FROM idem_tool_calls ORDER BY thread_id, tool_call_id, key"
        ).fetchall()
    return rows, messages


@pytest.fixture
def loops_used(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[asyncio.AbstractEventLoop]]:
    """The loops ``run_private`` ran on, in order (the real function, counted)."""
    used: list[asyncio.AbstractEventLoop] = []
    real = loops._private_loop

    def counted() -> asyncio.AbstractEventLoop:
        loop = real()
        used.append(loop)
        return loop

    monkeypatch.setattr(loops, "_private_loop", counted)
    yield used


def test_reused_loop_writes_what_fresh_loops_write(
    tmp_path: Path, loops_used: list[asyncio.AbstractEventLoop], monkeypatch: pytest.MonkeyPatch
) -> None:
    shipped = run_steps(tmp_path / "shipped.db")
    shipped_loops = list(loops_used)

    loops_used.clear()
    counted = loops._private_loop

    def fresh() -> asyncio.AbstractEventLoop:  # the earlier path: a new loop every call
        loops._drop_private_loop()
        return counted()

    monkeypatch.setattr(loops, "_private_loop", fresh)
    general = run_steps(tmp_path / "general.db")

    assert shipped == general
    rows, messages = shipped
    assert len(rows) == 10 + 7  # t1: ten calls; t2: six charges (fork slots) and refuse
    assert {r[9] for r in rows} >= {"completed", "failed"}
    assert messages[1] == messages[0]  # the replay answers what the first run returned
    assert any(status == "error" for _, _, status in messages[2])
    # the shipped run reused the caller thread's loop; the forced one never did
    distinct = {id(loop) for loop in shipped_loops}
    assert len(shipped_loops) >= len(STEPS) and len(distinct) < len(shipped_loops)
    assert len({id(loop) for loop in loops_used}) == len(loops_used) >= len(STEPS)


def test_thread_local_is_per_thread() -> None:
    seen: list[asyncio.AbstractEventLoop] = []
    barrier = threading.Barrier(2)

    def body() -> None:
        barrier.wait()
        seen.append(loops.run_private(this_loop()))

    threads = [threading.Thread(target=body) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(seen) == 2 and seen[0] is not seen[1]


_FORK_SCRIPT = """
import asyncio, concurrent.futures, gc, os, sys, threading
from concurrent.futures import ThreadPoolExecutor
from langgraph_idem_saver.engine.loops import run_private

async def hop():
    # completed from another thread: only the loop's self-pipe wakes it
    fut = concurrent.futures.Future()
    threading.Timer(0.1, fut.set_result, (7,)).start()
    return await asyncio.wrap_future(fut)

pool = ThreadPoolExecutor(1)
assert run_private(hop()) == 7 and pool.submit(run_private, hop()).result() == 7
pid = os.fork()
if pid == 0:
    ok = run_private(hop()) == 7  # the forking thread's first call in the child
    gc.collect()  # both inherited loops unreachable in the child now
    os._exit(0 if ok else 1)
_, status = os.waitpid(pid, 0)
assert status == 0, status
print(run_private(hop()), pool.submit(run_private, hop()).result(), flush=True)
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork: POSIX only")
def test_a_forked_child_leaves_the_parents_loops_working() -> None:
    """A forked child that drops the loops it inherited (its first call in the forking
    thread; the pool's threads do not exist there) must not close them: closing would
    unregister their self-pipes from the epoll instance shared with the parent, and the
    parent's next call waiting on another thread would hang."""
    done = subprocess.run(
        [sys.executable, "-c", _FORK_SCRIPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["7", "7"]
