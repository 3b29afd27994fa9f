"""The sync ``SqliteSaver``'s direct ``put`` / ``put_writes`` (on the caller's thread):
the rows they store, a delta whose base another connection deleted, the typed errors of
bad ids, and the closed saver. Real SQLite files; what is stored is read back with a
second ``sqlite3`` connection, not through the saver.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.sqlite import SqliteSaver

THREAD: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "sync_write.db"


@pytest.fixture
def saver(db: Path) -> Iterator[SqliteSaver]:
    with SqliteSaver.from_conn_string(str(db)) as s:
        yield s


class Chain:
    """Checkpoints of one thread put one after another, a growing list and a counter."""

    def __init__(self, saver: SqliteSaver) -> None:
        self.saver = saver
        self.config: RunnableConfig = THREAD
        self.n = 0
        self.items: list[Any] = []

    def put(self, *added: Any) -> RunnableConfig:
        self.n += 1
        # a new list holding the very same objects plus the added: what a reducer builds
        self.items = [*self.items, *added]
        version = f"{self.n:08d}"
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"log": self.items, "count": self.n}
        checkpoint["channel_versions"] = {"log": version, "count": version}
        new: dict[str, str | int | float] = {"log": version, "count": version}
        self.config = self.saver.put(self.config, checkpoint, {"step": self.n}, new)
        return self.config


def blob_rows(db: Path) -> list[tuple[str, str, str | None]]:
    """(channel, version, base_version) of every stored value, read by another connection."""
    with sqlite3.connect(db) as other:
        rows = other.execute(
            "SELECT channel, version, base_version FROM idem_blobs ORDER BY channel, version"
        ).fetchall()
    return [(str(c), str(v), b) for c, v, b in rows]


def test_a_put_stores_every_new_version_a_growing_list_as_a_delta(
    saver: SqliteSaver, db: Path
) -> None:
    chain = Chain(saver)
    chain.put({"a": 1})
    config = chain.put({"b": 2})
    assert blob_rows(db) == [
        ("count", "00000001", None),
        ("count", "00000002", None),
        ("log", "00000001", None),
        ("log", "00000002", "00000001"),  # the item appended, on the version before
    ]
    got = saver.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"log": [{"a": 1}, {"b": 2}], "count": 2}


def test_a_delta_whose_base_another_connection_deleted_is_stored_whole(
    saver: SqliteSaver, db: Path
) -> None:
    chain = Chain(saver)
    chain.put("a")
    chain.put("b")
    # another connection (another process's prune, say) removes version 2 of the list
    with sqlite3.connect(db) as other:
        other.execute("DELETE FROM idem_blobs WHERE channel = 'log' AND version = '00000002'")
    chain.put("c")
    rows = blob_rows(db)
    assert ("log", "00000003", None) in rows, "its base is gone: the value is stored whole"
    assert ("count", "00000003", None) in rows, "the put's other values are stored with it"
    # and the next version is a delta of that whole one again
    config = chain.put("d")
    assert ("log", "00000004", "00000003") in blob_rows(db)
    got = saver.get_tuple(config)
    assert got is not None
    assert got.checkpoint["channel_values"] == {"log": ["a", "b", "c", "d"], "count": 4}


def write_rows(db: Path) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as other:
        return other.execute(
            "SELECT task_id, task_path, idx, channel, type FROM idem_writes ORDER BY task_id, idx"
        ).fetchall()


def test_put_writes_stores_each_write_at_its_index_special_ones_replaced(
    saver: SqliteSaver, db: Path
) -> None:
    config = Chain(saver).put("a")
    saver.put_writes(config, [("log", ["x"]), ("count", 2), ("log", ["y"])], "task", "p")
    saver.put_writes(config, [("__error__", "first")], "task2")
    saver.put_writes(config, [("__error__", "second")], "task2")
    saver.put_writes(config, [("log", ["replaced?"])], "task")  # a regular write: kept
    assert [row[:4] for row in write_rows(db)] == [
        ("task", "p", 0, "log"),
        ("task", "p", 1, "count"),
        ("task", "p", 2, "log"),
        ("task2", "", -1, "__error__"),
    ]
    got = saver.get_tuple(config)
    assert got is not None
    assert got.pending_writes == [  # ordered by task path, task id, index
        ("task2", "__error__", "second"),
        ("task", "log", ["x"]),
        ("task", "count", 2),
        ("task", "log", ["y"]),
    ]


def test_put_writes_of_nothing_writes_nothing(saver: SqliteSaver, db: Path) -> None:
    config = Chain(saver).put("a")
    saver.put_writes(config, [], "task")
    assert write_rows(db) == []


def test_put_writes_takes_non_ascii_ids_and_refuses_lone_surrogates(
    saver: SqliteSaver, db: Path
) -> None:
    config = Chain(saver).put("a")
    saver.put_writes(config, [("épi", 1)], "tâche", "chemin/é")
    assert write_rows(db) == [("tâche", "chemin/é", 0, "épi", "msgpack")]
    for writes, task_id, task_path, what in (
        ([("bad\ud800", 1)], "task", "", "channel"),
        ([("log", 1)], "bad\udc00", "", "task_id"),
        ([("log", 1)], "task", "bad\ud800", "task_path"),
    ):
        with pytest.raises(ConfigError, match=what):
            saver.put_writes(config, writes, task_id, task_path)
    assert len(write_rows(db)) == 1, "nothing of a refused call was written"


def test_put_refuses_a_lone_surrogate_in_a_channel_before_writing(
    saver: SqliteSaver, db: Path
) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"bad\ud800": 1}
    checkpoint["channel_versions"] = {"bad\ud800": "1"}
    with pytest.raises(ConfigError, match="channel"):
        saver.put(THREAD, checkpoint, {}, {"bad\ud800": "1"})
    assert blob_rows(db) == []


def test_a_closed_saver_refuses_direct_writes_typed(db: Path) -> None:
    with SqliteSaver.from_conn_string(str(db)) as saver:
        config = Chain(saver).put("a")
    with pytest.raises(ConnectionClosedError):
        saver.put_writes(config, [("log", 1)], "task")
    checkpoint = empty_checkpoint()
    with pytest.raises(ConnectionClosedError):
        saver.put(THREAD, checkpoint, {}, {})
