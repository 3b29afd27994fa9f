"""``idempotent_task``: the Functional API's ``@task`` with the ledger - in process on both
backends, and with real crashes (``tests/task_crash_worker.py``, on SQLite and at every
crash point on Postgres) against the stock ``@task`` as the control."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest
import zygote
from langgraph.func import entrypoint
from langgraph.types import Command, RetryPolicy
from pg_server import fresh_dsn
from tool_node_helpers import Counter, cfg

from langgraph_idem_saver import NOT_APPLIED, CallStatus, ConfigError
from langgraph_idem_saver.task import RecordedFailureError, idempotent_task

WORKER = Path(__file__).resolve().parent / "task_crash_worker.py"


async def test_sequence_runs_once_and_replays_on_the_same_thread(saver: Any) -> None:
    fx = Counter()

    @idempotent_task
    async def charge(invoice: str, amount: int = 10) -> str:
        fx.bump(invoice)
        return f"charged {invoice} {amount}"

    @entrypoint(checkpointer=saver)
    async def pay(invoices: list[str]) -> list[str]:
        return [await charge(inv) for inv in invoices]

    assert await pay.ainvoke(["a", "b"], cfg("t")) == ["charged a 10", "charged b 10"]
    assert await pay.ainvoke(["a", "b"], cfg("t")) == ["charged a 10", "charged b 10"]
    assert fx.calls == ["a", "b"]  # the same task and arguments in a thread: one call
    assert charge.counters.replayed == 2
    entries = await saver.alist_entries("t")
    assert [e.tool_name for e in entries] == ["charge", "charge"]
    assert {e.status for e in entries} == {CallStatus.COMPLETED}


async def test_parallel_futures_and_a_sync_task(saver: Any) -> None:
    fx = Counter()

    @idempotent_task(name="notify")
    def notify(user: str) -> str:
        fx.bump(user)
        return f"notified {user}"

    @entrypoint(checkpointer=saver)
    def run(users: list[str]) -> list[str]:
        futures = [notify(u) for u in users]
        return [f.result() for f in futures]

    out = await asyncio.to_thread(run.invoke, ["x", "y", "z"], cfg("t"))
    assert out == ["notified x", "notified y", "notified z"] and sorted(fx.calls) == ["x", "y", "z"]
    out = await asyncio.to_thread(run.invoke, ["x", "y", "z"], cfg("t"))
    assert len(fx) == 3


async def test_raised_after_effect_is_verified_not_rerun(saver: Any) -> None:
    fx = Counter()
    asked: list[Any] = []

    def landed(args: dict[str, Any]) -> Any:
        asked.append(args)
        return f"charged {args['invoice']} (found)" if args["invoice"] in fx.calls else NOT_APPLIED

    @idempotent_task(verify=landed, retry_policy=RetryPolicy(initial_interval=0.01, jitter=False))
    async def charge(invoice: str) -> str:
        fx.bump(invoice)
        if len(fx) == 1:
            raise ConnectionResetError("reply lost")  # retried by the default retry_on
        return f"charged {invoice}"

    @entrypoint(checkpointer=saver)
    async def pay(invoice: str) -> str:
        return await charge(invoice)

    assert await pay.ainvoke("a", cfg("t")) == "charged a (found)"
    assert fx.calls == ["a"] and len(asked) == 1


async def test_unknown_outcome_asks_a_human_and_failed_answers_are_raised(saver: Any) -> None:
    fx = Counter()

    @idempotent_task
    async def charge(invoice: str) -> str:
        fx.bump(invoice)
        raise ConnectionResetError("reply lost")

    @entrypoint(checkpointer=saver)
    async def pay(invoice: str) -> str:
        try:
            return await charge(invoice)
        except RecordedFailureError as exc:
            return f"failed: {exc}"

    with pytest.raises(ConnectionResetError):
        await pay.ainvoke("a", cfg("t"))
    out = await pay.ainvoke(None, cfg("t"))  # the retry
    [question] = (
        out["__interrupt__"]
        if isinstance(out, dict)
        else (await pay.aget_state(cfg("t"))).interrupts
    )
    assert question.value["tool"] == "charge" and question.value["args"] == {"invoice": "a"}
    out = await pay.ainvoke(Command(resume={"action": "failed", "error": "declined"}), cfg("t"))
    assert "declined" in out and len(fx) == 1


def test_tool_call_key_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="no model tool call id"):
        idempotent_task(key_policy="tool_call")(lambda x: x)


# --- real crashes --------------------------------------------------------------------------


def run_worker(
    tmp: Path, mode: str, durability: str, crash: str, shape: str, db: str | None = None
) -> subprocess.CompletedProcess[str]:
    cmd = [
        sys.executable,
        str(WORKER),
        db or str(tmp / "wf.db"),
        str(tmp / "fx"),
        "t",
        mode,
        durability,
        crash,
        shape,
    ]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return zygote.run(cmd, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("durability", ["sync", "async", "exit"])
@pytest.mark.parametrize(
    ("crash", "shape"),
    [("after_effect", "sequence"), ("between_tasks", "sequence"), ("after_effect", "parallel")],
)
def test_crash_and_resume_each_effect_once(
    tmp_path: Path, durability: str, crash: str, shape: str
) -> None:
    died = run_worker(tmp_path, "ours", durability, crash, shape)
    assert died.returncode == 137, died.stderr[-2000:]
    resumed = run_worker(tmp_path, "ours", durability, "none", shape)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-a": 1, "inv-b": 1}
    assert json.loads(resumed.stdout) == ["charged inv-a", "charged inv-b"]


@pytest.mark.parametrize(
    ("crash", "shape", "durability"),
    [
        ("after_effect", "sequence", "sync"),
        ("between_tasks", "sequence", "exit"),
        ("after_effect", "parallel", "async"),
    ],
)
def test_crash_and_resume_on_postgres_each_effect_once(
    tmp_path: Path, pg_server_dsn: str, crash: str, shape: str, durability: str
) -> None:
    """Every crash point of the worker, with the checkpoints and the ledger on a real
    PostgreSQL server (a fresh schema each)."""
    db = fresh_dsn(pg_server_dsn)
    died = run_worker(tmp_path, "ours", durability, crash, shape, db)
    assert died.returncode == 137, died.stderr[-2000:]
    resumed = run_worker(tmp_path, "ours", durability, "none", shape, db)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert Tally((tmp_path / "fx").read_text().splitlines()) == {"inv-a": 1, "inv-b": 1}
    assert json.loads(resumed.stdout) == ["charged inv-a", "charged inv-b"]


def test_the_stock_task_repeats_the_effect_in_the_same_harness(tmp_path: Path) -> None:
    """The control: plain ``@task`` re-runs the crashed task's effect on resume."""
    assert run_worker(tmp_path, "stock", "sync", "after_effect", "sequence").returncode == 137
    assert run_worker(tmp_path, "stock", "sync", "none", "sequence").returncode == 0
    assert Tally((tmp_path / "fx").read_text().splitlines())["inv-a"] == 2
