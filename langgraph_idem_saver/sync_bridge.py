"""What the synchronous savers (``SqliteSaver``, ``PostgresSaver``) share: an async saver
running on a private event loop in a daemon thread, behind LangGraph's sync interface.

Why this design, rather than a second, synchronous implementation of each backend:

* **One implementation, one schema, by construction.** Checkpoints, blobs and list
  deltas, the ledger's policy, migrations, typed errors, group commit (SQLite) and
  one-statement reads (Postgres) all live in the async savers. A sync twin of each would
  be ~1,000 lines per backend to keep in step; here a database written by
  ``AsyncSqliteSaver`` *is* one written by ``SqliteSaver`` (the same code wrote it).
* **The engine needs nothing new.** The ledger is async (``ToolCallLedger``); the sync
  front doors already run it from a node's thread on the ledger's ``loop``
  (:mod:`langgraph_idem_saver.engine.loops`). A sync saver exposes its private loop as
  ``loop``, so ``graph.invoke`` with ``IdempotentToolNode``, ``IdempotencyMiddleware`` or
  ``idempotent_task`` works with no loop anywhere in the caller's program.
* **Thread-safe as LangGraph's sync savers promise.** Every call, from any thread, is a
  coroutine handed to the one loop; the async saver serializes what must be serialized
  (one SQLite connection, one Postgres connection) and runs the rest concurrently (a
  Postgres pool). Concurrent SQLite writes from several threads share a commit.

The cost is a round trip to the loop thread per call (plus, for SQLite, aiosqlite's own
hand-off to its worker thread, as in the async saver): tens of microseconds on an idle
machine, more when threads wait for a CPU (``benchmarks/bench_sync.py`` measures it).

Lifetime: the loop thread is a daemon, so a program that never closes its saver still
exits; ``close()`` (or leaving ``from_conn_string``'s ``with`` block, or ``with saver:``)
closes what the saver opened and stops the thread, and a saver that is garbage collected
or still open at interpreter exit is closed the same way (best effort, bounded).

The async methods work too, from any event loop (they hop to the private loop), so one
sync saver can serve ``graph.invoke`` and ``graph.ainvoke`` alike. A sync method called
*on* the private loop (which only code running inside the saver could do) raises
:class:`~langgraph_idem_saver.saver_base.SyncCallOnEventLoopError` instead of
deadlocking.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import threading
import weakref
from collections.abc import (
    AsyncGenerator,
    AsyncIterator,
    Awaitable,
    Callable,
    Collection,
    Coroutine,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import AsyncExitStack
from types import TracebackType
from typing import Any, Generic, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.engine.loops import on_loop
from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.import_langgraph import ImportReport
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    ClaimOutcome,
    LedgerEntry,
    ToolCallLedger,
)
from langgraph_idem_saver.saver_base import IdemSaverBase, SyncCallOnEventLoopError

T = TypeVar("T")
S = TypeVar("S", bound=IdemSaverBase)
Saver = TypeVar("Saver", bound="SyncSaverBase[Any]")

LOG = logging.getLogger(__name__)

# how long closing (at exit, on garbage collection) may wait for the saver's resources
SHUTDOWN_SECONDS = 10.0
# checkpoints fetched per hop by ``list``: the async savers read pages of 100
LIST_CHUNK = 100
# how often a waiting caller checks that the loop thread is still alive
_ALIVE_POLL_SECONDS = 1.0


class _Runtime:
    """A private event loop in a daemon thread, and what was opened on it.

    Shared by a sync saver and its ``with_allowlist`` copies: it is closed once, by
    ``close()`` of any of them, or when the last of them is garbage collected.
    """

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.stack = AsyncExitStack()
        self.closed = False
        started = threading.Event()
        # target and args must not reference self: the finalizer below needs it collectable
        self.thread = threading.Thread(
            target=_serve, args=(self.loop, started), name=name, daemon=True
        )
        self.thread.start()
        started.wait()
        self._finalizer = weakref.finalize(self, _shutdown, self.loop, self.thread, self.stack)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for it (from any thread but the loop's)."""
        if threading.current_thread() is self.thread:
            coro.close()
            raise SyncCallOnEventLoopError(
                "a synchronous saver method was called on the saver's own event loop; "
                "use the async method (`await saver.aget_tuple(...)`)"
            )
        if self.closed:
            coro.close()
            raise _closed_error()
        try:
            future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        except RuntimeError as exc:  # the loop closed after the check above
            coro.close()
            raise _closed_error() from exc
        while True:
            try:
                # result(timeout) rather than concurrent.futures.wait(): half the cost
                return future.result(_ALIVE_POLL_SECONDS)
            except concurrent.futures.TimeoutError:
                if future.done():  # the coroutine's own TimeoutError
                    raise
                if not self.thread.is_alive():  # stopped with our coroutine still queued
                    future.cancel()
                    raise _closed_error() from None

    async def hop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the loop, from this loop or any other."""
        if self.closed:
            coro.close()
            raise _closed_error()
        return await on_loop(self.loop, coro)

    def close(self) -> None:
        """Close what was opened on the loop (errors propagate), then stop the thread."""
        if self.closed:
            return
        self.closed = True
        try:
            if self.thread.is_alive() and threading.current_thread() is not self.thread:
                future = asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop)
                future.result(SHUTDOWN_SECONDS)
        finally:
            self._finalizer()


def _serve(loop: asyncio.AbstractEventLoop, started: threading.Event) -> None:
    """The loop thread: run until stopped, then finish what is left and close the loop."""
    asyncio.set_event_loop(loop)
    loop.call_soon(started.set)
    try:
        loop.run_forever()
    finally:
        try:
            tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in tasks:
                task.cancel()
            if tasks:
                loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _shutdown(
    loop: asyncio.AbstractEventLoop, thread: threading.Thread, stack: AsyncExitStack
) -> None:
    """Close ``stack`` on ``loop`` and stop ``thread`` (the finalizer: idempotent, bounded,
    never raising - it may run at interpreter exit or in the garbage collector)."""
    if loop.is_closed() or not thread.is_alive():
        return
    if threading.current_thread() is thread:  # collected on the loop itself: cannot wait

        async def last() -> None:
            try:
                await stack.aclose()
            finally:
                loop.stop()

        loop.create_task(last())
        return
    try:
        asyncio.run_coroutine_threadsafe(stack.aclose(), loop).result(SHUTDOWN_SECONDS)
    except Exception:  # best effort: the process may be exiting
        LOG.warning("closing a sync saver's connection failed", exc_info=True)
    try:
        loop.call_soon_threadsafe(loop.stop)
    except RuntimeError:  # closed meanwhile
        return
    thread.join(SHUTDOWN_SECONDS)


def _closed_error() -> ConnectionClosedError:
    return ConnectionClosedError(
        "the saver is closed (close() was called or its `with` block ended); open a new one"
    )


async def _pull(agen: AsyncIterator[T], n: int) -> tuple[list[T], bool]:
    """Up to ``n`` items of ``agen`` and whether it may have more: one hop for many items."""
    items: list[T] = []
    while len(items) < n:
        try:
            items.append(await agen.__anext__())
        except StopAsyncIteration:
            return items, False
    return items, True


class SyncSaverBase(BaseCheckpointSaver[str], ToolCallLedger, Generic[S]):
    """LangGraph's sync checkpointer interface, and the async one, over an async saver ``S``
    that runs on a private loop (see the module docstring). Also a :class:`ToolCallLedger`,
    so the front doors find it as the graph's checkpointer.

    Attributes:
        saver: the async saver doing the work (use it only through this object's methods
            from outside its loop).
        loop: its event loop (the engine runs ledger coroutines there).
    """

    saver: S
    loop: asyncio.AbstractEventLoop
    _runtime: _Runtime

    def _start(self, name: str, opener: Callable[[AsyncExitStack], Awaitable[S]]) -> None:
        """Start the loop thread and build the async saver on it with ``opener``, which
        registers what it opens on the stack (closed by :meth:`close`).

        ``BaseCheckpointSaver.__init__`` is not called: all it does is set ``serde``,
        which here is the async saver's (a property).
        """
        runtime = _Runtime(name)

        async def build() -> S:
            return await opener(runtime.stack)

        try:
            saver = runtime.call(build())
        except BaseException:
            try:
                runtime.close()
            except Exception:  # the first error is the one to report
                LOG.debug("cleanup after a failed open failed", exc_info=True)
            raise
        self._runtime = runtime
        self.saver = saver
        self.loop = runtime.loop

    # --- lifetime ----------------------------------------------------------------------

    def close(self) -> None:
        """Close the connection (or pool) the saver opened and stop its loop thread.

        Idempotent. A connection you passed in is yours: it is not closed. Afterwards
        every method raises :class:`~langgraph_idem_saver.errors.ConnectionClosedError`.
        """
        self._runtime.close()

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (on this saver or a ``with_allowlist`` copy)."""
        return self._runtime.closed

    def __enter__(self: Saver) -> Saver:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runtime.call(coro)

    async def _hop(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._runtime.hop(coro)

    # --- what the async saver owns -------------------------------------------------------

    @property
    def serde(self) -> SerializerProtocol:
        """The async saver's serializer (one for checkpoints, writes and ledger results)."""
        return self.saver.serde

    @serde.setter
    def serde(self, value: SerializerProtocol) -> None:
        self.saver.serde = value

    @property
    def is_setup(self) -> bool:
        return bool(getattr(self.saver, "is_setup", False))

    def get_next_version(self, current: str | None, channel: None) -> str:
        return self.saver.get_next_version(current, channel)

    def with_allowlist(
        self, extra_allowlist: Collection[tuple[str, ...]]
    ) -> BaseCheckpointSaver[str]:
        """A shallow copy whose serializer allows more msgpack types (LangGraph calls this
        when compiling a graph with registered types): the same loop, connection and
        ledger; only the serializer differs."""
        inner = self.saver.with_allowlist(extra_allowlist)
        if inner is self.saver:
            return self
        clone = copy.copy(self)
        clone.saver = cast(S, inner)
        return clone

    # --- sync checkpoint API -------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._call(self.saver.aget_tuple(config))

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._call(self.saver.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._call(self.saver.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._call(self.saver.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._call(self.saver.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._call(self.saver.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._call(self.saver.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return self._call(self.saver.aget_delta_channel_history(config=config, channels=channels))

    def import_langgraph(self, **options: Any) -> ImportReport:
        """``aimport_langgraph`` (same keyword arguments) for sync code."""
        return self._call(self.saver.aimport_langgraph(**options))

    # --- async checkpoint API (from any loop) --------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._hop(self.saver.aget_tuple(config))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        agen = _generator(self.saver.alist(config, filter=filter, before=before, limit=limit))
        if _running_loop() is self.loop:
            async for tup in agen:
                yield tup
            return
        try:
            more = True
            while more:
                items, more = await self._hop(_pull(agen, LIST_CHUNK))
                for tup in items:
                    yield tup
        finally:
            if not self.closed:
                await self._hop(agen.aclose())

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await self._hop(self.saver.aput(config, checkpoint, metadata, new_versions))

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await self._hop(self.saver.aput_writes(config, writes, task_id, task_path))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._hop(self.saver.adelete_thread(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._hop(self.saver.adelete_for_runs(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._hop(self.saver.acopy_thread(source_thread_id, target_thread_id))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._hop(self.saver.aprune(thread_ids, strategy=strategy))

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        return await self._hop(
            self.saver.aget_delta_channel_history(config=config, channels=channels)
        )

    # --- the ledger (async, as the engine drives it; on the saver's loop) ----------------

    async def aclaim(
        self, intents: Sequence[CallIntent], *, owner: str, lease_seconds: float
    ) -> list[ClaimOutcome]:
        return await self._hop(self.saver.aclaim(intents, owner=owner, lease_seconds=lease_seconds))

    async def afinish(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None = None,
    ) -> LedgerEntry:
        return await self._hop(
            self.saver.afinish(
                scope,
                key,
                owner=owner,
                status=status,
                result_type=result_type,
                result=result,
                error=error,
            )
        )

    async def areclaim(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        lease_seconds: float,
        expected_attempts: int,
        expected_owner: str,
    ) -> LedgerEntry | None:
        return await self._hop(
            self.saver.areclaim(
                scope,
                key,
                owner=owner,
                lease_seconds=lease_seconds,
                expected_attempts=expected_attempts,
                expected_owner=expected_owner,
            )
        )

    async def arelease(self, scope: str, key: str, *, owner: str) -> bool:
        return await self._hop(self.saver.arelease(scope, key, owner=owner))

    async def aabandon(self, scope: str, key: str, *, owner: str, error: str) -> LedgerEntry | None:
        return await self._hop(self.saver.aabandon(scope, key, owner=owner, error=error))

    async def aadopt(
        self, scope: str, key: str, *, tool_call_id: str, previous: str | None = None
    ) -> LedgerEntry | None:
        return await self._hop(
            self.saver.aadopt(scope, key, tool_call_id=tool_call_id, previous=previous)
        )

    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        return await self._hop(self.saver.aget_entry(scope, key))

    async def afind_orphans(
        self, scope: str, agent_path: str, tool_name: str, args_hash: str
    ) -> list[LedgerEntry]:
        return await self._hop(self.saver.afind_orphans(scope, agent_path, tool_name, args_hash))

    async def alist_entries(
        self, thread_id: str | None = None, *, agent_path: str | None = None
    ) -> list[LedgerEntry]:
        return await self._hop(self.saver.alist_entries(thread_id, agent_path=agent_path))

    async def alist_issued(self) -> list[LedgerEntry]:
        return await self._hop(self.saver.alist_issued())

    async def alist_unknown(self, *, now: float | None = None) -> list[LedgerEntry]:
        return await self._hop(self.saver.alist_unknown(now=now))

    async def aresolve(
        self,
        scope: str,
        key: str,
        *,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None,
        expected_attempts: int,
        expected_owner: str,
    ) -> LedgerEntry | None:
        return await self._hop(
            self.saver.aresolve(
                scope,
                key,
                status=status,
                result_type=result_type,
                result=result,
                error=error,
                expected_attempts=expected_attempts,
                expected_owner=expected_owner,
            )
        )

    async def aoperator_update(
        self,
        entry: LedgerEntry,
        *,
        status: CallStatus,
        owner: str,
        lease_expires_at: float,
        result_type: str | None,
        result: bytes | None,
        error: str | None,
        finished_at: float | None,
        event: dict[str, Any],
    ) -> LedgerEntry | None:
        return await self._hop(
            self.saver.aoperator_update(
                entry,
                status=status,
                owner=owner,
                lease_expires_at=lease_expires_at,
                result_type=result_type,
                result=result,
                error=error,
                finished_at=finished_at,
                event=event,
            )
        )

    async def anote_replay(self, scope: str, key: str, *, conflict: bool = False) -> None:
        await self._hop(self.saver.anote_replay(scope, key, conflict=conflict))

    # --- last: the method named `list` shadows the builtin in the class body below it

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, fetched lazily a page at a time (nothing is held
        between pages: the caller may write while iterating)."""
        agen = _generator(self.saver.alist(config, filter=filter, before=before, limit=limit))
        try:
            more = True
            while more:
                items, more = self._call(_pull(agen, LIST_CHUNK))
                yield from items
        finally:
            if not self.closed:
                self._call(agen.aclose())


def _generator(items: AsyncIterator[T]) -> AsyncGenerator[T, None]:
    """``alist``'s result as what it is (an async generator), to close it when a
    consumer stops early."""
    return cast(AsyncGenerator[T, None], items)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
