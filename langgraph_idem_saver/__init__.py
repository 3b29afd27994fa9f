"""Crash-safe LangGraph checkpointers with a durable tool-call ledger.

``from langgraph_idem_saver import AsyncSqliteSaver`` is a drop-in for LangGraph's
``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver`` (``AsyncPostgresSaver`` likewise for
``langgraph.checkpoint.postgres.aio``); ``IdempotentToolNode`` is a drop-in for
``langgraph.prebuilt.ToolNode`` that runs each side-effecting tool call at most once
across crashes and resumes.

The savers and the tool node are imported on first use (PEP 562), so ``import
langgraph_idem_saver`` - and the ``idem-saver`` command line - stay fast, and the
Postgres backend's optional dependency (psycopg) is only needed when it is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    DatabaseLockedError,
    IdemSaverError,
    LedgerStateError,
    NotADatabaseError,
    SchemaVersionError,
    SerializationError,
)
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, ToolCallLedger

if TYPE_CHECKING:
    from langgraph_idem_saver.middleware import IdempotencyMiddleware
    from langgraph_idem_saver.postgres import AsyncPostgresSaver
    from langgraph_idem_saver.sqlite import AsyncSqliteSaver
    from langgraph_idem_saver.task import RecordedFailureError, idempotent_task
    from langgraph_idem_saver.tool_node import (
        NOT_APPLIED,
        IdempotencyConflict,
        IdempotentToolNode,
        NoLedgerError,
        NotAppliedError,
        ToolCallInProgress,
        UnknownToolOutcome,
    )

_LAZY = {
    "AsyncSqliteSaver": "langgraph_idem_saver.sqlite",
    "AsyncPostgresSaver": "langgraph_idem_saver.postgres",
    "IdempotentToolNode": "langgraph_idem_saver.tool_node",
    "NOT_APPLIED": "langgraph_idem_saver.tool_node",
    "IdempotencyConflict": "langgraph_idem_saver.tool_node",
    "NoLedgerError": "langgraph_idem_saver.tool_node",
    "ToolCallInProgress": "langgraph_idem_saver.tool_node",
    "UnknownToolOutcome": "langgraph_idem_saver.tool_node",
    "NotAppliedError": "langgraph_idem_saver.tool_node",
    "IdempotencyMiddleware": "langgraph_idem_saver.middleware",
    "idempotent_task": "langgraph_idem_saver.task",
    "RecordedFailureError": "langgraph_idem_saver.task",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_idem_saver' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__all__ = [
    "NOT_APPLIED",
    "AsyncPostgresSaver",
    "AsyncSqliteSaver",
    "CallStatus",
    "ConfigError",
    "ConnectionClosedError",
    "CorruptRecordError",
    "DatabaseLockedError",
    "IdemSaverError",
    "IdempotencyConflict",
    "IdempotencyMiddleware",
    "IdempotentToolNode",
    "LedgerEntry",
    "LedgerStateError",
    "NoLedgerError",
    "NotADatabaseError",
    "NotAppliedError",
    "RecordedFailureError",
    "SchemaVersionError",
    "SerializationError",
    "ToolCallInProgress",
    "ToolCallLedger",
    "UnknownToolOutcome",
    "idempotent_task",
]
__version__ = "0.1.0"
