"""Retention (``ttl=``, ``asweep``/``sweep``): threads idle past their TTL are deleted or
cut down to their latest checkpoint, ledger entries go only when nothing can replay them.

Ages come from the data itself: a checkpoint's id is a UUIDv6 made at a time we choose
(LangGraph's own ``UUID`` class builds it), ledger rows carry the real time they were
written, and each sweep is run ``now=`` a moment chosen relative to both. Every saver
test runs on SQLite and Postgres; the sync classes are driven through ``sweep()``.
"""

from __future__ import annotations

import asyncio
import math
import operator
import random
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Annotated, Any

import pytest
from delta_extend import extend
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import UUID, uuid6
from langgraph.graph import START, StateGraph
from pg_server import fresh_dsn
from test_prune_race import open_savers
from tool_node_helpers import intent_for
from typing_extensions import TypedDict

from langgraph_idem_saver import (
    ConfigError,
    CorruptRecordError,
    Outcome,
    SweepReport,
    TTLConfig,
)
from langgraph_idem_saver.postgres import PostgresSaver
from langgraph_idem_saver.retention import Cutoffs, checkpoint_time, first_checkpoint_id_at
from langgraph_idem_saver.sqlite import SqliteSaver

DAY = 86_400.0
NOW = time.time()
TTL = TTLConfig(after=timedelta(days=30))
_EPOCH = 0x01B21DD213814000


def made_at(ts: float) -> str:
    """A LangGraph checkpoint id (UUIDv6) made at ``ts``, random below the timestamp."""
    ticks = int(ts * 1e7) + _EPOCH
    value = ((ticks >> 12) << 80) | ((ticks & 0xFFF) << 64) | random.getrandbits(62)
    return str(UUID(int=value, version=6))


def cfg(thread_id: str, ns: str = "") -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": ns}}


def at(thread_id: str, checkpoint_id: str) -> dict[str, Any]:
    return {"configurable": {**cfg(thread_id)["configurable"], "checkpoint_id": checkpoint_id}}


async def put_thread(
    saver: Any, thread_id: str, start: float, n: int = 3, ns: str = "", pending: bool = True
) -> list[str]:
    """``n`` checkpoints made a second apart from ``start`` (a growing list channel, so
    list deltas are stored), and (``pending``) a pending write on the last; their ids."""
    parent: Any = cfg(thread_id, ns)
    items: list[str] = []
    version = None
    ids = []
    for step in range(n):
        items = [*items, f"{thread_id}:{step}"]
        version = saver.get_next_version(version, None)
        checkpoint = empty_checkpoint()
        checkpoint["id"] = made_at(start + step)
        checkpoint["channel_values"] = {"messages": items}
        checkpoint["channel_versions"] = {"messages": version}
        parent = await saver.aput(parent, checkpoint, {"step": step}, {"messages": version})
        ids.append(checkpoint["id"])
    if pending:
        await saver.aput_writes(parent, [("messages", ["pending"])], "task-1")
    return ids


async def checkpoint_ids(saver: Any, thread_id: str) -> list[str]:
    """Every namespace's, newest first."""
    every = {"configurable": {"thread_id": thread_id}}
    return [t.config["configurable"]["checkpoint_id"] async for t in saver.alist(every)]


async def settled_entry(saver: Any, thread_id: str, call_id: str, **kw: Any) -> Any:
    """A completed ledger entry of ``thread_id`` (``namespace=`` for a named one)."""
    intent = intent_for(thread_id, {"name": "charge", "args": {"n": call_id}, "id": call_id}, **kw)
    await saver.aclaim([intent], owner="me", lease_seconds=60)
    outcome = Outcome.completed("json", b"1")
    await saver.record_outcome(intent.scope, intent.key, owner="me", outcome=outcome)
    return intent


async def issued_entry(saver: Any, thread_id: str, call_id: str) -> Any:
    intent = intent_for(thread_id, {"name": "charge", "args": {"n": call_id}, "id": call_id})
    await saver.aclaim([intent], owner="me", lease_seconds=60)
    return intent


# --- threads ---------------------------------------------------------------------------


async def test_delete_sweeps_idle_threads_and_leaves_recent_ones(saver: Any) -> None:
    old = await put_thread(saver, "old", NOW - 40 * DAY)
    await put_thread(saver, "old-sub", NOW - 35 * DAY, ns="child:1")
    recent = await put_thread(saver, "recent", NOW - 2 * DAY)
    before = await saver.aget_tuple(cfg("recent"))
    assert len(old) == 3

    report = await saver.asweep(NOW, ttl=TTL)

    assert await checkpoint_ids(saver, "old") == []
    assert await checkpoint_ids(saver, "old-sub") == []
    assert await saver.aget_tuple(cfg("old")) is None
    assert await checkpoint_ids(saver, "recent") == recent[::-1]
    assert await saver.aget_tuple(cfg("recent")) == before
    assert report.threads_deleted == 2 and report.threads_pruned == 0
    assert report.checkpoints_deleted == 6 and report.writes_deleted == 2
    assert report.blobs_deleted == 6
    # nothing left to do: a second sweep removes nothing
    assert (await saver.asweep(NOW, ttl=TTL)).checkpoints_deleted == 0


async def test_keep_latest_keeps_each_namespace_head_and_its_writes(saver: Any) -> None:
    ids = await put_thread(saver, "t", NOW - 40 * DAY, n=4)
    sub = await put_thread(saver, "t", NOW - 40 * DAY + 100, n=2, ns="child:1")
    head = await saver.aget_tuple(cfg("t"))

    report = await saver.asweep(
        NOW, ttl=TTLConfig(after=timedelta(days=30), strategy="keep_latest")
    )

    assert await checkpoint_ids(saver, "t") == [sub[-1], ids[-1]]
    assert await saver.aget_tuple(cfg("t")) == head
    assert head is not None and head.pending_writes == [("task-1", "messages", ["pending"])]
    assert report.threads_pruned == 1 and report.checkpoints_deleted == 4
    assert report.writes_deleted == 0  # each namespace's pending write stays with its head
    # a thread already at its head is not pruned again
    again = await saver.asweep(NOW, ttl=TTLConfig(after=timedelta(days=30), strategy="keep_latest"))
    assert again.threads_pruned == 0 and again.checkpoints_deleted == 0


async def test_recent_ledger_activity_keeps_a_thread(saver: Any) -> None:
    """A thread whose last checkpoint is old but which claimed a call since is active."""
    await put_thread(saver, "busy", NOW - 10 * DAY)
    await issued_entry(saver, "busy", "c1")  # claimed now
    report = await saver.asweep(NOW + 60, ttl=TTLConfig(after=timedelta(days=1)))
    assert report.threads_deleted == 0
    assert len(await checkpoint_ids(saver, "busy")) == 3


async def test_ids_that_are_not_uuid6_never_expire(saver: Any) -> None:
    parent: Any = cfg("hand-made")
    for cid in ("0001", "0002"):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = cid
        parent = await saver.aput(parent, checkpoint, {}, {})
    report = await saver.asweep(NOW + 3650 * DAY, ttl=TTL)
    assert report.threads_deleted == 0
    assert await checkpoint_ids(saver, "hand-made") == ["0002", "0001"]


async def test_sweeps_in_bounded_batches(saver: Any) -> None:
    for i in range(5):
        await put_thread(saver, f"t{i}", NOW - 40 * DAY, n=1)
    report = await saver.asweep(NOW, ttl=TTLConfig(after=timedelta(days=30), batch_size=2))
    assert report.threads_deleted == 5
    assert report.batches >= 3


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
async def test_dry_run_counts_what_a_sweep_removes_and_removes_nothing(
    saver: Any, strategy: str
) -> None:
    for i in range(3):
        await put_thread(saver, f"t{i}", NOW - 40 * DAY, n=3)
    await settled_entry(saver, "gone", "c1")  # a thread with no checkpoint: removable now
    ttl = TTLConfig(after=timedelta(days=30), strategy=strategy, batch_size=2)  # type: ignore[arg-type]
    later = time.time() + 31 * DAY

    dry = await saver.asweep(later, ttl=ttl, dry_run=True)
    assert dry.dry_run and dry.checkpoints_deleted == (9 if strategy == "delete" else 6)
    assert dry.ledger_entries_deleted == 1
    for i in range(3):
        assert len(await checkpoint_ids(saver, f"t{i}")) == 3
    assert len(await saver.alist_entries("gone")) == 1

    done = await saver.asweep(later, ttl=ttl)
    assert {**dry.as_dict(), "dry_run": False} == done.as_dict()


def test_checkpoint_time_reads_langgraph_ids() -> None:
    made = checkpoint_time(str(uuid6(clock_seq=3)))
    assert made is not None and abs(made - time.time()) < 60
    assert checkpoint_time("not-a-uuid") is None
    assert checkpoint_time(str(UUID(int=12345, version=7))) is None
    assert first_checkpoint_id_at(NOW - 1) < made_at(NOW) < first_checkpoint_id_at(NOW + 1)


# --- a graph still loads and resumes after keep_latest ------------------------------------


class State(TypedDict):
    messages: Annotated[list[str], operator.add]
    log: Annotated[list[str], DeltaChannel(extend, snapshot_frequency=3)]
    n: int


def counting_graph(checkpointer: Any) -> Any:
    def step(state: State) -> dict[str, Any]:
        n = state.get("n", 0) + 1
        return {"messages": [f"m{n}"], "log": [f"l{n}"], "n": n}

    builder = StateGraph(State)
    builder.add_node("step", step)
    builder.add_edge(START, "step")
    return builder.compile(checkpointer=checkpointer)


async def test_keep_latest_thread_still_loads_and_resumes(saver: Any) -> None:
    graph = counting_graph(saver)
    config = {"configurable": {"thread_id": "g"}}
    for i in range(4):
        await graph.ainvoke({"messages": [f"in{i}"], "log": [f"in{i}"]}, config)
    state = await graph.aget_state(config)
    assert state.values["n"] == 4 and len(state.values["log"]) == 8
    # last activity is read from LangGraph's checkpoint ids (UUIDv6, made now): this
    # fails loudly if LangGraph ever mints ids of another kind
    made = checkpoint_time(state.config["configurable"]["checkpoint_id"])
    assert made is not None and abs(made - time.time()) < 600

    # checkpoints were made now: sweep as if 31 days had passed
    keep = TTLConfig(after=timedelta(days=30), strategy="keep_latest")
    report = await saver.asweep(time.time() + 31 * DAY, ttl=keep)
    assert report.threads_pruned == 1 and report.checkpoints_deleted > 0

    assert (await graph.aget_state(config)).values == state.values
    out = await graph.ainvoke({"messages": ["in4"], "log": ["in4"]}, config)
    assert out["n"] == 5
    assert out["messages"] == [*state.values["messages"], "in4", "m5"]
    assert out["log"] == [*state.values["log"], "in4", "l5"]


# --- the ledger ---------------------------------------------------------------------------


async def test_ledger_entries_kept_while_replayable_and_while_issued(saver: Any) -> None:
    await put_thread(saver, "t", NOW - 10 * DAY, pending=False)  # checkpoints alone
    done = await settled_entry(saver, "t", "c1")
    unknown = await issued_entry(saver, "t", "c2")
    later = time.time() + 2 * DAY
    keep = TTLConfig(after=timedelta(days=1), strategy="keep_latest")

    # keep_latest leaves a checkpoint that could replay both: both stay
    report = await saver.asweep(later, ttl=keep)
    assert report.threads_pruned == 1 and report.ledger_entries_deleted == 0
    assert await saver.aget_entry(done.scope, done.key) is not None

    # delete: no checkpoint left; the settled entry goes, the unknown outcome stays
    report = await saver.asweep(later, ttl=TTLConfig(after=timedelta(days=1)))
    assert report.threads_deleted == 1 and report.ledger_entries_deleted == 1
    assert report.issued_kept == 1
    assert await saver.aget_entry(done.scope, done.key) is None
    assert await saver.aget_entry(unknown.scope, unknown.key) is not None

    # once settled, it goes on a later sweep (after its own ledger_after)
    outcome = Outcome.failed("declined", "json", b"0")
    await saver.record_outcome(unknown.scope, unknown.key, owner="me", outcome=outcome)
    report = await saver.asweep(time.time() + 2 * DAY, ttl=TTLConfig(after=timedelta(days=1)))
    assert report.ledger_entries_deleted == 1 and report.issued_kept == 0
    assert await saver.alist_entries("t") == []


async def test_pending_writes_keep_entries_and_ledger_after_is_its_own(saver: Any) -> None:
    # a thread with only a pending write left (its checkpoint was deleted) can replay
    await saver.aput_writes(at("w", made_at(NOW)), [("x", 1)], "task")
    kept = await settled_entry(saver, "w", "c1")
    gone = await settled_entry(saver, "no-checkpoints", "c2")
    later = time.time() + 2 * DAY

    long_ledger = TTLConfig(after=timedelta(days=1), ledger_after=timedelta(days=30))
    assert (await saver.asweep(later, ttl=long_ledger)).ledger_entries_deleted == 0

    report = await saver.asweep(later, ttl=TTLConfig(after=timedelta(days=1)))
    assert report.ledger_entries_deleted == 1
    assert await saver.aget_entry(kept.scope, kept.key) is not None
    assert await saver.aget_entry(gone.scope, gone.key) is None


async def test_named_namespace_entries_have_their_own_retention(saver: Any) -> None:
    billing = await settled_entry(saver, "a", "c1", namespace="billing")
    other = await settled_entry(saver, "a", "c2", namespace="other")
    live = await settled_entry(saver, "b", "c3", namespace="billing")
    later = time.time() + 2 * DAY
    await put_thread(saver, "b", later - 3600, pending=False)  # c3's thread remains
    base = {"after": timedelta(days=1)}

    # by default named namespaces are kept whatever the thread TTL
    report = await saver.asweep(later, ttl=TTLConfig(**base))
    assert report.namespace_entries_deleted == 0 and report.ledger_entries_deleted == 0
    assert await saver.aget_entry(billing.scope, billing.key) is not None

    # a window longer than their age keeps them too
    named = TTLConfig(**base, namespace_ttl={"billing": timedelta(days=3)})
    assert (await saver.asweep(later, ttl=named)).namespace_entries_deleted == 0

    named = TTLConfig(**base, namespace_ttl={"billing": timedelta(days=1)})
    assert (await saver.asweep(later, ttl=named)).namespace_entries_deleted == 1
    assert await saver.aget_entry(billing.scope, billing.key) is None
    assert await saver.aget_entry(other.scope, other.key) is not None
    assert await saver.aget_entry(live.scope, live.key) is not None

    every = TTLConfig(**base, namespace_ttl=timedelta(days=1))
    assert (await saver.asweep(later, ttl=every)).namespace_entries_deleted == 1
    assert await saver.aget_entry(other.scope, other.key) is None
    assert await saver.aget_entry(live.scope, live.key) is not None


# --- sweeping while others write ----------------------------------------------------------


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
@pytest.mark.parametrize("revival", ["checkpoint", "claim"])
async def test_a_thread_revived_between_finding_and_sweeping_is_spared(
    saver: Any, strategy: str, revival: str
) -> None:
    """The window a sweep cannot close by reading: a thread found idle gets a new
    checkpoint (or claims a call) before its batch runs. The batch re-checks it."""
    ids = await put_thread(saver, "t", NOW - 40 * DAY)
    cut = Cutoffs.at(TTLConfig(after=timedelta(days=30), strategy=strategy), NOW)  # type: ignore[arg-type]
    assert [t for t, _ in await saver._expired_threads(cut, "", 10)] == ["t"]
    if revival == "checkpoint":
        head = await saver.aget_tuple(cfg("t"))
        await saver.aput(head.config, empty_checkpoint(), {}, {})  # made now
    else:
        await issued_entry(saver, "t", "c1")
    assert await saver._sweep_threads(cut, ["t"]) == []
    assert len(await checkpoint_ids(saver, "t")) == len(ids) + (revival == "checkpoint")


IDLE = [f"idle-{i}" for i in range(12)]
REVIVED = [f"revived-{i}" for i in range(6)]


@pytest.mark.parametrize("strategy", ["delete", "keep_latest"])
async def test_sweeping_while_writers_run_loses_nothing_live(
    backend: str, request: pytest.FixtureRequest, strategy: str
) -> None:
    """Threads that look idle (old checkpoints) are revived by writers appending to their
    list while a sweep runs over them one thread per batch, and readers read them. Every
    checkpoint a writer made survives and reads back as written; no read is corrupt."""
    where = request.getfixturevalue("tmp_path" if backend == "sqlite" else "pg_server_dsn")
    ttl = TTLConfig(after=timedelta(days=30), strategy=strategy, batch_size=1)  # type: ignore[arg-type]
    corrupt: list[str] = []
    async with open_savers(backend, where, 3) as (savers, _):
        sweeper, writer_saver, reader_saver = savers
        for t in IDLE + REVIVED:
            await put_thread(sweeper, t, NOW - 40 * DAY, n=3)
        written: dict[str, dict[str, list[str]]] = {t: {} for t in REVIVED}

        async def write(thread_id: str) -> None:
            head = await writer_saver.aget_tuple(cfg(thread_id))
            items = list(head.checkpoint["channel_values"]["messages"]) if head else []
            version = head.checkpoint["channel_versions"]["messages"] if head else None
            parent: Any = head.config if head else cfg(thread_id)
            for step in range(4):
                items = [*items, f"new-{step}"]
                version = writer_saver.get_next_version(version, None)
                checkpoint = empty_checkpoint()  # a real, current id
                checkpoint["channel_values"] = {"messages": items}
                checkpoint["channel_versions"] = {"messages": version}
                written[thread_id][checkpoint["id"]] = list(items)
                parent = await writer_saver.aput(parent, checkpoint, {}, {"messages": version})
                await asyncio.sleep(0)

        async def read(stop: asyncio.Event) -> None:
            while not stop.is_set():
                for t in IDLE + REVIVED:
                    try:
                        await reader_saver.aget_tuple(cfg(t))
                    except CorruptRecordError as exc:
                        corrupt.append(str(exc))
                await asyncio.sleep(0)

        stop = asyncio.Event()
        reading = asyncio.create_task(read(stop))
        report, *_ = await asyncio.gather(
            sweeper.asweep(NOW, ttl=ttl), *(write(t) for t in REVIVED)
        )
        stop.set()
        await reading

        assert corrupt == []
        for t in REVIVED:
            for checkpoint_id, items in written[t].items():
                got = await reader_saver.aget_tuple(at(t, checkpoint_id))
                assert got is not None, (t, checkpoint_id)
                assert got.checkpoint["channel_values"]["messages"] == items
        for t in IDLE:
            left = await checkpoint_ids(reader_saver, t)
            assert len(left) == (0 if strategy == "delete" else 1)
        assert isinstance(report, SweepReport) and report.batches >= len(IDLE)


# --- the sync classes ---------------------------------------------------------------------


def test_sync_savers_sweep(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    ttl = TTLConfig(after=timedelta(days=30))
    if backend == "sqlite":
        opened = SqliteSaver.from_conn_string(str(tmp_path / "sync.sqlite"), ttl=ttl)
    else:
        opened = PostgresSaver.from_conn_string(
            fresh_dsn(request.getfixturevalue("pg_server_dsn")), ttl=ttl
        )
    with opened as saver:
        assert saver.ttl == ttl
        for thread_id, start in (("old", NOW - 40 * DAY), ("new", NOW - DAY)):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = made_at(start)
            saver.put(cfg(thread_id), checkpoint, {}, {})
        report = saver.sweep(NOW)
        assert report.threads_deleted == 1 and report.checkpoints_deleted == 1
        assert saver.get_tuple(cfg("old")) is None and saver.get_tuple(cfg("new")) is not None
        assert asyncio.run(saver.asweep(NOW)).threads_deleted == 0


async def test_async_savers_take_ttl_in_from_conn_string(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    from langgraph_idem_saver import AsyncPostgresSaver, AsyncSqliteSaver

    platform = {"strategy": "keep_latest", "default_ttl": 60}
    if backend == "sqlite":
        opened = AsyncSqliteSaver.from_conn_string(str(tmp_path / "a.sqlite"), ttl=platform)
    else:
        dsn = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
        opened = AsyncPostgresSaver.from_conn_string(dsn, ttl=platform)
    async with opened as saver:
        assert saver.ttl == TTLConfig(after=timedelta(hours=1), strategy="keep_latest")
        await put_thread(saver, "t", NOW - 2 * 3600, n=3)
        report = await saver.asweep(datetime.fromtimestamp(NOW, timezone.utc))
        assert report.threads_pruned == 1 and len(await checkpoint_ids(saver, "t")) == 1
        # the sync method, from another thread (as LangGraph's async savers allow)
        await put_thread(saver, "u", NOW - 2 * 3600, n=2)
        report = await asyncio.to_thread(saver.sweep, NOW)
        assert report.threads_pruned == 1 and len(await checkpoint_ids(saver, "u")) == 1


# --- bad input ----------------------------------------------------------------------------

BAD_TTLS: list[tuple[str, Any]] = [
    ("zero after", lambda: TTLConfig(after=timedelta(0))),
    ("negative after", lambda: TTLConfig(after=timedelta(days=-1))),
    ("after as int", lambda: TTLConfig(after=30)),  # type: ignore[arg-type]
    ("unknown strategy", lambda: TTLConfig(after=timedelta(1), strategy="drop")),  # type: ignore[arg-type]
    ("negative ledger_after", lambda: TTLConfig(after=timedelta(1), ledger_after=timedelta(-1))),
    ("empty namespace", lambda: TTLConfig(after=timedelta(1), namespace_ttl={"": timedelta(1)})),
    ("bad window", lambda: TTLConfig(after=timedelta(1), namespace_ttl={"b": 5})),  # type: ignore[dict-item]
    ("batch 0", lambda: TTLConfig(after=timedelta(1), batch_size=0)),
    ("batch bool", lambda: TTLConfig(after=timedelta(1), batch_size=True)),
    ("platform interval", lambda: TTLConfig.of({"default_ttl": 5, "sweep_interval_minutes": 1})),
    ("platform nan", lambda: TTLConfig.of({"default_ttl": math.nan})),
    ("platform negative", lambda: TTLConfig.of({"default_ttl": -5})),
    ("platform strategy", lambda: TTLConfig.of({"default_ttl": 5, "strategy": "x"})),
    ("a string", lambda: TTLConfig.of("30d")),
]


@pytest.mark.parametrize("make", [m for _, m in BAD_TTLS], ids=[n for n, _ in BAD_TTLS])
def test_bad_ttl_values_are_config_errors(make: Any) -> None:
    with pytest.raises(ConfigError):
        make()


async def test_bad_sweep_arguments_are_config_errors(saver: Any, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no retention configured"):
        await saver.asweep()
    for now in (datetime(2026, 1, 1), math.nan, "today"):
        with pytest.raises(ConfigError):
            await saver.asweep(now, ttl=TTL)
    from langgraph_idem_saver import AsyncSqliteSaver

    with pytest.raises(ConfigError):
        async with AsyncSqliteSaver.from_conn_string(
            str(tmp_path / "x.sqlite"), ttl={"default_ttl": 0}
        ):
            pass  # pragma: no cover
    assert not (tmp_path / "x.sqlite").exists()  # refused before anything was opened


# --- the command line ---------------------------------------------------------------------


def test_prune_older_than_previews_then_sweeps(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``idem-saver prune --older-than 30d``: a dry run by default, ``--apply`` sweeps."""
    import json

    from langgraph_idem_saver import AsyncPostgresSaver, AsyncSqliteSaver
    from langgraph_idem_saver.cli import main

    if backend == "sqlite":
        target = str(tmp_path / "cli.sqlite")
        opened: Any = lambda: AsyncSqliteSaver.from_conn_string(target)  # noqa: E731
    else:
        target = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
        opened = lambda: AsyncPostgresSaver.from_conn_string(target)  # noqa: E731

    async def fill() -> None:
        async with opened() as saver:
            await put_thread(saver, "old", NOW - 40 * DAY)
            await put_thread(saver, "recent", NOW - 2 * DAY)

    async def threads() -> set[str]:
        async with opened() as saver:
            return {t for t in ("old", "recent") if await checkpoint_ids(saver, t)}

    def prune(*argv: str) -> tuple[int, Any, str]:
        code = main(["prune", "--db", target, "--older-than", "30d", *argv])
        out, err = capsys.readouterr()
        return code, json.loads(out) if "--json" in argv and code == 0 else out, err

    asyncio.run(fill())
    code, preview, err = prune("--json")
    assert code == 0, err
    assert preview["dry_run"] is True and preview["threads_deleted"] == 1
    assert preview["checkpoints_deleted"] == 3
    assert asyncio.run(threads()) == {"old", "recent"}  # the dry run changed nothing
    code, text, err = prune("--apply")
    assert code == 0, err
    assert "threads deleted" in text and "dry run" not in text
    assert asyncio.run(threads()) == {"recent"}
    code, _, err = prune("--thread", "old")
    assert code == 2 and "takes no --thread" in err
    assert main(["prune", "--db", target, "--older-than", "soon"]) == 2
    assert "bad date" in capsys.readouterr().err
