"""``alist(filter=...)`` on the SQLite savers: which checkpoints a metadata filter matches.

The rule is LangGraph's ``InMemorySaver``'s (every filter value ``==`` the metadata's, in
Python: ``1 == 1.0 == True``; ``None`` also matches an absent key), with one addition that
LangGraph's own ``SqliteSaver`` makes: **a dotted key is a nested path**. Its SQL reads a
key with ``json_extract(metadata, '$.<key>')``, so ``{"user.access-level": "nested"}``
matches ``{"user": {"access-level": "nested"}}``; we match that too. A key the metadata
holds as written (a literal ``"user.access-level"`` at the top level, which LangGraph's
saver never matches) is used as it is, before any path: a filter that matched on our
saver before still matches. A path walks objects only (``'$.a.0'`` is the key ``"0"`` in
SQLite, not an index), and a key with an empty part (``"a..b"``, ``".a"``, which
LangGraph's saver refuses as a malformed path) is only ever a literal key.

The SQL conditions here only *narrow* the rows (keys and values bound, never
interpolated); :func:`metadata_matches` decides, on each row the SQL let through.
"""

from __future__ import annotations

from typing import Any

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.saver_codec import canonical_json, has_number
from langgraph_idem_saver.surrogates import utf8_ok

_ABSENT = object()


def value_at(metadata: dict[str, Any], key: str) -> Any:
    """The value ``key`` names in ``metadata``: the key as written if present, else the
    nested value along its dotted path; None when neither is there."""
    if key in metadata:
        return metadata[key]
    parts = key.split(".")
    if len(parts) < 2 or "" in parts:
        return None
    node: Any = metadata
    for part in parts:
        if not isinstance(node, dict):
            return None
        node = node.get(part, _ABSENT)
        if node is _ABSENT:
            return None
    return node


def metadata_matches(metadata: dict[str, Any], filter: dict[str, Any]) -> bool:
    """Whether a checkpoint's metadata matches ``filter`` (the rule in the docstring)."""
    return all(value == value_at(metadata, key) for key, value in filter.items())


def narrowing(filter: dict[str, Any]) -> tuple[list[str], list[Any]]:
    """SQL conditions that *narrow* rows by top-level metadata keys. They may let through
    rows that do not match - :func:`metadata_matches` decides - but never drop one that
    does: a dotted key (which may name a nested value) is not narrowed."""
    clauses: list[str] = []
    params: list[Any] = []
    for key, value in filter.items():
        if not isinstance(key, str):
            raise ConfigError(f"metadata filter keys must be str, got {type(key).__name__}")
        if (
            value is None
            or "." in key
            or not _bindable(key)
            or (isinstance(value, str) and not _bindable(value))
        ):
            # json_each cuts keys at NUL, SQLite cannot take text with lone surrogates,
            # None also matches an absent key, and a dotted key may be a path: these are
            # left to the exact check in Python, never narrowed (a narrowing must not
            # drop a real match)
            continue
        exists = "EXISTS (SELECT 1 FROM json_each(metadata) AS j WHERE j.key = ? AND {})"
        if isinstance(value, (bool, int, float)):
            clauses.append(
                exists.format("j.type IN ('integer', 'real', 'true', 'false') AND j.value = ?")
            )
            params += [key, float(value) if isinstance(value, float) else int(value)]
        elif isinstance(value, str):
            clauses.append(exists.format("j.type = 'text' AND j.value = ?"))
            params += [key, value]
        else:
            try:
                text = canonical_json(value)
            except (TypeError, ValueError) as exc:
                raise ConfigError(f"metadata filter value for {key!r} is not JSON: {exc}") from exc
            kind = "object" if isinstance(value, dict) else "array"
            if not utf8_ok(text) or has_number(value):
                # lone surrogates (not bindable), or numbers and bools, which Python
                # equates across types ([1] == [True]) and JSON text does not: narrow by
                # kind only, the exact check decides
                clauses.append(exists.format("j.type = ?"))
                params += [key, kind]
                continue
            clauses.append(
                exists.format("j.type IN ('object', 'array') AND json(j.value) = json(?)")
            )
            params += [key, text]
    return clauses, params


def _bindable(text: str) -> bool:
    """Whether ``text`` can narrow a filter in SQL: bindable, and without NUL."""
    return "\x00" not in text and utf8_ok(text)
