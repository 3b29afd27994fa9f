"""How the crash workers resume a thread, and how they tell that it is finished.

``graph.get_state(config)`` is LangGraph's *live* view: it applies the writes of the tasks
that already finished and leaves those tasks out of ``next``. When every task of the
newest checkpoint finished but the checkpoint after them was lost with the process
(durability ``"async"`` keeps it in flight while the next step runs), the live view has an
empty ``next`` - it looks finished, ending on a tool message, or on a model message whose
calls never ran - although the steps after those tasks never ran. The checkpoint *as
saved* (``get_state`` with its id, which is not live) still lists them, and a run with
``None`` input applies their writes and goes on: what a user does after a crash.
"""

from __future__ import annotations

from typing import Any

NO_CHECKPOINT = None


def _saved_config(live: Any) -> Any:
    """The config naming the live snapshot's checkpoint, or None when there is none."""
    return live.config if "checkpoint_id" in live.config.get("configurable", {}) else None


async def asaved_next(graph: Any, config: Any) -> tuple[str, ...] | None:
    """The newest checkpoint's tasks as saved (finished ones included); None: no checkpoint."""
    saved = _saved_config(await graph.aget_state(config))
    return NO_CHECKPOINT if saved is None else (await graph.aget_state(saved)).next


def saved_next(graph: Any, config: Any) -> tuple[str, ...] | None:
    """``asaved_next`` for a sync graph (``graph.get_state``)."""
    saved = _saved_config(graph.get_state(config))
    return NO_CHECKPOINT if saved is None else graph.get_state(saved).next


def resume_input(next_tasks: tuple[str, ...] | None, first_input: Any) -> Any:
    """The first input for a thread that has no checkpoint yet, else ``None`` (resume)."""
    return first_input if next_tasks is NO_CHECKPOINT else None
