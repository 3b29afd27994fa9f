"""The embedded SQLite backend: checkpoints and the tool-call ledger in one file.

``AsyncSqliteSaver`` for asyncio programs, ``SqliteSaver`` (the same saver behind a
synchronous interface) for ``graph.invoke``; one file format.
"""

from langgraph_idem_saver.sqlite.saver import AsyncSqliteSaver
from langgraph_idem_saver.sqlite.sync_saver import SqliteSaver

__all__ = ["AsyncSqliteSaver", "SqliteSaver"]
