"""``IdempotencyMiddleware`` crashed at every crash point, on a real PostgreSQL server.

``tests/test_middleware.py`` kills ``tests/agent_crash_worker.py`` (a ``create_agent``
agent with the middleware) at each of its crash points on SQLite, and on Postgres right
after a tool's effect (durability ``sync`` and ``exit``). These are the worker's other
crash points on Postgres, each in a fresh schema: inside the tool before its effect, in
the model call after every tool returned, and in the saver as it starts the checkpoint
after the tools (their writes saved, that checkpoint lost). Each invoice is charged once,
the resumed agent ends as an uncrashed one, and the ledger holds each call, completed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import zygote
from pg_server import fresh_dsn

WORKER = Path(__file__).resolve().parent / "agent_crash_worker.py"
CRASH_EXIT_CODE = 137


def run_worker(
    tmp: Path, db: str, durability: str, crash: str, calls: int
) -> subprocess.CompletedProcess[str]:
    """One process of the agent on ``db``'s thread ``t``: crashing, or to the end."""
    cmd = [sys.executable, str(WORKER), db, str(tmp / "fx"), "t", "ours", durability, crash]
    env = {**os.environ, "CALLS": str(calls)}
    return zygote.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    ("crash", "durability", "calls"),
    [
        ("before_effect", "sync", 3),
        ("after_tools", "async", 3),
        ("checkpoint_lost", "sync", 3),
    ],
)
def test_crash_and_resume_on_postgres_charges_each_invoice_once(
    tmp_path: Path, pg_server_dsn: str, crash: str, durability: str, calls: int
) -> None:
    db = fresh_dsn(pg_server_dsn)
    died = run_worker(tmp_path, db, durability, crash, calls)
    assert died.returncode == CRASH_EXIT_CODE, died.stderr[-2000:]
    resumed = run_worker(tmp_path, db, durability, "none", calls)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    effects = Counter((tmp_path / "fx").read_text().splitlines())
    assert effects == dict.fromkeys([f"inv-{i + 1}" for i in range(calls)], 1)
    assert json.loads(resumed.stdout)[-1] == "all charged"
    charges = asyncio.run(charges_in_ledger(db))
    assert charges == dict.fromkeys(effects, "completed"), "every call recorded, settled"


async def charges_in_ledger(db: str) -> dict[str, str]:
    """``{invoice: status}`` of the thread's ``charge`` entries (the latest per invoice)."""
    from langgraph_idem_saver import AsyncPostgresSaver

    async with AsyncPostgresSaver.from_conn_string(db) as saver:
        entries = await saver.alist_entries("t")
    return {
        json.loads(e.args)["invoice"]: e.status.value for e in entries if e.tool_name == "charge"
    }
