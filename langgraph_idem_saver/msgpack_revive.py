"""LangGraph's msgpack reviver, with a module already imported looked up as CPython does first.

Reading a stored message back, ``JsonPlusSerializer``'s extension hook revives each object
by ``importlib.import_module(module)`` then ``getattr(module, name)``. For a module that
is already imported, ``import_module`` still runs ~80 bytecodes of ``importlib._bootstrap``
(``_gcd_import``, ``_sanity_check``, ``_find_and_load``) before it returns
``sys.modules[module]``: about a quarter of the Python a message's revival runs, ~1.5 µs a
message (a 20-message list: ~6% of its decoding, measured in ``benchmarks/README.md``).

:func:`fast_hook` builds the same hook - LangGraph's own ``_create_msgpack_ext_hook``
code, the same allowlist, the same events and fallbacks, no second copy of it - run over
the jsonplus module's globals with one name rebound: ``importlib`` is :data:`MODULES`,
whose ``import_module`` returns a module from ``sys.modules`` exactly when CPython's
``_find_and_load`` would return it without a lock (present, not ``None``, not being
initialized by another thread), and otherwise calls ``importlib.import_module`` itself.
So every module, class and answer is the one the stock hook gives; only the lookup of an
imported module is shorter. Pinned in ``tests/test_upstream_contracts.py`` (the hook
reads ``importlib`` as a global of jsonplus) and ``tests/test_msgpack_revive.py`` (the
same values, the allowlist's blocks and events, a module mid-import).
"""

from __future__ import annotations

import importlib
import sys
import threading
import types
from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.serde import jsonplus

ExtHook = Callable[[int, bytes], Any]

__all__ = ["MODULES", "available", "fast_hook"]


class _Modules:
    """Stands in for the ``importlib`` module inside the reviver (only ``import_module``
    is called there; anything else is ``importlib``'s own)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib, name)

    @staticmethod
    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        """``importlib.import_module(name, package)``; a module imported already is taken
        from ``sys.modules`` as ``importlib._bootstrap._find_and_load`` takes it."""
        if package is None and type(name) is str:
            module = sys.modules.get(name)
            if module is not None and not getattr(
                getattr(module, "__spec__", None), "_initializing", False
            ):
                return module
        return importlib.import_module(name, package)


MODULES = _Modules()

_make: Callable[[Any], ExtHook] | None = None
_AVAILABLE: bool
_make_lock = threading.Lock()


def _hook_code() -> types.CodeType | None:
    """The code of the hook LangGraph's factory makes, when it reads ``importlib`` as a
    global (the name this module rebinds)."""
    factory = getattr(jsonplus, "_create_msgpack_ext_hook", None)
    if not isinstance(factory, types.FunctionType):
        return None
    for code in factory.__code__.co_consts:
        if isinstance(code, types.CodeType) and code.co_name == "ext_hook":
            return code if "importlib" in code.co_names else None
    return None


def available() -> bool:
    """Whether LangGraph's jsonplus has the factory this module rebuilds, as it was."""
    return _hook_code() is not None


_HOOK_CODE = _hook_code()
_AVAILABLE = _HOOK_CODE is not None


def _factory() -> Callable[[Any], ExtHook]:
    """``_create_msgpack_ext_hook`` over jsonplus' globals with ``importlib`` rebound
    (built once: the globals are read when jsonplus is fully imported)."""
    global _make
    if _make is None:
        with _make_lock:
            if _make is None:
                original = jsonplus._create_msgpack_ext_hook
                scope = dict(vars(jsonplus))
                scope["importlib"] = MODULES
                _make = types.FunctionType(
                    original.__code__, scope, original.__name__, original.__defaults__
                )
    return _make


def fast_hook(serde: Any) -> ExtHook:
    """The reviver to unpack ``serde``'s msgpack values with: its own hook when that is
    a custom one (``__unpack_ext_hook__``), else LangGraph's hook for its allowlist with
    the shorter module lookup. Cached on the serializer, rebuilt whenever its hook or
    allowlist was replaced (``with_msgpack_allowlist`` makes a copy with both new)."""
    hook: ExtHook = serde._unpack_ext_hook
    if serde._custom_unpack_ext_hook or not _AVAILABLE:
        return hook
    allowed = serde._allowed_msgpack_modules
    cached = serde.__dict__.get("_idem_fast_hook")
    if cached is not None and cached[0] is hook and cached[1] is allowed:
        fast: ExtHook = cached[2]
        return fast
    if getattr(hook, "__code__", None) is not _HOOK_CODE:
        return hook  # not one LangGraph's factory made (set by hand): used as it is
    fast = _factory()(allowed)
    serde.__dict__["_idem_fast_hook"] = (hook, allowed, fast)
    return fast
