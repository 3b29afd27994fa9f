"""Faults from outside the process: SIGKILL mid-write, a lock held by another process,
a Postgres backend terminated mid-statement, a server restart, a full disk.

Each fault is real: child processes (``tests/fault_child.py``) are killed with SIGKILL or
run under ``RLIMIT_FSIZE``; Postgres backends are ended with ``pg_terminate_backend``;
the restart test starts its own throwaway server (``pgserver``) so the session's server
is never disturbed.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import zygote
from fault_child import Db
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from pg_blocking import admin, charge_intent, named_pool, wait_until_blocked
from pg_server import afresh_dsn, throwaway_server
from psycopg_pool import AsyncConnectionPool
from tool_node_helpers import cfg

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.errors import ConnectionClosedError, DatabaseLockedError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome
from langgraph_idem_saver.postgres import AsyncPostgresSaver

CHILD = Path(__file__).with_name("fault_child.py")


def spawn(spec: dict[str, Any], **kwargs: Any) -> subprocess.Popen[str]:
    return zygote.Popen(
        [sys.executable, str(CHILD), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kwargs,
    )


def read_until(proc: subprocess.Popen[str], predicate: Any) -> list[str]:
    """Lines the child printed, up to the first one ``predicate`` accepts."""
    assert proc.stdout is not None
    lines = []
    while True:
        line = proc.stdout.readline()
        if not line:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"child exited early ({proc.wait()}): {err[-2000:]}")
        lines.append(line.strip())
        if predicate(line.strip()):
            return lines


def sigkill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    for stream in (proc.stdout, proc.stderr, proc.stdin):
        if stream is not None:
            stream.close()


def integrity_ok(path: str) -> None:
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []


# ----------------------------------------------------------------------------- SIGKILL


async def test_sigkill_during_aput_loop(db: Db) -> None:
    """A writer killed mid-loop, three times: every acknowledged checkpoint is intact,
    nothing half-written is visible, and a new writer continues the thread."""
    rng = random.Random(42)
    acked: dict[str, tuple[int, str]] = {}
    async with db.open() as saver:
        await saver.setup()
    for round_ in range(3):
        thread = f"loop-{round_}"
        proc = spawn(
            {
                "mode": "put-loop",
                "backend": db.backend,
                "where": db.where,
                "thread": thread,
                "size": 20000,
            }
        )
        target = rng.randint(3, 15)
        lines = read_until(proc, lambda line, t=target: line.startswith(f"ok {t} "))
        # land the kill at a random point of the next write
        await asyncio.sleep(rng.random() * 0.01)
        sigkill(proc)
        _, n, checkpoint_id = lines[-1].split()
        acked[thread] = (int(n), checkpoint_id)
    if db.backend == "sqlite":
        integrity_ok(db.where)
    async with db.open() as saver:
        for thread, (n, checkpoint_id) in acked.items():
            tup = await saver.aget_tuple(cfg(thread, "", checkpoint_id))
            assert tup is not None, thread
            assert tup.checkpoint["channel_values"]["n"] == n
            # the newest row may be the write in flight: complete, or absent
            # the child may have committed more after its last line we read
            latest = await saver.aget_tuple(cfg(thread))
            assert latest is not None
            assert latest.metadata["step"] >= n
            values = latest.checkpoint["channel_values"]
            assert values["payload"] == "p" * 20000 + str(values["n"])
            history = [t.metadata["step"] async for t in saver.alist(cfg(thread))]
            assert history == list(range(len(history), 0, -1))
            # resume: the thread continues from its latest checkpoint
            versions = {"n": saver.get_next_version(None, None)}
            cp = generate_checkpoint(channel_values={"n": -1}, channel_versions=versions)
            await saver.aput(latest.config, cp, {"step": 999}, versions)
            again = await saver.aget_tuple(cfg(thread))
            assert again is not None and again.metadata["step"] == 999
    if db.backend == "sqlite":
        integrity_ok(db.where)


async def test_sigkill_during_ledger_commits(db: Db) -> None:
    """A process killed while claiming and finishing calls: every acknowledged claim and
    outcome is there, the in-flight claim (if committed) is an unknown outcome at once
    (its owner is dead), and an operator can settle it."""
    rng = random.Random(7)
    async with db.open() as saver:
        await saver.setup()
    expected: dict[str, tuple[int, int]] = {}
    for round_ in range(3):
        thread = f"ledger-{round_}"
        proc = spawn(
            {"mode": "ledger-loop", "backend": db.backend, "where": db.where, "thread": thread}
        )
        target = rng.randint(2, 10)
        stop = rng.choice(["issued", "done"])
        lines = read_until(proc, lambda line, t=target, s=stop: line == f"{s} {t}")
        await asyncio.sleep(rng.random() * 0.005)
        sigkill(proc)
        done = max((int(x.split()[1]) for x in lines if x.startswith("done")), default=0)
        issued = max(int(x.split()[1]) for x in lines if x.startswith("issued"))
        expected[thread] = (done, issued)
    if db.backend == "sqlite":
        integrity_ok(db.where)
    async with db.open() as saver:
        unknown = {(e.scope, e.key): e for e in await saver.alist_unknown()}
        for thread, (done, issued) in expected.items():
            entries = {e.key: e for e in await saver.alist_entries(thread)}
            for n in range(1, done + 1):
                e = entries[f"key-{n}"]
                assert e.status is CallStatus.COMPLETED
                assert saver.serde.loads_typed((e.result_type, e.result))["charged"] == n
            assert f"key-{issued}" in entries
            # one call at a time: every entry but the newest is finished, none is missing
            last = max(int(k.split("-")[1]) for k in entries)
            assert sorted(entries) == sorted(f"key-{n}" for n in range(1, last + 1))
            for e in entries.values():
                if int(e.key.split("-")[1]) < last:
                    assert e.status is CallStatus.COMPLETED, e.key
                if e.status is CallStatus.ISSUED:
                    assert (e.scope, e.key) in unknown  # dead owner: unknown at once
                    settled = await saver.aresolve(e, Outcome.failed("settled by operator"))
                    assert settled is not None and settled.status is CallStatus.FAILED
        assert await saver.alist_unknown() == []
    if db.backend == "sqlite":
        integrity_ok(db.where)


# ----------------------------------------------------------------------------- SQLite lock


@pytest.fixture
def lock_holder(tmp_path: Path) -> Iterator[Any]:
    """Start a child process holding the write lock of ``path``; yields ``start(path)``."""
    procs: list[subprocess.Popen[str]] = []

    def start(path: str) -> subprocess.Popen[str]:
        proc = spawn({"mode": "hold-lock", "where": path}, stdin=subprocess.PIPE)
        procs.append(proc)
        read_until(proc, lambda line: line == "locked")
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            sigkill(proc)


def release(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None
    proc.stdin.write("release\n")
    proc.stdin.flush()
    read_until(proc, lambda line: line == "released")
    proc.wait(10)


async def test_sqlite_locked_by_another_process(tmp_path: Path, lock_holder: Any) -> None:
    path = str(tmp_path / "locked.sqlite")
    db = Db("sqlite", path)
    async with db.open() as saver:
        stored = await saver.aput(cfg("kept"), generate_checkpoint(), {"step": 1}, {})
    before = await db.snapshot()
    intent = CallIntent(
        scope="t",
        key="k",
        thread_id="t",
        agent_path="tools",
        tool_name="charge",
        args_hash="h",
        args=b"{}",
        tool_call_id="call-1",
    )
    async with db.open(busy_timeout=0.2) as saver:
        await saver.setup()
        holder = lock_holder(path)
        with pytest.raises(DatabaseLockedError, match="busy_timeout"):
            await saver.aput(cfg("new"), generate_checkpoint(), {"step": 2}, {})
        with pytest.raises(DatabaseLockedError):
            await saver.aclaim([intent], owner="h:1:x", lease_seconds=60)
        with pytest.raises(DatabaseLockedError):
            await saver.aput_writes(stored, [("a", 1)], "task")
        # reads are not blocked by a writer (WAL)
        assert await saver.aget_tuple(cfg("kept")) is not None
        release(holder)
        assert await db.snapshot() == before  # the refused calls wrote nothing
        # retryable: the same calls now succeed
        await saver.aput(cfg("new"), generate_checkpoint(), {"step": 2}, {})
        [outcome] = await saver.aclaim([intent], owner="h:1:x", lease_seconds=60)
        assert outcome.claimed
    integrity_ok(path)


async def test_sqlite_lock_released_within_busy_timeout(tmp_path: Path, lock_holder: Any) -> None:
    """A lock released while our call waits (busy_timeout is long): the call succeeds."""
    path = str(tmp_path / "wait.sqlite")
    async with AsyncSqliteSaver.from_conn_string(path, busy_timeout=60) as saver:
        await saver.setup()
        holder = lock_holder(path)
        write = asyncio.create_task(
            saver.aput(cfg("waited"), generate_checkpoint(), {"step": 1}, {})
        )
        await asyncio.sleep(0.2)  # let the write start waiting on the lock
        assert not write.done()
        await asyncio.to_thread(release, holder)
        stored = await asyncio.wait_for(write, 30)
        assert (await saver.aget_tuple(stored)) is not None


# ----------------------------------------------------------------------------- Postgres


@pytest.fixture
async def pg(request: pytest.FixtureRequest) -> str:
    return await afresh_dsn(request.getfixturevalue("pg_server_dsn"))


async def test_pg_backend_terminated_during_claim(pg: str) -> None:
    """pg_terminate_backend while a claim waits on a row lock: ConnectionClosedError,
    no claim recorded, and the ledger is consistent for the next process. The saver
    ``from_conn_string`` made owns its connection: its next call opens a new one."""
    async with AsyncPostgresSaver.from_conn_string(pg) as saver:
        await saver.aclaim([charge_intent("kept")], owner="h:1:a", lease_seconds=60)
        assert isinstance(saver.conn, psycopg.AsyncConnection)
        pid = saver.conn.info.backend_pid
        blocker = await psycopg.AsyncConnection.connect(pg)
        try:  # an open transaction that inserted the same key: our INSERT waits on it
            await blocker.execute(
                "INSERT INTO idem_tool_calls (scope, key, thread_id, tool_name, args_hash, "
                "args, tool_call_id, status, owner, issued_at, lease_expires_at) "
                "VALUES ('t', 'contended', 't', 'x', 'h', '', 'c', 'issued', 'o', 0, 0)"
            )
            claim = asyncio.create_task(
                saver.aclaim([charge_intent("contended")], owner="h:1:b", lease_seconds=60)
            )
            await wait_until_blocked(pg)
            async with await admin(pg) as conn:
                await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            with pytest.raises(ConnectionClosedError):
                await asyncio.wait_for(claim, 10)
        finally:
            await blocker.rollback()
            await blocker.close()
        reopened = await saver.aget_entry("t", "kept")  # on a new connection
        assert reopened is not None and reopened.status is CallStatus.ISSUED
        assert saver.conn.info.backend_pid != pid
    async with AsyncPostgresSaver.from_conn_string(pg) as fresh:
        assert await fresh.aget_entry("t", "contended") is None
        kept = await fresh.aget_entry("t", "kept")
        assert kept is not None and kept.status is CallStatus.ISSUED
        [again] = await fresh.aclaim([charge_intent("contended")], owner="h:1:c", lease_seconds=60)
        assert again.claimed


async def test_pg_backend_terminated_during_finish_with_a_pool(pg: str) -> None:
    """The outcome write dies with its backend: never half written, and kept - the saver
    writes it again on the pool's next connection (``held_outcomes``), so the call that
    recorded it returns the entry completed, once the row is free."""
    async with named_pool(pg, "idem-fault-pool", 2) as pool:
        saver = AsyncPostgresSaver(pool)
        await saver.aclaim([charge_intent("k")], owner="h:1:a", lease_seconds=60)
        type_, data = saver.serde.dumps_typed({"charged": 1})

        async def finish() -> Any:
            outcome = Outcome.completed(type_, data)
            await saver.record_outcome("t", "k", owner="h:1:a", outcome=outcome)
            return await saver.aget_entry("t", "k")

        blocker = await psycopg.AsyncConnection.connect(pg)
        try:  # lock the row: our UPDATE waits on it
            await blocker.execute("SELECT 1 FROM idem_tool_calls WHERE key = 'k' FOR UPDATE")
            task = asyncio.create_task(finish())
            await wait_until_blocked(pg)
            async with await admin(pg) as conn:
                await conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = 'idem-fault-pool' AND wait_event_type = 'Lock'"
                )
            await asyncio.sleep(0.3)  # the retry waits on the row lock too
            assert not task.done()
            entry = await asyncio.wait_for(saver.aget_entry("t", "k"), 10)
            assert entry is not None and entry.status is CallStatus.ISSUED  # not half written
        finally:
            await blocker.rollback()
            await blocker.close()
        done = await asyncio.wait_for(task, 10)
        assert done.status is CallStatus.COMPLETED
        assert saver.serde.loads_typed((done.result_type, done.result)) == {"charged": 1}


@pytest.fixture(scope="module")
def own_pg_server() -> Iterator[Any]:
    """A second throwaway server, ours to restart (the session's is shared)."""
    server = throwaway_server("idem-fault-pg-")  # watched: stopped even if pytest is killed
    try:
        yield server
    finally:
        server.cleanup()


def restart(server: Any) -> None:
    from pgserver._commands import pg_ctl

    pg_ctl(
        ["-w", "-m", "fast", "restart"], pgdata=server.pgdata, user=server.system_user, timeout=60
    )


@pytest.fixture
async def restartable(own_pg_server: Any) -> AsyncIterator[tuple[Any, str]]:
    dsn = await afresh_dsn(str(own_pg_server.get_uri()))
    yield own_pg_server, dsn


async def test_pg_server_restart_single_connection(restartable: tuple[Any, str]) -> None:
    """A saver on the user's own connection cannot replace it: after a restart its calls
    raise ConnectionClosedError (``from_conn_string``'s reopens: test_db_restart.py)."""
    server, dsn = restartable
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        saver = AsyncPostgresSaver(conn)
        stored = await saver.aput(cfg("before"), generate_checkpoint(), {"step": 1}, {})
        await saver.aclaim([charge_intent("k")], owner="h:1:a", lease_seconds=60)
        await asyncio.to_thread(restart, server)
        with pytest.raises(ConnectionClosedError):
            await saver.aget_tuple(cfg("before"))
        with pytest.raises(ConnectionClosedError):
            await saver.aclaim([charge_intent("k2")], owner="h:1:a", lease_seconds=60)
    async with AsyncPostgresSaver.from_conn_string(dsn) as fresh:
        tup = await fresh.aget_tuple(cfg("before"))
        assert tup is not None and tup.config == stored
        entry = await fresh.aget_entry("t", "k")
        assert entry is not None and entry.status is CallStatus.ISSUED
        assert await fresh.aget_entry("t", "k2") is None


async def test_pg_server_restart_with_a_pool(restartable: tuple[Any, str]) -> None:
    """After a restart every pooled connection is dead: one call may fail with a
    retryable ConnectionClosedError, the retry works, and nothing committed is lost."""
    server, dsn = restartable
    async with AsyncConnectionPool(
        dsn, min_size=2, max_size=2, kwargs={"autocommit": True}, open=False
    ) as pool:
        await pool.wait()
        saver = AsyncPostgresSaver(pool)
        stored = await saver.aput(cfg("before"), generate_checkpoint(), {"step": 1}, {})
        await asyncio.to_thread(restart, server)
        failures = 0
        for _ in range(3):
            try:
                tup = await saver.aget_tuple(cfg("before"))
            except ConnectionClosedError as exc:
                assert "retry" in str(exc)
                failures += 1
                continue
            break
        assert failures <= 1
        assert tup is not None and tup.config == stored
        after = await saver.aput(cfg("after"), generate_checkpoint(), {"step": 2}, {})
        assert await saver.aget_tuple(after) is not None


# ----------------------------------------------------------------------------- disk full


async def test_sqlite_disk_full(tmp_path: Path) -> None:
    """Writes past RLIMIT_FSIZE fail with a clear error; the connection still reads, and
    the database reopens with everything committed before."""
    path = str(tmp_path / "full.sqlite")
    db = Db("sqlite", path)
    async with db.open() as saver:
        for i in range(5):
            await saver.aput(cfg("before"), generate_checkpoint(), {"step": i}, {})
    before = [t.config async for t in _list(db)]
    proc = zygote.run(
        [
            sys.executable,
            str(CHILD),
            json.dumps(
                {
                    "mode": "disk-full",
                    "where": path,
                    "thread": "fill",
                    "headroom": 256 * 1024,
                    "chunk": 20000,
                }
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["error_type"] is not None, "the size limit was never hit"
    assert report["written"] >= 1
    message = report["message"].lower()
    assert "full" in message or "disk" in message or "i/o" in message, report
    assert "IdemSaverError" in report["error_mro"] or "OperationalError" in report["error_mro"]
    assert report["readable_after"]
    integrity_ok(path)
    after = {json.dumps(c, sort_keys=True) async for c in _configs(db)}
    assert {json.dumps(c, sort_keys=True) for c in before} <= after
    async with db.open() as saver:
        fills = [t async for t in saver.alist(cfg("fill"))]
        assert len(fills) >= report["written"]
        for t in fills:
            assert len(t.checkpoint["channel_values"]["big"]) == 40000
        await saver.aput(cfg("later"), generate_checkpoint(), {"step": 9}, {})


async def _list(db: Db) -> AsyncIterator[Any]:
    async with db.open() as saver:
        async for t in saver.alist(None):
            yield t


async def _configs(db: Db) -> AsyncIterator[Any]:
    async for t in _list(db):
        yield t.config
