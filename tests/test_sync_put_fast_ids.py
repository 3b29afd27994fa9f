"""The ids' fast test (``saver_config``) decides exactly as the general path.

``thread_id_of``, ``checkpoint_ns_of`` and ``checkpoint_id_value`` (every ``put`` and
``put_writes`` of a graph reads three or four ids) accept the common id - a ``str`` of
ASCII without NUL, not too long - with one test and hand anything else to the general
path. The fast test must accept nothing the general path refuses and return the very
value it would: here both are run on the same inputs (any text, including non-ASCII,
NUL, lone surrogates and ids about the size limit; non-``str`` values; ``str``
subclasses), and their answers - the value and its type, or the error's type and
message - compared. Derandomized under CI by the suite's Hypothesis profile.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.saver_config import (
    MAX_ID_BYTES,
    _checkpoint_id_checked,
    _checkpoint_ns_checked,
    _thread_id_checked,
    checkpoint_id_of,
    checkpoint_id_value,
    checkpoint_ns_of,
    thread_id_of,
)
from langgraph_idem_saver.sqlite import SqliteSaver


class Text(str):
    """A ``str`` subclass: the fast test leaves it to the general path."""


# every code point, lone surrogates included (Hypothesis leaves them out by default)
ANY_CHAR = st.characters(exclude_categories=())
LONG = st.integers(MAX_ID_BYTES - 3, MAX_ID_BYTES + 3)
TEXTS = st.one_of(
    st.text(ANY_CHAR, max_size=12),
    st.text(st.sampled_from("ab\x00é\ud800"), max_size=6),
    st.builds(lambda n, c: "a" * n + c, LONG, st.sampled_from(["", "\x00", "é", "\udfff"])),
    st.builds(lambda n: "é" * (n // 2), LONG),  # 2 bytes a character: near the limit
)
IDS = st.one_of(
    TEXTS,
    TEXTS.map(Text),
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.binary(max_size=4),
    st.just(["t"]),
)


def answer(read: Callable[[Any], Any], value: Any) -> tuple[Any, ...]:
    """What ``read(value)`` does: its result and the result's type, or its error."""
    try:
        got = read(value)
    except Exception as exc:  # compared as given, typed or not
        return ("error", type(exc), str(exc))
    return ("value", got, type(got))


def configured(key: str, value: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": "t", key: value}}


@settings(max_examples=5 * settings.default.max_examples)
@given(IDS)
@example("")
@example("a" * MAX_ID_BYTES)
@example("a" * (MAX_ID_BYTES + 1))
@example("a\x00b")
@example("\ud800")
@example(Text("t"))
@example(7)
@example(True)
def test_thread_id_fast_test_decides_as_the_general_path(value: Any) -> None:
    config = {"configurable": {"thread_id": value}}
    fast = answer(thread_id_of, config)
    assert fast == answer(_thread_id_checked, config)
    common = type(value) is str and value.isascii() and "\x00" not in value
    if common and 0 < len(value) <= MAX_ID_BYTES:
        assert thread_id_of(config) is value  # the common case: accepted, as itself


@settings(max_examples=5 * settings.default.max_examples)
@given(IDS)
@example("")
@example("a" * (MAX_ID_BYTES + 1))
@example("\x00")
@example("\udfff")
@example(None)
@example(Text("ns"))
def test_checkpoint_ns_fast_test_decides_as_the_general_path(value: Any) -> None:
    fast = answer(checkpoint_ns_of, configured("checkpoint_ns", value))
    assert fast == answer(_checkpoint_ns_checked, value)


@settings(max_examples=5 * settings.default.max_examples)
@given(IDS)
@example("")
@example("a" * MAX_ID_BYTES)
@example("a" * (MAX_ID_BYTES + 1))
@example("1ef-\x00")
@example("\ud83d")
@example(None)
@example(Text("c"))
def test_checkpoint_id_fast_test_decides_as_the_general_path(value: Any) -> None:
    general = answer(_checkpoint_id_checked, value)
    assert answer(checkpoint_id_value, value) == general
    assert answer(checkpoint_id_of, configured("checkpoint_id", value)) == general


@pytest.mark.parametrize(
    "config",
    [None, {}, {"configurable": None}, {"configurable": ["t"]}, {"configurable": {}}],
)
def test_a_config_without_a_thread_takes_the_general_paths_error(config: Any) -> None:
    with pytest.raises(ConfigError) as fast:
        thread_id_of(config)
    with pytest.raises(ConfigError) as general:
        _thread_id_checked(config)
    assert str(fast.value) == str(general.value)


def test_a_put_refuses_a_bad_id_before_writing(tmp_path: Path) -> None:
    """Through a real sync put: each bad id is the same typed error, and nothing is
    stored; a good put after them is stored (the control)."""
    conn = sqlite3.connect(tmp_path / "ids.db", check_same_thread=False)
    with SqliteSaver(conn) as saver:
        saver.setup()
        checkpoint: dict[str, Any] = {
            "v": 4,
            "id": "1",
            "ts": "2026-11-28T00:00:00+00:00",
            "channel_values": {"log": ["a"]},
            "channel_versions": {"log": "1"},
            "versions_seen": {},
            "updated_channels": ["log"],
        }
        bad = [
            ({"thread_id": "t\x00"}, {}, "NUL"),
            ({"thread_id": "a" * (MAX_ID_BYTES + 1)}, {}, "limit"),
            ({"thread_id": "t", "checkpoint_ns": "\ud800"}, {}, "surrogate"),
            ({"thread_id": "t", "checkpoint_id": 5}, {}, "must be a str"),
            ({"thread_id": "t"}, {"id": "x" * (MAX_ID_BYTES + 1)}, "limit"),
        ]
        for configurable, changed, message in bad:
            with pytest.raises(ConfigError, match=message):
                saver.put(
                    {"configurable": configurable}, {**checkpoint, **changed}, {}, {"log": "1"}
                )
        assert conn.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (0,)
        saver.put({"configurable": {"thread_id": "t"}}, checkpoint, {}, {"log": "1"})
        assert conn.execute("SELECT count(*) FROM idem_checkpoints").fetchone() == (1,)
    conn.close()
