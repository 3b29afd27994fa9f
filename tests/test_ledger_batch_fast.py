"""A step's claim and outcome rows in one statement each (``sqlite/ledger_batch.py``)
answer and write what a statement a row does.

Each case runs the same rows on two real SQLite files made by the saver's ``setup()``:
one through the one-statement path, one a statement a row (``INSERT_ISSUED`` /
``FINISH_ENTRY``, the path of an SQLite before 3.35), and compares the answer per row
and every column of every ledger row, rowids included. The rows mix what a statement
must tell apart: keys taken before, a fork slot taken, a slot two rows of the claim
share, outcomes whose guard fails (another owner, settled already, no such key), a row
the database refuses, and more rows than one statement holds.
"""

from __future__ import annotations

import dataclasses
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from typing import Any

import aiosqlite
import pytest

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.backend import INTENT_COLUMNS, Claims, step_params
from langgraph_idem_saver.ledger import CallIntent, LedgerEntry, StepLookup
from langgraph_idem_saver.sqlite import ledger_batch, runner, sql
from langgraph_idem_saver.sqlite.ledger_store import _each_matched

SHARED = ("me", 100.0, 400.0)  # owner, issued_at, lease_expires_at


def row(i: int, *, slot: int | None = None, scope: str = "s") -> tuple[Any, ...]:
    """A claim row (``INTENT_COLUMNS``) of key ``k{i}``, its fork slot ``slot`` (``i``)."""
    occurrence = i if slot is None else slot
    return (scope, f"k{i}", scope, "agent", "charge", "h", b'{"i":%d}' % i, f"c{i}", None,
            "p", "b", occurrence)  # fmt: skip


async def ledger_file(path: str) -> sqlite3.Connection:
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    return conn


@pytest.fixture
async def files(tmp_path: Any) -> AsyncIterator[tuple[sqlite3.Connection, sqlite3.Connection]]:
    at_once = await ledger_file(os.path.join(tmp_path, "at_once.db"))
    by_row = await ledger_file(os.path.join(tmp_path, "by_row.db"))
    yield at_once, by_row
    at_once.close()
    by_row.close()


def rows_of(conn: sqlite3.Connection) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT rowid, * FROM idem_tool_calls ORDER BY rowid").fetchall()


def inserted_by_row(conn: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> list[int]:
    return [conn.execute(sql.INSERT_ISSUED, (*r, *SHARED)).rowcount for r in rows]


def test_a_claim_in_one_statement_inserts_and_answers_as_row_by_row(
    files: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    at_once, by_row = files
    earlier = [row(3), row(500, slot=7)]  # key k3 taken; slot 7 taken by another key
    for conn in files:
        inserted_by_row(conn, earlier)
    # 150 rows: three statements (64, 64, 22); row 20 shares row 10's slot (10 wins)
    claim = [row(i, slot=10 if i == 20 else None) for i in range(150)]
    got = ledger_batch.claim_inserted(at_once, claim, SHARED)
    expected = inserted_by_row(by_row, claim)
    assert got == expected
    assert [i for i, n in enumerate(expected) if n == 0] == [3, 7, 20]
    assert rows_of(at_once) == rows_of(by_row)


def test_a_claim_not_for_one_statement_is_left_to_the_caller(
    files: tuple[sqlite3.Connection, sqlite3.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key twice in the claim, a single row, or an SQLite before 3.35: None, nothing
    written (the caller inserts a row at a time, the first of a key winning)."""
    at_once, _ = files
    assert ledger_batch.claim_inserted(at_once, [row(1), row(2), row(1)], SHARED) is None
    assert ledger_batch.claim_inserted(at_once, [row(1)], SHARED) is None
    monkeypatch.setattr(ledger_batch, "AT_ONCE", False)
    assert ledger_batch.claim_inserted(at_once, [row(1), row(2)], SHARED) is None
    assert rows_of(at_once) == []


def outcome(i: int, *, owner: str = "me", status: str = "completed") -> tuple[Any, ...]:
    """``FINISH_ENTRY``'s parameters for key ``k{i}``."""
    return (status, "msgpack", b"\x01" * (i % 7), None if i % 3 else f"e{i}", 200.0 + i,
            "s", f"k{i}", owner)  # fmt: skip


def test_outcomes_in_one_statement_match_and_write_as_row_by_row(
    files: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    at_once, by_row = files
    for conn in files:
        inserted_by_row(conn, [row(i) for i in range(140)])
        # k5 settled already: its guard (status 'issued') fails
        assert _each_matched(conn, [outcome(5)]) == [True]
    rows = [outcome(i) for i in range(140) if i != 5]
    rows[8] = outcome(9, owner="someone else")  # the guard's owner fails
    rows.append(outcome(999))  # no such key
    rows[100] = outcome(101, status="bogus")  # refused by the status' CHECK
    got = ledger_batch.outcomes_matched(at_once, rows, _each_matched)
    expected = _each_matched(by_row, rows)
    assert [type(g) for g in got] == [type(e) for e in expected]
    assert isinstance(got[100], sqlite3.IntegrityError)
    assert [g for g in got if not isinstance(g, Exception)] == [
        e for e in expected if not isinstance(e, Exception)
    ]
    assert [i for i, g in enumerate(got) if g is False] == [8, 139]
    assert rows_of(at_once) == rows_of(by_row)


def test_outcomes_not_for_one_statement_go_row_by_row(
    files: tuple[sqlite3.Connection, sqlite3.Connection], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key twice among the outcomes: row by row, so the first matches and the second
    finds the row settled (one statement would answer both "matched")."""
    at_once, by_row = files
    for conn in files:
        inserted_by_row(conn, [row(i) for i in range(3)])
    rows = [outcome(0), outcome(1), outcome(0, status="failed")]
    seen: list[int] = []

    def each(conn: sqlite3.Connection, chunk: Any) -> list[bool | Exception]:
        seen.append(len(chunk))
        return _each_matched(conn, chunk)

    assert ledger_batch.outcomes_matched(at_once, rows, each) == [True, True, False]
    assert seen == [3]
    assert _each_matched(by_row, rows) == [True, True, False]
    assert rows_of(at_once) == rows_of(by_row)
    monkeypatch.setattr(ledger_batch, "AT_ONCE", False)
    assert ledger_batch.outcomes_matched(at_once, [outcome(2), outcome(1)], each) == [
        True,
        False,
    ]
    assert seen == [3, 2]


def intents(n: int) -> list[CallIntent]:
    return [CallIntent(**dict(zip(INTENT_COLUMNS, row(i), strict=True))) for i in range(n)]


async def saver_run(path: str) -> tuple[list[Any], list[Any], list[tuple[Any, ...]]]:
    """Two claims (the second finding three of its keys taken) and a batch of outcomes
    (the last a key the batch settled before it) through the saver: the claims' answers,
    the outcomes' answers (errors by type and text), every row."""
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        await saver.setup()
        first = await saver.aclaim(intents(3), owner="me", lease_seconds=60)
        claimed = await saver.aclaim(intents(70), owner="me", lease_seconds=60)
        assert [o.entry for o in claimed[:3]] == [o.entry for o in first]
        for got in claimed:
            assert got.entry == await saver.aget_entry("s", got.entry.key)
        errors = await saver.record_outcome_rows([outcome(i) for i in range(70)] + [outcome(1)])
    answers = [(o.claimed, o.entry.key) for o in claimed]
    said = [None if e is None else (type(e), str(e)) for e in errors]
    conn = sqlite3.connect(path)
    try:
        stored = conn.execute(
            "SELECT rowid, scope, key, status, result, error, finished_at, attempts "
            "FROM idem_tool_calls ORDER BY rowid"
        ).fetchall()
    finally:
        conn.close()
    return answers, said, stored


async def test_the_saver_claims_and_records_the_same_either_way(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the saver (``aclaim``, ``record_outcome_rows``) with the one-statement
    path on and off: the same answers and the same rows."""
    at_once = await saver_run(os.path.join(tmp_path, "at_once.db"))
    monkeypatch.setattr(ledger_batch, "AT_ONCE", False)
    by_row = await saver_run(os.path.join(tmp_path, "by_row.db"))
    assert at_once == by_row
    answers, said, stored = at_once
    assert [claimed for claimed, _ in answers] == [False] * 3 + [True] * 67
    assert said[:70] == [None] * 70 and said[70] is not None
    assert {status for _, _, _, status, *_ in stored} == {"completed"}


def lookup_rows(conn: sqlite3.Connection) -> None:
    """Rows the adoption read must tell apart: two scopes, two agent paths, rows with and
    without a fork position, arguments repeated across positions."""
    rows = []
    for i in range(60):
        scope = "s" if i % 5 else "other"
        agent = "agent" if i % 7 else "elsewhere"
        position = None if i % 4 == 0 else f"p{i % 3}"
        occurrence = None if position is None else i
        rows.append((scope, f"k{i}", scope, agent, f"tool{i % 2}", f"h{i % 9}",
                     b"{}", f"c{i}", None, position, "b", occurrence))  # fmt: skip
    inserted_by_row(conn, rows)


@pytest.mark.parametrize(
    ("signatures", "spots"),
    [
        (
            [("tool0", "h0"), ("tool1", "h1"), ("tool0", "h4"), ("tool1", "nothing")],
            [("p1", "tool0")],
        ),
        ([("tool1", "h3"), ("tool0", "h8")], []),
        ([("tool0", f"h{i % 9}") for i in range(3)], [("p0", "tool1"), ("p2", "tool0")]),
        ([("tool0", f"x{i}") for i in range(300)] + [("tool1", "h5")], [("p2", "tool1")] * 150),
    ],
    ids=["signatures and a spot", "no spot", "spots", "over PAIRS_PER_READ"],
)
async def test_the_adoption_read_with_bound_pairs_finds_what_the_json_read_finds(
    signatures: list[tuple[str, str]], spots: list[tuple[str, str]], tmp_path: Any
) -> None:
    """``step_candidates`` finds the rows ``SELECT_STEP_CANDIDATES`` finds, in the same
    order (rowid), each pair a probe of its index (no scan of the ledger)."""
    conn = await ledger_file(os.path.join(tmp_path, "l.db"))
    try:
        lookup_rows(conn)
        lookup = StepLookup("s", "agent", signatures, spots)
        query, params = ledger_batch.step_candidates(lookup)
        n_pairs = len(signatures) + len(spots)
        assert (query == sql.SELECT_STEP_CANDIDATES) == (n_pairs > ledger_batch.PAIRS_PER_READ)
        found = conn.execute(query, params).fetchall()
        assert found == conn.execute(sql.SELECT_STEP_CANDIDATES, step_params(lookup)).fetchall()
        assert found  # the read sees rows (the comparison is not of two empty answers)
        plan = [r[3] for r in conn.execute("EXPLAIN QUERY PLAN " + query, params)]
        assert not [p for p in plan if p.startswith("SCAN") and "idem_tool_calls" in p], plan
    finally:
        conn.close()


@pytest.mark.parametrize("sealed", [False, True])
def test_a_claims_entries_built_at_once_equal_those_built_one_by_one(sealed: bool) -> None:
    """``Claims.issued_entries`` (one dict copied an entry, ``records_over``; with sealed
    args, from columns) equals ``issued_entry`` row by row: every field, in field order."""
    rows = [row(i) for i in range(5)]
    clear = [b"clear %d" % i for i in range(5)] if sealed else None
    claims = Claims(rows, "me", 100.0, 400.0, clear_args=clear)
    at_once = claims.issued_entries()
    one_by_one = [claims.issued_entry(i) for i in range(5)]
    assert at_once == one_by_one
    assert [vars(e) for e in at_once] == [vars(e) for e in one_by_one]
    fields = [f.name for f in dataclasses.fields(LedgerEntry)]
    assert all(list(vars(e)) == fields for e in at_once)
    assert [e.args for e in at_once] == (clear or [r[6] for r in rows])
    assert {e.status.value for e in at_once} == {"issued"}


def listed(cursor: sqlite3.Cursor, values: tuple[Any, ...]) -> list[Any]:
    """A user's row factory whose rows are lists (unhashable, never equal to a tuple)."""
    return list(values)


async def claims_over_factory(path: str, factory: Any) -> tuple[list[Any], list[Any]]:
    """A fresh step's claim, a second claim finding its keys taken, a step claim and the
    outcomes, through a saver over the user's aiosqlite connection whose ``row_factory``
    is ``factory``: the claims' answers and the outcomes' errors."""
    async with aiosqlite.connect(path) as conn:
        conn.row_factory = factory
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        fresh = await saver.aclaim(intents(5), owner="me", lease_seconds=60)
        again = await saver.aclaim(intents(6), owner="me", lease_seconds=60)
        step = [
            CallIntent(**dict(zip(INTENT_COLUMNS, row(i, scope="t"), strict=True)))
            for i in range(4)
        ]
        lookup = StepLookup("t", "agent", [("charge", "h")], [])
        stepped = await saver.aclaim_step(step, lookup, owner="me", lease_seconds=60)
        assert stepped.claimed is not None
        errors = await saver.record_outcome_rows([outcome(i) for i in range(6)])
        claimed = [o.claimed for o in (*fresh, *again, *stepped.claimed)]
        keys = [o.entry.key for o in (*fresh, *again, *stepped.claimed)]
        return list(zip(claimed, keys, strict=True)), errors


@pytest.mark.parametrize("factory", [sqlite3.Row, listed], ids=["sqlite3.Row", "lists"])
async def test_a_users_row_factory_changes_no_answer(factory: Any, tmp_path: Any) -> None:
    """The pairs a statement's ``RETURNING`` answers are compared as tuples whatever rows
    the user's connection makes (``sqlite3.Row`` rows equal no tuple: every fresh claim
    was answered "taken", every outcome "not matched"), as with the default rows."""
    plain = await claims_over_factory(os.path.join(tmp_path, "plain.db"), None)
    assert [claimed for claimed, _ in plain[0]] == [True] * 5 + [False] * 5 + [True] * 5
    assert plain[1] == [None] * 6
    assert await claims_over_factory(os.path.join(tmp_path, "factory.db"), factory) == plain


def bind_at_most(conn: sqlite3.Connection, n: int) -> None:
    """Lower ``conn``'s limit of parameters a statement (Python 3.11+: ``setlimit``)."""
    if sys.version_info >= (3, 11):
        conn.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, n)


@pytest.mark.skipif(sys.version_info < (3, 11), reason="setlimit/getlimit: Python 3.11+")
def test_a_connection_of_few_parameters_gets_statements_that_fit(
    files: tuple[sqlite3.Connection, sqlite3.Connection],
) -> None:
    """A connection whose SQLite binds fewer parameters than a statement of 64 rows needs
    (a build's ``SQLITE_MAX_VARIABLE_NUMBER``, or ``setlimit``): the claim, the outcomes
    and the adoption read are cut to statements that fit (they failed "too many SQL
    variables"), and answer and write what a statement a row does."""
    at_once, by_row = files
    bind_at_most(at_once, 100)  # 8 claim rows a statement
    claim = [row(i) for i in range(30)]
    assert ledger_batch.claim_inserted(at_once, claim, SHARED) == inserted_by_row(by_row, claim)
    rows = [outcome(i) for i in range(30)]
    seen: list[int] = []

    def each(conn: sqlite3.Connection, chunk: Any) -> list[bool | Exception]:
        seen.append(len(chunk))
        return _each_matched(conn, chunk)

    assert ledger_batch.outcomes_matched(at_once, rows, each) == [True] * 30
    assert seen == []  # no statement refused: none went row by row
    assert _each_matched(by_row, rows) == [True] * 30
    assert rows_of(at_once) == rows_of(by_row)
    lookup = StepLookup("s", "agent", [("charge", "h")] * 40, [("p", "charge")] * 20)
    found = at_once.execute(*ledger_batch.step_candidates(lookup, at_once)).fetchall()
    assert len(found) == 30
    assert found == at_once.execute(sql.SELECT_STEP_CANDIDATES, step_params(lookup)).fetchall()
    bind_at_most(at_once, 20)  # not two claim rows
    assert ledger_batch.claim_inserted(at_once, [row(40), row(41)], SHARED) is None


def test_the_one_statement_path_waits_for_returning_fixed() -> None:
    """SQLite 3.35.0-3.35.3 had ``RETURNING`` defects (fixed in 3.35.4): there, and before
    3.35, a statement a row; this library's version decides ``AT_ONCE``."""
    assert not ledger_batch.supported((3, 34, 1))
    assert not ledger_batch.supported((3, 35, 0))
    assert not ledger_batch.supported((3, 35, 3))
    assert ledger_batch.supported((3, 35, 4))
    assert ledger_batch.supported((3, 40, 1))
    assert ledger_batch.supported(sqlite3.sqlite_version_info) == ledger_batch.AT_ONCE


async def claims_under_limit(path: str, limit: int | None) -> list[Any]:
    """Through a saver whose connection binds at most ``limit`` parameters a statement: a
    fresh claim of 70 calls, the same claim again (70 keys taken, read back), a step
    claim that finds them (60 pairs), and the outcomes; every answer."""
    async with aiosqlite.connect(path, check_same_thread=False) as conn:
        saver = AsyncSqliteSaver(conn)
        await saver.setup()
        if limit is not None:
            bind_at_most(runner.raw_connection(conn), limit)
        fresh = await saver.aclaim(intents(70), owner="me", lease_seconds=60)
        again = await saver.aclaim(intents(70), owner="me", lease_seconds=60)
        lookup = StepLookup("s", "agent", [("charge", "h")] * 40, [("p", "charge")] * 20)
        stepped = await saver.aclaim_step(intents(2), lookup, owner="me", lease_seconds=60)
        errors = await saver.record_outcome_rows([outcome(i) for i in range(70)])
    return [
        [(o.claimed, o.entry.key) for o in fresh],
        [(o.claimed, o.entry.key, o.entry.owner) for o in again],
        stepped.claimed,
        len(stepped.candidates.by_signature.get(("charge", "h"), [])),
        errors,
    ]


@pytest.mark.skipif(sys.version_info < (3, 11), reason="setlimit/getlimit: Python 3.11+")
async def test_a_saver_binding_few_parameters_answers_as_one_binding_many(
    tmp_path: Any,
) -> None:
    """The claims, the refused keys' read-back, the adoption read and the outcomes fit a
    connection of 100 parameters a statement (``SELECT`` of 70 taken keys was 140) and
    answer as with the default limit."""
    many = await claims_under_limit(os.path.join(tmp_path, "many.db"), None)
    few = await claims_under_limit(os.path.join(tmp_path, "few.db"), 100)
    assert few == many
    assert [claimed for claimed, _ in many[0]] == [True] * 70
    assert [(claimed, owner) for claimed, _, owner in many[1]] == [(False, "me")] * 70
    assert many[2] is None and many[3] == 70  # the step found the 70 entries
    assert many[4] == [None] * 70
