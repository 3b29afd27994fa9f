"""What only the PostgreSQL backend has to get right.

Connections (pool concurrency, a backend killed mid-transaction, pgbouncer-style
``prepare_threshold=None``, pipeline mode), ``setup()`` on every kind of connection and
under concurrency, flat reads checked with EXPLAIN (rows and buffers touched, never
timings), metadata filters against LangGraph's ``InMemorySaver``, client-side
compression, and the ledger's semantics against the SQLite backend's, call by call.

Every test gets a fresh schema on the session's server (``tests/pg_server.py``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import psycopg
import pytest
from delta_extend import extend
from langgraph.channels import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from pg_blocking import admin, named_pool, wait_until_blocked
from pg_reads import plans_cached_on_empty_tables, scans_during, table_reads
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool
from tool_node_helpers import cfg
from typing_extensions import TypedDict

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    LedgerStateError,
    SchemaVersionError,
)
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome
from langgraph_idem_saver.postgres import AsyncPostgresSaver, sql


def config(thread_id: str = "t", ns: str = "", checkpoint_id: str | None = None) -> Any:
    """``cfg`` that always names a namespace ("" the root)."""
    return cfg(thread_id, ns, checkpoint_id)


async def put(
    saver: Any,
    thread_id: str = "t",
    ns: str = "",
    values: dict[str, Any] | None = None,
    metadata: dict[str, Any] | None = None,
    parent: str | None = None,
) -> Any:
    values = values if values is not None else {"a": "value-a", "b": [1, 2]}
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    cp = generate_checkpoint(channel_values=values, channel_versions=versions)
    return await saver.aput(
        config(thread_id, ns, parent), cp, metadata or {"source": "input", "step": 1}, versions
    )


@pytest.fixture
async def saver(pg_dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as s:
        yield s


# ------------------------------------------------------------------- concurrency


@asynccontextmanager
async def aput_waiting(
    saver: Any, dsn: str, cp: Any, versions: dict[str, Any] | None = None
) -> AsyncIterator[asyncio.Task[Any]]:
    """``saver.aput`` of ``cp`` on thread "busy", started and waiting on an open
    transaction that inserted the same key; that transaction rolls back when the block
    ends, which lets the write through."""
    blocker = await psycopg.AsyncConnection.connect(dsn)
    try:
        await blocker.execute(
            "INSERT INTO idem_checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, "
            "checkpoint, metadata, channel_versions) VALUES ('busy', '', %s, 'x', '', '{}', '{}')",
            (cp["id"],),
        )
        task = asyncio.create_task(saver.aput(config("busy"), cp, {}, versions or {}))
        await wait_until_blocked(dsn)
        yield task
    finally:
        await blocker.rollback()
        await blocker.close()


async def test_pool_runs_independent_calls_concurrently(pg_dsn: str) -> None:
    """A call blocked on one thread's row does not hold up a call on another thread."""
    async with AsyncConnectionPool(pg_dsn, min_size=2, max_size=4, open=False) as pool:
        saver = AsyncPostgresSaver(pool)
        await put(saver, "other")
        async with aput_waiting(saver, pg_dsn, generate_checkpoint()) as blocked:
            # with one connection (or LangGraph's one lock) this would wait for `blocked`
            tup = await asyncio.wait_for(saver.aget_tuple(config("other")), 5)
            assert tup is not None and tup.checkpoint["channel_values"]["a"] == "value-a"
            entries = await asyncio.wait_for(saver.alist_entries("other"), 5)
            assert entries == []
            assert not blocked.done()
        await asyncio.wait_for(blocked, 5)
        assert (await saver.aget_tuple(config("busy"))) is not None


async def test_single_connection_serializes_calls(saver: AsyncPostgresSaver, pg_dsn: str) -> None:
    """One connection runs one call at a time: concurrent calls queue, none fails."""
    await put(saver, "other")
    async with aput_waiting(saver, pg_dsn, generate_checkpoint()) as blocked:
        queued = asyncio.create_task(saver.aget_tuple(config("other")))
        await asyncio.sleep(0.2)
        assert not queued.done()
    await asyncio.wait_for(blocked, 5)
    assert (await asyncio.wait_for(queued, 5)) is not None
    # many concurrent calls on the one connection all complete
    results = await asyncio.gather(*(put(saver, f"t{i}") for i in range(20)))
    assert len({r["configurable"]["thread_id"] for r in results}) == 20


async def test_many_workers_on_a_pool(pg_dsn: str) -> None:
    async with AsyncConnectionPool(
        pg_dsn,
        min_size=4,
        max_size=4,
        kwargs={"autocommit": True, "row_factory": dict_row, "prepare_threshold": 0},
        open=False,
    ) as pool:
        saver = AsyncPostgresSaver(pool)

        async def worker(w: int) -> None:
            parent = None
            for step in range(10):
                stored = await put(
                    saver, f"w{w}", values={"n": step}, metadata={"step": step}, parent=parent
                )
                parent = stored["configurable"]["checkpoint_id"]
                await saver.aput_writes(stored, [("n", step)], f"task-{step}")
                tup = await saver.aget_tuple(config(f"w{w}"))
                assert tup is not None and tup.checkpoint["channel_values"]["n"] == step

        await asyncio.gather(*(worker(w) for w in range(8)))
        for w in range(8):
            assert len([t async for t in saver.alist(config(f"w{w}"))]) == 10


# ------------------------------------------------------------ lost connections


async def test_backend_killed_mid_transaction_single_connection(
    saver: AsyncPostgresSaver,
    pg_dsn: str,
) -> None:
    """pg_terminate_backend while an aput waits: the saver (``from_conn_string``'s: it
    owns the connection) opens a new connection and runs the write once more (an upsert
    of the same rows); that one's backend terminated too: ConnectionClosedError, nothing
    half-written, and the next call works on yet another connection."""
    assert isinstance(saver.conn, psycopg.AsyncConnection)
    pid = saver.conn.info.backend_pid
    cp = generate_checkpoint(channel_values={"big": "x" * 10}, channel_versions={"big": "1"})
    async with aput_waiting(saver, pg_dsn, cp, {"big": "1"}) as task:
        async with await admin(pg_dsn) as conn:
            await conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            for _ in range(500):  # the write again, on a new connection, waits too
                cur = await conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database() AND pid <> %s",
                    (pid,),
                )
                again = await cur.fetchall()
                if again:
                    break
                await asyncio.sleep(0.02)
            assert len(again) == 1
            await conn.execute("SELECT pg_terminate_backend(%s)", (again[0][0],))
        with pytest.raises(ConnectionClosedError, match="lost"):
            await asyncio.wait_for(task, 10)
    assert await saver.aget_tuple(config("busy")) is None  # on a new connection
    assert saver.conn.info.backend_pid != pid
    # the statement was atomic: neither the blob nor the checkpoint was written
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as fresh:
        assert await fresh.aget_tuple(config("busy")) is None
        async with await admin(pg_dsn) as conn:
            cur = await conn.execute("SELECT count(*) FROM idem_blobs WHERE thread_id = 'busy'")
            assert await cur.fetchone() == (0,)


async def wait_until_gone(conn: psycopg.AsyncConnection[Any], pids: list[int]) -> None:
    for _ in range(500):
        cur = await conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s::int[])", [pids]
        )
        row = await cur.fetchone()
        if row == (0,):
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"backends {pids} survived pg_terminate_backend")


async def test_backends_killed_with_a_pool_next_call_works(pg_dsn: str) -> None:
    """Every pooled backend terminated while an aput waits on a row lock: the write runs
    again on a fresh connection (an upsert of the same rows), lands once the row is free,
    and the next calls work."""
    async with named_pool(pg_dsn, "idem-pool-test", 3) as pool:
        saver = AsyncPostgresSaver(pool)
        await put(saver, "t")
        async with aput_waiting(saver, pg_dsn, generate_checkpoint()) as task:
            await kill_backends(pg_dsn, "idem-pool-test")  # every pool connection, idle too
            await wait_until_blocked(pg_dsn)  # the write again, on a fresh connection
            assert not task.done()
        await asyncio.wait_for(task, 10)
        assert await saver.aget_tuple(config("busy")) is not None
        tup = await asyncio.wait_for(saver.aget_tuple(config("t")), 10)
        assert tup is not None
        await put(saver, "after")
        assert await saver.aget_tuple(config("after")) is not None


async def kill_backends(dsn: str, application_name: str) -> None:
    """``pg_terminate_backend`` every backend of ``application_name``, and wait until
    they are gone; the pool is not told (its idle connections now look alive). The wait
    matters: termination is a signal, and a pool's health check could still find an idle
    backend alive."""
    async with await admin(dsn) as conn:
        cur = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", [application_name]
        )
        pids = [row[0] for row in await cur.fetchall()]
        assert pids
        await conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) pid", [pids])
        await wait_until_gone(conn, pids)


async def test_a_read_or_a_write_on_a_dead_pooled_connection_is_run_again_once(
    pg_dsn: str,
) -> None:
    """A read that meets a dead idle pooled connection runs again on a fresh one (it
    changes nothing); so does a checkpoint write (an upsert of the same rows: running it
    twice stores what running it once does)."""
    async with named_pool(pg_dsn, "idem-read-retry", 2) as pool:
        saver = AsyncPostgresSaver(pool)
        await put(saver, "t")
        await kill_backends(pg_dsn, "idem-read-retry")
        assert await asyncio.wait_for(saver.aget_tuple(config("t")), 10) is not None
        await kill_backends(pg_dsn, "idem-read-retry")
        assert len([c async for c in saver.alist(config("t"))]) == 1
        await kill_backends(pg_dsn, "idem-read-retry")
        await asyncio.wait_for(put(saver, "t2"), 10)
        assert await saver.aget_tuple(config("t2")) is not None


async def test_closed_connection_and_closed_pool(pg_dsn: str) -> None:
    conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
    saver = AsyncPostgresSaver(conn)
    await saver.setup()
    await conn.close()
    with pytest.raises(ConnectionClosedError, match="closed"):
        await saver.aget_tuple(config())
    pool = AsyncConnectionPool(pg_dsn, min_size=1, open=False)
    with pytest.raises(ConnectionClosedError, match="pool"):
        await AsyncPostgresSaver(pool).aget_tuple(config())


def test_constructor_rejects_pool_with_pipeline_and_bad_conn() -> None:
    pool = AsyncConnectionPool("dbname=x", open=False)
    with pytest.raises(ValueError, match="Pipeline"):
        AsyncPostgresSaver(pool, pipe=object())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AsyncPostgresSaver("postgresql://")  # type: ignore[arg-type]


# ------------------------------------------------------ connection options


async def exercise(saver: AsyncPostgresSaver) -> None:
    """One of everything: checkpoints, writes, reads, listing, the ledger, deletion."""
    stored = await put(saver, "t", metadata={"source": "loop", "step": 1})
    await saver.aput_writes(stored, [("a", 1), ("b", 2)], "task")
    tup = await saver.aget_tuple(config("t"))
    assert tup is not None and len(tup.pending_writes) == 2
    assert [t.metadata["step"] async for t in saver.alist(config("t"), filter={"step": 1})] == [1]
    intent = CallIntent("t", "k", "t", "", "tool", "h", b"{}", "call-1")
    [claim] = await saver.aclaim([intent], owner="me", lease_seconds=60)
    assert claim.claimed
    await saver.record_outcome("t", "k", owner="me", outcome=Outcome.completed("json", b"1"))
    done = await saver.aget_entry("t", "k")
    assert done is not None and done.status is CallStatus.COMPLETED
    await saver.acopy_thread("t", "t2")
    await saver.aprune(["t2"])
    await saver.adelete_thread("t")
    assert await saver.aget_tuple(config("t")) is None
    assert await saver.aget_entry("t2", "k") is not None


async def test_prepare_threshold_none_prepares_nothing(pg_dsn: str) -> None:
    """pgbouncer transaction mode: no server-side prepared statements at all."""
    async with await psycopg.AsyncConnection.connect(
        pg_dsn, autocommit=True, prepare_threshold=None
    ) as conn:
        saver = AsyncPostgresSaver(conn)
        for _ in range(3):
            await exercise(saver)
        cur = await conn.execute("SELECT count(*) FROM pg_prepared_statements")
        assert await cur.fetchone() == (0,)


async def test_pool_with_prepare_threshold_none(pg_dsn: str) -> None:
    async with AsyncConnectionPool(
        pg_dsn, min_size=2, kwargs={"autocommit": True, "prepare_threshold": None}, open=False
    ) as pool:
        await exercise(AsyncPostgresSaver(pool))


async def test_pipeline_mode(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn, pipeline=True) as saver:
        assert saver.pipe is not None
        await exercise(saver)
        # concurrent calls on the pipelined connection
        await asyncio.gather(*(put(saver, f"p{i}") for i in range(10)))
        tuples = await asyncio.gather(*(saver.aget_tuple(config(f"p{i}")) for i in range(10)))
        assert all(t is not None for t in tuples)
        # an error inside the pipeline surfaces and the saver keeps working
        with pytest.raises(ConfigError):
            await saver.aput_writes(config("p0"), [("a", 1)], "task")
        assert await saver.aget_tuple(config("p0")) is not None


async def test_non_autocommit_connection(pg_dsn: str) -> None:
    """A plain connection: setup() and every call commit their own transaction and leave
    the connection idle (not 'idle in transaction')."""
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        assert not conn.autocommit
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
        await exercise(saver)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as other:  # it was committed
        assert await other.aget_entry("t2", "k") is not None


# ---------------------------------------------------------------------- setup


async def tables(dsn: str) -> set[str]:
    async with await admin(dsn) as conn:
        cur = await conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
        )
        return {r[0] for r in await cur.fetchall()}


async def test_setup_inside_and_outside_a_transaction(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        async with conn.transaction():
            await conn.execute("SELECT 1")
            await AsyncPostgresSaver(conn).setup()  # joins the caller's transaction
            assert "idem_checkpoints" not in await tables(pg_dsn)  # not committed yet
        assert {"idem_checkpoints", "idem_blobs", "idem_writes", "idem_tool_calls"} <= await tables(
            pg_dsn
        )
        await AsyncPostgresSaver(conn).setup()  # outside: idempotent
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute("SELECT v FROM idem_saver_migrations ORDER BY v")
        assert [r[0] for r in await cur.fetchall()] == list(range(sql.SCHEMA_VERSION + 1))


async def test_setup_in_a_rolled_back_transaction_leaves_nothing(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
        await conn.execute("SELECT 1")  # the caller's own open transaction
        await AsyncPostgresSaver(conn).setup()
        await conn.rollback()
    assert not (await tables(pg_dsn)) & {"idem_checkpoints", "idem_saver_migrations"}


async def test_concurrent_setup_does_not_race(pg_dsn: str) -> None:
    conns = [await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) for _ in range(6)]
    try:
        await asyncio.gather(*(AsyncPostgresSaver(c).setup() for c in conns))
    finally:
        for c in conns:
            await c.close()
    async with await admin(pg_dsn) as conn:
        cur = await conn.execute("SELECT count(*), max(v) FROM idem_saver_migrations")
        assert await cur.fetchone() == (sql.SCHEMA_VERSION + 1, sql.SCHEMA_VERSION)


async def test_setup_runs_on_first_use(pg_dsn: str) -> None:
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        saver = AsyncPostgresSaver(conn)
        assert await saver.aget_tuple(config()) is None
        assert saver.is_setup


async def test_newer_schema_is_refused(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await put(saver)
    async with await admin(pg_dsn) as conn:
        await conn.execute("INSERT INTO idem_saver_migrations (v) VALUES (%s)", (99,))
    with pytest.raises(SchemaVersionError, match="99"):
        async with AsyncPostgresSaver.from_conn_string(pg_dsn):
            pass


# -------------------------------------------------------------- flat reads


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    out = [plan]
    for child in plan.get("Plans", []):
        out += plan_nodes(child)
    return out


async def explain(dsn: str, query: str, params: dict[str, Any]) -> dict[str, Any]:
    async with await admin(dsn) as conn:
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) " + query, params
        )
        row = await cur.fetchone()
        assert row is not None
        doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        return dict(doc[0]["Plan"])


def touched(plan: dict[str, Any]) -> dict[str, Any]:
    """Rows read from each table (summed over loops), buffers, and any seq scans."""
    rows: dict[str, float] = {}
    seq = []
    for node in plan_nodes(plan):
        rel = node.get("Relation Name")
        if rel:
            rows[rel] = rows.get(rel, 0) + node["Actual Rows"] * node["Actual Loops"]
            if node["Node Type"] == "Seq Scan":
                seq.append(rel)
    return {"rows": rows, "seq": seq, "buffers": plan["Shared Hit Blocks"]}


async def build_thread(saver: AsyncPostgresSaver, thread_id: str, n: int) -> None:
    """n root checkpoints (3 channels, one changing each step), a subgraph checkpoint
    every 10th, each with one pending write."""
    cp = empty_checkpoint()
    versions: dict[str, str] = {}
    parent = None
    for i in range(n):
        changed = {"messages": [f"m{i}"] * 3, "count": i} if i % 2 else {"count": i}
        if i == 0:
            changed = {"messages": [], "count": 0, "static": "s"}
        new = {ch: saver.get_next_version(versions.get(ch), None) for ch in changed}
        versions.update(new)
        cp = generate_checkpoint(
            channel_values={**cp["channel_values"], **changed}, channel_versions=dict(versions)
        )
        stored = await saver.aput(config(thread_id, "", parent), cp, {"step": i}, new)
        parent = stored["configurable"]["checkpoint_id"]
        await saver.aput_writes(stored, [("count", i)], "task")
        if i % 10 == 0:
            sub = generate_checkpoint(channel_values={"x": i}, channel_versions={"x": "1"})
            await saver.aput(config(thread_id, f"sub:{i}"), sub, {}, {"x": "1"})


@pytest.mark.parametrize("analyzed", [False, True], ids=["no-stats", "analyzed"])
async def test_reads_stay_flat_on_long_threads(pg_dsn: str, analyzed: bool) -> None:
    """aget_tuple (latest and by id) and alist(limit=10) read as many rows and buffers on
    a 2,000-checkpoint thread as on a 10-checkpoint one, and never scan a table."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await build_thread(saver, "short", 10)
        await build_thread(saver, "long", 2000)
        if analyzed:
            async with await admin(pg_dsn) as conn:
                await conn.execute("ANALYZE")
        ids = {}
        for thread in ("short", "long"):
            tup = await saver.aget_tuple(config(thread))
            assert tup is not None
            ids[thread] = tup.config["configurable"]["checkpoint_id"]
            assert set(tup.checkpoint["channel_values"]) == {"messages", "count", "static"}

    results = {}
    for thread in ("short", "long"):
        latest = touched(
            await explain(
                pg_dsn, sql.SELECT_LATEST_TUPLE, {"thread_id": thread, "ns": "", "limit": 1}
            )
        )
        by_id = touched(
            await explain(
                pg_dsn,
                sql.SELECT_TUPLE_BY_ID,
                {"thread_id": thread, "ns": "", "checkpoint_id": ids[thread], "limit": 1},
            )
        )
        listing = touched(
            await explain(
                pg_dsn,
                sql.SELECT_TUPLES.format(
                    where="WHERE thread_id = %(thread_id)s", limit=sql.LIST_LIMIT
                ),
                {"thread_id": thread, "limit": 10},
            )
        )
        results[thread] = (latest, by_id, listing)

    for short, long_ in zip(results["short"], results["long"], strict=True):
        assert long_["seq"] == [] or (set(long_["seq"]) <= {"idem_writes"} and not analyzed), long_
        assert long_["rows"].get("idem_blobs", 0) == short["rows"].get("idem_blobs", 0)
        assert (
            long_["rows"].get("idem_checkpoints", 0) <= short["rows"].get("idem_checkpoints", 0) + 1
        )
        # a deeper B-tree may cost a page or two per probe: allow 2x, never 200x
        assert long_["buffers"] <= 2 * short["buffers"] + 10, (short, long_)
    latest_long = results["long"][0]
    assert latest_long["rows"]["idem_blobs"] == 3  # one probe per channel, no scan


async def explain_generic(dsn: str, query: str, params: dict[str, Any]) -> dict[str, Any]:
    """EXPLAIN ANALYZE of ``query`` run as a prepared statement's *generic* plan (what
    PostgreSQL switches to after five executions under ``prepare_threshold=0``)."""
    names = list(params)
    for i, name in enumerate(names, 1):
        query = query.replace(f"%({name})s", f"${i}")
    types = ", ".join("integer" if isinstance(params[n], int) else "text" for n in names)
    async with await admin(dsn) as conn:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
        await conn.execute(f"PREPARE q ({types}) AS {query}")
        args = ", ".join(
            str(params[n]) if isinstance(params[n], int) else "'" + params[n] + "'" for n in names
        )
        cur = await conn.execute(
            f"EXPLAIN (ANALYZE, BUFFERS, TIMING OFF, FORMAT JSON) EXECUTE q ({args})"
        )
        row = await cur.fetchone()
        assert row is not None
        doc = row[0] if not isinstance(row[0], str) else json.loads(row[0])
        return dict(doc[0]["Plan"])


async def test_generic_plans_read_by_index_in_a_full_database(pg_dsn: str) -> None:
    """The reads' generic plans (prepared statements after five executions) seek the
    thread's newest rows by index in a database holding many other threads, ANALYZEd:
    no table scan, and no more checkpoint rows read than asked for."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await build_thread(saver, "long", 200)
        tup = await saver.aget_tuple(config("long"))
        assert tup is not None
        checkpoint_id = tup.config["configurable"]["checkpoint_id"]
    async with await admin(pg_dsn) as conn:
        for table, cols in (
            (
                "idem_checkpoints",
                "checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id, "
                "type, checkpoint, metadata, metadata_exact, channel_versions",
            ),
            ("idem_blobs", "checkpoint_ns, channel, version, type, blob, base_version"),
            (
                "idem_writes",
                "checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value",
            ),
        ):
            await conn.execute(
                f"INSERT INTO {table} (thread_id, {cols}) SELECT 'other-' || g, {cols} "
                f"FROM {table}, generate_series(1, 60) AS g WHERE thread_id = 'long'"
            )
        await conn.execute("ANALYZE")
    reads = {
        "latest": (sql.SELECT_LATEST_TUPLE, {"thread_id": "long", "ns": ""}, 1),
        "by_id": (
            sql.SELECT_TUPLE_BY_ID,
            {"thread_id": "long", "ns": "", "checkpoint_id": checkpoint_id},
            1,
        ),
        "list_ns": (
            sql.SELECT_TUPLES.format(
                where="WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s",
                limit=sql.LIST_LIMIT,
            ),
            {"thread_id": "long", "ns": "", "limit": 10},
            10,
        ),
        "list_thread": (
            sql.SELECT_TUPLES.format(where="WHERE thread_id = %(thread_id)s", limit=sql.LIST_LIMIT),
            {"thread_id": "long", "limit": 10},
            10,
        ),
    }
    for name, (query, params, wanted) in reads.items():
        got = touched(await explain_generic(pg_dsn, query, params))
        assert got["seq"] == [], (name, got)
        # the index scan stops one row past the page (the incremental sort's look-ahead)
        assert got["rows"]["idem_checkpoints"] <= wanted + 1, (name, got)


# ------------------------------------------------------------------ metadata


METADATA = [
    {"source": "loop", "step": 1, "user": "alice", "score": 1, "flag": True},
    {
        "source": "loop",
        "step": 2,
        "user": "x\x00y",
        "score": 1.0,
        "flag": 1,
        "deep": {"s": "a\x00b"},
    },
    {"source": "input", "step": 3, "user": None, "score": 0, "flag": False},
    {"source": "input", "step": 4, "nested": {"a": True, "b": [1, "z"]}, "big": 1e16},
    {"source": "update", "step": 5, "nested": {"a": 1, "b": [1, "z"]}, "neg": -0.0},
    {"source": "update", "step": 6, "lone": "\ud800", "zoë": "ü", "tags": ["a", "b"]},
]

FILTERS: list[dict[str, Any]] = [
    {},
    {"source": "loop"},
    {"score": 1},
    {"score": True},
    {"score": 1.0},
    {"flag": 1},
    {"flag": False},
    {"score": 0},
    {"user": None},
    {"user": "x\x00y"},
    {"user": "xy"},
    {"user": "x\ufffdy"},
    {"deep": {"s": "a\x00b"}},
    {"deep": {"s": "a\ufffdb"}},
    {"missing": None},
    {"nested": {"a": True, "b": [1, "z"]}},
    {"nested": {"a": 1, "b": [1, "z"]}},
    {"nested": {"b": [1, "z"]}},
    {"big": 10**16},
    {"big": 1e16},
    {"neg": 0},
    {"lone": "\ud800"},
    {"zoë": "ü"},
    {"tags": ["a", "b"]},
    {"tags": ["b", "a"]},
    {"source": "input", "step": 4},
    {"step": float("nan")},
]


async def test_metadata_round_trips_and_filters_like_in_memory(saver: AsyncPostgresSaver) -> None:
    memory = InMemorySaver()
    for md in METADATA:
        cp = generate_checkpoint()
        await saver.aput(config("t"), cp, md, {})
        await memory.aput(config("t"), cp, md, {})
    # LangGraph drops NUL from top-level string values before any saver sees them
    stored = [
        {k: v.replace("\x00", "") if isinstance(v, str) else v for k, v in md.items()}
        for md in METADATA[::-1]
    ]
    ours = [t.metadata async for t in saver.alist(config("t"))]
    assert ours == stored  # exactly (InMemorySaver itself turns "\ud800" into "?")
    # types survive too (1e16 stays a float, -0.0 keeps its sign)
    by_step = {m["step"]: m for m in ours}
    assert isinstance(by_step[4]["big"], float)
    assert str(by_step[5]["neg"]) == "-0.0"
    for f in FILTERS:
        # InMemorySaver's rule: every filter value == the metadata's value (Python ==)
        want = [md["step"] for md in stored if all(v == md.get(k) for k, v in f.items())]
        if "lone" not in f:
            memory_steps = [t.metadata["step"] async for t in memory.alist(config("t"), filter=f)]
            assert memory_steps == want, f
        got = [t.metadata["step"] async for t in saver.alist(config("t"), filter=f)]
        assert got == want, f
        got_all = [t.metadata["step"] async for t in saver.alist(None, filter=f, limit=2)]
        assert got_all == want[:2], f


async def test_metadata_filter_is_bound_not_interpolated(saver: AsyncPostgresSaver) -> None:
    await put(saver, metadata={"k'); DROP TABLE idem_blobs; --": "v", "source": "x"})
    f = {"k'); DROP TABLE idem_blobs; --": "v"}
    assert len([t async for t in saver.alist(None, filter=f)]) == 1
    with pytest.raises(ConfigError):
        [t async for t in saver.alist(None, filter={"k": object()})]
    assert await saver.aget_tuple(config()) is not None


async def test_nul_in_ids_is_a_config_error(saver: AsyncPostgresSaver) -> None:
    with pytest.raises(ConfigError, match="NUL"):
        await saver.aget_tuple(config("a\x00b"))
    with pytest.raises(ConfigError):
        await put(saver, "a\x00b")


# -------------------------------------------------- storage, compression, corruption


async def test_large_values_are_compressed_and_read_back(pg_dsn: str) -> None:
    big = {"text": "lorem ipsum dolor sit amet " * 400, "items": list(range(500))}
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        stored = await put(saver, values={"big": big, "small": 1})
        await saver.aput_writes(stored, [("big", big)], "task")
        tup = await saver.aget_tuple(config())
        assert tup is not None
        assert tup.checkpoint["channel_values"]["big"] == big
        assert tup.pending_writes == [("task", "big", big)]
        saver.compress_min_bytes = None
        await put(saver, "plain", values={"big": big})
        plain = await saver.aget_tuple(config("plain"))
        assert plain is not None and plain.checkpoint["channel_values"]["big"] == big
    async with await admin(pg_dsn) as conn:
        cur = await conn.execute("SELECT thread_id, channel, type FROM idem_blobs ORDER BY 1, 2")
        types = {(r[0], r[1]): r[2] for r in await cur.fetchall()}
        assert types[("t", "big")].startswith("zlib:")
        assert not types[("t", "small")].startswith("zlib:")
        assert not types[("plain", "big")].startswith("zlib:")


async def test_only_new_versions_are_written(saver: AsyncPostgresSaver, pg_dsn: str) -> None:
    cp = generate_checkpoint(channel_values={"a": 1, "b": 2}, channel_versions={"a": "1", "b": "1"})
    stored = await saver.aput(config(), cp, {}, {"a": "1", "b": "1"})
    cp2 = generate_checkpoint(
        channel_values={"a": 1, "b": 3}, channel_versions={"a": "1", "b": "2"}
    )
    await saver.aput(stored, cp2, {}, {"b": "2"})
    async with await admin(pg_dsn) as conn:
        cur = await conn.execute("SELECT channel, version FROM idem_blobs ORDER BY 1, 2")
        assert await cur.fetchall() == [("a", "1"), ("b", "1"), ("b", "2")]
    tup = await saver.aget_tuple(config())
    assert tup is not None and tup.checkpoint["channel_values"] == {"a": 1, "b": 3}


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE idem_blobs SET blob = '\\xc1ffff'",
        "UPDATE idem_blobs SET type = 'zlib:msgpack', blob = '\\x00010203'",
        "UPDATE idem_checkpoints SET checkpoint = '\\xc1'",
        "UPDATE idem_checkpoints SET metadata_exact = '{not json'",
        "UPDATE idem_writes SET value = '\\xc1'",
    ],
    ids=["blob", "zlib", "checkpoint", "metadata", "write"],
)
async def test_corrupt_rows_raise_corrupt_record_error(
    saver: AsyncPostgresSaver,
    pg_dsn: str,
    damage: str,
) -> None:
    stored = await put(saver)
    await saver.aput_writes(stored, [("a", "w")], "task")
    async with await admin(pg_dsn) as conn:
        await conn.execute(damage)
    with pytest.raises(CorruptRecordError, match="thread_id='t'"):
        await saver.aget_tuple(config())
    with pytest.raises(CorruptRecordError):
        [t async for t in saver.alist(None)]


async def delta_chain(saver: AsyncPostgresSaver) -> tuple[Any, Any]:
    """A root checkpoint with two writes to ``messages`` (one large), and its child: the
    child's ``DeltaChannel`` history of ``messages`` is those writes (no seed)."""
    root = await put(saver, values={})
    await saver.aput_writes(root, [("messages", "small"), ("messages", "x" * 5000)], "task-1")
    child = await put(saver, values={}, parent=root["configurable"]["checkpoint_id"])
    return root, child


async def test_delta_history_decodes_compressed_writes(
    saver: AsyncPostgresSaver, pg_dsn: str
) -> None:
    """A write stored zlib-compressed (``compress_min_bytes``) comes back as written
    through the history read's decoding path, as it does through ``aget_tuple``."""
    saver.compress_min_bytes = 100
    _, child = await delta_chain(saver)
    async with await admin(pg_dsn) as conn:
        cur = await conn.execute("SELECT idx, type LIKE 'zlib:%%' FROM idem_writes ORDER BY idx")
        assert await cur.fetchall() == [(0, False), (1, True)], "the large write is compressed"
    history = await saver.aget_delta_channel_history(config=child, channels=["messages"])
    assert history == {
        "messages": {
            "writes": [("task-1", "messages", "small"), ("task-1", "messages", "x" * 5000)]
        }
    }


@pytest.mark.parametrize(
    "damage",
    [
        "UPDATE idem_writes SET value = '\\xc1' WHERE idx = 1",
        "UPDATE idem_writes SET type = 'zlib:msgpack', value = '\\x00010203' WHERE idx = 1",
    ],
    ids=["write", "zlib"],
)
async def test_delta_history_names_a_corrupt_write(
    saver: AsyncPostgresSaver, pg_dsn: str, damage: str
) -> None:
    """A pending write on the walk that cannot be decoded is a CorruptRecordError naming
    the checkpoint, the task and the channel - never a raw decoding error."""
    root, child = await delta_chain(saver)
    async with await admin(pg_dsn) as conn:
        await conn.execute(damage)
    with pytest.raises(CorruptRecordError) as raised:
        await saver.aget_delta_channel_history(config=child, channels=["messages"])
    shown = str(raised.value)
    assert "pending write" in shown and "task_id='task-1'" in shown, shown
    assert "channel='messages'" in shown, shown
    assert f"checkpoint_id='{root['configurable']['checkpoint_id']}'" in shown, shown


# -------------------------------------------- the ledger, against the SQLite backend


def intent(key: str, thread: str = "t", scope: str | None = None, run: str | None = None) -> Any:
    return CallIntent(
        scope=scope or thread,
        key=key,
        thread_id=thread,
        agent_path="agent",
        tool_name="charge",
        args_hash="h" + key[-1],
        args=b'{"amount": 1}',
        tool_call_id=f"call-{key}",
        run_id=run,
    )


def normalized(value: Any) -> Any:
    """Ledger results without the wall-clock fields."""
    if isinstance(value, list):
        return [normalized(v) for v in value]
    if hasattr(value, "entry"):  # ClaimOutcome
        return (value.claimed, normalized(value.entry))
    if hasattr(value, "issued_at"):
        d = dict(vars(value))
        for k in ("issued_at", "lease_expires_at", "finished_at"):
            d[k] = d[k] is not None
        if d.get("history"):  # its events' times ("at") differ between the two runs
            d["history"] = [
                {k: v for k, v in event.items() if k != "at"} for event in json.loads(d["history"])
            ]
        return d
    return value


async def ledger_script(saver: Any) -> list[Any]:
    """Every ledger call, including refused transitions, in one deterministic script."""
    out: list[Any] = []

    async def step(coro: Any) -> None:
        try:
            out.append(normalized(await coro))
        except (LedgerStateError, ValueError) as exc:
            out.append(type(exc).__name__)

    await step(
        saver.aclaim([intent("k1"), intent("k2"), intent("k1")], owner="a", lease_seconds=60)
    )
    await step(saver.aclaim([intent("k1"), intent("k3", run="r1")], owner="b", lease_seconds=-1))
    await step(saver.record_outcome("t", "k1", owner="b", outcome=Outcome.completed("j", b"x")))
    await step(saver.record_outcome("t", "k1", owner="a", outcome=Outcome.completed("j", b"1")))
    await step(saver.record_outcome("t", "k1", owner="a", outcome=Outcome.failed(None)))
    await step(saver.aget_entry("t", "k1"))
    await step(saver.alist_unknown())
    k3 = await saver.aget_entry("t", "k3")
    for attempts, expected_owner, owner in [
        (2, "b", "c"),
        (1, "x", "c"),
        (1, "b", "c"),
        (1, "b", "d"),
    ]:
        seen = replace(k3, attempts=attempts, owner=expected_owner)  # as a caller read it
        await step(saver.areclaim(seen, owner=owner, lease_seconds=60))
    await step(saver.arelease("t", "k3", owner="x"))
    await step(saver.arelease("t", "k3", owner="c"))
    await step(saver.aget_entry("t", "k3"))
    await step(saver.aclaim([intent("k4", scope="ns:shared")], owner="a", lease_seconds=-5))
    await step(saver.alist_unknown())
    k4 = await saver.aget_entry("ns:shared", "k4")
    await step(saver.aresolve(k4, Outcome.failed("boom")))
    await step(saver.aresolve(k4, Outcome.completed(None, None)))
    await step(saver.afind_orphans("t", "agent", "charge", "h2"))
    await step(saver.aadopt("t", "k2", tool_call_id="new-call"))
    await step(saver.aadopt("t", "k2", tool_call_id="other-call"))
    await step(saver.afind_orphans("t", "agent", "charge", "h2"))
    await step(saver.anote_replay("t", "k1"))
    await step(saver.anote_replay("t", "k1", conflict=True))
    await step(saver.anote_replay("t", "missing"))
    await step(saver.aget_entry("t", "k1"))
    await step(saver.aclaim([intent("k5", run="r9")], owner="a", lease_seconds=60))
    await step(saver.alist_entries("t"))
    await step(saver.alist_entries("t", agent_path="agent"))
    await step(saver.alist_entries("t", agent_path="nobody"))
    await step(saver.acopy_thread("t", "fork"))
    await step(saver.alist_entries("fork"))
    await step(saver.aprune(["t"], strategy="delete"))
    await step(saver.alist_entries("t"))
    await step(saver.adelete_for_runs(["r9"]))
    await step(saver.alist_entries("t"))
    await step(saver.adelete_thread("t"))
    await step(saver.alist_entries())
    return out


async def test_ledger_matches_sqlite_call_by_call(
    saver: AsyncPostgresSaver, tmp_path: Path
) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "ledger.sqlite")) as lite:
        want = await ledger_script(lite)
    got = await ledger_script(saver)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"step {i}"


async def test_concurrent_claims_have_one_winner(pg_dsn: str) -> None:
    """Claims across 'machines' (separate connections): exactly one inserts the row."""
    savers = []
    conns = []
    for _ in range(6):
        conn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        conns.append(conn)
        savers.append(AsyncPostgresSaver(conn))
    try:
        await savers[0].setup()
        for round_ in range(5):
            keys = [intent(f"key-{round_}-{j}") for j in range(3)]
            outcomes = await asyncio.gather(
                *(s.aclaim(keys, owner=f"w{i}", lease_seconds=60) for i, s in enumerate(savers))
            )
            for j in range(3):
                winners = [o[j] for o in outcomes if o[j].claimed]
                assert len(winners) == 1
                owner = winners[0].entry.owner
                assert all(o[j].entry.owner == owner for o in outcomes)
    finally:
        for c in conns:
            await c.close()


async def test_sync_methods_from_another_thread(saver: AsyncPostgresSaver) -> None:
    await put(saver)
    tup = await asyncio.to_thread(saver.get_tuple, config())
    assert tup is not None
    listed = await asyncio.to_thread(lambda: list(saver.list(config())))
    assert len(listed) == 1


async def test_a_cancelled_caller_does_not_break_a_shared_connection(pg_dsn: str) -> None:
    """LangGraph cancels sibling tasks when one fails: a statement whose caller is
    cancelled mid-flight is cancelled on the server (psycopg does it), and the single
    connection stays usable for the next call."""
    from langgraph_idem_saver.postgres import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:

        async def slow(cur: Any) -> None:
            await cur.execute("SELECT pg_sleep(30)")

        task = asyncio.ensure_future(saver._execute(slow))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # the sleep ended with its caller (seen from another session)
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as monitor:
            running = await monitor.execute(
                "SELECT count(*) FROM pg_stat_activity "
                "WHERE query = 'SELECT pg_sleep(30)' AND state = 'active'"
            )
            assert await running.fetchone() == (0,)
        assert await saver.aget_tuple({"configurable": {"thread_id": "after-cancel"}}) is None
        assert not saver.conn.closed


async def _saver_on(stack: AsyncExitStack, dsn: str, kind: str) -> AsyncPostgresSaver:
    """A set-up saver on its own connection (``kind="connection"``) or on a pool of one
    connection (``"pool"``: the next call reuses the connection the last one used)."""
    if kind == "pool":
        pool = AsyncConnectionPool(
            dsn, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
        )
        await stack.enter_async_context(pool)
        saver = AsyncPostgresSaver(pool)
    else:
        saver = await stack.enter_async_context(AsyncPostgresSaver.from_conn_string(dsn))
    await saver.setup()
    return saver


async def _monitor(
    stack: AsyncExitStack, dsn: str, sleep: str = ""
) -> psycopg.AsyncConnection[Any]:
    """Another session, to watch the server; closing ``stack`` ends any ``sleep``
    statement still running (one whose cancel request was itself interrupted)."""
    monitor = await psycopg.AsyncConnection.connect(dsn, autocommit=True)
    stack.push_async_callback(monitor.close)
    if sleep:
        stack.push_async_callback(
            monitor.execute,
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE query = %s AND state = 'active'",
            (sleep,),
        )
    return monitor


async def _waiting_on_a_lock(monitor: psycopg.AsyncConnection[Any], app: str) -> int:
    """How many sessions named ``app`` wait for a lock now."""
    row = await (
        await monitor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE application_name = %s AND wait_event_type = 'Lock'",
            (app,),
        )
    ).fetchone()
    return int(row[0]) if row else 0


async def _until(monitor: psycopg.AsyncConnection[Any], app: str, waiting: int) -> None:
    """Poll (10 s at most) until ``waiting`` sessions named ``app`` wait for a lock."""
    for _ in range(1000):
        if await _waiting_on_a_lock(monitor, app) == waiting:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{waiting} session(s) of {app!r} never waited for a lock")


@pytest.mark.parametrize("call", ["aput_writes", "aget_tuple"])
@pytest.mark.parametrize("kind", ["connection", "pool"])
async def test_a_call_cancelled_while_its_statement_waits_is_cancelled_on_the_server(
    pg_dsn: str, kind: str, call: str
) -> None:
    """A saver call whose statement is blocked (here: another session holds the table
    locked) and whose caller is then cancelled: the statement stops waiting on the
    server at once (cancelled, not left queued behind the lock), a cancelled write lands
    nothing, and the same connection - ours, or the pool's only one - serves the next
    call once the lock is gone."""
    from psycopg.conninfo import make_conninfo

    app = f"idem-cancel-{kind}-{call}"
    dsn = make_conninfo(pg_dsn, application_name=app)
    async with AsyncExitStack() as stack:
        saver = await _saver_on(stack, dsn, kind)
        stored = await put(saver, "locked")
        monitor = await _monitor(stack, pg_dsn)
        blocker = await psycopg.AsyncConnection.connect(pg_dsn)
        stack.push_async_callback(blocker.close)

        table = "idem_writes" if call == "aput_writes" else "idem_checkpoints"
        await blocker.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
        if call == "aput_writes":
            blocked = saver.aput_writes(stored, [("ch", "cancelled")], "task-1")
        else:
            blocked = saver.aget_tuple(config("locked"))
        task = asyncio.ensure_future(blocked)
        await _until(monitor, app, waiting=1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await _waiting_on_a_lock(monitor, app) == 0  # cancelled on the server
        await blocker.rollback()  # the lock is gone

        await saver.aput_writes(stored, [("ch", "after")], "task-2")
        tup = await saver.aget_tuple(config("locked"))
        assert tup is not None
        assert [(t, v) for t, _, v in tup.pending_writes] == [("task-2", "after")]
        if kind == "connection":
            assert not saver.conn.closed


@pytest.mark.parametrize("kind", ["connection", "pool"])
async def test_a_call_cancelled_twice_mid_statement_leaves_no_raw_error(
    pg_dsn: str, kind: str
) -> None:
    """A second cancellation while psycopg is cancelling the statement: a single
    connection either still works (psycopg finished cancelling) or is closed - every
    later call then raises the typed ``ConnectionClosedError`` - never a raw psycopg
    error; a pool replaces a closed connection (the next call works)."""
    async with AsyncExitStack() as stack:
        await _monitor(stack, pg_dsn, sleep="SELECT pg_sleep(31)")
        saver = await _saver_on(stack, pg_dsn, kind)

        async def slow(cur: Any) -> None:
            await cur.execute("SELECT pg_sleep(31)")

        task = asyncio.ensure_future(saver._execute(slow))
        await asyncio.sleep(0.2)
        task.cancel()
        await asyncio.sleep(0)  # the first cancellation lands: psycopg starts cancelling
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        if kind == "pool":
            assert await saver.aget_tuple(config("after")) is None
            return
        # psycopg drained the cancelled statement (the connection works), or closed the
        # connection (3.3 does when interrupted while cancelling): typed either way
        outcomes = []
        for _ in range(2):
            try:
                outcomes.append(await saver.aget_tuple(config("after")))
            except ConnectionClosedError:
                outcomes.append("closed")
        assert outcomes in ([None, None], ["closed", "closed"])


async def test_a_connection_an_interruption_left_mid_command_is_closed(pg_dsn: str) -> None:
    """Interrupted with a command in flight whose result nobody will read (what a second
    cancellation during psycopg's own cancelling can leave on the releases before 3.3),
    the single connection could never send a statement again - psycopg would raise a raw
    "another command is already in progress" on every later call. The saver closes it;
    ``from_conn_string``'s saver owns it and opens a new one at its next call (a saver on
    the user's connection raises ``ConnectionClosedError``: test_faults.py)."""
    async with AsyncExitStack() as stack:
        await _monitor(stack, pg_dsn, sleep="SELECT pg_sleep(32)")
        saver = await _saver_on(stack, pg_dsn, "connection")

        async def interrupted(cur: Any) -> None:
            cur.connection.pgconn.send_query(b"SELECT pg_sleep(32)")  # in flight, unread
            raise asyncio.CancelledError

        with pytest.raises(asyncio.CancelledError):
            await saver._execute(interrupted)
        closed = saver.conn
        assert closed.closed
        assert await saver.aget_tuple(config("after")) is None
        assert saver.conn is not closed and not saver.conn.closed


# ------------------------------------------------------------ outcomes, group commit


async def test_outcomes_of_calls_finishing_together_share_one_transaction(pg_dsn: str) -> None:
    """20 outcomes recorded at once are one transaction (one xmin), not 20; each is
    recorded; one that is not ours to finish fails alone, typed."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        keys = [f"k{i:02d}" for i in range(20)]
        await saver.aclaim([intent(k) for k in keys], owner="me", lease_seconds=60)
        await saver.aclaim([intent("theirs")], owner="other", lease_seconds=60)

        def finish(key: str) -> Any:
            return saver.record_outcome(
                "t", key, owner="me", outcome=Outcome.completed("json", key.encode())
            )

        outcomes = await asyncio.gather(*(finish(k) for k in [*keys, "theirs"]),
                                        return_exceptions=True)  # fmt: skip
        *recorded, refused = outcomes
        assert recorded == [None] * 20
        assert isinstance(refused, LedgerStateError), refused
        entries = [await saver.aget_entry("t", k) for k in keys]
        assert [(e.key, e.status, e.result) for e in entries if e] == [
            (k, CallStatus.COMPLETED, k.encode()) for k in keys
        ]
        async with await admin(pg_dsn) as conn:
            cur = await conn.execute(
                "SELECT count(DISTINCT xmin::text), count(*) FROM idem_tool_calls "
                "WHERE status = 'completed'"
            )
            assert await cur.fetchone() == (1, 20)
        theirs = await saver.aget_entry("t", "theirs")
        assert theirs is not None and theirs.status is CallStatus.ISSUED


FILL_OTHER_THREADS = [
    "INSERT INTO idem_checkpoints (thread_id, checkpoint_ns, checkpoint_id, type, checkpoint,"
    " metadata, channel_versions) SELECT 'other-' || (g / 20), '', lpad(g::text, 12, '0'),"
    " 'msgpack', '\\x80', '{}'::jsonb, '{}'::jsonb FROM generate_series(1, 20000) AS g",
    "INSERT INTO idem_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path,"
    " idx, channel, type, value) SELECT 'other-' || (g / 20), '', lpad(g::text, 12, '0'),"
    " 't', '', 0, 'c', 'msgpack', '\\x80' FROM generate_series(1, 20000) AS g",
    "INSERT INTO idem_blobs (thread_id, checkpoint_ns, channel, version, type, blob)"
    " SELECT 'other-' || (g / 20), '', 'c', g::text, 'msgpack', '\\x80'"
    " FROM generate_series(1, 20000) AS g",
]


@pytest.mark.parametrize("by_id", [False, True], ids=["latest", "by-id"])
async def test_aget_tuple_planned_while_the_tables_were_small_never_scans_them(
    pg_dsn: str, by_id: bool
) -> None:
    """On a connection that prepares every statement (``prepare_threshold=0``, as
    LangGraph's savers open theirs) PostgreSQL caches a generic plan of aget_tuple's read
    after five executions. Sent as it is, that plan, built on a fresh database, scanned
    the checkpoints, the writes and the blobs (once per channel) and kept doing so as
    they grew. Through its function (migration 10) the read, cached while the tables
    were empty, still probes indexes once they hold 20,000 rows of other threads each."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"a": [1, 2], "b": "x"}
        checkpoint["channel_versions"] = {"a": "1", "b": "1"}
        stored = await saver.aput(config, checkpoint, {}, {"a": "1", "b": "1"})
        await saver.aput_writes(stored, [("a", 3)], "task-1")
        read_config = stored if by_id else config
        for _ in range(8):  # the plans are cached now, on tables of one checkpoint
            assert await saver.aget_tuple(read_config) is not None
        for fill in FILL_OTHER_THREADS:
            await conn.execute(fill)
        reads = {}
        for table in ("idem_checkpoints", "idem_blobs", "idem_writes"):
            async with table_reads(conn, table) as counted:
                tup = await saver.aget_tuple(read_config)
            reads[table] = counted[:2]  # sequential scans, rows they read
    assert reads == {t: [0, 0] for t in reads}, reads
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": [1, 2], "b": "x"}
    assert tup.pending_writes == [("task-1", "a", 3)]


LEDGER_FILL_OTHER_THREADS = (
    "INSERT INTO idem_tool_calls (scope, key, thread_id, agent_path, tool_name, args_hash,"
    " args, tool_call_id, status, owner, issued_at, lease_expires_at, position, branch,"
    " occurrence) SELECT 'other-' || (g / 50), 'key-' || g, 'other-' || (g / 50), 'tools',"
    " 'send', md5(g::text), '\\x00', 'c' || g, 'completed', 'me', 0, 0, 'p' || (g / 50),"
    " 'b', g % 50 FROM generate_series(1, 20000) AS g"
)


async def test_no_call_scans_a_table_with_a_plan_cached_while_it_was_small(
    pg_dsn: str,
) -> None:
    """What a deployment does from an empty database, on a connection that prepares
    every statement (``prepare_threshold=0``, as LangGraph's savers open theirs):
    PostgreSQL caches the generic plans built while the tables hold a few rows and keeps
    them until a table is next analyzed. After the tables have grown to 20,000 rows of
    other threads each, a chat turn (aget_tuple, delta puts, writes), a history read, a
    tool step of the ledger, a thread copy, a prune and a delete read their rows through
    indexes: no sequential scan of any table. (Before 2026-11-26 (``04697dd``),
    aget_tuple's read, the delta put's check of its base and the maintenance statements
    scanned whole tables here.)"""
    from langchain_core.messages import AIMessage, HumanMessage
    from langchain_core.tools import tool
    from langgraph.graph import START, MessagesState, StateGraph

    from langgraph_idem_saver import IdempotentToolNode

    @tool
    def send(to: str) -> str:
        """Send a note (a side effect, as far as the ledger knows)."""
        return f"sent to {to}"

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"echo {state['messages'][-1].content}")]}

    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        chat = StateGraph(MessagesState)
        chat.add_node("reply", reply)
        chat.add_edge(START, "reply")
        chat_graph = chat.compile(checkpointer=saver)
        tools = StateGraph(MessagesState)
        tools.add_node("tools", IdempotentToolNode([send]))
        tools.add_edge(START, "tools")
        tools_graph = tools.compile(checkpointer=saver)

        async def workload(tag: str) -> None:
            config = {"configurable": {"thread_id": f"{tag}-chat"}}
            for turn in range(3):
                await chat_graph.ainvoke({"messages": [HumanMessage(f"turn {turn}")]}, config)
            assert len([s async for s in chat_graph.aget_state_history(config)]) == 9
            call = {"name": "send", "args": {"to": tag}, "id": f"c-{tag}", "type": "tool_call"}
            step = {"messages": [AIMessage("", id=f"ai-{tag}", tool_calls=[call])]}
            out = await tools_graph.ainvoke(step, {"configurable": {"thread_id": f"{tag}-t"}})
            assert out["messages"][-1].content == f"sent to {tag}"
            await saver.acopy_thread(f"{tag}-chat", f"{tag}-copy")
            await saver.aprune([f"{tag}-copy"], strategy="keep_latest")
            await saver.adelete_thread(f"{tag}-copy")

        for k in range(3):  # every plan is cached now, on tables of a few rows
            await workload(f"small-{k}")
        for fill in (*FILL_OTHER_THREADS, LEDGER_FILL_OTHER_THREADS):
            await conn.execute(fill)
        scans = await scans_during(conn, lambda: workload("big"))
    assert scans == {t: (0, 0) for t in scans}, scans  # (sequential scans, rows read)


async def test_alist_of_every_shape_planned_while_the_tables_were_small_never_scans_them(
    pg_dsn: str,
) -> None:
    """``alist`` outside one namespace - a whole thread, a metadata filter, pages after
    ``before``, one checkpoint by id - builds its statement per call shape. Prepared
    (``prepare_threshold=0``), each shape's generic plan was cached while the tables held
    a few rows and scanned them after they grew; these shapes are sent unprepared now,
    planned for the tables as they are. After the tables grow to 20,000 rows of other
    threads, no shape scans any table, and each still returns what it did."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for step in range(6):
            checkpoint = empty_checkpoint()  # ids increase within a process
            checkpoint["channel_values"] = {"a": [step]}
            checkpoint["channel_versions"] = {"a": str(step + 1)}
            meta = {"source": "loop", "step": step}
            config = await saver.aput(config, checkpoint, meta, {"a": str(step + 1)})
            await saver.aput_writes(config, [("a", step)], f"task-{step}")
        thread = {"configurable": {"thread_id": "t"}}
        ns = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

        async def every_shape() -> list[list[Any]]:
            shapes = [
                saver.alist(thread, limit=3),
                saver.alist(ns, filter={"step": 2}),
                saver.alist(thread, before=config, limit=2),
                saver.alist(config),
            ]
            found = []
            for shape in shapes:
                found.append([(t.checkpoint["id"], t.metadata["step"]) async for t in shape])
            return found

        for _ in range(6):  # the plans would be cached now, on tables of a few rows
            expected = await every_shape()
        for fill in FILL_OTHER_THREADS:
            await conn.execute(fill)
        read: list[list[Any]] = []

        async def read_all() -> None:
            read.extend(await every_shape())

        scans = await scans_during(conn, read_all)
    assert scans == {t: (0, 0) for t in scans}, scans  # (sequential scans, rows read)
    assert read == expected
    assert [len(rows) for rows in read] == [3, 1, 2, 1]


class DeltaLog(TypedDict):
    log: Annotated[list[Any], DeltaChannel(extend, snapshot_frequency=10**9)]
    count: int


class TwoDeltaLogs(DeltaLog):
    notes: Annotated[list[Any], DeltaChannel(extend, snapshot_frequency=10**9)]


@pytest.mark.parametrize("channels", [1, 2], ids=["one channel", "two channels"])
async def test_a_delta_channel_load_planned_while_the_tables_were_small_never_scans_them(
    pg_dsn: str, channels: int
) -> None:
    """The DeltaChannel history read (one recursive statement) had the same weakness as
    aget_tuple's: its generic plan, cached while the tables held a few rows, scanned
    them once per ancestor after they grew (600,000 rows to load a 30-step thread; with
    two channels, 845,292 blobs for 20 steps). For one channel it is a function now
    (migration 12); several channels, whose statement's text depends on their number,
    send it unprepared: no sequential scan either way, and the same state."""

    def step(state: TwoDeltaLogs) -> dict[str, Any]:
        count = state.get("count", 0) + 1
        return {"count": count, "log": [f"step {count}"], "notes": [count]}

    def only_log(state: DeltaLog) -> dict[str, Any]:
        count = state.get("count", 0) + 1
        return {"count": count, "log": [f"step {count}"]}

    builder: Any = StateGraph(TwoDeltaLogs if channels == 2 else DeltaLog)
    builder.add_node("step", step if channels == 2 else only_log)
    builder.add_edge(START, "step")
    builder.add_conditional_edges("step", lambda s: "step" if s["count"] < 30 else END)
    start = {"log": [], "count": 0} | ({"notes": []} if channels == 2 else {})
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        graph = builder.compile(checkpointer=saver)
        for k in range(3):  # the plans would be cached now, on small tables
            config = {"configurable": {"thread_id": f"d{k}"}, "recursion_limit": 50}
            await graph.ainvoke(start, config)
            for _ in range(3):
                await graph.aget_state(config)
        for fill in FILL_OTHER_THREADS:
            await conn.execute(fill)
        config = {"configurable": {"thread_id": "d0"}}
        scans = await scans_during(conn, lambda: graph.aget_state(config))
        state = await graph.aget_state(config)
    assert scans == {t: (0, 0) for t in scans}, scans  # (sequential scans, rows read)
    assert state.values["log"] == [f"step {i}" for i in range(1, 31)]
    if channels == 2:
        assert state.values["notes"] == list(range(1, 31))


async def test_a_full_disk_is_storage_full_error(saver: AsyncPostgresSaver) -> None:
    """SQLSTATE 53100 (disk_full) is a StorageFullError (an OSError), never a raw
    psycopg error. A real server with a full disk is not something a test can make, so
    the server's own exception class goes through the saver's mapping."""
    from langgraph_idem_saver.errors import StorageFullError

    raised = psycopg.errors.DiskFull("could not extend file: No space left on device")
    typed = saver._typed_error(raised, None)
    assert isinstance(typed, StorageFullError) and isinstance(typed, OSError)
    assert "disk is full" in str(typed) and "nothing of this call was written" in str(typed)


async def test_only_a_nul_character_is_a_nul_serialization_error(
    saver: AsyncPostgresSaver,
) -> None:
    """A server's DataError whose message merely says NULL (here its context: a
    statement with ``IS NULL``) is not read as a NUL character in text; a real NUL, as
    psycopg refuses it and as the server refuses it, is."""
    from langgraph_idem_saver.errors import SerializationError

    async def raised(statement: str, *params: Any) -> psycopg.Error:
        async with await psycopg.AsyncConnection.connect(saver.conn.info.dsn) as conn:
            with pytest.raises(psycopg.DataError) as info:
                await conn.execute(statement, params or None)
        return info.value

    division = await raised("DO $$ BEGIN PERFORM 1 / 0 WHERE NULL IS NULL; END $$")
    assert "NULL" in str(division)  # the trap: the old check matched it
    assert not isinstance(saver._typed_error(division, None), SerializationError)
    for nul in (
        await raised("SELECT %s::text", "a\x00b"),  # refused by psycopg
        await raised("SELECT convert_from('\\x610062'::bytea, 'UTF8')"),  # by the server
    ):
        typed = saver._typed_error(nul, None)
        assert isinstance(typed, SerializationError), nul
