"""JSON text of small values, the hot-path way: ``json.JSONEncoder.encode`` without its
two Python frames.

A 50-call tool step encodes JSON twice a call for the ledger's keys (the canonical
arguments and the key's parts) and a checkpoint write encodes its metadata and versions:
``encode`` and ``iterencode`` are ~170 bytecodes of Python around one C call, ~9% of the
ledger's own Python on such a step. :func:`encoder_of` calls the C encoder that
``iterencode`` builds for a one-shot encode, with the same arguments, so the text is
byte for byte ``JSONEncoder(**options).encode(value)`` (``tests/test_json_text.py``
checks it on generated values and fails if a Python release changes the recipe); where
the C encoder is missing (another Python implementation) it is ``encode`` itself.
"""

from __future__ import annotations

import itertools
import json
import json.encoder
from collections.abc import Callable, Iterable
from typing import Any


def encoder_of(**options: Any) -> Callable[[Any], str]:
    """``json.JSONEncoder(**options).encode`` for options without ``indent``."""
    encoder = json.JSONEncoder(**options)
    # not in typeshed; the C accelerator of ``iterencode``, present since Python 2.7
    make: Callable[..., Callable[[Any, int], Any]] | None = getattr(
        json.encoder, "c_make_encoder", None
    )
    if make is None or encoder.indent is not None:  # pragma: no cover - CPython has it
        return encoder.encode
    string: Callable[[str], str] = (
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring
    )
    default, key_sep, item_sep = encoder.default, encoder.key_separator, encoder.item_separator
    sort_keys, skipkeys, allow_nan = encoder.sort_keys, encoder.skipkeys, encoder.allow_nan
    check_circular = encoder.check_circular
    if not check_circular:
        # no markers, no state: one C encoder serves every call, from any thread
        stateless = make(
            None, default, string, None, key_sep, item_sep, sort_keys, skipkeys, allow_nan
        )

        def encode_unchecked(value: Any) -> str:
            if isinstance(value, str):
                return string(value)
            return "".join(stateless(value, 0))

        return encode_unchecked

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return string(value)
        markers: dict[int, Any] | None = {} if check_circular else None
        chunks = make(
            markers, default, string, None, key_sep, item_sep, sort_keys, skipkeys, allow_nan
        )(value, 0)
        return "".join(chunks)

    return encode


def many_encoder_of(**options: Any) -> Callable[[Iterable[Any]], list[str]]:
    """``encoder_of(check_circular=False, **options)``'s text of each of many values, in
    one comprehension over the C encoder: no Python frame a value (a step's 50 calls'
    arguments, ``keys.step_texts``). A circular value is a ``RecursionError``, as with
    ``check_circular=False`` in ``json``."""
    encoder = json.JSONEncoder(**{**options, "check_circular": False})
    make: Callable[..., Callable[[Any, int], Any]] | None = getattr(
        json.encoder, "c_make_encoder", None
    )
    if make is None or encoder.indent is not None:  # pragma: no cover - CPython has it
        one = encoder.encode
        return lambda values: [one(v) for v in values]
    string = (
        json.encoder.encode_basestring_ascii
        if encoder.ensure_ascii
        else json.encoder.encode_basestring
    )
    stateless = make(
        None, encoder.default, string, None, encoder.key_separator, encoder.item_separator,
        encoder.sort_keys, encoder.skipkeys, encoder.allow_nan,
    )  # fmt: skip
    join, zero = "".join, itertools.repeat(0)

    def encode_many(values: Iterable[Any]) -> list[str]:
        return list(map(join, map(stateless, values, zero)))

    return encode_many
