"""The crash-and-resume demonstration: ``python -m langgraph_idem_saver demo``.

A scripted ReAct agent (no API key: the "LLM" is :class:`ScriptedModel`) pays three
invoices in one tools step, on embedded SQLite. A child process really dies in the middle
of that step, right after the second card charge went through. A fresh process resumes
the thread. We do it twice - with LangGraph's stock ``ToolNode`` and with
``IdempotentToolNode`` - and print how many times each card was charged, and the ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import uuid
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import RunnableConfig
from pydantic import Field

CRASH_EXIT_CODE = 77
INVOICES = ["inv-1", "inv-2", "inv-3"]
PROVIDER_DELAY = {"inv-1": 0.0, "inv-2": 0.3, "inv-3": 1.0}


class ScriptedModel(BaseChatModel):
    """A deterministic stand-in for a tool-calling LLM.

    On a fresh user turn it asks for one ``tool_name`` call per entry of ``calls`` (all
    in one message, i.e. a parallel batch); once every call has an answer it replies
    ``"done"``. Like a real model it mints *fresh* tool-call ids on every generation, so
    a model step that LangGraph re-runs after a crash emits different ids for the same
    calls - the case a ledger keyed on ids alone gets wrong.
    """

    tool_name: str = "charge"
    calls: list[dict[str, Any]] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> ScriptedModel:
        """Tools are fixed by the script; binding is accepted and ignored."""
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        humans = [i for i, m in enumerate(messages) if isinstance(m, HumanMessage)]
        turn = messages[humans[-1] :] if humans else messages
        answered = [m for m in turn if isinstance(m, ToolMessage)]
        if answered or not self.calls:
            message = AIMessage(content=f"done: {len(answered)} tool results")
        else:
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": self.tool_name,
                        "args": args,
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "tool_call",
                    }
                    for args in self.calls
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


# --- the child process ----------------------------------------------------------------


async def _child(node_kind: str, phase: str, db: str, effects: str) -> None:
    from langchain_core.tools import tool
    from langgraph.prebuilt import ToolNode, create_react_agent

    from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode
    from langgraph_idem_saver.tool_node import NOT_APPLIED

    effects_file = Path(effects)
    crash = phase == "run"

    @tool
    async def charge(invoice: str, amount: int) -> str:
        """Charge the customer's card for an invoice."""
        # the payment provider answers at different speeds: inv-1 fast, inv-3 slow
        await asyncio.sleep(PROVIDER_DELAY[invoice])
        with effects_file.open("a") as f:
            f.write(f"{invoice}\n")
        if crash and invoice == "inv-2":
            # the card was charged; the process dies before anyone records it
            print("     [child] charged inv-2 ... and the process dies (os._exit)", flush=True)
            os._exit(CRASH_EXIT_CODE)
        return f"charged {invoice}: ${amount}"

    def verify_charge(args: dict[str, Any]) -> Any:
        """Ask the 'payment provider' whether the charge landed (here: the effects file)."""
        charged = effects_file.read_text().split() if effects_file.exists() else []
        if args["invoice"] in charged:
            return f"charged {args['invoice']}: ${args['amount']}"
        return NOT_APPLIED

    node: ToolNode
    if node_kind == "stock":
        node = ToolNode([charge])
    else:
        node = IdempotentToolNode([charge], verify={"charge": verify_charge})
    model = ScriptedModel(
        calls=[{"invoice": inv, "amount": 100 * (i + 1)} for i, inv in enumerate(INVOICES)]
    )
    config: RunnableConfig = {"configurable": {"thread_id": "invoices"}}
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        agent = create_react_agent(model, node, checkpointer=saver, version="v1")
        if phase == "run":
            await agent.ainvoke({"messages": [HumanMessage("pay my three invoices")]}, config)
        else:
            result = await agent.ainvoke(None, config)
            print(f"    [child] resumed; agent says: {result['messages'][-1].content!r}")
        if node_kind != "stock":
            rows = [
                [e.tool_name, json.loads(e.args)["invoice"], e.status.value, e.attempts]
                for e in await saver.alist_entries("invoices")
            ]
            print("LEDGER " + json.dumps(rows), flush=True)


# --- the parent ---------------------------------------------------------------------------


def _run_child(node_kind: str, phase: str, db: Path, effects: Path) -> tuple[int, list[Any]]:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "langgraph_idem_saver.demo",
            "--child",
            node_kind,
            phase,
            str(db),
            str(effects),
        ],
        capture_output=True,
        text=True,
    )
    ledger: list[Any] = []
    for line in proc.stdout.splitlines():
        if line.startswith("LEDGER "):
            ledger = json.loads(line[len("LEDGER ") :])
        else:
            print(line)
    if proc.returncode not in (0, CRASH_EXIT_CODE):
        sys.stderr.write(proc.stderr)
        raise SystemExit(f"demo child failed with exit code {proc.returncode}")
    return proc.returncode, ledger


def run_demo(workdir: Path) -> dict[str, Any]:
    """Run both variants; return charges per invoice and the ledger rows."""
    results: dict[str, Any] = {}
    for kind, title in (("stock", "LangGraph ToolNode"), ("idempotent", "IdempotentToolNode")):
        db, effects = workdir / f"{kind}.db", workdir / f"{kind}.effects"
        print(f"\n== {title} ==")
        print("  1. a process runs the agent: it asks to charge inv-1, inv-2, inv-3 at once")
        code, _ = _run_child(kind, "run", db, effects)
        print(f"     child exit code: {code} (killed mid tool batch)")
        print("  2. a fresh process resumes the thread from the checkpoint")
        _, ledger = _run_child(kind, "resume", db, effects)
        charges = Counter(effects.read_text().split())
        results[kind] = {
            "charges": {inv: charges.get(inv, 0) for inv in INVOICES},
            "ledger": ledger,
        }
    return results


def print_report(results: dict[str, Any]) -> None:
    stock, ours = results["stock"]["charges"], results["idempotent"]["charges"]
    print("\n== Cards charged per invoice (each should be charged exactly once) ==")
    print(f"  {'invoice':<10}{'ToolNode':>10}{'IdempotentToolNode':>22}")
    for inv in INVOICES:
        print(f"  {inv:<10}{stock[inv]:>10}{ours[inv]:>22}")
    print(f"  {'total':<10}{sum(stock.values()):>10}{sum(ours.values()):>22}")
    print("\n== The ledger after the resume (IdempotentToolNode) ==")
    print(f"  {'tool':<8}{'invoice':<10}{'status':<11}{'attempts':>8}")
    for tool_name, invoice, status, attempts in results["idempotent"]["ledger"]:
        print(f"  {tool_name:<8}{invoice:<10}{status:<11}{attempts:>8}")
    print(
        "\ninv-1 had completed before the crash: replayed from the ledger, not re-run.\n"
        "inv-2 was charged but never recorded: its outcome was unknown, so the tool's\n"
        "verify hook asked the provider, found the charge, and recorded it - no re-run.\n"
        "inv-3 was issued but its charge had not happened yet: verify said so, and\n"
        "only then was it run - once."
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="idem-saver demo", description=__doc__)
    parser.add_argument("--dir", help="keep the databases here (default: a temp dir)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        node_kind, phase, db, effects = args.child
        asyncio.run(_child(node_kind, phase, db, effects))
        return 0
    if args.dir:
        workdir = Path(args.dir)
        workdir.mkdir(parents=True, exist_ok=True)
        print_report(run_demo(workdir))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            print_report(run_demo(Path(tmp)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
