"""How both backends encode what they store as JSON text, and decode what they read back:
metadata (canonical, lossless, filterable), channel versions, serialized values. A
stored value that does not decode is a :class:`CorruptRecordError` naming where it is.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import ChannelVersions, CheckpointMetadata

from langgraph_idem_saver.errors import CorruptRecordError, SerializationError
from langgraph_idem_saver.json_text import encoder_of
from langgraph_idem_saver.surrogates import escape_surrogates, has_split_pair

if TYPE_CHECKING:
    from langgraph_idem_saver.value_copies import Loads

# ``json.dumps`` with any argument builds a new encoder on every call; these are the very
# encoders it builds (the same text, byte for byte: tests/test_saver_codec.py), made once,
# without json's Python frames (json_text). Every ``put`` encodes its metadata and versions.
_METADATA = encoder_of(ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False)
_CANONICAL = encoder_of(ensure_ascii=False, sort_keys=True, separators=(",", ":"))
_COMPACT = encoder_of(separators=(",", ":"))


def encode_metadata(metadata: CheckpointMetadata) -> str:
    """Metadata as canonical JSON text (sorted keys), the form filters compare against.

    UTF-8 text, with lone surrogates (which UTF-8 cannot carry) as ``\\uXXXX`` escapes, so
    such strings round-trip exactly. A high surrogate directly followed by a low one
    cannot (JSON reads the two escapes back as one character): :class:`SerializationError`
    before anything is written.
    """
    try:
        text = _METADATA(metadata)
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"checkpoint metadata must be JSON-serializable (str/int/float/bool/None, "
            f"lists and dicts of them): {exc}"
        ) from exc
    escaped = escape_surrogates(text)
    if escaped is not text and has_split_pair(text):
        raise SerializationError(
            "checkpoint metadata holds a high surrogate directly followed by a low one "
            "(two code points), which JSON cannot store exactly (it would read back as one "
            "character); nothing was written"
        )
    return escaped


def metadata_matches(metadata: dict[str, Any], filter: dict[str, Any]) -> bool:
    """LangGraph's InMemorySaver rule for ``alist(filter=...)``: every filter value
    ``==`` the metadata's (Python equality: ``1 == 1.0 == True``; ``None`` also matches
    an absent key). Backends narrow in SQL, then decide with this."""
    return all(value == metadata.get(key) for key, value in filter.items())


def has_number(value: Any) -> bool:
    """Whether a filter value holds a bool or number, which Python equates across types
    (``True == 1 == 1.0``) and JSON texts do not: SQL must not narrow by its text."""
    if isinstance(value, (bool, int, float)):
        return True
    if isinstance(value, dict):
        return any(has_number(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_number(v) for v in value)
    return False


def canonical_json(value: Any) -> str:
    """Canonical JSON for equality comparisons inside the database (metadata filters)."""
    return _CANONICAL(value)


def encode_versions(versions: ChannelVersions) -> str:
    """``channel_versions`` as a JSON object of strings: the blob keys of a checkpoint."""
    return _COMPACT({k: str(v) for k, v in versions.items()})


def decode_typed(serde: Loads, type_: str, data: bytes | None, what: str, **location: Any) -> Any:
    """``serde.loads_typed`` that turns any decoding failure into :class:`CorruptRecordError`.
    ``serde``: a serializer, or a ``ValueCopies.reader`` of one."""
    try:
        return serde.loads_typed((type_, data if data is not None else b""))
    except Exception as exc:
        raise CorruptRecordError(what, location=location, cause=exc) from exc


def decode_checkpoint(
    serde: Loads, type_: str, data: bytes | None, **location: Any
) -> dict[str, Any]:
    """Decode a stored checkpoint, insisting it decodes to a checkpoint-shaped dict."""
    value = decode_typed(serde, type_, data, "checkpoint", **location)
    if not isinstance(value, dict) or "id" not in value:
        raise CorruptRecordError(
            "checkpoint",
            location=location,
            cause=TypeError(f"decoded to {type(value).__name__}, not a checkpoint dict"),
        )
    return value


def check_versions(stored: Any, own: Any, **location: Any) -> None:
    """A row's ``channel_versions`` column (decoded) against the versions its checkpoint
    names, which it copies (``encode_versions``: the checkpoint's own versions may be
    numbers, the column holds them as text). The column is what the reads look blobs up
    by: one edited by hand (another shape, other versions) would return the checkpoint
    without its values, so it is a :class:`CorruptRecordError` naming the row."""
    if stored == own:
        return
    if type(stored) is dict and isinstance(own, dict) and stored == _as_text(own):
        return
    shown = repr(stored)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    raise CorruptRecordError(
        "channel_versions",
        location=location,
        cause=ValueError(f"the row's column holds {shown}, not its checkpoint's versions"),
    )


def _as_text(versions: dict[str, Any]) -> dict[str, str]:
    return {k: str(v) for k, v in versions.items()}


def decode_json(text: str | bytes, what: str, **location: Any) -> Any:
    """``json.loads`` that turns a failure into :class:`CorruptRecordError`."""
    try:
        return json.loads(text)
    except Exception as exc:
        raise CorruptRecordError(what, location=location, cause=exc) from exc


__all__ = [
    "canonical_json",
    "check_versions",
    "decode_checkpoint",
    "decode_json",
    "decode_typed",
    "encode_metadata",
    "encode_versions",
    "has_number",
    "metadata_matches",
]
