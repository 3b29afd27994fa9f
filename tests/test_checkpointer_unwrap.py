"""The front doors find the ledger inside a checkpointer wrapper (``checkpointer_unwrap``).

LangGraph's server wraps the checkpointer it hands graphs (its shape is pinned by
``tests/test_upstream_contracts.py``; the server itself runs in ``test_agent_server.py``).
Here: a wrapper of one's own that says what it wraps with ``__wrapped__``, a wrapper of a
saver that is not a ledger (still ``NoLedgerError``, whatever it forwards), and all three
front doors with no ``ledger=`` behind a wrapper, on both backends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.func import entrypoint
from resume_worker import InvoiceModel, build_graph
from tool_node_helpers import cfg

from langgraph_idem_saver import (
    IdempotencyMiddleware,
    IdempotentToolNode,
    NoLedgerError,
    idempotent_task,
)
from langgraph_idem_saver.checkpointer_unwrap import describe, ledger_in


class Wrapper(BaseCheckpointSaver[Any]):
    """A checkpointer wrapper of the server's kind: checkpoint methods passed on, every
    other attribute forwarded; it names what it wraps with ``__wrapped__``."""

    def __init__(self, inner: BaseCheckpointSaver[Any], *, say_wrapped: bool = True) -> None:
        super().__init__(serde=inner.serde)
        self._held = inner
        if say_wrapped:
            self.__wrapped__ = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._held, name)

    async def aget_tuple(self, config: Any) -> Any:
        return await self._held.aget_tuple(config)

    async def alist(self, config: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for item in self._held.alist(config, **kwargs):
            yield item

    async def aput(self, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
        return await self._held.aput(config, checkpoint, metadata, versions)

    async def aput_writes(
        self, config: Any, writes: Any, task_id: str, task_path: str = ""
    ) -> None:
        await self._held.aput_writes(config, writes, task_id, task_path)

    def get_next_version(self, current: Any, channel: Any) -> Any:
        return self._held.get_next_version(current, channel)


def charge_tool(charged: list[str]) -> Any:
    @tool
    async def charge(invoice: str, amount: int) -> str:
        """Charge an invoice."""
        charged.append(invoice)
        return f"charged {invoice} ${amount}"

    return charge


def pay(*invoices: str) -> dict[str, Any]:
    return {"messages": [HumanMessage(content="pay invoices " + " ".join(invoices))]}


@pytest.mark.parametrize("door", ["middleware", "tool_node", "task"])
async def test_every_front_door_finds_the_ledger_through_a_wrapper(saver: Any, door: str) -> None:
    charged: list[str] = []
    wrapped = Wrapper(Wrapper(saver))  # a wrapper of a wrapper too
    assert ledger_in(wrapped) is saver
    if door == "task":

        @idempotent_task
        async def charge(invoice: str) -> str:
            charged.append(invoice)
            return f"charged {invoice}"

        @entrypoint(checkpointer=wrapped)
        async def flow(invoices: list[str]) -> list[str]:
            return [await charge(i) for i in invoices]

        await flow.ainvoke(["a", "b"], cfg("T"))
    elif door == "middleware":
        agent = create_agent(
            InvoiceModel(),
            tools=[charge_tool(charged)],
            middleware=[IdempotencyMiddleware()],
            checkpointer=wrapped,
        )
        await agent.ainvoke(pay("a", "b"), cfg("T"))
    else:
        graph = build_graph(InvoiceModel(), IdempotentToolNode([charge_tool(charged)]), wrapped)
        await graph.ainvoke(pay("a", "b"), cfg("T"))
    assert charged == ["a", "b"]
    entries = await saver.alist_entries("T")
    assert len(entries) == 2, "the calls were ledgered in the wrapped saver"


async def test_a_wrapper_of_a_saver_that_is_no_ledger_is_still_refused() -> None:
    """``InMemorySaver`` behind a wrapper: the wrapper forwards every attribute, but it is
    not a ledger, and neither is what it wraps - nothing runs unprotected."""
    charged: list[str] = []
    wrapped = Wrapper(InMemorySaver())
    assert ledger_in(wrapped) is None
    assert describe(wrapped) == "Wrapper wrapping InMemorySaver"
    agent = create_agent(
        InvoiceModel(),
        tools=[charge_tool(charged)],
        middleware=[IdempotencyMiddleware()],
        checkpointer=wrapped,
    )
    with pytest.raises(NoLedgerError, match="found Wrapper wrapping InMemorySaver"):
        await agent.ainvoke(pay("a"), cfg("T"))
    assert charged == []


async def test_a_wrapper_that_does_not_say_what_it_wraps_is_not_looked_into(saver: Any) -> None:
    """Only a wrapper's own ``__wrapped__`` (or the server's ``_inner``) is followed, never
    an attribute reached through its forwarding ``__getattr__``: a wrapper that does not
    say what it wraps is refused, with what was found."""
    wrapped = Wrapper(saver, say_wrapped=False)
    assert ledger_in(wrapped) is None
    assert describe(wrapped) == "Wrapper"
    assert describe(None) == "no checkpointer"
