"""What PostgreSQL text and JSONB can hold, and metadata made to fit them.

Text cannot hold NUL characters or unpaired surrogates, and JSONB normalizes numbers: ids
that do not fit are refused (:class:`ConfigError`), metadata that does not fit is stored
sanitized for filtering next to its exact text, and filters are narrowed in SQL only in
ways that never drop a match (the exact Python check decides).
"""

from __future__ import annotations

import json
import math
from typing import Any

from langgraph.checkpoint.base import CheckpointMetadata

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.saver_codec import canonical_json, encode_metadata, has_number
from langgraph_idem_saver.surrogates import utf8_ok


def as_text(value: str, what: str) -> str:
    """An id as PostgreSQL text, or a ConfigError for what TEXT cannot hold."""
    if value.isascii():
        if "\x00" not in value:
            return value
    elif "\x00" not in value and utf8_ok(value):
        return value
    raise ConfigError(
        f"{what} {value!r} cannot be stored in PostgreSQL: text cannot hold NUL characters "
        "or unpaired surrogates"
    )


def clean_str(value: str) -> bool:
    """Whether JSONB holds this string exactly (no NUL, no unpaired surrogate)."""
    if "\x00" in value:
        return False
    return value.isascii() or utf8_ok(value)


def jsonb_exact(value: Any) -> bool:
    """Whether JSONB round-trips this (already JSON-encodable) value exactly.

    JSONB refuses NUL characters and unpaired surrogates, and prints numbers in plain
    decimal: ``1e+16`` would come back as the int ``10000000000000000`` and ``-0.0``
    as ``0.0``.
    """
    if value is None or isinstance(value, (bool, int)):
        return True
    if isinstance(value, str):
        return clean_str(value)
    if isinstance(value, float):
        return "e+" not in repr(value) and not (value == 0.0 and math.copysign(1.0, value) < 0)
    if isinstance(value, dict):
        return all(
            (not isinstance(k, str) or clean_str(k)) and jsonb_exact(v) for k, v in value.items()
        )
    if isinstance(value, (list, tuple)):
        return all(jsonb_exact(v) for v in value)
    return False


def sanitize(value: Any) -> Any:
    """A JSONB-storable stand-in: NUL and unpaired surrogates become U+FFFD.

    Applied alike to stored metadata and to filter values, so equal values still match
    (the Python check on the exact metadata then removes false positives).
    """
    if isinstance(value, str):
        if clean_str(value):
            return value
        return "".join(
            "\ufffd" if ch == "\x00" or 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in value
        )
    if isinstance(value, dict):
        return {sanitize(k): sanitize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [sanitize(v) for v in value]
    return value


def metadata_columns(metadata: CheckpointMetadata) -> tuple[str, str | None]:
    """``(metadata JSONB text, metadata_exact)``: the exact text only when JSONB can't
    hold the metadata as is."""
    text = encode_metadata(metadata)
    if jsonb_exact(metadata):
        return text, None
    safe = sanitize(json.loads(text))
    return json.dumps(safe, ensure_ascii=False, sort_keys=True, separators=(",", ":")), text


def metadata_filter(filter: dict[str, Any], params: dict[str, Any]) -> list[str]:
    """SQL conditions that keep every row whose top-level metadata matches ``filter``
    (with keys and values bound); ``_matches`` then checks each row exactly.

    Equality follows Python's (``1 == 1.0 == True``), as LangGraph's in-memory saver
    compares; a ``None`` filter value also matches an absent key, as there.
    """
    clauses: list[str] = []
    for n, (key, value) in enumerate(filter.items()):
        if not isinstance(key, str):
            raise ConfigError(f"metadata filter keys must be str, got {type(key).__name__}")
        if not clean_str(key):
            # stored metadata holds such keys sanitized (U+FFFD), where two keys can
            # collide: narrowing by one could drop a real match. The exact check decides.
            continue
        k, v = f"fk{n}", f"fv{n}"
        params[k] = key
        if value is None:
            clauses.append(f"COALESCE(metadata -> %({k})s, 'null'::jsonb) = 'null'::jsonb")
        elif isinstance(value, (bool, int, float)):
            if isinstance(value, float) and not math.isfinite(value):
                clauses.append("FALSE")  # NaN and infinities equal no JSON value
                continue
            alternatives = [json.dumps(value if isinstance(value, float) else int(value))]
            if value == 1:
                alternatives.append("true")
            elif value == 0:
                alternatives.append("false")
            params[v] = alternatives
            clauses.append(f"metadata -> %({k})s = ANY(%({v})s::jsonb[])")
        elif isinstance(value, str):
            params[v] = json.dumps(sanitize(value), ensure_ascii=False)
            clauses.append(f"metadata -> %({k})s = %({v})s::jsonb")
        else:
            try:
                text = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"metadata filter value for {key!r} is not JSON: {exc}") from exc
            if has_number(value) or not isinstance(value, (dict, list, tuple)):
                # JSONB compares true and 1 as different; narrow by kind only
                params[v] = "object" if isinstance(value, dict) else "array"
                clauses.append(f"jsonb_typeof(metadata -> %({k})s) = %({v})s")
            else:
                params[v] = json.dumps(sanitize(json.loads(text)), ensure_ascii=False)
                clauses.append(f"metadata -> %({k})s = %({v})s::jsonb")
    return clauses
