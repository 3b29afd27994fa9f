"""LangGraph's msgpack reviver, with a module already imported looked up as CPython does first.

Reading a stored message back, ``JsonPlusSerializer``'s extension hook revives each object
by ``importlib.import_module(module)`` then ``getattr(module, name)``. For a module that
is already imported, ``import_module`` still runs ~80 bytecodes of ``importlib._bootstrap``
(``_gcd_import``, ``_sanity_check``, ``_find_and_load``) before it returns
``sys.modules[module]``: about a quarter of the Python a message's revival runs, ~1.5 µs a
message (a 20-message list: ~6% of its decoding, measured in ``benchmarks/README.md``).

:func:`fast_hook` rebuilds the serializer's own hook - LangGraph's ``ext_hook`` code, no
second copy of it - with one global rebound: ``importlib`` is :data:`MODULES`, whose
``import_module`` returns a module from ``sys.modules`` exactly when CPython's
``_find_and_load`` would return it without a lock (present, not ``None``, not being
initialized by another thread), and otherwise calls ``importlib.import_module`` itself.
Why it stays the stock hook in every decision:

* its closure is the stock hook's own cells (only the cell for its recursion is new), so
  the allowlist it checks is the one the serializer's hook captured, and the checks
  (``_check_allowed``: events, warn-once sets, the strict switch) are LangGraph's own
  functions reading jsonplus' live globals;
* the globals the hook's own body reads are a snapshot of jsonplus' taken when it was
  built, compared with jsonplus' current ones on every :func:`fast_hook` call (one tuple
  of its ~13 names, ~4 bytecodes): a name rebound since (a monkeypatched
  ``_reconstruction_fallback``, an ``importlib`` replaced in jsonplus) makes a new
  snapshot, and a jsonplus whose ``importlib`` is not the real module gets its own hook
  (a rebinding made while a value is being read is seen from the next read on);
* it is used only when a ``JsonPlusSerializer`` was seen at import to hold the factory's
  hook where it is read (:data:`REVIVES`); else LangGraph's ``loads_typed`` reads.

Pinned in ``tests/test_upstream_contracts.py`` (the hook reads ``importlib`` as a global
of jsonplus) and ``tests/test_msgpack_revive.py`` (the same values, the allowlist's
blocks and events, names rebound in jsonplus, a module mid-import, a changed upstream).
"""

from __future__ import annotations

import dis
import importlib
import operator
import sys
import types
from collections.abc import Callable
from typing import Any

from langgraph.checkpoint.serde import jsonplus

ExtHook = Callable[[int, bytes], Any]

__all__ = ["MODULES", "REVIVES", "available", "fast_hook"]


class _Modules:
    """Stands in for the ``importlib`` module inside the reviver (only ``import_module``
    is called there; anything else is ``importlib``'s own)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib, name)

    @staticmethod
    def import_module(name: str, package: str | None = None) -> types.ModuleType:
        """``importlib.import_module(name, package)``; a module imported already is taken
        from ``sys.modules`` as ``importlib._bootstrap._find_and_load`` takes it (a
        relative or empty name goes to ``importlib``, which refuses it)."""
        if package is None and type(name) is str and name[:1] not in ("", "."):
            module = sys.modules.get(name)
            if module is not None and not getattr(
                getattr(module, "__spec__", None), "_initializing", False
            ):
                return module
        return importlib.import_module(name, package)


MODULES = _Modules()


def _hook_code() -> types.CodeType | None:
    """The code of the hook LangGraph's factory makes, when its bytecode reads
    ``importlib`` as a global (the name this module rebinds)."""
    factory = getattr(jsonplus, "_create_msgpack_ext_hook", None)
    if not isinstance(factory, types.FunctionType):
        return None
    for code in factory.__code__.co_consts:
        if isinstance(code, types.CodeType) and code.co_name == "ext_hook":
            # read as a global (not ``from importlib import ...``, not a local)
            reads = {i.argval for i in dis.get_instructions(code) if i.opname == "LOAD_GLOBAL"}
            return code if "importlib" in reads else None
    return None


def _serializer_holds(code: types.CodeType | None) -> bool:
    """Whether a ``JsonPlusSerializer`` keeps its reviver where :func:`fast_hook` reads
    it (``_unpack_ext_hook``, made by the factory; ``_custom_unpack_ext_hook``)."""
    try:
        serde = jsonplus.JsonPlusSerializer()
        hook = serde._unpack_ext_hook
        return serde._custom_unpack_ext_hook is False and hook.__code__ is code is not None
    except Exception:  # another LangGraph: the serializer's own reading
        return False


def available() -> bool:
    """Whether LangGraph's jsonplus has the factory this module rebuilds, as it was, and
    its serializer holds the hook it makes."""
    return _serializer_holds(_hook_code())


_HOOK_CODE = _hook_code()
# checked once here: else ``LosslessJsonPlusSerializer`` reads msgpack as LangGraph does,
# and no attribute of the serializer is read on each call (an upgrade without them
# would otherwise fail every read)
REVIVES = _AVAILABLE = _serializer_holds(_HOOK_CODE)
# the globals the hook's body reads (its other names are attributes and builtins)
_NAMES: tuple[str, ...] = tuple(
    sorted(
        {"importlib"}
        | {n for n in (_HOOK_CODE.co_names if _HOOK_CODE else ()) if n in vars(jsonplus)}
    )
)
_read_names = operator.itemgetter(*_NAMES) if _AVAILABLE else None
_NAMESPACE = vars(jsonplus)
_IMPORTLIB = _NAMES.index("importlib")


class _Scope:
    """jsonplus' globals as the rebuilt hooks read them: ``values`` (the hook's names,
    as they were in jsonplus) and ``globals`` (the copy with ``importlib`` rebound)."""

    __slots__ = ("globals", "values")

    def __init__(self, values: tuple[Any, ...], scope: dict[str, Any]) -> None:
        self.values, self.globals = values, scope

    def __copy__(self) -> _Scope:
        return self  # shared, never changed (a new scope replaces it)

    def __deepcopy__(self, memo: dict[int, Any]) -> _Scope:
        return self  # (a deep copy of the serializer: modules cannot be copied)


_scope: _Scope | None = None  # replaced whole (one assignment: no lock needed)


def _current_scope(values: tuple[Any, ...]) -> _Scope | None:
    """The scope for jsonplus' globals as they are now (``values``: the hook's names read
    from jsonplus); None when the hook cannot be rebuilt over them (jsonplus'
    ``importlib`` replaced by someone: their ``import_module`` is theirs to run)."""
    global _scope
    scope = _scope
    if scope is not None and values == scope.values:
        return scope
    if values[_IMPORTLIB] is not importlib:
        return None
    copied = dict(_NAMESPACE)
    copied["importlib"] = MODULES
    scope = _scope = _Scope(values, copied)
    return scope


def _rebuilt(hook: Any, scope: _Scope) -> ExtHook:
    """``hook`` (an ``ext_hook`` of LangGraph's factory) over ``scope``'s globals: its own
    closure cells (the stock checks and, through them, the allowlist it captured), but a
    new one for the name it recurses through, so nested objects are revived by it too."""
    code: types.CodeType = hook.__code__
    cells = list(hook.__closure__)
    own = code.co_freevars.index("ext_hook") if "ext_hook" in code.co_freevars else -1
    if own >= 0:
        cells[own] = types.CellType()
    fast = types.FunctionType(code, scope.globals, hook.__name__, hook.__defaults__, tuple(cells))
    if own >= 0:
        cells[own].cell_contents = fast
    return fast


def fast_hook(serde: Any) -> ExtHook:
    """(Only when :data:`REVIVES`.) The reviver to unpack ``serde``'s msgpack values with:
    its own hook when that is
    a custom one (``__unpack_ext_hook__``, or one set by hand), else that hook rebuilt
    with the shorter module lookup. Cached on the serializer, rebuilt whenever its hook
    was replaced (``with_msgpack_allowlist`` makes a copy with a new one) or a global of
    jsonplus the hook reads was rebound since (compared on every call, in C)."""
    hook: ExtHook = serde._unpack_ext_hook
    if serde._custom_unpack_ext_hook or _read_names is None:
        return hook
    try:
        values: tuple[Any, ...] = _read_names(_NAMESPACE)
    except KeyError:  # a name gone from jsonplus: its own hook, as it is now
        return hook
    cached = serde.__dict__.get("_idem_fast_hook")
    if cached is not None and cached[0] is hook and values == cached[1].values:
        fast: ExtHook = cached[2]  # (a tuple compare: ints, classes, functions, modules)
        return fast
    if getattr(hook, "__code__", None) is not _HOOK_CODE:
        return hook  # not one LangGraph's factory made (set by hand): used as it is
    scope = _current_scope(values)
    if scope is None:
        return hook
    fast = _rebuilt(hook, scope)
    serde.__dict__["_idem_fast_hook"] = (hook, scope, fast)
    return fast
