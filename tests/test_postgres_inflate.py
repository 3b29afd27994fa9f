"""A page of ``alist`` decompresses a base its rows share once (``postgres/codec.inflate``):
the cache holds bytes only, so every tuple still gets values of its own, and it stays
small (a bounded number of entries, none above its size limit)."""

from __future__ import annotations

import zlib
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from test_fresh_db_reads import graph_of
from tool_node_helpers import cfg

from langgraph_idem_saver.postgres import AsyncPostgresSaver, codec


@pytest.fixture(autouse=True)
def empty_cache() -> None:
    codec._INFLATED.clear()


def counted_decompress(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    sizes: list[int] = []
    original = zlib.decompress

    def decompress(data: Any, *args: Any) -> bytes:
        sizes.append(len(data))
        return original(data, *args)

    monkeypatch.setattr(codec.zlib, "decompress", decompress)
    return sizes


async def test_an_alist_page_decompresses_a_shared_base_once(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        graph = graph_of(saver)
        seed = [HumanMessage(f"m{i} " * 60, id=f"m{i}") for i in range(20)]  # compressed
        await graph.ainvoke({"messages": seed, "n": 0}, cfg("t"))
        for _ in range(6):  # the same list, re-versioned: each version a delta of one base
            await graph.ainvoke({"n": 0}, cfg("t"))
        codec._INFLATED.clear()
        sizes = counted_decompress(monkeypatch)
        page = [t async for t in saver.alist(cfg("t"), limit=10)]
    lists = [t.checkpoint["channel_values"]["messages"] for t in page]
    assert len(lists) == 10 and all(len(m) == 20 for m in lists[:7])
    assert len(sizes) == 1, sizes  # one base, decompressed once for the page
    # values of their own: the cache keeps bytes, never a decoded list
    assert len({id(m) for m in lists}) == len(lists)
    assert len({id(m[0]) for m in lists[:7]}) == 7
    lists[0][0].content = "changed"
    assert lists[1][0].content == seed[0].content


def test_the_cache_is_bounded_and_keeps_no_large_value(monkeypatch: pytest.MonkeyPatch) -> None:
    sizes = counted_decompress(monkeypatch)
    small = [zlib.compress(f"value {i} ".encode() * 100, 1) for i in range(40)]
    for data in small:
        assert codec.inflate(data) == zlib.decompress(data)
    assert len(codec._INFLATED) == codec._INFLATED_ENTRIES
    assert codec.inflate(small[-1]) == zlib.decompress(small[-1])  # a hit: no decompress
    # zlib.decompress is counted everywhere: the test's own 41 calls and inflate's 40
    assert len(sizes) == 41 + 40
    sizes.clear()
    large = zlib.compress(b"x" * (codec._INFLATED_MAX_BYTES + 1), 1)
    assert codec.inflate(large) == b"x" * (codec._INFLATED_MAX_BYTES + 1)
    assert codec.inflate(large) == b"x" * (codec._INFLATED_MAX_BYTES + 1)
    assert len(sizes) == 2  # inflate's, both times: never cached
    assert large not in codec._INFLATED
