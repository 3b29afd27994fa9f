"""``IdempotencyMiddleware`` with each LangChain 1.x built-in middleware that touches model
calls or messages, in both orders, in process, on both backends.

HumanInTheLoop and ToolRetry, where the order matters, have their own files (in process:
``test_middleware_hitl.py``; SIGKILL at each point of a call: ``test_middleware_kills.py``).
The middlewares here do not wrap tool calls (they act before or after the model, or
around its call), so the ledger sees the same calls in either order; each pair runs one
conversation that exercises the other middleware and the ledger together:

* turn 1 asks for two charges; the second raises after its effect (an unknown outcome),
  the run fails, and running the thread again settles it through ``verify``;
* turn 2 asks for a third charge, and turn 3 charges inv-1 again (a new call the user
  asked for: it runs, it is not answered by turn 1's entry).

Each effect lands once per call asked for, with the arguments that ran, in both orders.
No process is killed here (these pairs are in-process composition tests).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain.agents.middleware import (
    ClearToolUsesEdit,
    ContextEditingMiddleware,
    LLMToolSelectorMiddleware,
    ModelFallbackMiddleware,
    ModelRetryMiddleware,
    PIIMiddleware,
    SummarizationMiddleware,
    TodoListMiddleware,
    ToolCallLimitMiddleware,
)
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from tool_node_helpers import Counter, ToolCallingFakeModel, cfg

from langgraph_idem_saver import NOT_APPLIED, CallStatus
from langgraph_idem_saver.keys import canonical_args
from langgraph_idem_saver.middleware import IdempotencyMiddleware

TURNS = {
    "pay inv-1 and inv-2": [("inv-1", 10), ("inv-2", 20)],
    "pay inv-3": [("inv-3", 30)],
    "pay inv-1 again": [("inv-1", 10)],
}


class Agent(ToolCallingFakeModel):
    """Asks for the charges of the newest user message (fixed ids per turn), then says
    done. ``fail_first``: the first call of each turn raises (a flaky provider);
    ``broken``: every call raises (a provider that is down); ``todos``/``note``: also
    write a todo list, or put an email in each charge's ``note``."""

    fail_first: bool = False
    broken: bool = False
    todos: bool = False
    note: str = ""
    failed: list[str] = []  # noqa: RUF012 - one list per instance (pydantic copies it)

    def _generate(
        self, messages: list[Any], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        if self.broken:
            raise ConnectionError("provider down")
        humans = [m for m in messages if isinstance(m, HumanMessage)]
        text = str(humans[-1].content) if humans else ""
        turn = list(TURNS).index(text) if text in TURNS else -1
        if self.fail_first and text not in self.failed:
            self.failed.append(text)
            raise ConnectionError("flaky provider")
        last = messages[-1]
        if isinstance(last, ToolMessage) or turn < 0:
            message = AIMessage(f"done {turn}", id=f"ai-done-{turn}")
        else:
            calls: list[dict[str, Any]] = [
                {
                    "name": "charge",
                    "args": {"invoice": inv, "amount": amount, "note": self.note},
                    "id": f"call_{turn}_{i}",
                    "type": "tool_call",
                }
                for i, (inv, amount) in enumerate(TURNS[text])
            ]
            if self.todos:
                todo = [{"content": f"turn {turn}", "status": "in_progress"}]
                calls.append(
                    {
                        "name": "write_todos",
                        "args": {"todos": todo},
                        "id": f"todo_{turn}",
                        "type": "tool_call",
                    }
                )
            message = AIMessage("", id=f"ai-{turn}", tool_calls=calls)  # type: ignore[arg-type]
        return ChatResult(generations=[ChatGeneration(message=message)])


class Summarizer(ToolCallingFakeModel):
    def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage("summary so far"))])


class Selector(ToolCallingFakeModel):
    """Selects the charge tool (the structured output LLMToolSelector asks for)."""

    def _generate(self, messages: list[Any], *args: Any, **kwargs: Any) -> ChatResult:
        call = {"name": "ToolSelectionResponse", "args": {"tools": ["charge"]}, "id": "sel"}
        message = AIMessage("", tool_calls=[{**call, "type": "tool_call"}])  # type: ignore[list-item]
        return ChatResult(generations=[ChatGeneration(message=message)])


def model(**flags: Any) -> Agent:
    return Agent(messages=iter([]), **flags)


# name -> (the other middleware, the agent's model, the charges that run per turn)
Setup = tuple[Any, Agent]
PAIRS: dict[str, Callable[[], Setup]] = {
    "ModelRetryMiddleware": lambda: (
        ModelRetryMiddleware(max_retries=2, initial_delay=0.0, jitter=False),
        model(fail_first=True),
    ),
    "ModelFallbackMiddleware": lambda: (ModelFallbackMiddleware(model()), model(broken=True)),
    "SummarizationMiddleware": lambda: (
        SummarizationMiddleware(
            model=Summarizer(messages=iter([])), trigger=("messages", 6), keep=("messages", 2)
        ),
        model(),
    ),
    "ContextEditingMiddleware": lambda: (
        ContextEditingMiddleware(edits=[ClearToolUsesEdit(trigger=1, keep=0)]),
        model(),
    ),
    "ToolCallLimitMiddleware": lambda: (
        ToolCallLimitMiddleware(tool_name="charge", thread_limit=3),
        model(),
    ),
    "LLMToolSelectorMiddleware": lambda: (
        LLMToolSelectorMiddleware(model=Selector(messages=iter([])), max_tools=1),
        model(),
    ),
    "PIIMiddleware": lambda: (
        PIIMiddleware("email", strategy="redact", apply_to_tool_results=True),
        model(note="mail bob@example.com"),
    ),
    "TodoListMiddleware": lambda: (TodoListMiddleware(), model(todos=True)),
}


async def converse(saver: Any, name: str, order: str) -> tuple[Counter, Any, dict[str, Any]]:
    effects = Counter()
    raised: list[str] = []
    ran_with: list[dict[str, Any]] = []

    @tool
    def charge(invoice: str, amount: int, note: str = "") -> str:
        """Charge an invoice."""
        effects.bump((invoice, amount))
        ran_with.append({"invoice": invoice, "amount": amount, "note": note})
        if invoice == "inv-2" and not raised:
            raised.append(invoice)
            raise ConnectionResetError("the reply was lost after the charge")
        return f"charged {invoice} {amount}" + (f" ({note})" if note else "")

    @tool
    def lookup(invoice: str) -> str:
        """Look an invoice up (read-only)."""
        return f"{invoice}: open"

    def verify(args: dict[str, Any]) -> Any:
        done = (args["invoice"], args["amount"]) in effects.calls
        return f"charged {args['invoice']} {args['amount']} (verified)" if done else NOT_APPLIED

    other, agent_model = PAIRS[name]()
    ours = IdempotencyMiddleware(verify={"charge": verify}, read_only=["lookup"])
    agent = create_agent(
        agent_model,
        tools=[charge, lookup],
        middleware=[ours, other] if order == "ledger_first" else [other, ours],
        checkpointer=saver,
    )
    for text in TURNS:
        try:
            await agent.ainvoke({"messages": [("user", text)]}, cfg("t"))
        except ConnectionResetError:
            await agent.ainvoke(None, cfg("t"))  # run the thread again: verify settles it
    state = await agent.aget_state(cfg("t"))
    return effects, ran_with, state.values


@pytest.mark.parametrize("order", ["ledger_first", "other_first"])
@pytest.mark.parametrize("name", list(PAIRS))
async def test_each_effect_once_with_the_arguments_that_ran(
    saver: Any, name: str, order: str
) -> None:
    effects, ran_with, values = await converse(saver, name, order)
    charged = [("inv-1", 10), ("inv-2", 20), ("inv-3", 30), ("inv-1", 10)]
    if name == "ToolCallLimitMiddleware":
        charged = charged[:3]  # the thread limit blocks turn 3's call before any hook
    # turn 1's two calls run in parallel (sync tools on the executor): either may land first
    assert sorted(effects.calls[:2]) == charged[:2]
    assert effects.calls[2:] == charged[2:]
    entries = [e for e in await saver.alist_entries("t") if e.tool_name == "charge"]
    assert len(entries) == len(charged)
    assert all(e.status is CallStatus.COMPLETED for e in entries)
    # the ledger recorded each call with the arguments the tool was invoked with
    assert sorted(e.args for e in entries) == sorted(canonical_args(a).encode() for a in ran_with)
    if name == "PIIMiddleware":  # results redacted in the state; the ledger keeps what ran
        shown = [str(m.content) for m in values["messages"] if isinstance(m, ToolMessage)]
        assert shown and all("bob@example.com" not in t for t in shown)
        assert all(r["note"] == "mail bob@example.com" for r in ran_with)
        ran = [e for e in entries if b'"inv-2"' not in e.args]  # (inv-2's came from verify)
        assert all(b"bob@example.com" in (e.result or b"") for e in ran)  # the tool's own
    if name == "SummarizationMiddleware":  # it did fold the older turns
        assert any("summary so far" in str(m.content) for m in values["messages"])
    if name == "TodoListMiddleware":
        assert values["todos"] == [{"content": "turn 2", "status": "in_progress"}]
    texts = [str(m.content) for m in values["messages"] if isinstance(m, ToolMessage)]
    if name != "SummarizationMiddleware":  # (it folds turn 1 into a summary)
        assert any(t.startswith("charged inv-2 20") and "verified" in t for t in texts)


def test_the_readme_table_names_every_pair_and_the_order_it_needs() -> None:
    """README's middleware table: every pair tested here and in the HITL / ToolRetry files,
    and the two orders that are refused are the ones it says must come before ours."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = readme.split("Where it goes among LangChain", 1)[1].split("The tests:", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`(\w+Middleware)", row)}
    assert named == {*PAIRS, "HumanInTheLoopMiddleware", "ToolRetryMiddleware"}
    before = [row for row in rows if "| **before** ours |" in row]
    assert len(before) == 2
    assert any('interrupt_mode="per_call"' in row for row in before)
    assert any(row.startswith("| `ToolRetryMiddleware`") for row in before)
    for row in rows:
        if row not in before:
            assert "| either |" in row, row


def test_the_guarantees_composition_section_names_tests_that_exist() -> None:
    """Each test ``docs/guarantees.md`` names for a composition is defined where it says."""
    import ast

    root = Path(__file__).resolve().parents[1]
    text = (root / "docs" / "guarantees.md").read_text()
    section = text.split("## Composition with other middlewares", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"`(tests/[\w/]+\.py)::(\w+)`", section)
    assert len(named) >= 9
    for path, name in named:
        tree = ast.parse((root / path).read_text())
        defined = {
            n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        assert name in defined, f"{path}::{name}"
