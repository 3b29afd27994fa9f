"""A catalog of bad input, on both backends: each case gets a typed, clear error (or the
correct behaviour), and nothing already stored is lost or altered.

Complements ``test_saver_errors.py`` (SQLite files, missing thread ids, corrupt rows) and
``test_postgres_specific.py`` (NUL ids, filters bound not interpolated): here every case
runs on SQLite *and* Postgres through the same assertions, including the ledger and the
``IdempotentToolNode`` (a tool must never run when its call cannot be recorded).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
from fault_child import Db, Tripwire
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from tool_node_helpers import Counter, ai_calls, cfg, rerun_tool_step, tool_graph

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    IdemSaverError,
    NotADatabaseError,
    SchemaVersionError,
    SerializationError,
)
from langgraph_idem_saver.keys import args_hash, canonical_args
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome
from langgraph_idem_saver.surrogates import LOSSLESS_TYPE, LosslessJsonPlusSerializer

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


async def seed(saver: Any) -> Any:
    """A healthy thread with a checkpoint, a pending write and a completed ledger entry."""
    values = {"a": "value-a", "b": [1, 2]}
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    cp = generate_checkpoint(channel_values=values, channel_versions=versions)
    stored = await saver.aput(cfg("healthy"), cp, {"source": "input", "step": 1}, versions)
    await saver.aput_writes(stored, [("a", "pending-a")], "task-1")
    intent = make_intent("healthy", "seed-key")
    [_outcome] = await saver.aclaim([intent], owner="h:1:seed", lease_seconds=60)
    type_, data = saver.serde.dumps_typed({"ok": True})
    await saver.record_outcome(
        intent.scope, intent.key, owner="h:1:seed", outcome=Outcome.completed(type_, data)
    )
    return stored


async def assert_seed_intact(saver: Any) -> None:
    tup = await saver.aget_tuple(cfg("healthy"))
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": "value-a", "b": [1, 2]}
    assert tup.pending_writes == [("task-1", "a", "pending-a")]
    entry = await saver.aget_entry("healthy", "seed-key")
    assert entry is not None and entry.status is CallStatus.COMPLETED
    assert saver.serde.loads_typed((entry.result_type, entry.result)) == {"ok": True}


def make_intent(thread: str, key: str, **over: Any) -> CallIntent:
    fields: dict[str, Any] = {
        "scope": thread,
        "key": key,
        "thread_id": thread,
        "agent_path": "tools",
        "tool_name": "charge",
        "args_hash": "h",
        "args": b'{"amount":1}',
        "tool_call_id": f"call-{key}",
    }
    fields.update(over)
    return CallIntent(**fields)


async def put_plain(saver: Any, thread: Any, ns: str = "") -> Any:
    cp = generate_checkpoint()
    return await saver.aput(cfg(thread, ns), cp, {"source": "input", "step": 0}, {})


async def round_trip_or_config_error(saver: Any, thread: Any, ns: str = "") -> bool:
    """An id is either stored and read back exactly, or refused with ConfigError.

    Returns True when it round-tripped."""
    try:
        stored = await put_plain(saver, thread, ns)
    except ConfigError:
        with pytest.raises(ConfigError):
            await saver.aget_tuple(cfg(thread, ns))
        return False
    assert stored["configurable"]["thread_id"] == thread
    assert stored["configurable"]["checkpoint_ns"] == ns
    tup = await saver.aget_tuple(cfg(thread, ns))
    assert tup is not None
    assert tup.config["configurable"]["thread_id"] == thread
    assert tup.config["configurable"]["checkpoint_ns"] == ns
    listed = [t.config async for t in saver.alist(cfg(thread, ns))]
    assert listed == [tup.config]
    return True


# ------------------------------------------------------------------- metadata filters

HOSTILE_METADATA = {
    "'); DROP TABLE idem_checkpoints; --": "v1",
    "$.source": "path-key",
    "a\x00b": "nul-key",
    "quote'\"": "x') OR ('1'='1",
    "nested": {"$.x": ["'); DROP", "\x00"], "k": "json_extract(metadata, '$')"},
    "plain": "value\x00with nul",
}


async def test_hostile_metadata_is_stored_exactly_and_filters_like_in_memory(db: Db) -> None:
    """Metadata *containing* injection text, JSON paths and NUL round-trips and filters
    exactly as LangGraph's InMemorySaver filters it; the database is unchanged by reads."""
    memory = InMemorySaver()
    async with db.open() as saver:
        await seed(saver)
        cp = generate_checkpoint()
        await saver.aput(cfg("hostile", ns=""), cp, dict(HOSTILE_METADATA), {})
        await memory.aput(cfg("hostile", ns=""), cp, dict(HOSTILE_METADATA), {})
        tup = await saver.aget_tuple(cfg("hostile", ns=""))
        assert tup is not None
        mem = await memory.aget_tuple(cfg("hostile", ns=""))
        assert mem is not None
        assert tup.metadata == mem.metadata
        before = await db.snapshot()
        filters: list[dict[str, Any]] = [{k: v} for k, v in HOSTILE_METADATA.items()] + [
            {"'); DROP TABLE idem_checkpoints; --": "v2"},
            {"$.source": "input"},
            {"$": "path-key"},
            {"nested": {"$.x": ["'); DROP", "\x00"]}},
            {"plain": "value"},
            {"source": "input') OR 1=1 --"},
            {"a": None, "$.source": "path-key"},
        ]
        wrong = []
        for f in filters:
            want = [
                t.config["configurable"]["thread_id"] async for t in memory.alist(None, filter=f)
            ]
            got = [
                t.config["configurable"]["thread_id"]
                async for t in saver.alist(cfg("hostile", ns=""), filter=f)
            ]
            if got != want:
                wrong.append((f, got, want))
        assert wrong == []
        assert await db.snapshot() == before
        await assert_seed_intact(saver)


@pytest.mark.parametrize(
    "bad_filter",
    [{1: "x"}, {("a",): "x"}, {"a": object()}, {"a": {"b": {1, 2}}}, {"a": [b"bytes"]}],
    ids=["int-key", "tuple-key", "object-value", "set-value", "bytes-value"],
)
async def test_filter_that_is_not_json_is_config_error(db: Db, bad_filter: Any) -> None:
    async with db.open() as saver:
        await seed(saver)
        before = await db.snapshot()
        with pytest.raises(ConfigError):
            [t async for t in saver.alist(None, filter=bad_filter)]
        assert await db.snapshot() == before
        await assert_seed_intact(saver)


# ------------------------------------------------------------------- thread ids, namespaces


@pytest.mark.parametrize(
    ("thread", "ns"),
    [
        ("it's", ""),
        ('"; DROP TABLE idem_checkpoints; --', ""),
        ("t", "ns'); DELETE FROM idem_tool_calls; --"),
        ("$.thread_id", "[0]"),
        ("%_*", "%"),
    ],
    ids=["apostrophe", "drop", "ns-delete", "json-path", "like-wildcards"],
)
async def test_quoted_ids_round_trip(db: Db, thread: str, ns: str) -> None:
    async with db.open() as saver:
        await seed(saver)
        assert await round_trip_or_config_error(saver, thread, ns)
        # a wildcard-looking id selects only itself
        assert [t async for t in saver.alist(cfg("%"))] == []
        await assert_seed_intact(saver)


@pytest.mark.parametrize(
    ("thread", "ns"),
    [("a\x00b", ""), ("t", "n\x00s"), ("\x00", "")],
    ids=["nul-thread", "nul-ns", "only-nul"],
)
async def test_nul_in_ids_round_trips_or_is_config_error(db: Db, thread: str, ns: str) -> None:
    async with db.open() as saver:
        await seed(saver)
        if await round_trip_or_config_error(saver, thread, ns):
            # a NUL must not truncate the id: "a\x00b" is not "a"
            cut_thread, cut_ns = thread.split("\x00")[0] or "x", ns.split("\x00")[0]
            assert await saver.aget_tuple(cfg(cut_thread, cut_ns)) is None
        await assert_seed_intact(saver)


@pytest.mark.parametrize(
    ("thread", "ns"),
    [("a\ud800b", ""), ("t", "ns\udfff")],
    ids=["surrogate-thread", "surrogate-ns"],
)
async def test_lone_surrogate_ids_round_trip_or_are_config_error(
    db: Db, thread: str, ns: str
) -> None:
    """Postgres refuses them with ConfigError. SQLite must either store them or refuse
    them the same way, never leak a raw UnicodeEncodeError."""
    async with db.open() as saver:
        await seed(saver)
        await round_trip_or_config_error(saver, thread, ns)
        await assert_seed_intact(saver)


@pytest.mark.parametrize("kind", ["repetitive", "random"])
async def test_10kb_thread_id(db: Db, kind: str) -> None:
    """A 10 KB thread id is stored, or refused with a typed error; never a raw driver
    error, and the database keeps everything it held."""
    thread = "t" * 10240 if kind == "repetitive" else random.Random(7).randbytes(5120).hex()
    async with db.open() as saver:
        await seed(saver)
        before = await db.snapshot()
        try:
            ok = await round_trip_or_config_error(saver, thread)
        except IdemSaverError:
            ok = False
        if not ok:
            assert await db.snapshot() == before
        await assert_seed_intact(saver)


@pytest.mark.parametrize(
    "bad",
    [
        {"configurable": {"thread_id": True}},
        {"configurable": {"thread_id": {"x": 1}}},
        {"configurable": {"thread_id": ["a"]}},
        {"configurable": {"thread_id": "t", "checkpoint_ns": 5}},
        {"configurable": {"thread_id": "t", "checkpoint_id": 123}},
        {"configurable": "thread_id=t"},
    ],
    ids=["bool", "dict", "list", "int-ns", "int-checkpoint-id", "str-configurable"],
)
async def test_wrongly_typed_config_is_config_error(db: Db, bad: Any) -> None:
    async with db.open() as saver:
        await seed(saver)
        before = await db.snapshot()
        with pytest.raises(ConfigError):
            await saver.aget_tuple(bad)
        with pytest.raises(ConfigError):
            await saver.aput(bad, generate_checkpoint(), {"step": 0}, {})
        with pytest.raises(ConfigError):
            [t async for t in saver.alist(bad)]
        assert await db.snapshot() == before


# ------------------------------------------------------------------- ids, limits


async def test_unknown_checkpoint_id(db: Db) -> None:
    async with db.open() as saver:
        stored = await seed(saver)
        before = await db.snapshot()
        for unknown in ("no-such-id", "1f0" + "f" * 33, "' OR '1'='1", "%"):
            assert await saver.aget_tuple(cfg("healthy", "", unknown)) is None
            assert [t async for t in saver.alist(cfg("healthy", "", unknown))] == []
            assert await saver.aget_tuple(cfg("nobody", "", unknown)) is None
        # `before` an id older than everything: nothing; newer than everything: all
        assert [t async for t in saver.alist(None, before=cfg("healthy", "", "0"))] == []
        everything = [t.config async for t in saver.alist(None, before=cfg("x", "", "~"))]
        assert everything == [stored]
        assert await db.snapshot() == before


@pytest.mark.parametrize(
    ("limit", "expected"),
    [(0, 0), (-1, 0), (-(2**63), 0), (1, 1), (10**30, 5), (2**63 - 1, 5), (None, 5)],
)
async def test_list_limits(db: Db, limit: Any, expected: int) -> None:
    memory = InMemorySaver()
    async with db.open() as saver:
        parent: Any = None
        for step in range(5):
            cp = generate_checkpoint()
            config = cfg("t", "", parent)
            stored = await saver.aput(config, cp, {"step": step}, {})
            await memory.aput(config, cp, {"step": step}, {})
            parent = stored["configurable"]["checkpoint_id"]
        got = [t.metadata["step"] async for t in saver.alist(cfg("t", ns=""), limit=limit)]
        assert len(got) == expected
        assert got == [4, 3, 2, 1, 0][:expected]
        if limit is not None and limit > 0:
            want = [t.metadata["step"] async for t in memory.alist(cfg("t", ns=""), limit=limit)]
            assert got == want


# ------------------------------------------------------------------- writes


@pytest.mark.parametrize(
    ("task_id", "channel"),
    [("task'); --", 'ch"annel'), ("t\x00k", "c"), ("task", "ch\x00an"), ("t" * 10240, "c")],
    ids=["quotes", "nul-task", "nul-channel", "10kb-task"],
)
async def test_hostile_write_ids(db: Db, task_id: str, channel: str) -> None:
    async with db.open() as saver:
        stored = await seed(saver)
        before = await db.snapshot()
        try:
            await saver.aput_writes(stored, [(channel, "v")], task_id)
        except (ConfigError, SerializationError):
            assert await db.snapshot() == before
        else:
            tup = await saver.aget_tuple(stored)
            assert tup is not None
            assert (task_id, channel, "v") in tup.pending_writes
        tup = await saver.aget_tuple(stored)
        assert tup is not None and ("task-1", "a", "pending-a") in tup.pending_writes


# ------------------------------------------------------------------- connection, schema


async def test_closed_connection_refuses_ledger_calls(db: Db) -> None:
    """Existing tests cover checkpoint methods; the ledger must refuse the same way."""
    async with db.open() as saver:
        await seed(saver)
        conn = saver.conn
    # the context closed the connection; the saver object is still around
    assert conn is not None
    intent = make_intent("healthy", "after-close")
    with pytest.raises(ConnectionClosedError):
        await saver.aclaim([intent], owner="h:1:x", lease_seconds=60)
    with pytest.raises(ConnectionClosedError):
        await saver.record_outcome(
            "healthy", "seed-key", owner="h:1:seed", outcome=Outcome.failed("x")
        )
    with pytest.raises(ConnectionClosedError):
        await saver.aget_entry("healthy", "seed-key")
    with pytest.raises(ConnectionClosedError):
        await saver.alist_entries("healthy")
    with pytest.raises(ConnectionClosedError):
        await saver.alist_unknown()
    async with db.open() as again:
        await assert_seed_intact(again)
        assert await again.aget_entry("healthy", "after-close") is None


async def test_newer_schema_refuses_ledger_calls_too(db: Db) -> None:
    async with db.open() as saver:
        await seed(saver)
    await db.execute("INSERT INTO idem_saver_migrations (v) VALUES (9999)")
    before = await db.snapshot()
    with pytest.raises(SchemaVersionError, match="9999"):
        async with db.open() as saver:
            await saver.aclaim([make_intent("healthy", "new")], owner="h:1:x", lease_seconds=60)
    assert await db.snapshot() == before
    await db.execute("DELETE FROM idem_saver_migrations WHERE v = 9999")
    async with db.open() as saver:
        await assert_seed_intact(saver)


async def test_truncated_sqlite_file(tmp_path: Path) -> None:
    """A database file cut short: NotADatabaseError, and the file is left as it was."""
    path = tmp_path / "full.sqlite"
    db = Db("sqlite", str(path))
    async with db.open() as saver:
        for i in range(30):
            values = {"big": "x" * 4000 + str(i)}
            versions = {"big": saver.get_next_version(None, None)}
            cp = generate_checkpoint(channel_values=values, channel_versions=versions)
            await saver.aput(cfg(f"t{i}"), cp, {"step": i}, versions)
    whole = path.read_bytes()
    assert len(whole) > 3 * 4096
    for cut in (50, 4096, len(whole) // 2, len(whole) - 100):
        damaged = tmp_path / f"cut-{cut}.sqlite"
        damaged.write_bytes(whole[:cut])
        try:
            async with Db("sqlite", str(damaged)).open() as saver:
                # SQLite zero-fills a short last page: a cut inside unused space may
                # leave every row readable, which is then the correct behaviour
                for i in range(30):
                    tup = await saver.aget_tuple(cfg(f"t{i}"))
                    assert tup is not None
                    assert tup.checkpoint["channel_values"] == {"big": "x" * 4000 + str(i)}
                assert len([t async for t in saver.alist(None)]) == 30
        except NotADatabaseError as exc:
            assert "malformed" in str(exc) or "not a database" in str(exc)
            assert damaged.read_bytes() == whole[:cut], f"cut at {cut}: the file was modified"
        else:
            assert cut > len(whole) - 4096, f"a cut at {cut} of {len(whole)} went unnoticed"


# ------------------------------------------------------------------- tool calls


def echo_tools(effects: Counter) -> list[Any]:
    @tool
    def echo(payload: Any) -> str:
        """Echo the payload (a side effect)."""
        effects.bump(payload)
        return json.dumps(payload, ensure_ascii=True)

    @tool(response_format="content_and_artifact")
    def produce(size: int, surrogates: bool = False) -> tuple[str, Any]:
        """Produce a large or odd result (a side effect)."""
        effects.bump(size)
        if surrogates:
            text = "result \ud800 lone \udfff"
            return text, {"text": text, "list": ["\udc80"]}
        return "big", random.Random(size).randbytes(size // 2).hex()

    return [echo, produce]


@pytest.mark.parametrize(
    "payload",
    [float("nan"), float("inf"), b"raw-bytes", {"when": __import__("datetime").date(2024, 1, 1)}],
    ids=["nan", "inf", "bytes", "date"],
)
async def test_non_json_tool_args_rejected_before_the_tool_runs(db: Db, payload: Any) -> None:
    effects = Counter()
    async with db.open() as saver:
        await seed(saver)
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        with pytest.raises(SerializationError, match="nothing was run"):
            await graph.ainvoke(
                {"messages": [ai_calls(("echo", {"payload": payload}, "call-bad"))]},
                cfg("t"),
                durability="sync",
            )
        assert len(effects) == 0
        assert await saver.alist_entries("t") == []
        await assert_seed_intact(saver)


async def test_tool_args_with_lone_surrogates_are_stored_and_replayed(db: Db) -> None:
    """Arguments with unpaired surrogates run once, are recorded, and a re-run of the
    step replays them (no second side effect, no error)."""
    effects = Counter()
    payload = {"text": "lone \ud800 high and \udfff low", "ok": "é"}
    async with db.open() as saver:
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        out = await graph.ainvoke(
            {"messages": [ai_calls(("echo", {"payload": payload}, "call-s"))]},
            cfg("t"),
            durability="sync",
        )
        assert effects.calls == [payload]
        [entry] = await saver.alist_entries("t")
        assert entry.status is CallStatus.COMPLETED
        # stored losslessly: valid UTF-8 text with the surrogates as JSON escapes
        assert b"\\ud800" in entry.args and b"\\udfff" in entry.args
        assert json.loads(entry.args) == {"payload": payload}
        assert entry.args_hash == args_hash(canonical_args({"payload": payload}))
        # the call as the checkpoint holds it (what a resume reads) keeps its surrogates
        state = await graph.aget_state(cfg("t"))
        [checkpointed] = [m for m in state.values["messages"] if m.type == "ai"]
        assert checkpointed.tool_calls[0]["args"] == {"payload": payload}
        again = await rerun_tool_step(graph, "t")
        assert len(effects) == 1
        assert again["messages"][-1].content == out["messages"][-1].content
        assert [e.key for e in await saver.alist_entries("t")] == [entry.key]


async def test_tool_call_id_with_lone_surrogate_is_typed_and_runs_nothing(db: Db) -> None:
    effects = Counter()
    async with db.open() as saver:
        await seed(saver)
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        try:
            await graph.ainvoke(
                {"messages": [ai_calls(("echo", {"payload": 1}, "call-\ud800"))]},
                cfg("t"),
                durability="sync",
            )
        except IdemSaverError:
            assert len(effects) == 0
        else:
            assert len(effects) == 1
            [entry] = await saver.alist_entries("t")
            assert entry.status is CallStatus.COMPLETED
        await assert_seed_intact(saver)


async def test_tool_result_with_lone_surrogates_replays_what_was_checkpointed(db: Db) -> None:
    """A result with unpaired surrogates is checkpointed and recorded exactly (the
    serializer's lossless variant, not ``?``), and the replay is that exact result."""
    effects = Counter()
    async with db.open() as saver:
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        await graph.ainvoke(
            {"messages": [ai_calls(("produce", {"size": 1, "surrogates": True}, "call-r"))]},
            cfg("t"),
            durability="sync",
        )
        state = await graph.aget_state(cfg("t"))
        checkpointed = state.values["messages"][-1]
        assert checkpointed.content == "result \ud800 lone \udfff"
        assert checkpointed.artifact == {"text": "result \ud800 lone \udfff", "list": ["\udc80"]}
        [entry] = await saver.alist_entries("t")
        assert entry.result_type is not None
        assert entry.result_type.split("+")[0].removeprefix("zlib:") == LOSSLESS_TYPE
        again = await rerun_tool_step(graph, "t")
        replayed = again["messages"][-1]
        assert len(effects) == 1
        assert isinstance(replayed, ToolMessage)
        assert (replayed.content, replayed.artifact) == (
            checkpointed.content,
            checkpointed.artifact,
        )


async def test_10mb_tool_result_is_recorded_and_replayed(db: Db) -> None:
    effects = Counter()
    size = 10 * 1024 * 1024
    async with db.open() as saver:
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        out = await graph.ainvoke(
            {"messages": [ai_calls(("produce", {"size": size}, "call-big"))]},
            cfg("t"),
            durability="sync",
        )
        first = out["messages"][-1]
        assert len(first.artifact) == size
        again = await rerun_tool_step(graph, "t")
        assert len(effects) == 1
        assert again["messages"][-1].artifact == first.artifact


@pytest.mark.parametrize(
    ("column", "value"),
    [
        ("result", b"\xc1\xff\x00garbage"),
        ("result_type", "no-such-codec"),
        ("result_type", "pickle"),
    ],
    ids=["garbage-bytes", "unknown-type", "pickle-type"],
)
async def test_corrupt_ledger_result(db: Db, column: str, value: Any) -> None:
    """A recorded result that cannot be decoded: CorruptRecordError naming the entry,
    and the tool is not run again."""
    effects = Counter()
    async with db.open() as saver:
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        await graph.ainvoke(
            {"messages": [ai_calls(("echo", {"payload": 1}, "call-c"))]},
            cfg("t"),
            durability="sync",
        )
        [entry] = await saver.alist_entries("t")
        assert await db.execute(
            f"UPDATE idem_tool_calls SET {column} = ? WHERE key = ?", (value, entry.key)
        )
        ledger = "SELECT * FROM idem_tool_calls ORDER BY key"
        before = await db.query(ledger)
        with pytest.raises(CorruptRecordError) as info:
            await rerun_tool_step(graph, "t")
        assert info.value.location["key"] == entry.key
        assert len(effects) == 1
        assert await db.query(ledger) == before  # the entry is left for an operator


async def test_corrupt_checkpoint_blob_on_both_backends(db: Db) -> None:
    async with db.open() as saver:
        await seed(saver)
        stored = await put_plain(saver, "victim")
    await db.execute(
        "UPDATE idem_checkpoints SET checkpoint = ? WHERE thread_id = 'victim'", (b"\xc1\x00",)
    )
    async with db.open() as saver:
        with pytest.raises(CorruptRecordError) as info:
            await saver.aget_tuple(cfg("victim"))
        assert info.value.location["checkpoint_id"] == stored["configurable"]["checkpoint_id"]
        await assert_seed_intact(saver)


# ------------------------------------------------------------------- isolation


def charge_tool(effects: Counter, label: str) -> Any:
    @tool
    def charge(amount: int) -> str:
        """Charge (a side effect)."""
        effects.bump((label, amount))
        return f"{label} charged {amount}"

    return charge


async def run_charge(saver: Any, node: IdempotentToolNode, thread: str, call_id: str) -> str:
    graph = tool_graph(node, saver)
    out = await graph.ainvoke(
        {"messages": [ai_calls(("charge", {"amount": 5}, call_id))]},
        cfg(thread),
        durability="sync",
    )
    return str(out["messages"][-1].content)


@pytest.mark.parametrize("policy", ["tool_call", "args"])
async def test_replay_never_crosses_threads_without_a_namespace(db: Db, policy: str) -> None:
    effects = Counter()
    async with db.open() as saver:
        a = await run_charge(
            saver, IdempotentToolNode([charge_tool(effects, "A")], key_policy=policy), "A", "c1"
        )
        b = await run_charge(
            saver, IdempotentToolNode([charge_tool(effects, "B")], key_policy=policy), "B", "c1"
        )
        assert (a, b) == ("A charged 5", "B charged 5")
        assert len(effects) == 2
        shared = Counter()
        n1 = IdempotentToolNode([charge_tool(shared, "N")], key_policy=policy, namespace="bill")
        n2 = IdempotentToolNode([charge_tool(shared, "M")], key_policy=policy, namespace="bill")
        assert await run_charge(saver, n1, "C", "c1") == "N charged 5"
        assert await run_charge(saver, n2, "D", "c1") == "N charged 5"  # shared: replayed
        assert len(shared) == 1


async def test_hostile_key_fn_cannot_read_another_scope(db: Db) -> None:
    """A key_fn returning the same key everywhere still only sees its own scope."""
    effects = Counter()

    def same_key(call: Any, ctx: Any) -> str:
        return "the-one-key"

    async with db.open() as saver:
        secret = IdempotentToolNode(
            [charge_tool(effects, "secret")], key_policy=same_key, namespace="billing"
        )
        assert await run_charge(saver, secret, "tenant-a", "c1") == "secret charged 5"
        for thread, ns in (("tenant-b", None), ("tenant-a", None), ("tenant-b", "other")):
            node = IdempotentToolNode(
                [charge_tool(effects, f"{thread}/{ns}")], key_policy=same_key, namespace=ns
            )
            got = await run_charge(saver, node, thread, "c1")
            assert got == f"{thread}/{ns} charged 5", (thread, ns)
        assert len(effects) == 4


async def test_thread_named_like_a_namespace_does_not_share_its_scope(db: Db) -> None:
    """A thread whose id is ``"ns:billing"`` must not read the ``billing`` namespace's
    results (thread ids are often user-controlled: one tenant could read another's). The
    node refuses such a thread id before anything runs (``ns:`` is reserved)."""
    effects = Counter()
    async with db.open() as saver:
        billing = IdempotentToolNode(
            [charge_tool(effects, "billing")], key_policy="args", namespace="billing"
        )
        assert await run_charge(saver, billing, "tenant-a", "c1") == "billing charged 5"
        intruder = IdempotentToolNode([charge_tool(effects, "intruder")], key_policy="args")
        with pytest.raises(ConfigError, match="starts with 'ns:'"):
            await run_charge(saver, intruder, "ns:billing", "c9")
        assert len(effects) == 1, "nothing ran, nothing was replayed to the intruder"
        # and deleting that thread leaves the namespace's entries alone
        await saver.adelete_thread("ns:billing")
        assert len([e for e in await saver.alist_entries("tenant-a")]) == 1


@pytest.mark.parametrize("namespace", ["bill'ing", "bill\x00ing", "x" * 10240])
async def test_hostile_namespace_names(db: Db, namespace: str) -> None:
    """Named namespaces with quotes / NUL / 10 KB: shared correctly, or a typed error
    before the tool runs."""
    effects = Counter()
    async with db.open() as saver:
        await seed(saver)
        node = IdempotentToolNode([charge_tool(effects, "N")], namespace=namespace)
        try:
            first = await run_charge(saver, node, "A", "c1")
        except IdemSaverError:
            assert len(effects) == 0
        else:
            assert first == "N charged 5"
            again = IdempotentToolNode([charge_tool(effects, "M")], namespace=namespace)
            assert await run_charge(saver, again, "B", "c1") == "N charged 5"
            assert len(effects) == 1
        await assert_seed_intact(saver)


async def test_checkpoint_blob_disagreeing_with_its_row_is_corrupt_record(db: Db) -> None:
    """A checkpoint blob that decodes fine but whose channel_versions no longer name the
    row's channels (a blob swapped from another checkpoint): CorruptRecordError, never a
    raw KeyError."""
    async with db.open() as saver:
        await seed(saver)
        empty = await put_plain(saver, "donor")
        values = {"v": 1}
        versions = {"v": saver.get_next_version(None, None)}
        cp = generate_checkpoint(channel_values=values, channel_versions=versions)
        await saver.aput(cfg("victim"), cp, {"step": 1}, versions)
    rows = await db.query(
        "SELECT checkpoint FROM idem_checkpoints WHERE checkpoint_id = ?",
        (empty["configurable"]["checkpoint_id"],),
    )
    await db.execute(
        "UPDATE idem_checkpoints SET checkpoint = ? WHERE thread_id = 'victim'", (rows[0][0],)
    )
    async with db.open() as saver:
        try:
            tup = await saver.aget_tuple(cfg("victim"))
        except CorruptRecordError as exc:
            assert exc.location["thread_id"] == "victim"
        else:
            assert tup is not None
        await assert_seed_intact(saver)


# ------------------------------------------------------------------- lone surrogates
#
# Any str a user stores comes back exactly (LangGraph's serializer alone would store
# "\ud800" as "?"), or is refused with a typed error before anything is written.

SURROGATE_VALUES: dict[str, Any] = {
    "messages": [
        HumanMessage("hi \ud800 there", id="h1"),
        AIMessage(
            "",
            id="a1",
            tool_calls=[
                {"name": "echo", "args": {"p": "\udfff"}, "id": "call-1", "type": "tool_call"}
            ],
        ),
        ToolMessage("done \udc80", tool_call_id="call-1", artifact={"\ud800": ["\udbff"]}),
    ],
    "text": "lone \ud800 high, \udfff low, and é",
    "keyed": {"\ud800": 1, "ok": {"\udfff": ["\ud83d\ude00"]}},
    "pair_as_two_code_points": "\ud83d\ude00",
    "plain": {"ascii": [1, 2.5, None, True]},
}


async def put_surrogates(saver: Any, thread: str = "s") -> Any:
    versions = {ch: saver.get_next_version(None, None) for ch in SURROGATE_VALUES}
    cp = generate_checkpoint(channel_values=SURROGATE_VALUES, channel_versions=versions)
    return await saver.aput(cfg(thread), cp, {"source": "input", "step": 0}, versions)


async def test_lone_surrogates_in_checkpoint_values_round_trip(db: Db) -> None:
    async with db.open() as saver:
        await seed(saver)
        stored = await put_surrogates(saver)
        # a second checkpoint appending to the message list (stored as a delta)
        more = [*SURROGATE_VALUES["messages"], HumanMessage("again \udfff", id="h2")]
        first = await saver.aget_tuple(stored)
        assert first is not None
        old_versions = first.checkpoint["channel_versions"]
        versions = {"messages": saver.get_next_version(old_versions["messages"], None)}
        cp = generate_checkpoint(
            channel_values={**SURROGATE_VALUES, "messages": more},
            channel_versions={**old_versions, **versions},
        )
        second = await saver.aput(stored, cp, {"source": "loop", "step": 1}, versions)
    async with db.open() as saver:  # a fresh saver: nothing cached
        first = await saver.aget_tuple(stored)
        assert first is not None
        assert first.checkpoint["channel_values"] == SURROGATE_VALUES
        latest = await saver.aget_tuple(cfg("s"))
        assert latest is not None and latest.config == second
        assert latest.checkpoint["channel_values"]["messages"] == more
        listed = [t.checkpoint["channel_values"] async for t in saver.alist(cfg("s"))]
        assert listed == [{**SURROGATE_VALUES, "messages": more}, SURROGATE_VALUES]
        await assert_seed_intact(saver)
    types = {t.removeprefix("zlib:") for (t,) in await db.query("SELECT type FROM idem_blobs")}
    assert LOSSLESS_TYPE in types, "values with surrogates use the lossless format"
    assert "msgpack" in types, "the others keep LangGraph's format"


def test_the_lossless_serializer_keeps_langgraphs_bytes_for_ordinary_values() -> None:
    """The hot path is LangGraph's own encoding: byte-identical output, same type."""
    ours, theirs = LosslessJsonPlusSerializer(), JsonPlusSerializer()
    for value in (
        {"plain": SURROGATE_VALUES["plain"]},
        [HumanMessage("no surrogates: é 😀", id="x")],
        "text",
        {"n": 1, "nested": {"a": ("t", 2)}},
    ):
        assert ours.dumps_typed(value) == theirs.dumps_typed(value)
        assert ours.loads_typed(theirs.dumps_typed(value)) == theirs.loads_typed(
            theirs.dumps_typed(value)
        )
    # and LangGraph's serializer changes what ours keeps
    assert theirs.loads_typed(theirs.dumps_typed("a\ud800")) == "a?"
    assert ours.loads_typed(ours.dumps_typed("a\ud800")) == "a\ud800"
    assert ours.dumps_typed("a\ud800")[0] == LOSSLESS_TYPE


async def test_lone_surrogates_with_encryption_and_allowlist_copies(db: Db) -> None:
    """An EncryptedSerializer around JsonPlusSerializer stores surrogates exactly too, and
    LangGraph's ``with_allowlist`` keeps the lossless variant."""
    serde = EncryptedSerializer.from_pycryptodome_aes(key=b"0123456789abcdef")
    async with db.open(serde=serde) as saver:
        assert isinstance(saver.serde, EncryptedSerializer)
        assert isinstance(saver.serde.serde, LosslessJsonPlusSerializer)
        stored = await put_surrogates(saver)
        tup = await saver.aget_tuple(stored)
        assert tup is not None and tup.checkpoint["channel_values"] == SURROGATE_VALUES
    async with db.open() as saver:
        saver.serde = JsonPlusSerializer(allowed_msgpack_modules=None)  # set after init
        assert isinstance(saver.serde, LosslessJsonPlusSerializer)
        clone = saver.with_allowlist([("my_app.models", "Invoice")])
        assert isinstance(clone.serde, LosslessJsonPlusSerializer)
        assert clone.serde.loads_typed(clone.serde.dumps_typed(["\ud800"])) == ["\ud800"]


async def test_strict_allowlist_applies_to_the_lossless_format(db: Db, tmp_path: Path) -> None:
    """A value stored in the lossless format is revived by LangGraph's own rules: under
    strict msgpack a non-allowlisted type is not constructed."""
    tripwire = tmp_path / "tripped"
    values = {"v": {"t": Tripwire(str(tripwire)), "s": "\ud800"}}
    tripwire.unlink()  # building the value tripped it once
    async with db.open() as saver:
        stored = await put_values_with(saver, "t", values)
    async with db.open(serde=JsonPlusSerializer(allowed_msgpack_modules=None)) as saver:
        tup = await saver.aget_tuple(stored)
        assert tup is not None
        assert tup.checkpoint["channel_values"]["v"]["s"] == "\ud800"
        assert not isinstance(tup.checkpoint["channel_values"]["v"]["t"], Tripwire)
        assert not tripwire.exists(), "strict mode revived a non-allowlisted type"


async def put_values_with(saver: Any, thread: str, values: dict[str, Any]) -> Any:
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    cp = generate_checkpoint(channel_values=values, channel_versions=versions)
    return await saver.aput(cfg(thread), cp, {"step": 1}, versions)


SURROGATE_METADATA: dict[str, Any] = {
    "source": "input",
    "step": 0,
    "user": "x\ud800y",
    "\udfff": ["\ud800", {"\udbff": "é"}],
    "nul": "a\x00b",  # LangGraph strips NUL from top-level strings (as its savers do)
    "nested_nul": ["a\x00b"],
    "a\x00b": "nul-key",
}


async def test_lone_surrogates_in_metadata_round_trip(db: Db) -> None:
    """Metadata comes back as LangGraph's InMemorySaver keeps it (with a serializer that
    can hold surrogate keys): surrogates exact."""
    memory: Any = InMemorySaver(serde=LosslessJsonPlusSerializer())
    async with db.open() as saver:
        await seed(saver)
        cp = generate_checkpoint()
        stored = await saver.aput(cfg("m", ns=""), cp, dict(SURROGATE_METADATA), {})
        await memory.aput(cfg("m", ns=""), cp, dict(SURROGATE_METADATA), {})
        want = (await memory.aget_tuple(cfg("m", ns=""))).metadata
        assert want["user"] == "x\ud800y" and want["\udfff"] == SURROGATE_METADATA["\udfff"]
        tup = await saver.aget_tuple(stored)
        assert tup is not None and tup.metadata == want
        [listed] = [t.metadata async for t in saver.alist(cfg("m", ns=""))]
        assert listed == want
        await assert_seed_intact(saver)


async def test_metadata_json_cannot_hold_is_serialization_error(db: Db) -> None:
    """A high surrogate directly followed by a low one (two code points) reads back
    from JSON as one character: refused before anything is written."""
    async with db.open() as saver:
        await seed(saver)
        before = await db.snapshot()
        with pytest.raises(SerializationError, match="nothing was written"):
            await saver.aput(cfg("m"), generate_checkpoint(), {"text": "\ud83d\ude00"}, {})
        assert await db.snapshot() == before
        await assert_seed_intact(saver)


async def test_lone_surrogates_in_pending_writes_round_trip(db: Db) -> None:
    async with db.open() as saver:
        stored = await seed(saver)
        writes = [("a", "w\ud800"), ("b", {"\udfff": [HumanMessage("m \udc80", id="w")]})]
        await saver.aput_writes(stored, writes, "task-2")
        tup = await saver.aget_tuple(stored)
        assert tup is not None
        assert [w for w in tup.pending_writes if w[0] == "task-2"] == [
            ("task-2", "a", "w\ud800"),
            ("task-2", "b", {"\udfff": [HumanMessage("m \udc80", id="w")]}),
        ]


@pytest.mark.parametrize(
    ("task_id", "channel", "task_path"),
    [("t\ud800", "c", ""), ("task", "c\udfff", ""), ("task", "c", "p\ud800")],
    ids=["task-id", "channel", "task-path"],
)
async def test_write_ids_with_lone_surrogates_are_config_error(
    db: Db, task_id: str, channel: str, task_path: str
) -> None:
    """Ids of writes are ids: refused like thread ids, never a raw driver error."""
    async with db.open() as saver:
        stored = await seed(saver)
        before = await db.snapshot()
        with pytest.raises(ConfigError, match="surrogate"):
            await saver.aput_writes(stored, [(channel, "v")], task_id, task_path)
        assert await db.snapshot() == before
        await assert_seed_intact(saver)


@pytest.mark.parametrize("where", ["channel", "checkpoint-id"])
async def test_checkpoint_ids_with_lone_surrogates_are_config_error(db: Db, where: str) -> None:
    """A channel name or checkpoint id a database cannot hold: ConfigError on both
    backends before anything is written, never a raw UnicodeEncodeError."""
    async with db.open() as saver:
        await seed(saver)
        before = await db.snapshot()
        values = {"c\ud800" if where == "channel" else "c": 1}
        versions = {ch: saver.get_next_version(None, None) for ch in values}
        cp = generate_checkpoint(channel_values=values, channel_versions=versions)
        if where == "checkpoint-id":
            cp["id"] = "id-\udfff"
        with pytest.raises(ConfigError, match="surrogate"):
            await saver.aput(cfg("t"), cp, {"step": 0}, versions)
        assert await db.snapshot() == before
        await assert_seed_intact(saver)


async def test_ledger_args_and_results_with_lone_surrogates_round_trip(db: Db) -> None:
    """Through the ledger API: canonical args and a result holding surrogates read back
    exactly from a fresh saver."""
    args = {"to": "\ud800@example.com", "\udfff": ["é", "\udbff"]}
    result = ToolMessage("sent \ud800", tool_call_id="call-s", artifact={"\udc80": 1})
    canon = canonical_args(args)
    intent = make_intent(
        "t", "k-s", args=canon.encode("utf-8"), args_hash=args_hash(canon), tool_call_id="call-s"
    )
    async with db.open() as saver:
        [claim] = await saver.aclaim([intent], owner="h:1:s", lease_seconds=60)
        assert claim.claimed
        type_, data = saver.serde.dumps_typed(result)
        await saver.record_outcome(
            "t", "k-s", owner="h:1:s", outcome=Outcome.completed(type_, data)
        )
    async with db.open() as saver:
        entry = await saver.aget_entry("t", "k-s")
        assert entry is not None
        assert json.loads(entry.args) == args
        assert entry.args_hash == args_hash(canonical_args(args))
        assert entry.result_type is not None and entry.result is not None
        replayed = saver.serde.loads_typed((entry.result_type, entry.result))
        assert (replayed.content, replayed.artifact) == (result.content, result.artifact)


async def test_tool_args_json_cannot_hold_are_refused_before_the_tool_runs(db: Db) -> None:
    """Arguments with a surrogate pair split into two code points cannot be stored as
    canonical JSON exactly: SerializationError, and nothing runs or is recorded."""
    effects = Counter()
    async with db.open() as saver:
        graph = tool_graph(IdempotentToolNode(echo_tools(effects)), saver)
        with pytest.raises(SerializationError, match="nothing was run"):
            await graph.ainvoke(
                {"messages": [ai_calls(("echo", {"payload": "\ud83d\ude00"}, "call-p"))]},
                cfg("t"),
                durability="sync",
            )
        assert len(effects) == 0
        assert await saver.alist_entries("t") == []


@pytest.mark.parametrize(
    "flt",
    [
        {"\ud800": []},  # what CI once hit on SQLite: a raw UnicodeEncodeError
        {"\ud800": None},
        {"\udfff": ["\ud800", {"\udbff": "é"}]},
        {"user": "x\ud800y"},
        {"user": "x\udfffy"},
        {"user": ["x\ud800y"]},
        {"user": {"\ud800": 1}},
        {"\ud800\x00": "x"},
        {"nul": "a\x00b"},
        {"nul": "ab"},
        {"nested_nul": ["a\x00b"]},
        {"nested_nul": ["ab"]},
        {"a\x00b": "nul-key"},
        {"a": "nul-key"},
        {"source": "input", "\udfff": ["\ud800", {"\udbff": "é"}]},
        {"\ud83d\ude00": "pair"},
    ],
)
async def test_filters_with_surrogates_and_nul_match_like_in_memory(
    db: Db, flt: dict[str, Any]
) -> None:
    """Filter keys and values no SQL text can hold are matched exactly (by the Python
    check on the stored metadata, which holds them): what InMemorySaver matches, never
    a driver error, on both backends. (The reference keeps its metadata with our lossless
    serializer: LangGraph's would refuse the surrogate keys.)"""
    memory: Any = InMemorySaver(serde=LosslessJsonPlusSerializer())
    metadatas: list[dict[str, Any]] = [SURROGATE_METADATA, {"source": "loop", "user": "x?y"}, {}]
    async with db.open() as saver:
        for i, md in enumerate(metadatas):
            cp = generate_checkpoint()
            await saver.aput(cfg(f"f{i}", ns=""), cp, {**md, "i": i}, {})
            await memory.aput(cfg(f"f{i}", ns=""), cp, {**md, "i": i}, {})
        before = await db.snapshot()
        want = sorted([t.metadata["i"] async for t in memory.alist(None, filter=flt)])
        got = sorted([t.metadata["i"] async for t in saver.alist(None, filter=flt)])
        assert got == want
        got_one = [
            t.metadata["i"] async for t in saver.alist(cfg("f0", ns=""), filter=flt, limit=1)
        ]
        assert got_one == [i for i in want if i == 0]
        assert await db.snapshot() == before
