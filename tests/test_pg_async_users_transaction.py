"""AsyncPostgresSaver over a user's own ``AsyncConnection`` with a transaction of the
user's open (``async with conn.transaction():``): the ledger's writes refuse it with
``ConfigError`` before sending anything - joined, a claim would be a savepoint committed
only with the user's transaction and gone with its rollback while the tool had run - and
checkpoint writes still join it, as LangGraph's saver's do. The sync saver does the same
(``postgres/borrowed.py``).
"""

from __future__ import annotations

import psycopg
import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import empty_checkpoint
from psycopg import AsyncConnection
from tool_node_helpers import intent_for

from langgraph_idem_saver import AsyncPostgresSaver, ConfigError


class _Rollback(Exception):
    """Ends the user's transaction with a rollback."""


@pytest.mark.parametrize("autocommit", [True, False])
async def test_a_claim_inside_the_users_transaction_is_refused(
    pg_dsn: str, autocommit: bool
) -> None:
    intent = intent_for("t", {"name": "charge", "args": {"n": 1}, "id": "c1"})
    thread = f"users-tx-{autocommit}"
    config: RunnableConfig = {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}
    async with await AsyncConnection.connect(pg_dsn, autocommit=autocommit) as conn:
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        if not autocommit:
            await conn.commit()
        with pytest.raises(_Rollback):
            async with conn.transaction():
                with pytest.raises(ConfigError, match="transaction of yours open"):
                    await saver.aclaim([intent], owner="a", lease_seconds=60)
                # the control: a checkpoint write joins the user's transaction
                await saver.aput(config, empty_checkpoint(), {}, {})
                assert await saver.aget_tuple(config) is not None
                raise _Rollback
        # rolled back with the user's transaction: the checkpoint gone, and no claim
        assert await saver.aget_tuple(config) is None
        with psycopg.connect(pg_dsn) as other:
            assert other.execute("SELECT count(*) FROM idem_tool_calls").fetchone() == (0,)
        async with conn.transaction():
            with pytest.raises(ConfigError, match="transaction of yours open"):
                await saver.aclaim([intent], owner="a", lease_seconds=60)
        with psycopg.connect(pg_dsn) as other:  # committed, still nothing of the ledger's
            assert other.execute("SELECT count(*) FROM idem_tool_calls").fetchone() == (0,)
        # the same connection outside a transaction of the user's: a normal claim
        [claim] = await saver.aclaim([intent], owner="a", lease_seconds=60)
        assert claim.claimed
        if not autocommit:
            await conn.commit()
        with psycopg.connect(pg_dsn) as other:
            assert other.execute("SELECT count(*) FROM idem_tool_calls").fetchone() == (1,)
