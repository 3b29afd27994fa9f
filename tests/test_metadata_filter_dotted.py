"""Dotted metadata filter keys on the SQLite savers match what LangGraph's SqliteSaver
matches: ``{"user.access-level": "nested"}`` names ``metadata["user"]["access-level"]``.

A differential test: the same checkpoints written to LangGraph's ``SqliteSaver`` and to
ours (sync and async), listed with the same filters, give the same checkpoints. Then the
part of the rule LangGraph's saver does not have: a key the metadata holds as written
(``"a.b"`` at the top level) still matches as it is, before any path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.sqlite import SqliteSaver as OfficialSqliteSaver

from langgraph_idem_saver import AsyncSqliteSaver, SqliteSaver
from langgraph_idem_saver.sqlite.metadata_filter import metadata_matches, value_at

METADATA: list[dict[str, Any]] = [
    {"source": "input", "step": 1, "user": {"access-level": "nested", "name": "ann"}},
    {"source": "loop", "step": 2, "user": {"access-level": "admin"}},
    {"source": "loop", "step": 3, "user": {"profile": {"tier": "gold"}}},
    {"source": "loop", "step": 4, "user": "flat"},
    {"source": "loop", "step": 5},
    {"source": "loop", "step": 6, "user": {"access-level": None}},
    {"source": "update", "step": 7, "user": {"profile": {"tier": "silver", "n": 2}}},
]
FILTERS: list[dict[str, Any]] = [
    {"user.access-level": "nested"},
    {"user.access-level": "admin"},
    {"user.profile.tier": "gold"},
    {"user.profile.tier": "silver", "source": "update"},
    {"user.profile.n": 2},
    {"user.access-level": None},
    {"user.name": "ann", "source": "input"},
    {"user.name": "bob"},
    {"user.access-level": "nested", "step": 1},
    {"user.missing.deep": None},
    {"user.profile": "gold"},
    {"step": 3},
    {"source": "loop"},
]


def write_all(saver: Any) -> list[str]:
    """The same checkpoints (same ids) in ``saver``; their ids in order."""
    ids = []
    parent: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
    for i, metadata in enumerate(METADATA):
        checkpoint = empty_checkpoint()
        checkpoint["id"] = f"1ef00000-0000-6000-8000-{i:012d}"
        parent = saver.put(parent, checkpoint, metadata, {})
        ids.append(checkpoint["id"])
    return ids


def listed(saver: Any, filter: dict[str, Any]) -> list[str]:
    return [t.config["configurable"]["checkpoint_id"] for t in saver.list(None, filter=filter)]


async def alisted(saver: Any, filter: dict[str, Any]) -> list[str]:
    return [
        t.config["configurable"]["checkpoint_id"] async for t in saver.alist(None, filter=filter)
    ]


@pytest.fixture
def official(tmp_path: Path) -> Any:
    with OfficialSqliteSaver.from_conn_string(str(tmp_path / "official.db")) as saver:
        write_all(saver)
        yield saver


def test_dotted_keys_match_as_on_langgraphs_sqlite_saver(official: Any, tmp_path: Path) -> None:
    with SqliteSaver.from_conn_string(str(tmp_path / "ours.db")) as ours:
        write_all(ours)
        for filter in FILTERS:
            theirs = listed(official, filter)
            assert listed(ours, filter) == theirs, filter
        # the differential can see a difference: the nested ones match something
        assert listed(official, {"user.access-level": "nested"}) != []
        assert listed(official, {"user.profile.tier": "gold"}) != []


async def test_the_async_saver_matches_the_same(official: Any, tmp_path: Path) -> None:
    async with AsyncSqliteSaver.from_conn_string(str(tmp_path / "ours.db")) as ours:
        for i, metadata in enumerate(METADATA):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = f"1ef00000-0000-6000-8000-{i:012d}"
            await ours.aput(
                {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}, checkpoint, metadata, {}
            )
        for filter in FILTERS:
            assert await alisted(ours, filter) == listed(official, filter), filter


def test_a_key_held_as_written_matches_as_it_is(tmp_path: Path) -> None:
    """LangGraph's saver reads ``"a.b"`` only as a path; ours first as the key it is,
    when the metadata has that key (a filter that matched before still matches)."""
    with SqliteSaver.from_conn_string(str(tmp_path / "ours.db")) as ours:
        parent: dict[str, Any] = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        rows = [{"a.b": 1}, {"a": {"b": 1}}, {"a.b": 1, "a": {"b": 2}}, {"a..b": 3}]
        ids = []
        for i, metadata in enumerate(rows):
            checkpoint = empty_checkpoint()
            checkpoint["id"] = f"1ef00000-0000-6000-8000-{i:012d}"
            parent = ours.put(parent, checkpoint, metadata, {})
            ids.append(checkpoint["id"])
        assert sorted(listed(ours, {"a.b": 1})) == ids[:3]
        assert listed(ours, {"a.b": 2}) == []  # the key as written wins over the path
        assert listed(ours, {"a..b": 3}) == [ids[3]]  # an empty part: a key only


def test_the_rule_in_python() -> None:
    metadata = {"a": {"b": {"c": 1}}, "x.y": "literal", "list": [{"0": 1}], "n": None}
    assert value_at(metadata, "a.b.c") == 1
    assert value_at(metadata, "a.b") == {"c": 1}
    assert value_at(metadata, "x.y") == "literal"
    assert value_at(metadata, "a.z") is None and value_at(metadata, "a.b.c.d") is None
    assert value_at(metadata, "list.0") is None  # objects only, as SQLite's '$.list.0'
    assert value_at(metadata, ".a") is None and value_at(metadata, "a.") is None
    assert metadata_matches(metadata, {"a.b.c": 1, "n": None, "absent.key": None})
    assert not metadata_matches(metadata, {"a.b.c": 2})
