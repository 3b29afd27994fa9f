"""Finding the ledger behind a checkpointer that wraps our saver.

LangGraph's Agent Server (``langgraph dev``, ``langgraph-api``) does not hand a graph the
checkpointer named in ``langgraph.json``: it wraps it in
``langgraph_api._checkpointer._adapter._CustomCheckpointerAdapter``, a
``BaseCheckpointSaver`` that overrides the checkpoint methods and forwards every other
attribute to the saver with ``__getattr__``. The wrapper is not a ``ToolCallLedger``, so a
front door that only checked ``isinstance(checkpointer, ToolCallLedger)`` refused to run
although our saver sits right inside it.

LangGraph offers no public way to reach a wrapped saver. This module is the one place
that knows the server's wrapper: it keeps the saver in its ``_inner`` attribute (pinned
by ``tests/test_upstream_contracts.py``, which fails loudly if that changes). A wrapper of
one's own can say what it wraps with the ``functools`` convention, ``__wrapped__``.

Only the wrapper's *own* attributes are read (its ``__dict__``), never through its
forwarding ``__getattr__``: a wrapper of a saver that is not a ledger stays "no ledger"
(``NoLedgerError``), whatever the inner object forwards.
"""

from __future__ import annotations

from typing import Any

from langgraph.checkpoint.base import BaseCheckpointSaver

from langgraph_idem_saver.ledger import ToolCallLedger

# the server's adapter (langgraph-api 0.16: ``_inner``), then the functools convention
WRAPPED_ATTRIBUTES = ("_inner", "__wrapped__")
# wrappers of wrappers are followed this deep (a cycle ends here too)
MAX_DEPTH = 8


def ledger_in(checkpointer: object) -> ToolCallLedger | None:
    """The ledger ``checkpointer`` is, or wraps (through up to ``MAX_DEPTH`` wrappers);
    None when there is none."""
    current: object = checkpointer
    for _ in range(MAX_DEPTH):
        if isinstance(current, ToolCallLedger):
            return current
        inner = wrapped_saver(current)
        if inner is None:
            return None
        current = inner
    return None


def wrapped_saver(checkpointer: object) -> BaseCheckpointSaver[Any] | None:
    """The saver a checkpointer wrapper holds, or None when ``checkpointer`` wraps none.

    A wrapper is a ``BaseCheckpointSaver`` holding another one as an instance attribute
    named in ``WRAPPED_ATTRIBUTES``.
    """
    if not isinstance(checkpointer, BaseCheckpointSaver):
        return None
    own = getattr(checkpointer, "__dict__", None)  # the instance's own, no forwarding
    if not isinstance(own, dict):
        return None
    for name in WRAPPED_ATTRIBUTES:
        inner = own.get(name)
        if inner is not checkpointer and isinstance(inner, BaseCheckpointSaver):
            return inner
    return None


def describe(checkpointer: object) -> str:
    """What was found, for ``NoLedgerError``: the wrappers and what they wrap."""
    if checkpointer is None:
        return "no checkpointer"
    names = [type(checkpointer).__name__]
    current = wrapped_saver(checkpointer)
    while current is not None and len(names) < MAX_DEPTH:
        names.append(type(current).__name__)
        current = wrapped_saver(current)
    return " wrapping ".join(names)
