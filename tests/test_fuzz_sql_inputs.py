"""Property-based fuzzing of every SQL-facing input (metadata filters, ids, tool arguments)
against LangGraph's ``InMemorySaver`` as the reference, on both backends.

The example budget comes from the Hypothesis profile (tests/conftest.py: derandomized on
CI). Each example gets a fresh database: a new SQLite file, or a new schema on the
session's Postgres server. Metadata keys and values include lone surrogates (the
reference keeps them with our lossless serializer: LangGraph's would refuse surrogate
keys). Every failure ever found is pinned below as an ``@example``.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from fault_child import Db
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from langchain_core.tools import tool
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.prebuilt import ToolNode
from pg_server import fresh_dsn, server_dsn
from tool_node_helpers import ai_calls, cfg, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.errors import ConfigError, SerializationError
from langgraph_idem_saver.keys import canonical_args
from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer, has_split_pair

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

# the profile's budget and determinism (tests/conftest.py); every example is a new database
FUZZ = settings(
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
# text no database column holds as is (stored exactly as metadata; refused as ids)
UNSTORABLE = ["\ud800", "a\udfffb", "\udbff\x00", "x\x00y"]

hostile_text = st.one_of(st.sampled_from(HOSTILE + UNSTORABLE), st.text(max_size=12))
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


@contextmanager
def new_db(backend: str) -> Iterator[Db]:
    """A fresh database for one example (a SQLite file removed afterwards)."""
    if backend == "postgres":
        yield Db("postgres", fresh_dsn(server_dsn()))
        return
    directory = tempfile.mkdtemp(prefix="idem-fuzz-")
    try:
        yield Db("sqlite", str(Path(directory) / "f.sqlite"))
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def reference() -> InMemorySaver:
    """LangGraph's InMemorySaver, with a serializer that holds lone surrogates exactly."""
    return InMemorySaver(serde=LosslessJsonPlusSerializer())


def json_cannot_hold(metadata: dict[str, Any]) -> bool:
    """Metadata our savers refuse: a surrogate pair split into two code points."""
    return has_split_pair(json.dumps(metadata, ensure_ascii=False))


@pytest.fixture
def fuzz_backend(backend: str, request: pytest.FixtureRequest) -> str:
    if backend == "postgres":
        request.getfixturevalue("pg_server_dsn")  # the server is up (or the test skips)
    return backend


# ----------------------------------------------------------------------------- profiles


def test_hypothesis_profile_follows_the_environment() -> None:
    """CI runs derandomized (the same examples every run, reproduction blob printed);
    HYPOTHESIS_PROFILE picks a profile explicitly (tests/conftest.py)."""
    ci = settings.get_profile("ci")
    assert ci.derandomize and ci.deadline is None and ci.print_blob and ci.database is None
    explore = settings.get_profile("explore")
    assert not explore.derandomize and explore.max_examples > ci.max_examples
    expected = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    chosen = settings.get_profile(expected)
    assert (settings.default.derandomize, settings.default.max_examples) == (
        chosen.derandomize,
        chosen.max_examples,
    )
    assert FUZZ.derandomize == chosen.derandomize


# ----------------------------------------------------------------------------- filters


@FUZZ
@given(
    metadatas=st.lists(st.dictionaries(key_text, json_value, max_size=4), min_size=1, max_size=5),
    filters=st.lists(st.dictionaries(key_text, json_value, max_size=3), min_size=1, max_size=4),
)
# found on CI (SQLite bound the key and raised a raw UnicodeEncodeError)
@example(metadatas=[{}], filters=[{"\ud800": []}])
# fixed before: NUL keys/values (json_each cuts keys at NUL), None matching an absent
# key, Python's 1 == 1.0 == True, JSONB printing 1e16 as an int and -0.0 as 0
@example(metadatas=[{"a\x00b": "v", "k": ["x\x00"]}], filters=[{"a\x00b": "v"}, {"a": "v"}])
@example(metadatas=[{"k": 1}, {"k": True}, {"k": 1.0}, {}], filters=[{"k": None}, {"k": True}])
@example(metadatas=[{"k": 1e16}, {"k": -0.0}, {"k": [1]}], filters=[{"k": 10**16}, {"k": [True]}])
# sanitized (U+FFFD) keys colliding on Postgres must not drop a real match
@example(
    metadatas=[dict([("\ud800", "a"), ("\udfff", "b")]), {}],  # (a dict literal confuses ruff)
    filters=[{"\ud800": "a"}, {"\udfff": None}],
)
def test_filters_match_in_memory(
    fuzz_backend: str, metadatas: list[dict[str, Any]], filters: list[dict[str, Any]]
) -> None:
    async def check(db: Db) -> None:
        memory = reference()
        async with db.open() as saver:
            for i, md in enumerate(metadatas):
                cp = generate_checkpoint()
                if json_cannot_hold(md):
                    with pytest.raises(SerializationError):
                        await saver.aput(cfg(f"t{i % 2}", ns=""), cp, {**md, "_n": i}, {})
                    continue
                await saver.aput(cfg(f"t{i % 2}", ns=""), cp, {**md, "_n": i}, {})
                await memory.aput(cfg(f"t{i % 2}", ns=""), cp, {**md, "_n": i}, {})
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
                want_t0 = [t.metadata["_n"] async for t in memory.alist(cfg("t0", ns=""), filter=f)]
                got_t0 = [t.metadata["_n"] async for t in saver.alist(cfg("t0", ns=""), filter=f)]
                assert got_t0 == want_t0, f
                got_one = [t.metadata["_n"] async for t in saver.alist(None, filter=f, limit=1)]
                assert len(got_one) == min(1, len(want)) and set(got_one) <= set(want), f
            assert await db.snapshot() == before

    with new_db(fuzz_backend) as db:
        asyncio.run(check(db))


# ----------------------------------------------------------------------------- ids


id_text = st.one_of(st.sampled_from(HOSTILE[:-1] + UNSTORABLE), st.text(min_size=1, max_size=24))


def unstorable_id(text: str) -> bool:
    """NUL or a lone surrogate: refused as an id (ConfigError) by both backends."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return "\x00" in text


@FUZZ
@given(ids=st.lists(st.tuples(id_text, st.one_of(st.just(""), id_text)), min_size=1, max_size=6))
# fixed before: NUL and lone surrogates in ids (refused alike, nothing written)
@example(ids=[("a\x00b", ""), ("t", "n\x00s"), ("a\ud800b", ""), ("t", "ns\udfff"), ("t", "")])
def test_ids_match_in_memory(fuzz_backend: str, ids: list[tuple[str, str]]) -> None:
    """Any (thread_id, checkpoint_ns) round-trips exactly and selects only itself, or is
    refused with ConfigError (NUL, lone surrogates: on both backends) before anything is
    written."""

    async def check(db: Db) -> None:
        memory = InMemorySaver()
        async with db.open() as saver:
            accepted: list[tuple[str, str]] = []
            for i, (thread, ns) in enumerate(ids):
                cp = generate_checkpoint()
                before = await db.snapshot() if unstorable_id(thread + ns) else None
                try:
                    stored = await saver.aput(cfg(thread, ns), cp, {"i": i}, {})
                except ConfigError:
                    # refused alike by both backends: text a database cannot hold
                    assert unstorable_id(thread + ns)
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

    with new_db(fuzz_backend) as db:
        asyncio.run(check(db))


async def _configs(saver: Any, config: Any) -> Any:
    async for t in saver.alist(config):
        yield t.config["configurable"]


# ----------------------------------------------------------------------------- tool args


@tool
def record(payload: Any) -> str:
    """Return the payload as canonical JSON."""
    return json.dumps(payload, sort_keys=True, ensure_ascii=True)


# each example runs two graphs: a smaller budget than the other properties
@settings(FUZZ, max_examples=max(1, settings.default.max_examples * 5 // 8))
@given(
    payload=json_value,
    thread=id_text.filter(lambda s: not unstorable_id(s) and not s.startswith("ns:")),
)
# fixed before: lone surrogates in arguments (now stored exactly, as JSON escapes)
@example(payload={"\udfff": ["a\ud800", "\udbff\x00"]}, thread="t")
@example(payload="\ud800", thread="it's")
def test_tool_args_match_a_plain_tool_node(fuzz_backend: str, payload: Any, thread: str) -> None:
    """The ledgered tool sees exactly what a plain ToolNode on InMemorySaver sees, the
    ledger stores the canonical arguments (reading back exactly), and a second identical
    call (args policy) replays the same answer."""

    async def check(db: Db) -> None:
        call = ai_calls(("record", {"payload": payload}, "call-1"))
        plain = tool_graph(ToolNode([record]), reference())
        want = (await plain.ainvoke({"messages": [call]}, cfg(thread)))["messages"][-1]
        async with db.open() as saver:
            graph = tool_graph(IdempotentToolNode([record], key_policy="args"), saver)
            got = (await graph.ainvoke({"messages": [call]}, cfg(thread), durability="sync"))[
                "messages"
            ][-1]
            assert got.content == want.content
            [entry] = await saver.alist_entries(thread)
            assert entry.args == canonical_args({"payload": payload}).encode()
            assert json.loads(entry.args) == json.loads(json.dumps({"payload": payload}))
            assert json.loads(entry.args) == {"payload": json.loads(json.dumps(payload))}
            again = ai_calls(("record", {"payload": payload}, "call-2"))
            out = await graph.ainvoke({"messages": [again]}, cfg(thread), durability="sync")
            assert out["messages"][-1].content == want.content
            assert len(await saver.alist_entries(thread)) == 1

    with new_db(fuzz_backend) as db:
        asyncio.run(check(db))


# ----------------------------------------------------------------------------- adoption read

# a small alphabet, so that entries and look-ups collide: a tool with another call's hash,
# an entry found by both a signature and a spot, another agent's entry at a spot
TOOLS, DIGESTS, PATHS, SPOTS = (
    ["send", "charge", "s'q"],
    ["h1", "h2", "h3"],
    ["tools", "other"],
    [None, "p1", "p2"],
)
planted_call = st.tuples(
    st.sampled_from(TOOLS), st.sampled_from(DIGESTS), st.sampled_from(PATHS), st.sampled_from(SPOTS)
)


@FUZZ
@given(
    planted=st.lists(planted_call, max_size=12),
    signatures=st.lists(st.tuples(st.sampled_from(TOOLS), st.sampled_from(DIGESTS)), max_size=6),
    spots=st.lists(st.tuples(st.sampled_from(SPOTS[1:]), st.sampled_from(TOOLS)), max_size=3),
)
# the shapes of the Postgres read (migration 14): a step of several calls whose
# signatures share tools and hashes pairwise but not as pairs, an entry found both by its
# signature and at a spot (once), another agent's entry with a signature's pair at a spot
@example(
    planted=[
        ("send", "h2", "tools", "p1"),
        ("charge", "h1", "tools", None),
        ("send", "h1", "other", "p1"),
    ],
    signatures=[("send", "h1"), ("charge", "h2"), ("send", "h2")],
    spots=[("p1", "send"), ("p2", "charge")],
)
def test_the_adoption_read_of_a_step_finds_what_the_reads_per_call_find(
    fuzz_backend: str,
    planted: list[tuple[str, str, str, str | None]],
    signatures: list[tuple[str, str]],
    spots: list[tuple[str, str]],
) -> None:
    """A step's adoption read (one statement: ``afind_step_candidates``, also the first
    part of ``aclaim_step``) returns exactly what ``ToolCallLedger``'s default - one
    ``afind_orphans``/``afind_at_position`` read per signature and spot - returns: every
    entry once, oldest first, whatever the step's signatures and spots share."""
    from langgraph_idem_saver.ledger import CallIntent, StepLookup, ToolCallLedger

    signatures, spots = list(dict.fromkeys(signatures)), list(dict.fromkeys(spots))

    async def check(db: Db) -> None:
        async with db.open() as saver:
            intents = [
                CallIntent(
                    scope="t",
                    key=f"k{i}",
                    thread_id="t",
                    agent_path=path,
                    tool_name=name,
                    args_hash=digest,
                    args=b"{}",
                    tool_call_id=f"c{i}",
                    position=at,
                    branch=None if at is None else "b",
                    occurrence=i,
                )
                for i, (name, digest, path, at) in enumerate(planted)
            ]
            await saver.aclaim(intents, owner="someone", lease_seconds=60)
            lookup = StepLookup("t", "tools", signatures, spots)
            one = await saver.afind_step_candidates(lookup)
            per_call = await ToolCallLedger.afind_step_candidates(saver, lookup)
            assert one == per_call
            if signatures:  # the claim's own read finds the same (and then writes nothing)
                fresh = CallIntent(
                    scope="t", key="new", thread_id="t", agent_path="tools", tool_name="send",
                    args_hash="new", args=b"{}", tool_call_id="new",
                )  # fmt: skip
                step = await saver.aclaim_step([fresh], lookup, owner="me", lease_seconds=60)
                assert step.candidates == one
                assert (step.claimed is None) == one.any()

    with new_db(fuzz_backend) as db:
        asyncio.run(check(db))
