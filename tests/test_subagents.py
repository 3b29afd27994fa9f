"""IdempotentToolNode inside nested agents: a supervisor with two ``create_react_agent``
children (see ``tests/subagent_harness.py``).

* agent paths: what the ledger records for each topology (subgraph as a node, subgraph
  invoked from a node function, ``Send`` tasks, a name repeated at different depths) and
  that per-agent views filter on them;
* two agents making the same call are two calls; two ``Send``s to one agent node never
  adopt each other's entries;
* interrupts raised deep inside a child (approval, unknown outcomes naming the agent);
* handoffs (``Command(graph=Command.PARENT)``) and spend (``Command(update={"spend"})``
  with an ``operator.add`` reducer) replayed once when a step's writes are lost;
* real crashes: a child process dies at each ledger point inside a child agent while the
  other agent's calls are in flight; a fresh process resumes. Side effects happen
  exactly once and the final state (messages, spend, rounds) equals an uncrashed run.

In-process tests run on every backend of ``tests/conftest.py``; crash tests on SQLite
files and, at every crash point and for unknown outcomes and a handoff under durability
``exit``, on a real PostgreSQL server (a fresh schema per scenario). The topology
variants (sibling sends, handoffs) crash on SQLite: the ledger code they exercise is the
same on both backends.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import zygote
from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableConfig
from langgraph.graph import START, StateGraph
from pg_server import fresh_dsn, require_postgres
from subagent_harness import (
    COST,
    CRASH_EXIT_CODE,
    ChildState,
    Effects,
    Faults,
    SimulatedCrash,
    build,
    drive,
    make_agent,
    summarize,
)
from tool_node_helpers import cfg, intent_for, plant_unknown

from langgraph_idem_saver.keys import agent_path_of

pytestmark = pytest.mark.filterwarnings("ignore:create_react_agent has been moved")

HARNESS = Path(__file__).with_name("subagent_harness.py")
POINTS = ["before_issued", "after_issued", "after_effect", "after_completed", "after_node"]
ALL_BOUGHT = {"researcher:alpha", "researcher:shared", "writer:beta", "writer:shared"}
CRASH_BACKENDS = ["sqlite", "postgres"]


async def run_in_process(saver: Any, tmp_path: Path, thread: str, **scenario: Any) -> Any:
    scenario = {"effects": str(tmp_path / f"{thread}.fx"), **scenario}
    graph, nodes, effects = build(scenario, saver)
    result, interrupts = await drive(graph, scenario, effects, cfg(thread))
    return result, interrupts, nodes, effects


def outcome(result: dict[str, Any]) -> tuple[Any, Any, Any]:
    """What a resumed run must agree on with an uncrashed one."""
    return summarize(result["messages"]), result.get("spend", 0.0), result.get("rounds", 0)


# --- agent paths -----------------------------------------------------------------------------


def test_agent_path_of_strips_task_ids_at_any_depth() -> None:
    assert agent_path_of("") == ""
    assert agent_path_of("tools:1f0") == "tools"
    assert agent_path_of("researcher:abc|tools:def") == "researcher|tools"
    assert agent_path_of("agent:a|agent:b|tools:c") == "agent|agent|tools"
    assert agent_path_of("persistent|tools:c") == "persistent|tools"  # checkpointer=True


async def test_agent_paths_for_each_topology(saver: Any, tmp_path: Path) -> None:
    """The recorded agent path is the chain of node names from the root graph down to
    the tool node: task ids (which change when a task re-runs) are stripped, node names
    at every depth are kept - so a name repeated at two depths stays two agents."""
    effects, faults = Effects(tmp_path / "fx"), Faults({"phase": "run"})

    def agent(name: str, version: str = "v2") -> Any:
        return make_agent(name, version, effects, faults, fixed_ids=True)[0]

    # nested: supervisor (a subgraph node) -> researcher (an agent) -> tools (Send tasks);
    # and a writer invoked from inside a node function of the supervisor;
    # and an "researcher" node inside a "researcher" node (a repeated name)
    writer = agent("writer", "v1")

    async def call_writer(state: ChildState, config: RunnableConfig) -> dict[str, Any]:
        out = await writer.ainvoke({"messages": [HumanMessage("write the report")]}, config)
        return {"messages": [out["messages"][-1]]}

    inner = StateGraph(ChildState)
    inner.add_node("researcher", agent("researcher"))
    inner.add_node("writer", call_writer)
    inner.add_edge(START, "researcher")
    inner.add_edge(START, "writer")
    twice = StateGraph(ChildState)
    twice.add_node("researcher", agent("researcher"))
    twice.add_edge(START, "researcher")
    root = StateGraph(ChildState)
    root.add_node("supervisor", inner.compile())
    root.add_node("researcher", twice.compile())
    root.add_edge(START, "supervisor")
    root.add_edge(START, "researcher")
    graph = root.compile(checkpointer=saver)
    await graph.ainvoke({"messages": [HumanMessage("research the market")]}, cfg("paths"))

    entries = await saver.alist_entries("paths")
    assert Counter(e.agent_path for e in entries) == {
        "supervisor|researcher|tools": 2,  # two Send tasks of one agent
        "supervisor|writer|tools": 2,  # invoked from a node function: the node's name
        "researcher|researcher|tools": 2,  # same name twice: not the supervisor's one
    }
    # fixed ids: the three agents used the same tool call ids, yet made their own calls
    assert len({e.key for e in entries}) == 6
    assert sorted(effects.lines()) == sorted(
        ["researcher:alpha", "researcher:shared"] * 2 + ["writer:beta", "writer:shared"]
    )
    # per-agent views
    mine = await saver.alist_entries("paths", agent_path="supervisor|writer|tools")
    assert {e.tool_call_id for e in mine} == {"call_0", "call_1"}
    assert {e.agent_path for e in mine} == {"supervisor|writer|tools"}


async def test_two_agents_same_tool_same_args_same_ids_are_two_calls(
    saver: Any, tmp_path: Path
) -> None:
    result, _, _, effects = await run_in_process(
        saver, tmp_path, "same", effects=str(tmp_path / "fx"), fixed_ids=True
    )
    assert Counter(effects.lines()) == dict.fromkeys(ALL_BOUGHT, 1)
    entries = await saver.alist_entries("same")
    shared = [e for e in entries if json.loads(e.args)["item"] == "shared"]
    assert {(e.agent_path, e.tool_call_id) for e in shared} == {
        ("researcher|tools", "call_1"),
        ("writer|tools", "call_1"),
    }
    assert result["spend"] == 18.0
    # the same graph run again on its thread: every call already answered, nothing runs
    graph, _, _ = build({"effects": str(tmp_path / "fx")}, saver)
    await graph.ainvoke(None, cfg("same"))
    assert len(effects.lines()) == 4


async def test_sibling_sends_to_one_agent_never_adopt_each_other(
    saver: Any, tmp_path: Path
) -> None:
    """Two ``Send``s to the same agent node share an agent path. The slow sibling buys
    the same item after the fast one finished: the fast one's entry is no orphan of the
    slow one (its message is in the sibling's state), so both purchases happen."""
    result, _, nodes, effects = await run_in_process(saver, tmp_path, "sends", topology="sends")
    assert effects.lines() == ["researcher:shared", "researcher:shared"]
    assert nodes["researcher"].counters.adopted == 0
    assert result["spend"] == 6.0
    entries = await saver.alist_entries("sends", agent_path="researcher|tools")
    assert [e.adopted_by for e in entries] == [None, None]


# --- interrupts deep inside children ---------------------------------------------------------


async def test_approval_interrupts_in_parallel_children(saver: Any, tmp_path: Path) -> None:
    """Every purchase asks for approval with ``interrupt()`` inside a child's tool; the
    answers (``Command(resume={id: ...})``) reach the right calls, each runs once, and the
    result equals a run without approvals."""
    scenario = {"approval": True, "answer": "yes"}
    result, interrupts, nodes, effects = await run_in_process(saver, tmp_path, "ok", **scenario)
    assert sorted(i["approve"] for i in interrupts) == sorted(ALL_BOUGHT)
    assert Counter(effects.lines()) == dict.fromkeys(ALL_BOUGHT, 1)
    assert sum(n.counters.released for n in nodes.values()) >= len(ALL_BOUGHT)
    entries = await saver.alist_entries("ok")
    assert sorted(e.status.value for e in entries) == ["completed"] * 4
    plain, *_ = await run_in_process(saver, tmp_path, "plain")
    assert outcome(result) == outcome(plain)


async def test_unknown_outcome_in_a_child_names_the_agent(saver: Any, tmp_path: Path) -> None:
    """A writer call left unknown by a dead process: the interrupt says which agent made
    it; the human's answer (a Command carrying the spend) is recorded and used."""
    call = {"name": "buy", "args": {"item": "shared", "cost": 3.0}, "id": "call_1"}
    planted = await plant_unknown(
        saver,
        intent_for(
            "unk", call, checkpoint_ns="writer:old-task|tools:old-task", message_id="writer-1"
        ),
    )
    # the researcher made the very same call (same id, same args): not its business
    scenario = {"fixed_ids": True, "verify": False, "answer": "oracle"}
    effects = Effects(tmp_path / "unk.fx")
    effects.add("writer:shared")  # the dead process's purchase did land
    result, interrupts, _, _ = await run_in_process(saver, tmp_path, "unk", **scenario)
    [question] = interrupts
    assert question["kind"] == "unknown_tool_outcome"
    assert question["agent_path"] == "writer|tools"
    assert question["key"] == planted.key and question["args"] == call["args"]
    assert Counter(effects.lines()) == dict.fromkeys(ALL_BOUGHT, 1)
    plain, *_ = await run_in_process(saver, tmp_path, "plain")
    assert outcome(result) == outcome(plain)


# --- writes lost after the tools ran: spend and handoffs replayed once ------------------------


async def test_spend_is_replayed_once_when_a_child_step_is_lost(saver: Any, tmp_path: Path) -> None:
    """The researcher's tool step ran (spend recorded as Commands) but its writes were
    lost; the resumed step replays each Command once: the spend is not double-added, and
    the session continues from the recorded spend."""
    scenario = {"crash_at": "after_node", "crash_target": "researcher:alpha"}
    with pytest.raises(SimulatedCrash):
        await run_in_process(saver, tmp_path, "lost", crash_mode="raise", **scenario)
    state = await build({"effects": str(tmp_path / "x")}, saver)[0].aget_state(cfg("lost"))
    assert "researcher" in state.next, "the researcher's step is lost: it runs again"
    # the writer runs beside it and may have finished first (its writes then stay saved):
    # only the writer's spend can be in the state, never the researcher's
    writer_spend = COST["beta"] + COST["shared"]
    assert state.values.get("spend", 0.0) in (0.0, writer_spend), state.values
    graph, nodes, effects = build({"effects": str(tmp_path / "lost.fx"), "phase": "resume"}, saver)
    result, _ = await drive(graph, {"phase": "resume"}, effects, cfg("lost"))
    assert Counter(effects.lines()) == dict.fromkeys(ALL_BOUGHT, 1)
    # alpha's Send task replays (and shared's, if its writes were lost with the step)
    assert nodes["researcher"].counters.executed == 0
    assert nodes["researcher"].counters.replayed >= 1
    plain, *_ = await run_in_process(saver, tmp_path, "plain")
    assert outcome(result) == outcome(plain)
    assert result["spend"] == 18.0 and result["rounds"] == 2


async def test_handoff_command_is_recorded_and_replayed(saver: Any, tmp_path: Path) -> None:
    scenario = {
        "topology": "handoff",
        "crash_at": "after_node",
        "crash_target": "researcher:handoff",
    }
    with pytest.raises(SimulatedCrash):
        await run_in_process(saver, tmp_path, "ho", crash_mode="raise", **scenario)
    entries = await saver.alist_entries("ho", agent_path="researcher|tools")
    [handoff] = [e for e in entries if e.tool_name == "transfer_to_writer"]
    assert handoff.status.value == "completed"
    graph, nodes, effects = build(
        {"effects": str(tmp_path / "ho.fx"), "topology": "handoff", "phase": "resume"}, saver
    )
    result, _ = await drive(graph, {"phase": "resume"}, effects, cfg("ho"))
    assert Counter(effects.lines()) == {
        "researcher:alpha": 1,
        "researcher:handoff": 1,
        "writer:gamma": 1,
    }
    assert nodes["researcher"].counters.replayed == 1
    plain, *_ = await run_in_process(saver, tmp_path, "plain", topology="handoff")
    assert outcome(result) == outcome(plain)
    assert result["spend"] == 16.0


# --- real crashes, resumed in a fresh process ------------------------------------------------


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


def where(backend: str, tmp: Path) -> dict[str, Any]:
    """Where a scenario keeps its thread: a SQLite file in ``tmp``, or a fresh schema on
    the test server (no server: skipped locally, a failure in CI - ``pg_server.py``)."""
    if backend == "postgres":
        require_postgres()
        return {"backend": "postgres", "db": fresh_dsn(), "thread_id": uuid.uuid4().hex}
    return {"db": str(tmp / "a.db")}


@cache
def baseline(topology: str, backend: str, tmp: str) -> dict[str, Any]:
    base = Path(tmp) / f"baseline-{topology}-{backend}"
    base.mkdir(parents=True, exist_ok=True)
    scenario = {**where(backend, base), "effects": str(base / "fx"), "topology": topology}
    code, payload, err = run_phase(scenario, "run")
    assert code == 0, err
    assert payload is not None
    return payload


def crash_then_resume(tmp: Path, backend: str, **scenario: Any) -> tuple[Counter[str], Any]:
    scenario = {**where(backend, tmp), "effects": str(tmp / "fx"), **scenario}
    code, _, err = run_phase(scenario, "run")
    assert code == CRASH_EXIT_CODE, f"the child should have died at {scenario}: {err}"
    code, payload, err = run_phase(scenario, "resume")
    assert code == 0, err
    assert payload is not None
    return Counter(Effects(scenario["effects"]).lines()), payload


def same_as_uncrashed(resumed: dict[str, Any], ref: dict[str, Any]) -> None:
    assert resumed["messages"] == ref["messages"], "final conversation equals an uncrashed run"
    assert resumed["spend"] == ref["spend"], "spend counted once per purchase"
    assert resumed["rounds"] == ref["rounds"], "no round credited twice or for free"


CRASHES = [(p, "researcher:alpha", b) for p in POINTS for b in CRASH_BACKENDS] + [
    ("after_effect", "writer:shared", "sqlite"),
    ("after_completed", "writer:shared", "sqlite"),
]
"""Every crash point on both backends; the other agent's call as the target on SQLite."""


@pytest.mark.parametrize(("crash_at", "target", "backend"), CRASHES)
def test_crash_inside_a_child_while_both_agents_run_tools(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
    crash_at: str,
    target: str,
) -> None:
    # all four purchases are in flight together; the target goes first and dies
    effects, resumed = crash_then_resume(
        tmp_path, backend, crash_at=crash_at, crash_target=target, rendezvous=4
    )
    assert effects == dict.fromkeys(ALL_BOUGHT, 1), "every purchase exactly once"
    assert resumed["interrupts"] == [], "verify hooks settle the unknown outcomes"
    assert all(status == "completed" for _, _, status, _ in resumed["ledger"])
    assert (
        sorted(p for p, *_ in resumed["ledger"]) == ["researcher|tools"] * 2 + ["writer|tools"] * 2
    )
    same_as_uncrashed(resumed, baseline("parallel", backend, str(tmp_path_factory.getbasetemp())))


@pytest.mark.parametrize("backend", CRASH_BACKENDS)
def test_unknown_outcomes_after_a_crash_are_asked_of_the_right_agent(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, backend: str
) -> None:
    """No verify hooks: each call left unknown becomes an interrupt naming its agent; a
    human checks the outside world and answers; nothing runs twice."""
    effects, resumed = crash_then_resume(
        tmp_path,
        backend,
        crash_at="after_effect",
        crash_target="researcher:alpha",
        rendezvous=4,
        verify=False,
        answer="oracle",
    )
    assert effects == dict.fromkeys(ALL_BOUGHT, 1)
    asked = {(q["agent_path"], q["args"]["item"]) for q in resumed["interrupts"]}
    assert ("researcher|tools", "alpha") in asked, "the dead call is asked about"
    assert all(q["kind"] == "unknown_tool_outcome" for q in resumed["interrupts"])
    # the calls in flight at the crash are asked about too, each of its own agent
    assert asked <= {
        ("researcher|tools", "alpha"),
        ("researcher|tools", "shared"),
        ("writer|tools", "beta"),
        ("writer|tools", "shared"),
    }
    assert len(asked) == len(resumed["interrupts"]) >= 2
    same_as_uncrashed(resumed, baseline("parallel", backend, str(tmp_path_factory.getbasetemp())))


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_sibling_sends_after_a_crash_each_buy_once(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, backend: str, durability: str
) -> None:
    """The fast sibling bought; the process died as the slow sibling was claiming the
    same purchase. On resume the slow one must buy (not adopt its sibling's entry)."""
    effects, resumed = crash_then_resume(
        tmp_path,
        backend,
        topology="sends",
        crash_at="before_issued",
        crash_target="researcher:shared",
        crash_nth=2,
        durability=durability,
    )
    assert effects == {"researcher:shared": 2}
    ref = baseline("sends", backend, str(tmp_path_factory.getbasetemp()))
    assert resumed["messages"] == ref["messages"] and resumed["spend"] == ref["spend"] == 6.0


@pytest.mark.parametrize("backend", ["sqlite"])
@pytest.mark.parametrize("crash_at", ["after_completed", "after_node"])
def test_handoff_after_a_crash_is_replayed(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, backend: str, crash_at: str
) -> None:
    effects, resumed = crash_then_resume(
        tmp_path, backend, topology="handoff", crash_at=crash_at, crash_target="researcher:handoff"
    )
    assert effects == {"researcher:alpha": 1, "researcher:handoff": 1, "writer:gamma": 1}
    assert resumed["counters"]["researcher"]["replayed"] == 1
    same_as_uncrashed(resumed, baseline("handoff", backend, str(tmp_path_factory.getbasetemp())))


@pytest.mark.parametrize("crash_at", ["after_effect", "after_completed"])
def test_handoff_under_exit_durability_then_a_crash_in_the_next_agent_buys_once(
    tmp_path: Path, backend: str, request: pytest.FixtureRequest, crash_at: str
) -> None:
    """Issue 15 item 3. Durability ``"exit"``: the researcher buys and hands off
    (``Command.PARENT``); the process dies later, in the writer. The researcher's
    checkpoint was written when it exited through the handoff, the root's never was: the
    calls found there belong to a branch of history nobody will continue. On resume the
    researcher's re-run calls must take their entries back (replayed), not run again."""
    if backend == "postgres":
        dsn = fresh_dsn(request.getfixturevalue("pg_server_dsn"))
        loc: dict[str, Any] = {"backend": "postgres", "db": dsn, "thread_id": uuid.uuid4().hex}
    else:
        loc = {"db": str(tmp_path / "a.db")}
    scenario = {**loc, "effects": str(tmp_path / "fx"), "topology": "handoff"}
    scenario.update(durability="exit", crash_at=crash_at, crash_target="writer:gamma")
    code, _, err = run_phase(scenario, "run")
    assert code == CRASH_EXIT_CODE, err
    code, resumed, err = run_phase(scenario, "resume")
    assert code == 0 and resumed is not None, err
    effects = Counter(Effects(scenario["effects"]).lines())
    assert effects == {"researcher:alpha": 1, "researcher:handoff": 1, "writer:gamma": 1}
    assert resumed["interrupts"] == []
