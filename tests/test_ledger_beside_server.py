"""A ``ToolLedger`` beside LangGraph's dev server's OWN persistence (``langgraph dev`` with
no custom checkpointer), killed inside a tool.

The server runs ``tests/ledger_beside_server_graph.py``'s ``create_agent`` graph in a
process group of its own. The test starts a run; the first charge records its effect and
waits; once the server has saved its runs (it does every 10 s), the tool SIGKILLs the
server's group. A new server on the same directory finds the run left running and runs it
again by itself ("Retrying runs left running by a previous process"); the test waits for
the thread to finish with ``langgraph_sdk`` only. With the ledger each invoice is charged
once; without it (the control) the killed charge is made again. Every server process is
SIGKILLed at the end, however the test ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pg_server import fresh_dsn

GRAPH = Path(__file__).with_name("ledger_beside_server_graph.py")
OFFLINE_ENV = {
    "LANGGRAPH_CLI_NO_ANALYTICS": "1",
    "LANGGRAPH_NO_VERSION_CHECK": "true",
    "LANGSMITH_TRACING": "false",
}
READY_SECONDS = 120.0
WAIT_SECONDS = 180.0

# the [server] extra (langgraph-cli[inmem]), which [dev] includes, needs Python >= 3.11
pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="langgraph-api needs Python >= 3.11"
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """``langgraph dev --no-reload`` on ``root``, in a process group of its own."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root, self.env = root, env
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def proc(self) -> subprocess.Popen[bytes]:
        return self.procs[-1]

    def log(self) -> str:
        path = self.root / f"server-{len(self.procs)}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-40:])

    def start(self) -> None:
        import httpx

        with (self.root / f"server-{len(self.procs) + 1}.log").open("wb") as log:
            command = [sys.executable, str(GRAPH), "langgraph", "dev", "--no-browser"]
            command += ["--port", str(self.port), "--no-reload"]
            self.procs.append(
                subprocess.Popen(
                    command,
                    cwd=self.root,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + READY_SECONDS
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the server exited at start:\n{self.log()}"
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/ok", timeout=2).status_code == 200:
                    return
            time.sleep(0.2)
        raise AssertionError(f"the server did not answer:\n{self.log()}")

    def stop(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(30)


def wait_for(condition: Any, what: str, server: Server, seconds: float = WAIT_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen:\n{server.log()}")
        time.sleep(0.1)


@pytest.fixture
def project(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "project"
    root.mkdir()
    config = {"dependencies": ["."], "graphs": {"agent": f"{GRAPH}:agent"}}
    (root / "langgraph.json").write_text(json.dumps(config))
    yield root


async def afinished(url: str, thread_id: str) -> tuple[str, list[str]]:
    """Wait until the thread's runs are done (the server re-runs the killed one by
    itself); its last message and the runs' statuses."""
    from langgraph_sdk import get_client

    client = get_client(url=url)
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        runs = await client.runs.list(thread_id)
        statuses = [r["status"] for r in runs]
        if runs and all(s not in ("pending", "running") for s in statuses):
            break
        assert time.monotonic() < deadline, f"the thread's runs never finished: {statuses}"
        await asyncio.sleep(0.5)
    state = await client.threads.get_state(thread_id)
    return str(state["values"]["messages"][-1]["content"]), statuses


async def astart_run(url: str) -> str:
    from langgraph_sdk import get_client

    client = get_client(url=url)
    thread = await client.threads.create()
    message = {"role": "user", "content": "pay inv-1 inv-2"}
    await client.runs.create(thread["thread_id"], "agent", input={"messages": [message]})
    return str(thread["thread_id"])


@pytest.mark.parametrize(
    ("mode", "ledger_backend"), [("ours", "sqlite"), ("ours", "postgres"), ("stock", None)]
)
def test_killed_server_reruns_the_run_beside_its_own_persistence(
    project: Path, request: pytest.FixtureRequest, mode: str, ledger_backend: str | None
) -> None:
    ledger = str(project / "ledger.db")
    if ledger_backend == "postgres":
        ledger = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANGGRAPH_")}
    env.update(OFFLINE_ENV)
    env.update(
        LEDGER_BESIDE_WORK=str(project), LEDGER_BESIDE_MODE=mode, LEDGER_BESIDE_LEDGER=ledger
    )
    server = Server(project, env)
    try:
        server.start()
        thread_id = asyncio.run(astart_run(server.url))
        wait_for((project / "parked").exists, "the first charge", server)
        parked_at = time.time()
        ops = project / ".langgraph_api" / ".langgraph_ops.pckl"
        wait_for(
            lambda: ops.exists() and ops.stat().st_mtime > parked_at,
            "the server's save of its runs",
            server,
            seconds=40,
        )
        (project / "kill").write_text("")
        assert server.proc.wait(60) == -signal.SIGKILL, "killed from inside the tool"
        server.start()
        last, statuses = asyncio.run(afinished(server.url, thread_id))
        restarted = (project / "server-2.log").read_text(errors="replace")
        assert "Retrying runs left running" in restarted, "the server re-ran it by itself"
    finally:
        server.stop()
    charges = Counter((project / "effects").read_text().split())
    if mode == "ours":
        assert dict(charges) == {"inv-1": 1, "inv-2": 1}, "each invoice charged once"
        assert last == "done: charged inv-1; charged inv-2" and statuses == ["success"]
    else:
        assert charges["inv-1"] == 2, f"the control charges the killed call again: {charges}"
    assert all(not _group_alive(p.pid) for p in server.procs), "nothing left running"


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
