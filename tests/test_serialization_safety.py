"""Serialization safety, on both backends: no pickle, no JSON-constructor path, LangGraph's
strict msgpack allowlist honoured for checkpoints *and* ledger results, and
``EncryptedSerializer`` keeping plaintext out of the database (ledger included).

Stored rows are planted or inspected behind the saver's back (``fault_child.Db``).
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fault_child import Db, Secret, Tripwire
from langchain_core.messages import ToolMessage
from langchain_core.tools import tool
from langgraph.checkpoint.conformance.test_utils import generate_checkpoint
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from tool_node_helpers import (
    Counter,
    ai_calls,
    cfg,
    intent_for,
    plant_completed,
    rerun_tool_step,
    tool_graph,
)

from langgraph_idem_saver import IdempotentToolNode
from langgraph_idem_saver.errors import CorruptRecordError

CHILD = Path(__file__).with_name("fault_child.py")
SECRET_KEY = (Secret.__module__, "Secret")
TRIPWIRE_KEY = (Tripwire.__module__, "Tripwire")
MARKER = "PLAINTEXT-MARKER-7f3a9c"


def strict() -> JsonPlusSerializer:
    """What ``LANGGRAPH_STRICT_MSGPACK=true`` gives: only the built-in safe types."""
    return JsonPlusSerializer(allowed_msgpack_modules=None)


def aes(key: bytes = b"0123456789abcdef") -> EncryptedSerializer:
    return EncryptedSerializer.from_pycryptodome_aes(key=key)


async def put_values(saver: Any, thread: str, values: dict[str, Any]) -> Any:
    versions = {ch: saver.get_next_version(None, None) for ch in values}
    cp = generate_checkpoint(channel_values=values, channel_versions=versions)
    return await saver.aput(cfg(thread), cp, {"step": 1}, versions)


def secret_tools(effects: Counter) -> list[Any]:
    @tool(response_format="content_and_artifact")
    def fetch(name: str) -> tuple[str, Any]:
        """Fetch a secret (a side effect)."""
        effects.bump(name)
        return f"fetched {name} {MARKER}-result", Secret(f"{MARKER}-artifact")

    @tool
    def refuse(name: str) -> str:
        """Always fails, with sensitive text in the error."""
        effects.bump(name)
        raise ValueError(f"card declined {MARKER}-error")

    return [fetch, refuse]


async def run_fetch(saver: Any, effects: Counter, thread: str = "t", **node_kw: Any) -> Any:
    graph = tool_graph(IdempotentToolNode(secret_tools(effects), **node_kw), saver)
    out = await graph.ainvoke(
        {"messages": [ai_calls(("fetch", {"name": "s1"}, "call-1"))]},
        cfg(thread),
        durability="sync",
    )
    return graph, out["messages"][-1]


# ----------------------------------------------------------------------------- no pickle


async def test_unserializable_values_are_refused_never_pickled(db: Db) -> None:
    async with db.open() as saver:
        assert getattr(saver.serde, "pickle_fallback", False) is False
        before = await db.snapshot()
        with pytest.raises(TypeError):
            await put_values(saver, "t", {"bad": object()})
        assert await db.snapshot() == before
        await put_values(saver, "ok", {"fine": {"a": [1, 2]}})
    types = await db.query("SELECT type FROM idem_checkpoints")
    types += await db.query("SELECT type FROM idem_blobs")
    types += await db.query("SELECT result_type FROM idem_tool_calls")
    assert all("pickle" not in (t or "") for (t,) in types)


class Evil:
    """Unpickling this creates a file: proof that pickle ran."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> Any:
        return (open, (self.path, "w"))


async def test_planted_pickle_rows_are_never_unpickled(db: Db, tmp_path: Path) -> None:
    marker = tmp_path / "pickle-ran"
    payload = pickle.dumps(Evil(str(marker)))
    effects = Counter()
    async with db.open() as saver:
        graph, _ = await run_fetch(saver, effects)
        await put_values(saver, "victim", {"v": 1})
    await db.execute(
        "UPDATE idem_checkpoints SET type = 'pickle', checkpoint = ? WHERE thread_id = 'victim'",
        (payload,),
    )
    await db.execute("UPDATE idem_tool_calls SET result_type = 'pickle', result = ?", (payload,))
    async with db.open() as saver:
        with pytest.raises(CorruptRecordError):
            await saver.aget_tuple(cfg("victim"))
        graph = tool_graph(IdempotentToolNode(secret_tools(effects)), saver)
        with pytest.raises(CorruptRecordError):
            await rerun_tool_step(graph, "t")
    assert not marker.exists()
    assert len(effects) == 1


async def test_json_constructor_rows_are_not_revived(db: Db, tmp_path: Path) -> None:
    """A row of type ``json`` holding an lc:2 constructor (here ``builtins.open`` creating
    a file, and our Secret) must not call it."""
    marker = tmp_path / "constructor-ran"
    opener = {
        "lc": 2,
        "type": "constructor",
        "id": ["builtins", "open"],
        "kwargs": {"file": str(marker), "mode": "w"},
    }
    secret = {"lc": 2, "type": "constructor", "id": list(SECRET_KEY), "kwargs": {"value": "x"}}
    effects = Counter()
    async with db.open() as saver:
        await run_fetch(saver, effects)
        await put_values(saver, "victim", {})
    for planted in (opener, secret):
        data = json.dumps(
            {
                "id": "x",
                "v": 4,
                "ts": "",
                "channel_versions": {},
                "versions_seen": {},
                "obj": planted,
            }
        ).encode()
        await db.execute(
            "UPDATE idem_checkpoints SET type = 'json', checkpoint = ? WHERE thread_id = 'victim'",
            (data,),
        )
        await db.execute(
            "UPDATE idem_tool_calls SET result_type = 'json', result = ?",
            (json.dumps(planted).encode(),),
        )
        async with db.open() as saver:
            try:
                tup = await saver.aget_tuple(cfg("victim"))
            except CorruptRecordError:
                pass
            else:
                assert tup is not None
                assert not isinstance(tup.checkpoint.get("obj"), Secret)  # type: ignore[call-overload]
            graph = tool_graph(IdempotentToolNode(secret_tools(effects)), saver)
            try:
                out = await rerun_tool_step(graph, "t")
            except CorruptRecordError:
                pass
            else:
                replayed = out["messages"][-1]
                assert not isinstance(getattr(replayed, "artifact", None), Secret)
        assert not marker.exists()
    assert len(effects) == 1


# ----------------------------------------------------------------------------- allowlist


async def test_strict_allowlist_for_checkpoints(db: Db) -> None:
    async with db.open(serde=strict()) as saver:
        await put_values(saver, "t", {"secret": Secret("s"), "plain": [1, 2]})
        tup = await saver.aget_tuple(cfg("t"))
        assert tup is not None
        assert not isinstance(tup.checkpoint["channel_values"]["secret"], Secret)
        assert tup.checkpoint["channel_values"]["plain"] == [1, 2]
        allowed = saver.with_allowlist([SECRET_KEY])
        assert allowed is not saver
        tup = await allowed.aget_tuple(cfg("t"))
        assert tup is not None
        assert tup.checkpoint["channel_values"]["secret"] == Secret("s")
        # the original keeps refusing
        tup = await saver.aget_tuple(cfg("t"))
        assert tup is not None and not isinstance(
            tup.checkpoint["channel_values"]["secret"], Secret
        )


FETCH_CALL = {"name": "fetch", "args": {"name": "s1"}, "id": "call-1", "type": "tool_call"}


async def replay_planted(saver: Any, ledger_saver: Any, effects: Counter, path: Path) -> Any:
    """Plant a completed entry whose result holds a Tripwire, then let the tool node
    replay it through ``saver`` (as checkpointer) / ``ledger_saver`` (as ledger)."""
    node = IdempotentToolNode(secret_tools(effects), ledger=ledger_saver)
    graph = tool_graph(node, saver)
    out = await graph.ainvoke(
        {"messages": [ai_calls(("fetch", {"name": "s1"}, "call-1"))]},
        cfg("t"),
        durability="sync",
    )
    return out["messages"][-1]


async def test_strict_allowlist_for_ledger_results(db: Db, tmp_path: Path) -> None:
    """Under strict mode a recorded result holding a non-allowlisted type is not revived
    as that type on replay (its constructor never runs); a saver derived with
    ``with_allowlist`` revives it (the positive control)."""
    effects = Counter()
    tripwire = tmp_path / "tripped"
    async with db.open(serde=strict()) as saver:
        intent = intent_for("t", FETCH_CALL, checkpoint_ns="tools:x")
        await plant_completed(saver, intent, {"planted": Tripwire(str(tripwire))})
        tripwire.unlink()  # constructing it to plant it tripped it once
        replayed = await replay_planted(saver, saver, effects, tripwire)
        assert isinstance(replayed, ToolMessage)
        assert not tripwire.exists(), "strict mode revived a non-allowlisted type"
        assert "planted" in str(replayed.content)
        allowed = saver.with_allowlist([TRIPWIRE_KEY])
        await allowed.adelete_thread("t")  # a fresh thread, same planted entry
        await plant_completed(allowed, intent, {"planted": Tripwire(str(tripwire))})
        tripwire.unlink()
        await replay_planted(allowed, allowed, effects, tripwire)
        assert tripwire.exists(), "with_allowlist did not reach the ledger's replay"
    assert len(effects) == 0


async def test_strict_msgpack_env_in_a_fresh_process(db: Db, tmp_path: Path) -> None:
    """``LANGGRAPH_STRICT_MSGPACK=true`` (read at import): LangGraph derives an allowlisted
    clone of our saver for the graph; the ledger's replay must honour strict mode too."""
    tripwire = tmp_path / "tripped-env"
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": "true"}
    spec = {
        "mode": "strict-replay",
        "backend": db.backend,
        "where": db.where,
        "tripwire": str(tripwire),
    }
    proc = subprocess.run(
        [sys.executable, str(CHILD), json.dumps(spec)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["effects"] == 0  # replayed, not run
    assert "planted" in report["replayed_content"]
    assert report["tripped"] is False, "strict mode revived a non-allowlisted ledger result"


# ----------------------------------------------------------------------------- encryption


async def test_encrypted_serializer_encrypts_checkpoints_and_ledger_results(db: Db) -> None:
    effects = Counter()
    async with db.open(serde=aes()) as saver:
        await put_values(saver, "cp", {"v": f"{MARKER}-channel"})
        graph, first = await run_fetch(saver, effects)
        out = await rerun_tool_step(graph, "t")  # replay decrypts
        assert out["messages"][-1].content == first.content
        [entry] = await saver.alist_entries("t")
        assert entry.result_type is not None and entry.result_type.endswith("+aes")
    if db.backend == "sqlite":
        await _close_wal(db)
    stored = await db.all_text()
    for what in ("channel", "result", "artifact"):
        assert f"{MARKER}-{what}" not in stored, what
    assert len(effects) == 1


async def test_encrypted_serializer_keeps_error_text_of_failed_calls_out(db: Db) -> None:
    """A failed call's result is its error ToolMessage; the ledger also keeps the error
    text in the ``error`` column, which must not be plaintext under encryption."""
    effects = Counter()
    async with db.open(serde=aes()) as saver:
        node = IdempotentToolNode(secret_tools(effects), handle_tool_errors=True)
        graph = tool_graph(node, saver)
        out = await graph.ainvoke(
            {"messages": [ai_calls(("refuse", {"name": "r"}, "call-r"))]},
            cfg("t"),
            durability="sync",
        )
        assert out["messages"][-1].status == "error"
    if db.backend == "sqlite":
        await _close_wal(db)
    assert f"{MARKER}-error" not in await db.all_text()


async def test_encrypted_serializer_keeps_tool_args_out(db: Db) -> None:
    """Arguments are part of the call's record; they are encrypted in the checkpoint
    (the AIMessage) and must not sit in plaintext in the ledger next to it."""
    effects = Counter()
    async with db.open(serde=aes()) as saver:
        graph = tool_graph(IdempotentToolNode(secret_tools(effects)), saver)
        await graph.ainvoke(
            {"messages": [ai_calls(("fetch", {"name": f"{MARKER}-arg"}, "call-a"))]},
            cfg("t"),
            durability="sync",
        )
    if db.backend == "sqlite":
        await _close_wal(db)
    assert f"{MARKER}-arg" not in await db.all_text()


async def test_wrong_key_is_corrupt_record_never_plaintext(db: Db) -> None:
    effects = Counter()
    async with db.open(serde=aes()) as saver:
        await put_values(saver, "cp", {"v": "x"})
        await run_fetch(saver, effects)
        [entry] = await saver.alist_entries("t")
    async with db.open(serde=aes(b"fedcba9876543210")) as saver:
        with pytest.raises(CorruptRecordError):
            await saver.aget_tuple(cfg("cp"))
        with pytest.raises(CorruptRecordError):  # the args are sealed with the other key
            await saver.alist_entries("t")
        graph = tool_graph(IdempotentToolNode(secret_tools(effects), ledger=saver), _Plain())
        with pytest.raises(CorruptRecordError) as info:
            await graph.ainvoke(
                {"messages": [ai_calls(("fetch", {"name": "s1"}, "call-1"))]},
                cfg("t"),
                durability="sync",
            )
        assert info.value.location["key"] == entry.key
    assert len(effects) == 1


def _Plain() -> Any:
    from langgraph.checkpoint.memory import InMemorySaver

    return InMemorySaver()


async def _close_wal(db: Db) -> None:
    """Fold the WAL into the main file so the byte scan sees one file's worth (it also
    scans the WAL itself, so this only makes the check stricter, never weaker)."""
    import sqlite3

    with sqlite3.connect(db.where) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
