"""docs/guarantees.md, "Bad input": thread ids, namespaces and checkpoint ids "longer than
1,024 UTF-8 bytes ... are refused with ``ConfigError`` on both backends before anything is
written - the same rule everywhere, so a thread can move from SQLite to Postgres".

At the boundary, counted in UTF-8 bytes (a two-byte character): 1,024 bytes are stored and
read back on both backends, 1,025 are refused, and the database holds nothing of them.
That includes the checkpoint's own id, which ``aput`` stores and returns in the config
the checkpoint is read back with (it used to be stored, over the limit or with a NUL on
SQLite, and then could not be read by that config)."""

from __future__ import annotations

import random
import string
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_idem_saver import ConfigError

AT_LIMIT = "é" * 512  # 1,024 UTF-8 bytes, 512 characters
OVER = AT_LIMIT + "x"  # 1,025 bytes
ALNUM = string.ascii_letters + string.digits


def config(thread: str, ns: str = "") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ns}}


async def test_ids_of_1024_utf8_bytes_are_stored_and_read_back(saver: Any) -> None:
    assert len(AT_LIMIT.encode()) == 1024
    checkpoint = empty_checkpoint()
    checkpoint["id"] = checkpoint["id"][:-1] + "0"  # (a real id: its own length)
    stored = await saver.aput(config(AT_LIMIT, AT_LIMIT), checkpoint, {}, {})
    got = await saver.aget_tuple(stored)
    assert got is not None
    assert got.config["configurable"]["thread_id"] == AT_LIMIT
    assert got.config["configurable"]["checkpoint_ns"] == AT_LIMIT


@pytest.mark.parametrize("where", ["thread_id", "checkpoint_ns", "checkpoint_id"])
async def test_an_id_of_1025_utf8_bytes_is_refused_writing_nothing(saver: Any, where: str) -> None:
    assert len(OVER.encode()) == 1025
    cfg = config("t")
    checkpoint = empty_checkpoint()
    if where == "checkpoint_id":
        checkpoint["id"] = OVER
    else:
        cfg["configurable"][where] = OVER
    with pytest.raises(ConfigError, match="1025 bytes long; the limit is 1024"):
        await saver.aput(cfg, checkpoint, {}, {})
    assert [c async for c in saver.alist(None)] == []  # nothing written


async def test_a_checkpoint_id_with_nul_is_refused_writing_nothing(saver: Any) -> None:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = "ab\x00c"
    with pytest.raises(ConfigError, match="NUL"):
        await saver.aput(config("t"), checkpoint, {}, {})
    assert [c async for c in saver.alist(None)] == []


async def test_three_incompressible_ids_at_the_limit_on_each_backend(saver: Any) -> None:
    """guarantees.md: on PostgreSQL a thread id, namespace and checkpoint id together must
    also fit its key index (a row of at most 2,704 bytes, values compressed first):
    three incompressible ids of 1,024 bytes are refused there with ConfigError, nothing
    written; SQLite stores them. (The tests above use repetitive ids, which PostgreSQL
    compresses under the index limit.)"""
    rng = random.Random(7)
    thread, ns, cid = ("".join(rng.choices(ALNUM, k=1024)) for _ in range(3))
    checkpoint = empty_checkpoint()
    checkpoint["id"] = cid
    if "postgres" in type(saver).__module__:
        with pytest.raises(ConfigError, match="too large for PostgreSQL to index"):
            await saver.aput(config(thread, ns), checkpoint, {}, {})
        assert [c async for c in saver.alist(None)] == []  # nothing written
        return
    stored = await saver.aput(config(thread, ns), checkpoint, {}, {})
    got = await saver.aget_tuple(stored)
    assert got is not None and got.checkpoint["id"] == cid
