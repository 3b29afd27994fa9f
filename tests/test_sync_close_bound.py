"""A sync saver's ``close()`` while an outcome write is held back by another connection's
lock (``sync_closing``): one bounded close that raises the typed ``CloseTimeoutError``
past ``CLOSE_SECONDS``, never a second ``aclose()`` of the same stack, the saver closed
at once; and a second ``close()`` from another thread that waits for the first.

Real parts: our sync ``SqliteSaver`` on a SQLite file (another ``sqlite3`` connection in
``BEGIN IMMEDIATE`` holds the write lock) and ``PostgresSaver`` on a real PostgreSQL
(another session holds the ledger's rows ``FOR UPDATE``), each over the user's own
connection, closed from a tool's thread while a sync step's outcome row waits in its
window; the outcomes are read back with another connection.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AsyncExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
from langchain_core.tools import tool
from sync_step_window_worker import open_saver
from test_sync_step_close import contextlib_blocker, long_window_and_handed, statuses
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode, errors
from langgraph_idem_saver.errors import CloseTimeoutError, ConnectionClosedError
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_bridge import SyncSaverBase


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "close.db")
    return "postgres", request.getfixturevalue("pg_dsn")


@contextmanager
def opened(kind: str, where: str) -> Iterator[Any]:
    """The saver over the user's own connection; on SQLite a busy timeout longer than
    every wait here, so the held write waits for the lock rather than failing."""
    if kind == "postgres":
        with open_saver(kind, where) as saver:
            yield saver
        return
    conn = sqlite3.connect(where, check_same_thread=False)
    try:
        with SqliteSaver(conn, busy_timeout=60.0) as saver:
            saver.setup()
            yield saver
    finally:
        conn.close()


def count_acloses(saver: SyncSaverBase[Any]) -> list[float]:
    """Each ``aclose()`` of the saver's own stack, as it starts."""
    stack: AsyncExitStack = saver._runtime.stack
    real = stack.aclose
    started: list[float] = []

    async def aclose() -> None:
        started.append(time.monotonic())
        await real()

    stack.aclose = aclose  # type: ignore[method-assign]
    return started


def two_calls(saver: Any, on_call_1: Callable[[], None]) -> list[BaseException]:
    """A sync step of two calls: call 0 returns and its row waits (a 30 s window); call 1
    runs ``on_call_1`` once that row was handed. What the run raised."""

    @tool
    def work(i: int) -> str:
        """Call 1 runs the test's part once call 0's row waits."""
        if i == 1:
            on_call_1()
        return f"done {i}"

    graph = tool_graph(IdempotentToolNode([work]), saver)
    raised: list[BaseException] = []
    try:
        graph.invoke(
            {"messages": [ai_calls(("work", {"i": 0}, "c0"), ("work", {"i": 1}, "c1"))]},
            cfg("closing"),
        )
    except BaseException as exc:
        raised.append(exc)
    return raised


def test_a_close_held_by_a_lock_raises_close_timeout_error_within_its_bound(
    backend: tuple[str, str],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``CLOSE_SECONDS`` 2 s; call 0's row flushed by the close meets another
    connection's lock. The close raises ``CloseTimeoutError`` (typed, a ``TimeoutError``)
    after ~2 s - not ~50 s then a raw ``TimeoutError`` - and logs what it gave up (the
    call stays ``issued``: an unknown outcome, never re-run). The saver is closed at once
    (a call raises ``ConnectionClosedError`` without waiting), a second ``close()`` raises
    the same error at once, the finalizer starts no second ``aclose()``; once the lock is
    let go, the one close goes on to its end: the row is committed, the loop thread ends."""
    kind, where = backend
    handed = long_window_and_handed(monkeypatch)
    monkeypatch.setattr(SyncSaverBase, "CLOSE_SECONDS", 2.0)
    seen: dict[str, Any] = {}
    with contextlib_blocker(kind, where) as block, opened(kind, where) as saver:
        acloses = count_acloses(saver)
        runtime = saver._runtime

        def close_under_the_lock() -> None:
            assert handed.wait(30), "call 0 never handed its row"
            block("lock")
            try:
                started = time.monotonic()
                try:
                    saver.close()
                except BaseException as exc:
                    seen["error"] = exc
                seen["took"] = time.monotonic() - started
                seen["held"] = statuses(kind, where, "closing")
                started = time.monotonic()
                with pytest.raises(ConnectionClosedError):
                    saver.get_tuple(cfg("closing"))
                with pytest.raises(CloseTimeoutError):
                    saver.close()  # still running past its bound: said again, at once
                runtime._finalizer()  # what garbage collection would run: joins, no 2nd
                seen["after"] = time.monotonic() - started
                seen["acloses"] = len(acloses)
            finally:
                block("release")

        with caplog.at_level(logging.WARNING, logger="langgraph_idem_saver.sync_closing"):
            raised = two_calls(saver, close_under_the_lock)
        runtime.thread.join(60)
        assert not runtime.thread.is_alive(), "the close never ended once the lock was let go"
    error = seen["error"]
    assert isinstance(error, CloseTimeoutError) and isinstance(error, TimeoutError), error
    assert "issued" in str(error) and "never re-run" in str(error)
    assert 1.5 <= seen["took"] < 8, seen["took"]
    assert seen["after"] < 1.5, seen["after"]  # nothing after it waited out a bound again
    assert seen["held"] == {"c0": "issued", "c1": "issued"}  # uncommitted when it raised
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("sync_closing")]
    assert len(warned) == 1 and "never re-run" in warned[0], warned
    assert seen["acloses"] <= 1 and len(acloses) == 1, acloses  # one close, never a second
    assert statuses(kind, where, "closing")["c0"] == "completed"  # the close went on
    assert len(raised) == 1 and type(raised[0]).__module__ == errors.__name__, raised
    assert saver.closed
    saver.close()  # ended: idempotent again
    with pytest.raises(ConnectionClosedError):
        saver.get_tuple(cfg("closing"))


def test_a_second_close_waits_for_the_first_to_commit_the_waiting_row(
    backend: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first ``close()`` (a thread of its own) flushes call 0's row into another
    connection's lock; a second ``close()`` from another thread meanwhile does not return
    while the first still waits (it returned at once, before the row was committed): it
    returns once the lock is let go and the first close committed the row."""
    kind, where = backend
    handed = long_window_and_handed(monkeypatch)
    done: dict[str, Any] = {}
    with contextlib_blocker(kind, where) as block, opened(kind, where) as saver:
        runtime = saver._runtime

        def close(name: str) -> None:
            try:
                saver.close()
                done[name] = statuses(kind, where, "closing")
            except BaseException as exc:
                done[name] = exc

        def two_closers() -> None:
            assert handed.wait(30), "call 0 never handed its row"
            block("lock")
            try:
                first = threading.Thread(target=close, args=("first",), daemon=True)
                first.start()
                deadline = time.monotonic() + 30
                while not runtime.closed:
                    assert time.monotonic() < deadline, "the first close never began"
                    time.sleep(0.001)
                second = threading.Thread(target=close, args=("second",), daemon=True)
                second.start()
                second.join(1.0)
                done["second_waited"] = second.is_alive()
            finally:
                block("release")
            first.join(30)
            second.join(30)
            assert not first.is_alive() and not second.is_alive()

        two_calls(saver, two_closers)
    assert done["second_waited"], "the second close returned while the first still flushed"
    assert done["first"] == done["second"] == {"c0": "completed", "c1": "issued"}, done


def test_a_close_with_nothing_held_is_quick_and_idempotent(
    backend: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: with nothing blocked, close returns well within its bound (short
    here), twice, and the saver's loop thread is gone."""
    kind, where = backend
    monkeypatch.setattr(SyncSaverBase, "CLOSE_SECONDS", 2.0)
    with opened(kind, where) as saver:
        started = time.monotonic()
        saver.close()
        saver.close()
        assert time.monotonic() - started < 2.0
        assert not saver._runtime.thread.is_alive()


def test_a_call_still_running_on_the_loop_when_the_close_ends_gets_a_typed_error(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop-path call (``delete_thread``) waits for a pooled connection (the pool
    exhausted) when the saver closes; the close ends and stops the loop with the call's
    task not finished (the rounds that let answered calls finish made none here), so
    the loop's shutdown cancels it: the caller gets ``ConnectionClosedError``, not a raw
    ``CancelledError``."""
    from psycopg.rows import dict_row
    from psycopg_pool import ConnectionPool

    from langgraph_idem_saver import sync_closing
    from langgraph_idem_saver.postgres import PostgresSaver

    monkeypatch.setattr(sync_closing, "_SETTLE_ROUNDS", 0)
    kwargs = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    with ConnectionPool(pg_dsn, kwargs=kwargs, min_size=1, max_size=1, timeout=30) as pool:
        saver = PostgresSaver(pool)
        try:
            saver.setup()
            held = pool.getconn()  # the pool is now exhausted
            raised: list[BaseException] = []

            def delete() -> None:
                try:
                    saver.delete_thread("anyone")
                except BaseException as exc:
                    raised.append(exc)

            caller = threading.Thread(target=delete, daemon=True)
            try:
                caller.start()
                deadline = time.monotonic() + 10
                while pool.get_stats().get("requests_waiting", 0) == 0:
                    assert time.monotonic() < deadline, "the call never waited"
                    time.sleep(0.002)
                saver.close()
                caller.join(30)
            finally:
                pool.putconn(held)
        finally:
            saver.close()
    assert not caller.is_alive()
    assert len(raised) == 1 and isinstance(raised[0], ConnectionClosedError), raised
