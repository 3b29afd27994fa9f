"""The sync ``PostgresSaver``'s direct path (``postgres/direct.py``): every ``put`` and
``put_writes`` of ``graph.invoke`` runs on the user's connection (under its lock) or a
pooled one, counted in progress so that ``close()`` waits for it, with typed errors.
Real PostgreSQL (the tests' throwaway server, a fresh schema each).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from psycopg_pool import ConnectionPool

from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.postgres import PostgresSaver

THREAD: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
KW: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0}


def put_one(saver: PostgresSaver, n: int, config: RunnableConfig = THREAD) -> RunnableConfig:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"count": n}
    checkpoint["channel_versions"] = {"count": str(n)}
    return saver.put(config, checkpoint, {"step": n}, {"count": str(n)})


@pytest.fixture
def conn(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    with psycopg.Connection.connect(pg_dsn, **KW) as c:
        yield c


@pytest.mark.parametrize("kind", ["connection", "pool"])
def test_put_and_put_writes_store_what_get_tuple_reads(pg_dsn: str, kind: str) -> None:
    if kind == "pool":
        target: Any = ConnectionPool(pg_dsn, min_size=1, max_size=2, kwargs=KW, open=True)
    else:
        target = psycopg.Connection.connect(pg_dsn, **KW)
    try:
        with PostgresSaver(target) as saver:
            saver.setup()
            config = put_one(saver, 1)
            saver.put_writes(config, [("count", 2), ("__error__", "x")], "task")
            got = saver.get_tuple(config)
            assert got is not None
            assert got.checkpoint["channel_values"] == {"count": 1}
            assert sorted(got.pending_writes) == [("task", "__error__", "x"), ("task", "count", 2)]
    finally:
        target.close()


def test_a_closed_user_connection_is_a_typed_error_and_counts_no_call(
    conn: psycopg.Connection[Any],
) -> None:
    saver = PostgresSaver(conn)
    saver.setup()
    config = put_one(saver, 1)
    conn.close()
    with pytest.raises(ConnectionClosedError, match="given to PostgresSaver is closed"):
        saver.put_writes(config, [("count", 2)], "task")
    with pytest.raises(ConnectionClosedError, match="given to PostgresSaver is closed"):
        put_one(saver, 2, config)
    done = threading.Event()
    closer = threading.Thread(target=lambda: (saver.close(), done.set()))
    closer.start()
    # no call left counted in progress: close() does not wait for the failed ones
    assert done.wait(10), "close() waited for calls that had ended"
    closer.join()


def test_close_waits_for_a_direct_call_in_progress_then_refuses_new_ones(
    conn: psycopg.Connection[Any],
) -> None:
    saver = PostgresSaver(conn)
    saver.setup()
    config = put_one(saver, 1)
    path = saver._direct_path
    assert path is not None
    inside, release = threading.Event(), threading.Event()

    def body(c: psycopg.Connection[Any]) -> int:
        inside.set()
        release.wait(10)
        return int(c.execute("SELECT 1").fetchone()[0])  # type: ignore[index]

    results: list[int] = []
    caller = threading.Thread(target=lambda: results.append(path.call(saver.saver, body)))
    caller.start()
    assert inside.wait(10)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (saver.close(), closed.set()))
    closer.start()
    time.sleep(0.3)
    assert not closed.is_set(), "close() returned while a call was running on the connection"
    release.set()
    assert closed.wait(10)
    caller.join()
    closer.join()
    assert results == [1], "the call in progress finished its work"
    with pytest.raises(ConnectionClosedError, match="saver is closed"):
        saver.put_writes(config, [("count", 2)], "task")
    assert not conn.closed, "the user's connection stays open"
