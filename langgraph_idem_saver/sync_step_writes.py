"""A sync step's outcomes, handed from the tools' threads to the ledger's loop.

In a sync ``graph.invoke`` each tool call runs in a thread of ``ToolNode``'s executor,
and the ledger lives on its own event loop in another thread. Waiting there for its own
outcome's commit, each call is a hop to that loop and a wakeup back, and the step's
calls reach the group commit one by one. Here, as in an async step
(``LedgerEngine.outcomes_at_end``), each call's thread serializes its result (a result
the serializer refuses fails that call only), hands the row to the step's
:class:`SyncStepWrites` and returns. ``IdempotentToolNode._func`` then awaits every
outcome of the step with one hop (``LedgerEngine.aoutcomes`` on the ledger's loop), so
the node still returns only once every outcome is committed (``docs/guarantees.md``).

**One write a step.** The rows wait, in the tools' threads' hands, until the step's last
ledgered call has handed its own (:attr:`SyncStepWrites.expected`) or
:attr:`SyncStepWrites.WINDOW` (50 ms) has passed since the first row waiting, whichever
comes first, and then go as one write (one statement and one synced commit on
PostgreSQL). A step's sync calls finish one by one (each is ~1 ms of LangChain's
Python under the GIL: ten no-op calls end over 10-25 ms), so sending each burst at once
made 2-3 writes a step, each a synced commit taken in turn on the user's connection.
The cost: an outcome's commit starts up to 50 ms after its call returned while a
sibling still runs (before: at once, or after the write in flight); a crash in that
time leaves the call ``issued``, an unknown outcome (asked, never re-run), as a crash
just before its commit always did. The step's end (:meth:`SyncStepWrites.close`, then
``aoutcomes``) sends whatever still waits at once.

Wakeups of the ledger's loop: one to start a step's window (:meth:`SyncStepWrites.arm`,
which sends at once if the step's rows all came before it ran), one to send when the
last row comes after it; the rows between wake nothing.

Once the step's end began collecting stops: a call that finishes later (the step left by
an exception while siblings still run) records its own outcome, as before.

**A saver closed mid-step.** Each step's writes are registered (weakly) under its loop;
closing a sync saver first runs :func:`send_waiting` on its loop (``sync_closing``), which
stops every live step of that loop taking rows, sends what waits and awaits those writes,
before the connection closes - so a returned call's outcome is committed as if the
window were not there, and a row handed after that gets the closed saver's typed error
(its call records it itself).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import logging
import threading
import time
import weakref
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from langgraph_idem_saver.engine.loops import on_loop, run_private
from langgraph_idem_saver.engine.step_writes import StepWrites, forget
from langgraph_idem_saver.engine.types import Batch, Kind, Plan
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.held_outcomes import OutcomeParams
from langgraph_idem_saver.ledger import CallStatus

_COMPLETED, _FAILED = CallStatus.COMPLETED.value, CallStatus.FAILED.value

T = TypeVar("T")

LOG = logging.getLogger(__name__)

# how often ``wait_on`` checks that the ledger's loop still runs
_ALIVE_POLL_SECONDS = 1.0
# how long ``wait_on`` waits for a loop that stopped, not closed, to run again: a loop
# stopped for good (its thread gone) and never closed would otherwise never answer
_STOPPED_GRACE_SECONDS = 30.0


class SyncStepWrites(StepWrites):
    """:class:`StepWrites` fed from other threads (see the module)."""

    __slots__ = (
        "__weakref__",
        "arming",
        "closed",
        "expected",
        "handed",
        "lock",
        "timer",
        "waiting",
    )

    # how long the first row waiting may wait for the step's other ledgered calls
    WINDOW = 0.05

    def __init__(
        self, batch: Batch, loop: asyncio.AbstractEventLoop, name: str, expected: int
    ) -> None:
        super().__init__(batch, loop, name)
        self.lock = threading.Lock()
        self.closed = False  # the step's end began: no more rows taken
        self.handed = 0  # rows handed to the loop (read by the node's thread)
        self.expected = expected  # rows the step's calls hand when each returns
        # rows handed, not sent yet; while it is not empty, an ``arm`` is scheduled
        # (``arming``), the window's timer runs, or a ``send`` is scheduled
        self.waiting: list[tuple[Plan, OutcomeParams]] = []
        self.arming = False
        self.timer: asyncio.TimerHandle | None = None  # set and cancelled on the loop

    def hand(self, plan: Plan, result: Any) -> bool:
        """In a call's thread: serialize ``result`` (raising the ``SerializationError``
        of that call when the serializer refuses it) and hand its row to the loop.
        False when the step's end already began, or the ledger's loop closed: the caller
        records it itself (through the loop: a closed one is ``on_loop``'s typed error).

        The step's last row sends the rows at once (unless an ``arm`` still to run will);
        the first of others starts the window (``arm``); the rest wait with it. Each
        wakeup is scheduled under the lock, so before any :meth:`close` returns."""
        row = self.row_of(plan, result)
        with self.lock:
            if self.closed or self.loop.is_closed():
                return False
            wake: Callable[[], None] | None = None
            arming = False
            if self.arming:
                pass  # ``arm`` runs soon and sees these rows
            elif self.handed + 1 >= self.expected:  # the step's last row
                wake = self.send
            elif not self.waiting and self.timer is None:
                wake, arming = self.arm, True
            if wake is not None:
                try:
                    self.loop.call_soon_threadsafe(wake)
                except RuntimeError:  # the loop closed since is_closed(): not taken
                    return False
                self.arming = arming
            self.waiting.append((plan, row))
            self.handed += 1
        return True

    def arm(self) -> None:
        """On the loop: send at once if the step's rows are all in; else start the
        window, at whose end what waits is sent."""
        with self.lock:
            self.arming = False
            if not self.waiting:
                return
            if self.handed < self.expected and not self.closed:
                self.timer = self.loop.call_later(self.WINDOW, self.send)
                return
        self.send()

    def send(self) -> None:
        """On the loop: the rows waiting (and any taken since the last send) as one
        write; the window's timer, if it runs, is stopped."""
        with self.lock:
            rows, self.waiting = self.waiting, []
            if self.timer is not None:
                self.timer.cancel()
                self.timer = None
        if rows:
            if self.rows is None:
                self.rows = []
            for plan, row in rows:
                self.plans.append(plan)
                self.rows.append(row)
        super().send()

    def close(self) -> int:
        """In the node's thread, at the step's end: stop taking rows; how many were
        handed (what still waits is sent by ``aoutcomes``, whose first act is a send)."""
        with self.lock:
            self.closed = True
            return self.handed

    def under_way(self) -> list[asyncio.Future[Any]]:
        """On the loop: a future for each write sent whose answer nobody awaits yet (a
        coroutine, started as a task and put back in its place, so the step's end still
        awaits it; or a future not done). One the step's end awaits already is under way:
        closing the saver waits for its write as for any (the group commit's on SQLite,
        the statement's on PostgreSQL; ``tests/test_sync_step_close.py``)."""
        futures: list[asyncio.Future[Any]] = []
        for at, (plans, answer) in enumerate(self.sent):
            if inspect.iscoroutine(answer):
                if inspect.getcoroutinestate(answer) != inspect.CORO_CREATED:
                    continue
                task = asyncio.ensure_future(answer)
                forget(task)  # its error is the step's end's to report
                self.sent[at] = (plans, task)
                futures.append(task)
            elif isinstance(answer, asyncio.Future) and not answer.done():
                futures.append(answer)
        return futures


# the live steps of each loop (weakly: a step ended is gone), and the loops closing
_LIVE: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, weakref.WeakSet[SyncStepWrites]]
_LIVE = weakref.WeakKeyDictionary()
_CLOSING: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


async def send_waiting(loop: asyncio.AbstractEventLoop, timeout: float) -> None:
    """On ``loop``, as its sync saver closes, before the connection does: every live step
    of the loop takes no more rows (a later one is recorded by its call, through the
    closed saver: a typed error), sends what waits, and its writes are awaited (at most
    ``timeout`` seconds, a warning logged if some are still under way; never raising -
    the step's end reports a write's error). A statement on the user's own PostgreSQL
    connection runs on the loop's thread, so the bound cannot cut it short: it is waited
    for as its caller would (``close()`` itself still ends within ``CLOSE_SECONDS``, with
    ``CloseTimeoutError``: ``sync_closing``). Not cancelled either: psycopg cancels what
    the connection runs when the server gets the request - by then possibly the next
    statement, the user's own - and a cancelled outcome write is retried into the same
    lock."""
    with _LIVE_LOCK:
        _CLOSING.add(loop)
        steps = list(_LIVE.pop(loop, ()))
    futures: list[asyncio.Future[Any]] = []
    for step in steps:
        with step.lock:
            step.closed = True
        try:
            step.send()
        except Exception:  # a refused write is its answer (StepWrites.send); be safe
            LOG.warning("sending a sync step's outcomes at close failed", exc_info=True)
        futures.extend(step.under_way())
    if futures:
        _, pending = await asyncio.wait(futures, timeout=timeout)
        if pending:  # the close goes on: said, since the step's end may never see why
            LOG.warning(
                "closing a sync saver: %d outcome write(s) of a live sync step not done "
                "after %.1f s; the connection closes under them (calls not recorded stay "
                "issued)",
                len(pending),
                timeout,
            )


def sync_writes(batch: Batch, name: str) -> SyncStepWrites | None:
    """The step's writes when its outcomes can go to the ledger's loop from the calls'
    threads: a ledger on a running loop, and a call of the step to run; else None (each
    call awaits its own outcome, on a private loop). ``expected``: the calls that will
    hand a row - each ledgered call that runs its tool and publishes to no follower
    (``IdempotentToolNode._run_one``); one that raises hands none, and the window ends
    the wait for it."""
    loop = batch.ledger_loop
    if batch.ledger is None or loop is None or loop.is_closed() or not loop.is_running():
        return None
    if not batch.all_plans:
        return None
    expected = sum(p.kind is Kind.RUN and p.outcome is None for p in batch.all_plans)
    writes = SyncStepWrites(batch, loop, name, expected)
    with _LIVE_LOCK:
        if loop in _CLOSING:  # its saver is closing: each call records its own (typed error)
            return None
        steps = _LIVE.get(loop)
        if steps is None:
            steps = _LIVE[loop] = weakref.WeakSet()
        steps.add(writes)
    return writes


def wait_on(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> T:
    """``coro`` run on ``loop`` (the ledger's), this thread blocked until it is done: the
    step's end, pure ledger work (no hook, no ``interrupt()``), so no private loop in
    this thread - ~100 against ~300 µs a hop through ``run_private``. The task runs in a
    copy of this thread's context (``call_soon_threadsafe`` copies it), as through
    ``on_loop``. A loop not running at the hand-off raises ``on_loop``'s ``ConfigError``.
    After it, a loop that stops is waited for as long as it is not closed: a program may
    stop its own loop and run it again (``run_forever`` twice), and the task then goes on
    where it was - its outcomes are committed, so a step whose wait gave up in that gap
    would report a failure that never happened. A loop closed with the task queued or
    left mid-way (checked every second: it never answers) raises ``ConfigError`` (a sync
    saver's loop is closed as its thread ends). A loop stopped for good but never closed
    is waited for up to ``_STOPPED_GRACE_SECONDS`` (30 s) in a row, then raises the same
    ``ConfigError``: the wait never hangs for good."""
    if loop.is_closed() or not loop.is_running():
        return run_private(on_loop(loop, coro))
    try:
        future = asyncio.run_coroutine_threadsafe(coro, loop)
    except RuntimeError:  # closed since the check above
        coro.close()
        raise _stopped() from None
    stopped_since: float | None = None  # when the loop was first seen stopped, in a row
    while True:
        try:
            return future.result(_ALIVE_POLL_SECONDS)
        except concurrent.futures.TimeoutError:
            if future.done():  # done as the wait timed out, or its own TimeoutError
                return future.result()
            if loop.is_running():
                stopped_since = None
                continue
            if not loop.is_closed():  # stopped for now: it may run again, for a while
                now = time.monotonic()
                stopped_since = now if stopped_since is None else stopped_since
                if now - stopped_since < _STOPPED_GRACE_SECONDS:
                    continue
            if future.cancel() or not future.done():  # queued, or left mid-way
                raise _stopped() from None
            return future.result()  # it ended as the loop stopped: its answer
        except concurrent.futures.CancelledError:  # only the loop's shutdown cancels it
            raise _stopped() from None


def _stopped() -> ConfigError:
    return ConfigError(
        "the ledger's event loop was closed (or stayed stopped) before the step's outcomes "
        "were committed (its saver was closed during the step): the calls not recorded "
        "stay issued"
    )
