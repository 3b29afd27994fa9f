"""The embedded SQLite backend: checkpoints and the tool-call ledger in one file."""

from langgraph_idem_saver.sqlite.saver import AsyncSqliteSaver

__all__ = ["AsyncSqliteSaver"]
