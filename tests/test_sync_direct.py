"""``SqliteSaver``'s direct path: once set up, what ``graph.invoke`` calls on every step
(``get_tuple``, ``put``, ``put_writes``, ``list``, ``get_delta_channel_history``) runs on
the caller's thread, holding the connection lock that every function on the aiosqlite
worker holds too.

Observed through SQLite itself: a ``set_trace_callback`` on the saver's ``sqlite3``
connection records which thread ran each statement, in the order SQLite ran them.

* the checkpoint calls run on the calling thread; the async methods and the ledger on the
  worker; the first call of a saver not yet set up goes through the loop;
* many threads (and the async methods, from another thread) writing and reading one saver
  at once lose nothing and read only whole checkpoints;
* a direct call waits for a transaction in progress on the worker (a ledger claim), and
  no statement of it lands inside that transaction;
* after ``close()`` (also while other threads are calling) every call raises
  ``ConnectionClosedError``, never a raw ``sqlite3`` error.
"""

from __future__ import annotations

import asyncio
import itertools
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from tool_node_helpers import cfg, intent_for

from langgraph_idem_saver import ConnectionClosedError, DatabaseLockedError
from langgraph_idem_saver.sqlite import SqliteSaver

HOWS = ["conn", "from_conn_string"]


@contextmanager
def open_saver(path: Path, how: str) -> Iterator[SqliteSaver]:
    """A set-up ``SqliteSaver`` on a fresh file, built ``how``."""
    if how == "from_conn_string":
        with SqliteSaver.from_conn_string(str(path)) as saver:
            yield saver
        return
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        with SqliteSaver(conn) as saver:
            saver.setup()
            yield saver
    finally:
        conn.close()


class Trace:
    """Every statement SQLite runs on a connection, with the thread that ran it."""

    def __init__(self, conn: sqlite3.Connection | None = None) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.rows: list[tuple[int, str]] = []
        self.hook: Callable[[str], None] | None = None
        if conn is not None:  # else, a recorder for another driver (test_pg_sync_direct)
            conn.set_trace_callback(self._record)

    def _record(self, statement: str) -> None:
        with self.lock:
            self.rows.append((threading.get_ident(), statement))
        if self.hook is not None:
            self.hook(statement)

    def threads_of(self, run: Callable[[], Any]) -> set[int]:
        """The threads that ran the statements of ``run()``."""
        with self.lock:
            start = len(self.rows)
        run()
        with self.lock:
            return {ident for ident, _ in self.rows[start:]}


def put_checkpoint(saver: Any, thread_id: str, step: int, parent: Any = None) -> Any:
    """A checkpoint whose every value says ``step`` (so a torn read shows)."""
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"step": step, "log": [f"{thread_id}:{i}" for i in range(step)]}
    version = saver.get_next_version(None if step == 0 else str(step), None)
    checkpoint["channel_versions"] = {"step": version, "log": version}
    config = parent or {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    metadata: Any = {"source": "loop", "step": step}
    return saver.put(config, checkpoint, metadata, {"step": version, "log": version})


def assert_whole(tup: Any, thread_id: str) -> int:
    """A read checkpoint is one put's, whole; its step."""
    values = tup.checkpoint["channel_values"]
    step = values["step"]
    assert tup.metadata["step"] == step
    assert values["log"] == [f"{thread_id}:{i}" for i in range(step)]
    return int(step)


def per_step_calls(saver: Any, stored: Any) -> list[Callable[[], Any]]:
    """The checkpoint calls ``graph.invoke`` makes on every step, on a saver holding the
    checkpoint ``stored`` of thread "t" (a child of it put, writes, reads, lists)."""
    return [
        lambda: put_checkpoint(saver, "t", 1, stored),
        lambda: saver.put_writes(stored, [("step", 5), ("log", ["w"])], "task-1"),
        lambda: saver.get_tuple(cfg("t", "")),
        lambda: saver.get_tuple(stored),
        lambda: list(saver.list(cfg("t"), limit=1)),
        lambda: list(saver.list(None, filter={"step": 1})),
    ]


@pytest.mark.parametrize("how", HOWS)
def test_checkpoint_calls_run_on_the_callers_thread(tmp_path: Path, how: str) -> None:
    with open_saver(tmp_path / "x.db", how) as saver:
        trace = Trace(saver.conn)
        here = {threading.get_ident()}
        stored = put_checkpoint(saver, "t", 0)
        checkpoint_calls = [
            *per_step_calls(saver, stored),
            lambda: saver.get_delta_channel_history(config=stored, channels=["log"]),
        ]
        for call in checkpoint_calls:
            assert trace.threads_of(call) == here
        assert saver.get_tuple(stored).pending_writes == [  # type: ignore[union-attr]
            ("task-1", "step", 5),
            ("task-1", "log", ["w"]),
        ]
        # the async methods and the ledger run on the aiosqlite worker, as before
        on_worker = trace.threads_of(lambda: asyncio.run(saver.aget_tuple(stored)))
        assert on_worker and not on_worker & here
        intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
        claim = trace.threads_of(
            lambda: asyncio.run(saver.aclaim([intent], owner="me", lease_seconds=60))
        )
        assert claim == on_worker
        # so do the sync maintenance methods
        assert trace.threads_of(lambda: saver.prune(["t"])) == on_worker


def test_a_saver_not_yet_set_up_sets_up_through_the_loop_first(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "x.db", check_same_thread=False)
    trace = Trace(conn)
    here = {threading.get_ident()}
    try:
        with SqliteSaver(conn) as saver:
            first = trace.threads_of(lambda: saver.get_tuple(cfg("t", "")))
            assert first and not first & here, "setup() and the first read: on the worker"
            assert saver.is_setup
            assert trace.threads_of(lambda: saver.get_tuple(cfg("t", ""))) == here
            clone = saver.with_allowlist([("my_app", "Thing")])
            assert trace.threads_of(lambda: put_checkpoint(clone, "t", 0)) == here
    finally:
        conn.close()


@pytest.mark.parametrize("how", HOWS)
def test_many_threads_write_and_read_one_saver(tmp_path: Path, how: str) -> None:
    """Six threads put chains and read back on their own threads, two read everyone's
    latest, one puts through the async methods (on the worker): every checkpoint and
    write lands, and every read is a whole checkpoint of its thread."""
    with open_saver(tmp_path / "x.db", how) as saver:
        write_and_read_from_many_threads(saver, 25)


def write_and_read_from_many_threads(saver: Any, steps: int) -> None:
    """The test above on ``saver`` (any sync saver): ``steps`` checkpoints per thread."""
    errors: list[BaseException] = []
    done = threading.Event()

    def writer(name: str) -> None:
        try:
            parent = None
            for step in range(steps):
                parent = put_checkpoint(saver, name, step, parent)
                saver.put_writes(parent, [("step", step)], f"task-{step}")
                tup = saver.get_tuple(cfg(name, ""))
                assert tup is not None and assert_whole(tup, name) == step
                assert tup.pending_writes == [(f"task-{step}", "step", step)]
        except BaseException as exc:
            errors.append(exc)

    async def async_writer(name: str) -> None:
        parent = None
        for step in range(steps):
            checkpoint = empty_checkpoint()
            log = [f"{name}:{i}" for i in range(step)]
            checkpoint["channel_values"] = {"step": step, "log": log}
            version = saver.get_next_version(None if step == 0 else str(step), None)
            checkpoint["channel_versions"] = {"step": version, "log": version}
            config = parent or {"configurable": {"thread_id": name, "checkpoint_ns": ""}}
            new = {"step": version, "log": version}
            parent = await saver.aput(config, checkpoint, {"step": step}, new)
            tup = await saver.aget_tuple(cfg(name, ""))
            assert tup is not None and assert_whole(tup, name) == step

    def run_async_writer() -> None:
        try:
            asyncio.run(async_writer("async"))
        except BaseException as exc:
            errors.append(exc)

    def reader() -> None:
        try:
            while not done.is_set():
                for name in [f"w{i}" for i in range(6)] + ["async"]:
                    tup = saver.get_tuple(cfg(name, ""))
                    if tup is not None:
                        assert_whole(tup, name)
                    for listed in saver.list(cfg(name), limit=3):
                        assert_whole(listed, name)
        except BaseException as exc:
            errors.append(exc)

    writers = [threading.Thread(target=writer, args=(f"w{i}",)) for i in range(6)]
    writers.append(threading.Thread(target=run_async_writer))
    readers = [threading.Thread(target=reader) for _ in range(2)]
    for t in writers + readers:
        t.start()
    for t in writers:
        t.join(120)
    done.set()
    for t in readers:
        t.join(120)
    assert errors == []
    for name in [f"w{i}" for i in range(6)] + ["async"]:
        history = list(saver.list(cfg(name)))
        assert [assert_whole(t, name) for t in history] == list(range(steps))[::-1]
        # each the child of the one before
        for child, parent in itertools.pairwise(history):
            assert child.parent_config == parent.config
        if name != "async":
            assert all(len(t.pending_writes or []) == 1 for t in history)


def test_a_direct_call_waits_for_a_transaction_in_progress_on_the_worker(
    tmp_path: Path,
) -> None:
    """A ledger claim (async, on the worker) is held inside its transaction; direct
    ``get_tuple`` and ``put`` calls from other threads wait for it (no deadlock), and none
    of their statements lands between the claim's BEGIN and its COMMIT. (SQLite holds its
    own mutex while the claim is held in a statement, so without the connection lock the
    direct calls would slip in only after it, in some rounds: hence several rounds.)"""
    with open_saver(tmp_path / "x.db", "from_conn_string") as saver:
        parent = put_checkpoint(saver, "t", 0)
        trace = Trace(saver.conn)
        for round in range(5):
            parent = claim_while_direct_calls_wait(saver, trace, round, parent)


def claim_while_direct_calls_wait(saver: Any, trace: Trace, round: int, parent: Any) -> Any:
    """One round: a claim of 20 calls held at its first INSERT while four threads read
    and put; the last checkpoint put."""
    inside, release = threading.Event(), threading.Event()
    worker: list[int] = []

    def hold_the_claim(statement: str) -> None:
        if "INSERT INTO idem_tool_calls" in statement and not inside.is_set():
            worker.append(threading.get_ident())
            inside.set()
            assert release.wait(60)

    trace.hook = hold_the_claim
    with trace.lock:
        trace.rows.clear()
    # a transaction of many statements: many chances to slip in, were there no lock
    intents = [
        intent_for("t", {"name": "charge", "args": {"n": n}, "id": f"c{round}-{n}"})
        for n in range(20)
    ]
    outcomes: list[Any] = []
    reads: list[Any] = []
    puts: list[Any] = []
    errors: list[BaseException] = []
    step = assert_whole(saver.get_tuple(parent), "t")

    def claim() -> None:
        try:
            outcomes.extend(asyncio.run(saver.aclaim(intents, owner="me", lease_seconds=60)))
        except BaseException as exc:
            errors.append(exc)

    def read_and_write(i: int) -> None:
        try:
            reads.append(saver.get_tuple(cfg("t", "")))
            puts.append(put_checkpoint(saver, "t", step + 1 + i, parent))
        except BaseException as exc:
            errors.append(exc)

    claimer = threading.Thread(target=claim)
    claimer.start()
    assert inside.wait(60), "the claim reached its INSERT"
    direct = [threading.Thread(target=read_and_write, args=(i,)) for i in range(4)]
    for t in direct:
        t.start()
    direct[0].join(0.1)  # the direct calls are running into the lock: let them try
    release.set()
    claimer.join(60)
    for t in direct:
        t.join(60)
    trace.hook = None
    assert errors == [] and not claimer.is_alive()
    assert not any(t.is_alive() for t in direct)
    assert len(outcomes) == 20 and len(reads) == len(puts) == 4
    for tup in reads:
        assert_whole(tup, "t")

    # the claim's transaction, as SQLite ran it: only the worker's statements
    with trace.lock:
        rows = list(trace.rows)
    claim_at = next(i for i, (_, s) in enumerate(rows) if "INSERT INTO idem_tool_calls" in s)
    begin = max(i for i in range(claim_at) if rows[i][1].startswith("BEGIN"))
    end = next(i for i in range(claim_at, len(rows)) if rows[i][1] == "COMMIT")
    assert {ident for ident, _ in rows[begin : end + 1]} == set(worker)
    direct_threads = {t.ident for t in direct}
    assert {ident for ident, _ in rows} & direct_threads == direct_threads
    return puts[-1]


@pytest.mark.parametrize("how", HOWS)
def test_calls_after_close_raise_connection_closed(tmp_path: Path, how: str) -> None:
    with open_saver(tmp_path / "x.db", how) as saver:
        stored = put_checkpoint(saver, "t", 0)
        clone = saver.with_allowlist([("my_app", "Thing")])
    for closed in (saver, clone):
        assert_all_closed(closed, stored)


def assert_all_closed(closed: Any, stored: Any) -> None:
    calls: list[Callable[[], Any]] = [
        lambda: closed.get_tuple(stored),
        lambda: put_checkpoint(closed, "t", 1, stored),
        lambda: closed.put_writes(stored, [("step", 1)], "task"),
        lambda: list(closed.list(cfg("t"))),
        lambda: closed.get_delta_channel_history(config=stored, channels=["log"]),
        lambda: asyncio.run(closed.aget_tuple(stored)),
    ]
    for call in calls:
        with pytest.raises(ConnectionClosedError):
            call()


@pytest.mark.parametrize("how", HOWS)
def test_close_while_threads_are_calling(tmp_path: Path, how: str) -> None:
    """Threads read and write while another closes the saver: each call either completes
    or raises ConnectionClosedError (never a raw sqlite3 error, never a hang), and what
    completed is stored."""
    path = tmp_path / "x.db"
    with open_saver(path, how) as saver:
        stored = call_from_threads_until_closed(saver)
    with open_saver(path, "conn") as reopened:
        assert_stored(reopened, stored)


@contextmanager
def calling_from_threads(saver: Any) -> Iterator[dict[str, list[Any]]]:
    """Four threads put and read on ``saver`` until a call raises ConnectionClosedError;
    the block (entered once they made 20 puts) closes the saver. What each stored."""
    errors: list[BaseException] = []
    stored: dict[str, list[Any]] = {}
    started = threading.Barrier(5)

    def caller(name: str) -> None:
        mine = stored.setdefault(name, [])
        parent = None
        try:
            started.wait(30)
            for step in range(10_000):
                parent = put_checkpoint(saver, name, step, parent)
                mine.append(parent)
                saver.get_tuple(parent)
        except ConnectionClosedError:
            return
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller, args=(f"c{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    started.wait(30)
    while sum(len(v) for v in stored.values()) < 20 and not errors:
        threading.Event().wait(0.01)
    yield stored
    for t in threads:
        t.join(60)
    assert errors == [] and not any(t.is_alive() for t in threads)


def call_from_threads_until_closed(saver: Any) -> dict[str, list[Any]]:
    """:func:`calling_from_threads`, closing ``saver`` meanwhile."""
    with calling_from_threads(saver) as stored:
        saver.close()
    return stored


def assert_stored(saver: Any, stored: dict[str, list[Any]]) -> None:
    """Every checkpoint the threads stored reads back whole."""
    for name, configs in stored.items():
        for config in configs:
            tup = saver.get_tuple(config)
            assert tup is not None and assert_whole(tup, name) >= 0


def test_a_direct_write_refused_by_a_locked_database_is_typed_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """A direct ``put`` / ``put_writes`` while another process holds SQLite's write lock:
    ``DatabaseLockedError`` after ``busy_timeout`` (never a raw ``sqlite3`` error), nothing
    of it stored, no transaction left open, and the next call works once the lock is
    gone - the caller's thread ran it (no hop), as every direct call."""
    path = tmp_path / "locked.sqlite"
    with SqliteSaver.from_conn_string(str(path), busy_timeout=0.05) as saver:
        stored = put_checkpoint(saver, "t", 0)
        other = sqlite3.connect(path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")  # the write lock, held by someone else
            with pytest.raises(DatabaseLockedError):
                put_checkpoint(saver, "t", 1, stored)
            with pytest.raises(DatabaseLockedError):
                saver.put_writes(stored, [("step", 5)], "task-1")
            assert not saver.conn.in_transaction
            other.execute("ROLLBACK")
        finally:
            other.close()
        trace = Trace(saver.conn)
        assert trace.threads_of(lambda: put_checkpoint(saver, "t", 2, stored)) == {
            threading.get_ident()
        }
        saver.put_writes(stored, [("step", 6)], "task-2")
        steps = [t.metadata["step"] for t in saver.list(cfg("t"))]
        assert steps == [2, 0]  # the refused step 1 is not there
        tup = saver.get_tuple(stored)
        assert tup is not None
        assert [(task, value) for task, _, value in tup.pending_writes] == [("task-2", 6)]
