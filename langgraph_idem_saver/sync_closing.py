"""The one close of a sync saver's private loop (``sync_bridge._Runtime``): started once,
bounded, the same end for every thread that asks for it.

What a close does, in one coroutine on the saver's loop: the outcome rows a live sync
step holds in its window are sent and committed (``sync_step_writes.send_waiting``, at
most half the bound: past it a warning says how many writes are still under way), the
saver's last writes run (``PostgresSaver``: what it still holds, ``held_writes.py``),
what was opened on the loop is closed (its ``AsyncExitStack``: the direct path ended
once the call in progress is done, the connection or pool the saver opened), and the
loop stops.

Decisions:

* **One bound for all of it** (``SyncSaverBase.CLOSE_SECONDS``; ``SHUTDOWN_SECONDS`` at
  interpreter exit or on garbage collection). Past it ``close()`` raises
  :class:`~langgraph_idem_saver.errors.CloseTimeoutError` (a ``TimeoutError``, never the
  wait's raw one) and logs a warning naming what it still waits on - typically a write
  held back by another connection's lock, until that lock is let go or the busy /
  lock timeout passes. A tool call whose outcome was not committed stays ``issued``: an
  unknown outcome, surfaced by the ledger, never re-run. Before, each part had its own
  wait (10 s flush, 20 s close, then the finalizer's 20 s more): ~50 s, then a raw
  ``TimeoutError``.
* **Never a second close.** The close is not abandoned at the bound: it goes on in the
  loop's thread and ends (the loop stopping) when what blocks it does. The finalizer
  (garbage collection, interpreter exit) joins the close already started, if any, rather
  than starting one more ``aclose()`` of the same stack while the first still runs.
* **Closed from the first instant.** ``_Runtime.closed`` is set before the close starts,
  so every call after it raises ``ConnectionClosedError`` at once (the direct paths
  check it too), whether the close finished, is running, or outlasted its bound.
* **Every closer waits for the one close.** A second ``close()`` (another thread, a
  ``with_allowlist`` copy) waits for the first to finish, up to the same deadline, and
  ends as it does: it returns, or raises the same error (``CloseTimeoutError`` while the
  close still runs past its bound). A ``close()`` that comes after the close ended
  returns at once (idempotent); one called on the loop's own thread cannot wait for
  what runs on that thread, so it starts the close and returns.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack

from langgraph_idem_saver.errors import CloseTimeoutError
from langgraph_idem_saver.sync_step_writes import send_waiting

LOG = logging.getLogger(__name__)

# a saver's last writes before what it opened is closed (PostgresSaver: what it holds)
LastWrites = Callable[[], Awaitable[None]]


class Closing:
    """A runtime's one close. Held by the runtime's finalizer too, so it references
    the loop, its thread and its stack, never the runtime or a saver."""

    __slots__ = ("bound", "deadline", "end", "lock", "loop", "stack", "stage", "thread", "warned")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, thread: threading.Thread, stack: AsyncExitStack
    ) -> None:
        self.loop = loop
        self.thread = thread
        self.stack = stack
        self.lock = threading.Lock()
        self.end: concurrent.futures.Future[None] | None = None  # the close's, once started
        self.bound = 0.0
        self.deadline = 0.0  # time.monotonic() by which every closer stops waiting
        self.stage = "starting"  # what the close is doing (for the timeout's message)
        self.warned = False

    def begin(
        self, bound: float, last_writes: LastWrites | None = None
    ) -> tuple[concurrent.futures.Future[None], bool]:
        """The close's future, and whether this call started it (else ``bound`` and
        ``last_writes`` are the first closer's)."""
        with self.lock:
            if self.end is not None:
                return self.end, False
            self.bound = bound
            self.deadline = time.monotonic() + bound
            self.end = self._start(last_writes)
            return self.end, True

    def _start(self, last_writes: LastWrites | None) -> concurrent.futures.Future[None]:
        coro = self._close_on_loop(last_writes, self.bound / 2)
        if not self.loop.is_closed() and self.thread.is_alive():
            try:
                return asyncio.run_coroutine_threadsafe(coro, self.loop)
            except RuntimeError:  # the loop closed since the check
                pass
        coro.close()
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        done.set_result(None)  # nothing left open on a loop that is gone
        return done

    async def _close_on_loop(self, last_writes: LastWrites | None, flush_seconds: float) -> None:
        """On the loop: a live sync step's outcome rows, the saver's last writes, what was
        opened; then the loop stops (errors propagate to every closer)."""
        try:
            try:
                self.stage = "the outcome writes of a live sync step"
                await send_waiting(self.loop, flush_seconds)
                if last_writes is not None:
                    self.stage = "the saver's last writes (outcomes it still holds)"
                    await last_writes()
            finally:
                self.stage = (
                    "closing what the saver opened (after the checkpoint call in progress "
                    "on its connection)"
                )
                await self.stack.aclose()
                await _settle()
        finally:
            self.stage = "its loop stopping"
            self.loop.call_soon(self.loop.stop)

    def wait(self, end: concurrent.futures.Future[None]) -> None:
        """Until the close ended (its error raised) or its deadline passed
        (:class:`CloseTimeoutError`); then, until the loop's thread is done (what is left
        of the deadline: a thread still finishing up holds nothing of the saver's)."""
        if threading.current_thread() is self.thread:
            return  # on the loop: the close runs once the caller gives the loop back
        try:
            end.result(max(self.deadline - time.monotonic(), 0.0))
        except concurrent.futures.TimeoutError:
            if not end.done():
                raise self._timed_out() from None
            end.result()  # done as the wait timed out (or its own TimeoutError): its end
        self.thread.join(max(self.deadline - time.monotonic(), 0.0))

    def _timed_out(self) -> CloseTimeoutError:
        """The error for a close past its bound, said once in the log."""
        message = (
            f"closing the sync saver did not finish within {self.bound:.1f} s: it still "
            f"waits on {self.stage}. The saver is closed (every call raises "
            "ConnectionClosedError); its close goes on in the background and ends when that "
            "does. A tool call whose outcome write was not committed stays issued: an "
            "unknown outcome, surfaced by the ledger, never re-run"
        )
        with self.lock:
            warn, self.warned = not self.warned, True
        if warn:
            LOG.warning("%s", message)
        return CloseTimeoutError(message)


# loop iterations given, once the stack is closed, to the tasks already answered
_SETTLE_ROUNDS = 20


async def _settle() -> None:
    """Let the calls the close just answered (a call waiting for a pooled connection,
    refused by the closed direct path; its worker joined) reach their callers before
    the loop stops and cancels what is left: a few iterations, no waiting on a task
    that is not done (``ConnectionClosedError`` for them, not ``CancelledError``)."""
    me = asyncio.current_task()
    for _ in range(_SETTLE_ROUNDS):
        if all(task.done() or task is me for task in asyncio.all_tasks()):
            return
        await asyncio.sleep(0)


def shutdown(closing: Closing, bound: float) -> None:
    """The finalizer's close (garbage collection, interpreter exit): the one close,
    joined if started, else started with ``bound``; never raising."""
    end, _ = closing.begin(bound)
    try:
        closing.wait(end)
    except CloseTimeoutError:  # said once already (``_timed_out``)
        return
    except Exception:  # best effort: the process may be exiting
        LOG.warning("closing a sync saver's connection failed", exc_info=True)
