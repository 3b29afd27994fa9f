"""A long list's delta chain on SQLite, read back through the sync saver: every value of
the chain read (the probes below the join's one base, ``sqlite/reads.py``), and a base
missing or corrupt at any depth is the row's ``CorruptRecordError`` - never a short list
or a raw error - on ``get_tuple`` and on a page of ``list``. Real parts: our sync
``SqliteSaver`` on a file, a chat graph of six turns (a chain twelve versions deep)."""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest
from langchain_core.messages import HumanMessage
from test_list_deltas import chat_graph
from tool_node_helpers import cfg

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.sqlite import SqliteSaver

TURNS = 6


@pytest.fixture(scope="module")
def chatted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str], int]:
    """A database after the chat, the latest list's chain (newest first), its length."""
    db = tmp_path_factory.mktemp("chain") / "chat.db"
    with _saver(db) as saver:
        graph = chat_graph(saver)
        for turn in range(TURNS):
            graph.invoke({"messages": [HumanMessage(f"turn {turn}")]}, cfg("t"))
        latest = saver.get_tuple(cfg("t"))
        assert latest is not None
        length = len(latest.checkpoint["channel_values"]["messages"])
    with sqlite3.connect(db) as conn:
        [(version,)] = conn.execute(
            "SELECT version FROM idem_blobs WHERE channel = 'messages' "
            "ORDER BY version DESC LIMIT 1"
        ).fetchall()
        chain = []
        while version is not None:
            chain.append(version)
            [(version,)] = conn.execute(
                "SELECT base_version FROM idem_blobs WHERE channel = 'messages' AND version = ?",
                (version,),
            ).fetchall()
    assert len(chain) > 3, chain  # deeper than the join's one base
    return db, chain, length


class _saver:
    def __init__(self, db: Path) -> None:
        self.conn = sqlite3.connect(db, check_same_thread=False)
        self.saver = SqliteSaver(self.conn)

    def __enter__(self) -> SqliteSaver:
        self.saver.__enter__()
        self.saver.setup()
        return self.saver

    def __exit__(self, *exc: object) -> None:
        try:
            self.saver.__exit__(*exc)
        finally:
            self.conn.close()


@pytest.fixture
def copy(chatted: tuple[Path, list[str], int], tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "copy.db"
    shutil.copy(chatted[0], path)
    yield path


def test_the_whole_chain_reads_back(chatted: tuple[Path, list[str], int], copy: Path) -> None:
    length = chatted[2]
    with _saver(copy) as saver:
        latest = saver.get_tuple(cfg("t"))
        assert latest is not None
        messages = latest.checkpoint["channel_values"]["messages"]
        assert len(messages) == length == 2 * TURNS
        assert [m.content for m in messages if m.type == "human"] == [
            f"turn {t}" for t in range(TURNS)
        ]
        page = list(saver.list(cfg("t"), limit=4))  # the page's probes: as one tuple's
        assert page[0].checkpoint == latest.checkpoint
        for read in page[1:]:
            alone = saver.get_tuple(read.config)
            assert alone is not None and alone.checkpoint == read.checkpoint


@pytest.mark.parametrize("damage", ["missing", "corrupt"])
@pytest.mark.parametrize("depth", [1, 2, 3, -1])
def test_a_base_missing_or_corrupt_at_any_depth_is_the_rows_corrupt_record_error(
    chatted: tuple[Path, list[str], int], copy: Path, depth: int, damage: str
) -> None:
    _, chain, _ = chatted
    with sqlite3.connect(copy) as conn:
        if damage == "missing":
            statement = "DELETE FROM idem_blobs WHERE channel = 'messages' AND version = ?"
        else:
            statement = (
                "UPDATE idem_blobs SET blob = x'c1ffff' WHERE channel = 'messages' AND version = ?"
            )
        assert conn.execute(statement, (chain[depth],)).rowcount == 1
    with _saver(copy) as saver:
        with pytest.raises(CorruptRecordError, match="channel value") as caught:
            saver.get_tuple(cfg("t"))
        assert "'t'" in str(caught.value)
        with pytest.raises(CorruptRecordError, match="channel value"):
            list(saver.list(cfg("t"), limit=3))
