"""The two private knobs of ``langgraph dev`` the server tests turn: how often its
in-memory runtime saves its threads and runs to disk (upstream: every 10 s), and how soon
its queue picks up a new run (upstream: up to a second, below).

The server crash tests (test_agent_server.py, test_ledger_beside_server.py) wait for such
a save before a tool kills the server - the server must know its runs as running to re-run
them after the restart. A save every second instead of every ten shortens that wait and
changes nothing else: the same flush loop writes the same files, sooner.
``langgraph_runtime_inmem._persistence._flush_interval`` is private;
tests/test_upstream_contracts.py pins it.

Importing the runtime already starts its flush loop (its ``store.pckl`` registers), and
that loop read the interval when it began to wait: left running, its first save came ten
seconds after the import (measured: a server ready after 3 s saved first at 11 s), every
crash test's first wait. So the loop is restarted after the interval is set: stopped
(``stop_flush_loop``), then started again by registering a store it already had
(``register_persistent_dict``; pinned the same way).

The queue: when its last look found no run, ``Runs.next(wait=True)`` sleeps 0.5 s and
then takes the pending runs created before it *started* sleeping, so a run created
during the sleep waits for the next look: 0.5-1 s between ``runs.create`` and the run
starting, every run of a test (measured: a run started on each second's tick).
:func:`pick_up_runs_soon` makes that wait 0.05 s, then looks with ``wait=False``: the
same method takes the same runs, in the same order, sooner. Pinned in
tests/test_upstream_contracts.py like the flush interval.
"""

from __future__ import annotations

FLUSH_SECONDS = 1
PICKUP_SECONDS = 0.05


def flush_often() -> None:
    """In the process that runs ``langgraph dev --no-reload``, before the server starts."""
    from langgraph_runtime_inmem import _persistence

    if not isinstance(getattr(_persistence, "_flush_interval", None), int):
        raise RuntimeError("langgraph_runtime_inmem no longer has _persistence._flush_interval")
    _persistence._flush_interval = FLUSH_SECONDS
    if _persistence._flush_thread is not None:  # started at import, waiting 10 s
        stores = [ref() for ref in _persistence._stores.values()]
        _persistence.stop_flush_loop()
        for store in stores:
            if store is not None:
                _persistence.register_persistent_dict(store)  # the loop, at 1 s


def pick_up_runs_soon() -> None:
    """In the server's process (its graph module runs this at import): the queue's next
    look for a pending run comes PICKUP_SECONDS after an empty one, not 0.5-1 s."""
    import asyncio
    import inspect
    from collections.abc import AsyncIterator
    from typing import Any

    from langgraph_runtime_inmem import ops

    upstream = inspect.getattr_static(ops.Runs, "next")
    if getattr(upstream, "picks_up_soon", False):
        return
    if not isinstance(upstream, staticmethod):
        raise RuntimeError("langgraph_runtime_inmem.ops.Runs.next is no longer a staticmethod")
    look = upstream.__func__

    async def next_soon(wait: bool, limit: int = 1) -> AsyncIterator[Any]:
        if wait:
            await asyncio.sleep(PICKUP_SECONDS)
        async for item in look(wait=False, limit=limit):
            yield item

    next_soon.picks_up_soon = True  # type: ignore[attr-defined]
    ops.Runs.next = staticmethod(next_soon)  # type: ignore[method-assign,assignment]
