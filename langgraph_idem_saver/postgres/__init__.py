"""The PostgreSQL backend: checkpoints and the tool-call ledger in one database.

Needs the ``postgres`` extra (``pip install 'langgraph-idem-saver[postgres]'``: psycopg 3
and psycopg-pool).
"""

from langgraph_idem_saver.postgres.saver import AsyncPostgresSaver

__all__ = ["AsyncPostgresSaver"]
