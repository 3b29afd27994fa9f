"""Nested ``idempotent_task`` s (issue 36, item 5): an orchestrating task is never settled
``completed`` in a way that skips the ledgered tasks it awaits.

``settle(inv)`` awaits ``charge(inv)`` then ``notify(inv)``, all three ledgered. The
process dies inside ``notify(inv-2)`` before its effect (a real child process, killed
there). Before: the resume asked a human about ``settle(inv-2)``; the human, finding the
charge at the vendor, answered ``completed`` - and ``notify(inv-2)`` never ran. Now the
outer task, marked as orchestrating from its first inner call, is re-run: ``charge``
replays, ``notify`` settles its own unknown outcome (``verify``: not applied) and runs.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import zygote
from langgraph.func import entrypoint
from pg_server import fresh_dsn

from langgraph_idem_saver.task import idempotent_task

WORKER = Path(__file__).with_name("nested_task_worker.py")
CRASH_EXIT_CODE = 137


def child(scenario: dict[str, Any]) -> tuple[int, str, str]:
    proc = zygote.Popen(
        [sys.executable, str(WORKER), json.dumps(scenario)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, out, err[-3000:]


@pytest.mark.parametrize("durability", ["sync", "exit"])
def test_a_crash_inside_an_inner_task_reruns_the_outer_one_and_skips_nothing(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, durability: str
) -> None:
    effects = tmp_path / "effects"
    scenario: dict[str, Any] = {"effects": str(effects), "durability": durability}
    if backend == "sqlite":
        scenario["db"] = str(tmp_path / "a.db")
    else:
        scenario["dsn"] = fresh_dsn(request.getfixturevalue("pg_server_dsn"))

    code, _, err = child({**scenario, "crash": "inv-2"})
    assert code == CRASH_EXIT_CODE, err
    assert effects.read_text().splitlines()[-1] == "charge inv-2", "died in notify(inv-2)"

    code, out, err = child(scenario)
    assert code == 0, err
    resumed = json.loads(out)

    lines = Counter(effects.read_text().splitlines())
    expected = [f"{what} {inv}" for inv in ("inv-1", "inv-2") for what in ("charge", "notify")]
    assert lines == dict.fromkeys(expected, 1), "every inner effect once, none skipped"
    assert [q["tool"] for q in resumed["asked"]] == [], "the outer task was never asked about"
    assert resumed["result"][1] == ["charge inv-2", "notify inv-2"]
    assert resumed["counters"]["settle"]["unknown"] == 1, "settle(inv-2) was decided: re-run"


async def test_only_a_task_that_calls_ledgered_tasks_is_marked(saver_factory: Any) -> None:
    """The mark is in the outer entry's history; an inner (leaf) task has none."""
    async with saver_factory() as saver:

        @idempotent_task
        async def leaf(n: int) -> int:
            return n + 1

        @idempotent_task
        async def outer(n: int) -> int:
            return await leaf(n) * 10

        @entrypoint(checkpointer=saver)
        async def flow(n: int) -> int:
            return await outer(n)

        assert await flow.ainvoke(1, {"configurable": {"thread_id": "t"}}) == 20
        events = {
            e.tool_name: [v["action"] for v in e.events()] for e in await saver.alist_entries("t")
        }
        assert events == {"outer": ["orchestrates"], "leaf": []}


def test_a_sync_task_calling_ledgered_tasks_is_marked_too(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``def`` tasks under ``graph.invoke`` (the sync savers): LangGraph runs an inner
    task in the caller's context there too, so the outer one is marked the same way."""
    if backend == "sqlite":
        from langgraph_idem_saver import SqliteSaver

        opened: Any = SqliteSaver.from_conn_string(str(tmp_path / "s.db"))
    else:
        from langgraph_idem_saver.postgres import PostgresSaver

        opened = PostgresSaver.from_conn_string(fresh_dsn(request.getfixturevalue("pg_server_dsn")))
    with opened as saver:

        @idempotent_task
        def leaf(n: int) -> int:
            return n + 1

        @idempotent_task
        def outer(n: int) -> int:
            return int(leaf(n).result()) * 10

        @entrypoint(checkpointer=saver)
        def flow(n: int) -> int:
            return int(outer(n).result())

        assert flow.invoke(1, {"configurable": {"thread_id": "t"}}) == 20
        entries = asyncio.run(saver.alist_entries("t"))
    events = {e.tool_name: [v["action"] for v in e.events()] for e in entries}
    assert events == {"outer": ["orchestrates"], "leaf": []}
