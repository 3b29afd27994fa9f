"""Recorded model responses across real crashes: the process dies inside a tool, after the
model's message was produced, and a fresh process resumes the thread.

With the model's answer recorded (``IdempotencyMiddleware`` for ``create_agent``,
``durable_model`` in a hand-written ``StateGraph`` with ``IdempotentToolNode``) the resume
asks the model zero more times for that step, whatever the durability: the same tool-call
ids come back, every effect happened once, the tool ledger replays by key (no adoption,
no question). The control - the same stack with ``record_model=False`` / the bare model -
asks the model again under durability ``"exit"``, gets new ids and needs adoption: the
harness sees the re-asked model. A different input at the same position (nothing was
saved, the user sends something else) is answered by the model.

Model calls are counted across processes in a file (``tests/durable_model_worker.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import zygote

WORKER = Path(__file__).resolve().parent / "durable_model_worker.py"
CRASH_EXIT_CODE = 137
TEXT = "pay inv-1 inv-2"


def run(scenario: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    return zygote.run(
        [sys.executable, str(WORKER), json.dumps(scenario)],
        capture_output=True,
        text=True,
        timeout=180,
    )


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def crash_then_resume(
    tmp: Path, db: str, front: str, record: bool, durability: str, **resume: Any
) -> dict[str, Any]:
    """One thread: a run that dies in a tool, then a fresh process that resumes it (with
    ``resume``'s changes to the scenario). Returns what the resume printed, plus the
    model calls and effects of each phase."""
    scenario = {
        "db": db,
        "effects": str(tmp / "effects"),
        "calls": str(tmp / "calls"),
        "thread": "t",
        "front": front,
        "record": record,
        "durability": durability,
        "text": TEXT,
        "crash": True,
    }
    crashed = run(scenario)
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    calls_before = lines(tmp / "calls")
    effects_before = lines(tmp / "effects")
    resumed = run({**scenario, "crash": False, **resume})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    out: dict[str, Any] = json.loads(resumed.stdout.strip().splitlines()[-1])
    out["calls_before"] = calls_before
    out["calls_after"] = lines(tmp / "calls")[len(calls_before) :]
    out["effects_before"] = effects_before
    out["effects"] = lines(tmp / "effects")
    return out


def database(backend: str, tmp: Path, request: pytest.FixtureRequest) -> str:
    if backend == "sqlite":
        return str(tmp / "db.sqlite")
    from pg_server import fresh_dsn

    return fresh_dsn(request.getfixturevalue("pg_server_dsn"))


def assert_replayed(out: dict[str, Any]) -> None:
    """The resume asked the model only for the step after the tools (its final answer),
    every tool call kept the id the crashed run's effects carry, each effect landed once,
    and nothing was adopted or asked."""
    assert out["calls_before"] == ["calls"]  # the crashed run: one answer, with the calls
    assert out["calls_after"] == ["answer"]  # zero more calls for the recorded step
    effect_ids = {line.split()[1] for line in out["effects"]}
    assert sorted(line.split()[0] for line in out["effects"]) == ["inv-1", "inv-2"]
    assert set(out["call_ids"]) == set(out["answered_ids"])
    assert effect_ids <= set(out["call_ids"])  # the ids the effects ran under came back
    assert len(out["call_ids"]) == 2
    assert out["adopted"] == 0 and out["adopted_entries"] == []
    assert out["interrupted"] is False
    assert out["usage"] == [{"input_tokens": 11, "output_tokens": 7, "total_tokens": 18}]
    assert out["contents"][-1] == "done: 2"
    assert len(out["recorded"]) == 2  # the calls step and the answer step


# every durability on SQLite; on Postgres "exit" (the mode that loses the model's message)
# for both front doors, and the other two once each
MATRIX = [
    *[("sqlite", f, d) for f in ("agent", "graph") for d in ("sync", "async", "exit")],
    ("postgres", "agent", "exit"),
    ("postgres", "graph", "exit"),
    ("postgres", "agent", "sync"),
    ("postgres", "graph", "async"),
]


@pytest.mark.parametrize(("backend", "front", "durability"), MATRIX)
def test_recorded_model_step_is_not_asked_again(
    backend: str, front: str, durability: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db = database(backend, tmp_path, request)
    out = crash_then_resume(tmp_path, db, front, True, durability)
    assert_replayed(out)


@pytest.mark.parametrize(
    ("backend", "front"), [("sqlite", "agent"), ("sqlite", "graph"), ("postgres", "agent")]
)
def test_control_without_recording_asks_the_model_again(
    backend: str, front: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The stock model call under durability "exit": the lost step is asked again, with
    new ids, which only adoption maps back to the effects (the harness sees a re-ask)."""
    db = database(backend, tmp_path, request)
    out = crash_then_resume(tmp_path, db, front, False, "exit")
    assert out["calls_before"] == ["calls"]
    assert out["calls_after"] == ["calls", "answer"]  # asked again
    lost_ids = {line.split()[1] for line in out["effects_before"]}
    assert lost_ids and not lost_ids & set(out["call_ids"])  # new ids...
    assert out["adopted"] >= 1  # ...that the ledger had to pair with the lost ones
    assert sorted(line.split()[0] for line in out["effects"]) == ["inv-1", "inv-2"]
    assert out["recorded"] == []


@pytest.mark.parametrize(("backend", "front"), [("sqlite", "graph"), ("postgres", "agent")])
def test_a_different_input_at_the_same_position_is_answered_by_the_model(
    backend: str, front: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Under "exit" nothing of the crashed run was saved: the user sends something else
    at the same step, and the model answers it (the recorded answer is not for it); the
    answer is recorded beside the lost step's. (What the tool ledger then does with the
    lost step's unfinished calls is its fallback for lost messages, docs/guarantees.md.)"""
    db = database(backend, tmp_path, request)
    out = crash_then_resume(tmp_path, db, front, True, "exit", text="pay inv-3")
    assert out["calls_after"][:1] == ["calls"]  # the model was asked
    assert out["contents"][:2] == ["pay inv-3", ""]
    lost_ids = {line.split()[1] for line in out["effects_before"]}
    assert len(out["call_ids"]) == 1 and not lost_ids & set(out["call_ids"])
    assert len(out["recorded"]) >= 2  # the lost step's record stays, unused, beside it
