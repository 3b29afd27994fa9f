"""Where the engine's coroutines run: the ledger's own event loop, a private loop for a
sync front door, a worker thread for a blocking hook.

A sync ``graph.invoke`` runs tool nodes in threads with no event loop, while an async
saver's connection belongs to the loop it was opened on; these helpers bridge the two the
way LangGraph's own ``AsyncSqliteSaver`` sync methods do.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import threading
import weakref
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

from langgraph_idem_saver.errors import ConfigError

T = TypeVar("T")
P = ParamSpec("P")


def running_loop() -> asyncio.AbstractEventLoop | None:
    """The running loop, or None outside one (a sync front door's thread)."""
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


async def on_loop(loop: asyncio.AbstractEventLoop | None, coro: Coroutine[Any, Any, T]) -> T:
    """Await ``coro`` on ``loop`` (the loop its saver/ledger lives on), or here if None."""
    if loop is None or loop is asyncio.get_running_loop():
        return await coro
    if loop.is_closed() or not loop.is_running():
        coro.close()
        raise ConfigError(
            "the ledger's event loop is not running: a sync graph.invoke with an async "
            "ledger needs that loop running in another thread"
        )
    return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, loop))


async def awaiting(start: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
    """``start(*args, **kwargs)`` awaited, called where this coroutine runs: a ledger
    method that starts its work at once (``record_outcome``) must be called on the
    ledger's loop, so a caller on another loop hops this there (``on_loop``)."""
    return await start(*args, **kwargs)


async def call_maybe_async(fn: Callable[..., Any], arg: Any) -> Any:
    """Call a sync or async hook. Sync hooks run in a worker thread: they may block (I/O
    to the vendor) or call ``asyncio.run`` themselves, neither of which a loop allows."""
    if inspect.iscoroutinefunction(fn):
        return await fn(arg)
    result = await asyncio.to_thread(fn, arg)
    if inspect.isawaitable(result):
        result = await result
    return result


class _PrivateLoop:
    """A thread's private loop, kept between ``run_private`` calls (a new loop costs a
    selector and a socket pair: ~55 µs, once a step on a sync front door) and closed when
    its thread ends (this holder, the loop's only reference, is dropped with the
    thread's locals). Not closed in a forked child: its selector is shared with the
    parent's."""

    __slots__ = ("loop", "pid")

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.pid = os.getpid()
        _ALIVE.add(self.loop)

    def __del__(self) -> None:
        if self.pid == os.getpid() and not self.loop.is_closed():
            self.loop.close()


_PRIVATE = threading.local()

# A forked child must never close (nor let the garbage collector close) a loop it
# inherited: closing unregisters the loop's self-pipe from the epoll instance the child
# shares with its parent, and the parent's thread then waits in that loop forever for a
# wakeup that never comes. At fork every live private loop is held for good, in the
# child only: the threads that held them do not exist there.
_ALIVE: weakref.WeakSet[asyncio.AbstractEventLoop] = weakref.WeakSet()
_FORKING: list[asyncio.AbstractEventLoop] = []
_INHERITED: list[asyncio.AbstractEventLoop] = []


def _hold_at_fork() -> None:
    _FORKING.extend(_ALIVE)


def _after_fork_in_child() -> None:
    _INHERITED.extend(_FORKING)
    _FORKING.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(
        before=_hold_at_fork, after_in_parent=_FORKING.clear, after_in_child=_after_fork_in_child
    )


def _private_loop() -> asyncio.AbstractEventLoop:
    held: _PrivateLoop | None = getattr(_PRIVATE, "held", None)
    if held is None or held.pid != os.getpid() or held.loop.is_closed():
        held = _PRIVATE.held = _PrivateLoop()
    return held.loop


def _drop_private_loop() -> None:
    """Close this thread's private loop: the next ``run_private`` starts a fresh one."""
    held: _PrivateLoop | None = getattr(_PRIVATE, "held", None)
    _PRIVATE.held = None
    if held is not None and held.pid == os.getpid() and not held.loop.is_closed():
        held.loop.close()


def run_private(coro: Coroutine[Any, Any, T]) -> T:
    """Run the node's async bookkeeping on a private loop in the current (node) thread.

    The coroutine's task copies this thread's context, so ``interrupt()`` and
    ``get_config()`` work inside it. The loop is this thread's, reused by the next call
    only when this one left nothing on it (no task still pending, no ``BaseException``
    such as ``KeyboardInterrupt`` out of it); otherwise it is closed, as a loop a call
    always was before: what a coroutine left behind never runs later.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise ConfigError(
            "an idempotent tool call was run synchronously from a thread running an event "
            "loop; use `await graph.ainvoke(...)` there (or run graph.invoke in a worker "
            "thread, e.g. asyncio.to_thread)"
        )
    loop = _private_loop()
    clean = False
    try:
        result = loop.run_until_complete(coro)
        clean = True
        return result
    except Exception:
        clean = True  # the coroutine's own error: the loop is as after a return
        raise
    finally:
        if not clean or asyncio.all_tasks(loop):
            _drop_private_loop()
