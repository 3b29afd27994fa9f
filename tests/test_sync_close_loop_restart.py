"""``sync_step_writes.wait_on`` (a sync step's end, waiting on the ledger's loop) when
that loop - a program's own - stops and runs again: the wait goes on while the loop is
not closed, and returns the step's answer once it runs again; a closed loop
(``tests/test_sync_step_close.py``), or one stopped past ``_STOPPED_GRACE_SECONDS`` in a
row, ends the wait with the typed ``ConfigError``.

Real parts: a real event loop in a thread that stops (``loop.stop()``) mid-task and runs
again (a second ``run_forever()``), as a program serving its own loop may.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from langgraph_idem_saver import sync_step_writes
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.sync_step_writes import wait_on


def waiting_node(loop: asyncio.AbstractEventLoop) -> tuple[threading.Thread, list[object]]:
    """A node thread waiting (``wait_on``) on a 0.2 s step's end run on ``loop``, returned
    once that step's end began; what the wait answered or raised goes to the list."""
    begun = threading.Event()

    async def step_end() -> int:
        begun.set()
        await asyncio.sleep(0.2)
        return 42

    outcome: list[object] = []

    def node() -> None:
        try:
            outcome.append(wait_on(loop, step_end()))
        except BaseException as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=node, daemon=True)
    waiter.start()
    assert begun.wait(30), "the step's end never began"
    return waiter, outcome


def test_wait_on_a_loop_stopped_and_run_again_returns_the_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The step's end is under way on the loop when the loop stops; it stays stopped
    for ten of ``wait_on``'s liveness checks (made 50 ms), then runs again: the waiting
    thread is still waiting in that gap (it raised ``ConfigError``: a failure of a step
    whose outcomes then got committed), and returns the answer once the task finishes."""
    monkeypatch.setattr(sync_step_writes, "_ALIVE_POLL_SECONDS", 0.05)
    loop = asyncio.new_event_loop()
    run_again = threading.Event()

    def serve() -> None:
        loop.run_forever()  # stopped mid-task by the test
        run_again.wait(30)
        loop.run_forever()  # the task goes on where it was
        loop.close()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    waiter, outcome = waiting_node(loop)
    try:
        loop.call_soon_threadsafe(loop.stop)
        deadline = time.monotonic() + 30
        while loop.is_running():
            assert time.monotonic() < deadline, "the loop never stopped"
            time.sleep(0.001)
        time.sleep(0.5)  # ten liveness checks while the loop is stopped
        assert not outcome and waiter.is_alive(), outcome  # still waiting, no error
        run_again.set()
        waiter.join(30)
        assert not waiter.is_alive(), "wait_on never returned once the loop ran again"
        assert outcome == [42], outcome
    finally:
        run_again.set()
        if not loop.is_closed():
            loop.call_soon_threadsafe(loop.stop)
        server.join(30)
    assert loop.is_closed()


def test_wait_on_a_loop_stopped_for_good_and_never_closed_raises_config_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A program's loop thread stops its loop for good (``loop.stop()``, the thread
    ends) and never closes it, mid-task: the waiting thread does not wait forever - past
    ``_STOPPED_GRACE_SECONDS`` (0.5 s here) stopped in a row it raises the typed
    ``ConfigError``; the control above (stopped as long, run again before the grace
    ends) gets its answer."""
    monkeypatch.setattr(sync_step_writes, "_ALIVE_POLL_SECONDS", 0.05)
    monkeypatch.setattr(sync_step_writes, "_STOPPED_GRACE_SECONDS", 0.5)
    loop = asyncio.new_event_loop()
    server = threading.Thread(target=loop.run_forever, daemon=True)
    server.start()
    waiter, outcome = waiting_node(loop)
    try:
        loop.call_soon_threadsafe(loop.stop)
        server.join(30)
        assert not server.is_alive() and not loop.is_closed()
        waiter.join(30)
        assert not waiter.is_alive(), "wait_on waited for good on a loop stopped for good"
        assert len(outcome) == 1 and isinstance(outcome[0], ConfigError), outcome
    finally:
        if not loop.is_closed():
            loop.close()
