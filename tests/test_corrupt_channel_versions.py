"""A checkpoint row whose ``channel_versions`` column was corrupted by hand.

The column holds the row's blob keys (a JSON object ``{channel: version}``, a copy of the
versions its checkpoint names). Edited into malformed JSON, SQLite's ``json_each`` failed
the whole read with "malformed JSON", which the saver reported as ``NotADatabaseError``
(the file is fine); on PostgreSQL (``jsonb``: always valid JSON) an array or a scalar
made ``jsonb_each_text`` fail the statement, reported as a NUL-character
``SerializationError``; and on both, valid JSON of another shape (numbers, an object
naming other versions) named no blob: the read returned the checkpoint WITHOUT its
channel values. The standard: a corrupt row is a :class:`CorruptRecordError` naming it
(thread, namespace, checkpoint id), and the thread's other rows stay readable where a
read does not need the corrupt one.

Each read path, on a real SQLite file and a real PostgreSQL schema, written through the
saver and corrupted with the driver: ``aget_tuple``, ``alist`` (the rows before the
corrupt one, then its error), the sync savers' ``get_tuple``/``list`` (the same bodies,
run on the caller's thread), and the ``DeltaChannel`` history walk.
"""

from __future__ import annotations

import asyncio
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.serde.types import _DeltaSnapshot

from langgraph_idem_saver import AsyncSqliteSaver, SqliteSaver
from langgraph_idem_saver.errors import CorruptRecordError, NotADatabaseError
from langgraph_idem_saver.postgres import AsyncPostgresSaver, PostgresSaver

THREAD = "t"
N = 5
CORRUPT = 2  # the index of the corrupted checkpoint: two newer, two older
# text that is not a JSON object: malformed (SQLite only: jsonb holds valid JSON), an
# array, a string, a number, null, empty (SQLite only)
NOT_AN_OBJECT = {
    "sqlite": ("{bad", "[1,2]", '"text"', "5", ""),
    "postgres": ("[1,2]", '"text"', "5", "null"),
}
# an object of numbers, an object naming nothing, an object naming other versions (its
# values all silently dropped before)
WRONG_VERSIONS = ('{"messages": 5, "plain": 7}', "{}", '{"plain": "0.1"}')
BACKENDS = ("sqlite", "postgres")


def cfg(checkpoint_id: str | None = None) -> RunnableConfig:
    configurable: dict[str, Any] = {"thread_id": THREAD, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def build(saver: Any) -> list[str]:
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
    """A thread of N checkpoints on one backend, as read before the corruption."""

    def __init__(self, backend: str, where: str) -> None:
        self.backend, self.where = backend, where
        self.ids: list[str] = []
        self.before: dict[str, Any] = {}
        self.delta: dict[str, Any] = {}

    def async_saver(self) -> AbstractAsyncContextManager[Any]:
        if self.backend == "sqlite":
            return AsyncSqliteSaver.from_conn_string(self.where)
        return AsyncPostgresSaver.from_conn_string(self.where)

    @contextmanager
    def sync_saver(self) -> Iterator[Any]:
        if self.backend == "sqlite":
            with SqliteSaver.from_conn_string(self.where) as saver:
                yield saver
        else:  # over the caller's own connection: the direct path
            with psycopg.connect(self.where, autocommit=True) as conn, PostgresSaver(conn) as saver:
                yield saver

    async def write(self) -> None:
        async with self.async_saver() as saver:
            if self.backend == "postgres":
                await saver.setup()
            self.ids = await build(saver)
            for cid in self.ids:
                tup = await saver.aget_tuple(cfg(cid))
                assert tup is not None
                self.before[cid] = shown(tup)
                self.delta[cid] = await saver.aget_delta_channel_history(
                    config=cfg(cid), channels=["messages"]
                )

    def corrupt(self, text: str, column: str = "channel_versions", index: int = CORRUPT) -> None:
        """Write ``text`` into the ``column`` of checkpoint ``index`` by hand."""
        target = self.ids[index]
        if self.backend == "sqlite":
            conn = sqlite3.connect(self.where)
            with conn:
                conn.execute(
                    f"UPDATE idem_checkpoints SET {column} = ? WHERE checkpoint_id = ?",
                    (text, target),
                )
            conn.close()
        else:
            with psycopg.connect(self.where, autocommit=True) as pg:
                pg.execute(
                    f"UPDATE idem_checkpoints SET {column} = %s::jsonb WHERE checkpoint_id = %s",
                    (text, target),
                )

    def assert_names_the_row(self, exc: CorruptRecordError, index: int = CORRUPT) -> None:
        assert exc.location == {
            "thread_id": THREAD,
            "checkpoint_ns": "",
            "checkpoint_id": self.ids[index],
        }
        assert exc.what == "channel_versions"
        assert self.ids[index] in str(exc)

    def newer(self) -> list[Any]:
        return [self.before[cid] for cid in reversed(self.ids[CORRUPT + 1 :])]

    def older(self) -> list[Any]:
        return [self.before[cid] for cid in reversed(self.ids[:CORRUPT])]

    def others(self) -> list[str]:
        return self.ids[:CORRUPT] + self.ids[CORRUPT + 1 :]


@pytest.fixture(params=BACKENDS)
def thread(request: pytest.FixtureRequest, tmp_path: Path) -> Thread:
    if request.param == "sqlite":
        made = Thread("sqlite", str(tmp_path / "corrupt.db"))
    else:
        made = Thread("postgres", request.getfixturevalue("pg_dsn"))
    asyncio.run(made.write())
    return made


def corrupt_texts(thread: Thread, kinds: str) -> tuple[str, ...]:
    if kinds == "not an object":
        return NOT_AN_OBJECT[thread.backend]
    return WRONG_VERSIONS


async def alist_until_error(
    saver: Any, config: RunnableConfig | None, **kwargs: Any
) -> tuple[list[Any], CorruptRecordError | None]:
    got: list[Any] = []
    items: AsyncIterator[CheckpointTuple] = saver.alist(config, **kwargs)
    try:
        async for tup in items:
            got.append(shown(tup))
    except CorruptRecordError as exc:
        return got, exc
    return got, None


def list_until_error(
    saver: Any, config: RunnableConfig, **kwargs: Any
) -> tuple[list[Any], CorruptRecordError | None]:
    got: list[Any] = []
    try:
        for tup in saver.list(config, **kwargs):
            got.append(shown(tup))
    except CorruptRecordError as exc:
        return got, exc
    return got, None


@pytest.mark.parametrize("kinds", ["not an object", "wrong versions"])
def test_async_reads_name_the_corrupt_row_and_read_the_others(thread: Thread, kinds: str) -> None:
    for text in corrupt_texts(thread, kinds):
        thread.corrupt(text)
        asyncio.run(_async_reads(thread))


async def _async_reads(thread: Thread) -> None:
    ids, before = thread.ids, thread.before
    async with thread.async_saver() as saver:
        with pytest.raises(CorruptRecordError) as caught:
            await saver.aget_tuple(cfg(ids[CORRUPT]))
        thread.assert_names_the_row(caught.value)
        for cid in thread.others():
            tup = await saver.aget_tuple(cfg(cid))
            assert tup is not None and shown(tup) == before[cid]
        latest = await saver.aget_tuple(cfg())
        assert latest is not None and shown(latest) == before[ids[-1]]
        # alist: the rows before the corrupt one, then its error
        got, exc = await alist_until_error(saver, cfg())
        assert got == thread.newer() and exc is not None
        thread.assert_names_the_row(exc)
        got, exc = await alist_until_error(saver, None)  # every thread: another statement
        assert got == thread.newer() and exc is not None
        thread.assert_names_the_row(exc)
        got, exc = await alist_until_error(saver, cfg(), limit=N - 1 - CORRUPT)
        assert got == thread.newer() and exc is None  # a read that stops before it
        got, exc = await alist_until_error(saver, cfg(), before=cfg(ids[CORRUPT]))
        assert got == thread.older() and exc is None


@pytest.mark.parametrize("kinds", ["not an object", "wrong versions"])
def test_sync_reads_name_the_corrupt_row_and_read_the_others(thread: Thread, kinds: str) -> None:
    for text in corrupt_texts(thread, kinds):
        thread.corrupt(text)
        with thread.sync_saver() as saver:
            for _ in range(2):  # SQLite: the second read runs on the caller's thread
                with pytest.raises(CorruptRecordError) as caught:
                    saver.get_tuple(cfg(thread.ids[CORRUPT]))
                thread.assert_names_the_row(caught.value)
                for cid in thread.others():
                    tup = saver.get_tuple(cfg(cid))
                    assert tup is not None and shown(tup) == thread.before[cid]
                got, exc = list_until_error(saver, cfg())
                assert got == thread.newer() and exc is not None
                thread.assert_names_the_row(exc)
                got, exc = list_until_error(saver, cfg(), before=cfg(thread.ids[CORRUPT]))
                assert got == thread.older() and exc is None


def test_the_delta_history_walk_names_a_corrupt_row_it_passes(thread: Thread) -> None:
    """The walk from the head passes the corrupt row (the seed is at the root): its
    error, also when it is the target; a walk that starts below it reads as before."""
    ids = thread.ids
    for text in NOT_AN_OBJECT[thread.backend]:
        thread.corrupt(text)

        async def read() -> None:
            async with thread.async_saver() as saver:
                for target in (None, ids[-1], ids[CORRUPT]):
                    with pytest.raises(CorruptRecordError) as caught:
                        await saver.aget_delta_channel_history(
                            config=cfg(target), channels=["messages"]
                        )
                    thread.assert_names_the_row(caught.value)
                for cid in ids[:CORRUPT]:
                    got = await saver.aget_delta_channel_history(
                        config=cfg(cid), channels=["messages"]
                    )
                    assert got == thread.delta[cid]

        asyncio.run(read())
        with thread.sync_saver() as saver:
            for _ in range(2):
                with pytest.raises(CorruptRecordError) as caught:
                    saver.get_delta_channel_history(config=cfg(), channels=["messages"])
                thread.assert_names_the_row(caught.value)
                got = saver.get_delta_channel_history(config=cfg(ids[1]), channels=["messages"])
                assert got == thread.delta[ids[1]]


def test_the_delta_history_reads_an_object_column_for_its_versions_only(thread: Thread) -> None:
    """An object column naming other versions: the walk takes no seed from that row
    (its versions match no stored value) and finds the one below it, with the writes
    between - the history LangGraph rebuilds the channel from, as before the edit. The
    row itself is refused by aget_tuple (above), which LangGraph reads with it."""
    for text in WRONG_VERSIONS:
        thread.corrupt(text)

        async def read() -> None:
            async with thread.async_saver() as saver:
                for cid in thread.ids:
                    got = await saver.aget_delta_channel_history(
                        config=cfg(cid), channels=["messages"]
                    )
                    assert got == thread.delta[cid]

        asyncio.run(read())


def test_malformed_json_read_by_sql_is_corrupt_record_not_a_bad_file(tmp_path: Path) -> None:
    """SQLite: metadata corrupted into malformed JSON and read by SQL (a metadata
    filter): SQLite's "malformed JSON" is a CorruptRecordError naming the database,
    never NotADatabaseError - the file is fine, and every other read works."""
    thread = Thread("sqlite", str(tmp_path / "corrupt.db"))
    asyncio.run(thread.write())
    thread.corrupt("{bad", column="metadata")

    async def read() -> None:
        async with thread.async_saver() as saver:
            with pytest.raises(CorruptRecordError) as caught:
                [t async for t in saver.alist(cfg(), filter={"step": 1})]
            assert not isinstance(caught.value, NotADatabaseError)
            assert caught.value.location == {"database": thread.where}
            tup = await saver.aget_tuple(cfg(thread.ids[-1]))
            assert tup is not None and shown(tup) == thread.before[thread.ids[-1]]

    asyncio.run(read())


def counts(thread: Thread) -> tuple[int, int, int]:
    """Checkpoints, blobs and writes stored, read with the driver."""
    tables = ("idem_checkpoints", "idem_blobs", "idem_writes")
    if thread.backend == "sqlite":
        conn = sqlite3.connect(thread.where)
        try:
            found = [conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]
        finally:
            conn.close()
    else:
        with psycopg.connect(thread.where) as pg:
            found = [pg.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in tables]  # type: ignore[index]
    return found[0], found[1], found[2]


def test_a_prune_stops_at_a_corrupt_column_and_deletes_nothing(thread: Thread) -> None:
    """Collecting unreferenced channel values reads every remaining checkpoint's
    column: one that is not an object of versions (the head, which the prune keeps)
    cannot say what it references, so the prune raises CorruptRecordError naming it and
    deletes nothing (its values may still be repaired from its checkpoint)."""
    texts = NOT_AN_OBJECT[thread.backend][1:] + WRONG_VERSIONS[:1]
    for text in texts:
        thread.corrupt(text, index=-1)
        stored = counts(thread)

        async def prune() -> None:
            async with thread.async_saver() as saver:
                with pytest.raises(CorruptRecordError) as caught:
                    await saver.aprune([THREAD], strategy="keep_latest")
                thread.assert_names_the_row(caught.value, index=-1)

        asyncio.run(prune())
        assert counts(thread) == stored, text
