"""Bad input and bad files: each refused with its own exception, and nothing damaged.

Uses real SQLite files, altered behind the saver's back with the ``sqlite3`` module
where a test needs a broken or foreign database.
"""

from __future__ import annotations

import asyncio
import random
import sqlite3
from pathlib import Path
from typing import Any

import aiosqlite
import pytest
from conftest import sqlite_saver_class
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from tool_node_helpers import cfg

from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    IdemSaverError,
    NotADatabaseError,
    SchemaVersionError,
    SerializationError,
    StorageFullError,
)
from langgraph_idem_saver.ledger import CallIntent

AsyncSqliteSaver = sqlite_saver_class()


def config(thread_id: str = "t", ns: str = "", checkpoint_id: str | None = None) -> Any:
    """``cfg`` that always names a namespace ("" the root)."""
    return cfg(thread_id, ns, checkpoint_id)


async def put_one(
    saver: Any, thread_id: str = "t", metadata: dict[str, Any] | None = None
) -> tuple[Any, dict[str, Any]]:
    cp = generate_checkpoint(
        channel_values={"a": "value-a", "b": [1, 2]}, channel_versions={"a": 1, "b": 1}
    )
    md = {"source": "input", "step": 1, **(metadata or {})}
    stored = await saver.aput(config(thread_id), cp, md, {"a": 1, "b": 1})
    await saver.aput_writes(stored, [("a", "pending-a")], "task-1")
    return stored, cp


async def all_rows(saver: Any) -> list[Any]:
    return [
        (t.config, t.checkpoint["channel_values"], t.metadata, t.pending_writes)
        async for t in saver.alist(None)
    ]


def dump(path: Path) -> list[str]:
    """Every row of every table, for "nothing was changed" checks."""
    with sqlite3.connect(path) as db:
        return list(db.iterdump())


# --------------------------------------------------------------------------- config


MISSING_THREAD = [
    {},
    {"configurable": {}},
    {"configurable": {"checkpoint_ns": ""}},
    {"configurable": {"thread_id": None, "checkpoint_ns": ""}},
    {"configurable": {"thread_id": "", "checkpoint_ns": ""}},
]


@pytest.mark.parametrize("bad", MISSING_THREAD, ids=range(len(MISSING_THREAD)))
async def test_missing_thread_id_is_config_error(saver: Any, bad: Any) -> None:
    cp = generate_checkpoint()
    with pytest.raises(ConfigError, match="thread_id") as info:
        await saver.aget_tuple(bad)
    assert isinstance(info.value, ValueError)
    with pytest.raises(ConfigError, match="thread_id"):
        await saver.aput(bad, cp, {"source": "input", "step": -1}, {})
    with pytest.raises(ConfigError, match="thread_id"):
        await saver.aput_writes(bad, [("a", 1)], "task-1")
    with pytest.raises(ConfigError, match="thread_id"):
        [t async for t in saver.alist(bad)]
    assert await all_rows(saver) == []  # nothing was written


async def test_put_writes_without_checkpoint_id_is_config_error(saver: Any) -> None:
    stored, _ = await put_one(saver)
    with pytest.raises(ConfigError, match="checkpoint_id"):
        await saver.aput_writes(config("t"), [("a", "orphan")], "task-2")
    tup = await saver.aget_tuple(stored)
    assert tup is not None and tup.pending_writes == [("task-1", "a", "pending-a")]


async def test_unserializable_metadata_is_serialization_error(saver: Any) -> None:
    cp = generate_checkpoint()
    with pytest.raises(SerializationError) as info:
        await saver.aput(config("t"), cp, {"source": "input", "step": 1, "obj": object()}, {})
    assert isinstance(info.value, TypeError)
    assert await saver.aget_tuple(config("t")) is None  # nothing was written


# --------------------------------------------------------------------------- connection


async def test_closed_connection(tmp_path: Path) -> None:
    conn = await aiosqlite.connect(tmp_path / "closed.sqlite")
    saver = AsyncSqliteSaver(conn)
    stored, cp = await put_one(saver)
    await conn.close()
    with pytest.raises(ConnectionClosedError):
        await saver.aget_tuple(stored)
    with pytest.raises(ConnectionClosedError):
        await saver.aput(config("t2"), generate_checkpoint(), {"source": "input", "step": 0}, {})
    with pytest.raises(ConnectionClosedError):
        await saver.aput_writes(stored, [("a", 1)], "task-9")
    with pytest.raises(ConnectionClosedError):
        [t async for t in saver.alist(None)]
    with pytest.raises(ConnectionClosedError):
        await saver.adelete_thread("t")
    # what was committed before the close is intact
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "closed.sqlite")) as again:
        tup = await again.aget_tuple(stored)
        assert tup is not None and tup.checkpoint["id"] == cp["id"]


async def test_connection_closed_before_first_use(tmp_path: Path) -> None:
    conn = await aiosqlite.connect(tmp_path / "never-used.sqlite")
    await conn.close()
    saver = AsyncSqliteSaver(conn)
    with pytest.raises(ConnectionClosedError):
        await saver.aget_tuple(config("t"))


async def test_unawaited_connection_is_opened_on_first_use(tmp_path: Path) -> None:
    """The constructor takes an aiosqlite connection "opened or not yet awaited"."""
    conn = aiosqlite.connect(tmp_path / "lazy.sqlite")
    try:
        saver = AsyncSqliteSaver(conn)
        stored, cp = await put_one(saver)
        tup = await saver.aget_tuple(stored)
        assert tup is not None and tup.checkpoint["channel_values"] == cp["channel_values"]
    finally:
        await conn.close()


# --------------------------------------------------------------------------- foreign files


async def test_file_that_is_not_sqlite(tmp_path: Path) -> None:
    path = tmp_path / "random.bin"
    junk = random.Random(1234).randbytes(8192)
    path.write_bytes(junk)
    with pytest.raises(NotADatabaseError) as info:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            await saver.setup()
            await saver.aget_tuple(config("t"))
    assert isinstance(info.value, IdemSaverError)
    assert path.read_bytes() == junk  # the file we were pointed at was not touched


async def test_database_with_newer_schema(tmp_path: Path) -> None:
    path = tmp_path / "future.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        stored, _ = await put_one(saver)
    with sqlite3.connect(path) as db:
        (current,) = db.execute("SELECT MAX(v) FROM idem_saver_migrations").fetchone()
        db.execute("INSERT INTO idem_saver_migrations (v) VALUES (9999)")
    before = dump(path)

    with pytest.raises(SchemaVersionError, match="9999") as info:
        async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
            await saver.aget_tuple(stored)
    assert info.value.found == 9999
    assert info.value.supported == current
    assert dump(path) == before  # refused without changing anything

    # an explicitly constructed saver refuses on first use too
    async with aiosqlite.connect(path) as conn:
        with pytest.raises(SchemaVersionError):
            await AsyncSqliteSaver(conn).aget_tuple(stored)
    assert dump(path) == before


# --------------------------------------------------------------------------- corrupt rows


async def corrupt(tmp_path: Path, statement: str, *params: Any) -> tuple[Path, Any, Any]:
    """A database with threads "t" and "healthy"; then ``statement`` breaks part of "t"."""
    path = tmp_path / "corrupt.sqlite"
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        stored, _ = await put_one(saver, "t")
        healthy, _ = await put_one(saver, "healthy")
    with sqlite3.connect(path) as db:
        assert db.execute(statement, params).rowcount >= 1
    return path, stored, healthy


GARBAGE = b"\xc1\xff\x00garbage\xde\xad\xbe\xef" * 4


CORRUPT_CHECKPOINT = {
    "garbage": ("UPDATE idem_checkpoints SET checkpoint = ? WHERE thread_id = 't'", GARBAGE),
    "torn": (
        "UPDATE idem_checkpoints SET checkpoint = substr(checkpoint, 1, length(checkpoint) / 2)"
        " WHERE thread_id = ?",
        "t",
    ),
    "wrong-shape": ("UPDATE idem_checkpoints SET checkpoint = ? WHERE thread_id = 't'", b"\x01"),
    "unknown-type": ("UPDATE idem_checkpoints SET type = ? WHERE thread_id = 't'", "no-such-codec"),
}


@pytest.mark.parametrize("how", list(CORRUPT_CHECKPOINT))
async def test_corrupt_checkpoint(tmp_path: Path, how: str) -> None:
    statement, param = CORRUPT_CHECKPOINT[how]
    path, stored, healthy = await corrupt(tmp_path, statement, param)
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        for read in (
            lambda: saver.aget_tuple(config("t")),
            lambda: saver.aget_tuple(stored),
        ):
            with pytest.raises(CorruptRecordError) as info:
                await read()
            message = str(info.value)
            assert "'t'" in message and checkpoint_id in message, message
            assert info.value.location["thread_id"] == "t"
            assert info.value.location["checkpoint_id"] == checkpoint_id
        with pytest.raises(CorruptRecordError, match=checkpoint_id):
            [t async for t in saver.alist(config("t"))]
        # the damage is contained: other threads still read
        tup = await saver.aget_tuple(healthy)
        assert tup is not None and tup.checkpoint["channel_values"] == {
            "a": "value-a",
            "b": [1, 2],
        }
        # and the corrupt thread can still be deleted
        await saver.adelete_thread("t")
        assert await saver.aget_tuple(config("t")) is None


async def test_corrupt_channel_blob(tmp_path: Path) -> None:
    path, stored, healthy = await corrupt(
        tmp_path,
        "UPDATE idem_blobs SET blob = ? WHERE thread_id = 't' AND channel = 'b'",
        GARBAGE,
    )
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        with pytest.raises(CorruptRecordError) as info:
            await saver.aget_tuple(stored)
        assert info.value.location["thread_id"] == "t"
        assert info.value.location["checkpoint_id"] == checkpoint_id
        assert info.value.location["channel"] == "b"
        assert "'b'" in str(info.value) and checkpoint_id in str(info.value)
        assert (await saver.aget_tuple(healthy)) is not None


async def test_corrupt_pending_write(tmp_path: Path) -> None:
    path, stored, healthy = await corrupt(
        tmp_path, "UPDATE idem_writes SET value = ? WHERE thread_id = 't'", GARBAGE
    )
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        with pytest.raises(CorruptRecordError, match=checkpoint_id) as info:
            await saver.aget_tuple(stored)
        assert info.value.location["task_id"] == "task-1"
        assert (await saver.aget_tuple(healthy)) is not None


async def test_corrupt_metadata(tmp_path: Path) -> None:
    path, stored, healthy = await corrupt(
        tmp_path, "UPDATE idem_checkpoints SET metadata = ? WHERE thread_id = 't'", "{not json"
    )
    checkpoint_id = stored["configurable"]["checkpoint_id"]
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        with pytest.raises(CorruptRecordError, match=checkpoint_id):
            await saver.aget_tuple(stored)
        assert (await saver.aget_tuple(healthy)) is not None


# --------------------------------------------------------------------------- metadata filters

HOSTILE_KEYS = [
    "a') OR 1=1 --",
    "source') OR 1=1 --",
    "' OR '1'='1",
    '" OR "1"="1',
    "$.x",
    "$.source",
    "$",
    "\x00",
    "source\x00",
    "'",
    '"',
    "a'b\"c",
    "%",
    "_",
    "*",
    "source; DROP TABLE idem_checkpoints; --",
]


async def test_hostile_filter_keys_match_nothing(saver: Any, tmp_path: Path) -> None:
    await put_one(saver, "t1", {"a": 1, "x": 2})
    await put_one(saver, "t2", {"a": 1, "x": 2, "nested": {"x": 2}})
    before = await all_rows(saver)
    assert len(before) == 2
    for key in HOSTILE_KEYS:
        for value in (1, 2, "input", "x", True, {"x": 2}):
            got = [t async for t in saver.alist(None, filter={key: value})]
            assert got == [], f"filter {{{key!r}: {value!r}}} matched {len(got)} rows"
        # combined with a real key it must still match nothing
        got = [t async for t in saver.alist(None, filter={"source": "input", key: 1})]
        assert got == [], f"filter with {key!r} matched"
    hostile_values = ["input' OR '1'='1", "' OR 1=1 --", '"input"', "$.source", "input\x00"]
    for value in hostile_values:
        assert [t async for t in saver.alist(None, filter={"source": value})] == [], value
    assert await all_rows(saver) == before  # tables intact
    # a real filter still works afterwards
    assert len([t async for t in saver.alist(None, filter={"source": "input"})]) == 2


UNUSUAL_KEYS = {
    "a.b": 1,
    "with space": "v",
    "ünï😀": "ok",
    "quote'key": "q",
    'dq"key': "d",
    "$.x": "dollar",
    "[0]": "bracket",
    "a.b.c": {"deep": True},
    "": "empty-key",
    "tags": ["x", "y"],
}


async def test_unusual_metadata_keys_roundtrip_and_filter(saver: Any, backend: str) -> None:
    stored, _ = await put_one(saver, "odd", UNUSUAL_KEYS)
    await put_one(saver, "plain", {"a": 1})
    tup = await saver.aget_tuple(stored)
    assert tup is not None
    for key, value in UNUSUAL_KEYS.items():
        assert tup.metadata[key] == value, key
        got = [
            t.config["configurable"]["thread_id"]
            async for t in saver.alist(None, filter={key: value})
        ]
        assert got == ["odd"], f"filter on {key!r}"
        miss = [t async for t in saver.alist(None, filter={key: "something else"})]
        assert miss == [], f"non-matching value for {key!r}"
    # several unusual keys at once
    both = {"a.b": 1, "ünï😀": "ok", "$.x": "dollar"}
    assert [
        t.config["configurable"]["thread_id"] async for t in saver.alist(None, filter=both)
    ] == ["odd"]
    # "a.b" names the key as written where the metadata holds it; on SQLite it also names
    # the nested path where it does not (as LangGraph's SqliteSaver reads a dotted key),
    # on Postgres it is a key only (as LangGraph's PostgresSaver's containment test)
    await put_one(saver, "path", {"a": {"b": 1}})
    got = [
        t.config["configurable"]["thread_id"] async for t in saver.alist(None, filter={"a.b": 1})
    ]
    assert sorted(got) == (["odd", "path"] if backend == "sqlite" else ["odd"])


# --------------------------------------------------------------------------- a full disk


async def cap_growth(saver: Any) -> None:
    """Let the database grow by no more than a few pages (``max_page_count``): a write
    that needs more fails as it would on a full disk (SQLITE_FULL)."""
    await saver.setup()

    def cap(conn: sqlite3.Connection) -> None:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        conn.execute(f"PRAGMA max_page_count = {pages + 2}")

    await saver._run(cap)


def big_checkpoint(tag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A checkpoint whose value needs some 200 pages, and its new versions."""
    value = random.Random(tag).randbytes(400_000).hex()
    cp = generate_checkpoint(channel_values={"a": value}, channel_versions={"a": 2})
    return cp, {"a": 2}


async def test_a_full_database_is_storage_full_error_and_keeps_what_it_had(
    tmp_path: Path,
) -> None:
    """A write the database has no room for is a StorageFullError (an OSError), never a
    raw ``sqlite3.OperationalError``; it writes nothing, everything stored before is
    still read back, and the same write succeeds once there is room."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "full.db")) as saver:
        stored, _ = await put_one(saver)
        before = await all_rows(saver)
        await cap_growth(saver)
        cp, versions = big_checkpoint("one")
        with pytest.raises(StorageFullError, match="cannot grow") as raised:
            await saver.aput(stored, cp, {"source": "loop", "step": 2}, versions)
        assert isinstance(raised.value, OSError)
        assert await all_rows(saver) == before, "nothing written, nothing lost"
        await saver._run(lambda conn: conn.execute("PRAGMA max_page_count = 1073741823"))
        again = await saver.aput(stored, cp, {"source": "loop", "step": 2}, versions)
        assert (await saver.aget_tuple(again)).checkpoint["channel_values"] == cp["channel_values"]


async def test_a_full_database_fails_a_shared_commit_with_storage_full_error(
    tmp_path: Path,
) -> None:
    """Writes group-committed together with the one that fills the database: each ends
    stored or with StorageFullError (SQLite may undo the whole transaction for a full
    disk), never with another error, and the saver goes on working."""
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "shared.db")) as saver:
        stored, _ = await put_one(saver)
        await cap_growth(saver)
        cp, versions = big_checkpoint("two")
        small = generate_checkpoint(channel_values={"a": "s"}, channel_versions={"a": 3})
        big, other = await asyncio.gather(
            saver.aput(stored, cp, {"source": "loop", "step": 2}, versions),
            saver.aput(config("u"), small, {"source": "input", "step": 1}, {"a": 3}),
            return_exceptions=True,
        )
        assert isinstance(big, StorageFullError), big
        assert isinstance(other, StorageFullError) or other["configurable"]["thread_id"] == "u"
        await saver._run(lambda conn: conn.execute("PRAGMA max_page_count = 1073741823"))
        assert await saver.aput(stored, cp, {"source": "loop", "step": 2}, versions)


async def test_a_claim_the_database_has_no_room_for_claims_nothing(tmp_path: Path) -> None:
    """The ledger's claim is a write like any other: StorageFullError, and no entry, so
    no tool runs on a claim that was never stored."""
    from langgraph_idem_saver.errors import StorageFullError

    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "claim.db")) as saver:
        await cap_growth(saver)
        args = random.Random(3).randbytes(400_000).hex().encode()
        intent = CallIntent("t", "k", "t", "tools", "send", "h", args, "call-1")
        with pytest.raises(StorageFullError):
            await saver.aclaim([intent], owner="me", lease_seconds=60)
        assert await saver.aget_entry("t", "k") is None
