"""The ledger engine: one implementation of the tool-call ledger protocol under every
front door (``IdempotentToolNode``, ``IdempotencyMiddleware``, ``idempotent_task``).

See :mod:`langgraph_idem_saver.engine.core` for the steps of one run and
``docs/architecture.md`` for how the modules fit together.
"""

from langgraph_idem_saver.engine.core import LedgerEngine, settle_future
from langgraph_idem_saver.engine.options import LedgerOptions
from langgraph_idem_saver.engine.types import (
    NOT_APPLIED,
    Batch,
    IdempotencyConflict,
    IdempotencyCounters,
    Kind,
    NoLedgerError,
    NotAppliedError,
    OnUnknown,
    Plan,
    ToolCallInProgress,
    UnknownToolOutcome,
    VerifyFn,
    live,
)

__all__ = [
    "NOT_APPLIED",
    "Batch",
    "IdempotencyConflict",
    "IdempotencyCounters",
    "Kind",
    "LedgerEngine",
    "LedgerOptions",
    "NoLedgerError",
    "NotAppliedError",
    "OnUnknown",
    "Plan",
    "ToolCallInProgress",
    "UnknownToolOutcome",
    "VerifyFn",
    "live",
    "settle_future",
]
