"""``DirectPath.call`` (``postgres/direct.py``) when the call's body fails midway: the
call is no longer counted in progress (``close()`` returns at once), the pooled
connection goes back to its pool and the user's connection's lock is released - for a
database error and for an exception that is not one. Each test ends with a put that
needs the connection (the control that it was given back). Real PostgreSQL.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from psycopg_pool import ConnectionPool

from langgraph_idem_saver.postgres import PostgresSaver

THREAD: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
KW: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0}


class Interrupted(BaseException):
    """Not an ``Exception``: what a KeyboardInterrupt in the body does to the call."""


def put_one(saver: PostgresSaver, n: int) -> RunnableConfig:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"count": n}
    checkpoint["channel_versions"] = {"count": str(n)}
    return saver.put(THREAD, checkpoint, {"step": n}, {"count": str(n)})


def failing_division(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1 / 0")


def interrupted(conn: psycopg.Connection[Any]) -> None:
    conn.execute("SELECT 1")
    raise Interrupted


@pytest.fixture(params=["connection", "pool"])
def target(request: pytest.FixtureRequest, pg_dsn: str) -> Iterator[Any]:
    if request.param == "pool":
        # one connection only: a call that kept it would leave the next waiting
        made: Any = ConnectionPool(pg_dsn, min_size=1, max_size=1, timeout=5, kwargs=KW, open=False)
        made.open(wait=True)
    else:
        made = psycopg.Connection.connect(pg_dsn, **KW)
    try:
        yield made
    finally:
        made.close()


def closes_at_once(saver: PostgresSaver) -> bool:
    done = threading.Event()

    def close() -> None:
        saver.close()
        done.set()

    closer = threading.Thread(target=close)
    closer.start()
    ended = done.wait(10)
    closer.join(10)
    return ended


@pytest.mark.parametrize(
    ("body", "raised"), [(failing_division, psycopg.Error), (interrupted, Interrupted)]
)
def test_a_body_failing_midway_gives_back_the_connection_and_the_count(
    target: Any, body: Any, raised: type[BaseException]
) -> None:
    saver = PostgresSaver(target)
    saver.setup()
    put_one(saver, 1)
    path = saver._direct_path
    assert path is not None
    seen: list[tuple[int, bool]] = []

    def observed(conn: psycopg.Connection[Any]) -> None:
        # the control: inside a call it is counted and holds the connection
        held = (
            target.get_stats()["pool_available"] == 0
            if isinstance(target, ConnectionPool)
            else path.lock.locked()
        )
        seen.append((path._running, held))
        body(conn)

    for _ in range(3):  # more failures than the pool has connections
        with pytest.raises(raised):
            path.call(saver.saver, observed)
    assert seen == [(1, True)] * 3, "inside, the call is counted and holds the connection"
    assert path._running == 0, "a failed call is not left counted in progress"
    if isinstance(target, ConnectionPool):
        stats = target.get_stats()
        assert stats["pool_available"] == 1, f"the pooled connection is back: {stats}"
    else:
        assert not path.lock.locked(), "the user's connection's lock is released"
    # the control: a put that needs the (only) connection, and its row read back
    config = put_one(saver, 2)
    got = saver.get_tuple(config)
    assert got is not None and got.checkpoint["channel_values"] == {"count": 2}
    assert closes_at_once(saver), "close() waited for a call that had failed"
