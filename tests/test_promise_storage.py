"""README, "Design decisions": storage grows far slower than LangGraph's - a growing
``messages`` list is stored as its appended items with a whole copy every 16 versions
(LangGraph's saver writes a whole copy every turn) - and the same list re-versioned
without growing (a node that returns the whole list) stores its last delta's row again,
not the list, while the node's write (the list it returned) is kept as a pending write.

The same graph runs the same chat on LangGraph's ``AsyncSqliteSaver`` (the control: its
file grows with the square of the chat) and on ours, each on a real SQLite file."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as LgAsyncSqliteSaver
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_idem_saver import AsyncSqliteSaver

TURNS = 32
TEXT = "x" * 256


def chat_graph(saver: Any, *, rewrite: bool = False) -> Any:
    """One node answering each user message; ``rewrite``: a second node returning the
    whole, unchanged list (a new version of the channel, no new item)."""

    def answer(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(TEXT, id=f"ai-{len(state['messages'])}")]}

    def whole(state: MessagesState) -> dict[str, Any]:
        return {"messages": state["messages"]}

    builder = StateGraph(MessagesState)
    builder.add_node("answer", answer)
    builder.add_edge(START, "answer")
    if rewrite:
        builder.add_node("whole", whole)
        builder.add_edge("answer", "whole")
    return builder.compile(checkpointer=saver)


def file_bytes(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path.stat().st_size


async def chat(saver_class: Any, path: Path, turns: int, *, rewrite: bool = False) -> int:
    async with saver_class.from_conn_string(str(path)) as saver:
        graph = chat_graph(saver, rewrite=rewrite)
        for turn in range(turns):
            message = {"role": "user", "content": TEXT, "id": f"u-{turn}"}
            await graph.ainvoke({"messages": [message]}, {"configurable": {"thread_id": "t"}})
    return file_bytes(path)


async def test_a_growing_chat_takes_a_fraction_of_langgraphs_storage(tmp_path: Path) -> None:
    theirs = await chat(LgAsyncSqliteSaver, tmp_path / "theirs.db", TURNS)
    ours = await chat(AsyncSqliteSaver, tmp_path / "ours.db", TURNS)
    assert ours * 3 < theirs, (ours, theirs)


def table_bytes(path: Path, table: str, column: str) -> int:
    with closing(sqlite3.connect(path)) as conn:
        row = conn.execute(f"SELECT coalesce(sum(length({column})), 0) FROM {table}").fetchone()
    return int(row[0])


async def test_the_same_list_re_versioned_stores_no_copy_of_it(tmp_path: Path) -> None:
    """Each turn with a node returning the whole list adds a version of ``messages``
    holding no new item: its channel value costs a row of about one message, not the
    list; the node's write (the whole list, as LangGraph's saver keeps it) is what grows."""
    plain, rewritten = tmp_path / "plain.db", tmp_path / "rewritten.db"
    await chat(AsyncSqliteSaver, plain, TURNS)
    await chat(AsyncSqliteSaver, rewritten, TURNS, rewrite=True)
    values = table_bytes(rewritten, "idem_blobs", "blob") - table_bytes(plain, "idem_blobs", "blob")
    assert values < TURNS * 1024, values  # a whole list would be ~TURNS * 2 * 300 bytes a turn
    writes = table_bytes(rewritten, "idem_writes", "value") - table_bytes(
        plain, "idem_writes", "value"
    )
    assert writes > TURNS * TURNS * len(TEXT), writes  # the control: the lists it returned
