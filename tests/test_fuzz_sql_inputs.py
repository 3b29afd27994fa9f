"""Property-based fuzzing of every SQL-facing input (metadata filters, ids, tool arguments)
against LangGraph's ``InMemorySaver`` as the reference, on both backends.

Bounded (at most 60 examples per property, no deadline) so the file stays fast. Each
example gets a fresh database: a new SQLite file, or a new schema on the session's
Postgres server. Lone surrogates and NUL in metadata *keys* are left to the explicit
cases of ``test_bad_input.py`` (hypothesis' text strategy excludes surrogates).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from fault_child import Db, cfg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langchain_core.tools import tool
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from pg_server import fresh_dsn, server_dsn
from tool_node_helpers import ai_calls, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.keys import canonical_args

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

HOSTILE = [
    "'",
    '"',
    "'); DROP TABLE idem_checkpoints; --",
    "' OR '1'='1",
    "$.source",
    "$",
    "[0]",
    "a.b",
    "%",
    "_",
    "\\",
    "json_extract(metadata, '$')",
    "é😀",
    "",
]

hostile_text = st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12))
key_text = st.one_of(
    st.sampled_from([*HOSTILE, "source", "step"]),
    st.text(alphabet=st.characters(blacklist_characters="\x00"), max_size=10),
)
scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**53), max_value=2**53),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    hostile_text,
)
json_value = st.recursive(
    scalar,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(hostile_text, inner, max_size=3)
    ),
    max_leaves=6,
)


def new_db(backend: str) -> Db:
    if backend == "sqlite":
        return Db("sqlite", str(Path(tempfile.mkdtemp(prefix="idem-fuzz-")) / "f.sqlite"))
    return Db("postgres", fresh_dsn(server_dsn()))


@pytest.fixture
def fuzz_backend(backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        request.getfixturevalue("pg_server_dsn")  # the server is up (or the test skips)
    return backend


# ----------------------------------------------------------------------------- filters


@FUZZ
@given(
    metadatas=st.lists(st.dictionaries(key_text, json_value, max_size=4), min_size=1, max_size=5),
    filters=st.lists(st.dictionaries(key_text, json_value, max_size=3), min_size=1, max_size=4),
)
def test_filters_match_in_memory(
    fuzz_backend: str, metadatas: list[dict[str, Any]], filters: list[dict[str, Any]]
) -> None:
    async def check() -> None:
        memory = InMemorySaver()
        db = new_db(fuzz_backend)
        async with db.open() as saver:
            for i, md in enumerate(metadatas):
                cp = generate_checkpoint()
                await saver.aput(cfg(f"t{i % 2}"), cp, {**md, "_n": i}, {})
                await memory.aput(cfg(f"t{i % 2}"), cp, {**md, "_n": i}, {})
            ours = {t.metadata["_n"]: t.metadata async for t in saver.alist(None)}
            theirs = {t.metadata["_n"]: t.metadata async for t in memory.alist(None)}
            assert ours == theirs
            before = await db.snapshot()
            # metadata from the examples themselves, so filters hit as well as miss
            for f in [*filters, *({k: v} for md in metadatas for k, v in list(md.items())[:1])]:
                # across threads the order is each saver's own (ours: newest first
                # globally; InMemorySaver: thread by thread): compare as sets
                want = sorted([t.metadata["_n"] async for t in memory.alist(None, filter=f)])
                got = sorted([t.metadata["_n"] async for t in saver.alist(None, filter=f)])
                assert got == want, f
                want_t0 = [t.metadata["_n"] async for t in memory.alist(cfg("t0"), filter=f)]
                got_t0 = [t.metadata["_n"] async for t in saver.alist(cfg("t0"), filter=f)]
                assert got_t0 == want_t0, f
                got_one = [t.metadata["_n"] async for t in saver.alist(None, filter=f, limit=1)]
                assert len(got_one) == min(1, len(want)) and set(got_one) <= set(want), f
            assert await db.snapshot() == before

    asyncio.run(check())


# ----------------------------------------------------------------------------- ids


id_text = st.one_of(st.sampled_from(HOSTILE[:-1]), st.text(min_size=1, max_size=24))


@FUZZ
@given(ids=st.lists(st.tuples(id_text, st.one_of(st.just(""), id_text)), min_size=1, max_size=6))
def test_ids_match_in_memory(fuzz_backend: str, ids: list[tuple[str, str]]) -> None:
    """Any (thread_id, checkpoint_ns) round-trips exactly and selects only itself, or is
    refused with ConfigError (NUL, on both backends) before anything is written."""

    async def check() -> None:
        memory = InMemorySaver()
        db = new_db(fuzz_backend)
        async with db.open() as saver:
            accepted: list[tuple[str, str]] = []
            for i, (thread, ns) in enumerate(ids):
                cp = generate_checkpoint()
                before = await db.snapshot() if "\x00" in thread + ns else None
                try:
                    stored = await saver.aput(cfg(thread, ns), cp, {"i": i}, {})
                except ConfigError:
                    # refused alike by both backends: text a database cannot hold
                    assert "\x00" in thread + ns
                    assert await db.snapshot() == before
                    continue
                assert stored["configurable"]["thread_id"] == thread
                assert stored["configurable"]["checkpoint_ns"] == ns
                await memory.aput(cfg(thread, ns), cp, {"i": i}, {})
                accepted.append((thread, ns))
            ours = sorted(
                [
                    (c["thread_id"], c["checkpoint_ns"], c["checkpoint_id"])
                    async for c in _configs(saver, None)
                ]
            )
            theirs = sorted(
                [
                    (c["thread_id"], c["checkpoint_ns"], c["checkpoint_id"])
                    async for c in _configs(memory, None)
                ]
            )
            assert ours == theirs
            for thread, ns in set(accepted):
                got = await saver.aget_tuple(cfg(thread, ns))
                want = await memory.aget_tuple(cfg(thread, ns))
                assert got is not None and want is not None
                assert got.config == want.config
                assert got.metadata["i"] == want.metadata["i"]
                mine = [c["checkpoint_id"] async for c in _configs(saver, cfg(thread, ns))]
                ref = [c["checkpoint_id"] async for c in _configs(memory, cfg(thread, ns))]
                assert mine == ref

    asyncio.run(check())


async def _configs(saver: Any, config: Any) -> Any:
    async for t in saver.alist(config):
        yield t.config["configurable"]


# ----------------------------------------------------------------------------- tool args


@tool
def record(payload: Any) -> str:
    """Return the payload as canonical JSON."""
    return json.dumps(payload, sort_keys=True, ensure_ascii=True)


@settings(FUZZ, max_examples=25)
@given(payload=json_value, thread=id_text.filter(lambda s: "\x00" not in s))
def test_tool_args_match_a_plain_tool_node(fuzz_backend: str, payload: Any, thread: str) -> None:
    """The ledgered tool sees exactly what a plain ToolNode on InMemorySaver sees, the
    ledger stores the canonical arguments, and a second identical call (args policy)
    replays the same answer."""

    async def check() -> None:
        call = ai_calls(("record", {"payload": payload}, "call-1"))
        plain = tool_graph(ToolNode([record]), InMemorySaver())
        want = (await plain.ainvoke({"messages": [call]}, cfg(thread)))["messages"][-1]
        db = new_db(fuzz_backend)
        async with db.open() as saver:
            graph = tool_graph(IdempotentToolNode([record], key_policy="args"), saver)
            got = (await graph.ainvoke({"messages": [call]}, cfg(thread), durability="sync"))[
                "messages"
            ][-1]
            assert got.content == want.content
            [entry] = await saver.alist_entries(thread)
            assert entry.args == canonical_args({"payload": payload}).encode()
            assert json.loads(entry.args) == json.loads(json.dumps({"payload": payload}))
            again = ai_calls(("record", {"payload": payload}, "call-2"))
            out = await graph.ainvoke({"messages": [again]}, cfg(thread), durability="sync")
            assert out["messages"][-1].content == want.content
            assert len(await saver.alist_entries(thread)) == 1

    asyncio.run(check())
