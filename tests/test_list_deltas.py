"""Growing list channels are stored as appended deltas: O(N) bytes, identical reads."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Annotated, Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, RemoveMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, StateGraph
from langgraph.graph.message import add_messages
from typing_extensions import TypedDict

from langgraph_idem_saver import AsyncSqliteSaver, CorruptRecordError
from langgraph_idem_saver.list_deltas import MAX_CHAIN


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def chat_graph(checkpointer: Any) -> Any:
    def reply(state: Chat) -> dict[str, Any]:
        last = state["messages"][-1].content
        return {"messages": [AIMessage(content=f"echo {last} " + "x" * 500)]}

    builder = StateGraph(Chat)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    return builder.compile(checkpointer=checkpointer)


async def chat(graph: Any, thread: str, turns: int, start: int = 0) -> None:
    config = {"configurable": {"thread_id": thread}}
    for i in range(start, start + turns):
        await graph.ainvoke({"messages": [HumanMessage(content=f"turn {i}", id=f"h{i}")]}, config)


def blob_stats(db: Path) -> tuple[int, int, int]:
    """(rows, delta rows, bytes) of the messages channel's stored versions."""
    with sqlite3.connect(db) as conn:
        rows, deltas, size = conn.execute(
            "SELECT COUNT(*), COUNT(base_version), SUM(LENGTH(blob)) FROM idem_blobs "
            "WHERE channel = 'messages'"
        ).fetchone()
    return rows, deltas, size


async def history(graph: Any, thread: str) -> list[Any]:
    config = {"configurable": {"thread_id": thread}}
    return [
        # AI message ids are random uuids: compare what the model and user said
        [(m.type, m.content) for m in s.values.get("messages", [])]
        async for s in graph.aget_state_history(config)
    ]


async def test_a_long_chat_stores_each_message_about_once_and_reads_back_identically(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chat.db"
    reference = chat_graph(InMemorySaver())
    await chat(reference, "t", 60)
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 60)
        assert await history(graph, "t") == await history(reference, "t")
    rows, deltas, size = blob_stats(db)
    assert deltas > rows * 0.8, "most versions are stored as deltas"
    whole_each_time = sum(
        len(AsyncSqliteSaver.serde.dumps_typed(msgs)[1])
        for msgs in [[AIMessage(content="x" * 520)] * n for n in range(2, 121, 2)]
    )
    assert size < whole_each_time / 5, "stored bytes grow with what each turn adds"


async def test_reopened_saver_starts_a_fresh_chain_and_reads_stay_equal(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    reference = chat_graph(InMemorySaver())
    await chat(reference, "t", 2 * MAX_CHAIN + 3)
    for start, turns in ((0, MAX_CHAIN + 2), (MAX_CHAIN + 2, MAX_CHAIN + 1)):
        async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
            await chat(chat_graph(saver), "t", turns, start)
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        assert await history(chat_graph(saver), "t") == await history(reference, "t")


async def test_a_replaced_or_removed_message_is_stored_whole(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 3)
        config = {"configurable": {"thread_id": "t"}}
        await graph.aupdate_state(config, {"messages": [RemoveMessage(id="h1")]})
        await graph.aupdate_state(config, {"messages": [HumanMessage("edited", id="h0")]})
        values = (await graph.aget_state(config)).values["messages"]
    assert [m.id for m in values if m.type == "human"] == ["h0", "h2"]
    assert values[0].content == "edited"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        again = (await chat_graph(saver).aget_state(config)).values["messages"]
    assert [(m.id, m.content) for m in again] == [(m.id, m.content) for m in values]


async def test_a_delta_whose_base_was_deleted_elsewhere_is_written_whole(tmp_path: Path) -> None:
    db = tmp_path / "chat.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", 2)
        # another process deletes the thread's blobs behind this saver's back
        with sqlite3.connect(db) as other:
            other.execute("DELETE FROM idem_blobs WHERE channel = 'messages'")
        await chat(graph, "t", 1, start=2)
        state = await graph.aget_state({"configurable": {"thread_id": "t"}})
    with sqlite3.connect(db) as conn:
        first_after = conn.execute(
            "SELECT base_version FROM idem_blobs WHERE channel = 'messages' ORDER BY version"
        ).fetchone()
    assert first_after == (None,), "the base it would extend is gone: stored whole"
    # LangGraph rebuilt the lost versions from the pending writes it keeps
    human = [m.content for m in state.values["messages"] if m.type == "human"]
    assert human == ["turn 0", "turn 1", "turn 2"]


async def test_a_missing_base_is_reported_as_corrupt_not_read_as_a_short_list(
    tmp_path: Path,
) -> None:
    db = tmp_path / "chat.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        await chat(chat_graph(saver), "t", 4)
    with sqlite3.connect(db) as conn:
        (base,) = conn.execute(
            "SELECT base_version FROM idem_blobs WHERE base_version IS NOT NULL "
            "ORDER BY version DESC LIMIT 1"
        ).fetchone()
        conn.execute("DELETE FROM idem_blobs WHERE channel = 'messages' AND version = ?", (base,))
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        with pytest.raises(CorruptRecordError, match="missing_base_version"):
            await saver.aget_tuple({"configurable": {"thread_id": "t"}})


@pytest.mark.parametrize("operation", ["prune", "copy", "delete_for_runs"])
async def test_maintenance_keeps_the_bases_that_live_deltas_need(
    tmp_path: Path, operation: str
) -> None:
    db = tmp_path / "chat.db"
    async with AsyncSqliteSaver.from_conn_string(str(db)) as saver:
        graph = chat_graph(saver)
        await chat(graph, "t", MAX_CHAIN // 2)
        config = {"configurable": {"thread_id": "t"}, "metadata": {"run_id": "last-run"}}
        await graph.ainvoke({"messages": [HumanMessage("last", id="hl")]}, config)
        before = (await graph.aget_state(config)).values["messages"]
        target = "t"
        if operation == "prune":
            await saver.aprune(["t"], strategy="keep_latest")
        elif operation == "copy":
            await saver.acopy_thread("t", "fork")
            await saver.adelete_thread("t")
            target = "fork"
        else:
            await saver.adelete_for_runs(["last-run"])
        after = (await graph.aget_state({"configurable": {"thread_id": target}})).values
    expected = before if operation != "delete_for_runs" else before[:-2]
    assert [(m.id, m.content) for m in after["messages"]] == [(m.id, m.content) for m in expected]
