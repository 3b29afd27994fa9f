"""``PostgresSaver``'s direct path: once set up, what ``graph.invoke`` calls on every step
(``get_tuple``, ``put``, ``put_writes``, ``list``) runs on the caller's thread over the
user's own sync ``Connection`` (under a lock) or ``ConnectionPool``.

Observed through psycopg itself: the user's connections are opened with a
``cursor_factory`` that records which thread executed each statement on them.

* the checkpoint calls run on the calling thread, on the user's connection; the async
  methods, the ledger and maintenance on the user's connections too, from the saver's loop
  or its worker threads; the first call of a saver not yet set up goes through the loop;
  a pipelined connection stays on the loop;
* many threads (and the async methods, from another thread) writing and reading one saver
  at once lose nothing and read only whole checkpoints (a connection, a non-autocommit
  connection, a pool);
* errors are the package's typed errors (a closed or lost connection, a closed pool, a
  read-only session), the same as on the loop path;
* after ``close()`` (also while other threads are calling) every call raises
  ``ConnectionClosedError``; the user's connection stays open;
* a non-autocommit connection commits each call; a ``dict_row`` connection works;
* the ledger and the checkpoints use one ``search_path``: the user's.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from pg_server import fresh_dsn
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool
from test_postgres_specific import kill_backends
from test_sync_direct import (
    Trace,
    assert_all_closed,
    assert_stored,
    assert_whole,
    call_from_threads_until_closed,
    per_step_calls,
    put_checkpoint,
    write_and_read_from_many_threads,
)
from tool_node_helpers import cfg, intent_for

from langgraph_idem_saver import ConnectionClosedError, ReadOnlyDatabaseError
from langgraph_idem_saver.postgres import PostgresSaver

HOWS = ["conn", "pool", "from_conn_string"]
# what LangGraph's docs open a connection with
KWARGS: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


TRACE = Trace()  # every statement run on the user's connections, with its thread


class TracingCursor(psycopg.Cursor[Any]):
    """psycopg's cursor, recording each statement's thread in :data:`TRACE`."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> Any:
        TRACE._record(str(query))  # as SQLite's trace callback would
        return super().execute(query, params, **kwargs)


@contextmanager
def open_saver(dsn: str, how: str, **kwargs: Any) -> Iterator[PostgresSaver]:
    """A set-up ``PostgresSaver`` on ``dsn``, built ``how``, its user connections traced."""
    kwargs = {**KWARGS, "cursor_factory": TracingCursor, **kwargs}
    if how == "from_conn_string":
        with PostgresSaver.from_conn_string(dsn) as saver:
            assert isinstance(saver.conn, psycopg.Connection)
            saver.conn.cursor_factory = TracingCursor
            yield saver
    elif how == "pool":
        with (
            ConnectionPool(dsn, kwargs=kwargs, min_size=1, max_size=4) as pool,
            PostgresSaver(pool) as saver,
        ):
            saver.setup()
            yield saver
    else:
        with psycopg.Connection.connect(dsn, **kwargs) as conn, PostgresSaver(conn) as saver:
            saver.setup()
            yield saver


def loop_side(saver: PostgresSaver) -> set[int]:
    """The threads that run what takes the saver's loop: the loop's own (over a
    Connection), or the saver's worker threads (over a pool)."""
    if isinstance(saver.conn, ConnectionPool):
        named = (t for t in threading.enumerate() if t.name.startswith("PostgresSaver-ledger"))
        return {t.ident for t in named if t.ident is not None}
    ident = saver._runtime.thread.ident
    assert ident is not None
    return {ident}


@pytest.mark.parametrize("how", HOWS)
def test_checkpoint_calls_run_on_the_callers_thread(pg_dsn: str, how: str) -> None:
    with open_saver(pg_dsn, how) as saver:
        here = {threading.get_ident()}
        stored = put_checkpoint(saver, "t", 0)
        history = lambda: saver.get_delta_channel_history(config=stored, channels=["log"])  # noqa: E731
        for call in [*per_step_calls(saver, stored), history]:
            assert TRACE.threads_of(call) == here
        assert saver.get_tuple(stored).pending_writes == [  # type: ignore[union-attr]
            ("task-1", "step", 5),
            ("task-1", "log", ["w"]),
        ]
        # the DeltaChannel read returns here what the async saver returns on its loop: from
        # the latest checkpoint (the child put above), its parent's write
        latest = {"config": cfg("t", ""), "channels": ["log"]}
        on_loop = asyncio.run(saver.aget_delta_channel_history(**latest))  # type: ignore[arg-type]
        assert saver.get_delta_channel_history(**latest) == on_loop  # type: ignore[arg-type]
        assert on_loop["log"]["writes"] == [("task-1", "log", ["w"])]
        # the async methods, the ledger and maintenance: on the user's connections too, but
        # from the saver's loop (a Connection) or its worker threads (a pool)
        intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
        claim = lambda: asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))  # noqa: E731
        for call in (lambda: asyncio.run(saver.aget_tuple(stored)), claim):
            assert set() != TRACE.threads_of(call) <= loop_side(saver)
        assert set() != TRACE.threads_of(lambda: saver.prune(["t"])) <= loop_side(saver)
        assert len(asyncio.run(saver.alist_entries("t"))) == 1


def test_a_saver_not_yet_set_up_sets_up_through_the_loop_first(pg_dsn: str) -> None:
    here = {threading.get_ident()}
    with (
        psycopg.Connection.connect(pg_dsn, **KWARGS, cursor_factory=TracingCursor) as conn,
        PostgresSaver(conn) as saver,
    ):
        assert not saver.is_setup
        assert TRACE.threads_of(lambda: saver.get_tuple(cfg("t", ""))) == loop_side(saver)
        assert saver.is_setup
        assert TRACE.threads_of(lambda: saver.get_tuple(cfg("t", ""))) == here
        clone = saver.with_allowlist([("my_app", "Thing")])
        assert TRACE.threads_of(lambda: put_checkpoint(clone, "t", 0)) == here


def test_a_pipelined_connection_keeps_the_loop_path(pg_dsn: str) -> None:
    """The decision in the module docstring: with ``pipe``, nothing runs on it."""
    with (
        psycopg.Connection.connect(pg_dsn, **KWARGS, cursor_factory=TracingCursor) as conn,
        conn.pipeline() as pipe,
        PostgresSaver(conn, pipe) as saver,
    ):
        saver.setup()
        stored = put_checkpoint(saver, "t", 0)
        assert TRACE.threads_of(lambda: put_checkpoint(saver, "t", 1, stored)) == set()
        assert TRACE.threads_of(lambda: saver.get_tuple(stored)) == set()
        assert assert_whole(saver.get_tuple(cfg("t", "")), "t") == 1


@pytest.mark.parametrize("how", ["conn", "conn-not-autocommit", "pool"])
def test_many_threads_write_and_read_one_saver(pg_dsn: str, how: str) -> None:
    """Six threads put chains and read back on their own threads, two read everyone's
    latest, one puts through the async methods (on the loop): every checkpoint and write
    lands, and every read is a whole checkpoint of its thread (test_sync_direct's test);
    a non-autocommit connection is left outside a transaction."""
    kwargs = {"autocommit": False} if how == "conn-not-autocommit" else {}
    with open_saver(pg_dsn, how.split("-")[0], **kwargs) as saver:
        write_and_read_from_many_threads(saver, 15)
        if isinstance(saver.conn, psycopg.Connection):
            assert saver.conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE


def test_a_non_autocommit_connection_commits_each_call(pg_dsn: str) -> None:
    with (
        open_saver(pg_dsn, "conn", autocommit=False) as saver,
        psycopg.Connection.connect(pg_dsn, autocommit=True) as other,
    ):
        assert isinstance(saver.conn, psycopg.Connection)
        stored = put_checkpoint(saver, "t", 0)
        idle = psycopg.pq.TransactionStatus.IDLE
        assert saver.conn.info.transaction_status == idle
        saver.put_writes(stored, [("step", 1)], "task")
        assert saver.conn.info.transaction_status == idle
        assert saver.get_tuple(stored) is not None
        assert saver.conn.info.transaction_status == idle
        assert other.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
        assert other.execute("SELECT count(*) FROM idem_writes").fetchone() == (1,)


@pytest.mark.parametrize("row_factory", ["dict_row", "tuple_row"])
def test_any_row_factory_on_the_users_connection(pg_dsn: str, row_factory: str) -> None:
    factory = psycopg.rows.dict_row if row_factory == "dict_row" else psycopg.rows.tuple_row
    with open_saver(pg_dsn, "conn", row_factory=factory) as saver:
        here = {threading.get_ident()}
        stored = put_checkpoint(saver, "t", 0)
        child: list[Any] = []
        assert TRACE.threads_of(lambda: child.append(put_checkpoint(saver, "t", 3, stored))) == here
        saver.put_writes(child[0], [("step", 4)], "task")
        got = saver.get_tuple(cfg("t", ""))
        assert got is not None and assert_whole(got, "t") == 3
        assert got.pending_writes == [("task", "step", 4)]
        assert [assert_whole(t, "t") for t in saver.list(cfg("t"))] == [3, 0]


# --- typed errors -----------------------------------------------------------------------


def test_a_closed_or_lost_connection_raises_connection_closed(pg_dsn: str) -> None:
    with (
        psycopg.Connection.connect(pg_dsn, **KWARGS) as conn,
        PostgresSaver(conn) as saver,
        psycopg.Connection.connect(pg_dsn, autocommit=True) as admin,
    ):
        stored = put_checkpoint(saver, "t", 0)
        admin.execute("SELECT pg_terminate_backend(%s)", (conn.info.backend_pid,))
        with pytest.raises(ConnectionClosedError, match="lost"):
            saver.get_tuple(stored)
        conn.close()
        for call in (
            lambda: saver.get_tuple(stored),
            lambda: put_checkpoint(saver, "t", 1, stored),
            lambda: saver.put_writes(stored, [("step", 1)], "task"),
            lambda: list(saver.list(cfg("t"))),
        ):
            with pytest.raises(ConnectionClosedError, match="closed"):
                call()
        # the ledger runs on the user's connection too: the same typed error
        intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
        with pytest.raises(ConnectionClosedError, match="closed"):
            asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))


def test_a_closed_pool_raises_connection_closed(pg_dsn: str) -> None:
    pool: ConnectionPool[Any] = ConnectionPool(pg_dsn, kwargs=KWARGS, min_size=1, max_size=2)
    with pool, PostgresSaver(pool) as saver:
        stored = put_checkpoint(saver, "t", 0)
        pool.close()
        with pytest.raises(ConnectionClosedError, match="pool is closed"):
            saver.get_tuple(stored)
        with pytest.raises(ConnectionClosedError, match="pool is closed"):
            put_checkpoint(saver, "t", 1, stored)
        intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
        with pytest.raises(ConnectionClosedError, match="pool is closed"):
            asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))


def test_a_read_or_a_write_on_a_dead_pooled_connection_is_run_again_once(
    pg_dsn: str,
) -> None:
    """As the async saver: a direct read or write meeting a dead idle pooled connection
    runs again on a fresh one (a write is an upsert of the same rows)."""
    kwargs = {**KWARGS, "application_name": "idem-sync-read-retry"}
    pool: ConnectionPool[Any] = ConnectionPool(pg_dsn, kwargs=kwargs, min_size=2, max_size=2)
    with pool, PostgresSaver(pool) as saver:
        stored = put_checkpoint(saver, "t", 0)
        asyncio.run(kill_backends(pg_dsn, "idem-sync-read-retry"))
        assert saver.get_tuple(stored) is not None
        asyncio.run(kill_backends(pg_dsn, "idem-sync-read-retry"))
        assert len(list(saver.list(cfg("t")))) == 1
        asyncio.run(kill_backends(pg_dsn, "idem-sync-read-retry"))
        put_checkpoint(saver, "t2", 0)
        assert saver.get_tuple(cfg("t2")) is not None


def test_a_read_only_session_raises_the_same_error_on_both_paths(pg_dsn: str) -> None:
    """A pool whose sessions are read-only (set in its conninfo): a direct ``put``, an
    ``aput`` on the loop and a ledger claim raise alike."""
    with open_saver(pg_dsn, "conn") as writable:
        stored = put_checkpoint(writable, "t", 0)
    read_only = pg_dsn.replace(
        "-c search_path", "-c default_transaction_read_only=on -c search_path"
    )
    assert read_only != pg_dsn
    with open_saver(read_only, "pool") as saver:
        assert saver.get_tuple(stored) is not None
        with pytest.raises(ReadOnlyDatabaseError) as direct:
            put_checkpoint(saver, "t", 1, stored)
        checkpoint = empty_checkpoint()
        with pytest.raises(ReadOnlyDatabaseError) as on_loop:
            asyncio.run(saver.aput(stored, checkpoint, {}, {}))
        assert str(direct.value).split(":")[0] == str(on_loop.value).split(":")[0]
        intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
        with pytest.raises(ReadOnlyDatabaseError):
            asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))


# --- close ------------------------------------------------------------------------------


@pytest.mark.parametrize("how", HOWS)
def test_calls_after_close_raise_connection_closed(pg_dsn: str, how: str) -> None:
    with open_saver(pg_dsn, how) as saver:
        stored = put_checkpoint(saver, "t", 0)
        clone = saver.with_allowlist([("my_app", "Thing")])
        users = saver.conn
    for closed in (saver, clone):
        assert_all_closed(closed, stored)
    if how == "from_conn_string":  # the saver's own: closed with the block
        assert users.closed


def test_close_leaves_the_users_connection_open(pg_dsn: str) -> None:
    with psycopg.Connection.connect(pg_dsn, **KWARGS) as conn:
        with PostgresSaver(conn) as saver:
            put_checkpoint(saver, "t", 0)
        assert not conn.closed
        assert conn.execute("SELECT count(*) AS n FROM idem_checkpoints").fetchone() == {"n": 1}


@pytest.mark.parametrize("how", ["conn", "pool"])
def test_close_waits_for_a_direct_call_in_progress(pg_dsn: str, how: str) -> None:
    """A ``put`` held inside its statement: ``close()`` returns only after it finished
    (and stored its checkpoint); the next call raises ConnectionClosedError."""
    inside, release = threading.Event(), threading.Event()
    results: list[Any] = []
    with open_saver(pg_dsn, how) as saver:
        stored = put_checkpoint(saver, "t", 0)

        def hold(statement: str) -> None:
            if "idem_checkpoints" in statement and not inside.is_set():
                inside.set()
                assert release.wait(60)

        TRACE.hook = hold
        try:
            putter = threading.Thread(
                target=lambda: results.append(put_checkpoint(saver, "t", 1, stored))
            )
            putter.start()
            assert inside.wait(60)
            closer = threading.Thread(target=saver.close)
            closer.start()
            closer.join(0.5)
            assert closer.is_alive(), "close() waits for the put in progress"
            release.set()
            closer.join(60)
            putter.join(60)
        finally:
            TRACE.hook = None
            release.set()
        assert not closer.is_alive() and len(results) == 1
        with pytest.raises(ConnectionClosedError):
            saver.get_tuple(stored)
    with open_saver(pg_dsn, "conn") as reopened:
        assert assert_whole(reopened.get_tuple(results[0]), "t") == 1


@pytest.mark.parametrize("how", ["conn", "pool"])
def test_close_while_threads_are_calling(pg_dsn: str, how: str) -> None:
    """Threads read and write while another closes the saver: each call either completes
    or raises ConnectionClosedError (never a raw psycopg error, never a hang), and what
    completed is stored."""
    with open_saver(pg_dsn, how) as saver:
        stored = call_from_threads_until_closed(saver)
    with open_saver(pg_dsn, "conn") as reopened:
        assert_stored(reopened, stored)


# --- one search_path for the checkpoints and the ledger ---------------------------------


def test_the_users_search_path_is_the_ledgers_too(pg_server_dsn: str, pg_dsn: str) -> None:
    """``SET search_path`` on the user's connection before the saver is made: the loop
    path (setup, the ledger) uses it as the direct path does, so every table is in it."""
    elsewhere = fresh_dsn(pg_server_dsn)  # a second empty schema
    schema = psycopg.conninfo.conninfo_to_dict(elsewhere)["options"].split("=")[-1]
    with psycopg.Connection.connect(pg_dsn, **KWARGS) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        with PostgresSaver(conn) as saver:
            stored = put_checkpoint(saver, "t", 0)
            intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
            asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))
            assert saver.get_tuple(stored) is not None
    with psycopg.Connection.connect(elsewhere, autocommit=True) as there:
        assert there.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
        assert there.execute("SELECT count(*) FROM idem_tool_calls").fetchone() == (1,)
    with psycopg.Connection.connect(pg_dsn, autocommit=True) as dsn_schema:
        tables = dsn_schema.execute(
            "SELECT count(*) FROM pg_tables WHERE schemaname = current_schema()"
        ).fetchone()
        assert tables == (0,), "nothing was created in the DSN's schema"
