"""Reads that do not depend on the database's statistics, nor on how a thread resumed.

Two things made a checkpoint read cost more on some databases than on others:

* the plans. A database whose tables were never analyzed (created by ``setup()`` moments
  before: a new deployment, a CI database, right after a migration or an import) plans
  with no statistics at all. Our reads (``idem_list_in_ns``, ``idem_checkpoint_tuple``)
  must probe indexes there exactly as on an analyzed database: no sequential scan, and
  rows read bounded by the page asked for, not by the thread's length;
* the delta chains. A list re-versioned without growing (a node returning the whole
  list) is the same delta row again - but after a resume it used to become a delta of
  the version read, so every invoke added one hop to every later read (up to
  ``MAX_CHAIN``). It is now the read version's own row again: the chain no deeper.
"""

from __future__ import annotations

from typing import Annotated, Any

import psycopg
import pytest
from fault_child import Db
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pg_reads import table_reads
from tool_node_helpers import cfg
from typing_extensions import TypedDict

from langgraph_idem_saver.list_deltas import MAX_CHAIN
from langgraph_idem_saver.postgres import AsyncPostgresSaver

DEPTHS = """
WITH RECURSIVE d (version, base_version, depth) AS (
    SELECT version, base_version, 0 FROM idem_blobs WHERE channel = 'messages'
  UNION ALL
    SELECT d.version, b.base_version, d.depth + 1
    FROM d JOIN idem_blobs AS b ON b.channel = 'messages' AND b.version = d.base_version
)
SELECT MAX(depth) FROM d
"""
"""The longest chain of deltas of the ``messages`` channel (0: every row whole)."""


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]
    n: int


def graph_of(saver: Any) -> Any:
    """``talk`` appends a message; ``again`` re-versions the list without growing it."""

    def step(state: Chat) -> dict[str, Any]:
        if state["n"] % 2:
            return {"messages": [AIMessage(f"reply {state['n']}")], "n": state["n"] + 1}
        return {"messages": [], "n": state["n"] + 1}  # the same list, a new version

    builder = StateGraph(Chat)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    return builder.compile(checkpointer=saver)


async def test_a_list_re_versioned_after_each_resume_keeps_its_chain_depth(db: Db) -> None:
    """Forty invokes, each a fresh resume of a list re-versioned without growing: the
    chain stays as deep as before them (it reached ``MAX_CHAIN`` before), every version
    reads back as written. The control is the next test."""
    seed = [HumanMessage(f"m{i} " * 20, id=f"m{i}") for i in range(6)]
    async with db.open() as saver:
        graph = graph_of(saver)
        await graph.ainvoke({"messages": seed, "n": 0}, cfg("t"))  # n=0: re-versioned
        await graph.ainvoke({"n": 1}, cfg("t"))  # grows: a delta of one message
        [(seeded,)] = await db.query(DEPTHS)
        for _ in range(40):
            state = await graph.aget_state(cfg("t"))
            await graph.ainvoke({"n": 2 * (state.values["n"] // 2)}, cfg("t"))
        final = (await graph.aget_state(cfg("t"))).values["messages"]
        history = [s.values["messages"] async for s in graph.aget_state_history(cfg("t"))]
    [(depth,)] = await db.query(DEPTHS)
    assert depth == seeded == 2, "the growth's delta on the re-versioned one: no deeper"
    assert [m.content for m in final] == [m.content for m in seed] + ["reply 1"]
    assert all([m.content for m in h][:6] == [m.content for m in seed] for h in history if h)
    [(rows, deltas)] = await db.query(
        "SELECT COUNT(*), COUNT(base_version) FROM idem_blobs WHERE channel = 'messages'"
    )
    assert rows >= 42 and deltas == rows - 1, "one whole row, every other version a delta"


async def test_without_the_resumed_row_the_chain_deepens(db: Db, monkeypatch: Any) -> None:
    """The control of the test above: ``loaded`` without ``own`` (the behaviour before)
    makes each resumed re-version a delta of the version read."""
    from langgraph_idem_saver.list_deltas import ListDeltaEncoder

    original = ListDeltaEncoder.loaded

    def forgetful(self: Any, *args: Any) -> None:
        original(self, *args[:6])

    monkeypatch.setattr(ListDeltaEncoder, "loaded", forgetful)
    seed = [HumanMessage(f"m{i}", id=f"m{i}") for i in range(6)]
    async with db.open() as saver:
        graph = graph_of(saver)
        await graph.ainvoke({"messages": seed, "n": 0}, cfg("t"))
        await graph.ainvoke({"n": 1}, cfg("t"))
        [(seeded,)] = await db.query(DEPTHS)
        for _ in range(MAX_CHAIN // 2):
            await graph.ainvoke({"n": 0}, cfg("t"))
    [(depth,)] = await db.query(DEPTHS)
    assert depth == seeded + MAX_CHAIN // 2


# --- plans on a database with no statistics (PostgreSQL) ------------------------------

CHECKPOINTS = 600


async def _filled(dsn: str) -> None:
    """A thread of CHECKPOINTS checkpoints (list re-versioned each, one write each) in a
    schema set up just before, never analyzed (autovacuum off on its tables)."""
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            for table in ("idem_checkpoints", "idem_blobs", "idem_writes"):
                await conn.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = off)")
        graph = graph_of(saver)
        seed = [HumanMessage(f"m{i} " * 30, id=f"m{i}") for i in range(20)]
        await graph.ainvoke({"messages": seed, "n": 0}, cfg("long"))
        config = cfg("long")
        for _ in range(CHECKPOINTS // 2):
            await graph.ainvoke({"n": 0}, config)


async def _reads(dsn: str) -> dict[str, dict[str, list[int]]]:
    """Per read (alist of 10, aget_tuple), per table: [seq scans, rows they read, index
    scans, rows fetched by index], over 8 calls on one prepared connection (past the
    five after which PostgreSQL may switch to a generic plan)."""
    out: dict[str, dict[str, list[int]]] = {}
    async with await psycopg.AsyncConnection.connect(
        dsn, autocommit=True, prepare_threshold=0
    ) as conn:
        saver = AsyncPostgresSaver(conn)
        reads = {
            "alist": lambda: _consume(saver.alist(cfg("long"), limit=10)),
            "aget_tuple": lambda: saver.aget_tuple(cfg("long")),
        }
        for name, read in reads.items():
            out[name] = {}
            counts = {}
            for table in ("idem_checkpoints", "idem_blobs", "idem_writes"):
                counts[table] = table_reads(conn, table)
            for table, block in counts.items():
                async with block as got:
                    for _ in range(8):
                        await read()
                out[name][table] = got
    return out


async def _consume(it: Any) -> list[Any]:
    return [t async for t in it]


@pytest.mark.parametrize("analyzed", [False, True], ids=["fresh", "analyzed"])
async def test_reads_probe_indexes_with_and_without_statistics(pg_dsn: str, analyzed: bool) -> None:
    """No sequential scan of any table, and rows read bounded by the page (10 tuples:
    their blobs, bases and writes), not by the thread's CHECKPOINTS - on a database
    never analyzed and on the same one analyzed."""
    await _filled(pg_dsn)
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT reltuples FROM pg_class WHERE oid = 'idem_blobs'::regclass"
        )
        [(reltuples,)] = await cur.fetchall()
        assert reltuples == -1, "never analyzed"
        if analyzed:
            await conn.execute("ANALYZE idem_checkpoints, idem_blobs, idem_writes")
    reads = await _reads(pg_dsn)
    for name, tables in reads.items():
        for table, (seq, _, _, fetched) in tables.items():
            assert seq == 0, (name, table, tables)
            # per call at most: 11 checkpoints (the page and the next), their blobs
            # (4 channels + one base each) and writes: 36 blobs - far below CHECKPOINTS
            assert fetched <= 8 * 40, (name, table, tables)


async def test_the_checkpoint_reads_keep_their_generic_plan(pg_dsn: str) -> None:
    """The three read functions run with sequential scans off and one generic plan a
    session (migration 15): which plan a session uses depends neither on statistics nor
    on its first calls' arguments."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT proname, proconfig FROM pg_proc "
            "WHERE pronamespace = current_schema()::regnamespace AND proname = ANY(%s)",
            (["idem_checkpoint_tuple", "idem_list_in_ns", "idem_delta_history"],),
        )
        found = {name: set(config) for name, config in await cur.fetchall()}
    assert sorted(found) == ["idem_checkpoint_tuple", "idem_delta_history", "idem_list_in_ns"]
    for config in found.values():
        assert {"enable_seqscan=off", "plan_cache_mode=force_generic_plan"} <= config
