"""``PostgresSaver.close()`` while a call waits for a pooled connection (the pool
exhausted: the test holds its only connection; a server down looks the same to the
call): ``close()`` returns at once, cleanly, and the waiting call raises
``ConnectionClosedError`` having run nothing - on the direct path (a checkpoint read on
the caller's thread) and on the loop path (a ledger call on a worker thread). The
control: without a close, the waiting call runs once the connection comes back.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from langgraph_idem_saver import ConnectionClosedError
from langgraph_idem_saver.postgres import PostgresSaver

KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
CONFIG: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
POOL_TIMEOUT = 30.0  # the waiting call would give up only after this long on its own


def calls(saver: PostgresSaver) -> dict[str, Callable[[], object]]:
    return {
        "direct": lambda: saver.get_tuple(CONFIG),
        "ledger": lambda: asyncio.run(saver.aget_entry("t", "k")),
    }


class Waiting(threading.Thread):
    """Runs ``call`` in a thread; keeps what it returned or raised."""

    def __init__(self, call: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: object = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.call()
        except BaseException as exc:
            self.error = exc


def wait_until_queued(pool: ConnectionPool[Any], thread: threading.Thread) -> None:
    """Return once the pool has a request waiting (the call, in its wait for a
    connection: not merely started), 10 s at most."""
    deadline = time.monotonic() + 10
    while pool.get_stats().get("requests_waiting", 0) == 0:
        assert thread.is_alive() and time.monotonic() < deadline, "the call never waited"
        time.sleep(0.002)


def waiting_connections(dsn: str, name: str) -> int:
    """How many of the database's backends are this test's (the pool's one, held)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            (name,),
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.parametrize("path", ["direct", "ledger"])
@pytest.mark.parametrize("closing", [True, False])
def test_close_while_a_call_waits_for_a_pooled_connection(
    pg_dsn: str, path: str, closing: bool
) -> None:
    name = f"close-waiting-{uuid.uuid4().hex[:8]}"
    kwargs = {**KWARGS, "application_name": name}
    with ConnectionPool(
        pg_dsn, kwargs=kwargs, min_size=1, max_size=1, timeout=POOL_TIMEOUT
    ) as pool:
        saver = PostgresSaver(pool)
        try:
            saver.setup()
            held = pool.getconn()  # the pool is now exhausted
            try:
                waiting = Waiting(calls(saver)[path])
                waiting.start()
                wait_until_queued(pool, waiting)  # waiting for the connection
                if closing:
                    started = time.monotonic()
                    saver.close()  # no error
                    closed_in = time.monotonic() - started
            finally:
                pool.putconn(held)
            waiting.join(POOL_TIMEOUT)
            assert not waiting.is_alive()
        finally:
            saver.close()
        assert waiting_connections(pg_dsn, name) == 1  # the pool's own, nothing of the saver's
    if closing:
        assert closed_in < 5, closed_in  # not the pool's timeout, not 10 s
        assert isinstance(waiting.error, ConnectionClosedError), waiting.error
        assert "nothing of the call ran" in str(waiting.error), waiting.error
    else:  # the control: the same call, not closed under it, runs once it can
        assert waiting.error is None and waiting.result is None


@pytest.mark.parametrize("path", ["direct", "ledger"])
def test_a_call_handed_its_connection_after_close_began_runs_nothing(
    pg_dsn: str, path: str
) -> None:
    """The docstring's "every later call raises": a call waiting for a pooled connection
    that the pool hands it *after* ``close()`` began (the connection freed within the
    call's wait slice) raises ``ConnectionClosedError`` too, having run nothing - it does
    not start its statements under a ``close()`` that then has to wait for them."""
    name = f"close-handed-{uuid.uuid4().hex[:8]}"
    kwargs = {**KWARGS, "application_name": name}
    with ConnectionPool(
        pg_dsn, kwargs=kwargs, min_size=1, max_size=1, timeout=POOL_TIMEOUT
    ) as pool:
        saver = PostgresSaver(pool)
        try:
            saver.setup()
            direct = saver._direct_path
            assert direct is not None
            held = pool.getconn()  # the pool is now exhausted
            waiting = Waiting(calls(saver)[path])
            waiting.start()
            wait_until_queued(pool, waiting)  # waiting for the connection
            closing = threading.Thread(target=saver.close, daemon=True)
            closing.start()
            deadline = time.monotonic() + 10
            while not direct.closed:  # close() has begun (and waits for the call)
                assert time.monotonic() < deadline
                time.sleep(0.001)
            pool.putconn(held)  # handed to the waiting call, within its slice
            waiting.join(POOL_TIMEOUT)
            closing.join(POOL_TIMEOUT)
            assert not waiting.is_alive() and not closing.is_alive()
        finally:
            saver.close()
    assert isinstance(waiting.error, ConnectionClosedError), (waiting.error, waiting.result)
    assert "nothing of the call ran" in str(waiting.error), waiting.error


@pytest.mark.parametrize("call", ["read", "write"])
def test_an_exhausted_pool_fails_a_call_after_one_pool_timeout_not_two(
    pg_dsn: str, call: str
) -> None:
    """A call that got no pooled connection within the pool's ``timeout`` lost nothing in
    transit, so it is not run once more as a call on a lost connection is (that doubled
    the wait: a second full ``timeout``): ``ConnectionClosedError`` after one."""
    timeout = 1.5
    with (
        ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=1, timeout=timeout) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        held = pool.getconn()  # the pool is now exhausted
        try:
            started = time.monotonic()
            with pytest.raises(ConnectionClosedError, match="pool's timeout"):
                if call == "read":
                    saver.get_tuple(CONFIG)
                else:
                    saver.put(CONFIG, empty_checkpoint(), {}, {})
            waited = time.monotonic() - started
        finally:
            pool.putconn(held)
    assert timeout <= waited < 2 * timeout, waited
