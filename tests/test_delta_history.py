"""``aget_delta_channel_history``: our one-round-trip walk against LangGraph's own.

LangGraph (>= 1.2) calls ``get_delta_channel_history`` whenever it loads a thread that
uses a ``DeltaChannel``: per channel, the writes on the parent chain since the nearest
ancestor storing the channel's value, and that value (the ``seed``). The inherited
default walks the chain with one ``aget_tuple`` per ancestor; both savers override it
with a recursive query. These tests hold the override to the default's exact answer:

* a differential test on seeded random checkpoint forests (forks, snapshots, plain and
  list-delta seeds, missing seeds, parents that are gone, namespaces, duplicate and
  unknown channel names, special writes, empty write batches), ours vs
  ``BaseCheckpointSaver.aget_delta_channel_history(saver, ...)`` called explicitly;
* real ``DeltaChannel`` graphs, observed exactly as on ``InMemorySaver``, across
  resume, interrupts, time travel, ``update_state`` forks, ``copy_thread`` and
  ``prune(keep_latest)``, async and sync;
* the cost: the number of statements and round trips does not grow with the chain,
  and ``aget_tuple`` is never called.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Annotated, Any

import pytest
from delta_extend import extend
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.serde.types import _DeltaSnapshot
from langgraph.graph import END, START, StateGraph
from langgraph.types import StateSnapshot
from tool_node_helpers import cfg
from typing_extensions import TypedDict

# --------------------------------------------------------------------------- helpers


def config_of(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> dict[str, Any]:
    configurable: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable}


async def reference(saver: Any, config: Any, channels: Sequence[str]) -> Any:
    """LangGraph's default implementation, run against the same saver."""
    return await BaseCheckpointSaver.aget_delta_channel_history(
        saver, config=config, channels=channels
    )


def assert_same(ours: Any, expected: Any, where: str) -> None:
    assert list(ours) == list(expected), where
    assert {k: dict(v) for k, v in ours.items()} == {k: dict(v) for k, v in expected.items()}, where


# --------------------------------------------------------------------------- random forests

CHANNELS = ("messages", "files", "count", "notes")
WRITE_CHANNELS = (*CHANNELS, "__error__", "branch:to:agent")
ASKED = (*CHANNELS, "__error__", "never_written")
TASK_PATHS = (
    "",
    "~__pregel_pull, agent",
    "~__pregel_pull, tools",
    "~__pregel_push, ('~__pregel_pull', 'agent'), 0, False",
)


class RandomThread:
    """One namespace of a thread, built checkpoint by checkpoint from a seeded rng.

    Parents: mostly the previous checkpoint, sometimes an older one (a fork), a new root,
    or an id that is not stored (a pruned parent). Each checkpoint bumps some channels:
    with no stored value (a DeltaChannel step), a ``_DeltaSnapshot``, a list extending
    the channel's previous list (stored as a list delta), or a plain value, ``None``
    included; the others keep their parent's version, hence its stored value. Some
    checkpoints get task writes (several tasks and task paths, repeated task ids,
    special channels, empty batches). Ids are mostly uuid6, sometimes random, so a
    parent's id can sort after its child's.
    """

    def __init__(self, saver: Any, rng: random.Random, thread_id: str, ns: str) -> None:
        self.saver = saver
        self.rng = rng
        self.thread_id = thread_id
        self.ns = ns
        self.ids: list[str] = []
        self.versions: dict[str, dict[str, Any]] = {}
        self.lists: dict[str, list[str]] = {}
        self.task_ids = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(4)]
        self.n = 0
        self.shapes = {"forks": 0, "gone_parents": 0}

    def _value(self, ch: str) -> tuple[bool, Any]:
        r = self.rng.random()
        if ch == "messages" and r > 0.5:  # runs of growing lists: list-delta seeds
            r = 0.7
        self.n += 1
        if r < 0.45:
            return False, None
        if r < 0.65:
            return True, _DeltaSnapshot([f"{ch}-snap-{self.n}"])
        if r < 0.85:
            grown = [*self.lists.get(ch, []), f"{ch}-{self.n}"]
            self.lists[ch] = grown
            return True, grown
        if r < 0.95:
            return True, self.rng.choice([self.n, f"{ch}={self.n}", {"n": self.n}])
        return True, None

    def _write_value(self) -> Any:
        self.n += 1
        return self.rng.choice([[f"w{self.n}"], f"w{self.n}", self.n, {"w": self.n}, None])

    async def add(self) -> str:
        rng = self.rng
        if not self.ids or rng.random() < 0.06:
            parent = None
        elif rng.random() < 0.05:
            parent = f"gone-{rng.getrandbits(32)}"
            self.shapes["gone_parents"] += 1
        elif rng.random() < 0.7:
            parent = self.ids[-1]
        else:
            parent = rng.choice(self.ids)
            self.shapes["forks"] += parent != self.ids[-1]
        if rng.random() < 0.85:
            checkpoint_id = str(uuid6(clock_seq=len(self.ids)))
        else:
            checkpoint_id = str(uuid.UUID(int=rng.getrandbits(128)))
        versions = dict(self.versions.get(parent or "", {}))
        values: dict[str, Any] = {}
        new_versions: dict[str, Any] = {}
        for ch in CHANNELS:
            if rng.random() < 0.5:
                versions[ch] = new_versions[ch] = self.saver.get_next_version(
                    versions.get(ch), None
                )
                present, value = self._value(ch)
                if present:
                    values[ch] = value
        checkpoint = {
            **empty_checkpoint(),
            "id": checkpoint_id,
            "channel_values": values,
            "channel_versions": versions,
        }
        await self.saver.aput(
            config_of(self.thread_id, self.ns, parent),
            checkpoint,
            {"source": "loop", "step": len(self.ids), "parents": {}},
            new_versions,
        )
        self.ids.append(checkpoint_id)
        self.versions[checkpoint_id] = versions
        for _ in range(rng.choice((0, 1, 1, 2, 3))):
            writes = [
                (rng.choice(WRITE_CHANNELS), self._write_value())
                for _ in range(rng.choice((0, 1, 1, 2, 3)))
            ]
            await self.saver.aput_writes(
                config_of(self.thread_id, self.ns, checkpoint_id),
                writes,
                rng.choice(self.task_ids),
                rng.choice(TASK_PATHS),
            )
        return checkpoint_id


async def test_matches_reference_walk_on_random_forests(saver: Any) -> None:
    """Ours == LangGraph's default, on every kind of chain the generator makes."""
    rng = random.Random(20260514)
    tally = {"calls": 0, "seeds": 0, "unseeded": 0, "writes": 0, "forks": 0, "gone_parents": 0}
    for case in range(20):
        thread_id = f"forest-{case}"
        threads = [RandomThread(saver, rng, thread_id, ns) for ns in ("", "child:1")]
        for _ in range(rng.randint(2, 24)):
            await rng.choice(threads).add()
        for t in threads:
            for shape, count in t.shapes.items():
                tally[shape] += count
            targets: list[str | None] = [None, "no-such-checkpoint"]
            targets += rng.sample(t.ids, min(5, len(t.ids)))
            for target in targets:
                channels = rng.sample(ASKED, rng.randint(0, 4))
                if channels and rng.random() < 0.2:
                    channels.append(channels[0])  # a duplicate name
                config = config_of(thread_id, t.ns, target)
                ours = await saver.aget_delta_channel_history(config=config, channels=channels)
                expected = await reference(saver, config, channels)
                assert_same(ours, expected, f"case {case} ns {t.ns!r} target {target}")
                tally["calls"] += 1
                for entry in expected.values():
                    tally["seeds" if "seed" in entry else "unseeded"] += 1
                    tally["writes"] += len(entry["writes"])
    # the generator really produced every situation
    assert tally["calls"] > 150, tally
    assert min(tally.values()) > 0, tally


async def test_target_without_id_missing_thread_and_no_channels(saver: Any) -> None:
    """The edges the default defines: no channels -> {}; an unknown thread or target ->
    every channel with no writes and no seed; no checkpoint_id -> the latest."""
    assert await saver.aget_delta_channel_history(config=config_of("nobody"), channels=[]) == {}
    got = await saver.aget_delta_channel_history(config=config_of("nobody"), channels=["a", "b"])
    assert got == {"a": {"writes": []}, "b": {"writes": []}}
    ids = await build_linear(saver, "lin", 4)
    latest = await saver.aget_delta_channel_history(config=config_of("lin"), channels=["messages"])
    by_id = await saver.aget_delta_channel_history(
        config=config_of("lin", "", ids[-1]), channels=["messages"]
    )
    assert latest == by_id
    assert latest["messages"]["seed"] == _DeltaSnapshot(["m0"])
    assert [w[2] for w in latest["messages"]["writes"]] == [["m1"], ["m2"], ["m3"]]


ODD_NAMES = ("é-messages", 'say "hi"', "back\\slash", "dot.ted[0]", "日本", "$.x", "")


async def test_odd_channel_names(saver: Any, backend: str) -> None:
    """Channel names that JSON paths, escapes and collations could trip on: non-ASCII,
    quotes, backslashes, path syntax, the empty name."""
    versions: dict[str, Any] = {}
    parent = None
    ids = []
    for i in range(6):
        new = {ch: saver.get_next_version(versions.get(ch), None) for ch in ODD_NAMES}
        versions = {**versions, **new}
        values = {ch: _DeltaSnapshot([ch, i]) for ch in ODD_NAMES if (i + len(ch)) % 4 == 0}
        checkpoint_id = str(uuid6(clock_seq=i))
        checkpoint = {
            **empty_checkpoint(),
            "id": checkpoint_id,
            "channel_values": values,
            "channel_versions": versions,
        }
        await saver.aput(config_of("odd", "", parent), checkpoint, {"step": i}, new)
        await saver.aput_writes(
            config_of("odd", "", checkpoint_id),
            [(ch, [ch, i]) for ch in ODD_NAMES],
            str(uuid.UUID(int=i)),
            f"~__pregel_pull, {ODD_NAMES[i]}",
        )
        parent = checkpoint_id
        ids.append(checkpoint_id)
    asked = [*ODD_NAMES, "plain", "lone \udc80 surrogate"]  # the last: nothing can store it
    if backend == "sqlite":  # SQLite stores a NUL in a name (PostgreSQL refuses it)
        await saver.aput_writes(config_of("odd", "", ids[-2]), [("nul\x00name", 1)], "t", "")
        asked.append("nul\x00name")
    config = config_of("odd")
    got = await saver.aget_delta_channel_history(config=config, channels=asked)
    assert_same(got, await reference(saver, config, asked), "odd names")
    assert sum("seed" in entry for entry in got.values()) >= 4
    assert all(got[ch]["writes"] for ch in ODD_NAMES)
    assert got["lone \udc80 surrogate"] == {"writes": []}
    if backend == "sqlite":
        assert [w[2] for w in got["nul\x00name"]["writes"]] == [1]


async def test_a_chain_that_loops_ends(saver: Any) -> None:
    """Re-putting a checkpoint under its own descendant (``aput`` replaces by id) makes
    the parent chain a loop; the default walk would never return. Ours stops where the
    chain repeats, with the writes of each checkpoint walked once."""
    ids = await build_linear(saver, "looped", 3)  # root <- middle <- head
    versions = {"messages": saver.get_next_version("9", None)}
    root = {**empty_checkpoint(), "id": ids[0], "channel_values": {}, "channel_versions": versions}
    # the root, now without its snapshot, re-put as a child of the head: a loop
    await saver.aput(config_of("looped", "", ids[2]), root, {"step": 3}, dict(versions))
    for target in (ids[2], ids[1]):
        got = await asyncio.wait_for(
            saver.aget_delta_channel_history(
                config=config_of("looped", "", target), channels=["messages", "other"]
            ),
            timeout=30,
        )
        assert "seed" not in got["messages"] and "seed" not in got["other"]
        walked = [ids[1], ids[0], ids[2]] if target == ids[2] else [ids[0], ids[2]]
        # oldest first: the walk's ancestors reversed (the head has no writes)
        expected = [[f"m{ids.index(c) + 1}"] for c in reversed(walked) if c != ids[2]]
        assert [w[2] for w in got["messages"]["writes"]] == expected, target


# --------------------------------------------------------------------------- cost


async def build_linear(saver: Any, thread_id: str, n: int) -> list[str]:
    """A DeltaChannel-shaped chain of n checkpoints: the root stores a ``_DeltaSnapshot``
    of ``messages``, every later one bumps its version without storing a value; each
    checkpoint has one task's write to it, and ``other`` has no value anywhere."""
    ids: list[str] = []
    versions: dict[str, Any] = {}
    for i in range(n):
        versions = {
            "messages": saver.get_next_version(versions.get("messages"), None),
            "other": saver.get_next_version(versions.get("other"), None),
        }
        values = {"messages": _DeltaSnapshot(["m0"])} if i == 0 else {}
        checkpoint: dict[str, Any] = {
            **empty_checkpoint(),
            "id": str(uuid6(clock_seq=i)),
            "channel_values": values,
            "channel_versions": versions,
        }
        parent = ids[-1] if ids else None
        await saver.aput(config_of(thread_id, "", parent), checkpoint, {"step": i}, dict(versions))
        ids.append(checkpoint["id"])
        if i < n - 1:  # the head's writes are pending for the next step: not history
            await saver.aput_writes(
                config_of(thread_id, "", checkpoint["id"]),
                [("messages", [f"m{i + 1}"]), ("other", [i])],
                str(uuid.UUID(int=i)),
                "~__pregel_pull, agent",
            )
    return ids


@asynccontextmanager
async def counting(
    saver: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[dict[str, list[str]]]:
    """Count the statements the database runs and the round trips (SQLite: hand-offs to
    the aiosqlite worker; Postgres: connection uses) while the block runs; fail on any
    ``aget_tuple`` (the default's per-ancestor walk)."""
    seen: dict[str, list[str]] = {"statements": [], "round_trips": []}

    async def no_get_tuple(config: Any) -> Any:
        raise AssertionError(f"aget_tuple({config}) called")

    monkeypatch.setattr(saver, "aget_tuple", no_get_tuple)
    if backend == "sqlite":
        call = saver._call

        async def counted_call(fn: Any) -> Any:
            seen["round_trips"].append("call")
            return await call(fn)

        await call(lambda conn: conn.set_trace_callback(seen["statements"].append))
        monkeypatch.setattr(saver, "_call", counted_call)
        try:
            yield seen
        finally:
            monkeypatch.setattr(saver, "_call", call)
            await call(lambda conn: conn.set_trace_callback(None))
    else:
        import psycopg

        execute = psycopg.AsyncCursor.execute
        run = saver._execute

        async def counted_execute(cur: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
            seen["statements"].append(str(query))
            return await execute(cur, query, *args, **kwargs)

        async def counted_run(fn: Any, **kwargs: Any) -> Any:
            seen["round_trips"].append("run")
            return await run(fn, **kwargs)

        monkeypatch.setattr(psycopg.AsyncCursor, "execute", counted_execute)
        monkeypatch.setattr(saver, "_execute", counted_run)
        try:
            yield seen
        finally:
            monkeypatch.setattr(psycopg.AsyncCursor, "execute", execute)
            monkeypatch.setattr(saver, "_execute", run)
    monkeypatch.undo()


async def test_statements_do_not_grow_with_the_chain(
    saver: Any, backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """5 or 150 ancestors: the same statements, the same single round trip (the
    default: one ``aget_tuple`` round trip per ancestor)."""
    counts = {}
    for n in (5, 150):
        ids = await build_linear(saver, f"chain-{n}", n)
        config = config_of(f"chain-{n}", "", ids[-1])
        expected = await reference(saver, config, ["messages", "other"])
        async with counting(saver, backend, monkeypatch) as seen:
            got = await saver.aget_delta_channel_history(
                config=config, channels=["messages", "other"]
            )
        assert_same(got, expected, f"chain of {n}")
        assert len(got["messages"]["writes"]) == n - 1
        assert "seed" not in got["other"]  # walked to the root
        counts[n] = (len(seen["statements"]), len(seen["round_trips"]))
    assert counts[5] == counts[150], counts
    statements, round_trips = counts[150]
    assert round_trips == 1
    # SQLite: BEGIN, the chain, the writes, the seed, COMMIT; Postgres: one statement
    assert statements == (5 if backend == "sqlite" else 1), counts


# --------------------------------------------------------------------------- graphs


class LoopState(TypedDict):
    # snapshots every 3rd update: most loads walk back to one
    items: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]
    # the default frequency (100) is never reached here: every load walks to the root
    log: Annotated[list[str], DeltaChannel(extend)]
    n: int


def loop_graph(checkpointer: Any, *, interrupt_before: Sequence[str] = ()) -> Any:
    """a -> (b, c in parallel: both write ``items`` in one step) -> d -> a ... until n is
    a multiple of 3: nine supersteps per invoke."""

    def a(state: LoopState) -> dict[str, Any]:
        n = state.get("n", 0)
        return {"items": [f"a{n}"], "n": n + 1}

    def b(state: LoopState) -> dict[str, Any]:
        return {"items": [f"b{state['n']}"], "log": [f"b{state['n']}"]}

    def c(state: LoopState) -> dict[str, Any]:
        return {"items": [f"c{state['n']}:{len(state['items'])}"]}

    def d(state: LoopState) -> dict[str, Any]:
        return {"log": [f"d{state['n']}:{len(state['log'])}"]}

    builder = StateGraph(LoopState)
    for name, fn in (("a", a), ("b", b), ("c", c), ("d", d)):
        builder.add_node(name, fn)
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("a", "c")
    # two edges, not a join (["b", "c"] -> "d"): a join's `next` in get_state_history
    # differs between InMemorySaver and SQLite savers, LangGraph's own included, with or
    # without a DeltaChannel (not what this file tests)
    builder.add_edge("b", "d")
    builder.add_edge("c", "d")
    builder.add_conditional_edges("d", lambda s: "a" if s["n"] % 3 else END, ["a", END])
    return builder.compile(checkpointer=checkpointer, interrupt_before=list(interrupt_before))


def snap(s: StateSnapshot) -> dict[str, Any]:
    metadata = s.metadata or {}
    return {
        "values": s.values,
        "next": s.next,
        "step": metadata.get("step"),
        "source": metadata.get("source"),
    }


async def state_and_history(graph: Any, config: dict[str, Any]) -> dict[str, Any]:
    return {
        "state": snap(await graph.aget_state(config)),
        "history": [snap(s) async for s in graph.aget_state_history(config)],
    }


async def loop_flow(checkpointer: Any) -> dict[str, Any]:
    """Three invokes (each resumes from the latest checkpoint), then time travel: a
    replay from an older checkpoint and an ``update_state`` fork, each run on."""
    graph = loop_graph(checkpointer)
    config = cfg("loop")
    outs = [await graph.ainvoke({"items": [f"in{i}"], "log": [f"in{i}"]}, config) for i in range(3)]
    seen = await state_and_history(graph, config)
    history = [s async for s in graph.aget_state_history(config)]
    # replay from a mid-run checkpoint of the second invoke (its next node runs again)
    old = next(s for s in history[len(history) // 2 :] if s.next)
    replayed = await graph.ainvoke(None, old.config)
    after_replay = await state_and_history(graph, config)
    # fork an older checkpoint by editing its state, then run on from the edit
    older = next(s for s in history[-len(history) // 4 :] if s.next)
    forked = await graph.aupdate_state(older.config, {"items": ["edited"], "log": ["edited"]})
    fork_out = await graph.ainvoke(None, forked)
    after_fork = await state_and_history(graph, config)
    return {
        "outs": outs,
        "seen": seen,
        "replayed": replayed,
        "after_replay": after_replay,
        "fork_out": fork_out,
        "after_fork": after_fork,
    }


async def test_delta_graph_resume_and_time_travel_match_in_memory(saver: Any) -> None:
    ours = await loop_flow(saver)
    assert ours == await loop_flow(InMemorySaver())
    # and the values are what the graph means (not a bug shared by both)
    first = ours["outs"][0]
    assert first["items"][:4] == ["in0", "a0", "b1", "c1:2"]  # b and c see a's step
    assert first["n"] == 3 and len(first["items"]) == 1 + 3 * 3
    assert ours["outs"][2]["n"] == 9
    assert "edited" in ours["fork_out"]["items"] and "edited" in ours["fork_out"]["log"]
    assert len(ours["seen"]["history"]) >= 27


async def test_delta_graph_interrupt_and_resume_match_in_memory(saver: Any) -> None:
    async def flow(checkpointer: Any) -> list[Any]:
        graph = loop_graph(checkpointer, interrupt_before=["d"])
        config = cfg("paused")
        steps = [{"items": ["in"], "log": ["in"]}, None, None, None, {"items": ["again"]}, None]
        out = []
        for step in steps:  # each run pauses before d (after n reached 3, d ends the run)
            out.append((await graph.ainvoke(step, config), snap(await graph.aget_state(config))))
        return out

    ours = await flow(saver)
    assert ours == await flow(InMemorySaver())
    assert [(s["next"], s["values"]["n"]) for _, s in ours] == [
        (("d",), 1), (("d",), 2), (("d",), 3), ((), 3), (("d",), 4), (("d",), 5),
    ]  # fmt: skip


async def test_sync_get_state_from_a_worker_thread(saver: Any) -> None:
    """``graph.get_state`` / ``invoke`` in a worker thread use the sync bridge."""
    graph = loop_graph(saver)
    config = cfg("sync")
    await graph.ainvoke({"items": ["in"], "log": ["in"]}, config)
    state = await asyncio.to_thread(graph.get_state, config)
    assert state.values == (await graph.aget_state(config)).values
    out = await asyncio.to_thread(graph.invoke, {"items": ["more"], "log": []}, config)
    reference_graph = loop_graph(InMemorySaver())
    await reference_graph.ainvoke({"items": ["in"], "log": ["in"]}, config)
    assert out == await reference_graph.ainvoke({"items": ["more"], "log": []}, config)
    head = (await saver.aget_tuple(config)).config
    sync = await asyncio.to_thread(
        lambda: saver.get_delta_channel_history(config=head, channels=["items", "log"])
    )
    assert sync == await saver.aget_delta_channel_history(config=head, channels=["items", "log"])


async def test_copy_thread_and_prune_keep_delta_state(saver: Any) -> None:
    """After time travel, ``copy_thread`` and ``prune(keep_latest)`` leave the thread's
    state, its history call at the head and its future exactly as they were (the
    unpruned ``InMemorySaver`` run is the reference)."""
    ref = InMemorySaver()
    await loop_flow(saver)
    await loop_flow(ref)
    graph, ref_graph = loop_graph(saver), loop_graph(ref)
    want = snap(await ref_graph.aget_state(cfg("loop")))
    head = (await saver.aget_tuple(cfg("loop"))).config
    before = await saver.aget_delta_channel_history(config=head, channels=["items", "log"])

    await saver.acopy_thread("loop", "copy")
    assert snap(await graph.aget_state(cfg("copy"))) == want
    await saver.aprune(["loop"], strategy="keep_latest")
    assert snap(await graph.aget_state(cfg("loop"))) == want
    after = await saver.aget_delta_channel_history(config=head, channels=["items", "log"])
    assert after == before
    assert_same(after, await reference(saver, head, ["items", "log"]), "pruned head")
    # pruning did delete: far fewer checkpoints than the history had
    kept = [t async for t in saver.alist(cfg("loop"))]
    assert 1 < len(kept) < len([t async for t in saver.alist(cfg("copy"))])

    more = {"items": ["more"], "log": ["more"]}
    expected = await ref_graph.ainvoke(more, cfg("loop"))
    assert await graph.ainvoke(more, cfg("loop")) == expected
    assert await graph.ainvoke(more, cfg("copy")) == expected
    # prune the copy too after it moved on; then both go on alike
    await saver.aprune(["copy"], strategy="keep_latest")
    expected = await ref_graph.ainvoke(more, cfg("loop"))
    assert await graph.ainvoke(more, cfg("copy")) == expected
    assert await graph.ainvoke(more, cfg("loop")) == expected


def parent_graph(checkpointer: Any) -> Any:
    """The loop graph as a subgraph: its checkpoints live in a child namespace."""
    builder = StateGraph(LoopState)
    builder.add_node("sub", loop_graph(None))
    builder.add_edge(START, "sub")
    builder.add_edge("sub", END)
    return builder.compile(checkpointer=checkpointer)


@pytest.mark.parametrize("durability", ["exit", "async", "sync"])
async def test_delta_subgraph_and_prune_under_each_durability(saver: Any, durability: str) -> None:
    """A DeltaChannel graph inside a subgraph, under each durability mode (``exit``
    stores one checkpoint per run): the same as ``InMemorySaver``, before and after
    ``prune(keep_latest)``, and on the run after the prune."""

    async def flow(checkpointer: Any) -> list[Any]:
        graph = parent_graph(checkpointer)
        return [
            await graph.ainvoke(
                {"items": [f"in{i}"], "log": [f"in{i}"]}, cfg("p"), durability=durability
            )
            for i in range(3)
        ]

    ref = InMemorySaver()
    assert await flow(saver) == await flow(ref)
    graph, ref_graph = parent_graph(saver), parent_graph(ref)
    want = (await ref_graph.aget_state(cfg("p"), subgraphs=True)).values
    await saver.aprune(["p"], strategy="keep_latest")
    assert (await graph.aget_state(cfg("p"), subgraphs=True)).values == want
    more = {"items": ["more"], "log": ["more"]}
    expected = await ref_graph.ainvoke(more, cfg("p"), durability=durability)
    assert await graph.ainvoke(more, cfg("p"), durability=durability) == expected
