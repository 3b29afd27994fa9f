"""No silent guesses (issue 36, items 3 and 9): an earlier entry answers a call only when
it is that call.

* Item 3: under durability ``"exit"`` a crash loses the model's message; the user then
  sends a *different* request, and its ``charge(inv-7)`` is paired with the lost
  ``charge(inv-1)`` (same step, same tool). The lost call is settled on its own
  (``verify`` about inv-1); inv-7 is then decided explicitly: asked by default,
  ``on_earlier_call="run"`` runs it, ``"replay"`` (chosen) answers it from inv-1.
* A lost call paired with a reworded one that was decided "run", or whose question was
  never answered, stays a lost call: made again later with its very arguments, it is
  answered by its entry, not run twice.
* Item 9: with ``create_react_agent(version="v2")`` each call is a task of its own. The
  inv-0 task, blind to its sibling, pairs with the lost inv-1 call, which ``verify``
  finds did not happen: it is closed "not applied; superseded". The inv-1 task, asking
  for those very arguments, reaches that entry through its fork slot - and was told the
  charge failed instead of running it. An entry closed as superseded answers nothing.

Each scenario kills a real child process at the point under test and resumes in a fresh
one, on both backends.
"""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pg_server import fresh_dsn
from resume_worker import CRASH_EXIT_CODE, FAILED_EXIT_CODE, effects_lines
from test_concurrent_resume import collect
from test_concurrent_resume import spawn as spawn_worker

from langgraph_idem_saver.engine.options import LedgerOptions
from langgraph_idem_saver.errors import ConfigError

WORKER = Path(__file__).with_name("earlier_call_worker.py")


def child(scenario: dict[str, Any]) -> tuple[int, dict[str, Any] | None, str]:
    """Run one phase in a child process; it is killed if the test gives up on it."""
    proc: subprocess.Popen[str] = spawn_worker(scenario, WORKER)
    try:
        return collect(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def resumed(scenario: dict[str, Any]) -> dict[str, Any]:
    code, payload, err = child({**scenario, "phase": "resume"})
    assert payload is not None and code in (0, FAILED_EXIT_CODE), f"exit {code}: {err}"
    assert payload["ok"], payload.get("traceback")
    return payload


def where(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, Any]:
    if backend == "sqlite":
        return {"db": str(tmp_path / "a.db"), "effects": str(tmp_path / "effects")}
    dsn = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
    return {"dsn": dsn, "effects": str(tmp_path / "effects")}


def crashed_paying_inv_1(base: dict[str, Any]) -> None:
    """Turn one, durability ``"exit"``: the charge of inv-1 lands and the process dies
    before anything of the turn is saved but the ledger's claim."""
    run = {
        **base,
        "phase": "run",
        "text": "pay invoices inv-1",
        "durability": "exit",
        "crash_at": "after_effect",
        "crash_invoice": "inv-1",
    }
    code, _, err = child(run)
    assert code == CRASH_EXIT_CODE, err
    assert effects_lines(Path(base["effects"])) == ["inv-1"], "the lost call happened"


def other_request(base: dict[str, Any], **more: Any) -> dict[str, Any]:
    """The user, seeing no answer, asks for something else: pay inv-7 instead."""
    return {**base, "text": "pay invoices inv-7", "durability": "exit", **more}


def test_a_different_request_after_a_lost_call_is_asked_about_not_answered_by_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Item 3, default ``on_earlier_call="ask"``: inv-7 is not answered with inv-1's
    charge. The lost inv-1 is settled on its own (``verify``: it happened); the question
    about inv-7 shows both calls; the human answers ``run``: inv-7 is charged once, inv-1
    stays charged once."""
    base = where(backend, tmp_path, request)
    crashed_paying_inv_1(base)
    out = resumed(other_request(base, answer_earlier="run"))

    [asked] = out["asked"]
    assert asked["kind"] == "earlier_call" and asked["reason"] == "reworded"
    assert asked["args"]["invoice"] == "inv-7"
    assert asked["earlier"]["args"]["invoice"] == "inv-1"
    assert asked["earlier"]["status"] == "completed", "the lost call was settled first"
    assert Counter(effects_lines(tmp_path / "effects")) == {"inv-1": 1, "inv-7": 1}
    [answer] = out["tool_messages"].values()
    assert answer == "charged inv-7 $10", "the model is told what happened to inv-7"
    ledger = {e["invoice"]: e["status"] for e in out["ledger"]}
    assert ledger == {"inv-1": "completed", "inv-7": "completed"}


@pytest.mark.parametrize("choice", ["run", "replay"])
def test_on_earlier_call_decides_a_reworded_call_without_asking(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, choice: str
) -> None:
    """Item 3's option: ``"run"`` charges inv-7 with no question; ``"replay"`` (the user's
    explicit choice) answers it with the lost call's settled outcome, as before."""
    base = {**where(backend, tmp_path, request), "on_earlier_call": choice}
    crashed_paying_inv_1(base)
    out = resumed(other_request(base))

    assert out["asked"] == [], "decided by the option, nobody asked"
    [answer] = out["tool_messages"].values()
    if choice == "run":
        assert Counter(effects_lines(tmp_path / "effects")) == {"inv-1": 1, "inv-7": 1}
        assert answer == "charged inv-7 $10"
    else:
        assert effects_lines(tmp_path / "effects") == ["inv-1"]
        assert answer == "charged inv-1 $10", "the recorded outcome of the lost call"


@pytest.mark.parametrize("decided_by", ["human", "option"])
def test_a_lost_call_a_reworded_call_ran_beside_still_answers_its_own_call_later(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, decided_by: str
) -> None:
    """The lost inv-1 charge, paired with the reworded inv-7, is decided "run" (by the
    human, or by ``on_earlier_call="run"``): inv-7 is another call, and inv-1 stays a lost
    call. When the user then asks for inv-1 again, its entry answers it - charged once,
    replayed - instead of being hidden behind inv-7's adoption and charged twice."""
    more = {"answer_earlier": "run"} if decided_by == "human" else {"on_earlier_call": "run"}
    base = {**where(backend, tmp_path, request), **more}
    crashed_paying_inv_1(base)
    resumed(other_request(base))
    assert Counter(effects_lines(tmp_path / "effects")) == {"inv-1": 1, "inv-7": 1}

    again = {**base, "phase": "run", "text": "pay invoices inv-1", "durability": "exit"}
    code, out, err = child(again)
    assert out is not None and code == 0 and out["ok"], err
    assert Counter(effects_lines(tmp_path / "effects")) == {"inv-1": 1, "inv-7": 1}
    assert out["asked"] == [], "the same call: answered by its entry, nobody asked"
    told = {out["calls"][i]: text for i, text in out["tool_messages"].items()}
    assert told == {"inv-7": "charged inv-7 $10", "inv-1": "charged inv-1 $10"}
    assert Counter(e["invoice"] for e in out["ledger"]) == {"inv-1": 1, "inv-7": 1}


def left_unanswered(base: dict[str, Any], *, then: str | None) -> dict[str, Any]:
    """inv-1 charged and lost; the user asks for inv-7 and leaves the question it raises
    unanswered (``then``: the user's next turn, in that same process)."""
    crashed_paying_inv_1(base)
    first = {**other_request(base), "phase": "run", "leave_unanswered": True}
    if then is not None:
        first["then"] = then
    code, out, err = child(first)
    assert out is not None and code == 0 and out["ok"], err
    return out


@pytest.mark.parametrize("process", ["the same", "a new"])
def test_a_lost_call_whose_reworded_question_is_never_answered_answers_its_own_call(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, process: str
) -> None:
    """The question about inv-7 (paired with the lost inv-1) is left unanswered; the user
    asks for inv-1 again instead - in the process that asked, or in a new one. The
    pairing is a question, not an adoption: inv-1's entry answers inv-1 - charged once,
    replayed, nobody asked."""
    base = where(backend, tmp_path, request)
    inv_1 = "pay invoices inv-1"
    out = left_unanswered(base, then=inv_1 if process == "the same" else None)
    assert [q["kind"] for q in out["asked"]] == ["earlier_call"], "inv-7 asked about, unanswered"
    if process == "a new":
        again = {**base, "phase": "run", "text": inv_1, "durability": "exit"}
        code, out, err = child(again)
        assert out is not None and code == 0 and out["ok"], err
    else:
        assert out["asked_then"] == []
        out["asked"] = []  # the question about inv-7 (above), not one about inv-1
    assert effects_lines(tmp_path / "effects") == ["inv-1"], "charged once, inv-7 never ran"
    assert out["asked"] == []
    assert "charged inv-1 $10" in out["tool_messages"].values()


@pytest.mark.parametrize("process", ["the same", "a new"])
def test_a_lost_call_whose_unknown_outcome_is_never_answered_is_not_run_again(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, process: str
) -> None:
    """No ``verify``: paired with inv-7, the lost inv-1 (its outcome unknown) is asked
    about first, and nobody answers; the user asks for inv-1 again - in that process or a
    new one. inv-1's entry still answers it: asked about again, never charged again."""
    base = {**where(backend, tmp_path, request), "no_verify": True}
    inv_1 = "pay invoices inv-1"
    out = left_unanswered(base, then=inv_1 if process == "the same" else None)
    assert [(q["kind"], q["args"]["invoice"]) for q in out["asked"]] == [
        ("unknown_tool_outcome", "inv-1")
    ], "the lost call's outcome asked about, unanswered"
    if process == "a new":
        again = {**base, "phase": "run", "text": inv_1, "durability": "exit"}
        code, out, err = child({**again, "leave_unanswered": True})
        assert out is not None and code == 0 and out["ok"], err
        later = out["asked"]
    else:
        later = out["asked_then"]
    assert effects_lines(tmp_path / "effects") == ["inv-1"], "never charged a second time"
    assert [(q["kind"], q["args"]["invoice"]) for q in later] == [("unknown_tool_outcome", "inv-1")]


def died_after_claiming_inv1(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> dict[str, Any]:
    """Turn one of ``create_react_agent`` v2, durability ``"exit"``, asks for inv-1 and dies
    after its claim, before its effect; the scenario that re-sends that turn."""
    base = {**where(backend, tmp_path, request), "agent": "react_v2", "durability": "exit"}
    turn = {**base, "text": "pay invoices inv-0 inv-1"}
    run = {
        **turn,
        "phase": "run",
        "calls": ["inv-1"],
        "crash_at": "after_issued",
        "crash_invoice": "inv-1",
    }
    code, _, err = child(run)
    assert code == CRASH_EXIT_CODE, err
    return turn


def both_charged_once(out: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """inv-0 and inv-1 each charged once and told so; the lost inv-1 entry."""
    assert Counter(effects_lines(tmp_path / "effects")) == {"inv-0": 1, "inv-1": 1}
    told = {out["calls"][i]: text for i, text in out["tool_messages"].items()}
    assert told == {"inv-0": "charged inv-0 $10", "inv-1": "charged inv-1 $10"}
    [lost] = [e for e in out["ledger"] if e["invoice"] == "inv-1"]
    return lost


def test_a_superseded_lost_call_never_answers_a_call_with_its_own_arguments(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Item 9, deterministically: ``create_react_agent`` v2, durability ``"exit"``. Turn
    one asks for inv-1 and dies after its claim, before its effect. The re-run model asks
    for inv-0 and inv-1 (two tasks); the inv-0 task goes first (``hold``), pairs with
    the lost inv-1, whose ``verify`` says "not applied": closed as superseded. The inv-1
    task then reaches that entry with the very same arguments and must run it - not be
    told "not applied; superseded"."""
    turn = died_after_claiming_inv1(backend, tmp_path, request)
    assert effects_lines(tmp_path / "effects") == [], "inv-1 claimed, never charged"

    hold = {"invoice": "inv-1", "until": "inv-0"}
    out = resumed({**turn, "calls": ["inv-0", "inv-1"], "hold": hold})

    lost = both_charged_once(out, tmp_path)
    assert lost["status"] == "completed" and lost["attempts"] == 2, lost
    assert lost["events"] == ["superseded", "reopened"], "closed, then run again - on record"


def test_a_lost_call_closed_as_superseded_while_its_own_call_settles_it_is_run(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Item 9, the concurrent variant: the inv-1 task reaches the lost inv-1 entry while it
    is still unknown and asks ``verify``; meanwhile the inv-0 task, paired with it, closes
    it as superseded. The inv-1 task's re-run then finds the row changed - closed, "not
    applied" - and must run the charge, not replay that failure. Made deterministic: the
    inv-1 task reads the ledger only once the inv-0 task took the lost entry; ``verify``
    answers the inv-0 task (asked first) only once the inv-1 task asked too - it read the
    entry still unknown - and the inv-1 task only once inv-0 was charged (after the
    close)."""
    turn = died_after_claiming_inv1(backend, tmp_path, request)

    out = resumed(
        {
            **turn,
            "calls": ["inv-0", "inv-1"],
            "hold": {"invoice": "inv-1", "until": "adopted"},
            "verify_waits_for": "inv-0",
        }
    )

    lost = both_charged_once(out, tmp_path)
    assert lost["events"] == ["superseded", "reopened"], "the race was run, on record"


def test_on_earlier_call_is_validated() -> None:
    with pytest.raises(ConfigError, match="on_earlier_call"):
        LedgerOptions.build(tools=None, on_earlier_call="guess")  # type: ignore[typeddict-item]
    with pytest.raises(ConfigError, match="names tools"):
        LedgerOptions.build(tools={"charge": None}, on_earlier_call={"refund": "run"})
    options = LedgerOptions.build(tools=None, on_earlier_call={"charge": "run"})
    assert options.on_earlier_call_for("charge") == "run"
    assert options.on_earlier_call_for("email") == "ask"
