"""The one private knob of ``langgraph dev`` the server tests turn: how often its
in-memory runtime saves its threads and runs to disk (upstream: every 10 s).

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
"""

from __future__ import annotations

FLUSH_SECONDS = 1


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
