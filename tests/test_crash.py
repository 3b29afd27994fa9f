"""Real crashes: a child process dies at each ledger point; a fresh process resumes.

Every scenario runs ``tests/crash_harness.py`` twice as separate OS processes: the first
dies with ``os._exit`` at the point under test, the second resumes the thread. Between the
two the test reads the ledger as the crash left it; after the resume it checks, call by
call, what the protocol promises from that state (:func:`expected`):

* a call with no entry runs once (attempts 1, no replay);
* a call whose ``completed`` outcome was committed is replayed (replays + 1; none when
  LangGraph saved its task's writes and does not run that task again) and never runs
  again: ``verify`` is not asked about it and the tool's body does not start;
* a call left ``issued`` is an unknown outcome: ``verify`` is asked once (or, without a
  ``verify`` hook, a human once); it is re-run only when the answer says it did not
  happen (attempts + 1).

The tool's ``verify`` hook comes in three kinds, so that no answer can hide a lost
outcome: the truthful one (it reads the effects file the test counts), a liar that always
says "not applied" (a committed ``completed`` it were asked about would run twice), and
none (a human who sees only the interrupt's payload answers "completed": a lost outcome
would be one question too many). The tool's starts and ``verify``'s questions are counted
in witness files the agent never reads. Side effects are lines in a file the tool appends
to; the final conversation is compared with an uncrashed run of the same agent.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
import sys
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import zygote
from crash_harness import calls_of
from langchain_core.messages import ToolMessage
from pg_server import fresh_dsn

HARNESS = Path(__file__).with_name("crash_harness.py")
CRASH_EXIT_CODE = 77
POINTS = ["before_issued", "after_issued", "after_effect", "after_completed", "after_node"]
THREAD = "t1"


def run_phase(scenario: dict[str, Any], phase: str) -> tuple[int, dict[str, Any] | None, str]:
    proc = zygote.run(
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


def state_now(scenario: dict[str, Any]) -> tuple[dict[str, list[Any]], set[str]]:
    """What the crash left, read by this process through the saver between the two
    phases: the thread's ledger, ``{invoice: [status, attempts, replays]}``, and the
    invoices whose tool message LangGraph saved as a pending write of the latest
    checkpoint (a task it will not run again: its call is not even replayed)."""

    async def read(saver: Any) -> tuple[dict[str, list[Any]], set[str]]:
        calls = calls_of(await saver.alist_entries(THREAD))
        latest = await saver.aget_tuple({"configurable": {"thread_id": THREAD}})
        saved: set[str] = set()
        for _task, _channel, value in (latest.pending_writes or []) if latest else []:
            for message in value if isinstance(value, list) else [value]:
                if isinstance(message, ToolMessage):
                    saved.update(re.findall(r"inv-\d+", str(message.content)))
        return calls, saved

    async def open_and_read() -> tuple[dict[str, list[Any]], set[str]]:
        if scenario.get("dsn"):
            from langgraph_idem_saver.postgres import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(scenario["dsn"]) as pg:
                return await read(pg)
        from langgraph_idem_saver import AsyncSqliteSaver

        async with AsyncSqliteSaver.from_conn_string(scenario["db"]) as lite:
            return await read(lite)

    return asyncio.run(open_and_read())


class Crash:
    """One scenario's two phases and what the test saw between and after them."""

    def __init__(self, tmp_path: Path, **scenario: Any) -> None:
        self.scenario: dict[str, Any] = {
            "db": str(tmp_path / "a.db"),
            "effects": str(tmp_path / "effects"),
            "starts": str(tmp_path / "starts"),
            "asked": str(tmp_path / "asked"),
            "thread_id": THREAD,
            **scenario,
        }
        code, _, err = run_phase(self.scenario, "run")
        where = self.scenario.get("crash_at")
        assert code == CRASH_EXIT_CODE, f"the child should have died at {where}: {err}"
        self.at_crash, self.saved_at_crash = state_now(self.scenario)
        self.effects_at_crash = self.count("effects")
        self.starts_at_crash = self.count("starts")
        code, payload, err = run_phase(self.scenario, "resume")
        assert code == 0, err
        assert payload is not None
        self.resumed: dict[str, Any] = payload

    def count(self, witness: str) -> Counter[str]:
        return effects_of(Path(self.scenario[witness]))


def expected(crash: Crash, invoices: list[str], verify: str) -> dict[str, Any]:
    """What the protocol promises after the resume, from the ledger the crash left."""
    calls: dict[str, list[Any]] = {}
    effects: Counter[str] = Counter()
    asked: Counter[str] = Counter()
    starts = Counter(crash.starts_at_crash)
    for inv in invoices:
        landed = crash.effects_at_crash[inv]
        before = crash.at_crash.get(inv)
        if before is None:  # never claimed: it runs, once
            calls[inv] = ["completed", 1, 0]
            effects[inv], starts[inv] = 1, starts[inv] + 1
        elif before[0] == "completed":  # replayed, never run again, nobody asked
            # (unless LangGraph saved its task's writes: then it is not even replayed)
            replayed = inv not in crash.saved_at_crash
            calls[inv] = ["completed", before[1], before[2] + replayed]
            effects[inv] = landed
        else:  # issued: an unknown outcome, asked once
            assert before[0] == "issued", before
            asked[inv] = 1
            rerun = verify == "liar" or (verify == "truthful" and not landed)
            calls[inv] = ["completed", before[1] + rerun, before[2]]
            effects[inv] = landed + rerun
            starts[inv] += rerun
    return {"calls": calls, "effects": effects, "asked": asked, "starts": starts}


def check(crash: Crash, invoices: list[str], verify: str) -> None:
    """The resumed run against :func:`expected`, call by call."""
    want = expected(crash, invoices, verify)
    resumed = crash.resumed
    assert resumed["calls"] == want["calls"], (
        f"attempts and replays per call; the ledger at the crash was {crash.at_crash}"
    )
    assert crash.count("effects") == want["effects"], "side effects per invoice"
    assert crash.count("starts") == want["starts"], "a call's body starts once per attempt"
    questions = Counter(q["args"]["invoice"] for q in resumed["interrupts"])
    if verify == "absent":
        assert crash.count("asked") == Counter()
        assert questions == want["asked"], "a human is asked exactly about the unknown calls"
    else:
        assert crash.count("asked") == want["asked"], "verify is asked only about unknowns"
        assert questions == Counter(), "verify settles every unknown outcome"
    for inv, (_, attempts, _) in resumed["calls"].items():
        # a claim is an attempt even if the crash came before its body started, so count
        # from the crash: every attempt the resume made started the body once
        before = crash.at_crash.get(inv, [None, 0, 0])[1]
        started = crash.count("starts")[inv] - crash.starts_at_crash[inv]
        assert attempts - before == started, f"{inv}: one start per attempt since the crash"


def reached(crash: Crash, crash_at: str, crash_invoice: str) -> None:
    """The child died where the scenario names, in the ledger state that point means."""
    target = crash.at_crash.get(crash_invoice)
    if crash_at == "before_issued":
        assert crash.at_crash == {}
    elif crash_at in ("after_issued", "after_effect"):
        assert target is not None and target[0] == "issued"
        assert crash.effects_at_crash[crash_invoice] == (crash_at == "after_effect")
    else:  # after_completed / after_node: at least one outcome is committed
        assert any(status == "completed" for status, _, _ in crash.at_crash.values())


VERIFY_BY_DURABILITY = {"sync": "truthful", "async": "liar", "exit": "absent"}
"""Three parallel calls: the kind of ``verify`` per durability (a lone call: truthful)."""


def scenario_for(verify: str) -> dict[str, Any]:
    if verify == "liar":
        return {"verify": "liar"}
    if verify == "absent":
        return {"verify": False, "answer": "payload"}
    return {}


MATRIX = [
    (*cell, "truthful" if cell[1] == 1 else VERIFY_BY_DURABILITY[cell[3]])
    for cell in itertools.product(POINTS, [1, 3], ["v1", "v2"], ["sync", "async", "exit"])
]


@pytest.mark.parametrize(("crash_at", "n_calls", "version", "durability", "verify"), MATRIX)
def test_crash_at_each_point_charges_exactly_once(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    crash_at: str,
    n_calls: int,
    version: str,
    durability: str,
    verify: str,
) -> None:
    # the crash hits the last of the parallel calls, so the others are in flight or done
    crash_invoice = f"inv-{n_calls - 1}"
    crash = Crash(
        tmp_path,
        crash_at=crash_at,
        n_calls=n_calls,
        version=version,
        durability=durability,
        crash_invoice=crash_invoice,
        **scenario_for(verify),
    )
    reached(crash, crash_at, crash_invoice)
    invoices = [f"inv-{i}" for i in range(n_calls)]
    check(crash, invoices, verify)
    if verify == "truthful":
        assert crash.count("effects") == dict.fromkeys(invoices, 1), "each charged once"
    ref = baseline(version, n_calls, durability, str(tmp_path_factory.getbasetemp()))
    assert crash.resumed["messages"] == ref["messages"], "final state equals an uncrashed run"


@pytest.mark.parametrize(
    ("crash_at", "version", "verify"),
    [(p, v, "truthful" if v == "v1" else "liar") for p in POINTS for v in ("v1", "v2")],
)
def test_on_postgres_each_point_charges_exactly_once(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pg_server_dsn: str,
    crash_at: str,
    version: str,
    verify: str,
) -> None:
    """The same crashes, with the checkpoints and the ledger on a real PostgreSQL server
    (a fresh schema per scenario), three parallel calls, durability "sync"."""
    crash = Crash(
        tmp_path,
        crash_at=crash_at,
        n_calls=3,
        version=version,
        durability="sync",
        crash_invoice="inv-2",
        dsn=fresh_dsn(pg_server_dsn),
        **scenario_for(verify),
    )
    reached(crash, crash_at, "inv-2")
    check(crash, ["inv-0", "inv-1", "inv-2"], verify)
    ref = baseline(version, 3, "sync", str(tmp_path_factory.getbasetemp()))
    assert crash.resumed["messages"] == ref["messages"]


def crash_then_resume(tmp_path: Path, **scenario: Any) -> tuple[Counter[str], dict[str, Any]]:
    crash = Crash(tmp_path, **scenario)
    return crash.count("effects"), crash.resumed


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
