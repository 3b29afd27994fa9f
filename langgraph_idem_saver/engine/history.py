"""Reading a thread's saved checkpoints from whatever checkpointer the graph has.

Adoption asks which calls are still in a saved checkpoint (``adoption.adurable_calls``).
Our savers, LangGraph's async ones and ``InMemorySaver`` answer ``alist``; LangGraph's sync
savers (``langgraph.checkpoint.sqlite.SqliteSaver``, ``...postgres.PostgresSaver``) raise
``NotImplementedError`` there, which a ``ToolLedger`` beside them under ``graph.invoke``
would otherwise meet on the one path that matters (a crash lost the model's message).
Their sync ``list`` is read in a worker thread instead: they are thread-safe, and a
thread's history is read whole only on that rare path.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple


async def alist_saved(checkpointer: Any, config: RunnableConfig) -> AsyncIterator[CheckpointTuple]:
    """``checkpointer.alist(config)``, or its sync ``list`` in a worker thread when its
    async methods are not implemented (newest first, as both list)."""
    started = False
    try:
        async for tup in checkpointer.alist(config):
            started = True
            yield tup
        return
    except NotImplementedError:
        if started or not callable(getattr(checkpointer, "list", None)):
            raise
    for tup in await asyncio.to_thread(lambda: list(checkpointer.list(config))):
        yield tup
