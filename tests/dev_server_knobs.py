"""The one private knob of ``langgraph dev`` the server tests turn: how often its
in-memory runtime saves its threads and runs to disk (upstream: every 10 s).

The server crash tests (test_agent_server.py, test_ledger_beside_server.py) wait for such
a save before a tool kills the server - the server must know its runs as running to re-run
them after the restart. A save every second instead of every ten shortens that wait and
changes nothing else: the same flush thread writes the same files, sooner.
``langgraph_runtime_inmem._persistence._flush_interval`` is private;
tests/test_upstream_contracts.py pins it.
"""

from __future__ import annotations

FLUSH_SECONDS = 1


def flush_often() -> None:
    """In the process that runs ``langgraph dev --no-reload``, before the server starts."""
    from langgraph_runtime_inmem import _persistence

    if not isinstance(getattr(_persistence, "_flush_interval", None), int):
        raise RuntimeError("langgraph_runtime_inmem no longer has _persistence._flush_interval")
    _persistence._flush_interval = FLUSH_SECONDS
