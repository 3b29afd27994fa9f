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
* **Thread-safe as LangGraph's sync savers promise.** Every call that takes the loop,
  from any thread, is a coroutine handed to the one loop; the async saver serializes
  what must be serialized (one SQLite connection, one Postgres connection) and runs the
  rest concurrently (a Postgres pool).

The cost is a round trip to the loop thread per call (plus, for SQLite, aiosqlite's own
hand-off to its worker thread, as in the async saver): three thread switches, tens of
microseconds on an idle machine but about a millisecond when threads wait for a CPU - more
than the SQL of a read. So ``SqliteSaver`` skips it where ``graph.invoke`` spends its time:
once set up, ``get_tuple``, ``put``, ``put_writes``, ``list`` and
``get_delta_channel_history`` run the async saver's own read and write bodies on the
caller's thread, holding the connection lock its worker holds for everything else (see
:mod:`langgraph_idem_saver.sqlite.sync_saver`; concurrent direct writes then take turns,
one commit each, instead of sharing one). ``PostgresSaver`` skips it for the same calls
(not ``get_delta_channel_history``) by running them over the user's own *sync* psycopg
``Connection`` or ``ConnectionPool`` on the caller's thread - the async saver's own
statements and decoding, built once for both (see
:mod:`langgraph_idem_saver.postgres.sync_saver`); what runs on its loop (the ledger,
maintenance and ``setup()``) borrows the same connection or pool for each call
(:mod:`langgraph_idem_saver.postgres.borrowed`).

Lifetime: the loop thread is a daemon, so a program that never closes its saver still
exits; ``close()`` (or leaving ``from_conn_string``'s ``with`` block, or ``with saver:``)
closes what the saver opened and stops the thread, once, within ``CLOSE_SECONDS`` (else a
typed ``CloseTimeoutError``; :mod:`langgraph_idem_saver.sync_closing`), and a saver that is
garbage collected or still open at interpreter exit is closed the same way (best effort,
bounded).

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
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from contextlib import AsyncExitStack
from typing import Any, Generic, TypeVar, cast

from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.answer_records import AnswerRecords
from langgraph_idem_saver.engine.loops import awaiting, on_loop, running_loop
from langgraph_idem_saver.errors import CloseTimeoutError, ConnectionClosedError
from langgraph_idem_saver.forwarding import blocking, hopping, paging, relaying
from langgraph_idem_saver.held_outcomes import OutcomeParams
from langgraph_idem_saver.ledger import Outcome, ToolCallLedger
from langgraph_idem_saver.saver_base import IdemSaverBase, SyncCallOnEventLoopError
from langgraph_idem_saver.sync_closing import Closing, LastWrites, shutdown

T = TypeVar("T")
S = TypeVar("S", bound=IdemSaverBase)
Saver = TypeVar("Saver", bound="SyncSaverBase[Any]")

LOG = logging.getLogger(__name__)

# how long closing (at exit, on garbage collection) may wait for the saver's resources
SHUTDOWN_SECONDS = 10.0
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
        self._closing = Closing(self.loop, self.thread, self.stack)
        self._finalizer = weakref.finalize(self, shutdown, self._closing, SHUTDOWN_SECONDS)

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
                if future.done():  # done as the wait timed out, or its own TimeoutError
                    return future.result()
                if not self.thread.is_alive():  # stopped with our coroutine still queued
                    future.cancel()
                    raise _closed_error() from None
            except concurrent.futures.CancelledError:  # only the loop's shutdown cancels
                raise _closed_error() from None  # a call left running as the close ended

    async def hop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the loop, from this loop or any other."""
        if self.closed:
            coro.close()
            raise _closed_error()
        return await on_loop(self.loop, coro)

    def close(
        self, bound: float = 2 * SHUTDOWN_SECONDS, last_writes: LastWrites | None = None
    ) -> None:
        """Close what was opened on the loop (errors propagate), then stop the thread:
        the one close (:mod:`~langgraph_idem_saver.sync_closing`), at most ``bound``
        seconds (then :class:`~langgraph_idem_saver.errors.CloseTimeoutError`), joined
        by any other closer. Every call raises ``ConnectionClosedError`` from now on."""
        self.closed = True
        closing = self._closing
        end, first = closing.begin(bound, last_writes)
        if end.done() and not first:
            return  # closed before: idempotent
        closing.wait(end)


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


def _closed_error() -> ConnectionClosedError:
    return ConnectionClosedError(
        "the saver is closed (close() was called or its `with` block ended); open a new one"
    )


class ForwardedLedger(ToolCallLedger):
    """The ledger of a saver living on another loop, method for method: the sync savers'
    (their async saver, on a private loop) and ``ToolLedger``'s. Each method is the
    saver's, awaited where it lives (``forwarding.hopping``, through the class's
    ``_bridge_target`` and ``_run_hopping``), so the two cannot drift apart."""

    @abstractmethod
    def _bridge_target(self) -> IdemSaverBase:
        """The saver doing the work."""

    @abstractmethod
    async def _run_hopping(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` on the saver's loop."""

    aclaim = hopping(IdemSaverBase.aclaim)
    aclaim_step = hopping(IdemSaverBase.aclaim_step)
    areclaim = hopping(IdemSaverBase.areclaim)
    arelease = hopping(IdemSaverBase.arelease)
    aabandon = hopping(IdemSaverBase.aabandon)
    aadopt = hopping(IdemSaverBase.aadopt)
    aget_entry = hopping(IdemSaverBase.aget_entry)
    afind_orphans = hopping(IdemSaverBase.afind_orphans)
    afind_at_position = hopping(IdemSaverBase.afind_at_position)
    afind_step_candidates = hopping(IdemSaverBase.afind_step_candidates)
    alist_entries = hopping(IdemSaverBase.alist_entries)
    alist_issued = hopping(IdemSaverBase.alist_issued)
    alist_unknown = hopping(IdemSaverBase.alist_unknown)
    aresolve = hopping(IdemSaverBase.aresolve)
    aoperator_update = hopping(IdemSaverBase.aoperator_update)
    anote_replay = hopping(IdemSaverBase.anote_replay)
    # both savers of this package record a model answer in one commit (answer_records)
    arecord_answer = hopping(AnswerRecords.arecord_answer)

    def record_outcome(
        self, scope: str, key: str, *, owner: str, outcome: Outcome
    ) -> Awaitable[None]:
        """The saver's own (its group commit) on its loop; from another loop, started
        now in a task that hops there."""
        record = self._bridge_target().record_outcome
        if running_loop() is self.loop:
            return record(scope, key, owner=owner, outcome=outcome)
        started = awaiting(record, scope, key, owner=owner, outcome=outcome)
        return asyncio.ensure_future(self._run_hopping(started))

    def record_outcome_rows(
        self, rows: Sequence[OutcomeParams]
    ) -> Awaitable[list[Exception | None]]:
        """The saver's own (one write for all the rows) on its loop; from another loop,
        started now in a task that hops there."""
        record = self._bridge_target().record_outcome_rows
        if running_loop() is self.loop:
            return record(rows)
        return asyncio.ensure_future(self._run_hopping(awaiting(record, rows)))


class SyncSaverBase(BaseCheckpointSaver[str], ForwardedLedger, Generic[S]):
    """LangGraph's sync checkpointer interface, and the async one, over an async saver ``S``
    that runs on a private loop (see the module docstring). Also a :class:`ToolCallLedger`
    (:class:`ForwardedLedger`), so the front doors find it as the graph's checkpointer.

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

    #: How long :meth:`close` may take in all, in seconds: the outcome rows a live sync
    #: step holds committed (at most half of it), the saver's last writes, what it opened
    #: closed once the call in progress on its connection is done. Past it ``close()``
    #: raises :class:`~langgraph_idem_saver.errors.CloseTimeoutError` (see
    #: :mod:`~langgraph_idem_saver.sync_closing`). Set it on the class or the instance.
    CLOSE_SECONDS: float = 30.0

    def close(self) -> None:
        """Close the connection (or pool) the saver opened and stop its loop thread.

        Idempotent. A connection you passed in is yours: it is not closed. From its first
        instant every method raises
        :class:`~langgraph_idem_saver.errors.ConnectionClosedError`. It first commits the
        outcome rows a live sync step holds, then closes what the saver opened, all within
        :attr:`CLOSE_SECONDS`; past that bound (a write held back by another connection's
        lock) it raises :class:`~langgraph_idem_saver.errors.CloseTimeoutError` and logs
        what it still waits on, while the close goes on in the background - never
        started twice; a call whose outcome was not committed stays ``issued``, an unknown
        outcome, never re-run. A ``close()`` from another thread meanwhile waits for this
        one, up to the same deadline, and ends as it does.
        """
        self._runtime.close(self.CLOSE_SECONDS, self._last_writes)

    async def _last_writes(self) -> None:
        """On the loop, in :meth:`close` after a live sync step's outcomes and before
        what the saver opened is closed: a subclass's last writes (none here)."""

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (on this saver or a ``with_allowlist`` copy)."""
        return self._runtime.closed

    def __enter__(self: Saver) -> Saver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        """:meth:`close`; with the block's own exception in flight, a close past its
        bound is said in the log only (``sync_closing``), so that exception is the one
        raised, never masked by the ``CloseTimeoutError``."""
        if exc_info[1] is None:
            self.close()
            return
        try:
            self.close()
        except CloseTimeoutError:  # logged once by the close: the block's error propagates
            return

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

    # --- where the forwarded methods go (forwarding.Bridged) -----------------------------

    def _bridge_target(self) -> S:
        return self.saver

    def _run_blocking(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._call(coro)

    async def _run_hopping(self, coro: Coroutine[Any, Any, T]) -> T:
        return await self._hop(coro)

    def _bridge_closed(self) -> bool:
        return self.closed

    # --- sync checkpoint API -------------------------------------------------------------

    get_tuple = blocking(IdemSaverBase.aget_tuple)
    put = blocking(IdemSaverBase.aput)
    put_writes = blocking(IdemSaverBase.aput_writes)
    delete_thread = blocking(IdemSaverBase.adelete_thread)
    delete_for_runs = blocking(IdemSaverBase.adelete_for_runs)
    copy_thread = blocking(IdemSaverBase.acopy_thread)
    prune = blocking(IdemSaverBase.aprune)
    get_delta_channel_history = blocking(IdemSaverBase.aget_delta_channel_history)

    import_langgraph = blocking(IdemSaverBase.aimport_langgraph)

    # --- async checkpoint API (from any loop) --------------------------------------------

    aget_tuple = hopping(IdemSaverBase.aget_tuple)
    aput = hopping(IdemSaverBase.aput)
    aput_writes = hopping(IdemSaverBase.aput_writes)
    adelete_thread = hopping(IdemSaverBase.adelete_thread)
    adelete_for_runs = hopping(IdemSaverBase.adelete_for_runs)
    acopy_thread = hopping(IdemSaverBase.acopy_thread)
    aprune = hopping(IdemSaverBase.aprune)
    aget_delta_channel_history = hopping(IdemSaverBase.aget_delta_channel_history)

    alist = relaying(IdemSaverBase.alist)
    list = paging(IdemSaverBase.alist)
