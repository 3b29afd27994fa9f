"""The savers' read-side methods (``sqlite/inspect.py``, ``postgres/inspect.py``) on both
backends: what the CLI reads, with no SQL of its own."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.messages import ToolMessage
from langgraph.checkpoint.base import empty_checkpoint
from tool_node_helpers import cfg, intent_for, plant_completed, plant_unknown

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.inspect_types import (
    CheckpointHistory,
    DeletedCounts,
    StorageCounts,
    ThreadSummary,
)
from langgraph_idem_saver.inspection import aresolve_unknown, astats

CALL = {"name": "charge", "args": {"invoice": "inv-1", "amount": 5}, "id": "call_1"}


def config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    """``cfg`` that always names a namespace ("" the root)."""
    return cfg(thread_id, ns, checkpoint_id)


async def chain(saver: Any, thread_id: str, n: int, ns: str = "") -> list[str]:
    """``n`` checkpoints in one namespace, each the child of the one before; their ids."""
    at = config(thread_id, ns)
    ids = []
    for step in range(n):
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"count": step}
        checkpoint["channel_versions"] = {"count": f"{step + 1:032}"}
        at = await saver.aput(
            at, checkpoint, {"step": step, "source": "loop"}, {"count": f"{step + 1:032}"}
        )
        ids.append(at["configurable"]["checkpoint_id"])
    return ids


async def test_thread_summaries_count_root_and_subgraph_checkpoints_apart(saver: Any) -> None:
    root = await chain(saver, "t1", 3)
    await chain(saver, "t1", 5, ns="child:task-1")
    await saver.aput_writes(config("t1", "", root[-1]), [("__interrupt__", "ask")], "task-a")
    await plant_completed(saver, intent_for("t-ledger", CALL), ToolMessage("ok", tool_call_id="c"))

    by_id = {s.thread_id: s for s in await saver.athread_summaries()}
    assert set(by_id) == {"t1", "t-ledger"}
    t1 = by_id["t1"]
    assert (t1.checkpoints, t1.subgraph_checkpoints) == (3, 5)
    assert t1.head_id == root[-1] and t1.head is not None
    assert (t1.head_writes, t1.head_interrupted, t1.head_error) == (1, True, False)
    assert t1.ledger_entries == 0
    assert by_id["t-ledger"] == ThreadSummary("t-ledger", 0, 0, None, None, 0, False, False, 1)
    history = await saver.acheckpoint_history("t1")
    assert history.total == t1.checkpoints, "a thread's count is its history's length"


async def test_checkpoint_history_newest_first_per_namespace(saver: Any) -> None:
    root = await chain(saver, "t1", 4)
    sub = await chain(saver, "t1", 2, ns="child:task-1")
    await saver.aput_writes(config("t1", "", root[1]), [("x", 1), ("y", 2)], "task-a")

    history = await saver.acheckpoint_history("t1", "", limit=3)
    assert history.total == 4
    assert [r.checkpoint_id for r in history.rows] == root[::-1][:3]
    assert [r.parent_checkpoint_id for r in history.rows] == root[::-1][1:4]
    assert [r.metadata["step"] for r in history.rows] == [3, 2, 1]
    assert [r.pending_writes for r in history.rows] == [0, 0, 2]
    whole = await saver.acheckpoint_history("t1", "child:task-1")
    assert whole.total == 2 and [r.checkpoint_id for r in whole.rows] == sub[::-1]
    assert await saver.acheckpoint_history("nobody") == CheckpointHistory(0, [])


async def test_prefix_lookups(saver: Any) -> None:
    ids = await chain(saver, "t1", 2)
    assert await saver.acheckpoint_ids_with_prefix("t1", "", ids[0]) == [ids[0]]
    assert await saver.acheckpoint_ids_with_prefix("t1", "", "") == sorted(ids)
    assert await saver.acheckpoint_ids_with_prefix("t1", "", "", limit=1) == sorted(ids)[:1]
    assert await saver.acheckpoint_ids_with_prefix("t1", "other-ns", ids[0]) == []

    a = await plant_completed(saver, intent_for("t1", CALL), ToolMessage("ok", tool_call_id="c"))
    b = await plant_completed(
        saver, intent_for("t2", {**CALL, "id": "call_2"}), ToolMessage("ok", tool_call_id="c")
    )
    assert await saver.aentry_keys_with_prefix(a.key[:8]) == [(a.scope, a.key)]
    assert await saver.aentry_keys_with_prefix(a.key[:8], "t2") == []
    assert set(await saver.aentry_keys_with_prefix("")) == {(a.scope, a.key), (b.scope, b.key)}
    assert await saver.aentry_keys_with_prefix("", "t2") == [(b.scope, b.key)]


async def test_thread_exists_by_checkpoint_or_ledger_entry(saver: Any) -> None:
    await chain(saver, "t1", 1)
    await plant_completed(saver, intent_for("t2", CALL), ToolMessage("ok", tool_call_id="c"))
    assert await saver.athread_exists("t1") and await saver.athread_exists("t2")
    assert not await saver.athread_exists("t3")


async def test_checkpoint_nodes_for_prune_planning(saver: Any) -> None:
    root = await chain(saver, "t1", 2)
    await chain(saver, "t2", 1)
    await saver.aput_writes(config("t1", "", root[0]), [("x", 1)], "task-a")

    nodes = await saver.acheckpoint_nodes(["t1"])
    assert sorted((n.checkpoint_id, n.parent_checkpoint_id, n.writes) for n in nodes) == [
        (root[0], None, 1),
        (root[1], root[0], 0),
    ]
    assert {n.thread_id for n in await saver.acheckpoint_nodes()} == {"t1", "t2"}
    assert await saver.acheckpoint_nodes([]) == []


async def test_delete_checkpoints_keeps_the_rest_and_the_ledger(saver: Any) -> None:
    root = await chain(saver, "t1", 3)
    await saver.aput_writes(config("t1", "", root[0]), [("x", 1)], "task-a")
    entry = await plant_completed(
        saver, intent_for("t1", CALL), ToolMessage("ok", tool_call_id="c")
    )
    blobs_before = (await saver.astorage_counts()).blobs

    deleted = await saver.adelete_checkpoints([("t1", "", root[0]), ("t1", "", root[1])])
    assert (deleted.checkpoints, deleted.writes) == (2, 1)
    assert deleted.blobs == 2 == blobs_before - (await saver.astorage_counts()).blobs
    history = await saver.acheckpoint_history("t1")
    assert [r.checkpoint_id for r in history.rows] == [root[2]]
    head = await saver.aget_tuple(config("t1"))
    assert head is not None and head.checkpoint["channel_values"] == {"count": 2}
    assert await saver.aget_entry(entry.scope, entry.key) is not None, "ledger entries stay"
    assert await saver.adelete_checkpoints([]) == DeletedCounts(0, 0, 0)


async def test_storage_counts(saver: Any) -> None:
    await chain(saver, "t1", 2)
    await chain(saver, "t1", 1, ns="child:task-1")
    [t2] = await chain(saver, "t2", 1)
    await saver.aput_writes(config("t2", "", t2), [("x", 1)], "task-a")
    await plant_completed(saver, intent_for("t1", CALL), ToolMessage("ok", tool_call_id="c"))

    counts = await saver.astorage_counts()
    assert isinstance(counts, StorageCounts)
    assert (counts.threads, counts.checkpoints, counts.blobs, counts.writes) == (2, 4, 4, 1)
    assert counts.ledger_entries == 1
    assert counts.schema_version is not None and counts.schema_version >= 1
    assert counts.size_bytes is not None and counts.size_bytes > 0


async def test_stats_count_an_approved_rerun_as_settled(saver: Any) -> None:
    """An entry an operator released for a re-run is no unknown outcome any more, as
    ``alist_unknown`` (and ``idem-saver pending``) say."""
    entry = await plant_unknown(saver, intent_for("t1", CALL))
    assert (await astats(saver, "t1")).unknown == 1
    await aresolve_unknown(saver, entry, "rerun")
    stats = await astats(saver, "t1")
    assert (stats.unknown, stats.in_progress) == (0, 1)
    assert await saver.alist_unknown() == []


BAD_TEXT = ["a\x00b", "\ud800"]


@pytest.mark.parametrize("bad", BAD_TEXT, ids=["nul", "lone-surrogate"])
async def test_ids_and_prefixes_a_database_cannot_hold_are_config_errors(
    saver: Any, bad: str
) -> None:
    calls = [
        saver.athread_exists(bad),
        saver.acheckpoint_history(bad),
        saver.acheckpoint_history("t1", bad),
        saver.acheckpoint_ids_with_prefix("t1", "", bad),
        saver.aentry_keys_with_prefix(bad),
        saver.aentry_keys_with_prefix("abc", bad),
        saver.acheckpoint_nodes([bad]),
        saver.adelete_checkpoints([("t1", "", bad)]),
    ]
    for call in calls:
        with pytest.raises(ConfigError):
            await call


async def test_bad_limits_and_keys_are_config_errors(saver: Any) -> None:
    with pytest.raises(ConfigError, match="limit"):
        await saver.acheckpoint_history("t1", limit=-1)
    with pytest.raises(ConfigError, match="limit"):
        await saver.acheckpoint_ids_with_prefix("t1", "", "a", limit=True)
    with pytest.raises(ConfigError, match="checkpoint key"):
        await saver.adelete_checkpoints([("t1", "only-two")])  # type: ignore[list-item]
    with pytest.raises(ConfigError, match="must be a str"):
        await saver.athread_exists(7)


async def test_is_idem_database_tells_ours_from_another(
    saver: Any, backend: str, tmp_path: Any, request: pytest.FixtureRequest
) -> None:
    """Read before ``setup()``, which would create the tables: a foreign database stays
    as it was."""
    assert await type(saver).ais_idem_database(saver.conn)
    if backend == "sqlite":
        import aiosqlite

        other = tmp_path / "other.sqlite"
        async with aiosqlite.connect(other) as conn:
            await conn.execute("CREATE TABLE notes (body TEXT)")
            assert not await type(saver).ais_idem_database(conn)
            async with conn.execute("SELECT name FROM sqlite_master") as cur:
                assert [r[0] for r in await cur.fetchall()] == ["notes"]
    else:
        import psycopg
        from pg_server import afresh_dsn

        dsn = await afresh_dsn(request.getfixturevalue("pg_server_dsn"))
        async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
            assert not await type(saver).ais_idem_database(conn)
            cur = await conn.execute("SELECT to_regclass('idem_checkpoints') IS NULL")
            assert (await cur.fetchone()) == (True,)


async def test_a_read_only_sqlite_uri_is_known_to_the_saver(tmp_path: Any) -> None:
    """The CLI opens SQLite files as ``mode=ro`` URIs and lets the saver find that out
    from the connection (``sqlite.files.target_of_connection``, which reads what
    aiosqlite closed over): if aiosqlite stops keeping it, this fails, not the CLI."""
    import aiosqlite

    from langgraph_idem_saver import AsyncSqliteSaver
    from langgraph_idem_saver.errors import ReadOnlyDatabaseError

    path = tmp_path / "app.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        await chain(saver, "t1", 1)
    async with aiosqlite.connect(f"{path.as_uri()}?mode=ro", uri=True) as conn:
        assert await AsyncSqliteSaver.ais_idem_database(conn)
        reader = AsyncSqliteSaver(conn)
        assert [s.thread_id for s in await reader.athread_summaries()] == ["t1"]
        with pytest.raises(ReadOnlyDatabaseError, match="opened read-only"):
            await chain(reader, "t2", 1)
