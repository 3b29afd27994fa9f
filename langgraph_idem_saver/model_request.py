"""A ``create_agent`` model call as the recorder sees it: what its input is (the parts
hashed into its key) and how its answer (a ``ModelResponse``) is stored and read back.

Kept apart from ``middleware.py`` so that the middleware only wires the hooks, and from
``model_record.py`` so that the recorder needs no LangChain agents import.
"""

from __future__ import annotations

from typing import Any

from langchain.agents.middleware.types import ModelRequest, ModelResponse
from langchain_core.messages import AIMessage

from langgraph_idem_saver.model_record import Codec, model_identity, record_of

__all__ = ["RESPONSE_CODEC", "request_parts"]


def request_parts(request: ModelRequest[Any]) -> dict[str, Any]:
    """What the model is asked: the system message and messages, the tools, tool choice,
    response format and settings, and which model. Middleware that rewrites the request
    before it reaches the recorder changes these, so place the recorder after it."""
    system = [request.system_message] if request.system_message is not None else []
    return {
        "messages": [*system, *request.messages],
        "tools": request.tools,
        "tool_choice": request.tool_choice,
        "response_format": request.response_format,
        "settings": request.model_settings,
        "model": model_identity(request.model),
    }


def _encode(response: ModelResponse[Any]) -> dict[str, Any]:
    return record_of(response.result, response.structured_response)


def _decode(stored: dict[str, Any]) -> ModelResponse[Any]:
    result = stored["result"]
    if not isinstance(result, list):
        raise TypeError(f"recorded messages are a {type(result).__name__}, not a list")
    return ModelResponse(result=result, structured_response=stored.get("structured_response"))


def _message(response: ModelResponse[Any]) -> AIMessage | None:
    return next((m for m in response.result if isinstance(m, AIMessage)), None)


RESPONSE_CODEC: Codec[ModelResponse[Any]] = Codec(_encode, _decode, _message)
"""How a ``ModelResponse`` (its messages and structured response) is recorded."""
