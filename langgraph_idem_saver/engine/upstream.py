"""The one LangGraph name the engine reads that has no public home.

LangGraph puts ``checkpoint_map`` in every task's ``configurable``: for each graph
namespace from the root down, the id of the checkpoint the task's step started from.
``engine.forks`` reads it to place a call in the thread's history (its branch), so a fork
resumed from an earlier checkpoint does not replay the other branch's outcomes. The key's
name lives in ``langgraph._internal._constants`` only (``langgraph.constants`` serves it
with a deprecation warning), so it is imported here and nowhere else, and
``tests/test_upstream_contracts.py`` pins its value and what LangGraph stores under it.

The checkpointer's key, ``CONFIG_KEY_CHECKPOINTER``, is public (``langgraph.constants``
exports it) and is imported from there where it is used.
"""

from __future__ import annotations

from langgraph._internal._constants import CONFIG_KEY_CHECKPOINT_MAP

__all__ = ["CONFIG_KEY_CHECKPOINT_MAP"]
