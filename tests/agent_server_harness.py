"""LangGraph's dev server (``langgraph dev``) on a copy of ``examples/agent-server``, for
the tests: start it, let a tool kill it, start it again, and finish threads the way an
SDK user would.

* :class:`ServerProject` - a copy of the example in a temporary directory, its
  ``langgraph.json`` listing the example's ``agent`` and the test graphs of
  ``agent_server_graphs.py``, the database chosen by environment variables (the example's
  ``checkpointer.py`` reads them), and the files the test graphs read (plans) and write
  (``parked``, ``hung``, the payments file).
* :class:`DevServer` - ``langgraph dev --no-browser`` in a session of its own (its
  process group is what a parked tool SIGKILLs), offline (:data:`OFFLINE_ENV`), on a free
  port. However the test ends, :meth:`DevServer.stop` SIGKILLs the group; if the test run
  itself is killed, the command (``python tests/agent_server_harness.py langgraph dev
  ...``: the ``langgraph`` command line in a process that ends itself once the test run
  is gone) and the server (its graph module does the same) end themselves
  (``process_guard.exit_with_parent``).
* :func:`afinish` - what a user does after a restart, with ``langgraph_sdk`` only.

``python tests/agent_server_harness.py adapter-facts DIR`` prints what the server's
checkpointer wrapper looks like (tests/test_upstream_contracts.py): ``langgraph_api``
reads its configuration from the environment when imported, as ``langgraph dev`` sets it
up, so that check runs in a process of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "agent-server"
GRAPHS_MODULE = Path(__file__).resolve().parent / "agent_server_graphs.py"
EXAMPLE_FILES = ("agent.py", "payments.py", "checkpointer.py")
TEST_GRAPHS = ("ours", "stock", "node", "task", "asking", "modules")

# what turns the dev server's calls home off: the CLI's usage analytics, the server's
# check for a newer langgraph-api on PyPI, LangSmith tracing (README, "Deploy on
# LangGraph's server")
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGSMITH_TRACING": "false",
}
# what `langgraph dev` sets before it imports langgraph_api (langgraph_api.cli.run_server)
INMEM_ENV = {
    "DATABASE_URI": ":memory:",
    "REDIS_URI": "fake",
    "MIGRATIONS_PATH": "__inmem",
    "LANGGRAPH_RUNTIME_EDITION": "inmem",
}
READY_SECONDS = 90.0
PARK_SECONDS = 180.0
FLUSH_SECONDS = 40.0  # for a save of its runs and threads (every second: dev_server_knobs)
DIE_SECONDS = 30.0
JOBS = 32  # runs one server runs at once (every scenario of a life parks together)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerProject:
    """A copy of the example plus the test graphs, served from ``root``."""

    def __init__(
        self, root: Path, db_env: Mapping[str, str], *, extra_graphs: tuple[str, ...] = ()
    ) -> None:
        self.root = root
        self.db_env = dict(db_env)
        root.mkdir(parents=True, exist_ok=True)
        for name in EXAMPLE_FILES:
            shutil.copy(EXAMPLE / name, root / name)
        config = json.loads((EXAMPLE / "langgraph.json").read_text())
        names = TEST_GRAPHS + extra_graphs
        config["graphs"].update({name: f"{GRAPHS_MODULE}:{name}" for name in names})
        (root / "langgraph.json").write_text(json.dumps(config, indent=2))
        for sub in ("plans", "parked", "fired", "hung"):
            (root / sub).mkdir(exist_ok=True)
        self.payments = root / "payments.log"

    def plan(self, thread_id: str, **plan: Any) -> None:
        (self.root / "plans" / f"{thread_id}.json").write_text(json.dumps(plan))

    def parked(self) -> set[str]:
        return {p.name for p in (self.root / "parked").iterdir()}

    def hung(self, thread_id: str) -> bool:
        return (self.root / "hung" / thread_id).exists()

    def charges(self) -> list[str]:
        """Every charge made, in order (invoice names)."""
        if not self.payments.exists():
            return []
        return [line.split()[0] for line in self.payments.read_text().splitlines()]

    def ops_file(self) -> Path:
        """Where the dev server saves its threads and runs (every second: dev_server_knobs)."""
        return self.root / ".langgraph_api" / ".langgraph_ops.pckl"

    def forget_server_state(self) -> None:
        """Delete what the dev server saved of its threads and runs: a server that died
        before its first save, or a new container, knows none of them."""
        shutil.rmtree(self.root / ".langgraph_api", ignore_errors=True)

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANGGRAPH_")}
        env.update(OFFLINE_ENV)
        env.update(self.db_env)
        env["PAYMENTS_FILE"] = str(self.payments)
        env["IDEM_SERVER_WORK"] = str(self.root)
        return env


class DevServer:
    """``langgraph dev`` on a :class:`ServerProject`, in its own process group."""

    def __init__(self, project: ServerProject) -> None:
        self.project = project
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def log_tail(self, lines: int = 40) -> str:
        log = self.project.root / f"server-{self.starts}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def start(self, *, reload: bool = False, wait: bool = True) -> None:
        """Start the server (the previous one must be gone) and wait until it answers.

        ``reload=True`` is the README's command as it is (``langgraph dev --no-browser``,
        which restarts the server when a ``.py`` file changes); the crash tests add
        ``--no-reload``: one process, no file watcher."""
        assert self.proc is None or self.proc.poll() is not None
        self.starts += 1
        (self.project.root / "kill").unlink(missing_ok=True)
        log = (self.project.root / f"server-{self.starts}.log").open("wb")
        with log:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "langgraph",  # the `langgraph` command, guarded (see _langgraph)
                    "dev",
                    "--no-browser",
                    "--port",
                    str(self.port),
                    "--n-jobs-per-worker",
                    str(JOBS),
                    *([] if reload else ["--no-reload"]),
                ],
                cwd=self.project.root,
                env=self.project.env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: what a tool kills
            )
        if wait:
            self._wait_ready()

    def wait_exit(self) -> int:
        """Wait until the server process ends by itself; its exit code."""
        assert self.proc is not None
        try:
            return self.proc.wait(READY_SECONDS)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the server did not exit:\n{self.log_tail()}") from None

    def _wait_ready(self) -> None:
        import httpx

        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the server exited at start:\n{self.log_tail()}")
            try:
                if httpx.get(f"{self.url}/ok", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer in {READY_SECONDS} s:\n{self.log_tail()}")

    def wait_parked(self, threads: set[str]) -> None:
        """Until every thread of ``threads`` stopped at its crash point."""
        deadline = time.monotonic() + PARK_SECONDS
        while not threads <= self.project.parked():
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"the server died early:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                missing = sorted(threads - self.project.parked())
                raise AssertionError(f"not parked: {missing}\n{self.log_tail()}")
            time.sleep(0.1)

    def wait_saved(self, since: float) -> None:
        """Until the server saved its runs and threads (a periodic flush) after ``since``."""
        ops = self.project.ops_file()
        deadline = time.monotonic() + FLUSH_SECONDS
        while not (ops.exists() and ops.stat().st_mtime > since):
            if time.monotonic() > deadline:
                raise AssertionError(f"no flush of {ops} in {FLUSH_SECONDS} s")
            time.sleep(0.1)

    def kill_from_a_tool(self) -> None:
        """Let a parked tool SIGKILL the server's process group; wait until it is gone."""
        assert self.proc is not None
        (self.project.root / "kill").write_text("kill")
        try:
            self.proc.wait(DIE_SECONDS)
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError("no parked tool killed the server") from None
        assert self.proc.returncode == -signal.SIGKILL, self.proc.returncode
        for name in ("kill", "parked"):
            path = self.project.root / name
            if path.is_dir():
                for marker in path.iterdir():
                    marker.unlink()
            else:
                path.unlink(missing_ok=True)

    def stop(self) -> None:
        """SIGKILL the server's process group, if anything of it still runs."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL is not refused
            self.proc.wait(DIE_SECONDS)
        # the reloader's server process is reaped by init, not by us: wait for it too
        deadline = time.monotonic() + DIE_SECONDS
        while self.group_alive() and time.monotonic() < deadline:
            time.sleep(0.05)

    def group_alive(self) -> bool:
        """Whether any process of the server's group still exists."""
        if self.proc is None:
            return False
        try:
            os.killpg(self.proc.pid, 0)
        except ProcessLookupError:
            return False
        return True


Answer = Callable[[dict[str, Any]], dict[str, Any]]


async def afinish(
    client: Any, thread_id: str, graph: str, first_input: Any, answer: Answer
) -> dict[str, Any]:
    """Bring a thread to its end as a user of the SDK would after a server restart:

    * a thread the server forgot is created again with its id (the checkpoints are in
      our database, not the server's);
    * a run the server is re-running by itself is joined;
    * unknown-outcome interrupts are answered with ``answer(interrupt value)``;
    * a thread whose saved checkpoint has tasks left is resumed (``input=None``), one
      with no checkpoint gets its first input again.

    Returns the final state.
    """
    from langgraph_sdk.errors import NotFoundError

    for attempt in range(40):
        try:
            await client.threads.get(thread_id)
        except NotFoundError:
            await client.threads.create(thread_id=thread_id, graph_id=graph, if_exists="do_nothing")
        for run in await client.runs.list(thread_id):
            if run["status"] in ("pending", "running"):
                await client.runs.join(thread_id, run["run_id"])
        live = await client.threads.get_state(thread_id)
        try:
            if live["interrupts"]:
                resume = {i["id"]: answer(i["value"]) for i in live["interrupts"]}
                await client.runs.wait(thread_id, graph, command={"resume": resume})
                continue
            checkpoint = (live.get("checkpoint") or {}).get("checkpoint_id")
            if checkpoint is None:
                await client.runs.wait(thread_id, graph, input=first_input)
                continue
            # the checkpoint as saved, not the live view (tests/resume_rule.py)
            saved = await client.threads.get_state(thread_id, checkpoint_id=checkpoint)
            if not saved["next"]:
                return dict(live)
            await client.runs.wait(thread_id, graph, input=None)
        except Exception as exc:  # a call still claimed elsewhere: wait and look again
            if "ToolCallInProgress" not in repr(exc):
                raise
            await asyncio.sleep(0.2 + 0.05 * attempt)
    raise AssertionError(f"thread {thread_id} did not finish")


def _adapter_facts(tmp: str) -> dict[str, Any]:
    """How the server wraps a custom checkpointer (see the module docstring)."""
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph_api._checkpointer import _adapter

    from langgraph_idem_saver import AsyncSqliteSaver
    from langgraph_idem_saver.checkpointer_unwrap import ledger_in

    adapter_class = getattr(_adapter, "_CustomCheckpointerAdapter", None)
    facts: dict[str, Any] = {
        "class": isinstance(adapter_class, type),
        "saver_subclass": isinstance(adapter_class, type)
        and issubclass(adapter_class, BaseCheckpointSaver),
        "forwards": isinstance(adapter_class, type) and "__getattr__" in vars(adapter_class),
    }

    async def built() -> None:
        async with AsyncSqliteSaver.from_conn_string(str(Path(tmp) / "db.sqlite")) as saver:
            _adapter.CUSTOM_CHECKPOINTER = saver  # as collect_checkpointer_from_env sets it
            wrapper = await _adapter.get_checkpointer()
            caps = _adapter.get_checkpointer_capabilities()
            facts["built_type"] = f"{type(wrapper).__module__}.{type(wrapper).__qualname__}"
            facts["inner_is_saver"] = vars(wrapper).get("_inner") is saver
            facts["ledger_found"] = ledger_in(wrapper) is saver
            # what the server does with the saver it is given: it never calls setup()
            facts["calls_setup"] = "setup(" in inspect.getsource(_adapter)
            facts["detected"] = [
                name
                for name in ("adelete_for_runs", "adelete_thread", "aprune")
                if getattr(caps, f"has_{name}", False)
            ]
            await _adapter.exit_checkpointer()

    asyncio.run(built())
    return facts


def adapter_facts(tmp: Path) -> dict[str, Any]:
    """:func:`_adapter_facts`, in a process configured as ``langgraph dev`` does."""
    env = {**os.environ, **OFFLINE_ENV, **INMEM_ENV}
    out = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "adapter-facts", str(tmp)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _langgraph(args: list[str]) -> None:
    """The ``langgraph`` command line in this process, which ends itself once the test
    run is gone (``process_guard.exit_with_parent``): with reloading on, this process is
    the file watcher, which the server's own guard (in the graphs module) does not cover."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from dev_server_knobs import flush_often
    from langgraph_cli.cli import cli
    from process_guard import exit_with_parent

    exit_with_parent()
    flush_often()  # saves every second, not every ten (a no-reload server runs here)
    cli(args, prog_name="langgraph")


if __name__ == "__main__":
    if sys.argv[1:2] == ["adapter-facts"]:
        print(json.dumps(_adapter_facts(sys.argv[2])))
    elif sys.argv[1:2] == ["langgraph"]:
        _langgraph(sys.argv[2:])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} adapter-facts DIR | langgraph ARGS...")
