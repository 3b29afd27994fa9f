"""Crash-safe LangGraph checkpointers with a durable tool-call ledger.

``from langgraph_idem_saver import AsyncSqliteSaver`` is a drop-in for LangGraph's
``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver``; ``IdempotentToolNode`` is a drop-in
for ``langgraph.prebuilt.ToolNode`` that runs each side-effecting tool call at most once
across crashes and resumes.
"""

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
from langgraph_idem_saver.sqlite import AsyncSqliteSaver
from langgraph_idem_saver.tool_node import (
    NOT_APPLIED,
    IdempotencyConflict,
    IdempotentToolNode,
    NoLedgerError,
    ToolCallInProgress,
    UnknownToolOutcome,
)

__all__ = [
    "NOT_APPLIED",
    "AsyncSqliteSaver",
    "CallStatus",
    "ConfigError",
    "ConnectionClosedError",
    "CorruptRecordError",
    "DatabaseLockedError",
    "IdemSaverError",
    "IdempotencyConflict",
    "IdempotentToolNode",
    "LedgerEntry",
    "LedgerStateError",
    "NoLedgerError",
    "NotADatabaseError",
    "SchemaVersionError",
    "SerializationError",
    "ToolCallInProgress",
    "ToolCallLedger",
    "UnknownToolOutcome",
]
__version__ = "0.1.0"
