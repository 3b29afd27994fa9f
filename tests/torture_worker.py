"""The agent that ``tests/test_torture.py`` SIGKILLs at random moments, one process per run.

Why a module of its own, run as a *zygote*: the torture test starts dozens of short-lived
processes, and importing LangGraph costs ~1.2 s of CPU per fresh interpreter - more than
the whole run of the agent. So the parent starts ONE ``python tests/torture_worker.py
--zygote`` subprocess (its own session), which imports everything once and then forks a
child per request (:func:`zygote_main`). Every child is still a real, separate OS process
with its own pid (what the ledger's "is the owner dead?" check looks at), event loop and
database connections - it just starts in a few ms. The zygote reaps its children and
reports their exits; when its stdin closes (the test is over, or the test process died)
it SIGKILLs whatever children are left and exits.

A child (:func:`child_main`) is one application process working on one thread:

1. it starts a session of its own (``os.setsid``), so the parent can SIGKILL it - and
   anything it might start - as one process group;
2. opens the saver (SQLite file or PostgreSQL schema), builds the graph, touches
   ``<round dir>/ready-<pid>`` and waits until every process of its round is ready (a
   barrier: two concurrent resumers really overlap);
3. drives the thread (:func:`adrive`). ``role="app"``, the application restarting: finish
   whatever is pending (``ainvoke(None)``), then send the user turns the thread has not
   seen yet (all of them when nothing was saved: durability ``"exit"`` saves nothing
   before the end of an invoke). ``role="resumer"``, a recovery worker (two of them run
   at once): only finish what is pending - except under ``"exit"``, where nothing is
   ever pending in a checkpoint and recovering means sending the lost turn again. Under
   ``"sync"``/``"async"`` user turns have one source, as in a real deployment:
   LangGraph's checkpointer has no compare-and-swap, so a turn sent while another
   process extends the thread lands on whichever checkpoint is newest - possibly the
   middle of the other's step, whose tool calls then stay unanswered for good (under
   ``"exit"`` there are no mid-step checkpoints to land on; there a :class:`TurnLock`
   keeps a turn from being sent on a head that already has it);
4. writes a JSON report to ``out`` and leaves with ``os._exit`` - unless the parent
   killed it first, which is the point.

The agent: a scripted ReAct "model" (:class:`BatchPayModel`) pays the invoices of each
user turn in batches of parallel ``charge`` calls (two, then the rest), one tools step
per batch, then answers ``done: <the tool results>``. Like a real model it mints fresh
tool-call ids on every generation, so a model step LangGraph re-runs after a crash asks
for the same charges under new ids.

The side effect: ``charge`` appends one line (the invoice) to the ``effects`` file with
``O_APPEND`` and ``fsync`` - a line in the file is a charge that happened, whatever
happens to the process afterwards. It sleeps before (the request) and after (the
vendor's reply) the effect: a kill in the second sleep is the classic "charged, but the
agent never learned it" window. The ``verify`` hook (``scenario["verify"]``) reads the
same file, as a tool would ask its payment provider whether a charge with this idempotency
key exists (``"truthful"``, the default); or it always answers "not applied" (``"liar"``:
a call it is wrongly asked about runs twice); or there is none (``"absent"``: unknown
outcomes are interrupts, answered by a human who sees only the payload - "completed",
with the result the tool returns for those arguments).

Whoever is asked - ``verify`` or the human - the child first notes, in the scenario's
``asked`` file (one JSON line each), the invoice and the pids of the processes that hold
its ``issued`` entries: in rounds of one process the parent checks that each of them is
a process it killed. A call whose process lived to the end of its run must never be
asked about: its outcome was committed.

``stack`` chooses the parts: ``"ours"`` (our saver + :class:`IdempotentToolNode`) or
``"stock"`` (LangGraph's own saver + ``langgraph.prebuilt.ToolNode``) - the control
that must show duplicates.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any, ClassVar

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from langgraph.prebuilt import ToolNode
from langgraph.types import Command
from scripted_chat_model import ScriptedChatModel

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run as the zygote script from a checkout
    sys.path.insert(0, str(REPO_ROOT))

from resume_worker import build_graph as react_loop  # noqa: E402  (one ReAct loop)
from resume_worker import summarize  # noqa: E402  (one definition of a thread's transcript)

from langgraph_idem_saver import IdempotentToolNode  # noqa: E402
from langgraph_idem_saver.tool_node import NOT_APPLIED  # noqa: E402

FAILED_EXIT_CODE = 3
WORKER = Path(__file__)
BATCH = 2
"""Invoices per tools step: a turn of three invoices takes two tools steps."""


class BatchPayModel(ScriptedChatModel):
    """A scripted ReAct "LLM": ``"pay a b c"`` -> charge a, b (parallel) -> charge c -> done.

    Everything it says derives from the conversation since the last user turn, so a
    re-run model step asks for the same charges (under fresh ids, as a real model would).
    """

    llm_type: ClassVar[str] = "scripted-batch-pay"

    def _generate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kwargs: Any
    ) -> ChatResult:
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        turn = messages[last_human:]
        invoices = str(turn[0].content).split()[1:]
        answered = [m for m in turn if isinstance(m, ToolMessage)]
        if len(answered) >= len(invoices):
            message = AIMessage(content=done_text([str(m.content) for m in answered]))
        else:
            start = len(answered)
            message = AIMessage(
                content="",
                tool_calls=[
                    {
                        "name": "charge",
                        "args": {"invoice": inv, "amount": amount_of(invoices, inv)},
                        "id": f"call_{uuid.uuid4().hex[:12]}",
                        "type": "tool_call",
                    }
                    for inv in invoices[start : start + BATCH]
                ],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])


def amount_of(invoices: Sequence[str], invoice: str) -> int:
    """The amount the model asks for: fixed by the invoice's place in its turn."""
    return 10 * (invoices.index(invoice) + 1)


def charge_result(invoice: str, amount: int) -> str:
    """What ``charge`` returns - and what ``verify`` answers for a charge that landed."""
    return f"charged {invoice} ${amount}"


def done_text(results: Sequence[str]) -> str:
    """The model's last answer of a turn: it quotes the tool results (replays included)."""
    return "done: " + "; ".join(results)


def expected_transcript(inputs: Sequence[str]) -> list[Any]:
    """The :func:`summarize` of a thread that ran every turn once, uncrashed."""
    out: list[Any] = []
    for text in inputs:
        invoices = text.split()[1:]
        out.append(["human", text])
        results: list[str] = []
        for start in range(0, len(invoices), BATCH):
            batch = invoices[start : start + BATCH]
            calls = sorted(
                json.dumps(["charge", {"amount": amount_of(invoices, i), "invoice": i}])
                for i in batch
            )
            out.append(["ai", "", calls])
            for inv in batch:
                results.append(charge_result(inv, amount_of(invoices, inv)))
                out.append(["tool", "charge", results[-1], "success"])
        out.append(["ai", done_text(results), []])
    return out


def effect_lines(path: Path) -> list[str]:
    """The charges that happened, one invoice per line, in the order they landed."""
    try:
        return path.read_text().split()
    except FileNotFoundError:
        return []


def record_effect(path: Path, invoice: str) -> None:
    """Append one line and fsync it: once this returns the charge happened for good."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{invoice}\n".encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def make_charge(effects: Path, latency: float) -> BaseTool:
    """The side-effecting tool, writing to ``effects``."""

    @tool
    async def charge(invoice: str, amount: int) -> str:
        """Charge an invoice (the side effect under test)."""
        await asyncio.sleep(latency)  # the request travels to the vendor
        record_effect(effects, invoice)
        await asyncio.sleep(latency)  # the reply travels back: a kill here loses it
        return charge_result(invoice, amount)

    return charge


def owner_pid(owner: str) -> int | None:
    """The pid in a claim's owner id (``host:pid:nonce-...``; see ``owners.make_owner``)."""
    parts = owner.split(":")
    return int(parts[-2]) if len(parts) >= 3 and parts[-2].isdigit() else None


async def note_asked(scenario: dict[str, Any], saver: Any, who: str, invoice: str) -> None:
    """One line in the ``asked`` file: who was asked about ``invoice``, and the pids of the
    other processes holding its ``issued`` entries (the parent checks it killed them)."""
    if saver is None or not scenario.get("asked"):
        return
    entries = await saver.alist_entries(config_of(scenario)["configurable"]["thread_id"])
    owners = sorted(
        pid
        for e in entries
        if e.status.value == "issued"
        and json.loads(e.args)["invoice"] == invoice
        and (pid := owner_pid(e.owner)) != os.getpid()
    )
    line = json.dumps({"who": who, "invoice": invoice, "owners": owners}) + "\n"
    fd = os.open(scenario["asked"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
        os.fsync(fd)
    finally:
        os.close(fd)


def make_node(scenario: dict[str, Any], saver: Any = None) -> ToolNode:
    """The tools node of the stack under test (``saver``: where ``verify`` looks up the
    entries it is asked about, for the ``asked`` file)."""
    effects = Path(scenario["effects"])
    charge = make_charge(effects, float(scenario.get("latency", 0.01)))
    if scenario["stack"] == "stock":
        return ToolNode([charge])
    kind = scenario.get("verify", "truthful")

    async def verify(args: dict[str, Any]) -> Any:
        """Did this invoice's charge land? (asks the "vendor": the effects file; the liar
        says no, always)"""
        await note_asked(scenario, saver, "verify", args["invoice"])
        if kind != "liar" and args["invoice"] in effect_lines(effects):
            return charge_result(args["invoice"], args["amount"])
        return NOT_APPLIED

    hooks: dict[str, Any] = {}
    if kind != "absent":
        hooks["on_unknown"] = "raise"  # every unknown outcome must be settled by verify
        hooks["verify"] = {"charge": verify}
    return IdempotentToolNode(
        [charge],
        **hooks,
        key_policy=scenario.get("key_policy", "tool_call"),
        on_earlier_call=scenario.get("on_earlier_call", "ask"),
        wait_seconds=float(scenario.get("wait_seconds", 15.0)),
        poll_seconds=0.01,
    )


def build_graph(node: ToolNode, saver: Any) -> Any:
    """agent -> (tools -> agent)* -> END over MessagesState: a minimal ReAct loop."""
    return react_loop(BatchPayModel(), node, saver)


@asynccontextmanager
async def open_saver(scenario: dict[str, Any]) -> AsyncIterator[Any]:
    """The scenario's database through the stack's saver: ``db`` (SQLite) or ``dsn``."""
    stock = scenario["stack"] == "stock"
    if scenario.get("dsn"):
        if stock:
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver as StockPg

            async with StockPg.from_conn_string(scenario["dsn"]) as saver:
                await saver.setup()
                yield saver
        else:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(scenario["dsn"]) as saver:
                yield saver
    else:
        if stock:
            from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver as StockSqlite

            async with StockSqlite.from_conn_string(scenario["db"]) as saver:
                yield saver
        else:
            from langgraph_idem_saver import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(scenario["db"]) as saver:
                yield saver


class TurnLock:
    """One source of user turns under durability ``"exit"``, across the round's processes.

    A process sends a turn only if the thread's head has not seen it. Without this lock
    that check races with another process's end-of-run save: a resumer that read the head
    before the other process saved its turn, but whose run reads the head after, sends
    that turn a second time - a user repeating themselves, not a crash (seen as a turn
    answered twice and a "reworded" call paired with the other turn's lost call). So a
    sender holds ``turns.lock`` from its check until its run has read the head, and every
    checkpoint write (``aput``: under ``"exit"`` the run's one save) waits for it. Two
    senders that check the same head still run from it together: the fork the pairs
    variant is about. The kernel drops the lock of a killed process.
    """

    def __init__(self, scenario: dict[str, Any]) -> None:
        self.path = Path(scenario["effects"]).with_name("turns.lock")
        self.fd: int | None = None
        self.armed = False

    async def acquire(self) -> None:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        self.fd = fd

    def release(self) -> None:
        fd, self.fd, self.armed = self.fd, None, False
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def install(self, saver: Any) -> None:
        """Wrap the saver instance's ``aput`` (waits for another sender's check) and
        ``aget_tuple`` (the run's head read ends this process's hold)."""
        aput, aget_tuple = saver.aput, saver.aget_tuple

        async def locked_aput(*args: Any, **kwargs: Any) -> Any:
            if self.fd is not None:  # this process holds it: its own write
                return await aput(*args, **kwargs)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            try:
                await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
                return await aput(*args, **kwargs)
            finally:
                os.close(fd)

        async def head_read(*args: Any, **kwargs: Any) -> Any:
            try:
                return await aget_tuple(*args, **kwargs)
            finally:
                if self.armed:
                    self.release()

        saver.aput, saver.aget_tuple = locked_aput, head_read


def config_of(scenario: dict[str, Any]) -> dict[str, Any]:
    """The run config of the scenario's thread."""
    return {"configurable": {"thread_id": scenario.get("thread_id", "t1")}}


async def adrive(
    graph: Any, scenario: dict[str, Any], turns: TurnLock | None = None
) -> dict[str, Any]:
    """Bring the thread forward as the process's ``role`` says (see the module docstring);
    returns the values of this process's own run (with concurrent resumers the thread's
    head may be the other's branch). ``turns``: the round's :class:`TurnLock` (durability
    ``"exit"``), held from each turn's check until its run read the head."""
    config = config_of(scenario)
    durability = scenario["durability"]
    state = await graph.aget_state(config)
    values: dict[str, Any] = dict(state.values)
    if values:
        # even when `state.next` is empty: under durability "async" a finished task's
        # writes may be pending without their checkpoint, and only a run applies them
        values = await answered(
            graph, scenario, await graph.ainvoke(None, config, durability=durability)
        )
    if scenario.get("role", "app") == "app" or durability == "exit":
        texts = list(scenario["inputs"])
        if scenario.get("order") == "fickle" and scenario.get("round", 0) % 2:
            texts.reverse()  # after a round that may have lost a turn: the other one first
        for text in texts:
            if values.get("__interrupt__"):
                break
            head = values
            if turns is not None:
                await turns.acquire()
                head = dict((await graph.aget_state(config)).values)
            seen = {m.content for m in head.get("messages", []) if isinstance(m, HumanMessage)}
            if text in seen:
                if turns is not None:
                    turns.release()
                continue
            if turns is not None:
                turns.armed = True  # released by the run's first head read
            try:
                values = await graph.ainvoke(
                    {"messages": [HumanMessage(content=text)]}, config, durability=durability
                )
            finally:
                if turns is not None:
                    turns.release()
            values = await answered(graph, scenario, values)
    if values.get("__interrupt__"):
        raise RuntimeError(f"unexpected interrupt: {values['__interrupt__']!r}")
    return values


async def answered(graph: Any, scenario: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """Without a ``verify`` hook: answer every unknown-outcome interrupt as a human who sees
    only its payload ("completed", the result the tool returns for those arguments, about
    that key and attempt) until the run goes through. Otherwise ``values`` as they are."""
    if scenario.get("verify") != "absent":
        return values
    while values.get("__interrupt__"):
        answers: dict[str, Any] = {}
        for pending in values["__interrupt__"]:
            question = pending.value
            args = question["args"]
            await note_asked(scenario, graph.checkpointer, "human", args["invoice"])
            answers[pending.id] = {
                "action": "completed",
                "result": charge_result(args["invoice"], args["amount"]),
                "key": question["key"],
                "attempt": question["attempt"],
            }
        values = await graph.ainvoke(
            Command(resume=answers), config_of(scenario), durability=scenario["durability"]
        )
    return values


def _barrier(round_dir: Path, n: int) -> None:
    """Announce readiness, wait for the round's other process(es): the runs overlap."""
    (round_dir / f"ready-{os.getpid()}").touch()
    deadline = time.monotonic() + 60
    while len(list(round_dir.glob("ready-*"))) < n:
        if time.monotonic() > deadline:
            raise TimeoutError("barrier: the other processes of this round never showed up")
        time.sleep(0.002)


async def arun(scenario: dict[str, Any]) -> dict[str, Any]:
    """One application process's work on the thread; returns its report."""
    async with open_saver(scenario) as saver:
        turns = None
        if scenario["durability"] == "exit":
            turns = TurnLock(scenario)
            turns.install(saver)
        graph = build_graph(make_node(scenario, saver), saver)
        _barrier(Path(scenario["round_dir"]), int(scenario.get("n", 1)))
        values = await adrive(graph, scenario, turns)
        messages = summarize(values.get("messages", []))
        return {"ok": True, "pid": os.getpid(), "messages": messages}


def child_main(scenario: dict[str, Any]) -> None:
    """The body of one child process, forked by the zygote: never returns."""
    code = 0
    try:
        payload = asyncio.run(arun(scenario))
    except BaseException as exc:  # report everything: the parent decides what is fine
        code = FAILED_EXIT_CODE
        payload = {
            "ok": False,
            "pid": os.getpid(),
            "error": type(exc).__name__,
            "message": str(exc)[:2000],
            "traceback": traceback.format_exc()[-4000:],
        }
    out = Path(scenario["out"])
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    tmp.rename(out)  # the parent never reads half a report
    os._exit(code)  # no atexit handlers of the zygote: like a real process exit


def zygote_main() -> None:
    """Fork a child per JSON line read on stdin; report on stdout, one line each:
    ``ready`` (once, after the imports), ``started <pid>``, ``exited <pid> <exit code>``
    (negative: killed by that signal). EOF on stdin: kill the children left, exit.

    Single-threaded (forking a threaded process is asking for trouble): children's exits
    arrive as SIGCHLD through a wakeup fd, multiplexed with stdin by ``selectors``.
    """
    import selectors
    import signal

    # everything a child may need, imported once here instead of in every child
    import aiosqlite  # noqa: F401
    import psycopg  # noqa: F401
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver  # noqa: F401
    from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver  # noqa: F401

    from langgraph_idem_saver import AsyncSqliteSaver as OurSqlite  # noqa: F401
    from langgraph_idem_saver.postgres import AsyncPostgresSaver as OurPg  # noqa: F401

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler: wakeups fire
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    live: set[int] = set()

    def say(line: str) -> None:
        os.write(1, f"{line}\n".encode())

    def reap() -> None:
        while live:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                return
            live.discard(pid)
            say(f"exited {pid} {os.waitstatus_to_exitcode(status)}")

    def fork(spec: dict[str, Any]) -> None:
        pid = os.fork()
        if pid == 0:  # the child: leave the zygote's plumbing, run, never return
            try:
                os.setsid()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                devnull = os.open(os.devnull, os.O_RDWR)
                os.dup2(devnull, 0)
                os.dup2(devnull, 1)  # stdout is the zygote's report channel
                for fd in (devnull, wake_r, wake_w):
                    os.close(fd)
                child_main(spec)
            finally:
                os._exit(FAILED_EXIT_CODE)
        live.add(pid)
        say(f"started {pid}")

    say("ready")
    pending = b""
    eof = False
    while not eof:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
            else:
                chunk = os.read(0, 65536)
                eof = not chunk
                pending += chunk
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    fork(json.loads(line))
        reap()
    for pid in live:  # the test is over (or died): nothing outlives it
        for kill in (os.killpg, os.kill):
            with suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
    while live:
        pid, _status = os.waitpid(-1, 0)
        live.discard(pid)


if __name__ == "__main__":
    if sys.argv[1:] == ["--zygote"]:
        zygote_main()
    else:
        sys.exit("usage: torture_worker.py --zygote")
