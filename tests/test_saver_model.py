"""Model-based property test: our saver against a reference built on ``InMemorySaver``.

Hypothesis generates a sequence of operations (put with forks and emptied channels,
put_writes incl. special channels, get_tuple, list with filter/before/limit,
delete_thread, copy_thread, prune, delete_for_runs). Each one is applied to the saver
under test and to :class:`ReferenceSaver`; every read and, after every write, the whole
observable state must agree.

``InMemorySaver`` lacks ``delete_for_runs``/``copy_thread``/``prune``; the subclass
implements them with the semantics of the conformance spec (delete the checkpoints and
their writes; copy every namespace, checkpoint, write and blob; keep only the newest
checkpoint per namespace). Blobs are never garbage-collected in the reference, so the
surviving checkpoints' ``channel_values`` must stay exactly as they were.

Values and metadata include lone surrogates, which our savers keep exactly; the reference
keeps them too (it uses our lossless serializer: LangGraph's would store ``?``). The
example budget is relative to the Hypothesis profile (tests/conftest.py).

Ordering contract of ``list`` (that of LangGraph's SQLite and Postgres savers): newest
``checkpoint_id`` first across all namespaces of the thread, then ``limit``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import SAVER_IMPL, backend_resource, sqlite_saver_class
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from langgraph.checkpoint.base import WRITES_IDX_MAP, CheckpointTuple
from langgraph.checkpoint.base.id import uuid6
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer

# The special channels whose writes replace earlier ones (negative idx).
ERROR, INTERRUPT, RESUME = "__error__", "__interrupt__", "__resume__"
assert {ERROR, INTERRUPT, RESUME} <= set(WRITES_IDX_MAP)
SaverFactory = Callable[[], AbstractAsyncContextManager[Any]]


class ReferenceSaver(InMemorySaver):
    """InMemorySaver plus the optional capabilities, as the conformance spec defines them."""

    def _drop(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        del self.storage[thread_id][ns][checkpoint_id]
        self.writes.pop((thread_id, ns, checkpoint_id), None)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = set(run_ids)
        for thread_id, namespaces in list(self.storage.items()):
            for ns, checkpoints in list(namespaces.items()):
                for cid, (_, metadata, _) in list(checkpoints.items()):
                    if self.serde.loads_typed(metadata).get("run_id") in wanted:
                        self._drop(thread_id, ns, cid)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        for ns, checkpoints in list(self.storage.get(source_thread_id, {}).items()):
            self.storage[target_thread_id][ns].update(checkpoints)
        for (tid, ns, cid), writes in list(self.writes.items()):
            if tid == source_thread_id:
                self.writes[(target_thread_id, ns, cid)] = dict(writes)
        for (tid, ns, ch, ver), blob in list(self.blobs.items()):
            if tid == source_thread_id:
                self.blobs[(target_thread_id, ns, ch, ver)] = blob

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            assert strategy == "keep_latest", strategy
            for ns, checkpoints in list(self.storage.get(thread_id, {}).items()):
                if not checkpoints:
                    continue
                latest = max(checkpoints)
                for cid in [c for c in checkpoints if c != latest]:
                    self._drop(thread_id, ns, cid)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.delete_for_runs(run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.copy_thread(source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.prune(thread_ids, strategy=strategy)


# --------------------------------------------------------------------------- normalizing

CHECKPOINT_KEYS = ("v", "id", "ts", "channel_values", "channel_versions", "versions_seen")


def _cfg(config: dict[str, Any] | None) -> tuple[Any, ...] | None:
    if config is None:
        return None
    c = config["configurable"]
    return (c["thread_id"], c.get("checkpoint_ns", ""), c.get("checkpoint_id"))


def _config(key: tuple[Any, ...]) -> dict[str, Any]:
    """The config of a checkpoint from its key (thread_id, checkpoint_ns, checkpoint_id):
    :func:`_cfg` the other way round."""
    thread_id, ns, checkpoint_id = key
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def normalize(t: CheckpointTuple | None) -> Any:
    if t is None:
        return None
    return {
        "config": _cfg(t.config),
        "checkpoint": {k: t.checkpoint.get(k) for k in CHECKPOINT_KEYS},
        "metadata": t.metadata,
        "parent_config": _cfg(t.parent_config),
        "pending_writes": [tuple(w) for w in (t.pending_writes or [])],
    }


async def collect(saver: Any, config: Any, **kw: Any) -> list[Any]:
    return [normalize(t) async for t in saver.alist(config, **kw)]


def newest_first(rows: list[Any]) -> list[Any]:
    return sorted(rows, key=lambda r: r["config"][2], reverse=True)


# --------------------------------------------------------------------------- operations

THREADS = ["t0", "t1", "t2"]
NAMESPACES = ["", "child:1", "sub|x:2"]
CHANNELS = ["messages", "count", "flag"]
RUN_IDS = ["run-a", "run-b", "run-c"]
SOURCES = ["input", "loop", "update", "fork"]

# lone surrogates: our savers keep them exactly (so does the reference's serializer)
SURROGATES = ["\ud800", "a\udfffb"]
json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.text(max_size=8),
    st.sampled_from(SURROGATES),
)
values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(
            st.one_of(st.text(max_size=4), st.sampled_from(SURROGATES)), inner, max_size=3
        ),
    ),
    max_leaves=6,
)
filter_values = st.one_of(
    st.integers(0, 4),
    st.sampled_from([*SOURCES, *RUN_IDS, "zoë", "x", "xy", "a.b c", "x\ud800y"]),
    st.none(),  # matches an absent key too, as InMemorySaver's `==` does
    st.booleans(),
    st.lists(st.text(max_size=3), max_size=2),
    st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
)

pick = st.integers(0, 50)  # resolved modulo the current number of candidates

op_put = st.tuples(
    st.just("put"),
    pick,  # thread
    st.sampled_from(NAMESPACES),
    st.sampled_from(["latest", "fork", "root"]),
    pick,  # fork point
    st.dictionaries(st.sampled_from(CHANNELS), st.one_of(st.just("<empty>"), values), max_size=3),
    st.fixed_dictionaries(
        {"source": st.sampled_from(SOURCES), "run_id": st.sampled_from(RUN_IDS)},
        optional={
            "user": st.sampled_from(["alice", "zoë", "a.b c", "x\x00y", "x\ud800y"]),
            "score": st.integers(0, 4),
            "tags": st.lists(st.text(max_size=3), max_size=2),
            "nested": st.dictionaries(st.text(max_size=3), json_scalars, max_size=2),
        },
    ),
)
op_put_writes = st.tuples(
    st.just("put_writes"),
    pick,  # checkpoint
    st.one_of(
        st.lists(st.tuples(st.sampled_from(CHANNELS), values), min_size=1, max_size=3),
        st.lists(
            st.tuples(st.sampled_from([ERROR, INTERRUPT, RESUME]), values),
            min_size=1,
            max_size=2,
        ),
    ),
    st.sampled_from(["task-1", "task-2", "task-3"]),
    st.sampled_from(["", "~__pregel_pull, a", "~__pregel_pull, b"]),
)
op_get = st.tuples(
    st.just("get"),
    pick,
    st.sampled_from(NAMESPACES),
    st.sampled_from(["latest", "existing", "missing"]),
    pick,
)
op_list = st.tuples(
    st.just("list"),
    st.one_of(st.none(), pick),  # thread (None: no config, across threads)
    st.one_of(st.none(), st.sampled_from(NAMESPACES)),
    st.dictionaries(
        st.sampled_from(["source", "step", "run_id", "user", "score", "tags", "nested", "absent"]),
        filter_values,
        max_size=2,
    ),
    st.one_of(st.none(), pick),  # before: index of a known checkpoint
    st.one_of(st.none(), st.integers(1, 4)),  # limit
    st.booleans(),  # config names an exact checkpoint_id
)
op_delete_thread = st.tuples(st.just("delete_thread"), pick)
op_copy = st.tuples(st.just("copy_thread"), pick)
op_prune = st.tuples(
    st.just("prune"), st.lists(pick, max_size=2), st.sampled_from(["keep_latest", "delete"])
)
op_delete_runs = st.tuples(
    st.just("delete_for_runs"), st.lists(st.sampled_from([*RUN_IDS, "run-none"]), max_size=2)
)

operations = st.lists(
    st.one_of(
        op_put,
        op_put,
        op_put,
        op_put_writes,
        op_put_writes,
        op_get,
        op_list,
        op_list,
        op_delete_thread,
        op_copy,
        op_prune,
        op_delete_runs,
    ),
    min_size=4,
    max_size=30,
)


class Harness:
    """Applies one operation to both savers and compares what can be observed."""

    def __init__(self, ours: Any, ref: ReferenceSaver) -> None:
        self.ours = ours
        self.ref = ref
        self.threads = list(THREADS)
        self.version = 0
        self.step = 0
        self.copies = 0

    def _thread(self, i: int) -> str:
        return self.threads[i % len(self.threads)]

    async def _all_checkpoints(self) -> list[Any]:
        rows = await collect(self.ref, None)
        return sorted(rows, key=lambda r: r["config"])

    async def check_state(self) -> None:
        for tid in self.threads:
            ours = await collect(self.ours, {"configurable": {"thread_id": tid}})
            ref = newest_first(await collect(self.ref, {"configurable": {"thread_id": tid}}))
            assert ours == ref, f"state of thread {tid!r} differs"
            for ns in NAMESPACES:
                cfg = {"configurable": {"thread_id": tid, "checkpoint_ns": ns}}
                assert normalize(await self.ours.aget_tuple(cfg)) == normalize(
                    await self.ref.aget_tuple(cfg)
                ), f"latest of {tid!r}/{ns!r} differs"

    async def both(self, method: str, *args: Any, **kw: Any) -> tuple[Any, Any]:
        return (
            await getattr(self.ours, method)(*args, **kw),
            await getattr(self.ref, method)(*args, **kw),
        )

    async def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        known = await self._all_checkpoints()
        if kind == "put":
            _, ti, ns, mode, fi, updates, metadata = op
            tid = self._thread(ti)
            in_ns = [r for r in known if r["config"][:2] == (tid, ns)]
            parent = None
            if in_ns and mode == "latest":
                parent = max(in_ns, key=lambda r: r["config"][2])
            elif in_ns and mode == "fork":
                parent = in_ns[fi % len(in_ns)]
            base_versions = dict(parent["checkpoint"]["channel_versions"]) if parent else {}
            base_values = dict(parent["checkpoint"]["channel_values"]) if parent else {}
            new_versions = {}
            for ch, val in updates.items():
                self.version += 1
                new_versions[ch] = self.version
                if val == "<empty>":
                    base_values.pop(ch, None)
                else:
                    base_values[ch] = val
            base_versions.update(new_versions)
            self.step += 1
            checkpoint = {
                "v": 4,
                "id": str(uuid6(clock_seq=-1)),
                "ts": datetime.now(timezone.utc).isoformat(),
                "channel_values": base_values,
                "channel_versions": base_versions,
                "versions_seen": {"node": dict.fromkeys(new_versions, self.version)},
                "updated_channels": sorted(new_versions),
            }
            configurable: dict[str, Any] = {"thread_id": tid, "checkpoint_ns": ns}
            if parent is not None:
                configurable["checkpoint_id"] = parent["config"][2]
            md = {**metadata, "step": self.step % 5, "parents": {}}
            ours_cfg, ref_cfg = await self.both(
                "aput", {"configurable": configurable}, checkpoint, md, new_versions
            )
            assert _cfg(ours_cfg) == _cfg(ref_cfg) == (tid, ns, checkpoint["id"])
        elif kind == "put_writes":
            _, ci, writes, task_id, task_path = op
            if not known:
                return
            target = _config(known[ci % len(known)]["config"])
            await self.both("aput_writes", target, writes, task_id, task_path)
        elif kind == "get":
            _, ti, ns, mode, ci = op
            tid = self._thread(ti)
            configurable = {"thread_id": tid, "checkpoint_ns": ns}
            in_thread = [r for r in known if r["config"][0] == tid]
            if mode == "existing" and in_thread:
                configurable["checkpoint_id"] = in_thread[ci % len(in_thread)]["config"][2]
            elif mode == "missing":
                configurable["checkpoint_id"] = str(uuid6(clock_seq=-1))
            ours, ref = await self.both("aget_tuple", {"configurable": configurable})
            assert normalize(ours) == normalize(ref), f"get_tuple({configurable}) differs"
            return
        elif kind == "list":
            _, ti, ns, flt, bi, limit, exact = op
            before = None
            if bi is not None and known:
                before = _config(known[bi % len(known)]["config"])
            if ti is None:
                # Across threads: order between equal ids of copied threads is unspecified.
                ours = await collect(self.ours, None, filter=flt, before=before)
                ref = await collect(self.ref, None, filter=flt, before=before)
                key = lambda r: r["config"]  # noqa: E731
                assert sorted(ours, key=key) == sorted(ref, key=key), "list(None) differs"
                return
            configurable = {"thread_id": self._thread(ti)}
            if ns is not None:
                configurable["checkpoint_ns"] = ns
            in_thread = [r for r in known if r["config"][0] == configurable["thread_id"]]
            if exact and in_thread:
                configurable["checkpoint_id"] = in_thread[(bi or 0) % len(in_thread)]["config"][2]
            cfg = {"configurable": configurable}
            ours = await collect(self.ours, cfg, filter=flt, before=before, limit=limit)
            ref = newest_first(await collect(self.ref, cfg, filter=flt, before=before))
            if limit is not None:
                ref = ref[:limit]
            assert ours == ref, f"list({cfg}, filter={flt}, before={before}, limit={limit})"
            return
        elif kind == "delete_thread":
            await self.both("adelete_thread", self._thread(op[1]))
        elif kind == "copy_thread":
            src = self._thread(op[1])
            self.copies += 1
            dst = f"copy-{self.copies}-of-{src}"
            await self.both("acopy_thread", src, dst)
            self.threads.append(dst)
        elif kind == "prune":
            _, tis, strategy = op
            tids = sorted({self._thread(i) for i in tis})
            await self.both("aprune", tids, strategy=strategy)
        elif kind == "delete_for_runs":
            await self.both("adelete_for_runs", op[1])
        else:  # pragma: no cover
            raise AssertionError(kind)
        await self.check_state()


async def run_model(factory: SaverFactory, ops: list[tuple[Any, ...]]) -> list[Any]:
    """Run ``ops`` on a fresh saver and the reference; returns the final checkpoints."""
    async with factory() as ours:
        harness = Harness(ours, ReferenceSaver(serde=LosslessJsonPlusSerializer()))
        for op in ops:
            await harness.apply(op)
        await harness.check_state()
        return await harness._all_checkpoints()


MIGRATIONS_TABLES = ("idem_saver_migrations", "checkpoint_migrations")


def _delete_every_row_sqlite(path: Path) -> None:
    with sqlite3.connect(path) as db:
        tables = [
            name
            for (name,) in db.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
            if name not in MIGRATIONS_TABLES
        ]
        assert tables, "the saver made no tables"
        for name in tables:
            db.execute(f'DELETE FROM "{name}"')
        assert all(db.execute(f'SELECT count(*) FROM "{n}"').fetchone() == (0,) for n in tables)
    db.close()


async def _delete_every_row_postgres(dsn: str) -> None:
    import psycopg

    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT table_name FROM information_schema.tables "
            "WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
        tables = [name for (name,) in await cur.fetchall() if name not in MIGRATIONS_TABLES]
        assert tables, "the saver made no tables"
        async with conn.transaction():
            for name in tables:
                await conn.execute(f'DELETE FROM "{name}"')
        for name in tables:
            cur = await conn.execute(f'SELECT count(*) FROM "{name}"')
            assert await cur.fetchone() == (0,), f"{name} kept rows"


@pytest.fixture
def emptied_saver_factory(backend: str, request: pytest.FixtureRequest) -> SaverFactory:
    """Like ``saver_factory``, a new saver each call, but on ONE database whose rows are
    all deleted first (its tables and migrations kept): the first call sets it up, later
    ones skip the schema's creation and migrations. For a property test, where that set-up
    would cost more than most examples."""
    where = backend_resource(backend, request)
    dsn: list[str] = []

    @asynccontextmanager
    async def factory() -> AsyncIterator[Any]:
        if backend == "sqlite":
            path = Path(where) / "model.sqlite"
            if path.exists():
                await asyncio.to_thread(_delete_every_row_sqlite, path)
            async with sqlite_saver_class().from_conn_string(str(path)) as saver:
                yield saver
            return
        from pg_server import afresh_dsn

        if SAVER_IMPL == "official":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        else:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver
        if dsn:
            await _delete_every_row_postgres(dsn[0])
        else:
            dsn.append(await afresh_dsn(where))
        async with AsyncPostgresSaver.from_conn_string(dsn[0]) as saver:
            if SAVER_IMPL == "official":
                await saver.setup()
            yield saver

    return factory


# three times the profile's budget (tests/conftest.py): operation sequences are long
@settings(
    max_examples=3 * settings.default.max_examples,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=operations)
def test_saver_matches_in_memory_model(emptied_saver_factory: SaverFactory, ops: list[Any]) -> None:
    """Any operation sequence: every read equals the InMemorySaver-based reference (each
    example on a new saver over an emptied database)."""
    asyncio.run(run_model(emptied_saver_factory, ops))


def test_model_exercises_every_operation(saver_factory: SaverFactory) -> None:
    """A fixed sequence touching every operation, so the property is never vacuous."""
    put = (
        "put",
        0,
        "",
        "latest",
        0,
        {"messages": [1], "count": 1},
        {"source": "input", "run_id": "run-a", "user": "zoë"},
    )
    ops = [
        put,
        (
            "put",
            0,
            "",
            "latest",
            0,
            {"count": 2, "flag": "<empty>"},
            {"source": "loop", "run_id": "run-b"},
        ),
        (
            "put",
            0,
            "child:1",
            "root",
            0,
            {"messages": ["c"]},
            {"source": "loop", "run_id": "run-b", "user": "a.b c"},
        ),
        ("put", 1, "", "latest", 0, {"count": 7}, {"source": "input", "run_id": "run-c"}),
        (
            "put",
            0,
            "",
            "fork",
            0,
            {"count": 3},
            {"source": "fork", "run_id": "run-c", "user": "zoë"},
        ),
        ("put_writes", 0, [("messages", "w1"), ("count", 5)], "task-1", ""),
        ("put_writes", 0, [(INTERRUPT, {"v": 1})], "task-2", "~__pregel_pull, a"),
        ("put_writes", 0, [(INTERRUPT, {"v": 2})], "task-2", "~__pregel_pull, a"),
        ("put_writes", 0, [("messages", "ignored-dup")], "task-1", ""),
        ("get", 0, "", "latest", 0),
        ("get", 0, "", "existing", 1),
        ("get", 0, "", "missing", 0),
        ("list", 0, None, {}, None, None, False),
        ("list", 0, "", {"source": "loop"}, 2, 1, False),
        ("list", 0, None, {"user": "zoë"}, None, 2, False),
        ("list", None, None, {"run_id": "run-c"}, None, None, False),
        ("copy_thread", 0),
        ("delete_for_runs", ["run-b"]),
        ("prune", [1, 3], "keep_latest"),
        ("put", 3, "", "latest", 0, {"count": 9}, {"source": "loop", "run_id": "run-a"}),
        ("prune", [0], "delete"),
        ("delete_thread", 1),
    ]
    final = asyncio.run(run_model(saver_factory, ops))
    # t0 pruned away, t1 deleted; the copy of t0 was pruned to its newest checkpoint per
    # namespace (run-b's checkpoints were deleted before), then got one more put.
    by_thread: dict[str, list[Any]] = {}
    for row in final:
        by_thread.setdefault(row["config"][0], []).append(row)
    assert sorted(by_thread) == ["copy-1-of-t0"]
    copy = sorted(by_thread["copy-1-of-t0"], key=lambda r: r["config"][2])
    assert [r["metadata"]["run_id"] for r in copy] == ["run-c", "run-a"]
    assert copy[0]["checkpoint"]["channel_values"] == {"messages": [1], "count": 3}
    assert copy[1]["checkpoint"]["channel_values"] == {"messages": [1], "count": 9}
    assert copy[0]["metadata"]["user"] == "zoë"
    assert copy[0]["pending_writes"] == []


async def run_bulk(factory: SaverFactory) -> dict[str, int]:
    """Hundreds of checkpoints per thread: ``list`` must page through them exactly."""
    async with factory() as ours:
        ref = ReferenceSaver(serde=LosslessJsonPlusSerializer())
        savers = (ours, ref)
        for tid in ("bulk-a", "bulk-b"):
            for ns in ("", "child:1"):
                parent: str | None = None
                for i in range(130):
                    configurable: dict[str, Any] = {"thread_id": tid, "checkpoint_ns": ns}
                    if parent:
                        configurable["checkpoint_id"] = parent
                    cp = {
                        "v": 4,
                        "id": str(uuid6(clock_seq=-1)),
                        "ts": datetime.now(timezone.utc).isoformat(),
                        "channel_values": {"n": i},
                        "channel_versions": {"n": i + 1},
                        "versions_seen": {},
                        "updated_channels": ["n"],
                    }
                    md = {"source": "loop", "step": i, "parity": i % 2, "run_id": f"r{i % 3}"}
                    for s in savers:
                        await s.aput({"configurable": configurable}, cp, md, {"n": i + 1})
                    parent = cp["id"]
        await ours.acopy_thread("bulk-a", "bulk-c")
        await ref.acopy_thread("bulk-a", "bulk-c")

        everything = await collect(ref, None)
        middle = sorted(everything, key=lambda r: r["config"][2])[len(everything) // 2]
        before = {
            "configurable": dict(
                zip(("thread_id", "checkpoint_ns", "checkpoint_id"), middle["config"], strict=True)
            )
        }
        compared = 0
        # across threads (copied ids repeat): same rows
        key = lambda r: r["config"]  # noqa: E731
        assert sorted(await collect(ours, None), key=key) == sorted(everything, key=key)
        assert len(everything) == 3 * 2 * 130
        for tid in ("bulk-a", "bulk-b", "bulk-c"):
            for ns in (None, "", "child:1"):
                configurable = {"thread_id": tid}
                if ns is not None:
                    configurable["checkpoint_ns"] = ns
                cfg = {"configurable": configurable}
                for kw in (
                    {},
                    {"limit": 99},
                    {"limit": 100},
                    {"limit": 101},
                    {"limit": 250},
                    {"before": before},
                    {"before": before, "limit": 120},
                    {"filter": {"parity": 1}},
                    {"filter": {"parity": 0, "run_id": "r1"}, "limit": 30},
                ):
                    limit = kw.get("limit")
                    rest = {k: v for k, v in kw.items() if k != "limit"}
                    expected = newest_first(await collect(ref, cfg, **rest))[:limit]
                    got = await collect(ours, cfg, **kw)
                    assert got == expected, (cfg, kw)
                    compared += len(got)
        return {"compared": compared}


def test_list_pages_through_many_checkpoints(saver_factory: SaverFactory) -> None:
    """Many pages, limits around the page size, before/filter, copied thread."""
    result = asyncio.run(run_bulk(saver_factory))
    assert result["compared"] > 5000
