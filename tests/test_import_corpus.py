"""The import corpus: databases LangGraph's own savers filled, imported whole.

For each backend (SQLite, PostgreSQL) and each flavour of the official saver (sync
``SqliteSaver``/``PostgresSaver`` with ``graph.invoke``, async ``AsyncSqliteSaver``/
``AsyncPostgresSaver`` with ``graph.ainvoke``), the threads of
:mod:`langgraph_corpus` - answered interrupts, subgraphs, ``Send``, Functional-API tasks,
a failed node, durability ``exit``, a scheduled write - are written by the official
saver, imported with ``aimport_langgraph``, and then:

* every thread's ``get_state_history`` (and latest state with subgraphs) read through our
  saver equals the one read through the official saver;
* every paused thread resumes on our saver exactly as it does on the official one, and
  the histories still agree afterwards.

Plus: a thread whose import fails leaves nothing of itself (a failure used to leave it
half imported), and the issue's reproduction (an answered interrupt, refused with
``ImportLayoutError ... [-4, -3, 1]``) imports.
"""

from __future__ import annotations

import asyncio

import pytest
from import_db import Db
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph_corpus import PAUSED, THREADS, afill, ahistory, aresume, fill_sync

from langgraph_idem_saver.errors import ImportLayoutError
from langgraph_idem_saver.import_langgraph import STAGING_PREFIX

FLAVOURS = ("sync", "async")


@pytest.fixture
def source(backend: str, request: pytest.FixtureRequest) -> Db:
    return Db.for_test(backend, request)


def _fill_sync(source: Db) -> None:
    with source.official_sync() as saver:
        fill_sync(saver)


async def filled(source: Db, flavour: str) -> None:
    if flavour == "sync":
        await asyncio.to_thread(_fill_sync, source)
    else:
        async with source.official() as official:
            await afill(official)


# --------------------------------------------------------------------------- the corpus


@pytest.mark.parametrize("flavour", FLAVOURS)
async def test_the_corpus_imports_reads_back_and_resumes_as_on_langgraphs_saver(
    source: Db, flavour: str
) -> None:
    await filled(source, flavour)
    # the corpus holds every special write index LangGraph defines
    indexes = {r[0] for r in source.sql(f"SELECT DISTINCT idx FROM {source.writes_table()}")}
    assert set(WRITES_IDX_MAP.values()) <= indexes
    namespaces = source.sql("SELECT count(DISTINCT checkpoint_ns) FROM checkpoints")[0][0]
    assert namespaces >= 2  # the subgraph's checkpoints too
    async with source.ours() as ours:
        report = await ours.aimport_langgraph(batch_size=7)
        assert report.threads_imported == report.threads_found == len(THREADS)
        assert report.checkpoints_imported == report.checkpoints_found == report.verified
        async with source.official() as official:
            for thread in THREADS:
                theirs = await ahistory(official, thread)
                assert len(theirs) >= 2, thread.name
                assert await ahistory(ours, thread) == theirs, thread.name
            for thread in THREADS:
                state = await thread.graph(official).aget_state(thread.config())
                assert bool(state.next) == (thread.name in PAUSED), thread.name
            for name in PAUSED:
                thread = next(t for t in THREADS if t.name == name)
                ours_out = await aresume(ours, thread)
                assert ours_out == await aresume(official, thread), name
                done = await thread.graph(ours).aget_state(thread.config())
                assert not done.next, name
                ours_after = await ahistory(ours, thread)
                theirs_after = await ahistory(official, thread)
                # the resumed checkpoints have new ids and times: compare their count
                # and what the graph made of them
                assert len(ours_after) == len(theirs_after), name
                assert [h["values"] for h in ours_after] == [h["values"] for h in theirs_after], (
                    name
                )
    assert source.our_threads() == {t.name for t in THREADS}


@pytest.mark.parametrize("verify", [True, False])
async def test_the_reproduction_an_answered_interrupt_imports(source: Db, verify: bool) -> None:
    """The issue's case: ``Command(resume=41)`` left the task's writes at -4, -3 and 1,
    which the import refused (``ImportLayoutError ... [-4, -3, 1]``) after writing part
    of the thread."""
    thread = next(t for t in THREADS if t.name == "answered")
    async with source.official() as official:
        graph = thread.graph(official)
        for run in thread.runs:
            await graph.ainvoke(run, thread.config())
    rows = source.sql(
        f"SELECT idx, channel FROM {source.writes_table()} WHERE thread_id = 'answered' "
        "ORDER BY idx"
    )
    by_task = [r[0] for r in rows]
    assert -4 in by_task and -3 in by_task and 1 in by_task, rows
    async with source.ours() as ours:
        report = await ours.aimport_langgraph(verify=verify)
        assert report.threads_imported == 1 and report.verified == (
            report.checkpoints_imported if verify else 0
        )
        async with source.official() as official:
            assert await ahistory(ours, thread) == await ahistory(official, thread)
        state = await thread.graph(ours).aget_state(thread.config())
        assert state.values == {"x": 42, "log": ["after:42"]} and not state.next


# --------------------------------------------------------------------------- whole or nothing


async def test_a_thread_that_fails_to_import_leaves_nothing_of_itself(source: Db) -> None:
    """A bad row in the middle of a thread: the threads before it are in, whole; of that
    thread nothing is visible (no checkpoint, no staged rows), and a re-run fails the same
    way, still writing nothing of it."""
    async with source.official() as official:
        await afill(official)
    # the last checkpoint of 'nested' (in import order) with an ordinary write gets it
    # at an index LangGraph never writes: its checkpoints before it are copied first
    writes = source.writes_table()
    ns, last = source.sql(
        f"SELECT checkpoint_ns, checkpoint_id FROM {writes} WHERE thread_id = 'nested' "
        "AND idx >= 0 ORDER BY checkpoint_ns DESC, checkpoint_id DESC LIMIT 1"
    )[0]
    total = source.sql("SELECT count(*) FROM checkpoints WHERE thread_id = 'nested'")[0][0]
    earlier = source.sql(
        "SELECT count(*) FROM checkpoints WHERE thread_id = 'nested' "
        "AND (checkpoint_ns, checkpoint_id) < (%s, %s)",
        (ns, last),
    )[0][0]
    assert 0 < earlier < total
    source.sql(
        f"UPDATE {writes} SET idx = -7 - idx WHERE thread_id = 'nested' "
        "AND checkpoint_ns = %s AND checkpoint_id = %s AND idx >= 0",
        (ns, last),
    )
    changed = source.sql(
        f"SELECT count(*) FROM {source.writes_table()} WHERE thread_id = 'nested' AND idx <= -7"
    )[0][0]
    assert changed > 0
    before = sorted(t.name for t in THREADS if t.name < "nested")
    for _ in range(2):
        async with source.ours() as ours:
            with pytest.raises(ImportLayoutError, match="nothing of that thread was imported"):
                await ours.aimport_langgraph(batch_size=3)
            assert await ours.aget_tuple({"configurable": {"thread_id": "nested"}}) is None
        assert sorted(source.our_threads()) == before
        staged = source.sql(
            "SELECT count(*) FROM idem_checkpoints WHERE thread_id LIKE %s",
            (STAGING_PREFIX + "%",),
        )
        assert staged == [(0,)]
        for table in ("idem_writes", "idem_blobs"):
            assert source.sql(
                f"SELECT count(*) FROM {table} WHERE thread_id = 'nested' OR thread_id LIKE %s",
                (STAGING_PREFIX + "%",),
            ) == [(0,)]


async def test_a_thread_langgraphs_saver_grew_after_the_import_is_completed_whole(
    source: Db,
) -> None:
    """The old application wrote more to a thread already imported: a re-run imports the
    new checkpoints (as a whole: staged, then renamed; the channel versions the thread
    already has are kept once) and the thread reads as on LangGraph's saver."""
    thread = next(t for t in THREADS if t.name == "two-questions")
    async with source.official() as official:
        for run in thread.runs:
            await thread.graph(official).ainvoke(run, thread.config())
    async with source.ours() as ours:
        first = await ours.aimport_langgraph()
        latest = await ours.aget_tuple(thread.config())
        first_latest, first_writes = latest.config, len(latest.pending_writes)
    async with source.official() as official:
        await aresume(official, thread)
        theirs = await ahistory(official, thread)
    async with source.ours() as ours:
        again = await ours.aimport_langgraph()
        assert again.checkpoints_present == first.checkpoints_imported
        assert again.checkpoints_imported == len(theirs) - 1 - first.checkpoints_imported
        assert again.threads_imported == 1
        # the checkpoint it was paused at got the answered task's writes afterwards
        paused_at = first_latest["configurable"]["checkpoint_id"]
        mine = await ours.aget_tuple(
            {
                "configurable": {
                    **thread.config()["configurable"],
                    "checkpoint_ns": "",
                    "checkpoint_id": paused_at,
                }
            }
        )
        assert len(mine.pending_writes) > first_writes
        assert await ahistory(ours, thread) == theirs
    assert source.sql(
        "SELECT count(*) FROM idem_blobs WHERE thread_id LIKE %s", (STAGING_PREFIX + "%",)
    ) == [(0,)]
