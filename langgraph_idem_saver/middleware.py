"""``IdempotencyMiddleware``: the tool-call ledger for LangChain 1.x ``create_agent``.

``create_agent(model, tools=[...], middleware=[...])`` builds its own tool node and
dispatches each tool call as its own ``Send`` task, passing it through every middleware's
``wrap_tool_call``/``awrap_tool_call``. This middleware is one such hook over the same
ledger engine as ``IdempotentToolNode``: it claims the call before the tool runs, records
the outcome after, replays recorded calls, and sends unknown outcomes to ``verify`` ->
``on_unknown`` -> ``interrupt()``. Same options, same guarantees (docs/guarantees.md).

Where it goes in the list (the first middleware is the outermost):

* after ``ToolRetryMiddleware`` (so inside it): each retry then passes through the
  ledger as the next attempt of the same call - the failed attempt is an unknown outcome
  that ``verify`` (or ``NotAppliedError``) settles - instead of re-running the tool
  unseen within one claim. The other order is refused at the first call
  (``MiddlewareOrderError``, ``middleware_order.py``);
* after ``HumanInTheLoopMiddleware(interrupt_mode="per_call")`` (its approval
  ``interrupt()`` and ours must not share answer positions; the other order is refused);
  the default ``batched`` mode may sit on either side: a reviewer's edit is read from the
  state, so the ledger records, verifies and asks about the arguments that run
  (``middleware_calls.py``), with the edit in the entry's history;
* after middlewares that rewrite a call's arguments, so the ledger records what runs.

Needs the ``[agents]`` extra (``pip install 'langgraph-idem-saver[agents]'``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from typing_extensions import Unpack

from langgraph_idem_saver.call_context import in_call
from langgraph_idem_saver.engine import (
    Batch,
    IdempotencyCounters,
    Kind,
    LedgerEngine,
    LedgerOptions,
    Plan,
)
from langgraph_idem_saver.engine.finish import finish_blocking
from langgraph_idem_saver.engine.loops import run_private
from langgraph_idem_saver.engine.options import LedgerKwargs
from langgraph_idem_saver.engine.prepare import prepare_blocking
from langgraph_idem_saver.engine.results import calls_in_messages
from langgraph_idem_saver.middleware_calls import Executed, anote_edit, executed_call
from langgraph_idem_saver.middleware_order import check_order

try:
    from langchain.agents.middleware import AgentMiddleware
    from langchain.agents.middleware.types import ModelRequest, ModelResponse, ToolCallRequest
except ImportError as exc:  # pragma: no cover - exercised in a subprocess test
    raise ImportError(
        "IdempotencyMiddleware needs LangChain 1.x (langchain.agents): install the extra "
        "with `pip install 'langgraph-idem-saver[agents]'`"
    ) from exc

from langgraph.config import get_config

from langgraph_idem_saver.model_record import ModelRecorder
from langgraph_idem_saver.model_request import RESPONSE_CODEC, request_parts

__all__ = ["IdempotencyMiddleware"]

Handler = Callable[[ToolCallRequest], Any]
AsyncHandler = Callable[[ToolCallRequest], Awaitable[Any]]
ModelHandler = Callable[[ModelRequest[Any]], ModelResponse[Any]]
AsyncModelHandler = Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]]


class IdempotencyMiddleware(AgentMiddleware):
    """Run each side-effecting tool call of a ``create_agent`` agent at most once.

    Options (the same as ``IdempotentToolNode``'s, see there): ``ledger`` (default: the
    graph's checkpointer, when it is one of our savers), ``key_policy``, ``namespace``,
    ``read_only`` (names; a tool may also declare ``metadata={"read_only": True}``),
    ``verify``, ``on_unknown``, ``not_applied_errors``, ``lease_seconds``,
    ``wait_seconds``, ``poll_seconds``. Per-tool mappings are checked against the agent's
    tools when a call arrives, as the middleware is built before the agent.

    ``record_model`` (default True): each model step's answer is also recorded before
    LangGraph gets it and replayed when a crash re-runs the step (``model_record.py``,
    docs/guarantees.md); False: a re-run model step asks the model again.
    """

    def __init__(
        self,
        *,
        messages_key: str = "messages",
        record_model: bool = True,
        **ledger_options: Unpack[LedgerKwargs],
    ) -> None:
        super().__init__()
        options = LedgerOptions.build(tools=None, **ledger_options)
        # each model step's answer recorded and replayed after a crash (model_record.py);
        # record_model=False: a re-run model step asks the model again
        self.model_recorder = ModelRecorder(ledger=options.ledger) if record_model else None
        self.engine = LedgerEngine(options, name="IdempotencyMiddleware", messages_key=messages_key)
        self.counters: IdempotencyCounters = self.engine.counters
        self._checked_tools: frozenset[str] | None = None

    @property
    def name(self) -> str:
        return "IdempotencyMiddleware"

    async def awrap_model_call(
        self, request: ModelRequest[Any], handler: AsyncModelHandler
    ) -> ModelResponse[Any]:
        """The step's model answer from its record, else the model's, recorded before it
        is returned (``record_model=False``: the model's, unrecorded)."""
        if self.model_recorder is None:
            return await handler(request)
        return await self.model_recorder.acall(
            get_config(), request_parts(request), lambda: handler(request), RESPONSE_CODEC
        )

    def wrap_model_call(
        self, request: ModelRequest[Any], handler: ModelHandler
    ) -> ModelResponse[Any]:
        """:meth:`awrap_model_call` for a sync ``invoke``."""
        if self.model_recorder is None:
            return handler(request)
        return self.model_recorder.call(
            get_config(), request_parts(request), lambda: handler(request), RESPONSE_CODEC
        )

    def _plan(self, request: ToolCallRequest, handler: Any) -> tuple[Batch, Plan, Executed]:
        check_order(handler)  # refuse an order that defeats the ledger, before any tool runs
        self._check_tools(request)
        batch = Batch(sync=False)
        state = request.state
        messages = (
            state.get(self.engine.messages_key)
            if isinstance(state, dict)
            else getattr(state, self.engine.messages_key, None)
        )
        # the call that runs (a reviewer's edit swapped in), keyed as the model's call
        executed = executed_call(
            request.tool_call,
            request.tool,
            state,
            messages,
            getattr(request.runtime, "tools", None),
        )
        plan = self.engine.add_call(
            batch, executed.call, tool=executed.tool, known=executed.tool is not None
        )
        self.engine.note_state(batch, calls_in_messages(messages))
        return batch, plan, executed

    def _check_tools(self, request: ToolCallRequest) -> None:
        """Per-tool options must name the agent's tools (checked once, at the first call)."""
        tools = getattr(request.runtime, "tools", None)
        if self._checked_tools is not None or not tools:
            return
        names = frozenset(str(t.name) for t in tools)
        self.engine.options.check_tool_names(set(names))
        self._checked_tools = names

    async def awrap_tool_call(self, request: ToolCallRequest, handler: AsyncHandler) -> Any:
        batch, plan, executed = self._plan(request, handler)
        if plan.kind is Kind.SKIP:
            return await handler(request)
        config = request.runtime.config
        try:
            await self.engine.aprepare(batch, config)
            await anote_edit(batch, plan, executed)
            if plan.kind is not Kind.RUN:
                return await self.engine.aanswer(batch, plan)
            async with self.engine.running(batch, plan):
                result = await handler(request)
            return await self.engine.afinish(batch, plan, result)
        finally:
            await self.engine.arelease_unstarted(batch)

    def wrap_tool_call(self, request: ToolCallRequest, handler: Handler) -> Any:
        batch, plan, executed = self._plan(request, handler)
        if plan.kind is Kind.SKIP:
            return handler(request)
        batch.sync = True
        config = request.runtime.config
        try:
            # the claim from this thread to the ledger's loop (engine/prepare.py); what it
            # found (an entry: hooks, interrupt()) goes on on the private loop
            prepare_blocking(self.engine, batch, config)
            if executed.model_args is not None:  # an edited call: noted on its entry
                run_private(anote_edit(batch, plan, executed))
            if plan.kind is not Kind.RUN:
                return run_private(self.engine.aanswer(batch, plan))
            plan.started = True
            try:
                with in_call(batch, plan):  # current_call(), its span (call_context.py)
                    result = handler(request)  # in this thread, outside any loop, as without us
            except Exception as exc:
                run_private(self.engine.araised(batch, plan, exc))
                raise
            return finish_blocking(self.engine, batch, plan, result)  # committed
        finally:
            if plan.owned and not plan.started:
                run_private(self.engine.arelease_unstarted(batch))
