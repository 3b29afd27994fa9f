"""The PostgreSQL backend: checkpoints and the tool-call ledger in one database.

``AsyncPostgresSaver`` for asyncio programs, ``PostgresSaver`` (the same saver behind a
synchronous interface) for ``graph.invoke``; one schema.

Needs the ``postgres`` extra (``pip install 'langgraph-idem-saver[postgres]'``: psycopg 3
and psycopg-pool).
"""

from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver
from langgraph_idem_saver.postgres.sync_saver import PostgresSaver

__all__ = ["AsyncPostgresSaver", "PostgresSaver"]
