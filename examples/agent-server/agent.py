"""A billing agent for LangGraph's server: ``create_agent`` + ``IdempotencyMiddleware``.

Served by ``langgraph dev`` (see ``langgraph.json``): the server compiles the graph with
its checkpointer, ``checkpointer.py``'s saver, so the graph is built here *without*
``checkpointer=`` (the dev server refuses a graph that brings its own) and the middleware
finds the ledger in the server's checkpointer, no ``ledger=`` needed.

The model is a scripted stand-in (no API key): asked to "pay inv-1 inv-2", it calls
``charge`` once per invoice, in parallel, then answers. Swap in a real chat model
(``init_chat_model("openai:gpt-4.1")``...) for a real agent.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import payments
from langchain.agents import create_agent
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from langgraph_idem_saver import NOT_APPLIED, IdempotencyMiddleware

AMOUNT = 10


class PayModel(BaseChatModel):
    """Asks for one ``charge`` per invoice named in the last user message, then answers.

    Like a real model it mints new tool-call ids on every generation.
    """

    @property
    def _llm_type(self) -> str:
        return "scripted-payments"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> PayModel:  # type: ignore[override]
        return self

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        asked = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        answers = [m for m in messages[asked:] if isinstance(m, ToolMessage)]
        if answers:
            message = AIMessage(content="; ".join(str(m.content) for m in answers))
        else:
            words = str(messages[asked].content).split()
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "charge",
                        "args": {"invoice": invoice, "amount": AMOUNT},
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "tool_call",
                    }
                    for invoice in words[1:]
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


@tool
def charge(invoice: str, amount: int) -> str:
    """Charge an invoice."""
    return payments.charge(invoice, amount)


def charge_landed(args: dict[str, Any]) -> Any:
    """Asked after a crash left a charge's outcome unknown: did it happen?"""
    return payments.find(args["invoice"]) or NOT_APPLIED


agent = create_agent(
    PayModel(),
    tools=[charge],
    middleware=[IdempotencyMiddleware(verify={"charge": charge_landed})],
)
