"""Growing list channels are stored as appended deltas: O(N) bytes, identical reads,
delta-aware collection, copy and prune - on both backends (the ``db`` fixture), then what
only PostgreSQL does (client-side compression, the one-statement fallback, migration)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Annotated, Any

import psycopg
import pytest
from fault_child import Db
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from pg_reads import plans_cached_on_empty_tables, table_reads
from test_fresh_db_reads import DEPTHS
from tool_node_helpers import cfg
from typing_extensions import TypedDict

from langgraph_idem_saver import CorruptRecordError
from langgraph_idem_saver.list_deltas import MAX_CHAIN, ListDeltaEncoder, resolve_value
from langgraph_idem_saver.postgres import AsyncPostgresSaver
from langgraph_idem_saver.postgres.saver import ZLIB_PREFIX


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def chat_graph(checkpointer: Any) -> Any:
    def reply(state: Chat) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"echo {last} " + "x" * 500)]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=checkpointer)


async def chat(graph: Any, thread: str, turns: int, start: int = 0) -> None:
    for i in range(start, start + turns):
        message = HumanMessage(content=f"turn {i}", id=f"h{i}")
        await graph.ainvoke({"messages": [message]}, cfg(thread))


async def blob_stats(db: Db) -> tuple[int, int, int]:
    """(rows, delta rows, bytes) of the messages channel's stored versions."""
    [(rows, deltas, size)] = await db.query(
        "SELECT COUNT(*), COUNT(base_version), SUM(LENGTH(blob)) FROM idem_blobs "
        "WHERE channel = 'messages'"
    )
    return rows, deltas, size


async def history(graph: Any, thread: str) -> list[Any]:
    return [
        # AI message ids are random uuids: compare what the model and user said
        [(m.type, m.content) for m in s.values.get("messages", [])]
        async for s in graph.aget_state_history(cfg(thread))
    ]


async def chat_beside_reference(saver: Any, make_graph: Callable[[Any], Any], turns: int) -> Any:
    """``turns`` turns of thread t on ``saver`` and on LangGraph's ``InMemorySaver``, whose
    histories must agree; the reference graph (on ``InMemorySaver``)."""
    reference = make_graph(InMemorySaver())
    await chat(reference, "t", turns)
    graph = make_graph(saver)
    await chat(graph, "t", turns)
    assert await history(graph, "t") == await history(reference, "t")
    return reference


async def test_a_long_chat_stores_each_message_about_once_and_reads_back_identically(
    db: Db,
) -> None:
    async with db.open() as saver:
        await chat_beside_reference(saver, chat_graph, 60)
        serde = saver.serde
    rows, deltas, size = await blob_stats(db)
    assert deltas > rows * 0.8, "most versions are stored as deltas"
    whole_each_time = sum(
        len(serde.dumps_typed(msgs)[1])
        for msgs in [[AIMessage(content="x" * 520)] * n for n in range(2, 121, 2)]
    )
    assert size < whole_each_time / 5, "stored bytes grow with what each turn adds"


async def test_reopened_saver_starts_a_fresh_chain_and_reads_stay_equal(db: Db) -> None:
    reference = chat_graph(InMemorySaver())
    await chat(reference, "t", 2 * MAX_CHAIN + 3)
    for start, turns in ((0, MAX_CHAIN + 2), (MAX_CHAIN + 2, MAX_CHAIN + 1)):
        async with db.open() as saver:
            await chat(chat_graph(saver), "t", turns, start)
    async with db.open() as saver:
        assert await history(chat_graph(saver), "t") == await history(reference, "t")
    # the resumed saver continued the chain from what it read (deltas after the reopen),
    # and every chain is bounded
    rows, deltas, _ = await blob_stats(db)
    assert deltas > rows * 0.8
    depths = await db.query(DEPTHS)
    assert depths[0][0] <= MAX_CHAIN


async def test_the_messages_of_finished_runs_are_not_kept_alive(db: Db) -> None:
    """The saver remembers the last list it wrote per channel (the base of the next
    delta) through weak references: when a run ends and LangGraph drops its state, the
    messages are freed as without this saver. (Held strongly, the last 512 conversations
    stayed in memory for the saver's lifetime, and every full collection walked them.)
    Chains keep growing as deltas across runs: each run remembers what it loaded."""
    async with db.open() as saver:
        graph = chat_graph(saver)
        alive: list[weakref.ref[Any]] = []
        for thread in ("a", "b", "c"):
            for i in range(4):
                out = await graph.ainvoke({"messages": [HumanMessage(f"turn {i}")]}, cfg(thread))
                alive += [weakref.ref(m) for m in out["messages"]]
            del out
        # aiosqlite's worker thread holds its last job (the last put) until the next one
        await saver.aget_tuple(cfg("another thread"))
        gc.collect()
        assert [r for r in alive if r() is not None] == []
        await chat(graph, "a", 3, start=4)  # resumes from what it reads: deltas again
    rows, deltas, _ = await blob_stats(db)
    assert rows == 3 * 4 * 2 + 3 * 2 and deltas >= rows - 3 - 1  # one whole row a thread


def test_the_delta_cache_drops_an_entry_whose_items_are_gone() -> None:
    """An entry whose list was freed is dropped on a later write, and one of items that
    take no weak references (strings) is held as a copy, as before."""
    encoder = ListDeltaEncoder()
    serde = JsonPlusSerializer()
    gone = [HumanMessage("a"), HumanMessage("b")]
    kept = ["x", "y"]
    for thread, value in (("gone", gone), ("kept", kept)):
        encoder.remember(thread, "", encoder.encode(serde, thread, "", {"m": value}, {"m": "1"}))
    grown = [*kept, "z"]
    [delta] = encoder.encode(serde, "kept", "", {"m": grown}, {"m": "2"})
    assert delta.base_version == "1"  # strings: compared through the copy
    del gone
    gc.collect()
    encoder.remember("other", "", encoder.encode(serde, "other", "", {"m": [1]}, {"m": "1"}))
    assert ("gone", "", "m") not in encoder._recent
    assert ("kept", "", "m") in encoder._recent


async def test_a_replaced_or_removed_message_is_stored_whole(db: Db) -> None:
    config = cfg("t")
    async with db.open() as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 3)
        [(before,)] = await db.query("SELECT COUNT(base_version) FROM idem_blobs")
        await graph.aupdate_state(config, {"messages": [RemoveMessage(id="h1")]})
        await graph.aupdate_state(config, {"messages": [HumanMessage("edited", id="h0")]})
        [(after,)] = await db.query("SELECT COUNT(base_version) FROM idem_blobs")
        values = (await graph.aget_state(config)).values["messages"]
    assert after == before, "a removal and a replacement are not appends: stored whole"
    assert [m.id for m in values if m.type == "human"] == ["h0", "h2"]
    assert values[0].content == "edited"
    async with db.open() as saver:
        again = (await chat_graph(saver).aget_state(config)).values["messages"]
    assert [(m.id, m.content) for m in again] == [(m.id, m.content) for m in values]


async def test_a_delta_whose_base_was_deleted_elsewhere_is_written_whole(db: Db) -> None:
    async with db.open() as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 2)
        # another process deletes the thread's blobs behind this saver's back
        await db.execute("DELETE FROM idem_blobs WHERE channel = 'messages'")
        await chat(graph, "t", 1, start=2)
        state = await graph.aget_state(cfg("t"))
    first_after = await db.query(
        "SELECT base_version FROM idem_blobs WHERE channel = 'messages' ORDER BY version LIMIT 1"
    )
    assert first_after == [(None,)], "the base it would extend is gone: stored whole"
    # LangGraph rebuilt the lost versions from the pending writes it keeps
    human = [m.content for m in state.values["messages"] if m.type == "human"]
    assert human == ["turn 0", "turn 1", "turn 2"]


async def test_a_missing_base_is_reported_as_corrupt_not_read_as_a_short_list(db: Db) -> None:
    async with db.open() as saver:
        await chat(chat_graph(saver), "t", 4)
    [(base,)] = await db.query(
        "SELECT base_version FROM idem_blobs WHERE base_version IS NOT NULL "
        "ORDER BY version DESC LIMIT 1"
    )
    await db.execute("DELETE FROM idem_blobs WHERE channel = 'messages' AND version = ?", (base,))
    async with db.open() as saver:
        with pytest.raises(CorruptRecordError, match="missing_base_version"):
            await saver.aget_tuple(cfg("t"))
        with pytest.raises(CorruptRecordError, match="missing_base_version"):
            [t async for t in saver.alist(cfg("t"))]


@pytest.mark.parametrize("operation", ["prune", "copy", "delete_for_runs"])
async def test_maintenance_keeps_the_bases_that_live_deltas_need(db: Db, operation: str) -> None:
    async with db.open() as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", MAX_CHAIN // 2)
        config = cfg("t", metadata={"run_id": "last-run"})
        await graph.ainvoke({"messages": [HumanMessage("last", id="hl")]}, config)
        before = (await graph.aget_state(config)).values["messages"]
        target = "t"
        if operation == "prune":
            await saver.aprune(["t"], strategy="keep_latest")
            # only the latest checkpoint is left, yet its chain's bases survived
            [(checkpoints,)] = await db.query("SELECT COUNT(*) FROM idem_checkpoints")
            assert checkpoints == 1
        elif operation == "copy":
            await saver.acopy_thread("t", "fork")
            await saver.adelete_thread("t")
            target = "fork"
        else:
            await saver.adelete_for_runs(["last-run"])
        after = (await graph.aget_state(cfg(target))).values
        # and the thread goes on from there, still as deltas of the kept versions
        await chat(graph, target, 2, start=100)
        last = (await graph.aget_state(cfg(target))).values
    expected = before if operation != "delete_for_runs" else before[:-2]
    assert [(m.id, m.content) for m in after["messages"]] == [(m.id, m.content) for m in expected]
    assert [(m.id, m.content) for m in last["messages"][: len(expected)]] == [
        (m.id, m.content) for m in expected
    ]
    assert [m.content for m in last["messages"] if m.type == "human"][-2:] == [
        "turn 100",
        "turn 101",
    ]


async def test_unreferenced_delta_chains_are_collected(db: Db) -> None:
    """Collection keeps exactly what live checkpoints reach: after prune of a long chat,
    the blobs left are the latest versions' chains, no more."""
    async with db.open() as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", MAX_CHAIN * 2)
        await saver.aprune(["t"], strategy="keep_latest")
        rows, deltas, _ = await blob_stats(db)
        assert 1 <= rows <= MAX_CHAIN + 1 and deltas == rows - 1
        await saver.aprune(["t"], strategy="delete")
        assert await blob_stats(db) == (0, 0, None)


# --- PostgreSQL only -------------------------------------------------------------------


async def query(dsn: str, sql: str, params: Any = None) -> list[tuple[Any, ...]]:
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(sql, params)
        return await cur.fetchall() if cur.description else []


async def test_delta_payloads_are_compressed_like_whole_values(pg_dsn: str) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 2)
        big = "y" * 5000
        config = cfg("t")
        await graph.ainvoke({"messages": [HumanMessage(big, id="big")]}, config)
        [(type_, base)] = await query(
            pg_dsn,
            "SELECT type, base_version FROM idem_blobs WHERE channel = 'messages' "
            "ORDER BY version DESC LIMIT 1",
        )
        assert base is not None and type_.startswith(ZLIB_PREFIX)
        values = (await graph.aget_state(config)).values["messages"]
    assert [m.content for m in values if m.type == "human"] == ["turn 0", "turn 1", big]


async def test_the_write_itself_falls_back_to_whole_when_the_base_is_gone(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The encoder proposes a delta (same objects, appended), but the base row was
    deleted since: the one statement writes nothing, and the retry stores it whole."""
    items = [HumanMessage("a", id="a"), AIMessage("b", id="b")]
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        fallbacks: list[str] = []
        whole = saver._deltas.whole

        def spy(serde: Any, blob: Any) -> Any:
            fallbacks.append(blob.channel)
            return whole(serde, blob)

        monkeypatch.setattr(saver._deltas, "whole", spy)
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        v1 = saver.get_next_version(None, None)
        cp1 = empty_checkpoint()
        cp1["channel_values"] = {"messages": items, "n": 1}
        cp1["channel_versions"] = {"messages": v1, "n": v1}
        stored = await saver.aput(config, cp1, {}, {"messages": v1, "n": v1})
        await query(pg_dsn, "DELETE FROM idem_blobs WHERE channel = 'messages'")

        v2 = saver.get_next_version(v1, None)
        grown = [*items, HumanMessage("c", id="c")]
        cp2 = empty_checkpoint()
        cp2["channel_values"] = {"messages": grown, "n": 1}
        cp2["channel_versions"] = {"messages": v2, "n": v1}
        latest = await saver.aput(stored, cp2, {}, {"messages": v2})
        assert fallbacks == ["messages"]
        rows = await query(pg_dsn, "SELECT channel, version, base_version FROM idem_blobs")
        assert sorted(rows) == [("messages", str(v2), None), ("n", str(v1), None)]
        tup = await saver.aget_tuple(latest)
        assert tup is not None
        assert [m.id for m in tup.checkpoint["channel_values"]["messages"]] == ["a", "b", "c"]
        assert tup.checkpoint["channel_values"]["n"] == 1

        # and the next append (to the list just read, as a resumed graph does) is a
        # delta of the version written whole
        v3 = saver.get_next_version(v2, None)
        read = tup.checkpoint["channel_values"]["messages"]
        cp3 = empty_checkpoint()
        cp3["channel_values"] = {"messages": [*read, AIMessage("d", id="d")], "n": 1}
        cp3["channel_versions"] = {"messages": v3, "n": v1}
        await saver.aput(latest, cp3, {}, {"messages": v3})
        assert fallbacks == ["messages"]
        [(base,)] = await query(
            pg_dsn, "SELECT base_version FROM idem_blobs WHERE version = %s", (str(v3),)
        )
        assert base == str(v2)
        tup = await saver.aget_tuple(config)
        assert tup is not None
        assert [m.id for m in tup.checkpoint["channel_values"]["messages"]] == list("abcd")


async def test_migration_adds_base_version_to_an_existing_database(pg_dsn: str) -> None:
    """A database at schema 2 (before deltas) is migrated in place; old rows read fine."""
    from langgraph_idem_saver.postgres import sql

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        for version in range(3):
            for statement in sql.MIGRATIONS[version]:
                await conn.execute(statement)
            await conn.execute(sql.INSERT_MIGRATION, (version,))
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await chat(chat_graph(saver), "t", 3)
        [(v,)] = await query(pg_dsn, "SELECT MAX(v) FROM idem_saver_migrations")
        assert v == sql.SCHEMA_VERSION >= 3
        values = (await chat_graph(saver).aget_state(cfg("t"))).values
    assert len(values["messages"]) == 6


BLOBS_FILL = """
INSERT INTO idem_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
SELECT 'other-' || (g / 20), '', 'messages', g::text, 'msgpack', '\\x90'
FROM generate_series(1, 20000) AS g
"""


async def test_a_delta_put_planned_while_the_table_was_small_never_scans_it(
    pg_dsn: str,
) -> None:
    """On a connection that prepares every statement (``prepare_threshold=0``, as
    LangGraph's savers open theirs) PostgreSQL caches a generic plan of the put. The
    check of a delta's base, a join inside the put, was cached on a fresh database as a
    sequential scan of every blob, kept as the table grew (each put of a growing chat
    0.2 ms slower after a thousand). The check is a function (migration 9): with the
    plans cached while the table was empty, a delta put on a table of 20,000 blobs reads
    its base through the primary key."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        messages: list[Any] = []
        version = None

        async def put_one_more(parent: Any) -> Any:
            nonlocal version
            messages.append(HumanMessage(f"m{len(messages)}", id=f"m{len(messages)}"))
            version = saver.get_next_version(version, None)
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": list(messages)}
            checkpoint["channel_versions"] = {"messages": version}
            return await saver.aput(parent, checkpoint, {}, {"messages": version})

        parent = config
        for _ in range(8):  # the plans are cached now, on a table of a few blobs
            parent = await put_one_more(parent)
        await conn.execute(BLOBS_FILL)
        async with table_reads(conn, "idem_blobs") as reads:
            parent = await put_one_more(parent)
        [(base,)] = await (
            await conn.execute(
                "SELECT base_version FROM idem_blobs WHERE thread_id = 't' AND version = %s",
                (str(version),),
            )
        ).fetchall()
        tup = await saver.aget_tuple(config)
    assert base is not None  # it was a delta, so its base was checked
    seq_scans, seq_rows, _, _ = reads
    assert (seq_scans, seq_rows) == (0, 0), reads
    assert tup is not None
    assert [m.id for m in tup.checkpoint["channel_values"]["messages"]] == [
        f"m{i}" for i in range(9)
    ]


def reemit_graph(checkpointer: Any) -> Any:
    """A reply, then a node that returns the whole list unchanged: ``add_messages``
    merges it into a new version holding the very same objects."""

    def reply(state: Chat) -> dict[str, Any]:
        n = len(state["messages"])
        return {"messages": [AIMessage(content=f"answer {n} " + "y" * 400, id=f"a{n}")]}

    def review(state: Chat) -> dict[str, Any]:
        return {"messages": state["messages"]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_node("review", review)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", "review")
    return builder.compile(checkpointer=checkpointer)


async def test_a_list_re_versioned_without_growing_is_not_stored_again(db: Db) -> None:
    """The whole list returned unchanged is stored as the row of its last version again
    (a delta: the same bytes and base) or as a delta of no items (its last version was
    whole): never the whole list once more. Every version reads back as LangGraph's own
    saver gives it, in this saver and in a fresh one."""
    async with db.open() as saver:
        reference = await chat_beside_reference(saver, reemit_graph, 12)
    async with db.open() as saver:
        assert await history(reemit_graph(saver), "t") == await history(reference, "t")
    rows = await db.query(
        "SELECT blob, base_version FROM idem_blobs WHERE channel = 'messages' ORDER BY version"
    )
    # 36 versions (input, reply and review, a turn); only the first and the versions
    # where the chain reached MAX_CHAIN are whole (each review's was, before)
    assert len(rows) == 36
    assert sum(base is None for _, base in rows) <= 1 + 36 // MAX_CHAIN
    repeats = sum(rows[i] == rows[i - 1] for i in range(1, len(rows)))
    assert repeats >= 12 - 36 // MAX_CHAIN, "a review's row is its reply's row again"


class SameList:
    """Puts of one list, re-versioned without growing (the very same objects each time),
    on one thread; reads every version back after writing them all (a read remembers the
    objects it decoded - what a resumed graph holds - which are not these)."""

    def __init__(self, thread: str, items: list[Any]) -> None:
        self.items = items
        self.config: Any = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
        self.version: Any = None
        self.written: list[Any] = []

    async def put(self, saver: Any, step: int) -> None:
        checkpoint = empty_checkpoint()
        self.version = saver.get_next_version(self.version, None)
        checkpoint["channel_values"] = {"messages": list(self.items)}
        checkpoint["channel_versions"] = {"messages": self.version}
        new = {"messages": self.version}
        self.config = await saver.aput(self.config, checkpoint, {"step": step}, new)
        self.written.append(self.config)

    async def read_back(self, saver: Any) -> None:
        for config in self.written:
            stored = await saver.aget_tuple(config)
            assert stored is not None
            assert stored.checkpoint["channel_values"]["messages"] == self.items


async def test_re_versions_of_the_same_list_do_not_deepen_the_chain(db: Db) -> None:
    """The same list re-versioned many times: one whole row, then deltas of no items on
    it (the second version's row, repeated), each version read back equal."""
    same = SameList("same", [HumanMessage(content=f"m{i}", id=f"m{i}") for i in range(5)])
    async with db.open() as saver:
        for step in range(2 * MAX_CHAIN + 3):
            await same.put(saver, step)
        empty = saver.serde.dumps_typed([])[1]
        await same.read_back(saver)
    rows = await db.query(
        "SELECT version, blob, base_version FROM idem_blobs WHERE channel = 'messages' "
        "ORDER BY version"
    )
    first = rows[0][0]
    assert rows[0][2] is None
    assert all((bytes(blob), base) == (empty, first) for _, blob, base in rows[1:])


def test_a_dead_reference_never_matches_a_none() -> None:
    """Items held by weak reference read as None once freed: a new list holding None
    where they were is not a continuation of them (it would read back the old items)."""

    serde = JsonPlusSerializer()
    encoder = ListDeltaEncoder()
    items = [HumanMessage(content="a"), HumanMessage(content="b")]
    encoder.remember("t", "", encoder.encode(serde, "t", "", {"m": items}, {"m": "1"}))
    del items
    gc.collect()
    written = encoder._recent[("t", "", "m")]
    assert written.weak and written.held[0]() is None
    [blob] = encoder.encode(serde, "t", "", {"m": [None, None, "x"]}, {"m": "2"})
    assert blob.base_version is None


# --- the encoder and the reader agree, whatever the edits (property test) ----------------

edits = st.lists(
    st.tuples(
        st.sampled_from(["append", "window", "same", "replace", "shrink", "rebuild"]),
        st.integers(0, 4),
        st.integers(0, 3),
    ),
    min_size=1,
    max_size=3 * MAX_CHAIN,
)


@example(ops=[("window", 1, 1)] * (MAX_CHAIN + 2) + [("same", 0, 0)] * 3, weak=True).via(
    "windows past MAX_CHAIN, then the same list again"
)
@example(ops=[("same", 0, 0), ("window", 2, 0), ("same", 0, 0)], weak=False).via("strong")
@given(ops=edits, weak=st.booleans())
@settings(max_examples=5 * settings.default.max_examples)
def test_every_version_the_encoder_writes_reads_back_as_the_list_it_was(
    ops: list[tuple[str, int, int]], weak: bool
) -> None:
    """Rows as ``ListDeltaEncoder`` writes them (deltas, repeated rows, whole values: a
    window that dropped its oldest items, a shrunk or rebuilt list), read back with
    ``resolve_value``: each version is the very list written."""
    serde = JsonPlusSerializer()
    encoder = ListDeltaEncoder()
    made = iter(range(10**6))

    def item() -> Any:
        n = next(made)
        return HumanMessage(content=f"m{n}", id=f"m{n}") if weak else f"item {n}"

    rows: dict[str, tuple[str, bytes | None, str | None]] = {}
    written: list[tuple[str, list[Any]]] = []
    value = [item() for _ in range(4)]
    for step, (op, a, b) in enumerate(ops):
        if op == "append":
            value = [*value, *(item() for _ in range(a))]
        elif op == "window":
            value = [*value[min(a, len(value)) :], *(item() for _ in range(b))]
        elif op == "replace" and value:
            value = [*value[:-1], item()]
        elif op == "shrink":
            value = value[: max(len(value) - a, 0)]
        elif op == "rebuild":  # equal objects, not the same ones (as read back): whole
            value = [serde.loads_typed(serde.dumps_typed(x)) for x in value]
        else:  # "same": the very list again
            value = list(value)
        version = f"{step + 1:08d}"
        blobs = encoder.encode(serde, "t", "", {"m": value}, {"m": version})
        encoder.remember("t", "", blobs)
        [blob] = blobs
        rows[version] = (blob.type, blob.data, blob.base_version)
        written.append((version, list(value)))
    for version, expected in written:
        type_, data, base = rows[version]
        got, depth = resolve_value(serde, type_, data, base, rows.get)
        assert got == expected, f"version {version}"
        assert depth <= MAX_CHAIN


async def test_a_row_is_stored_again_only_by_the_serializer_that_wrote_it(db: Db) -> None:
    """A list re-versioned after the saver's serializer was swapped (an encrypting one
    set on a live saver) is written by the new serializer, not copied from the row the
    old one wrote: nothing in clear after the swap, and every version reads back."""
    from langgraph.checkpoint.serde.encrypted import EncryptedSerializer

    same = SameList("swap", [HumanMessage(content=f"secret {i}", id=f"s{i}") for i in range(3)])
    async with db.open() as saver:
        for step in range(4):
            if step == 2:
                saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
            await same.put(saver, step)
        await same.read_back(saver)
    rows = await db.query(
        "SELECT type, blob, base_version FROM idem_blobs WHERE channel = 'messages' "
        "ORDER BY version"
    )
    types = [str(t) for t, _, _ in rows]
    assert "aes" not in types[1] and all("aes" in t for t in types[2:]), types
    assert rows[3][1:] == rows[2][1:], "after the swap, the new serializer's row again"
