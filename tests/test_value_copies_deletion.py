"""What the read caches keep after a deletion, and their bound under threads.

* ``postgres/codec``'s decompressed values (``_INFLATED``, process-wide) are dropped with
  a saver's value copies when it deletes a thread: what was deleted is kept nowhere, and
  the same ids written again with other content read back as written (a real
  PostgreSQL, our sync ``PostgresSaver``).
* ``ValueCopies``' first sights stay within ``SEEN_ENTRIES`` whatever the threads: a
  thread reading while another trims waits for the trim, rather than adding one more.
"""

from __future__ import annotations

import threading
from hashlib import sha256
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from test_value_copies import SERDE

from langgraph_idem_saver.postgres import PostgresSaver, codec
from langgraph_idem_saver.value_copies import SEEN_ENTRIES, ValueCopies


def messages(word: str) -> list[HumanMessage]:
    """A list that serializes well past ``COMPRESS_MIN_BYTES`` and compresses: stored
    zlib-compressed, so every read of it decompresses (``codec.inflate``)."""
    return [HumanMessage(content=f"{word} {i} " + word * 40, id=f"m{i}") for i in range(20)]


def put(saver: Any, thread: str, items: list[HumanMessage]) -> Any:
    """One checkpoint, of a fixed id, holding ``items``."""
    checkpoint = empty_checkpoint()
    checkpoint["id"] = "1f000000-0000-6000-8000-000000000001"
    version = saver.get_next_version(None, None)
    checkpoint["channel_values"] = {"messages": items}
    checkpoint["channel_versions"] = {"messages": version}
    config = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    return saver.put(config, checkpoint, {"step": 0}, {"messages": version})


def inflated_holding(word: str) -> int:
    """How many decompressed values in the process-wide cache hold ``word``."""
    with codec._INFLATED_LOCK:
        return sum(word.encode() in value for value in codec._INFLATED.values())


def test_deleting_a_thread_drops_its_decompressed_values(pg_dsn: str) -> None:
    """Read a compressed list twice (decompressed once, then from the cache), delete the
    thread: no decompressed copy of it is left in the process (it was, until evicted by
    16 other values). The same thread and checkpoint id written again with another list
    read back as that list."""
    with PostgresSaver.from_conn_string(pg_dsn) as saver:
        config = put(saver, "deleted", messages("before"))
        for _ in range(2):
            got = saver.get_tuple(config)
            assert got is not None
            assert got.checkpoint["channel_values"]["messages"] == messages("before")
        assert inflated_holding("before") >= 1  # the control: the cache held it
        saver.delete_thread("deleted")
        assert inflated_holding("before") == 0, "a deleted value is still kept in memory"
        assert saver.get_tuple(config) is None
        config = put(saver, "deleted", messages("after"))
        got = saver.get_tuple(config)
        assert got is not None
        assert got.checkpoint["channel_values"]["messages"] == messages("after")
        assert inflated_holding("after") >= 1


def test_first_sights_stay_within_their_bound_while_another_thread_trims(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``SEEN_ENTRIES`` first sights; a thread's next one trims, and is held in the trim;
    another thread reads a new value meanwhile. The first sights never exceed
    ``SEEN_ENTRIES`` (each thread added its own before trimming: one more a thread), and
    both reads return their values."""
    copies = ValueCopies()
    reader = copies.reader(SERDE)
    values = [
        [HumanMessage(content=sha256(str(n).encode()).hexdigest() * 20, id=f"v{n}")]
        for n in range(SEEN_ENTRIES + 2)
    ]
    stored = [SERDE.dumps_typed(v) for v in values]  # 1.3 KB each, each a bucket of its own
    for data in stored[:SEEN_ENTRIES]:
        reader.loads_typed(data)
    assert copies.seen_size == SEEN_ENTRIES
    trimming, let_go = threading.Event(), threading.Event()
    real_trim = ValueCopies._trim_seen
    most: list[int] = []

    def held_trim(self: ValueCopies) -> None:
        most.append(len(self._seen))
        trimming.set()
        let_go.wait(30)
        real_trim(self)

    monkeypatch.setattr(ValueCopies, "_trim_seen", held_trim)
    results: dict[int, Any] = {}

    def read(n: int) -> None:
        results[n] = reader.loads_typed(stored[n])

    first = threading.Thread(target=read, args=(SEEN_ENTRIES,), daemon=True)
    first.start()
    assert trimming.wait(30), "the first sight over the bound never trimmed"
    second = threading.Thread(target=read, args=(SEEN_ENTRIES + 1,), daemon=True)
    second.start()
    second.join(0.5)
    most.append(len(copies._seen))
    let_go.set()
    first.join(30)
    second.join(30)
    assert not first.is_alive() and not second.is_alive()
    most.append(copies.seen_size)
    assert max(most) <= SEEN_ENTRIES, most
    assert results == {SEEN_ENTRIES: values[SEEN_ENTRIES], SEEN_ENTRIES + 1: values[-1]}
