"""A sync ``IdempotencyMiddleware.wrap_tool_call`` (``create_agent``, ``agent.invoke``)
claims from the caller's thread (``engine.prepare.prepare_blocking``) and commits its
outcome from there (``engine.finish.finish_blocking``), and does what the claim and the
outcome on the thread's private loop (``run_private(engine.aprepare)``,
``run_private(engine.afinish)``) did.

The test runs the same agent turns twice in one process on a real database - SQLite
file and PostgreSQL - as shipped and with the earlier path forced, and compares the
ledger rows (every column but the owner and the clock's, and the actions of each
entry's history), the tool messages, what the runs raised and what the hooks saw
(``verify``, ``current_call()``). A fresh call of the shipped run must run nothing on
the private loop; a call that found an entry (a replay, an unknown outcome for
``verify``) goes on there as before.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Annotated, Any

import pytest
from langchain.agents import create_agent
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import InjectedToolCallId, tool
from test_sync_task_claim_fast import (
    PrivateRuns,
    Unstorable,
    backend_where,
    general_finish,
    general_prepare,
    ledger_rows,
    private_runs,  # noqa: F401 - the fixture
    sync_saver,
)
from tool_node_helpers import scripted_model

from langgraph_idem_saver import NOT_APPLIED, current_call, middleware
from langgraph_idem_saver.middleware import IdempotencyMiddleware


def calls(msg_id: str, *calls: tuple[str, dict[str, Any]]) -> list[AIMessage]:
    """The model's turn: ``calls`` (ids ``<msg_id>-<n>``), then its answer."""
    tool_calls = [
        {"name": name, "args": args, "id": f"{msg_id}-{n}", "type": "tool_call"}
        for n, (name, args) in enumerate(calls)
    ]
    return [AIMessage("", id=msg_id, tool_calls=tool_calls), AIMessage("done", id=f"{msg_id}-d")]


def run_turns(
    backend: str, where: Any, name: str, runs: PrivateRuns
) -> tuple[list[tuple[Any, ...]], list[Any], list[tuple[str, int]]]:
    """Fresh calls, a call whose tool answers an error message, a replay (keys by
    arguments, shared across threads), an unknown outcome ``verify`` settles on resume,
    a result the serializer refuses. What the ledger holds, what the runs and hooks
    saw, and each tool call's private-loop runs in the middleware."""
    seen: list[Any] = []
    doors: list[tuple[str, int]] = []
    effects: list[str] = []
    keys: list[tuple[str, str]] = []  # the calls of a step run in parallel threads
    flaky_left = {"n": 1}

    class Counted(IdempotencyMiddleware):
        def wrap_tool_call(self, request: Any, handler: Any) -> Any:
            call = request.tool_call
            before = runs.count()
            try:
                return super().wrap_tool_call(request, handler)
            finally:
                doors.append(
                    (f"{call['name']}{sorted(call['args'].values())}", runs.count() - before)
                )

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        effects.append(invoice)
        keys.append((invoice, current_call().key))  # the tool sees its call
        return f"charged {invoice}"

    @tool
    def decline(invoice: str, tool_call_id: Annotated[str, InjectedToolCallId]) -> ToolMessage:
        """Decline an invoice (an error message: a failed call)."""
        effects.append(f"declined {invoice}")
        return ToolMessage(f"declined {invoice}", tool_call_id=tool_call_id, status="error")

    @tool
    def flaky(invoice: str) -> str:
        """Charge, the first time losing the reply."""
        effects.append(invoice)
        if flaky_left["n"]:
            flaky_left["n"] -= 1
            raise RuntimeError("reply lost")
        return f"charged {invoice}"

    @tool(response_format="content_and_artifact")
    def receipt(invoice: str) -> tuple[str, Any]:
        """A receipt whose artifact the serializer refuses."""
        effects.append(f"receipt {invoice}")
        return f"receipt {invoice}", Unstorable()

    def verified(args: dict[str, Any]) -> Any:
        seen.append(("verify", args["invoice"]))
        return f"verified {args['invoice']}" if args["invoice"] in effects else NOT_APPLIED

    model = scripted_model(
        *calls("a1", ("charge", {"invoice": "i1"}), ("charge", {"invoice": "i2"})),
        *calls("a2", ("decline", {"invoice": "i3"})),
        *calls("a3", ("charge", {"invoice": "i1"})),  # another thread: replayed
        *calls("a4", ("flaky", {"invoice": "r"})),
        *calls("a5", ("receipt", {"invoice": "u"})),
    )
    mw = Counted(
        key_policy="args", namespace="shop", verify={"flaky": verified}, record_model=False
    )
    with sync_saver(backend, where, name) as (saver, db):
        agent = create_agent(
            model, tools=[charge, decline, flaky, receipt], middleware=[mw], checkpointer=saver
        )

        def invoke(payload: Any, thread: str) -> Any:
            try:
                out = agent.invoke(payload, {"configurable": {"thread_id": thread}})
            except Exception as exc:  # what it raised, as seen
                return (type(exc).__name__, str(exc)[:60])
            return sorted(
                (str(m.content), m.status) for m in out["messages"] if isinstance(m, ToolMessage)
            )

        pay = {"messages": [("user", "pay")]}
        with ThreadPoolExecutor(1) as caller:  # one thread, as a program's main thread
            for payload, thread in [
                (pay, "m1"),  # two fresh calls
                (pay, "m2"),  # fresh, failed: an error message
                (pay, "m3"),  # found: replayed
                (pay, "m4"),  # raised: an unknown outcome
                (None, "m4"),  # resumed: found, verify settles it
                (pay, "m5"),  # refused by the serializer: abandoned, raised
            ]:
                seen.append(caller.submit(invoke, payload, thread).result())
    seen.append(sorted(effects))
    seen.append(sorted(keys))
    return ledger_rows(db), seen, sorted(doors)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_sync_middleware_fast_path_writes_what_the_private_loop_wrote(
    backend: str,
    request: pytest.FixtureRequest,
    private_runs: PrivateRuns,  # noqa: F811 - the fixture
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    where = backend_where(backend, request)
    shipped = run_turns(backend, where, "shipped", private_runs)
    monkeypatch.setattr(middleware, "prepare_blocking", general_prepare)
    monkeypatch.setattr(middleware, "finish_blocking", general_finish)
    forced = run_turns(backend, where, "general", private_runs)

    rows, seen, doors = shipped
    assert rows == forced[0]
    assert seen == forced[1]
    assert {(r[4], r[9]) for r in rows} == {
        ("charge", "completed"),
        ("decline", "failed"),
        ("flaky", "completed"),  # verify settled it
        ("receipt", "issued"),  # abandoned: an unknown outcome, kept
    }
    assert len(rows) == 5
    assert ("verify", "r") in seen
    assert seen[-3][0] == "SerializationError"
    # shipped: a fresh call ran nothing on the private loop, claim and outcome alike
    assert doors == [
        ("charge['i1']", 0),  # fresh
        ("charge['i1']", 2),  # found (another thread): replayed, on the private loop
        ("charge['i2']", 0),  # fresh
        ("decline['i3']", 0),  # fresh: its error message recorded failed
        ("flaky['r']", 1),  # raised: araised, on the private loop as before
        ("flaky['r']", 2),  # found on resume: verify settles it, answered there
        ("receipt['u']", 1),  # refused by the serializer: araised, then raised
    ]
    # forced: the earlier path, claim and outcome (or answer) on the private loop
    assert [n for _, n in forced[2]] == [2] * 7
