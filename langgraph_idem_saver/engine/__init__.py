"""The ledger engine: one implementation of the tool-call ledger protocol under every
front door (``IdempotentToolNode``, ``IdempotencyMiddleware``, ``idempotent_task``).

See :mod:`langgraph_idem_saver.engine.core` for the steps of one run and
``docs/architecture.md`` for how the modules fit together.
"""

from langgraph_idem_saver.engine import types
from langgraph_idem_saver.engine.core import LedgerEngine, settle_future
from langgraph_idem_saver.engine.options import LedgerOptions
from langgraph_idem_saver.engine.types import *  # noqa: F403  (its __all__)

__all__ = ["LedgerEngine", "LedgerOptions", "settle_future"]
__all__ += types.__all__
