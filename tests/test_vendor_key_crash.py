"""Exactly once with neither ``verify`` nor a human: ``on_unknown="rerun"`` plus the
ledger's key sent to a vendor that dedupes by it.

A real child process (``tests/vendor_crash_worker.py``) charges a fake vendor running in
its own process (``tests/fake_vendor.py``, Stripe-shaped: ``Idempotency-Key``) and is
SIGKILLed right after the vendor took the charge and before the ledger recorded
``completed``. A fresh process resumes the thread: the unknown outcome is re-run
(the policy), the tool sends the same ``current_call().key``, the vendor answers with the
first charge. One charge, no interrupt, no verify hook. The control sends a new key per
attempt (what a tool without the ledger's key would do): the same crash charges twice, so
the harness can see a duplicate. Every front door on SQLite; the tool node on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zygote
from fake_vendor import Vendor
from pg_server import fresh_dsn

from langgraph_idem_saver import AsyncPostgresSaver, AsyncSqliteSaver, CallStatus
from langgraph_idem_saver.call_context import vendor_key

HERE = Path(__file__).resolve().parent
WORKER = HERE / "vendor_crash_worker.py"
ENV = {**os.environ, "PYTHONPATH": f"{HERE.parent}{os.pathsep}{HERE}"}


@pytest.fixture
def vendor_url(tmp_path: Path) -> Iterator[str]:
    """The fake vendor's URL; its process is stopped when the test ends, however it ends."""
    port_file = tmp_path / "vendor.port"
    server = subprocess.Popen(
        [sys.executable, str(HERE / "fake_vendor.py"), str(port_file)],
        env=ENV,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while not port_file.exists():
            assert server.poll() is None, server.stderr.read() if server.stderr else ""
            assert time.monotonic() < deadline, "the fake vendor did not start"
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text()}"
    finally:
        server.kill()
        server.wait(timeout=30)
        if server.stderr is not None:
            server.stderr.close()


def run_worker(
    door: str, db: str, url: str, crash: str, keying: str
) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, str(WORKER), door, db, url, "t", crash, keying]
    return zygote.run(cmd, env=ENV, capture_output=True, text=True, timeout=180)


async def tool_entries(db: str) -> list[Any]:
    postgres = db.startswith(("postgresql:", "postgres:")) or "dbname=" in db
    opener: Any = AsyncPostgresSaver if postgres else AsyncSqliteSaver
    async with opener.from_conn_string(db) as saver:
        entries = await saver.alist_entries("t")
    return [e for e in entries if e.tool_name != "__model__"]


def crash_and_resume(door: str, db: str, url: str, keying: str) -> dict[str, Any]:
    """The crashed run and the resume; what the vendor and the resume saw."""
    crashed = run_worker(door, db, url, "after_vendor", keying)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr[-3000:]
    after_crash = Vendor(url).charges.list()
    assert len(after_crash["charges"]) == 1  # the vendor took the charge before the crash
    resumed = run_worker(door, db, url, "none", keying)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    return {"out": json.loads(resumed.stdout.splitlines()[-1]), **Vendor(url).charges.list()}


def assert_exactly_once(door: str, db: str, seen: dict[str, Any]) -> None:
    [charge] = seen["charges"]
    [first, rerun] = seen["requests"]
    assert first["key"] == rerun["key"] == charge["idempotency_key"]
    assert seen["out"]["interrupts"] == 0 and seen["out"]["next"] == []
    assert f"{charge['id']} for inv-1" in seen["out"]["answer"]  # the first charge, answered
    [entry] = asyncio.run(tool_entries(db))
    assert entry.status is CallStatus.COMPLETED and entry.attempts == 2  # re-run, no verify
    assert first["key"] == vendor_key(entry.scope, entry.key)


@pytest.mark.parametrize("door", ["node", "agent", "task"])
def test_sqlite_rerun_with_the_ledger_key_charges_once(
    door: str, vendor_url: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "agent.sqlite")
    assert_exactly_once(door, db, crash_and_resume(door, db, vendor_url, "ledger"))


@pytest.mark.parametrize("door", ["node", "agent", "task"])
def test_sqlite_control_a_new_key_per_attempt_charges_twice(
    door: str, vendor_url: str, tmp_path: Path
) -> None:
    db = str(tmp_path / "agent.sqlite")
    seen = crash_and_resume(door, db, vendor_url, "random")
    assert [c["invoice"] for c in seen["charges"]] == ["inv-1", "inv-1"]  # the duplicate
    assert seen["out"]["interrupts"] == 0


@pytest.mark.parametrize("door", ["node", "agent", "task"])
def test_postgres_rerun_with_the_ledger_key_charges_once(
    door: str, vendor_url: str, pg_server_dsn: str
) -> None:
    db = fresh_dsn(pg_server_dsn)
    assert_exactly_once(door, db, crash_and_resume(door, db, vendor_url, "ledger"))


def test_postgres_control_charges_twice(vendor_url: str, pg_server_dsn: str) -> None:
    db = fresh_dsn(pg_server_dsn)
    seen = crash_and_resume("node", db, vendor_url, "random")
    assert len(seen["charges"]) == 2
