"""The sync savers' ``put``, ``put_writes`` and ``list`` take their arguments exactly as
LangGraph's ``BaseCheckpointSaver`` declares them: the same names, kinds and defaults
(``list``'s ``filter``, ``before`` and ``limit`` keyword-only), positional and keyword
calls storing and reading alike, and a call LangGraph refuses refused too - when it is
made, as LangGraph's own savers refuse it (``InMemorySaver``, the control), not at the
first ``next()`` of ``list``'s generator."""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_idem_saver import PostgresSaver, SqliteSaver

METHODS = ("put", "put_writes", "list")


def _parameters(method: Any) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(method).parameters.values()]


@pytest.mark.parametrize("saver_class", [SqliteSaver, PostgresSaver])
@pytest.mark.parametrize("name", METHODS)
def test_sync_methods_declare_langgraphs_parameters(saver_class: type[Any], name: str) -> None:
    ours = getattr(saver_class, name)
    assert _parameters(ours) == _parameters(getattr(BaseCheckpointSaver, name))
    # and they bind as declared: keyword-only stays keyword-only
    cfg = {"configurable": {"thread_id": "t"}}
    if name == "list":
        with pytest.raises(TypeError):
            inspect.signature(ours).bind(object(), cfg, {"step": 1})


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    with SqliteSaver.from_conn_string(str(tmp_path / "sig.db")) as s:
        yield s


def _checkpoint(n: int) -> Any:
    checkpoint = empty_checkpoint()
    checkpoint["id"] = f"1ef00000-0000-6000-8000-00000000000{n}"
    return checkpoint


def _put_two(s: BaseCheckpointSaver[Any]) -> tuple[RunnableConfig, RunnableConfig]:
    """Two checkpoints of thread ``t``, the first put positionally, the second by keyword."""
    root: RunnableConfig = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    first = s.put(root, _checkpoint(1), {"source": "input", "step": -1}, {})
    second = s.put(
        config=first, checkpoint=_checkpoint(2), metadata={"source": "loop", "step": 0},
        new_versions={},
    )  # fmt: skip
    return first, second


def test_positional_and_keyword_calls_store_and_read_alike(saver: SqliteSaver) -> None:
    first, second = _put_two(saver)
    assert second["configurable"]["checkpoint_id"] == _checkpoint(2)["id"]
    saver.put_writes(second, [("a", 1)], "task-1", "path-1")
    saver.put_writes(config=second, writes=[("b", 2)], task_id="task-2", task_path="path-2")
    saver.put_writes(second, [("c", 3)], task_id="task-3")  # task_path's default
    tup = saver.get_tuple(second)
    assert tup is not None
    assert sorted(tup.pending_writes or []) == [
        ("task-1", "a", 1),
        ("task-2", "b", 2),
        ("task-3", "c", 3),
    ]
    by_keyword = saver.list(config={"configurable": {"thread_id": "t"}}, limit=1)
    assert [t.config["configurable"]["checkpoint_id"] for t in by_keyword] == [_checkpoint(2)["id"]]
    found = saver.list(first, filter={"source": "input"}, before=None)
    assert [t.metadata["source"] for t in found] == ["input"]
    older = saver.list(None, before=second)
    assert [t.config["configurable"]["checkpoint_id"] for t in older] == [_checkpoint(1)["id"]]


@pytest.mark.parametrize("saver_kind", ["InMemorySaver (control)", "SqliteSaver"])
def test_list_refuses_positional_filter_when_called(saver_kind: str, saver: SqliteSaver) -> None:
    s: BaseCheckpointSaver[Any] = InMemorySaver() if saver_kind.startswith("InMemory") else saver
    _put_two(s)
    cfg: RunnableConfig = {"configurable": {"thread_id": "t"}}
    # the call itself raises, before any iteration (list is a generator function)
    with pytest.raises(TypeError):
        s.list(cfg, {"source": "input"})  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.list(cfg, None, None, 1)  # type: ignore[misc]
    with pytest.raises(TypeError):
        s.list(cfg, limt=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        s.list()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        s.put_writes(cfg, [], "task", "", "extra")  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        s.put(cfg, _checkpoint(3), {})  # type: ignore[call-arg]
