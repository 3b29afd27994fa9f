"""Leaving a sync saver's ``with`` block (``with saver:``, ``from_conn_string``) with an
exception in flight while its close outlasts ``CLOSE_SECONDS``: the block's own
exception propagates (the close's ``CloseTimeoutError`` is logged, never raised in its
place); without an exception in flight the same close raises ``CloseTimeoutError``.

Real parts: our sync ``SqliteSaver`` on a SQLite file (over the user's connection, and
``from_conn_string``) and ``PostgresSaver`` over the user's connection to a real
PostgreSQL; the close waits for a direct ``put`` on another thread that another
connection's lock holds back (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: the checkpoint
table locked), let go once the block was left.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_idem_saver.errors import CloseTimeoutError
from langgraph_idem_saver.postgres import PostgresSaver
from langgraph_idem_saver.sqlite import SqliteSaver
from langgraph_idem_saver.sync_bridge import SyncSaverBase


class BlockError(Exception):
    """The block's own error."""


@contextmanager
def sqlite_lock(path: str) -> Iterator[Callable[[], None]]:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        conn.execute("BEGIN IMMEDIATE")

        def release() -> None:
            if conn.in_transaction:
                conn.execute("COMMIT")

        yield release
    finally:
        conn.close()


@contextmanager
def pg_lock(dsn: str) -> Iterator[Callable[[], None]]:
    with psycopg.connect(dsn) as conn:
        conn.execute("LOCK TABLE idem_checkpoints IN ACCESS EXCLUSIVE MODE")
        yield conn.commit


def put_held_back(
    opened: Callable[[], AbstractContextManager[SyncSaverBase[Any]]],
    lock: Callable[[], AbstractContextManager[Callable[[], None]]],
    raise_in_block: bool,
) -> tuple[BaseException | None, list[BaseException]]:
    """Open the saver; under another connection's lock, a direct ``put`` on another
    thread waits; leave the block (raising ``BlockError`` or not), the lock let go only
    after. What leaving the block raised, and what the put raised."""
    put_raised: list[BaseException] = []
    left: BaseException | None = None
    with lock() as release:
        putter: threading.Thread | None = None
        try:
            with opened() as saver:
                config: RunnableConfig = {
                    "configurable": {"thread_id": "exit", "checkpoint_ns": ""}
                }

                def put() -> None:
                    try:
                        saver.put(config, empty_checkpoint(), {}, {})
                    except BaseException as exc:
                        put_raised.append(exc)

                putter = threading.Thread(target=put, daemon=True)
                putter.start()
                putter.join(0.5)  # under way, held back by the lock
                assert putter.is_alive(), put_raised
                if raise_in_block:
                    raise BlockError("the block's own error")
        except BaseException as exc:
            left = exc
        finally:
            release()
            if putter is not None:
                putter.join(60)
                assert not putter.is_alive(), "the put never ended once the lock was let go"
    return left, put_raised


@pytest.fixture(params=["sqlite_with", "sqlite_from_conn_string", "postgres_with"])
def way(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[
    tuple[
        Callable[[], AbstractContextManager[SyncSaverBase[Any]]],
        Callable[[], AbstractContextManager[Callable[[], None]]],
    ]
]:
    if request.param.startswith("sqlite"):
        path = str(tmp_path / "exit.db")
        with SqliteSaver.from_conn_string(path):
            pass  # the tables, before the lock
        if request.param == "sqlite_from_conn_string":
            yield (
                lambda: SqliteSaver.from_conn_string(path, busy_timeout=60.0),
                lambda: sqlite_lock(path),
            )
            return
        # ``with SqliteSaver(conn)``: the user's connection, closed once the put ended
        conn = sqlite3.connect(path, check_same_thread=False)
        try:
            yield lambda: SqliteSaver(conn, busy_timeout=60.0), lambda: sqlite_lock(path)
        finally:
            conn.close()
        return
    # ``with PostgresSaver(conn)``: the user's connection, closed once the put ended (its
    # own close or commit would wait for the held-back statement: psycopg's, not ours)
    dsn: str = request.getfixturevalue("pg_dsn")
    with PostgresSaver.from_conn_string(dsn):
        pass
    with psycopg.Connection.connect(dsn, autocommit=True, prepare_threshold=0) as pg:
        yield lambda: PostgresSaver(pg), lambda: pg_lock(dsn)


def test_the_blocks_own_error_is_not_masked_by_the_close_timeout(
    way: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The block raises ``BlockError`` while the close waits past its bound (1 s) for
    the held-back put: ``BlockError`` leaves the block, in ~1 s; the timeout is logged
    once. The put then lands (the close went on in the background)."""
    monkeypatch.setattr(SyncSaverBase, "CLOSE_SECONDS", 1.0)
    opened, lock = way
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="langgraph_idem_saver.sync_closing"):
        left, put_raised = put_held_back(opened, lock, raise_in_block=True)
    assert isinstance(left, BlockError), repr(left)
    assert time.monotonic() - started < 30
    warned = [r.getMessage() for r in caplog.records if r.name.endswith("sync_closing")]
    assert len(warned) == 1 and "did not finish within 1.0 s" in warned[0], warned
    assert put_raised == []


def test_without_an_error_in_flight_the_close_timeout_is_raised(
    way: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the same held-back close, the block left normally, raises
    ``CloseTimeoutError`` (so the test above sees a close that did time out)."""
    monkeypatch.setattr(SyncSaverBase, "CLOSE_SECONDS", 1.0)
    opened, lock = way
    left, put_raised = put_held_back(opened, lock, raise_in_block=False)
    assert isinstance(left, CloseTimeoutError), repr(left)
    assert put_raised == []
