"""Shared test helpers: run configs (``cfg``), a scripted chat model, small graphs, and a
way to plant ledger entries exactly as a crashed process would have left them.

Imported as ``tool_node_helpers`` (not ``tests.tool_node_helpers``) everywhere: the
worker scripts run in child processes import it that way too."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode

from langgraph_idem_saver.keys import (
    KeyContext,
    KeyPolicy,
    agent_path_of,
    args_hash,
    canonical_args,
    compute_key,
    scope_of,
)
from langgraph_idem_saver.ledger import CallIntent, LedgerEntry, Outcome, ToolCallLedger


class ToolCallingFakeModel(GenericFakeChatModel):
    """A scripted chat model that accepts ``bind_tools`` (as create_react_agent needs)."""

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ToolCallingFakeModel:  # type: ignore[override]
        return self


def scripted_model(*messages: AIMessage) -> ToolCallingFakeModel:
    return ToolCallingFakeModel(messages=iter(list(messages)))


def ai_calls(*calls: tuple[str, dict[str, Any], str], msg_id: str | None = None) -> AIMessage:
    """An AIMessage carrying tool calls given as (name, args, id).

    Its id (``msg_id``, default ``"ai-<first call id>"``) is part of the default ledger
    key, so :func:`intent_for` can plant entries for these calls.
    """
    return AIMessage(
        "",
        id=msg_id or f"ai-{calls[0][2]}",
        tool_calls=[{"name": n, "args": a, "id": i, "type": "tool_call"} for n, a, i in calls],
    )


def tool_graph(node: ToolNode, checkpointer: Any, *, name: str = "tools") -> CompiledStateGraph:
    """START -> tool node -> END over MessagesState."""
    builder = StateGraph(MessagesState)
    builder.add_node(name, node)
    builder.add_edge(START, name)
    return builder.compile(checkpointer=checkpointer)


def cfg(
    thread_id: Any = "t", ns: str | None = None, checkpoint_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A run config for ``thread_id``; ``checkpoint_ns``/``checkpoint_id`` only when given
    (without a namespace, ``list`` spans them all; ``InMemorySaver.put`` needs ``ns=""``);
    ``extra`` keys go beside ``configurable`` (``metadata=...``)."""
    configurable: dict[str, Any] = {"thread_id": thread_id}
    if ns is not None:
        configurable["checkpoint_ns"] = ns
    if checkpoint_id is not None:
        configurable["checkpoint_id"] = checkpoint_id
    return {"configurable": configurable, **extra}


def tool_messages(out: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in out["messages"] if isinstance(m, ToolMessage)]


def intent_for(
    thread_id: str,
    call: dict[str, Any],
    *,
    policy: KeyPolicy = "tool_call",
    checkpoint_ns: str = "tools:some-task-id",
    namespace: str | None = None,
    message_id: str | None = None,
) -> CallIntent:
    """The intent IdempotentToolNode computes for ``call`` (to plant entries), carried by
    the AIMessage ``message_id`` (default: :func:`ai_calls`'s id for a first call)."""
    scope = scope_of(thread_id, namespace)
    agent_path = agent_path_of(checkpoint_ns)
    canon = canonical_args(call["args"])
    digest = args_hash(canon)
    origin = f"ai-{call['id']}" if message_id is None else message_id
    ctx = KeyContext(scope, thread_id, agent_path, call["name"], canon, digest, origin)
    return CallIntent(
        scope=scope,
        key=compute_key(policy, call, ctx),
        thread_id=thread_id,
        agent_path=agent_path,
        tool_name=call["name"],
        args_hash=digest,
        args=canon.encode(),
        tool_call_id=call["id"],
    )


async def plant_unknown(ledger: ToolCallLedger, intent: CallIntent) -> LedgerEntry:
    """An ``issued`` entry of a dead process whose lease has lapsed: an unknown outcome."""
    [outcome] = await ledger.aclaim([intent], owner="deadhost:1:dead", lease_seconds=0.001)
    assert outcome.claimed
    time.sleep(0.01)
    return outcome.entry


async def plant_in_progress(ledger: ToolCallLedger, intent: CallIntent) -> LedgerEntry:
    """An ``issued`` entry of a live process (long lease): a call in progress elsewhere."""
    [outcome] = await ledger.aclaim([intent], owner="otherhost:2:live", lease_seconds=600)
    assert outcome.claimed
    return outcome.entry


async def plant_completed(ledger: Any, intent: CallIntent, result: Any) -> LedgerEntry:
    """A completed entry, as a process that ran the tool and then lost its checkpoint."""
    [outcome] = await ledger.aclaim([intent], owner="deadhost:1:dead", lease_seconds=60)
    assert outcome.claimed
    result_type, data = ledger.serde.dumps_typed(result)
    outcome = Outcome.completed(result_type, data)
    await ledger.record_outcome(intent.scope, intent.key, owner="deadhost:1:dead", outcome=outcome)
    entry: LedgerEntry = await ledger.aget_entry(intent.scope, intent.key)
    return entry


class Counter:
    """Counts side effects; a tool body calls ``bump``."""

    def __init__(self) -> None:
        self.calls: list[Any] = []

    def bump(self, value: Any) -> None:
        self.calls.append(value)

    def __len__(self) -> int:
        return len(self.calls)


def by_id(messages: Sequence[ToolMessage]) -> dict[str, ToolMessage]:
    return {m.tool_call_id: m for m in messages}


Fields = Callable[[ToolMessage], tuple[Any, ...]]


def fields(m: ToolMessage) -> tuple[Any, ...]:
    """What a replayed ToolMessage must preserve."""
    return (m.content, m.artifact, m.status, m.name, m.tool_call_id)


async def rerun_tool_step(graph: Any, thread: str) -> dict[str, Any]:
    """Run the tool step of ``thread`` again from the checkpoint before it (what a resume
    after a crash between the tool and LangGraph's commit does): the ledger must replay."""
    target = None
    async for state in graph.aget_state_history(cfg(thread)):
        if state.next == ("tools",):
            target = state.config
    assert target is not None
    return dict(await graph.ainvoke(None, target, durability="sync"))
