"""Several processes resume one crashed thread at the same time, on one SQLite file.

A child process dies in the middle of a tools step that charges three invoices (in one
parallel batch); then 2 - and, separately, 8 - fresh OS processes resume the thread at
the same moment (they meet at a barrier after opening their savers, so their graph runs
really overlap). The ``charge`` tool has a ``verify`` hook, so unknown outcomes are
settled by asking the "vendor" (the effects file), never by a human.

What must hold:

* every invoice is charged exactly once in total, whatever the interleaving;
* every resumer either finishes or fails with an error that says "someone else is on it,
  retry" - see :data:`ACCEPTABLE_ERRORS`;
* one more, ordinary resume brings the thread to the same final messages as a run that
  never crashed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import zygote
from resume_worker import (
    CRASH_EXIT_CODE,
    FAILED_EXIT_CODE,
    WORKER,
    effects_lines,
    uncrashed_run,
)

INVOICES = ["inv-0", "inv-1", "inv-2"]
PAY = "pay invoices " + " ".join(INVOICES)

ACCEPTABLE_ERRORS = frozenset({"ToolCallInProgress", "DatabaseLockedError"})
"""Errors a concurrent resumer may end with, and why each is fine:

* ``ToolCallInProgress`` - another live process holds (or just took over) the claim on a
  call of this step; it is the node's documented "retry later" signal. Nothing ran twice
  and the step's unstarted claims were released, so a later resume settles the call.
* ``DatabaseLockedError`` - SQLite's write lock stayed busy past ``busy_timeout`` while
  eight processes committed; retryable by contract, nothing was written by that call.

LangGraph itself raises no concurrent-update error here: its checkpointer contract has no
compare-and-swap, so two resumers simply write sibling checkpoints (each one a consistent
branch) and the newest is the thread's head. Anything else - ``UnknownToolOutcome``,
``IdempotencyConflict``, ``LedgerStateError``, a crash - fails the test: those would mean
the ledger lost track of a call.
"""


def spawn(scenario: dict[str, Any], worker: Path = WORKER) -> subprocess.Popen[str]:
    return zygote.Popen(
        [sys.executable, str(worker), json.dumps(scenario)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def collect(proc: subprocess.Popen[str]) -> tuple[int, dict[str, Any] | None, str]:
    out, err = proc.communicate(timeout=120)
    lines = out.strip().splitlines()
    payload = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    return proc.returncode, payload, err[-3000:]


def run_child(scenario: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str]:
    return collect(spawn(scenario))


@cache
def baseline(tmp: str) -> list[Any]:
    """The final messages of an uncrashed run (in this process: it is only a reference)."""
    base = Path(tmp) / "concurrent-baseline"
    messages = uncrashed_run(base, [PAY])
    assert effects_lines(base / "effects") == INVOICES
    return messages


def resume_together(tmp_path: Path, scenario: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Start ``n`` resumers that meet at a barrier; return their payloads."""
    barrier = {"dir": str(tmp_path / f"barrier-{n}"), "n": n}
    procs = [spawn({**scenario, "phase": "resume", "barrier": barrier}) for _ in range(n)]
    payloads = []
    for proc in procs:
        code, payload, err = collect(proc)
        assert payload is not None, f"resumer died without a report (exit {code}): {err}"
        assert code in (0, FAILED_EXIT_CODE), err
        payloads.append(payload)
    return payloads


@pytest.mark.parametrize(
    ("crash_at", "n_resumers"),
    [("after_effect", 2), ("after_issued", 2), ("after_effect", 8), ("after_issued", 8)],
)
def test_concurrent_resumers_charge_each_invoice_exactly_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, crash_at: str, n_resumers: int
) -> None:
    scenario: dict[str, Any] = {
        "db": str(tmp_path / "a.db"),
        "effects": str(tmp_path / "effects"),
        "inputs": [PAY],
        "crash_at": crash_at,
        "crash_invoice": "inv-1",
    }
    code, _, err = run_child({**scenario, "phase": "run"})
    assert code == CRASH_EXIT_CODE, f"the child should have died {crash_at} inv-1: {err}"
    charged_before = Counter(effects_lines(tmp_path / "effects"))
    assert charged_before["inv-1"] == (1 if crash_at == "after_effect" else 0)

    payloads = resume_together(tmp_path, scenario, n_resumers)

    failures = [p for p in payloads if not p["ok"]]
    for p in failures:
        assert p["error"] in ACCEPTABLE_ERRORS, f"unacceptable failure: {p['traceback']}"
    ref = baseline(str(tmp_path_factory.getbasetemp()))
    for p in payloads:
        if p["ok"]:
            assert p["messages"] == ref, "a resumer that finished saw a consistent conversation"
    assert Counter(effects_lines(tmp_path / "effects")) == dict.fromkeys(INVOICES, 1), (
        "each invoice charged exactly once across the crash and all concurrent resumers"
    )

    # an ordinary restart afterwards (a fresh process) finishes whatever is left
    code, final, err = run_child({**scenario, "phase": "resume"})
    assert code == 0 and final is not None and final["ok"], err
    assert final["messages"] == ref, "same final conversation as an uncrashed run"
    assert Counter(effects_lines(tmp_path / "effects")) == dict.fromkeys(INVOICES, 1)
    assert sorted(status for _, status, _ in final["ledger"]) == ["completed"] * 3


def test_slow_tool_two_processes_one_runs_the_other_waits_and_replays(tmp_path: Path) -> None:
    """Two processes start the same fresh tools step while the tool takes seconds.

    The first to commit its claim runs the tool; the other finds a live claim, waits for
    it (``wait_seconds`` > the tool's duration) and replays the recorded result.
    """
    scenario: dict[str, Any] = {
        "db": str(tmp_path / "a.db"),
        "effects": str(tmp_path / "effects"),
        "inputs": ["pay invoices slow-1"],
        "slow": 2.5,
        "wait_seconds": 30,
    }
    code, prepared, err = run_child({**scenario, "phase": "prepare"})
    assert code == 0 and prepared is not None, err
    assert prepared["ledger"] == [], "the tools step has not started yet"

    payloads = resume_together(tmp_path, scenario, 2)

    assert all(p["ok"] for p in payloads), [p.get("traceback") for p in payloads]
    assert effects_lines(tmp_path / "effects") == ["slow-1"], "the slow tool ran once"
    work = sorted((p["counters"]["executed"], p["counters"]["replayed"]) for p in payloads)
    assert work == [(0, 1), (1, 0)], "one process ran the call, the other replayed it"
    tool_results = [[m for m in p["messages"] if m[0] == "tool"] for p in payloads]
    assert (
        tool_results[0] == tool_results[1] == [["tool", "charge", "charged slow-1 $10", "success"]]
    )
    assert payloads[0]["messages"] == payloads[1]["messages"]
