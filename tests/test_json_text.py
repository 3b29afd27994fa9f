"""``json_text.encoder_of`` calls the C encoder ``json.JSONEncoder.iterencode`` builds for
a one-shot encode. Keys and stored metadata rest on its text, so it must be byte for byte
``JSONEncoder(**options).encode`` - same text, same exceptions - for every option set we
use, and these tests fail loudly if a Python release changes that recipe."""

from __future__ import annotations

import json
import json.encoder
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from langgraph_idem_saver.json_text import encoder_of, many_encoder_of

# every option set the package encodes with (keys.py, saver_codec.py,
# postgres/ledger_rows.py), and json's defaults (backend.step_params)
OPTIONS: list[dict[str, Any]] = [
    {"ensure_ascii": False, "allow_nan": False},
    {"sort_keys": True, "separators": (",", ":"), "ensure_ascii": False, "allow_nan": False},
    {"separators": (",", ":"), "ensure_ascii": False},
    {"separators": (",", ":"), "ensure_ascii": False, "check_circular": False},
    {
        "sort_keys": True,
        "separators": (",", ":"),
        "ensure_ascii": False,
        "allow_nan": False,
        "check_circular": False,
    },
    {"ensure_ascii": False, "sort_keys": True, "separators": (",", ":")},
    {"separators": (",", ":")},
    {},
]

TEXT = st.text(st.characters(exclude_categories=()))
KEYS = TEXT | st.integers() | st.booleans() | st.none() | st.floats(allow_nan=False)
SCALARS = st.none() | st.booleans() | st.integers() | st.floats() | TEXT
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.tuples(inner, inner)
        | st.dictionaries(KEYS, inner, max_size=4)
    ),
)


def outcome(encode: Any, value: Any) -> tuple[str, str]:
    """What encoding ``value`` gives: ("ok", text) or ("error", the exception's type and
    message)."""
    try:
        return "ok", encode(value)
    except Exception as exc:
        return "error", f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(sorted(o)) or "defaults")
@given(value=VALUES)
@example(value={"b": [1, 2.5, None], "a": {"z": "é😀\ud800", "y": True}})
@example(value=[math.nan, math.inf, -math.inf])
@example(value={1: "int key", "1": "str key", None: 0, 2.5: "float key"})
@example(value="a lone string \ud800")
@example(value=("a", "tuple"))
def test_encoder_of_writes_what_json_encoder_writes(options: dict[str, Any], value: Any) -> None:
    assert outcome(encoder_of(**options), value) == outcome(
        json.JSONEncoder(**options).encode, value
    )


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(sorted(o)) or "defaults")
@given(values=st.lists(VALUES, max_size=4))
@example(values=["a lone string \ud800", {"b": 1, "a": [2.5, None]}, ("a", "tuple")])
def test_many_encoder_of_writes_each_value_as_json_encoder_writes_it(
    options: dict[str, Any], values: list[Any]
) -> None:
    """``many_encoder_of``: each text ``check_circular=False`` encoding writes, or the
    first value's error (as a loop of ``encode`` raises it)."""
    one = json.JSONEncoder(**{**options, "check_circular": False}).encode
    assert outcome(many_encoder_of(**options), values) == outcome(
        lambda vs: [one(v) for v in vs], values
    )


@pytest.mark.parametrize("options", OPTIONS, ids=lambda o: ",".join(sorted(o)) or "defaults")
def test_circular_values_and_unknown_types_raise_as_json_raises(options: dict[str, Any]) -> None:
    loop: list[Any] = [1]
    loop.append(loop)
    for bad in (loop, {"x": loop}, {"x": object()}, object()):
        got = outcome(encoder_of(**options), bad)
        assert got[0] == "error"
        assert got == outcome(json.JSONEncoder(**options).encode, bad)
    # a failed encode leaves nothing behind: the next one is not a "circular reference"
    shared = {"k": [1, 2]}
    assert encoder_of(**options)([shared, shared]) == json.JSONEncoder(**options).encode(
        [shared, shared]
    )


def test_the_c_encoder_is_what_runs() -> None:
    """On CPython the one-shot path is the C encoder (``json.encoder.c_make_encoder``): if
    a release drops or renames it, this fails instead of the hot path silently falling
    back to ``encode``."""
    assert getattr(json.encoder, "c_make_encoder", None) is not None
    encode = encoder_of(separators=(",", ":"))
    assert encode.__name__ == "encode" and encode.__qualname__.startswith("encoder_of.")
