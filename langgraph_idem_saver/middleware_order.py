"""Where ``IdempotencyMiddleware`` sits among an agent's other tool-call middlewares.

``create_agent`` composes every ``wrap_tool_call`` hook into one chain (the first listed
is the outermost) and gives each hook a ``handler`` that runs the rest. Two built-in
middlewares defeat the ledger when they run *inside* it, and LangChain gives a middleware
no public way to see its neighbours, so this module reads the chain from the handler:

* ``ToolRetryMiddleware`` inside ours re-runs a tool that raised within our one claim: a
  tool that raised after its effect is charged again, unseen by the ledger;
* ``HumanInTheLoopMiddleware(interrupt_mode="per_call")`` inside ours raises its own
  ``interrupt()`` in our tool task; LangGraph hands a task's answers back by position, so
  after a crash our unknown-outcome question (asked first) takes the reviewer's answer.

Both are refused at the first tool call, before any tool runs (:func:`check_order`).
``HumanInTheLoopMiddleware`` in its default ``batched`` mode may sit on either side: its
edits are read from the agent state (:func:`reviewer_edit`), so the ledger records the
call that runs.

The chain is read through ``langchain.agents.factory``'s private closures (``call_inner``
with the free variables ``inner``/``execute``, ``composed`` with ``outer``/``inner``, each
hook wrapped by ``traceable`` with ``__wrapped__``) and HITL's private state key
``hitl_edited_tool_calls``; ``tests/test_upstream_contracts.py`` pins both. When the chain
cannot be read, nothing is refused (the upstream test is what fails loudly).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from langgraph_idem_saver.engine.types import MiddlewareOrderError

__all__ = ["check_order", "inner_middlewares", "reviewer_edit"]

HITL_EDITS_KEY = "hitl_edited_tool_calls"
"""``HumanInTheLoopMiddleware``'s state key: tool call id -> the reviewer's ``{name, args}``."""

_MAX_DEPTH = 64  # a chain deeper than this is not one create_agent built


def _free_vars(fn: Any) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    closure = getattr(fn, "__closure__", None)
    if code is None or not closure:
        return {}
    try:
        return {
            name: cell.cell_contents for name, cell in zip(code.co_freevars, closure, strict=True)
        }
    except ValueError:  # an empty cell
        return {}


def _owner(hook: Any) -> object | None:
    """The middleware a composed hook belongs to (a bound method, maybe ``traceable``-
    wrapped), or None."""
    for _ in range(_MAX_DEPTH):
        owner = getattr(hook, "__self__", None)
        if owner is not None:
            return cast(object, owner)
        wrapped = getattr(hook, "__wrapped__", None)
        if wrapped is None:
            return None
        hook = wrapped
    return None


def _collect(wrapper: Any, found: list[object], depth: int) -> bool:
    """Append the middlewares of a composed wrapper, outermost first; False if unreadable."""
    if depth > _MAX_DEPTH:
        return False
    parts = _free_vars(wrapper)
    if "outer" in parts and "inner" in parts:  # compose_two's ``composed``
        return _collect(parts["outer"], found, depth + 1) and _collect(
            parts["inner"], found, depth + 1
        )
    owner = _owner(wrapper)
    if owner is None:
        return False
    found.append(owner)
    return True


def inner_middlewares(handler: Callable[..., Any]) -> list[object] | None:
    """The middlewares ``handler`` runs before the tool, outermost first: ``[]`` when it
    is the tool node's own ``execute`` (ours is the innermost hook), None when the chain
    cannot be read."""
    parts = _free_vars(handler)
    if "inner" not in parts or "execute" not in parts:
        return [] if getattr(handler, "__name__", "") == "execute" else None
    found: list[object] = []
    return found if _collect(parts["inner"], found, 0) else None


def _type_names(obj: object) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def check_order(handler: Callable[..., Any]) -> None:
    """Refuse the orders that defeat the ledger (module docstring), naming the fix."""
    inner = inner_middlewares(handler)
    for middleware in inner or ():
        names = _type_names(middleware)
        label = type(middleware).__name__
        if "ToolRetryMiddleware" in names:
            raise MiddlewareOrderError(
                f"{label} is listed after IdempotencyMiddleware, so it runs inside it and "
                "re-runs a tool that raised within one ledger claim: a tool that raised "
                "after its effect would run again unseen. List it before: "
                f"middleware=[{label}(...), IdempotencyMiddleware(...)] (each retry is "
                "then the next attempt of the call, settled by verify / on_unknown / a "
                "human)"
            )
        if (
            "HumanInTheLoopMiddleware" in names
            and getattr(middleware, "interrupt_mode", "batched") == "per_call"
        ):
            raise MiddlewareOrderError(
                f"{label}(interrupt_mode='per_call') is listed after IdempotencyMiddleware,"
                " so its approval interrupt() runs inside our tool task; LangGraph hands a "
                "task's answers back by position, so after a crash the ledger's "
                "unknown-outcome question would take the reviewer's answer (and the "
                "reviewer ours). List it before: "
                f"middleware=[{label}(..., interrupt_mode='per_call'), "
                "IdempotencyMiddleware(...)]"
            )


def reviewer_edit(state: Any, call_id: str) -> dict[str, Any] | None:
    """The reviewer's replacement ``{"name", "args"}`` for call ``call_id`` when a
    ``HumanInTheLoopMiddleware`` edit decision replaced it (None otherwise).

    HITL keeps the model's call in the message and swaps in the edited one inside its
    own ``wrap_tool_call``; listed after ours, it swaps it after we planned the call. So
    the ledger plans the call that will run from the same record HITL reads."""
    edits = state.get(HITL_EDITS_KEY) if isinstance(state, dict) else None
    if not isinstance(edits, dict):
        return None
    edited = edits.get(call_id)
    if (
        isinstance(edited, dict)
        and isinstance(edited.get("name"), str)
        and isinstance(edited.get("args"), dict)
    ):
        return edited
    return None
