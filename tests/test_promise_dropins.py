"""README, "Use": "The savers are drop-ins: the class names, constructors and
``from_conn_string`` match LangGraph's, so switching is a one-line import change", and
"``IdempotentToolNode(tools, ...)`` takes every ``ToolNode`` argument".

Checked against the installed LangGraph: every parameter of LangGraph's class is one of
ours, of the same kind with the same default (ours may add keyword-only ones), or ours
takes ``**options`` and the SQLite savers are then built with LangGraph's keywords for
real."""

from __future__ import annotations

import inspect
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.postgres import PostgresSaver as LgPostgresSaver
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as LgAsyncPostgresSaver
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer
from langgraph.checkpoint.sqlite import SqliteSaver as LgSqliteSaver
from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as LgAsyncSqliteSaver
from langgraph.prebuilt import ToolNode

import langgraph_idem_saver as ours

PAIRS = [
    (LgSqliteSaver, ours.SqliteSaver),
    (LgAsyncSqliteSaver, ours.AsyncSqliteSaver),
    (LgPostgresSaver, ours.PostgresSaver),
    (LgAsyncPostgresSaver, ours.AsyncPostgresSaver),
]


def takes_everything(theirs: Callable[..., Any], mine: Callable[..., Any]) -> list[str]:
    """LangGraph's parameters ``mine`` does not take as LangGraph does."""
    their_params = inspect.signature(theirs).parameters
    my_params = inspect.signature(mine).parameters
    var_kw = any(p.kind is p.VAR_KEYWORD for p in my_params.values())
    wrong = []
    for name, param in their_params.items():
        mine_p = my_params.get(name)
        if mine_p is None:
            if not (var_kw and param.kind in (param.KEYWORD_ONLY, param.POSITIONAL_OR_KEYWORD)):
                wrong.append(name)
        elif (mine_p.kind, mine_p.default) != (param.kind, param.default):
            wrong.append(name)
    positional = [n for n, p in their_params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
    assert [n for n in my_params if n in positional] == positional, "same positional order"
    return wrong


@pytest.mark.parametrize(("theirs", "mine"), PAIRS, ids=lambda c: c.__module__)
def test_the_savers_take_langgraphs_arguments(theirs: type, mine: type) -> None:
    assert mine.__name__ == theirs.__name__
    assert takes_everything(theirs.__init__, mine.__init__) == []
    assert takes_everything(theirs.from_conn_string, mine.from_conn_string) == []


def test_the_sync_sqlite_saver_is_built_as_langgraphs_is(tmp_path: Path) -> None:
    """``SqliteSaver`` takes ``**options``: LangGraph's own calls, for real."""
    path = str(tmp_path / "a.db")
    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        with ours.SqliteSaver(conn, serde=JsonPlusSerializer()) as saver:
            saver.setup()
            assert list(saver.list(None)) == []
    finally:
        conn.close()
    with ours.SqliteSaver.from_conn_string(path) as saver:
        assert list(saver.list(None)) == []


async def test_the_async_sqlite_saver_from_conn_string_as_langgraphs(tmp_path: Path) -> None:
    async with ours.AsyncSqliteSaver.from_conn_string(str(tmp_path / "b.db")) as saver:
        assert [c async for c in saver.alist(None)] == []


def test_the_tool_node_takes_every_tool_node_argument() -> None:
    assert takes_everything(ToolNode.__init__, ours.IdempotentToolNode.__init__) == []
