"""Claims submitted together share one transaction: one commit, one WAL flush.

``IdempotencyMiddleware`` sees a step's parallel tool calls one at a time (``create_agent``
wraps each call alone), so a model message of four calls makes four claims, each its own
statement, commit and WAL flush, one after the other on the saver's connection - and the
three that find their sibling's fresh claim at their step's position (the adoption read)
then claim again, three more. Claims that arrive in the same event-loop iteration, or
while a batch is being written, are sent here as one transaction instead (a pipeline:
one round trip where libpq supports it), in the order they were submitted. Each claim is
still its own statement and sees the ones before it, as it would one statement later
on its own: the answers are the ones the claims would get one by one, and each claimer
resumes only after the commit - no tool runs before its claim is on disk
(``docs/guarantees.md``). Measured on the scale-out workload (``benchmarks/README.md``).

A statement that fails rolls the whole transaction back; the batch is then sent again one
claim at a time, so that only the failing claim gets its error.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from psycopg import AsyncCursor
from psycopg.rows import TupleRow, tuple_row

from langgraph_idem_saver.errors import ConnectionClosedError

__all__ = ["ClaimStatement", "run_claims"]

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]
ClaimStatement = tuple[str, dict[str, Any]]  # a claim statement and its parameters
Rows = list[TupleRow]
Run = Callable[..., Awaitable[Any]]  # PostgresConnection._run


async def run_claims(run: Run, batch: list[ClaimStatement]) -> list[Rows | Exception]:
    """Each claim's rows (or its error), ``batch`` committed in one transaction."""
    if len(batch) == 1:  # alone: one autocommit statement, no BEGIN/COMMIT around it
        return [await _alone(run, batch[0])]
    try:
        return await run(lambda cur: _together(cur, batch), tx=True, pipeline=True)  # type: ignore[no-any-return]
    except ConnectionClosedError:
        raise  # committed or not: every claimer holds its rows as lost (ledger_store)
    except Exception:  # one claim's error: each alone, each its own answer
        return [await _alone(run, claim) for claim in batch]


async def _alone(run: Run, claim: ClaimStatement) -> Rows | Exception:
    query, params = claim

    async def one(cur: Cursor) -> Rows:
        await cur.execute(query, params)
        return await cur.fetchall()

    try:
        return await run(one)  # type: ignore[no-any-return]
    except ConnectionClosedError:
        raise
    except Exception as exc:  # handed to its own claimer, raised there
        return exc


async def _together(cur: Cursor, batch: list[ClaimStatement]) -> list[Rows | Exception]:
    """Every statement sent before any result is read (one cursor each: a cursor keeps
    only its last result), so that in a pipeline they travel in one round trip."""
    conn = cur.connection
    cursors = [conn.cursor(row_factory=tuple_row, binary=True) for _ in batch]
    try:
        for c, (query, params) in zip(cursors, batch, strict=True):
            await c.execute(query, params)
        return [await c.fetchall() for c in cursors]
    finally:
        for c in cursors:
            await c.close()
