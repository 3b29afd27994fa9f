"""The command line's read-side helpers on the sync savers (``SqliteSaver``,
``PostgresSaver``): each of ``thread_summaries``, ``thread_exists``,
``checkpoint_history``, ``checkpoint_ids_with_prefix``, ``entry_keys_with_prefix``,
``checkpoint_nodes``, ``storage_counts`` and ``delete_checkpoints`` answers what an
independent async saver on the same database answers, sync and as its ``a``-twin;
``is_idem_database`` takes the sync connection; a closed saver refuses them typed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sqlite3
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from langchain_core.tools import tool
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import ConnectionClosedError, IdempotentToolNode
from langgraph_idem_saver.postgres import AsyncPostgresSaver, PostgresSaver
from langgraph_idem_saver.sqlite import AsyncSqliteSaver, SqliteSaver

BACKENDS = ["sqlite", "postgres"]


@tool
def charge(amount: int) -> str:
    """Charge a card (the ledger's side effect)."""
    return f"charged {amount}"


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, str]:
    if request.param == "sqlite":
        return "sqlite", str(tmp_path / "app.sqlite")
    return "postgres", request.getfixturevalue("pg_dsn")


@contextmanager
def sync_saver(kind: str, where: str) -> Iterator[Any]:
    if kind == "sqlite":
        with SqliteSaver.from_conn_string(where) as saver:
            yield saver
    else:
        with PostgresSaver.from_conn_string(where) as saver:
            yield saver


def async_saver(kind: str, where: str) -> AbstractAsyncContextManager[Any]:
    if kind == "sqlite":
        return AsyncSqliteSaver.from_conn_string(where)
    return AsyncPostgresSaver.from_conn_string(where)


def fill(saver: Any) -> None:
    """Two threads, each a checkpointed tool step with two ledgered calls."""
    saver.setup()
    graph = tool_graph(IdempotentToolNode([charge]), saver)
    for thread in ("t1", "t2"):
        calls = [("charge", {"amount": i}, f"{thread}-c{i}") for i in (1, 2)]
        graph.invoke({"messages": [ai_calls(*calls)]}, cfg(thread))


async def async_answers(kind: str, where: str, checkpoint: str, key: str) -> dict[str, Any]:
    async with async_saver(kind, where) as saver:
        return await twin_answers(saver, checkpoint, key)


def sync_answers(saver: Any, checkpoint: str, key: str) -> dict[str, Any]:
    return {
        "summaries": saver.thread_summaries(),
        "exists": (saver.thread_exists("t1"), saver.thread_exists("nope")),
        "history": saver.checkpoint_history("t1", "", 10),
        "ids": saver.checkpoint_ids_with_prefix("t1", "", checkpoint[:-2]),
        "keys": saver.entry_keys_with_prefix(key[:8], "t1"),
        "nodes": saver.checkpoint_nodes(["t1"]),
        "counts": dataclasses.replace(saver.storage_counts(), size_bytes=None),
    }


async def twin_answers(saver: Any, checkpoint: str, key: str) -> dict[str, Any]:
    counts = await saver.astorage_counts()
    return {
        "summaries": await saver.athread_summaries(),
        "exists": (await saver.athread_exists("t1"), await saver.athread_exists("nope")),
        "history": await saver.acheckpoint_history("t1", "", 10),
        "ids": await saver.acheckpoint_ids_with_prefix("t1", "", checkpoint[:-2]),
        "keys": await saver.aentry_keys_with_prefix(key[:8], "t1"),
        "nodes": await saver.acheckpoint_nodes(["t1"]),
        "counts": dataclasses.replace(counts, size_bytes=None),
    }


def test_sync_helpers_answer_as_an_async_saver_does(target: tuple[str, str]) -> None:
    kind, where = target
    with sync_saver(kind, where) as saver:
        fill(saver)
        latest = saver.get_tuple(cfg("t1"))
        assert latest is not None
        checkpoint = latest.checkpoint["id"]
        key = asyncio.run(saver.alist_entries("t1"))[0].key
        got = sync_answers(saver, checkpoint, key)
        twin = asyncio.run(twin_answers(saver, checkpoint, key))
    want = asyncio.run(async_answers(kind, where, checkpoint, key))
    assert got == want
    assert twin == want
    # the answers hold what was written, so an empty answer could not pass
    assert {s.thread_id for s in got["summaries"]} == {"t1", "t2"}
    assert got["exists"] == (True, False)
    assert got["history"].total >= 2
    assert got["ids"] == [checkpoint]
    assert [k for _, k in got["keys"]] == [key]
    assert got["counts"].ledger_entries == 4


def test_sync_delete_checkpoints_deletes(target: tuple[str, str]) -> None:
    kind, where = target
    with sync_saver(kind, where) as saver:
        fill(saver)
        nodes = saver.checkpoint_nodes(["t2"])
        keys = [(n.thread_id, n.checkpoint_ns, n.checkpoint_id) for n in nodes]
        deleted = saver.delete_checkpoints(keys)
        assert deleted.checkpoints == len(keys) > 0
        assert saver.get_tuple(cfg("t2")) is None
        assert saver.get_tuple(cfg("t1")) is not None
        assert len(asyncio.run(saver.alist_entries("t2"))) == 2  # ledger entries stay


def test_is_idem_database_takes_the_sync_connection(target: tuple[str, str]) -> None:
    kind, where = target
    if kind == "sqlite":
        with sqlite3.connect(where) as conn:
            assert SqliteSaver.is_idem_database(conn) is False
        with sync_saver(kind, where) as saver:
            saver.setup()
        with sqlite3.connect(where) as conn:
            assert SqliteSaver.is_idem_database(conn) is True
    else:
        with psycopg.connect(where) as conn:
            assert PostgresSaver.is_idem_database(conn) is False
        with sync_saver(kind, where) as saver:
            saver.setup()
        with psycopg.connect(where) as conn:
            assert PostgresSaver.is_idem_database(conn) is True


def test_a_closed_sync_saver_refuses_them(target: tuple[str, str]) -> None:
    kind, where = target
    with sync_saver(kind, where) as saver:
        saver.setup()
    with pytest.raises(ConnectionClosedError):
        saver.thread_summaries()
    with pytest.raises(ConnectionClosedError):
        saver.storage_counts()
