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
    CloseTimeoutError,
    ConfigError,
    ConnectionClosedError,
    CorruptRecordError,
    DatabaseLockedError,
    DatabasePermissionError,
    IdemSaverError,
    LedgerStateError,
    NotADatabaseError,
    ReadOnlyDatabaseError,
    SchemaVersionError,
    SerializationError,
    StatementTimeoutError,
    StorageFullError,
)
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, Outcome, ToolCallLedger

if TYPE_CHECKING:
    from langgraph_idem_saver.call_context import CallInfo, NotInLedgeredCall, current_call
    from langgraph_idem_saver.durable_model import durable_model
    from langgraph_idem_saver.engine import MiddlewareOrderError
    from langgraph_idem_saver.middleware import IdempotencyMiddleware
    from langgraph_idem_saver.postgres import AsyncPostgresSaver, PostgresSaver
    from langgraph_idem_saver.retention import SweepReport, TTLConfig
    from langgraph_idem_saver.sqlite import AsyncSqliteSaver, SqliteSaver
    from langgraph_idem_saver.standalone_ledger import ToolLedger
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
    "SqliteSaver": "langgraph_idem_saver.sqlite",
    "PostgresSaver": "langgraph_idem_saver.postgres",
    "IdempotentToolNode": "langgraph_idem_saver.tool_node",
    "NOT_APPLIED": "langgraph_idem_saver.tool_node",
    "IdempotencyConflict": "langgraph_idem_saver.tool_node",
    "NoLedgerError": "langgraph_idem_saver.tool_node",
    "ToolCallInProgress": "langgraph_idem_saver.tool_node",
    "UnknownToolOutcome": "langgraph_idem_saver.tool_node",
    "NotAppliedError": "langgraph_idem_saver.tool_node",
    "IdempotencyMiddleware": "langgraph_idem_saver.middleware",
    "MiddlewareOrderError": "langgraph_idem_saver.engine",
    "idempotent_task": "langgraph_idem_saver.task",
    "durable_model": "langgraph_idem_saver.durable_model",
    "RecordedFailureError": "langgraph_idem_saver.task",
    "TTLConfig": "langgraph_idem_saver.retention",
    "SweepReport": "langgraph_idem_saver.retention",
    "ToolLedger": "langgraph_idem_saver.standalone_ledger",
    "current_call": "langgraph_idem_saver.call_context",
    "CallInfo": "langgraph_idem_saver.call_context",
    "NotInLedgeredCall": "langgraph_idem_saver.call_context",
}


POSTGRES_EXTRA = "pip install 'langgraph-idem-saver[postgres]'"
_POSTGRES_MODULES = ("psycopg", "psycopg_pool")
# optional extras: the modules each needs, and the lazy names that need them
_EXTRAS = {
    "langgraph_idem_saver.postgres": _POSTGRES_MODULES,
    "langgraph_idem_saver.middleware": ("langchain",),
}


def __getattr__(name: str) -> Any:
    """Import a lazily loaded name on first use (PEP 562)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'langgraph_idem_saver' has no attribute {name!r}")
    try:
        imported = importlib.import_module(module)
    except ImportError as exc:
        missing = (exc.name or "").split(".")[0]
        if module.startswith("langgraph_idem_saver.postgres") and (
            missing.startswith("psycopg") or not missing
        ):
            # the Postgres backend is an optional extra: say which one, not just "psycopg"
            raise ImportError(
                f"{name} needs the PostgreSQL extra (psycopg 3 and psycopg-pool), which is "
                f"not installed: {POSTGRES_EXTRA}  [{type(exc).__name__}: {exc}]",
                name=exc.name,
            ) from exc
        raise
    value = getattr(imported, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The module's names, the lazily loaded ones included (they are not in globals()
    until first used)."""
    return sorted({*globals(), *_LAZY})


def _installed(modules: tuple[str, ...]) -> bool:
    """Whether an extra's packages can be found (without importing them)."""
    from importlib.util import find_spec

    try:
        return all(find_spec(m) is not None for m in modules)
    except (ImportError, ValueError):  # a module in sys.modules without a __spec__
        return False


__all__ = [
    "NOT_APPLIED",
    "AsyncPostgresSaver",
    "AsyncSqliteSaver",
    "CallInfo",
    "CallStatus",
    "CloseTimeoutError",
    "ConfigError",
    "ConnectionClosedError",
    "CorruptRecordError",
    "DatabaseLockedError",
    "DatabasePermissionError",
    "IdemSaverError",
    "IdempotencyConflict",
    "IdempotencyMiddleware",
    "IdempotentToolNode",
    "LedgerEntry",
    "LedgerStateError",
    "MiddlewareOrderError",
    "NoLedgerError",
    "NotADatabaseError",
    "NotAppliedError",
    "NotInLedgeredCall",
    "Outcome",
    "PostgresSaver",
    "ReadOnlyDatabaseError",
    "RecordedFailureError",
    "SchemaVersionError",
    "SerializationError",
    "SqliteSaver",
    "StatementTimeoutError",
    "StorageFullError",
    "SweepReport",
    "TTLConfig",
    "ToolCallInProgress",
    "ToolCallLedger",
    "ToolLedger",
    "UnknownToolOutcome",
    "current_call",
    "durable_model",
    "idempotent_task",
]
# `from langgraph_idem_saver import *` works without the optional extras; their names stay
# in dir() and, when used, raise an ImportError naming the extra
_missing = {module for module, needs in _EXTRAS.items() if not _installed(needs)}
__all__ = [n for n in __all__ if _LAZY.get(n) not in _missing]
__version__ = "0.1.0"
