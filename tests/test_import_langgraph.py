"""Adopting a database LangGraph's own saver filled (issue 14, item 3).

Each test fills a SQLite file / Postgres schema with LangGraph's own ``AsyncSqliteSaver``
/ ``AsyncPostgresSaver`` through real compiled graphs (a chat on a fake chat model with
a time-travel fork, a subgraph paused on an interrupt, a graph paused on an interrupt),
then opens our saver on the same database: it warns, imports, reads every checkpoint
back equal to what LangGraph's saver reads, and the graphs continue on it.
"""

from __future__ import annotations

import asyncio
import logging
import math
import operator
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import pytest
import zygote
from import_db import Db
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AnyMessage, HumanMessage
from langgraph.checkpoint.serde.types import TASKS
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command, Send
from line_graph import line_graph
from test_delta_history import loop_graph, state_and_history
from test_graphs import approval_graph, cfg, norm, parent_graph
from typing_extensions import TypedDict

from langgraph_idem_saver.errors import (
    ConfigError,
    CorruptRecordError,
    ImportLayoutError,
)
from langgraph_idem_saver.import_langgraph import STAGING_PREFIX
from langgraph_idem_saver.import_rows import ImportReport

WORKER = Path(__file__).with_name("import_worker.py")
THREADS = ("approval", "chat", "nested")
LOGGER = "langgraph_idem_saver.import"
KEY = ("thread_id", "checkpoint_ns", "checkpoint_id")


# --------------------------------------------------------------------------- the database


@pytest.fixture
def db(backend: str, request: pytest.FixtureRequest) -> Db:
    return Db.for_test(backend, request)


# --------------------------------------------------------------------------- the graphs


class Chat(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def chat_graph(checkpointer: Any) -> Any:
    model = FakeListChatModel(responses=["hello!", "fine, thanks", "bye!", "back again"])

    async def call_model(state: Chat) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    return line_graph(Chat, checkpointer, model=call_model)


GRAPHS = {"chat": chat_graph, "nested": parent_graph, "approval": approval_graph}


async def fill(saver: Any) -> None:
    """What an application did with LangGraph's saver before switching."""
    chat = chat_graph(saver)
    for text in ["hi", "how are you", "bye"]:
        await chat.ainvoke({"messages": [HumanMessage(text)]}, cfg("chat"))
    # time travel: a fork from the end of the first turn (a parent that is not the
    # previous checkpoint)
    past = [s async for s in chat.aget_state_history(cfg("chat"))]
    first_turn = next(s for s in past if len(s.values["messages"]) == 2 and not s.next)
    await chat.ainvoke({"messages": [HumanMessage("actually, wait")]}, first_turn.config)
    # paused on interrupts: one inside a subgraph, one in the root graph
    await parent_graph(saver).ainvoke({"log": []}, cfg("nested"))
    await approval_graph(saver).ainvoke(
        {"request": "refund", "decision": "", "log": []}, cfg("approval")
    )


async def filled(db: Db) -> dict[tuple[str, str, str], Any]:
    """Fill ``db`` with LangGraph's saver; every checkpoint tuple it then reads, by key."""
    async with db.official() as saver:
        await fill(saver)
        return await tuples(saver)


async def tuples(saver: Any) -> dict[tuple[str, str, str], Any]:
    out = {}
    async for t in saver.alist(None):
        c = t.config["configurable"]
        out[(c["thread_id"], c["checkpoint_ns"], c["checkpoint_id"])] = t
    return out


def assert_same_tuple(ours: Any, theirs: Any) -> None:
    assert ours is not None
    assert ours.config == theirs.config
    assert ours.checkpoint == theirs.checkpoint
    assert ours.metadata == theirs.metadata
    assert ours.parent_config == theirs.parent_config
    assert ours.pending_writes == theirs.pending_writes


async def assert_all_read_back_equal(
    ours: Any, theirs: dict[Any, Any], *, snapshots_carried: bool = False
) -> None:
    """Every checkpoint reads back from ours as from LangGraph's saver. With
    ``snapshots_carried``: except that ours also returns a value in a checkpoint whose
    version of that channel is its parent's (a DeltaChannel snapshot, which LangGraph's
    SQLite saver keeps with the one checkpoint that wrote it; ours, like its Postgres
    saver, keeps it with the version)."""
    assert set(await tuples(ours)) == set(theirs)
    for (thread_id, ns, checkpoint_id), t in theirs.items():
        config = {
            "configurable": {
                "thread_id": thread_id,
                "checkpoint_ns": ns,
                "checkpoint_id": checkpoint_id,
            }
        }
        got = await ours.aget_tuple(config)
        if snapshots_carried:
            got = got._replace(checkpoint=without_carried(got, t, theirs))
        assert_same_tuple(got, t)


def without_carried(ours: Any, theirs: Any, everything: dict[Any, Any]) -> dict[str, Any]:
    values = dict(ours.checkpoint["channel_values"])
    versions = theirs.checkpoint["channel_versions"]
    parent = (
        theirs.parent_config
        and everything[tuple(theirs.parent_config["configurable"][k] for k in KEY)]
    )
    for channel in set(values) - set(theirs.checkpoint["channel_values"]):
        assert parent and parent.checkpoint["channel_versions"][channel] == versions[channel]
        del values[channel]
    return {**ours.checkpoint, "channel_values": values}


async def states(saver: Any) -> dict[str, Any]:
    return {
        name: await GRAPHS[name](saver).aget_state(cfg(name), subgraphs=True) for name in THREADS
    }


async def resume(saver: Any) -> dict[str, Any]:
    """What the application does next: a new chat turn, and both interrupts answered."""
    return {
        "chat": norm(
            await chat_graph(saver).ainvoke(
                {"messages": [HumanMessage("still there?")]}, cfg("chat")
            )
        ),
        "nested": norm(await parent_graph(saver).ainvoke(Command(resume="ok"), cfg("nested"))),
        "approval": norm(
            await approval_graph(saver).ainvoke(Command(resume="yes"), cfg("approval"))
        ),
    }


# --------------------------------------------------------------------------- tests


async def test_import_reads_every_checkpoint_back_and_the_graphs_continue(db: Db) -> None:
    theirs = await filled(db)
    namespaces = {ns for _, ns, _ in theirs}
    assert len(namespaces) >= 2  # the subgraph's checkpoints are there too
    assert any(t.pending_writes for t in theirs.values())
    async with db.ours() as ours:
        assert await tuples(ours) == {}  # before the import: every thread is hidden
        report = await ours.aimport_langgraph(batch_size=3)
        assert isinstance(report, ImportReport)
        assert report.checkpoints_found == report.checkpoints_imported == len(theirs)
        assert report.verified == len(theirs)
        assert report.checkpoints_present == 0
        assert report.threads_found == report.threads_imported == len(THREADS)
        assert report.writes_imported == sum(len(t.pending_writes) for t in theirs.values())
        assert report.batches == -(-len(theirs) // 3)
        assert report.changed
        text = str(report)
        assert f"{len(theirs)} imported" in text and "langgraph-checkpoint-" in text

        await assert_all_read_back_equal(ours, theirs)
        async with db.official() as official:
            assert await states(ours) == await states(official)
            paused = await states(ours)
            assert paused["approval"].interrupts and paused["nested"].tasks[0].state.interrupts
            before = len(paused["chat"].values["messages"])
            ours_next = await resume(ours)
            assert ours_next == await resume(official)
        chat = ours_next["chat"]["messages"]
        assert len(chat) == before + 2
        assert chat[-2:] == [("human", "still there?"), ("ai", "hello!")]
        assert ours_next["nested"]["log"][-2:] == ["child:got:ok", "parent:after"]
        assert ours_next["approval"]["log"] == ["asked:yes", "acted:yes"]


async def test_list_channels_are_stored_as_deltas_as_in_a_live_run(db: Db) -> None:
    await filled(db)
    async with db.ours() as ours:
        await ours.aimport_langgraph()
    deltas = db.sql(
        "SELECT count(*) FROM idem_blobs WHERE channel = 'messages' AND base_version IS NOT NULL"
    )
    assert deltas[0][0] > 0


async def test_reimport_changes_nothing(db: Db) -> None:
    theirs = await filled(db)
    async with db.ours() as ours:
        await ours.aimport_langgraph()
        rows = db.our_rows()
        again = await ours.aimport_langgraph()
        assert not again.changed
        assert again.checkpoints_present == again.checkpoints_found == len(theirs)
        assert again.checkpoints_imported == again.writes_imported == again.values_written == 0
        assert db.our_rows() == rows
        await assert_all_read_back_equal(ours, theirs)


async def test_killed_import_finishes_on_rerun(db: Db, caplog: pytest.LogCaptureFixture) -> None:
    """Killed in the middle of a thread: the threads before it are in, whole; of that
    thread nothing is visible under its id (its staged rows are not a thread of its
    own for long: the re-run deletes them), and the re-run imports it whole."""
    theirs = await filled(db)
    first = sum(1 for k in theirs if k[0] == THREADS[0])  # 'approval', whole
    proc = await asyncio.to_thread(
        zygote.run,
        [sys.executable, str(WORKER), db.backend, db.where, str(first + 2)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    counts = dict(db.sql("SELECT thread_id, count(*) FROM idem_checkpoints GROUP BY thread_id"))
    assert counts.pop(THREADS[0]) == first
    assert list(counts) == [STAGING_PREFIX + THREADS[1]]  # 'chat': staged only
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with db.ours() as ours:
        assert await ours.aget_tuple(cfg(THREADS[1])) is None
        # setup() still says there is something to import
        assert len([r for r in caplog.records if r.name == LOGGER]) == 1
        report = await ours.aimport_langgraph()
        assert report.checkpoints_present == first
        assert report.checkpoints_imported == len(theirs) - first
        await assert_all_read_back_equal(ours, theirs)
        assert not (await ours.aimport_langgraph()).changed
    threads = {r[0] for r in db.sql("SELECT DISTINCT thread_id FROM idem_checkpoints")}
    assert threads == set(THREADS)


async def test_previous_major_layout_without_task_path(db: Db) -> None:
    theirs = await filled(db)
    # langgraph-checkpoint-sqlite/-postgres 2.x databases: no writes.task_path
    db.sql(f"ALTER TABLE {db.writes_table()} DROP COLUMN task_path")
    if db.backend == "postgres":
        from langgraph.checkpoint.postgres.base import MIGRATIONS

        db.sql("DELETE FROM checkpoint_migrations WHERE v = %s", (len(MIGRATIONS) - 1,))
    async with db.ours() as ours:
        report = await ours.aimport_langgraph()
        assert "2.x" in report.source
        assert report.checkpoints_imported == len(theirs)
        # LangGraph's saver, opened now, migrates the table back (task paths '')
        async with db.official() as official:
            await assert_all_read_back_equal(ours, await tuples(official))
        assert (await resume(ours))["approval"]["log"] == ["asked:yes", "acted:yes"]


async def test_setup_warns_once_naming_the_command(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    await filled(db)
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with db.ours() as ours:
        await ours.setup()
        await ours.aget_tuple(cfg("chat"))
        warnings = [r for r in caplog.records if r.name == LOGGER]
        assert len(warnings) == 1
        message = warnings[0].getMessage()
        assert "idem-saver import-langgraph" in message and "aimport_langgraph()" in message
        if db.backend == "sqlite":
            assert f"idem-saver import-langgraph {db.where}" in message
        else:
            assert db.where not in message  # a DSN may hold a password
        await ours.aimport_langgraph()
    caplog.clear()
    async with db.ours() as ours:
        await ours.aget_tuple(cfg("chat"))
    assert [r for r in caplog.records if r.name == LOGGER] == []
    # the old application wrote one more thread (sorting after every imported one)
    async with db.official() as official:
        await chat_graph(official).ainvoke({"messages": [HumanMessage("late")]}, cfg("zz"))
    async with db.ours() as ours:
        assert len([r for r in caplog.records if r.name == LOGGER]) == 1


async def test_a_delta_channel_thread_is_imported_and_continues(db: Db) -> None:
    """LangGraph's savers store a DeltaChannel's value only at snapshots; the rest is
    rebuilt from writes along the parent chain: the import keeps what that needs."""
    config = cfg("delta")
    async with db.official() as official:
        for _ in range(2):
            await loop_graph(official).ainvoke({"n": 0} if _ == 0 else None, config)
        theirs = await tuples(official)
        before = await state_and_history(loop_graph(official), config)
    async with db.ours() as ours:
        await ours.aimport_langgraph()
        await assert_all_read_back_equal(ours, theirs, snapshots_carried=True)
        assert await state_and_history(loop_graph(ours), config) == before
        ours_next = await loop_graph(ours).ainvoke({"n": 1}, config)
    async with db.official() as official:
        assert ours_next == await loop_graph(official).ainvoke({"n": 1}, config)
    assert len(ours_next["items"]) > len(before["state"]["values"]["items"])


class Fan(TypedDict):
    subjects: list[str]
    done: Annotated[list[str], operator.add]


def fan_graph(checkpointer: Any) -> Any:
    """Map-reduce with Send, paused before the sends run."""
    builder = StateGraph(Fan)
    builder.add_node("plan", lambda state: {})
    builder.add_node("work", lambda item: {"done": [item["subject"].upper()]})
    builder.add_edge(START, "plan")
    builder.add_conditional_edges(
        "plan", lambda state: [Send("work", {"subject": s}) for s in state["subjects"]]
    )
    builder.add_edge("work", END)
    return builder.compile(checkpointer=checkpointer, interrupt_before=["work"])


@pytest.mark.parametrize("backend", ["postgres"])  # the one saver that kept sends apart
async def test_checkpoints_older_than_format_4_get_their_parents_sends(db: Db) -> None:
    """Before checkpoint format 4, LangGraph's Postgres saver kept a step's pending sends
    as writes of the parent checkpoint (channel __pregel_tasks), and its reader moves them
    into the checkpoint; the import reads them the same way."""
    config = cfg("fan")
    async with db.official() as official:
        await fan_graph(official).ainvoke({"subjects": ["a", "b"], "done": []}, config)
        latest = await official.aget_tuple(config)
    sends = latest.checkpoint["channel_values"][TASKS]
    assert [s.arg["subject"] for s in sends] == ["a", "b"]
    # the thread as an older release wrote it: format 3, no __pregel_tasks channel; the
    # sends are the parent checkpoint's writes (the "plan" task's), as they still are
    parent_id = latest.parent_config["configurable"]["checkpoint_id"]
    parent_sends = db.sql(
        "SELECT count(*) FROM checkpoint_writes WHERE checkpoint_id = %s AND channel = %s",
        (parent_id, TASKS),
    )
    assert parent_sends == [(2,)]
    key = (config["configurable"]["thread_id"], latest.config["configurable"]["checkpoint_id"])
    db.sql(
        "UPDATE checkpoints SET checkpoint = jsonb_set(checkpoint #- "
        "'{channel_versions,__pregel_tasks}', '{v}', '3') "
        "WHERE thread_id = %s AND checkpoint_id = %s",
        key,
    )
    async with db.official() as official:
        theirs = await tuples(official)
        migrated = theirs[(key[0], "", key[1])].checkpoint
        assert migrated["v"] == 3 and migrated["channel_values"][TASKS] == sends
        async with db.ours() as ours:
            await ours.aimport_langgraph()
            await assert_all_read_back_equal(ours, theirs)
            ours_done = await fan_graph(ours).ainvoke(None, config)
        assert ours_done == await fan_graph(official).ainvoke(None, config)
    assert ours_done["done"] == ["A", "B"]


class Scores(TypedDict):
    scores: Annotated[list[float], operator.add]


async def test_a_value_not_equal_to_itself_verifies(db: Db) -> None:
    """NaN != NaN: the read-back check compares such values by their bytes, not ==."""
    builder = StateGraph(Scores)
    builder.add_node("score", lambda state: {"scores": [math.nan, 1.0]})
    builder.add_edge(START, "score")
    builder.add_edge("score", END)
    async with db.official() as official:
        await builder.compile(checkpointer=official).ainvoke({"scores": []}, cfg("nan"))
        n = len(await tuples(official))
    async with db.ours() as ours:
        report = await ours.aimport_langgraph()
        assert report.verified == report.checkpoints_imported == n
        state = await builder.compile(checkpointer=ours).aget_state(cfg("nan"))
    assert math.isnan(state.values["scores"][0]) and state.values["scores"][1:] == [1.0]


def test_sync_saver_imports(db: Db) -> None:
    theirs = asyncio.run(filled(db))
    if db.backend == "sqlite":
        from langgraph_idem_saver import SqliteSaver as Saver
    else:
        from langgraph_idem_saver.postgres import PostgresSaver as Saver
    with Saver.from_conn_string(db.where) as saver:
        report = saver.import_langgraph(batch_size=2)
        assert report.checkpoints_imported == len(theirs)
        for name in THREADS:
            latest = max(k for k in theirs if k[0] == name and k[1] == "")
            assert_same_tuple(saver.get_tuple(cfg(name)), theirs[latest])


async def test_no_langgraph_tables_imports_nothing(saver: Any) -> None:
    report = await saver.aimport_langgraph()
    assert report.source == "none" and not report.changed
    assert str(report) == "no LangGraph checkpoint tables found: nothing to import"


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, True, "10"])
async def test_bad_batch_size_is_refused(saver: Any, batch_size: Any) -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        await saver.aimport_langgraph(batch_size=batch_size)


async def test_a_table_that_is_not_langgraphs_is_a_typed_error(
    db: Db, caplog: pytest.LogCaptureFixture
) -> None:
    db.sql("CREATE TABLE checkpoints (id INTEGER PRIMARY KEY, note TEXT)")
    db.sql("INSERT INTO checkpoints (id, note) VALUES (1, 'mine')")
    caplog.set_level(logging.WARNING, logger=LOGGER)
    async with db.ours() as ours:
        with pytest.raises(ImportLayoutError, match="thread_id") as err:
            await ours.aimport_langgraph()
        assert "nothing was imported" in str(err.value)
    assert [r for r in caplog.records if r.name == LOGGER] == []  # not ours to mention
    assert db.sql("SELECT count(*) FROM idem_checkpoints")[0][0] == 0


async def test_a_missing_writes_table_is_a_typed_error(db: Db) -> None:
    await filled(db)
    db.sql(f"DROP TABLE {db.writes_table()}")
    async with db.ours() as ours:
        with pytest.raises(ImportLayoutError, match=f"{db.writes_table()}.task_id"):
            await ours.aimport_langgraph()
    assert db.sql("SELECT count(*) FROM idem_checkpoints")[0][0] == 0


async def test_a_corrupt_row_is_a_typed_error_naming_it(db: Db) -> None:
    await filled(db)
    if db.backend == "sqlite":
        changed = db.sql("UPDATE checkpoints SET checkpoint = x'c1' WHERE thread_id = 'approval'")
    else:
        changed = db.sql(
            "UPDATE checkpoint_blobs SET blob = '\\xc1'::bytea WHERE thread_id = 'approval'"
        )
    assert changed[0][0] > 0
    async with db.ours() as ours:
        with pytest.raises(CorruptRecordError, match="'approval'"):
            await ours.aimport_langgraph()


async def test_write_indexes_langgraph_never_writes_are_a_typed_error(db: Db) -> None:
    """An ordinary channel at a negative index (LangGraph's put_writes gives those to
    its special channels only): refused, and nothing of that thread is imported."""
    await filled(db)
    changed = db.sql(
        f"UPDATE {db.writes_table()} SET idx = -5 - idx WHERE idx >= 0 AND thread_id = 'chat'"
    )
    assert changed[0][0] > 0
    async with db.ours() as ours:
        with pytest.raises(ImportLayoutError, match="put_writes never writes"):
            await ours.aimport_langgraph()
        # what came before the bad thread ('approval' sorts first) is in, and stays correct
        assert await ours.aget_tuple(cfg("approval")) is not None
        assert await ours.aget_tuple(cfg("chat")) is None
