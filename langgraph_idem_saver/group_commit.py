"""Group commit: writes submitted together share one transaction (one commit, one fsync).

SQLite sends every write of a saver through one (its connection has one writer); the
Postgres saver sends ledger outcomes through one: the parallel calls of one step (50
tool calls of one model message) each record their outcome as they finish, and one
autocommit statement per outcome would be one WAL flush per call. A
:class:`GroupCommit` collects what is submitted in the same event-loop iteration, and
what arrives while a batch is being committed, and hands each batch to one function
that writes it in one transaction. Each caller of ``submit`` returns only after *its*
write is committed; ``submit_nowait`` hands back the future instead (a ``ToolNode`` step
awaits its outcomes together, before the node returns). So what ``docs/guarantees.md``
says of outcomes (committed before the node returns) and of claims (synced before any
tool runs) stays true.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class GroupCommit(Generic[In, Out]):
    """Runs ``commit(items)`` for batches of submitted items, one batch at a time.

    ``commit`` returns one result per item, in order. If it raises, every item of the
    batch gets the exception (nothing of that transaction was committed).
    """

    def __init__(self, commit: Callable[[list[In]], Awaitable[list[Out]]]) -> None:
        self._commit = commit
        self._pending: list[tuple[In, asyncio.Future[Out]]] = []
        self._busy = False

    async def submit(self, item: In) -> Out:
        """Commit ``item`` with whatever else is submitted now; its result once committed."""
        return await self.submit_nowait(item)

    def submit_nowait(self, item: In) -> asyncio.Future[Out]:
        """:meth:`submit` without waiting: the future of ``item``'s result."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Out] = loop.create_future()
        self._pending.append((item, future))
        if not self._busy:
            self._busy = True
            loop.call_soon(self._flush)  # one loop iteration: siblings finishing now join
        return future

    def submit_gathered(self, item: In) -> asyncio.Future[Out]:
        """:meth:`submit_nowait` for an item its caller already gathered over a loop
        iteration (a step's outcomes, ``engine.step_writes``): committed with what is
        pending now, without waiting one more iteration for siblings - unless a batch is
        being committed, when it joins the next one as any item does."""
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._pending.append((item, future))
        if not self._busy:
            self._busy = True
            self._flush()
        return future

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._run(batch))
        task.add_done_callback(self._done)

    def _done(self, _: asyncio.Task[None]) -> None:
        if self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._busy = False

    async def _run(self, batch: list[tuple[In, asyncio.Future[Out]]]) -> None:
        try:
            results = await self._commit([item for item, _ in batch])
        except BaseException as exc:
            for _, future in batch:
                if not future.done():  # a cancelled caller stopped waiting; fine
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for result, (_, future) in zip(results, batch, strict=True):
            if not future.done():
                future.set_result(result)
