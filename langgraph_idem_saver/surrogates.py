"""Lone surrogates (``"\\ud800"``), stored exactly instead of silently changed.

A Python ``str`` may hold code points U+D800-U+DFFF that no UTF-8 text can carry (a
model's JSON with a stray ``\\ud800`` escape, text cut in the middle of a UTF-16 pair).
LangGraph's ``JsonPlusSerializer`` packs them with ``OPT_REPLACE_SURROGATES``: they come
back as ``?``, so a resumed agent sees other text than the one it stored, and a dict
*key* holding one raises a raw ``TypeError``. Here:

* :class:`LosslessJsonPlusSerializer` is ``JsonPlusSerializer`` with one change. It packs
  with a private copy of LangGraph's encoder that *refuses* surrogates instead of
  replacing them: for every value without one (all but a handful), that is the same
  code, the same single pass and byte-identical output (type ``"msgpack"``). Only when
  that refusal fires is the value packed again by a second copy that writes each such
  string as a msgpack extension (:data:`EXT_STR`; a dict with such a key as
  :data:`EXT_DICT`), under its own type :data:`LOSSLESS_TYPE`, which it reads back
  exactly. Everything else - the allowlist, the types it revives, ``pickle_fallback`` -
  is LangGraph's own code, so the guarantees of ``docs/guarantees.md`` hold for both.
* :func:`lossless` swaps a plain ``JsonPlusSerializer`` (alone or inside an
  ``EncryptedSerializer``) for that subclass; any other serializer is used as given.
* :func:`escape_surrogates` writes JSON text with lone surrogates as ``\\uXXXX`` escapes,
  for canonical tool arguments and metadata (JSON columns must be valid UTF-8).
"""

from __future__ import annotations

import importlib.util
import re
from types import ModuleType
from typing import Any, cast

import ormsgpack
from langgraph.checkpoint.serde import jsonplus
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.msgpack_revive import REVIVES, fast_hook

__all__ = [
    "EXT_DICT",
    "EXT_STR",
    "LOSSLESS_TYPE",
    "LosslessJsonPlusSerializer",
    "escape_surrogates",
    "has_split_pair",
    "lossless",
    "utf8_ok",
]

# the stored type of a value that holds lone surrogates (no "+": EncryptedSerializer
# appends "+<cipher>" and splits on the first "+")
LOSSLESS_TYPE = "msgpack-surrogates"
# msgpack extension codes, far from LangGraph's (0-7); read only under LOSSLESS_TYPE
EXT_STR = 126  # a str with lone surrogates: its UTF-8 bytes, surrogates passed through
EXT_DICT = 127  # a dict with such a str as a key: a list of [key, value] pairs

_SURROGATE = re.compile("[\ud800-\udfff]")
_PAIR = re.compile("[\ud800-\udbff][\udc00-\udfff]")
_SIMPLE_KEYS = (str, int, float, bool, type(None))


def utf8_ok(text: str) -> bool:
    """Whether ``text`` is valid UTF-8 text (no lone surrogates): what a database driver
    can bind as text."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def escape_surrogates(text: str) -> str:
    """``text`` (JSON) with each lone surrogate written as a ``\\uXXXX`` escape.

    Text without one is returned as is (the same object), so hashes of ordinary text do
    not change; ``json.loads`` reads the escapes back as the very same code points.
    """
    if text.isascii() or utf8_ok(text):
        return text
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


def has_split_pair(text: str) -> bool:
    """Whether ``text`` holds a high surrogate directly followed by a low one.

    Escaped as JSON (``\\ud83d\\ude00``) such a pair reads back as the one character
    U+1F600, not as the two code points stored: JSON cannot carry it exactly.
    """
    return not text.isascii() and _PAIR.search(text) is not None


# --- two private copies of LangGraph's msgpack encoder ---------------------------------


def _copy_of_jsonplus() -> ModuleType:
    """A fresh, private instance of ``langgraph.checkpoint.serde.jsonplus``.

    Its functions read their globals (``_option``, ``ormsgpack``) from the copy, so the
    copy can refuse or escape surrogates without touching the module every other
    ``JsonPlusSerializer`` in the process uses.
    """
    spec = importlib.util.find_spec(jsonplus.__name__)
    if spec is None or spec.loader is None:  # pragma: no cover - it was just imported
        raise ImportError(f"cannot load a copy of {jsonplus.__name__}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module._option = jsonplus._option & ~ormsgpack.OPT_REPLACE_SURROGATES  # type: ignore[attr-defined]
    return module


class _EscapingMsgpack:
    """Stands in for the ``ormsgpack`` module inside the lossless copy: packs strings with
    lone surrogates as :data:`EXT_STR` and reads them back, at every nesting level (the
    copy's encoder and ext hook call ``packb``/``unpackb`` again for nested objects)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(ormsgpack, name)

    def packb(self, obj: Any, default: Any = None, option: int | None = None) -> bytes:
        return ormsgpack.packb(_escape(obj, default, option), default=default, option=option)

    def unpackb(self, data: Any, *, ext_hook: Any = None, option: int | None = None) -> Any:
        return ormsgpack.unpackb(data, ext_hook=_unescaping(ext_hook), option=option)


def _escape(value: Any, default: Any, option: int | None) -> Any:
    """``value`` with every str holding lone surrogates made an :data:`EXT_STR`, in the
    containers msgpack packs natively (dict, list, tuple); other objects reach the copy's
    ``default``, which packs their parts through :class:`_EscapingMsgpack` again."""
    if isinstance(value, str):
        if value.isascii() or utf8_ok(value):
            return value
        return ormsgpack.Ext(EXT_STR, value.encode("utf-8", "surrogatepass"))
    if isinstance(value, dict):
        if all(isinstance(k, _SIMPLE_KEYS) for k in value) and any(
            isinstance(k, str) and not utf8_ok(k) for k in value
        ):
            pairs = [
                [_escape(k, default, option), _escape(v, default, option)] for k, v in value.items()
            ]
            return ormsgpack.Ext(EXT_DICT, ormsgpack.packb(pairs, default=default, option=option))
        return {k: _escape(v, default, option) for k, v in value.items()}
    if isinstance(value, list) or type(value) is tuple:
        return [_escape(v, default, option) for v in value]
    return value


def _unescaping(ext_hook: Any) -> Any:
    """An ext hook that reads :data:`EXT_STR`/:data:`EXT_DICT` and passes other codes on."""

    def hook(code: int, data: bytes) -> Any:
        if code == EXT_STR:
            return data.decode("utf-8", "surrogatepass")
        if code == EXT_DICT:
            pairs = ormsgpack.unpackb(data, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
            return {k: v for k, v in pairs}
        return None if ext_hook is None else ext_hook(code, data)

    return hook


# what the copies rely on; a LangGraph without it gets its own serializer back (lossy)
AVAILABLE = all(
    hasattr(jsonplus, name) for name in ("_option", "_msgpack_enc", "_create_msgpack_ext_hook")
)
if AVAILABLE:
    _STRICT = _copy_of_jsonplus()
    _LOSSLESS = _copy_of_jsonplus()
    _LOSSLESS.ormsgpack = _EscapingMsgpack()  # type: ignore[attr-defined]


class LosslessJsonPlusSerializer(JsonPlusSerializer):
    """``JsonPlusSerializer`` that stores lone surrogates exactly (see the module docstring).

    A subclass, so LangGraph's ``with_allowlist``/``with_msgpack_allowlist`` keep working
    on it (they copy the instance and keep its class).
    """

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        if obj is None or isinstance(obj, (bytes, bytearray)):
            return super().dumps_typed(obj)
        try:
            # the hot path: LangGraph's encoder, with surrogates refused instead of replaced
            return "msgpack", _STRICT._msgpack_enc(obj)
        except Exception:  # decided below, by the other encoders
            pass
        if not _custom_hook(self):  # else we could not read it back exactly
            try:
                return LOSSLESS_TYPE, cast(bytes, _LOSSLESS._msgpack_enc(obj))
            except Exception:  # not (only) surrogates: LangGraph decides
                pass
        try:
            return super().dumps_typed(obj)  # pickle_fallback, or LangGraph's own error
        except Exception as exc:
            raise SerializationError(
                f"cannot serialize a {type(obj).__name__} ({type(exc).__name__}: {exc}); "
                "nothing was written"
            ) from exc

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        type_, payload = data
        if type_ == "msgpack" and REVIVES:  # JsonPlusSerializer's branch, reviver shortened
            hook = fast_hook(self)  # (msgpack_revive.py: the same objects revived)
            return ormsgpack.unpackb(payload, ext_hook=hook, option=ormsgpack.OPT_NON_STR_KEYS)
        if type_ != LOSSLESS_TYPE:
            return super().loads_typed(data)
        if _custom_hook(self):
            ext_hook = self._unpack_ext_hook
        else:  # LangGraph's reviver, allowlist included, reading our extensions too
            ext_hook = _LOSSLESS._create_msgpack_ext_hook(self._allowed_msgpack_modules)
        return _LOSSLESS.ormsgpack.unpackb(
            payload, ext_hook=ext_hook, option=ormsgpack.OPT_NON_STR_KEYS
        )


def _custom_hook(serde: JsonPlusSerializer) -> bool:
    """Whether ``serde`` was built with its own ``__unpack_ext_hook__``, which only knows
    LangGraph's extensions at the top level: then values with surrogates are not stored
    in our format (LangGraph's replacement applies)."""
    return bool(getattr(serde, "_custom_unpack_ext_hook", False))


def lossless(serde: SerializerProtocol) -> SerializerProtocol:
    """``serde``, with a plain ``JsonPlusSerializer`` (alone or the inner one of an
    ``EncryptedSerializer``) replaced by a :class:`LosslessJsonPlusSerializer` holding the
    same settings. Other serializers, and subclasses with their own format, are returned
    unchanged: they decide how they store text."""
    if not AVAILABLE:
        return serde
    if type(serde) is JsonPlusSerializer:
        copy = LosslessJsonPlusSerializer.__new__(LosslessJsonPlusSerializer)
        copy.__dict__.update(vars(serde))
        return copy
    if type(serde) is EncryptedSerializer and type(serde.serde) is JsonPlusSerializer:
        return EncryptedSerializer(serde.cipher, lossless(serde.serde))
    return serde
