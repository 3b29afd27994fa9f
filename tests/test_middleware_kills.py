"""SIGKILL at each point of a call, for the middleware pairs where order matters.

``IdempotencyMiddleware`` with ``HumanInTheLoopMiddleware`` (batched and per call) and with
``ToolRetryMiddleware``, in both orders: a child process (``middleware_crash_worker.py``)
starts the thread, answers the review and kills itself with SIGKILL before a charge's
effect, after it, or after every tool returned; a fresh process finishes the thread, a
careful human answering each unknown-outcome question from the effects file. Every
effect lands once, with the arguments that ran, or the order is refused before anything
runs. The stock agent in the same harness is the control that shows the duplicate.

Children of one test run in parallel (three at a time), each on its own database.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections import Counter as Tally
from pathlib import Path
from typing import Any

import pytest
import zygote
from pg_server import fresh_dsn

WORKER = Path(__file__).resolve().parent / "middleware_crash_worker.py"
POINTS = ["before_effect", "after_effect", "after_tool"]
KILLED = -signal.SIGKILL

# every SQLite case, run in two processes: one that dies at each case's point, one resume
CASES = [
    *[("batched", o, p) for o in ("ledger_first", "other_first") for p in POINTS],
    *[("per_call", "other_first", p) for p in POINTS],
    ("per_call", "ledger_first", "after_effect"),
    *[("retry", "other_first", p) for p in POINTS],
    ("retry", "ledger_first", "after_tool"),
    ("batched", "stock", "after_effect"),
    ("retry", "stock", "after_tool"),
]


def worker(phase: str, cases: dict[str, list[str]]) -> Any:
    cmd = [sys.executable, str(WORKER), phase, json.dumps(cases)]
    return zygote.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)


def printed(done: Any) -> dict[str, Any]:
    lines = done.stdout.strip().splitlines()
    assert lines, (done.returncode, done.stderr[-3000:])
    return dict(json.loads(lines[-1]))


class Runs:
    """The crash run's and the resume run's reports, per case name."""

    def __init__(self, tmp: Path, cases: list[tuple[str, str, str]], dbs: dict[str, str]) -> None:
        self.tmp = tmp
        specs: dict[str, list[str]] = {}
        for case in cases:
            name = "-".join(case)
            (tmp / name).mkdir()
            db = dbs.get(name) or str(tmp / name / "agent.db")
            specs[name] = [db, str(tmp / name / "fx"), *case]
        self.crash = worker("crash", specs)
        self.crashed = printed(self.crash)
        self.resume = worker("resume", specs)
        assert self.resume.returncode == 0, self.resume.stderr[-3000:]
        self.resumed = printed(self.resume)["finished"]

    def effects(self, name: str) -> dict[str, int]:
        path = self.tmp / name / "fx"
        return dict(Tally(path.read_text().splitlines())) if path.exists() else {}

    def killed(self, name: str) -> bool:
        return self.crash.returncode == KILLED and name in self.crashed["stopped"]

    def refused(self, name: str) -> str:
        return str(self.crashed["finished"][name].get("refused", ""))

    def report(self, name: str) -> dict[str, Any]:
        found = self.resumed[name]
        assert "error" not in found, found
        return dict(found)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    return Runs(tmp_path_factory.mktemp("kills"), CASES, {})


def test_batched_review_with_an_edit_survives_a_kill_at_each_point(runs: Runs) -> None:
    """Approve inv-1, edit inv-2 from 20 to 25, reject inv-3; killed before/after the 25
    charge or after the tools, in both orders. Each charge once, inv-2 at 25; the
    unknown-outcome payload shows 25 (listed first, the ledger used to show 20, and a
    careful human's ``rerun`` charged 25 twice); the entry's history shows the edit."""
    for order in ("ledger_first", "other_first"):
        for point in POINTS:
            case = f"batched-{order}-{point}"
            assert runs.killed(case), case
            seen = runs.report(case)
            assert runs.effects(case) == {"inv-1 10": 1, "inv-2 25": 1}, case
            assert all(a["invoice"] != "inv-2" or a["amount"] == 25 for a in seen["seen"]), case
            if point != "after_tool":
                assert {"invoice": "inv-2", "amount": 25} in seen["seen"], case  # asked: 25
            entries = {e["args"]["invoice"]: e for e in seen["entries"]}
            assert entries["inv-2"]["args"]["amount"] == 25 and "inv-3" not in entries, case
            assert {e["status"] for e in entries.values()} == {"completed"}, case
            edits = [e for e in entries["inv-2"]["events"] if e["action"] == "edited"]
            assert edits and all(
                e["model_args"]["amount"] == 20 and e["args"]["amount"] == 25 for e in edits
            ), case
            assert "not this one" in seen["tools"]["call_3"], case
            assert seen["reviewed"] == [], case  # the batched review was saved with its step


def test_per_call_review_survives_a_kill_at_each_point_or_is_refused(runs: Runs) -> None:
    """Review listed first: approved, killed at each point; our question takes the next
    answer position and the reviewer's approval keeps its own (listed the other way, the
    approval used to receive our answer: a ValidationError on every retry, the charge
    never made). Listed after ours: refused at the first call, nothing charged."""
    for point in POINTS:
        case = f"per_call-other_first-{point}"
        assert runs.killed(case), case
        seen = runs.report(case)
        assert runs.effects(case) == {"inv-1 10": 1}, case
        [entry] = seen["entries"]
        assert entry["status"] == "completed", case
        asked = [] if point == "after_tool" else [{"invoice": "inv-1", "amount": 10}]
        assert seen["seen"] == asked, case
        # an approval given in the task the kill ended died with it: asked again
        assert seen["reviewed"] == ([] if point == "after_tool" else ["call_1"]), case
    case = "per_call-ledger_first-after_effect"
    assert "List it before: middleware=[HumanInTheLoopMiddleware" in runs.refused(case)
    assert runs.effects(case) == {} and runs.report(case)["entries"] == []


def test_tool_retry_outside_ours_survives_a_kill_at_each_point_inside_is_refused(
    runs: Runs,
) -> None:
    """The charge raises once after its effect. ToolRetry listed first: the retry is the
    call's next attempt, verify finds the charge: charged once whatever point the process
    died at. Listed after ours it would re-run the tool within one claim: refused."""
    for point in POINTS:
        case = f"retry-other_first-{point}"
        assert runs.killed(case), case
        seen = runs.report(case)
        assert runs.effects(case) == {"inv-1 10": 1}, case
        [entry] = seen["entries"]
        assert entry["status"] == "completed", case
        assert seen["tools"]["call_1"] == "charged inv-1 10 (verified)", case
    case = "retry-ledger_first-after_tool"
    assert "List it before: middleware=[ToolRetryMiddleware" in runs.refused(case)
    assert runs.effects(case) == {}


def test_the_stock_agent_charges_twice_in_the_same_harness(runs: Runs) -> None:
    """The control: without the ledger, the same kills charge again on resume (the edited
    25, and the retried charge whose reply was lost)."""
    assert runs.killed("batched-stock-after_effect") and runs.killed("retry-stock-after_tool")
    assert runs.effects("batched-stock-after_effect") == {"inv-1 10": 1, "inv-2 25": 2}
    assert runs.effects("retry-stock-after_tool") == {"inv-1 10": 2}


def test_batched_edit_killed_after_the_effect_on_postgres(
    tmp_path: Path, pg_server_dsn: str
) -> None:
    case = ("batched", "ledger_first", "after_effect")
    name = "-".join(case)
    pg = Runs(tmp_path, [case], {name: fresh_dsn(pg_server_dsn)})
    assert pg.killed(name), (pg.crash.returncode, pg.crashed, pg.crash.stderr[-2000:])
    assert pg.effects(name) == {"inv-1 10": 1, "inv-2 25": 1}
    assert {"invoice": "inv-2", "amount": 25} in pg.report(name)["seen"]
