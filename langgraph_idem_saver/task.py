"""``idempotent_task``: LangGraph's Functional API ``@task`` whose side effect runs at most
once across crashes and resumes (exactly once with a ``verify`` hook).

LangGraph's docs on ``@task``: "Re-execution can occur if a task starts, but does not
complete successfully ... Use idempotency keys or verify existing results to avoid
duplication." This is that, over the same ledger engine as ``IdempotentToolNode``: the
call is claimed (committed) before the function runs and its return value recorded
(committed) before the task returns - even under durability ``"exit"``, where LangGraph
itself persists task results only when the run ends.

The key
-------
A task has no model-minted call id, and LangGraph's task ids cannot serve: they hash the
checkpoint id, and a crash before the first checkpoint makes the caller re-send the input
(a new checkpoint, new task ids). So the default key is the **task name plus its canonical
arguments, within the thread** (``key_policy="args"``): it is the same after a re-sent
input in every durability mode. The same task with the same arguments twice in one thread
is therefore one call, replayed the second time - give a repeated effect an argument that
tells the occurrences apart (a date, a sequence number, the vendor's idempotency key), or
pass ``key_policy=key_fn(call, ctx)``. Arguments must be JSON (they are the identity).

Outcomes
--------
* returned: recorded ``completed``; later calls with the same key get the recorded value;
* raised: an *unknown outcome* (the effect may have happened before the exception), unless
  the exception is ``NotAppliedError`` or listed in ``not_applied_errors``; the next
  attempt (a ``retry_policy`` retry, or the user's resume) asks ``verify`` ->
  ``on_unknown`` -> ``interrupt()``;
* a human or operator answer ``failed`` is replayed as :class:`RecordedFailureError`.

Nested tasks
------------
A task whose body awaits other ``idempotent_task`` s orchestrates them: from its first
such call its entry says so (``engine/nested.py``), and after a crash it is re-run rather
than settled - each inner task replays or settles its own outcome, so none is skipped by
an answer about the outer one. Its own code runs again: keep effects in inner tasks.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

from langgraph.config import get_config
from langgraph.func import task
from langgraph.types import CachePolicy, RetryPolicy

from langgraph_idem_saver.call_context import in_call
from langgraph_idem_saver.engine import (
    Batch,
    Kind,
    LedgerEngine,
    LedgerOptions,
    OnUnknown,
    Plan,
    UnknownToolOutcome,
    VerifyFn,
)
from langgraph_idem_saver.engine.finish import finish_blocking
from langgraph_idem_saver.engine.loops import run_private
from langgraph_idem_saver.engine.nested import RUNNING_TASK, RunningTask, amark_caller
from langgraph_idem_saver.engine.prepare import prepare_blocking
from langgraph_idem_saver.engine.types import OnEarlierCall
from langgraph_idem_saver.errors import ConfigError, IdemSaverError
from langgraph_idem_saver.keys import KeyFn
from langgraph_idem_saver.ledger import CallStatus, ToolCallLedger

__all__ = ["RecordedFailureError", "idempotent_task"]

F = TypeVar("F", bound=Callable[..., Any])


class RecordedFailureError(IdemSaverError):
    """The task call's recorded outcome is a failure (settled by a human or operator):
    replayed as this error, never re-run."""


def idempotent_task(
    __func_or_none__: F | None = None,
    *,
    name: str | None = None,
    retry_policy: RetryPolicy | list[RetryPolicy] | None = None,
    cache_policy: CachePolicy[Any] | None = None,
    verify: VerifyFn | None = None,
    key_policy: str | KeyFn = "args",
    on_unknown: OnUnknown = "interrupt",
    on_earlier_call: OnEarlierCall = "ask",
    not_applied_errors: tuple[type[BaseException], ...] = (),
    ledger: ToolCallLedger | None = None,
    namespace: str | None = None,
    lease_seconds: float = 300.0,
    wait_seconds: float = 30.0,
    poll_seconds: float = 0.1,
) -> Any:
    """A drop-in for ``langgraph.func.task`` (``@idempotent_task`` or
    ``@idempotent_task(name=..., retry_policy=..., cache_policy=...)``) plus the ledger's
    options: ``verify(args) -> value | NOT_APPLIED`` (``args`` is the call's arguments by
    parameter name), ``key_policy`` (``"args"`` or a ``key_fn``), ``on_unknown``,
    ``on_earlier_call`` (an entry of a deleted or swept conversation: see
    ``IdempotentToolNode``), ``not_applied_errors``, ``ledger`` (default: the
    entrypoint's checkpointer), ``namespace``, ``lease_seconds``, ``wait_seconds``,
    ``poll_seconds``."""

    def decorate(func: F) -> Any:
        task_name = name or func.__name__
        if key_policy == "tool_call":
            raise ConfigError(
                "idempotent_task has no model tool call id: use key_policy='args' (default) "
                "or a key_fn"
            )
        options = LedgerOptions.build(
            tools={task_name: None},
            ledger=ledger,
            key_policy=key_policy,  # type: ignore[arg-type]
            namespace=namespace,
            verify={task_name: verify} if verify is not None else None,
            on_unknown=on_unknown,
            on_earlier_call=on_earlier_call,
            not_applied_errors=not_applied_errors,
            lease_seconds=lease_seconds,
            wait_seconds=wait_seconds,
            poll_seconds=poll_seconds,
        )
        engine = LedgerEngine(options, name=task_name, raw_results=True)
        signature = inspect.signature(func)

        def plan(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Batch, Plan]:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            call = {"name": task_name, "args": dict(bound.arguments), "id": f"task:{task_name}"}
            batch = Batch(sync=False)
            return batch, engine.add_call(batch, call)  # type: ignore[arg-type]

        if inspect.iscoroutinefunction(func):

            @wraps(func)
            async def arun(*args: Any, **kwargs: Any) -> Any:
                batch, call = plan(args, kwargs)
                try:
                    await amark_caller(task_name)  # a task calling us orchestrates
                    await engine.aprepare(batch, get_config())
                    if call.kind is not Kind.RUN:
                        return _answered(call, await engine.aanswer(batch, call))
                    token = RUNNING_TASK.set(RunningTask(batch, call))
                    try:
                        async with engine.running(batch, call):
                            value = await func(*args, **kwargs)
                    finally:
                        RUNNING_TASK.reset(token)
                    await engine.afinish(batch, call, value)
                    return value
                finally:
                    await engine.arelease_unstarted(batch)

            runner: Callable[..., Any] = arun
        else:

            @wraps(func)
            def run(*args: Any, **kwargs: Any) -> Any:
                batch, call = plan(args, kwargs)
                batch.sync = True
                try:
                    outer = RUNNING_TASK.get()  # a task calling us orchestrates (marked once)
                    if outer is not None and not outer.marked:
                        run_private(amark_caller(task_name))
                    prepare_blocking(engine, batch, get_config())  # engine/prepare.py
                    if call.kind is not Kind.RUN:
                        return _answered(call, run_private(engine.aanswer(batch, call)))
                    call.started = True
                    token = RUNNING_TASK.set(RunningTask(batch, call))
                    try:
                        with in_call(batch, call):  # current_call(), its span
                            value = func(*args, **kwargs)
                    except Exception as exc:
                        run_private(engine.araised(batch, call, exc))
                        raise
                    finally:
                        RUNNING_TASK.reset(token)
                    finish_blocking(engine, batch, call, value)  # committed
                    return value
                finally:
                    if call.owned and not call.started:
                        run_private(engine.arelease_unstarted(batch))

            runner = run

        make_task = task(name=task_name, retry_policy=retry_policy, cache_policy=cache_policy)
        wrapped = make_task(runner)
        wrapped.counters = engine.counters  # type: ignore[attr-defined]
        return wrapped

    if __func_or_none__ is not None:
        return decorate(__func_or_none__)
    return decorate


def _answered(call: Plan, result: Any) -> Any:
    """A task call not run: its recorded value, or its recorded failure raised."""
    entry = call.entry
    if entry is not None and entry.status is CallStatus.ISSUED:  # on_unknown="fail"
        raise UnknownToolOutcome(
            f"task {call.call['name']!r} (key {entry.key!r}) has an unknown outcome, left "
            "for an operator (on_unknown='fail'); it was not run again"
        )
    if entry is not None and entry.status is CallStatus.FAILED:
        raise RecordedFailureError(
            f"task {call.call['name']!r} was recorded as failed: {entry.error or result}"
        )
    return result
