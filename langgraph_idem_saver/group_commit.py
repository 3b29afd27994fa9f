"""Group commit: writes submitted together share one transaction (one commit, one fsync).

SQLite sends every write of a saver through one (its connection has one writer); the
Postgres saver sends ledger outcomes through one: the parallel calls of one step (50
tool calls of one model message) each record their outcome as they finish, and one
autocommit statement per outcome would be one WAL flush per call. A
:class:`GroupCommit` collects what is submitted in the same event-loop iteration, and
what arrives while a batch is being committed, and hands each batch to one function
that writes it in one transaction. Each caller still returns only after *its* write is
committed, so what ``docs/guarantees.md`` says of outcomes (committed before the node
returns) and of claims (synced before any tool runs) stays true.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")
T = TypeVar("T")


class GroupCommit(Generic[In, Out]):
    """Runs ``commit(items)`` for batches of submitted items, one batch at a time.

    ``commit`` returns one result per item, in order. If it raises, every item of the
    batch gets the exception (nothing of that transaction was committed).
    """

    def __init__(self, commit: Callable[[list[In]], Awaitable[list[Out]]]) -> None:
        self._commit = commit
        # (item, its future, what the future is given instead of the result, if anything)
        self._pending: list[tuple[In, asyncio.Future[Any], Callable[[Out], Any] | None]] = []
        self._busy = False

    async def submit(self, item: In) -> Out:
        """Commit ``item`` with whatever else is submitted now; its result once committed."""
        future: asyncio.Future[Out] = asyncio.get_running_loop().create_future()
        self._queue(item, future, None)
        return await future

    def enqueue(self, item: In, convert: Callable[[Out], T]) -> asyncio.Future[T]:
        """:meth:`submit` without waiting: ``item`` is queued now (on the running loop),
        and the future holds ``convert(its result)`` once committed (or what ``convert``
        raises). One future per item, no task. Cancelling the future only stops waiting
        for it: the write happens all the same."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._queue(item, future, convert)
        return future

    def _queue(
        self, item: In, future: asyncio.Future[Any], convert: Callable[[Out], Any] | None
    ) -> None:
        self._pending.append((item, future, convert))
        if not self._busy:
            self._busy = True
            # one loop iteration: siblings finishing now join
            future.get_loop().call_soon(self._flush)

    def _flush(self) -> None:
        batch, self._pending = self._pending, []
        task = asyncio.get_running_loop().create_task(self._run(batch))
        task.add_done_callback(self._done)

    def _done(self, _: asyncio.Task[None]) -> None:
        if self._pending:
            asyncio.get_running_loop().call_soon(self._flush)
        else:
            self._busy = False

    async def _run(
        self, batch: list[tuple[In, asyncio.Future[Any], Callable[[Out], Any] | None]]
    ) -> None:
        try:
            results = await self._commit([item for item, _, _ in batch])
        except BaseException as exc:
            for _, future, _ in batch:
                if not future.done():  # a cancelled caller stopped waiting; fine
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for result, (_, future, convert) in zip(results, batch, strict=True):
            if future.done():
                continue
            if convert is None:
                future.set_result(result)
                continue
            try:
                future.set_result(convert(result))
            except Exception as error:
                future.set_exception(error)
