"""A sync saver closed while a sync step's outcome row waits in its window
(``sync_step_writes.send_waiting``, run by ``sync_bridge`` before the connection
closes), and ``wait_on`` when the ledger's loop stops under a waiting node.

Real parts: our sync ``SqliteSaver`` on a SQLite file and ``PostgresSaver`` on a real
PostgreSQL, each over the user's own connection, closed from a tool's thread while the
graph runs; the outcomes are read back with another connection. The loop test runs a
real event loop in a thread that stops and closes it the way a program's own loop
thread does (``run_forever()`` then ``close()``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool
from sync_step_window_worker import open_saver as opened
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode, errors
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_step_writes import SyncStepWrites, send_waiting, wait_on


def long_window_and_handed(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """A 30 s window (a row waits until its step says otherwise) and an event set once a
    call's row was handed to its step's writes."""
    monkeypatch.setattr(SyncStepWrites, "WINDOW", 30.0)
    handed = threading.Event()
    real_hand = SyncStepWrites.hand

    def hand(writes: SyncStepWrites, plan: Any, result: Any) -> bool:
        taken = real_hand(writes, plan, result)
        handed.set()
        return taken

    monkeypatch.setattr(SyncStepWrites, "hand", hand)
    return handed


def statuses(backend: str, where: str, thread: str) -> dict[str, str]:
    """tool call id -> status, as committed (another connection)."""
    query = "SELECT tool_call_id, status FROM idem_tool_calls WHERE thread_id = "
    if backend == "sqlite":
        with closing(sqlite3.connect(where)) as conn:
            return dict(conn.execute(query + "?", (thread,)).fetchall())
    with psycopg.connect(where, autocommit=True) as conn:
        return dict(conn.execute(query + "%s", (thread,)).fetchall())  # type: ignore[arg-type]


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "close.db")
    return "postgres", request.getfixturevalue("pg_dsn")


def test_closing_the_saver_while_a_row_waits_commits_the_returned_call(
    backend: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sync calls: call 0 returns and its row waits in the window (made 30 s, so only
    the close can end the wait); call 1 then closes the saver from its thread and
    returns. The close sends and commits call 0's row before the connection closes:
    call 0 is ``completed`` (without the flush its row was lost with the loop's timer,
    leaving it ``issued``, an unknown outcome). Call 1's row, handed after the close
    began, is refused with a typed error and left ``issued``; nothing waits out the
    window."""
    kind, where = backend
    handed = long_window_and_handed(monkeypatch)

    with opened(kind, where) as saver:

        @tool
        def work(i: int) -> str:
            """Call 1 closes the saver once call 0's row waits."""
            if i == 1:
                assert handed.wait(30), "call 0 never handed its row"
                saver.close()
            return f"done {i}"

        graph = tool_graph(IdempotentToolNode([work]), saver)
        started = time.monotonic()
        with pytest.raises(Exception) as raised:
            graph.invoke(
                {"messages": [ai_calls(("work", {"i": 0}, "w0"), ("work", {"i": 1}, "w1"))]},
                cfg("closed"),
            )
        assert time.monotonic() - started < 15  # the 30 s window held nothing
    assert type(raised.value).__module__ == errors.__name__, repr(raised.value)
    assert statuses(kind, where, "closed") == {"w0": "completed", "w1": "issued"}


def test_closing_a_saver_with_no_step_running_still_closes(
    backend: tuple[str, str],
) -> None:
    """The flush is a no-op without a live step: close works, is idempotent, and a
    graph run before it left its outcome committed."""
    kind, where = backend

    @tool
    def work(i: int) -> str:
        """A quick tool."""
        return f"done {i}"

    with opened(kind, where) as saver:
        graph = tool_graph(IdempotentToolNode([work]), saver)
        graph.invoke({"messages": [ai_calls(("work", {"i": 0}, "q0"))]}, cfg("quiet"))
        saver.close()
        saver.close()
        assert saver.closed
    assert statuses(kind, where, "quiet") == {"q0": "completed"}


def test_wait_on_a_loop_stopped_after_the_hand_off_raises_instead_of_hanging(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``wait_on`` finds the loop running, hands its coroutine over, and the loop stops
    (its thread then closes it) before running it: the waiting thread gets the typed
    ``ConfigError`` within a few seconds (it waited forever on ``.result()``)."""
    loop = asyncio.new_event_loop()

    def serve() -> None:
        loop.run_forever()
        loop.close()  # what was still queued never runs

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    busy, release = threading.Event(), threading.Event()

    def hold() -> None:  # keeps the loop in one iteration, then stops it
        busy.set()
        release.wait(30)
        loop.stop()

    loop.call_soon_threadsafe(hold)
    assert busy.wait(30)
    real = asyncio.run_coroutine_threadsafe
    handed_off = threading.Event()

    def hand_off(coro: Any, target: asyncio.AbstractEventLoop) -> Any:
        future = real(coro, target)
        handed_off.set()
        return future

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hand_off)
    ran: list[bool] = []
    outcome: list[BaseException | None] = []

    async def step_end() -> None:
        ran.append(True)

    coro = step_end()

    def node() -> None:
        try:
            wait_on(loop, coro)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=node, daemon=True)
    waiter.start()
    try:
        assert handed_off.wait(30)
    finally:
        release.set()
    server.join(30)
    assert loop.is_closed()
    waiter.join(15)
    assert not waiter.is_alive(), "wait_on hung on a loop that stopped"
    assert not ran
    coro.close()  # never run: the loop closed with it queued
    assert len(outcome) == 1 and isinstance(outcome[0], ConfigError), outcome


def test_wait_on_a_running_loop_returns_the_coroutines_answer() -> None:
    """The control: on a loop that keeps running, ``wait_on`` returns the answer."""
    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()

    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    try:
        assert wait_on(loop, answer()) == 42
    finally:
        loop.call_soon_threadsafe(loop.stop)
        server.join(30)
        loop.close()


def test_closing_while_the_steps_end_awaits_a_blocked_write_waits_for_it(
    backend: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The step's end sent its outcome rows, whose write is held back by another
    connection's lock (SQLite: a write transaction; PostgreSQL: the rows locked ``FOR
    UPDATE``), when the saver is closed from another thread: the close waits for that
    write, so once the lock is let go both calls are ``completed`` (the run then meets
    the closed saver at its next checkpoint: a typed error)."""
    kind, where = backend
    monkeypatch.setattr(SyncStepWrites, "WINDOW", 30.0)
    ending = threading.Event()
    steps: list[SyncStepWrites] = []
    real_close = SyncStepWrites.close

    def close(writes: SyncStepWrites) -> int:
        steps.append(writes)
        ending.set()
        return real_close(writes)

    monkeypatch.setattr(SyncStepWrites, "close", close)
    with contextlib_blocker(kind, where) as block, opened(kind, where) as saver:

        @tool
        def work(i: int) -> str:
            """Call 1 takes the other connection's lock before it returns."""
            if i == 1:
                block("lock")
            return f"done {i}"

        graph = tool_graph(IdempotentToolNode([work]), saver)
        raised: list[BaseException] = []

        def run() -> None:
            try:
                graph.invoke(
                    {"messages": [ai_calls(("work", {"i": 0}, "b0"), ("work", {"i": 1}, "b1"))]},
                    cfg("blocked"),
                )
            except BaseException as exc:
                raised.append(exc)

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        try:
            assert ending.wait(30), "the step never ended"
            deadline = time.monotonic() + 30
            while not steps[0].sent:  # the step's end sent the rows: their write is blocked
                assert time.monotonic() < deadline, "the step's end never sent its rows"
                time.sleep(0.001)
            time.sleep(0.1)  # on SQLite the step's end then awaits the write
            closer = threading.Thread(target=saver.close, daemon=True)
            closer.start()
            time.sleep(0.5)  # the close now waits on the blocked write
        finally:
            block("release")
        closer.join(30)
        runner.join(30)
        assert not closer.is_alive() and not runner.is_alive()
    assert statuses(kind, where, "blocked") == {"b0": "completed", "b1": "completed"}
    assert len(raised) == 1 and type(raised[0]).__module__ == errors.__name__, raised


@contextmanager
def contextlib_blocker(kind: str, where: str) -> Iterator[Any]:
    """Another connection that takes (``"lock"``) and lets go of (``"release"``) the lock
    an outcome write waits on."""
    if kind == "sqlite":
        conn = sqlite3.connect(where, isolation_level=None, check_same_thread=False)

        def sqlite_block(what: str) -> None:
            if what == "lock":
                conn.execute("BEGIN IMMEDIATE")
            elif conn.in_transaction:
                conn.execute("COMMIT")

        try:
            yield sqlite_block
        finally:
            conn.close()
        return
    with psycopg.connect(where) as pg:

        def pg_block(what: str) -> None:
            if what == "lock":
                pg.execute("SELECT 1 FROM idem_tool_calls FOR UPDATE")
            elif pg.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                pg.commit()

        yield pg_block


class _DoneAsTheWaitTimesOut(concurrent.futures.Future[Any]):
    """The hand-off's future whose first timed wait ends just as the coroutine
    finishes: it times out, and the future is done by the time it is looked at."""

    def __init__(self, real: concurrent.futures.Future[Any]) -> None:
        super().__init__()
        self.real = real
        self.timed_out = False
        real.add_done_callback(self._copy)

    def _copy(self, real: concurrent.futures.Future[Any]) -> None:
        if real.cancelled():
            self.cancel()
        elif real.exception() is not None:
            self.set_exception(real.exception())
        else:
            self.set_result(real.result())

    def result(self, timeout: float | None = None) -> Any:
        if not self.timed_out and timeout is not None:
            self.timed_out = True
            self.real.result(30)  # finished meanwhile...
            raise concurrent.futures.TimeoutError  # ...as this wait timed out
        return super().result(timeout)


def test_wait_on_returns_the_answer_of_a_coroutine_done_as_a_wait_timed_out(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A one-second wait of ``wait_on`` times out at the instant the step's end finishes:
    its answer is returned (the outcomes are committed), not the wait's own
    ``TimeoutError`` re-raised as if the coroutine had raised it."""
    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    real = asyncio.run_coroutine_threadsafe
    raced: list[_DoneAsTheWaitTimesOut] = []

    def hand_off(coro: Any, target: asyncio.AbstractEventLoop) -> Any:
        raced.append(_DoneAsTheWaitTimesOut(real(coro, target)))
        return raced[-1]

    monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hand_off)

    async def answer() -> int:
        return 42

    try:
        assert wait_on(loop, answer()) == 42
        assert raced and raced[0].timed_out  # the race was met
    finally:
        loop.call_soon_threadsafe(loop.stop)
        server.join(30)
        loop.close()


def test_wait_on_still_raises_the_coroutines_own_timeout_error() -> None:
    """The control: a ``TimeoutError`` the step's end itself raises reaches the caller."""
    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()

    async def times_out() -> None:
        raise TimeoutError("the coroutine's own")

    try:
        with pytest.raises(TimeoutError, match="the coroutine's own"):
            wait_on(loop, times_out())
    finally:
        loop.call_soon_threadsafe(loop.stop)
        server.join(30)
        loop.close()


def test_a_sync_saver_call_done_as_its_wait_timed_out_returns_its_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race in a sync saver's own hop (``sync_bridge._Runtime.call``, which also
    waits a second at a time): a call finished as a wait timed out returns its answer
    (here ``delete_thread``'s None), not the wait's ``TimeoutError``."""
    with SqliteSaver.from_conn_string(str(tmp_path / "race.db")) as saver:
        real = asyncio.run_coroutine_threadsafe
        raced: list[_DoneAsTheWaitTimesOut] = []

        def hand_off(coro: Any, target: asyncio.AbstractEventLoop) -> Any:
            raced.append(_DoneAsTheWaitTimesOut(real(coro, target)))
            return raced[-1]

        monkeypatch.setattr(asyncio, "run_coroutine_threadsafe", hand_off)
        assert saver.delete_thread("nobody") is None
        monkeypatch.undo()
        assert raced and raced[0].timed_out  # the race was met


def test_a_flush_whose_write_outlasts_its_bound_is_logged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """``send_waiting`` (the close's first act) bounded at 0.2 s while call 0's flushed
    row is held back by another connection's write transaction: it returns, and says so
    in a warning - the close then goes on under that write, which nothing else reports
    when the step's end is never reached. Once the lock is let go the write lands and
    the step ends as usual (the saver was not closed here): both calls ``completed``."""
    where = str(tmp_path / "bound.db")
    handed = long_window_and_handed(monkeypatch)
    with contextlib_blocker("sqlite", where) as block, opened("sqlite", where) as saver:

        @tool
        def work(i: int) -> str:
            """Call 1 flushes call 0's row while the lock is held elsewhere."""
            if i == 1:
                assert handed.wait(30), "call 0 never handed its row"
                block("lock")
                try:
                    flush = send_waiting(saver.loop, 0.2)
                    asyncio.run_coroutine_threadsafe(flush, saver.loop).result(30)
                finally:
                    block("release")
            return f"done {i}"

        graph = tool_graph(IdempotentToolNode([work]), saver)
        with caplog.at_level(logging.WARNING, logger="langgraph_idem_saver.sync_step_writes"):
            graph.invoke(
                {"messages": [ai_calls(("work", {"i": 0}, "l0"), ("work", {"i": 1}, "l1"))]},
                cfg("bound"),
            )
    warned = [r.getMessage() for r in caplog.records if "not done after 0.2 s" in r.getMessage()]
    assert warned and "1 outcome write(s)" in warned[0], caplog.text
    assert statuses("sqlite", where, "bound") == {"l0": "completed", "l1": "completed"}
