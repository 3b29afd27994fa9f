"""``benchmarks/ledger_floor.py`` sends the ledger's own statements by hand; when those
statements gain a parameter the floor must follow, or the benchmark dies mid-run (it
did: ``query parameter missing: inert``). A few repetitions on each backend keep it
runnable: each floor is measured and positive, and the rows it wrote are the ledger's
(every claimed call ends ``completed``)."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest
from pg_server import afresh_dsn

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def floor() -> Any:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import each other by module name
    try:
        import ledger_floor  # type: ignore[import-not-found]

        return ledger_floor
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize("calls", [1, 3])
async def test_the_sqlite_floor_runs_and_completes_its_calls(
    floor: Any, tmp_path: Path, calls: int
) -> None:
    path = str(tmp_path / "floor.sqlite")
    assert await floor.sqlite_floor_us(path, calls, 4) > 0
    with sqlite3.connect(path) as conn:
        statuses = {row[0] for row in conn.execute("SELECT status FROM idem_tool_calls")}
        count = conn.execute("SELECT count(*) FROM idem_tool_calls").fetchone()[0]
    assert statuses == {"completed"} and count == 4 * calls


@pytest.mark.parametrize("calls", [1, 3])
async def test_the_postgres_floor_runs_and_completes_its_calls(
    floor: Any, pg_server_dsn: str, calls: int
) -> None:
    dsn = await afresh_dsn(pg_server_dsn)
    assert await floor.postgres_floor_us(dsn, calls, 4, {"autocommit": True}) > 0
    async with await psycopg.AsyncConnection.connect(dsn) as conn:
        rows = await (await conn.execute("SELECT status FROM idem_tool_calls")).fetchall()
    assert {r[0] for r in rows} == {"completed"} and len(rows) == 4 * calls
