"""The crash-and-resume demonstration: ``python -m langgraph_idem_saver demo [--db PATH]``.

A LangChain 1.x ``create_agent`` agent (no API key: the "LLM" is :class:`ScriptedModel`)
pays three invoices with three parallel tool calls, on embedded SQLite. A child process
really dies in the middle of them, right after the second card charge went through. A
fresh process resumes the thread. We do it twice - the stock agent (thread
``invoices-stock``) and the same agent with ``IdempotencyMiddleware`` (thread
``invoices-idempotent``) - and print how many times each card was charged, and the ledger.

Both threads are kept in one SQLite database, ``./idem-demo.db`` by default (``--db PATH``
to choose another), so the ``idem-saver`` commands printed at the end can show what
happened. Each run of the demo overwrites that database (and refuses a file that holds
anything but the demo's two threads).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import sqlite3
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
DEFAULT_DB = "idem-demo.db"
THREADS = {"stock": "invoices-stock", "idempotent": "invoices-idempotent"}
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

    from langgraph_idem_saver import NOT_APPLIED, AsyncSqliteSaver

    try:
        from langchain.agents import create_agent

        from langgraph_idem_saver.middleware import IdempotencyMiddleware
    except ImportError as exc:
        raise SystemExit(
            "the demo builds its agent with LangChain's create_agent: "
            "pip install 'langgraph-idem-saver[agents]'"
        ) from exc

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

    middleware = (
        [] if node_kind == "stock" else [IdempotencyMiddleware(verify={"charge": verify_charge})]
    )
    model = ScriptedModel(
        calls=[{"invoice": inv, "amount": 100 * (i + 1)} for i, inv in enumerate(INVOICES)]
    )
    thread_id = THREADS[node_kind]
    config: RunnableConfig = {"configurable": {"thread_id": thread_id}}
    async with AsyncSqliteSaver.from_conn_string(db) as saver:
        agent = create_agent(model, tools=[charge], middleware=middleware, checkpointer=saver)
        if phase == "run":
            await agent.ainvoke({"messages": [HumanMessage("pay my three invoices")]}, config)
        else:
            result = await agent.ainvoke(None, config)
            print(f"    [child] resumed; agent says: {result['messages'][-1].content!r}")
        if node_kind != "stock":
            rows = [
                [e.tool_name, json.loads(e.args)["invoice"], e.status.value, e.attempts]
                for e in await saver.alist_entries(thread_id)
                if e.tool_name != "__model__"  # the tool calls (not recorded model answers)
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


def run_demo(db: Path, workdir: Path) -> dict[str, Any]:
    """Run both variants on ``db`` (one thread each); return charges per invoice and the
    ledger rows. ``workdir`` holds the "payment provider's" records of charges."""
    results: dict[str, Any] = {}
    titles = (("stock", "create_agent"), ("idempotent", "create_agent + IdempotencyMiddleware"))
    for kind, title in titles:
        effects = workdir / f"{kind}.effects"
        print(f"\n== {title} (thread {THREADS[kind]}) ==")
        print("  1. a process runs the agent: it asks to charge inv-1, inv-2, inv-3 at once")
        code, _ = _run_child(kind, "run", db, effects)
        print(f"     child exit code: {code} (killed mid tool calls)")
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
    print(f"  {'invoice':<10}{'stock':>10}{'with the middleware':>22}")
    for inv in INVOICES:
        print(f"  {inv:<10}{stock[inv]:>10}{ours[inv]:>22}")
    print(f"  {'total':<10}{sum(stock.values()):>10}{sum(ours.values()):>22}")
    print("\n== The ledger after the resume (IdempotencyMiddleware) ==")
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


def cli_prefix() -> str:
    """How to run ``idem-saver`` from here: the command itself when it is on PATH (and
    is this installation's), else the script beside this Python, else ``python -m``."""
    bindir = Path(sys.executable).parent  # not resolved: a venv's python is a symlink
    script = bindir / ("idem-saver.exe" if os.name == "nt" else "idem-saver")
    on_path = shutil.which("idem-saver")
    if on_path and script.exists() and Path(on_path).resolve() == script.resolve():
        return "idem-saver"
    if script.exists():
        return shlex.quote(_shown(script))
    return f"{shlex.quote(_shown(Path(sys.executable)))} -m langgraph_idem_saver"


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it is inside it."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)


def inspect_commands(db: str) -> list[str]:
    """The ``idem-saver`` commands that show what the demo left in ``db``."""
    prefix, where = cli_prefix(), shlex.quote(db)
    ours = THREADS["idempotent"]
    return [
        f"{prefix} threads --db {where}",
        f"{prefix} ledger {ours} --db {where}",
        f"{prefix} history {ours} --db {where}",
    ]


def print_next_steps(db: str) -> None:
    print(
        f"\n== See it with the command line ==\n"
        f"The database is kept in {db} (the next run of the demo overwrites it). Try:"
    )
    for command in inspect_commands(db):
        print(f"  {command}")


class DemoError(Exception):
    """Why the demo refuses to run (printed as one line, exit code 2)."""


def prepare_db(db: Path) -> None:
    """Remove the previous run's database, after checking that it is one: never delete a
    file the demo did not write."""
    if db.is_dir():
        raise DemoError(f"{db} is a directory; --db takes a file path")
    if not db.parent.is_dir():
        raise DemoError(f"directory {db.parent} does not exist (create it, or pick another --db)")
    if db.exists() and db.stat().st_size > 0:
        threads = _demo_threads(db)
        if threads is None or not threads <= set(THREADS.values()):
            raise DemoError(
                f"{db} exists and is not a database this demo wrote; the demo overwrites its "
                "database on each run, so pass another --db PATH"
            )
    if not os.access(db.parent, os.W_OK):
        raise DemoError(f"directory {db.parent} is not writable (pick another --db)")
    for suffix in ("", "-wal", "-shm", "-journal"):
        try:
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        except OSError as exc:
            raise DemoError(f"cannot remove the previous {db}{suffix}: {exc}") from None


def _demo_threads(db: Path) -> set[str] | None:
    """The thread ids in ``db`` (read-only), or None when it is not one of our databases."""
    try:
        conn = sqlite3.connect(f"{db.resolve().as_uri()}?mode=ro", uri=True)
        try:
            rows = conn.execute(
                "SELECT thread_id FROM idem_checkpoints UNION SELECT thread_id FROM idem_tool_calls"
            ).fetchall()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return {str(r[0]) for r in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="idem-saver demo",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--db",
        default=DEFAULT_DB,
        metavar="PATH",
        help=f"the SQLite database to keep the demo's threads in (default: ./{DEFAULT_DB}); "
        "overwritten on each run",
    )
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        node_kind, phase, db, effects = args.child
        asyncio.run(_child(node_kind, phase, db, effects))
        return 0
    db = Path(args.db).expanduser()
    try:
        prepare_db(db)
    except DemoError as exc:
        print(f"idem-saver demo: error: {exc}", file=sys.stderr)
        return 2
    print(f"Database: {args.db} (overwritten on each run of the demo; --db PATH for another)")
    with tempfile.TemporaryDirectory() as provider:
        print_report(run_demo(db, Path(provider)))
    print_next_steps(args.db)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
