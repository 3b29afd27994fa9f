"""``IdempotentToolNode``: LangGraph's ``ToolNode`` plus a durable tool-call ledger.

Every side-effecting tool call is *claimed* in the ledger (an ``issued`` row, committed)
before the tool runs and *finished* (``completed``/``failed`` with the serialized result)
before the node returns. When LangGraph re-runs the node - after a crash, a resume, a
retry, or a second process picking the thread up - calls already recorded are replayed
from the ledger instead of running again, and calls whose outcome is unknown (the process
died between claim and finish) are never silently re-run: a ``verify`` hook, a policy, or
a human (``interrupt``) decides.

How it hooks into ``ToolNode``
------------------------------
``ToolNode``'s ``wrap_tool_call`` hooks see one call at a time, and any exception they
raise is turned into an error ``ToolMessage`` when ``handle_tool_errors`` allows it. The
ledger needs the whole batch (all parallel calls of one node run are claimed in ONE
transaction) and its own errors (conflicts, calls in progress elsewhere) must reach the
caller, not the model. So the node overrides the two levels of ``ToolNode``:

* ``_afunc``/``_func`` (one node run): parse the calls, compute keys, adopt orphans,
  claim everything in one ``aclaim``, settle existing entries (replay, conflict, wait,
  unknown outcome) *sequentially in call order* - which keeps ``interrupt()`` indices
  stable - and then hand over to ``ToolNode`` unchanged;
* ``_arun_one``/``_run_one`` (one call): replay, or run the unchanged ``ToolNode`` path -
  the user's ``wrap_tool_call``/``awrap_tool_call``, injection, ``handle_tool_errors``,
  ``Command`` validation - and record its outcome: in an async step the write starts as
  the call finishes, and ``_afunc`` awaits every outcome of the step before it returns
  (``LedgerEngine.outcomes_at_end``); in a sync step each call's thread hands its row to
  the ledger's loop and ``_func`` awaits them all with one hop (``sync_step_writes``).

So the user's wrappers run *inside* ours, and on replay they do not run at all.

Finding the ledger
------------------
``ledger=`` if given, else the graph's checkpointer (LangGraph puts it in
``config["configurable"]["__pregel_checkpointer"]``, also for subgraphs) when it
implements :class:`~langgraph_idem_saver.ledger.ToolCallLedger` - our savers do. If
neither, the node raises :class:`NoLedgerError` when it runs: it never runs a
side-effecting tool unprotected.

The ledger protocol itself (keys, adoption, claims, unknown outcomes, replay) lives in
:mod:`langgraph_idem_saver.engine`, shared with ``IdempotencyMiddleware`` and
``idempotent_task``; this module only adapts ``ToolNode`` to it.

Sync ``invoke``
---------------
The ledger is async-only. In sync mode the node runs its (async) bookkeeping on a
private event loop in the node's own thread, so that ``interrupt()``, ``get_config()``
and the tools see the node's context, and sends each ledger coroutine to the loop the
ledger lives on (``ledger.loop``, as LangGraph's ``AsyncSqliteSaver`` sync bridge does)
with ``asyncio.run_coroutine_threadsafe``. Ledgers without a ``loop`` attribute are
awaited on the private loop. Calling ``graph.invoke`` on the ledger's own loop thread
would deadlock, so it is refused (use ``ainvoke`` there).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar, Literal

from langchain_core.messages import AnyMessage, ToolCall
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool
from langgraph.prebuilt.tool_node import (
    AsyncToolCallWrapper,
    ToolCallWrapper,
    ToolNode,
    ToolRuntime,
    _default_handle_tool_errors,
)
from langgraph.runtime import Runtime
from pydantic import BaseModel
from typing_extensions import Unpack

from langgraph_idem_saver.call_context import RUNNING_CALL, in_call
from langgraph_idem_saver.engine import (
    NOT_APPLIED,
    Batch,
    IdempotencyConflict,
    IdempotencyCounters,
    Kind,
    LedgerEngine,
    LedgerOptions,
    NoLedgerError,
    NotAppliedError,
    OnUnknown,
    ToolCallInProgress,
    UnknownToolOutcome,
    VerifyFn,
    settle_future,
)
from langgraph_idem_saver.engine.loops import run_private
from langgraph_idem_saver.engine.options import LedgerKwargs
from langgraph_idem_saver.engine.outcomes import ended
from langgraph_idem_saver.engine.prepare import prepare_blocking
from langgraph_idem_saver.engine.results import calls_in_messages
from langgraph_idem_saver.engine.types import READ_ONLY_METADATA_KEY, Plan, UnknownOutcomeResume
from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.sync_step_writes import SyncStepWrites, sync_writes, wait_on

__all__ = [
    "NOT_APPLIED",
    "READ_ONLY_METADATA_KEY",
    "IdempotencyConflict",
    "IdempotencyCounters",
    "IdempotentToolNode",
    "NoLedgerError",
    "NotAppliedError",
    "OnUnknown",
    "ToolCallInProgress",
    "UnknownOutcomeResume",
    "UnknownToolOutcome",
    "VerifyFn",
]

# What ToolNode's entry points take: the node's input, and which form it came in.
NodeInput = list[AnyMessage] | dict[str, Any] | BaseModel
InputType = Literal["list", "dict", "tool_calls"]

# The batch of the node run in progress, for ``_arun_one``/``_run_one`` (ToolNode calls
# them per call, with no way to pass our plan along).
_BATCH: contextvars.ContextVar[tuple[IdempotentToolNode, Batch] | None] = contextvars.ContextVar(
    "langgraph_idem_saver_tool_batch", default=None
)


# A sync step's outcomes handed over by its calls' threads (``sync_step_writes``); None:
# each call records its own (a call that publishes to followers always does).
_WRITES: contextvars.ContextVar[SyncStepWrites | None] = contextvars.ContextVar(
    "langgraph_idem_saver_sync_writes", default=None
)


class Settling:
    """Publish what the block returns through ``settle(result)``, or the exception it
    raises, to the calls of the step that follow this one (same key).

    A class, not a ``contextmanager``: entered once per tool call and alive while the
    tool runs, a generator-based one is four objects a call for the garbage collector."""

    __slots__ = ("plan",)

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def __enter__(self) -> Callable[[Any], Any]:
        return self.settle

    def settle(self, result: Any) -> Any:
        settle_future(self.plan, result=result)
        return result

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is not None:
            settle_future(self.plan, exc=exc)  # and it propagates


class IdempotentToolNode(ToolNode):
    """A drop-in ``ToolNode`` whose side-effecting calls run at most once.

    Args (beyond ``ToolNode``'s, which keep their meaning):
        ledger: the :class:`ToolCallLedger` to use. Default: the graph's checkpointer,
            when it is one (e.g. ``langgraph_idem_saver.AsyncSqliteSaver``).
        key_policy: ``"tool_call"`` (default; one entry per model tool call id, with
            orphan adoption), ``"args"`` (same tool + same args in the scope = one call),
            or ``key_fn(tool_call, ctx) -> str``; or a mapping tool name -> one of those
            (unlisted tools use ``"tool_call"``).
        namespace: share the ledger scope across threads under ``"ns:<namespace>"``
            instead of the default per-thread scope.
        read_only: names of tools that skip the ledger (pure reads, safe to re-run).
            A tool may also declare itself with ``metadata={"idempotent_read_only": True}``.
        verify: tool name -> ``verify(args)`` (sync or async), consulted first for an
            unknown outcome: return the result if the effect landed (a ``ToolMessage``,
            ``Command``, or content) or :data:`NOT_APPLIED` if it did not (re-run).
        on_unknown: policy for unknown outcomes without a verify hook - ``"interrupt"``
            (default; ask a human via ``interrupt()``), ``"rerun"``, ``"fail"`` (an error
            ``ToolMessage``; the entry stays for an operator) or ``"raise"``
            (:class:`UnknownToolOutcome`); or a mapping tool name -> policy.
        on_earlier_call: a call an earlier entry might answer without proof - a lost
            call with other arguments (a reworded call after a lost message), or an entry
            kept by ``adelete_thread``/a sweep of a conversation that ended - once that
            entry is settled: ``"ask"`` (default; an ``earlier_call`` interrupt),
            ``"run"`` or ``"replay"`` (answer from it); or a mapping tool name -> choice.
        not_applied_errors: exception types that mean "the tool failed and nothing
            happened" (a tuple for every tool, or a mapping tool name -> tuple). Any
            other exception that escapes a tool leaves its call an unknown outcome (see
            :class:`NotAppliedError`, which always means "nothing happened").
        lease_seconds: how long a claim is exclusive. A tool that may run longer must
            raise it: past the lease, a resumer treats the call as an unknown outcome.
        wait_seconds: how long to wait for a call another owner is running before
            raising :class:`ToolCallInProgress`.
        poll_seconds: polling interval while waiting.
    """

    # False: every call of an async step runs inside ``LedgerEngine.running`` (what a
    # traced step's calls do); True: an untraced step's ``Running`` is inlined in
    # ``_arun_one``. The same claims and rows either way (tests/test_ledger_wide_step_fast.py)
    _inline_runs: ClassVar[bool] = True

    def __init__(
        self,
        tools: Sequence[BaseTool | Callable[..., Any]],
        *,
        name: str = "tools",
        tags: list[str] | None = None,
        handle_tool_errors: bool
        | str
        | Callable[..., str]
        | type[Exception]
        | tuple[type[Exception], ...] = _default_handle_tool_errors,
        messages_key: str = "messages",
        wrap_tool_call: ToolCallWrapper | None = None,
        awrap_tool_call: AsyncToolCallWrapper | None = None,
        **ledger_options: Unpack[LedgerKwargs],
    ) -> None:
        super().__init__(
            tools,
            name=name,
            tags=tags,
            handle_tool_errors=handle_tool_errors,
            messages_key=messages_key,
            wrap_tool_call=wrap_tool_call,
            awrap_tool_call=awrap_tool_call,
        )
        options = LedgerOptions.build(tools=self.tools_by_name, **ledger_options)
        self.engine = LedgerEngine(options, name=name, messages_key=messages_key)
        self.counters: IdempotencyCounters = self.engine.counters

    @property
    def owner(self) -> str:
        """The owner id of this node's claims (``host:pid:nonce``, renewed after fork)."""
        return self.engine.owner

    @property
    def read_only_tools(self) -> frozenset[str]:
        """Names of the tools that skip the ledger."""
        return self.engine.options.read_only

    # --- node entry points: plan the whole step, then let ToolNode run it ------------------

    async def _afunc(self, input: NodeInput, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        with self._step(input, config, sync=False) as batch:
            try:
                await self.engine.aprepare(batch, config)
                async with self.engine.outcomes_at_end(batch):
                    return await ToolNode._afunc(self, input, config, runtime)
            finally:
                await self.engine.arelease_unstarted(batch)

    def _func(self, input: NodeInput, config: RunnableConfig, runtime: Runtime[Any]) -> Any:
        with self._step(input, config, sync=True) as batch:
            try:
                prepare_blocking(self.engine, batch, config)  # the claim, committed
                writes = sync_writes(batch, self.engine.name)
                # set even when None: a graph run inside a tool never sees an outer step's
                token = _WRITES.set(writes)
                try:
                    result = ToolNode._func(self, input, config, runtime)
                except BaseException:
                    if writes is not None:
                        self._outcomes(writes, raising=False)  # the step's exception wins
                    raise
                finally:
                    _WRITES.reset(token)
                if writes is not None:
                    self._outcomes(writes, raising=True)
                return result
            finally:
                if any(p.owned and not p.started for p in batch.all_plans):
                    run_private(self.engine.arelease_unstarted(batch))

    def _outcomes(self, writes: SyncStepWrites, *, raising: bool) -> None:
        """The end of a sync step: every outcome its calls handed over is committed (one
        hop to the ledger's loop), or the first error raised when ``raising``."""
        if writes.close():
            wait_on(writes.loop, self.engine.aoutcomes(writes, raising=raising))

    async def _arun_one(self, call: ToolCall, input_type: InputType, runtime: ToolRuntime) -> Any:
        step = _BATCH.get()
        if step is None or step[0] is not self:
            return await ToolNode._arun_one(self, call, input_type, runtime)
        batch = step[1]
        current = batch.plans.pop(str(call["id"]), None)
        if batch.repeats:
            current = self._repeated(batch, call, current)
        if current is None or current.kind is Kind.SKIP:
            return await ToolNode._arun_one(self, call, input_type, runtime)
        engine = self.engine
        if current.kind is Kind.RUN and current.outcome is None:
            # the usual call: nothing of the step follows it (no result to publish)
            if batch.traced or batch.outcomes is None or not self._inline_runs:
                async with engine.running(batch, current):  # its span, its own outcome
                    result = await ToolNode._arun_one(self, call, input_type, runtime)
            else:  # ``Running`` inline (no span to open): no object, no coroutine a call
                current.started = True
                token = RUNNING_CALL.set((batch, current))
                try:
                    result = await ToolNode._arun_one(self, call, input_type, runtime)
                except BaseException as exc:
                    RUNNING_CALL.reset(token)
                    await ended(engine, batch, current, exc)
                    raise
                RUNNING_CALL.reset(token)
            writes = batch.outcomes  # None once the step's end began: its own outcome
            if writes is None:
                return await engine.afinish(batch, current, result)
            try:
                writes.finish(current, result)
            except SerializationError as exc:  # the tool ran: abandoned, as afinish does
                await engine.araised(batch, current, exc)
                raise
            return result
        with Settling(current) as settle:
            if current.kind is Kind.RUN:
                async with engine.running(batch, current):
                    result = await ToolNode._arun_one(self, call, input_type, runtime)
                result = await engine.afinish(batch, current, result)
            else:
                result = await engine.aanswer(batch, current)
            return settle(result)

    def _run_one(self, call: ToolCall, input_type: InputType, runtime: ToolRuntime) -> Any:
        taken = self._take(call)
        if taken is None:
            return ToolNode._run_one(self, call, input_type, runtime)
        batch, engine, current = taken
        with Settling(current) as settle:
            if current.kind is Kind.RUN:
                # The tool runs in this thread, outside any event loop, exactly as under
                # ToolNode (a sync tool may itself call asyncio.run()).
                current.started = True
                try:
                    with in_call(batch, current):  # current_call(), its span
                        result = ToolNode._run_one(self, call, input_type, runtime)
                except Exception as exc:
                    run_private(engine.araised(batch, current, exc))
                    raise
                writes = _WRITES.get() if current.outcome is None else None
                try:
                    handed = writes is not None and writes.hand(current, result)
                except SerializationError as exc:  # the tool ran: abandoned, as afinish does
                    run_private(engine.araised(batch, current, exc))
                    raise
                if not handed:
                    result = run_private(engine.afinish(batch, current, result))
            else:
                if current.leader is not None and current.leader.outcome is not None:
                    current.leader.outcome.result()  # block this thread, not a loop
                result = run_private(engine.aanswer(batch, current))
            return settle(result)

    @contextlib.contextmanager
    def _step(self, input: NodeInput, config: RunnableConfig, *, sync: bool) -> Iterator[Batch]:
        """The step's planned batch, visible to ``_arun_one``/``_run_one`` while it runs."""
        batch = self._plan(input, config, sync=sync)
        token = _BATCH.set((self, batch))
        try:
            yield batch
        finally:
            _BATCH.reset(token)

    # --- adapting ToolNode's input to the engine -------------------------------------------

    def _plan(
        self,
        input: NodeInput,
        config: RunnableConfig,
        *,
        sync: bool,
    ) -> Batch:
        """A batch with a plan for every call of the step, and what the state shows."""
        batch = Batch(sync=sync)
        tool_calls, _ = self._parse_input(input)
        self.engine.add_calls(batch, tool_calls, self.tools_by_name)
        self.engine.note_state(batch, self._calls_in_state(input, config))
        return batch

    def _take(self, call: ToolCall) -> tuple[Batch, LedgerEngine, Plan] | None:
        """The batch of this node's current run, its engine and the call's plan (taken off
        the queue), when ``call`` is ledgered; None when ToolNode runs it alone."""
        current = _BATCH.get()
        if current is None or current[0] is not self:
            return None
        node, batch = current
        plan = batch.take(str(call["id"]))
        if plan is None or plan.kind is Kind.SKIP:
            return None
        return batch, node.engine, plan

    @staticmethod
    def _repeated(batch: Batch, call: ToolCall, taken: Plan | None) -> Plan | None:
        """``_arun_one``'s ``Batch.take`` for a step that repeats a call id: the next
        plan of the id takes its place once ``taken`` is."""
        if taken is not None:
            call_id = str(call["id"])
            queue = batch.repeats.get(call_id)
            if queue:
                batch.plans[call_id] = queue.popleft()
        return taken

    def _calls_in_state(
        self, input: NodeInput, config: RunnableConfig
    ) -> list[tuple[str, str]] | None:
        """Every (tool call id, message id) of the AIMessages in the messages state,
        oldest first; None when no state is visible."""
        try:
            state = self._extract_state(input, config)
        except Exception:
            return None
        messages: Any
        if isinstance(state, list):
            messages = state
        elif isinstance(state, dict):
            messages = state.get(self._messages_key)
        else:
            messages = getattr(state, self._messages_key, None)
        return calls_in_messages(messages)
