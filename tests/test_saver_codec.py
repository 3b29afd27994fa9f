"""The JSON texts both backends store (metadata, channel versions) and compare against
(metadata filters) are exactly what ``json.dumps`` with the same arguments writes: the
encoders are built once (``saver_codec``), and a text that changed by one byte would
make metadata filters stop matching what earlier releases stored."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.saver_codec import canonical_json, encode_metadata, encode_versions
from langgraph_idem_saver.surrogates import escape_surrogates

KEYWORDS: dict[str, Any] = {"ensure_ascii": False, "sort_keys": True, "separators": (",", ":")}

# JSON values as metadata holds them: any text (lone surrogates included), numbers, nesting
TEXT = st.text(st.characters(exclude_categories=()))
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | TEXT
)
VALUES = st.recursive(
    SCALARS, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(TEXT, inner, max_size=4)
)


@given(st.dictionaries(TEXT, VALUES, max_size=6))
@example({"source": "loop", "step": 3, "parents": {}, "run_id": "r-1"})
@example({"é😀": ["\ud800", 1.5, None, True], "z": {"b": 2, "a": [1, {"x": ""}]}})
def test_metadata_and_its_canonical_form_are_json_dumps_text(metadata: dict[str, Any]) -> None:
    assert encode_metadata(metadata) == escape_surrogates(
        json.dumps(metadata, allow_nan=False, **KEYWORDS)
    )
    assert canonical_json(metadata) == json.dumps(metadata, **KEYWORDS)


@given(st.dictionaries(TEXT, st.one_of(TEXT, st.integers(), st.floats()), max_size=8))
@example({"__start__": "00000000000000000000000000000002.0.3", "messages": 7})
def test_channel_versions_are_json_dumps_text(versions: dict[str, Any]) -> None:
    expected = json.dumps({k: str(v) for k, v in versions.items()}, separators=(",", ":"))
    assert encode_versions(versions) == expected


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_metadata_that_json_cannot_hold_exactly_is_refused(bad: float) -> None:
    with pytest.raises(SerializationError):
        encode_metadata({"score": bad})
