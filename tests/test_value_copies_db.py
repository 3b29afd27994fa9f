"""Copies of decoded values in the savers' reads, on real SQLite files and a real
PostgreSQL: repeated reads of the same stored bytes are copies (``pickle.loads`` of a
pickle made in-process), equal in value and type to a fresh decode, sharing no object with
any other read; the serializer still decides (an encrypting one swapped in, a corrupt
row); a cold read pickles nothing; the list-delta memory works on the copies."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from fault_child import Db
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from test_value_copies import SERDE, count_pickling, objects, shape

from langgraph_idem_saver import CorruptRecordError
from langgraph_idem_saver.sqlite.sync_saver import SqliteSaver

ITEMS = [HumanMessage(content=f"message {i} " + "x" * 120, id=f"m{i}") for i in range(20)]


def cfg(thread: str, checkpoint_id: str | None = None) -> Any:
    configurable = {"thread_id": thread, "checkpoint_ns": ""}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def put_same_list(saver: Any, thread: str, times: int, items: list[Any] = ITEMS) -> Any:
    """``times`` checkpoints of one list re-versioned without growing (each a delta of
    the first's row), a write each; the last config."""
    config, version = cfg(thread), None
    for step in range(times):
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["channel_values"] = {"messages": items}
        checkpoint["channel_versions"] = {"messages": version}
        config = await saver.aput(config, checkpoint, {"step": step}, {"messages": version})
        await saver.aput_writes(config, [("messages", [items[step % len(items)]])], f"t{step}")
    return config


def fresh(value: Any) -> Any:
    """What the serializer decodes ``value``'s bytes to (a fresh decode)."""
    return SERDE.loads_typed(SERDE.dumps_typed(value))


async def test_repeated_reads_are_copies_of_their_own(db: Db) -> None:
    async with db.open() as saver:
        await put_same_list(saver, "t", 3)
        copies = saver._deltas.copies
        reads = [await saver.aget_tuple(cfg("t")) for _ in range(5)]
        assert copies.counts["hits"] >= 3  # the list's base, from the third read on
        lists = [r.checkpoint["channel_values"]["messages"] for r in reads]
        expected = fresh(ITEMS)
        for got in lists:
            assert got == ITEMS and shape(got) == shape(expected)
        writes = [r.pending_writes for r in reads]
        assert all(w == writes[0] for w in writes)
        seen = [objects(r.checkpoint) | objects(r.pending_writes) for r in reads]
        for i, mine in enumerate(seen):
            for other in seen[i + 1 :]:
                assert not mine & other, "two reads share an object"
        lists[2][0].content = "changed"
        lists[2].append(AIMessage("more"))
        assert all(got == ITEMS for n, got in enumerate(lists) if n != 2)
        again = await saver.aget_tuple(cfg("t"))
        assert again is not None and again.checkpoint["channel_values"]["messages"] == ITEMS


async def test_a_page_of_alist_is_copies_sharing_nothing(db: Db) -> None:
    async with db.open() as saver:
        await put_same_list(saver, "t", 8)
        copies = saver._deltas.copies
        pages = []
        for _ in range(2):
            pages.append([t async for t in saver.alist(cfg("t"), limit=6)])
        assert copies.counts["copied"] >= 1 and copies.counts["hits"] >= 10
        tuples = [t for page in pages for t in page]
        expected = shape(fresh(ITEMS))
        assert all(shape(t.checkpoint["channel_values"]["messages"]) == expected for t in tuples)
        seen = [objects(t.checkpoint) for t in tuples]
        for i, mine in enumerate(seen):
            for other in seen[i + 1 :]:
                assert not mine & other


async def test_an_encrypting_serializer_is_keyed_by_its_ciphertext_and_itself(db: Db) -> None:
    sealed = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    async with db.open() as saver:
        saver.serde = sealed
        await put_same_list(saver, "t", 3)
        copies = saver._deltas.copies
        for _ in range(4):
            got = await saver.aget_tuple(cfg("t"))
            assert got is not None and got.checkpoint["channel_values"]["messages"] == ITEMS
        assert copies.counts["hits"] >= 1
        saver.serde = EncryptedSerializer.from_pycryptodome_aes(key=b"fedcba9876543210")
        with pytest.raises(CorruptRecordError):  # the other key decodes, and fails
            await saver.aget_tuple(cfg("t"))
        saver.serde = sealed
        got = await saver.aget_tuple(cfg("t"))
        assert got is not None and got.checkpoint["channel_values"]["messages"] == ITEMS
    types = {str(t) for (t,) in await db.query("SELECT type FROM idem_blobs")}
    assert all("aes" in t for t in types if "msgpack" in t), types


async def test_corrupt_bytes_are_still_a_typed_error_naming_the_row(db: Db) -> None:
    async with db.open() as saver:
        await put_same_list(saver, "t", 3)
        for _ in range(4):
            await saver.aget_tuple(cfg("t"))
        assert saver._deltas.copies.counts["hits"] >= 1
        changed = await db.execute(
            "UPDATE idem_blobs SET blob = ? WHERE channel = 'messages' AND base_version IS NULL",
            (b"\xc1 not what was stored",),
        )
        assert changed == 1
        with pytest.raises(CorruptRecordError) as caught:
            await saver.aget_tuple(cfg("t"))
        assert caught.value.location["thread_id"] == "t"
        assert caught.value.location["channel"] == "messages"


async def test_a_list_read_from_a_copy_is_remembered_for_the_next_delta(db: Db) -> None:
    """``ListDeltaEncoder.loaded`` on the copies: the next version of the list a resumed
    graph holds (the read objects, one message appended) is stored as a delta."""
    async with db.open() as saver:
        config = await put_same_list(saver, "t", 3)
        copies = saver._deltas.copies
        for _ in range(3):
            await saver.aget_tuple(cfg("t"))
        hits = copies.counts["hits"]
        read = await saver.aget_tuple(cfg("t"))
        assert read is not None and copies.counts["hits"] > hits  # this read: a copy
        version = read.checkpoint["channel_versions"]["messages"]
        checkpoint = empty_checkpoint()
        grown = [*read.checkpoint["channel_values"]["messages"], AIMessage("next", id="n")]
        new_version = saver.get_next_version(version, None)
        checkpoint["channel_values"] = {"messages": grown}
        checkpoint["channel_versions"] = {"messages": new_version}
        await saver.aput(config, checkpoint, {}, {"messages": new_version})
        again = await saver.aget_tuple(cfg("t"))
        assert again is not None and again.checkpoint["channel_values"]["messages"] == grown
    [(base,)] = await db.query(
        "SELECT base_version FROM idem_blobs WHERE version = ?", (str(new_version),)
    )
    assert base is not None, "stored whole: the copies were not remembered"


async def test_a_cold_read_pickles_nothing(db: Db, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every checkpoint read once (a different list in each: stored whole): no copy made."""
    async with db.open() as saver:
        config, version, ids = cfg("cold"), None, []
        for step in range(12):
            version = saver.get_next_version(version, None)
            checkpoint = empty_checkpoint()
            window = [HumanMessage(f"step {step} message {i} " + "y" * 100) for i in range(8)]
            checkpoint["channel_values"] = {"messages": window}
            checkpoint["channel_versions"] = {"messages": version}
            config = await saver.aput(config, checkpoint, {}, {"messages": version})
            ids.append(config["configurable"]["checkpoint_id"])
        pickled = count_pickling(monkeypatch)
        for checkpoint_id in ids:
            assert await saver.aget_tuple(cfg("cold", checkpoint_id)) is not None
        saver._deltas.copies.clear()
        assert len([t async for t in saver.alist(cfg("cold"))]) == 12
        assert pickled == [0]
        assert saver._deltas.copies.counts["copied"] == 0


async def test_deleting_a_thread_drops_the_copies(db: Db) -> None:
    async with db.open() as saver:
        await put_same_list(saver, "t", 3)
        for _ in range(3):
            await saver.aget_tuple(cfg("t"))
        assert saver._deltas.copies.size[0] >= 1
        await saver.adelete_thread("t")
        assert saver._deltas.copies.size == (0, 0)
        assert saver._deltas.copies.seen_size == 0


def test_a_sync_saver_read_from_many_threads(tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "threads.db")) as saver:
        config, version = cfg("t"), None
        for step in range(6):
            version = saver.get_next_version(version, None)
            checkpoint = empty_checkpoint()
            checkpoint["channel_values"] = {"messages": ITEMS}
            checkpoint["channel_versions"] = {"messages": version}
            config = saver.put(config, checkpoint, {"step": step}, {"messages": version})
        failures: list[BaseException] = []
        start = threading.Barrier(6)

        def work(n: int) -> None:
            try:
                start.wait()
                for _ in range(25):
                    if n % 2:
                        got = saver.get_tuple(cfg("t"))
                        assert got is not None
                        assert got.checkpoint["channel_values"]["messages"] == ITEMS
                    else:
                        page = list(saver.list(cfg("t"), limit=4))
                        assert [t.checkpoint["channel_values"]["messages"] for t in page] == [
                            ITEMS
                        ] * 4
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert failures == []
        assert saver.saver._deltas.copies.counts["hits"] > 0
