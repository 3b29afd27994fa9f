"""docs/guarantees.md, "A ledger beside any checkpointer", operator tools: "``idem-saver
pending``, ``ledger``, ``resolve`` and ``stats --db <the ledger's database>`` and
``langgraph_idem_saver.inspection`` work" on a ``ToolLedger``'s own database
(``tests/test_ledger_beside.py`` runs ``pending``; this file the others).

A ``ToolLedger`` on a real SQLite file holds an unknown outcome (a claim of a dead
process, its lease lapsed); the commands list it, count it and settle it, and the
ledger reads the settlement back."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from tool_node_helpers import intent_for, plant_unknown

from langgraph_idem_saver import CallStatus, ToolLedger, inspection
from langgraph_idem_saver.cli import main

CALL = {"name": "charge", "args": {"invoice": "inv-1"}, "id": "c1"}


def cli(capsys: pytest.CaptureFixture[str], db: Path, *argv: str) -> Any:
    code = main(["--db", str(db), *argv, "--json"])
    out = capsys.readouterr().out
    assert code == 0, out
    return json.loads(out)


async def test_ledger_stats_resolve_and_inspection_on_a_ledgers_database(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "ledger.db"
    async with ToolLedger(str(db)) as ledger:
        entry = await plant_unknown(ledger, intent_for("t", CALL))
        [seen] = await inspection.aentries(ledger, "t")
        assert seen.key == entry.key and seen.status is CallStatus.ISSUED
        assert (await inspection.astats(ledger)).unknown == 1

    listed = await asyncio.to_thread(cli, capsys, db, "ledger", "t")
    assert entry.key in json.dumps(listed) and "inv-1" in json.dumps(listed)
    stats = await asyncio.to_thread(cli, capsys, db, "stats")
    assert "issued" in json.dumps(stats)
    settle = ("resolve", entry.key, "--failed", "--error", "declined by the bank")
    await asyncio.to_thread(cli, capsys, db, *settle)

    async with ToolLedger(str(db)) as ledger:
        settled = await ledger.aget_entry("t", entry.key)
        assert await inspection.aunknown_outcomes(ledger) == []
    assert settled is not None and settled.status is CallStatus.FAILED
    assert settled.error == "declined by the bank"
