"""Real crashes: a child process dies at each ledger point; a fresh process resumes.

Every scenario runs ``tests/crash_harness.py`` twice as separate OS processes: the first
dies with ``os._exit`` at the point under test, the second resumes the thread. We then
count side effects (lines in a file the tool appends to) and compare the final
conversation with an uncrashed run of the same agent.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pg_server import fresh_dsn

HARNESS = Path(__file__).with_name("crash_harness.py")
CRASH_EXIT_CODE = 77
POINTS = ["before_issued", "after_issued", "after_effect", "after_completed", "after_node"]


def run_phase(scenario: dict[str, Any], phase: str) -> tuple[int, dict[str, Any] | None, str]:
    proc = subprocess.run(
        [sys.executable, str(HARNESS), json.dumps({**scenario, "phase": phase})],
        capture_output=True,
        text=True,
        timeout=120,
    )
    out = proc.stdout.strip().splitlines()
    payload = json.loads(out[-1]) if proc.returncode == 0 and out else None
    return proc.returncode, payload, proc.stderr[-3000:]


def effects_of(path: Path) -> Counter[str]:
    return Counter(path.read_text().split()) if path.exists() else Counter()


@cache
def baseline(version: str, n_calls: int, durability: str, tmp: str) -> dict[str, Any]:
    """An uncrashed run: what the resumed run must end up equal to."""
    base = Path(tmp) / f"baseline-{version}-{n_calls}-{durability}"
    base.mkdir(parents=True, exist_ok=True)
    scenario = {
        "db": str(base / "a.db"),
        "effects": str(base / "effects"),
        "version": version,
        "n_calls": n_calls,
        "durability": durability,
    }
    code, payload, err = run_phase(scenario, "run")
    assert code == 0, err
    assert payload is not None
    return payload


def crash_then_resume(tmp_path: Path, **scenario: Any) -> tuple[Counter[str], dict[str, Any]]:
    scenario = {"db": str(tmp_path / "a.db"), "effects": str(tmp_path / "effects"), **scenario}
    code, _, err = run_phase(scenario, "run")
    assert code == CRASH_EXIT_CODE, f"the child should have died at {scenario['crash_at']}: {err}"
    code, payload, err = run_phase(scenario, "resume")
    assert code == 0, err
    assert payload is not None
    return effects_of(Path(scenario["effects"])), payload


MATRIX = list(itertools.product(POINTS, [1, 3], ["v1", "v2"], ["sync", "async", "exit"]))


@pytest.mark.parametrize(("crash_at", "n_calls", "version", "durability"), MATRIX)
def test_crash_at_each_point_charges_exactly_once(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    crash_at: str,
    n_calls: int,
    version: str,
    durability: str,
) -> None:
    # the crash hits the last of the parallel calls, so the others are in flight or done
    crash_invoice = f"inv-{n_calls - 1}"
    effects, resumed = crash_then_resume(
        tmp_path,
        crash_at=crash_at,
        n_calls=n_calls,
        version=version,
        durability=durability,
        crash_invoice=crash_invoice,
    )
    expected = {f"inv-{i}": 1 for i in range(n_calls)}
    assert dict(effects) == expected, "every invoice charged exactly once across crash+resume"
    assert resumed["interrupts"] == [], "the verify hook settles unknown outcomes"
    assert all(status == "completed" for _, status, _, _ in resumed["ledger"])
    ref = baseline(version, n_calls, durability, str(tmp_path_factory.getbasetemp()))
    assert resumed["messages"] == ref["messages"], "final state equals an uncrashed run"


@pytest.mark.parametrize(("crash_at", "version"), list(itertools.product(POINTS, ["v1", "v2"])))
def test_on_postgres_each_point_charges_exactly_once(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pg_server_dsn: str,
    crash_at: str,
    version: str,
) -> None:
    """The same crashes, with the checkpoints and the ledger on a real PostgreSQL server
    (a fresh schema per scenario), three parallel calls, durability "sync"."""
    effects, resumed = crash_then_resume(
        tmp_path,
        crash_at=crash_at,
        n_calls=3,
        version=version,
        durability="sync",
        crash_invoice="inv-2",
        dsn=fresh_dsn(pg_server_dsn),
    )
    assert dict(effects) == {"inv-0": 1, "inv-1": 1, "inv-2": 1}
    assert resumed["interrupts"] == []
    assert all(status == "completed" for _, status, _, _ in resumed["ledger"])
    ref = baseline(version, 3, "sync", str(tmp_path_factory.getbasetemp()))
    assert resumed["messages"] == ref["messages"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_unknown_outcome_without_verify_asks_a_human_and_records_the_answer(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, version: str
) -> None:
    answer = {"action": "completed", "result": "charged inv-0 $10"}
    effects, resumed = crash_then_resume(
        tmp_path,
        crash_at="after_effect",
        n_calls=1,
        version=version,
        verify=False,
        answer=answer,
    )
    assert dict(effects) == {"inv-0": 1}, "the unknown call was not re-run"
    assert len(resumed["interrupts"]) == 1
    question = resumed["interrupts"][0]
    assert question["kind"] == "unknown_tool_outcome"
    assert question["tool"] == "charge"
    assert question["args"] == {"invoice": "inv-0", "amount": 10}
    assert resumed["ledger"] == [["charge", "completed", 1, 0]]
    ref = baseline(version, 1, "sync", str(tmp_path_factory.getbasetemp()))
    assert resumed["messages"] == ref["messages"]


def test_human_says_rerun_after_a_crash_before_the_effect(tmp_path: Path) -> None:
    effects, resumed = crash_then_resume(
        tmp_path, crash_at="after_issued", n_calls=1, verify=False, answer={"action": "rerun"}
    )
    assert dict(effects) == {"inv-0": 1}
    assert [i["kind"] for i in resumed["interrupts"]] == ["unknown_tool_outcome"]
    assert resumed["ledger"] == [["charge", "completed", 2, 0]], "a second attempt, recorded"


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_stock_tool_node_charges_twice(tmp_path: Path, version: str) -> None:
    """The problem this package exists for, measured on LangGraph's own ToolNode."""
    scenario = {
        "db": str(tmp_path / "a.db"),
        "effects": str(tmp_path / "effects"),
        "node": "stock",
        "crash_at": "after_node",
        "n_calls": 1,
        "version": version,
        "durability": "sync",
    }
    code, _, err = run_phase(scenario, "run")
    assert code == CRASH_EXIT_CODE, err
    code, _, err = run_phase(scenario, "resume")
    assert code == 0, err
    assert effects_of(tmp_path / "effects") == {"inv-0": 2}
