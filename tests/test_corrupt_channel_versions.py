"""A checkpoint row whose ``channel_versions`` column was corrupted by hand.

The column holds the row's blob keys (a JSON object ``{channel: version}``). Edited into
malformed JSON, SQLite's ``json_each`` failed the whole read with "malformed JSON", which
the saver reported as ``NotADatabaseError`` (the file is fine); valid JSON of another
shape (an array, a string, numbers, an object naming other versions) named no blob and
the read returned the checkpoint WITHOUT its channel values. The standard: a corrupt row
is a :class:`CorruptRecordError` naming it (thread, namespace, checkpoint id), and the
thread's other rows stay readable where a read does not need the corrupt one.

Each read path on a real file written through the saver and corrupted with ``sqlite3``:
``aget_tuple``, ``alist`` (the rows before the corrupt one, then its error), the sync
``SqliteSaver``'s ``get_tuple``/``list`` (they run the same bodies on the caller's
thread), and the ``DeltaChannel`` history walk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from langgraph_idem_saver import AsyncSqliteSaver, SqliteSaver
from langgraph_idem_saver.errors import CorruptRecordError, NotADatabaseError

THREAD = "t"
N = 5
CORRUPT = 2  # the index of the corrupted checkpoint: two newer, two older
# malformed JSON, valid JSON that is not an object, an object of numbers, an object
# naming no version (all its values silently dropped before)
NOT_AN_OBJECT = ("{bad", "[1,2]", '"text"', "")
WRONG_VERSIONS = ('{"messages": 5, "plain": 7}', "{}", '{"plain": "0.1"}')


def cfg(checkpoint_id: str | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def build(saver: AsyncSqliteSaver) -> list[str]:
    """A chain of N checkpoints: ``plain`` stored at each, ``messages`` a DeltaChannel
    snapshot at the root and its writes after (what the history walk reads)."""
    ids: list[str] = []
    versions: dict[str, Any] = {}
    for i in range(N):
        versions = {
            "messages": saver.get_next_version(versions.get("messages"), None),
            "plain": saver.get_next_version(versions.get("plain"), None),
        }
        values: dict[str, Any] = {"plain": f"v{i}"}
        if i == 0:
            values["messages"] = _DeltaSnapshot(["m0"])
        checkpoint: Any = {
            **empty_checkpoint(),
            "id": str(uuid6(clock_seq=i)),
            "channel_values": values,
            "channel_versions": versions,
        }
        parent = cfg(ids[-1]) if ids else cfg()
        await saver.aput(parent, checkpoint, {"step": i}, dict(versions))
        ids.append(checkpoint["id"])
        if i < N - 1:
            await saver.aput_writes(
                cfg(checkpoint["id"]),
                [("messages", [f"m{i + 1}"])],
                str(uuid.UUID(int=i)),
                "~__pregel_pull, agent",
            )
    return ids


def shown(tup: CheckpointTuple) -> tuple[Any, ...]:
    """What a read returns of a tuple, comparable across saver instances."""
    return (
        tup.config,
        tup.checkpoint["channel_values"],
        tup.checkpoint["channel_versions"],
        tup.metadata,
        tup.parent_config,
        tup.pending_writes,
    )


class Thread:
    """The thread as read before the corruption, and the file."""

    def __init__(self, path: Path, ids: list[str], before: dict[str, Any], delta: Any) -> None:
        self.path, self.ids, self.before, self.delta = path, ids, before, delta

    def corrupt(self, text: str, column: str = "channel_versions") -> None:
        with sqlite3.connect(self.path) as conn:
            conn.execute(
                f"UPDATE idem_checkpoints SET {column} = ? WHERE checkpoint_id = ?",
                (text, self.ids[CORRUPT]),
            )
        conn.close()

    def assert_names_the_row(self, exc: CorruptRecordError) -> None:
        assert exc.location == {
            "thread_id": THREAD,
            "checkpoint_ns": "",
            "checkpoint_id": self.ids[CORRUPT],
        }
        assert exc.what == "channel_versions"
        assert self.ids[CORRUPT] in str(exc)


@pytest.fixture
def thread(tmp_path: Path) -> Thread:
    path = tmp_path / "corrupt.db"

    async def write() -> Thread:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            ids = await build(saver)
            reads = {}
            for cid in ids:
                tup = await saver.aget_tuple(cfg(cid))
                assert tup is not None
                reads[cid] = shown(tup)
            delta = {
                cid: await saver.aget_delta_channel_history(config=cfg(cid), channels=["messages"])
                for cid in ids
            }
        return Thread(path, ids, reads, delta)

    return asyncio.run(write())


async def alist_until_error(
    saver: AsyncSqliteSaver, config: RunnableConfig, **kwargs: Any
) -> tuple[list[Any], CorruptRecordError | None]:
    got: list[Any] = []
    try:
        async for tup in saver.alist(config, **kwargs):
            got.append(shown(tup))
    except CorruptRecordError as exc:
        return got, exc
    return got, None


def list_until_error(
    saver: SqliteSaver, config: RunnableConfig, **kwargs: Any
) -> tuple[list[Any], CorruptRecordError | None]:
    got: list[Any] = []
    try:
        for tup in saver.list(config, **kwargs):
            got.append(shown(tup))
    except CorruptRecordError as exc:
        return got, exc
    return got, None


ALL = NOT_AN_OBJECT + WRONG_VERSIONS


@pytest.mark.parametrize("text", ALL)
def test_async_reads_name_the_corrupt_row_and_read_the_others(thread: Thread, text: str) -> None:
    thread.corrupt(text)
    ids, before = thread.ids, thread.before
    newer = [before[cid] for cid in reversed(ids[CORRUPT + 1 :])]
    older = [before[cid] for cid in reversed(ids[:CORRUPT])]

    async def read() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(thread.path)) as saver:
            with pytest.raises(CorruptRecordError) as caught:
                await saver.aget_tuple(cfg(ids[CORRUPT]))
            thread.assert_names_the_row(caught.value)
            for cid in ids[:CORRUPT] + ids[CORRUPT + 1 :]:
                tup = await saver.aget_tuple(cfg(cid))
                assert tup is not None and shown(tup) == before[cid]
            latest = await saver.aget_tuple(cfg())
            assert latest is not None and shown(latest) == before[ids[-1]]
            # a page of alist: the rows before the corrupt one, then its error
            got, exc = await alist_until_error(saver, cfg())
            assert got == newer and exc is not None
            thread.assert_names_the_row(exc)
            got, exc = await alist_until_error(saver, cfg(), limit=CORRUPT)
            assert got == newer[:CORRUPT] and exc is None  # a read not reaching it
            got, exc = await alist_until_error(saver, cfg(), before=cfg(ids[CORRUPT]))
            assert got == older and exc is None

    asyncio.run(read())


@pytest.mark.parametrize("text", ALL)
def test_sync_reads_name_the_corrupt_row_and_read_the_others(thread: Thread, text: str) -> None:
    thread.corrupt(text)
    ids, before = thread.ids, thread.before
    newer = [before[cid] for cid in reversed(ids[CORRUPT + 1 :])]
    older = [before[cid] for cid in reversed(ids[:CORRUPT])]
    with SqliteSaver.from_conn_string(str(thread.path)) as saver:
        for _ in range(2):  # the second read runs on the caller's thread (set up)
            with pytest.raises(CorruptRecordError) as caught:
                saver.get_tuple(cfg(ids[CORRUPT]))
            thread.assert_names_the_row(caught.value)
            for cid in ids[:CORRUPT] + ids[CORRUPT + 1 :]:
                tup = saver.get_tuple(cfg(cid))
                assert tup is not None and shown(tup) == before[cid]
            got, exc = list_until_error(saver, cfg())
            assert got == newer and exc is not None
            thread.assert_names_the_row(exc)
            got, exc = list_until_error(saver, cfg(), before=cfg(ids[CORRUPT]))
            assert got == older and exc is None


@pytest.mark.parametrize("text", NOT_AN_OBJECT)
def test_the_delta_history_walk_names_a_corrupt_row_it_passes(thread: Thread, text: str) -> None:
    """The walk from the head passes the corrupt row (the seed is at the root): its
    error; a walk that starts below it reads as before, from both savers."""
    thread.corrupt(text)
    ids = thread.ids

    async def read() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(thread.path)) as saver:
            for target in (None, ids[-1], ids[CORRUPT]):
                with pytest.raises(CorruptRecordError) as caught:
                    await saver.aget_delta_channel_history(
                        config=cfg(target), channels=["messages"]
                    )
                thread.assert_names_the_row(caught.value)
            for cid in ids[:CORRUPT]:
                got = await saver.aget_delta_channel_history(config=cfg(cid), channels=["messages"])
                assert got == thread.delta[cid]

    asyncio.run(read())
    with SqliteSaver.from_conn_string(str(thread.path)) as saver:
        for _ in range(2):
            with pytest.raises(CorruptRecordError) as caught:
                saver.get_delta_channel_history(config=cfg(), channels=["messages"])
            thread.assert_names_the_row(caught.value)
            got = saver.get_delta_channel_history(config=cfg(ids[1]), channels=["messages"])
            assert got == thread.delta[ids[1]]


@pytest.mark.parametrize("text", WRONG_VERSIONS)
def test_the_delta_history_reads_an_object_column_for_its_versions_only(
    thread: Thread, text: str
) -> None:
    """An object column naming other versions: the walk takes no seed from that row
    (its versions match no stored value) and finds the one below it, with the writes
    between - the history LangGraph rebuilds the channel from, as before the edit; the
    row itself is refused by aget_tuple (above), which LangGraph reads with it."""
    thread.corrupt(text)

    async def read() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(thread.path)) as saver:
            for cid in thread.ids:
                got = await saver.aget_delta_channel_history(config=cfg(cid), channels=["messages"])
                assert got == thread.delta[cid]

    asyncio.run(read())


def test_malformed_json_read_by_sql_is_corrupt_record_not_a_bad_file(thread: Thread) -> None:
    """Metadata corrupted into malformed JSON and read by SQL (a metadata filter):
    SQLite's "malformed JSON" is a CorruptRecordError naming the database, never
    NotADatabaseError - the file is fine, and every other read works."""
    thread.corrupt("{bad", column="metadata")

    async def read() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(thread.path)) as saver:
            with pytest.raises(CorruptRecordError) as caught:
                [t async for t in saver.alist(cfg(), filter={"step": 1})]
            assert not isinstance(caught.value, NotADatabaseError)
            assert caught.value.location == {"database": str(thread.path)}
            tup = await saver.aget_tuple(cfg(thread.ids[-1]))
            assert tup is not None and shown(tup) == thread.before[thread.ids[-1]]

    asyncio.run(read())
