"""``durable_model(model)``: a chat model whose answer in a graph step is recorded in the
ledger before the node gets it, and replayed when the step runs again after a crash.

For graphs that call a chat model in their own node (``create_agent`` gets the same
through ``IdempotencyMiddleware``'s model hooks)::

    llm = durable_model(ChatOpenAI(model="...")).bind_tools(tools)

    async def agent(state):
        return {"messages": [await llm.ainvoke(state["messages"])]}

The wrapper is a ``BaseChatModel``, so it goes wherever a chat model goes: ``bind_tools``
binds the wrapped model's own tool format, ``invoke``/``ainvoke``/``stream`` behave as
the wrapped model's (a replayed answer streams as one chunk, through the same chat-model
callbacks: ``stream_mode="messages"`` and ``astream_events`` see it, with an
``idem_saver_replay`` custom event). Outside a graph step (no thread, no step) it is the
wrapped model, unrecorded. What counts as the same call: ``model_record``'s docstring.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel, LanguageModelInput
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding, RunnableConfig
from langchain_core.tools import BaseTool
from pydantic import ConfigDict, PrivateAttr

from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.ledger import ToolCallLedger
from langgraph_idem_saver.model_record import Codec, ModelRecorder, model_identity, record_of

__all__ = ["DurableChatModel", "durable_model"]


def _encode(message: BaseMessage) -> dict[str, Any]:
    return record_of([message])


def _decode(stored: dict[str, Any]) -> BaseMessage:
    result = stored["result"]
    if not isinstance(result, list) or len(result) != 1 or not isinstance(result[0], BaseMessage):
        raise TypeError("a recorded chat model answer is one message")
    message: BaseMessage = result[0]
    return message


MESSAGE_CODEC: Codec[BaseMessage] = Codec(_encode, _decode, lambda m: m)


def _node_config() -> RunnableConfig:
    """The config of the graph step this call runs in ({} outside one: unrecorded)."""
    from langgraph.config import get_config

    try:
        return get_config()
    except RuntimeError:
        return {}


class DurableChatModel(BaseChatModel):
    """A chat model whose answers in graph steps are recorded and replayed (see module).

    Built by :func:`durable_model`. ``model`` is the wrapped chat model; ``ledger`` the
    ledger to record in (default: the graph's checkpointer when it is one of ours).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    model: BaseChatModel
    ledger: ToolCallLedger | None = None
    _recorder: ModelRecorder = PrivateAttr()

    def model_post_init(self, context: Any, /) -> None:
        super().model_post_init(context)
        self._recorder = ModelRecorder(ledger=self.ledger)

    @property
    def recorder(self) -> ModelRecorder:
        """The recorder (its ``counts``: recorded, replayed, unrecorded)."""
        return self._recorder

    @property
    def _llm_type(self) -> str:
        return f"durable-{self.model._llm_type}"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"durable": True, **dict(self.model._identifying_params)}

    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: str | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """The wrapped model's ``bind_tools`` (its own tool format), bound to the wrapper."""
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        bound = self.model.bind_tools(tools, **kwargs)
        if not isinstance(bound, RunnableBinding) or bound.bound is not self.model:
            raise ConfigError(
                f"{type(self.model).__name__}.bind_tools did not return the model bound to "
                "arguments, so durable_model cannot bind the same tools; wrap the bound "
                "model's result in your node instead"
            )
        return self.bind(**bound.kwargs)

    def _parts(
        self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """What the model is asked: messages, stop words, bound tools and settings, which
        model."""
        return {
            "messages": messages,
            "stop": stop,
            "settings": kwargs,
            "model": model_identity(self.model),
        }

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        def ask() -> BaseMessage:
            # no config: the wrapped model's run joins the node's, as it would unwrapped
            return self.model.invoke(messages, stop=stop, **kwargs)

        config = _node_config()
        message = self._recorder.call(
            config, self._parts(messages, stop, kwargs), ask, MESSAGE_CODEC
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async def ask() -> BaseMessage:
            return await self.model.ainvoke(messages, stop=stop, **kwargs)

        config = _node_config()
        message = await self._recorder.acall(
            config, self._parts(messages, stop, kwargs), ask, MESSAGE_CODEC
        )
        return ChatResult(generations=[ChatGeneration(message=message)])


def durable_model(
    model: BaseChatModel, *, ledger: ToolCallLedger | None = None
) -> DurableChatModel:
    """Wrap ``model`` so that its answer in each graph step is recorded before the node
    gets it and replayed, not asked again, when the step re-runs with the same input.

    ``ledger``: where to record (default: the graph's checkpointer, when it is one of
    this package's savers; with another checkpointer nothing is recorded).
    """
    if not isinstance(model, BaseChatModel):
        raise ConfigError(
            f"durable_model wraps a chat model (BaseChatModel), got {type(model).__name__}"
        )
    if ledger is not None and not isinstance(ledger, ToolCallLedger):
        raise ConfigError(f"ledger must be a ToolCallLedger, got {type(ledger).__name__}")
    return DurableChatModel(model=model, ledger=ledger)
