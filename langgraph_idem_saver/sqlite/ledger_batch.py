"""A wide step's ledger rows on SQLite in one statement each, where SQLite can say which
rows it wrote: the claim's ``INSERT``s as one multi-row ``INSERT ... RETURNING``, the
outcomes' ``UPDATE``s as one ``UPDATE ... FROM (VALUES ...) RETURNING``; and the claim's
adoption read with its signatures and spots bound as parameters (``step_candidates``).

Each row as its own statement costs the driver's bind, step and reset a row; one
statement for a step's 50 rows spends that once (``benchmarks/README.md``, "the claim's
and the outcomes' rows in one statement"). The answer per row is the same as the
statement-a-row path's, because ``(scope, key)`` is the primary key: a row whose pair
comes back was written by this statement, and only then - so the path is taken only
when the rows' pairs are distinct (two rows of one pair: row by row, as before, the
first wins). ``RETURNING`` needs SQLite 3.35 (``UPDATE ... FROM`` 3.33), and is taken from
3.35.4 (``supported``): older libraries keep the statement a row.

An outcome statement that fails (a row SQLite refuses) is undone whole by SQLite, and
its rows go row by row, so a refused row is still that row's error alone and the others
are recorded. A claim statement that fails fails the claim, as a failing row's
``INSERT`` did (its transaction, or its savepoint, is rolled back either way).
"""

from __future__ import annotations

import operator
import sqlite3
import sys
from collections.abc import Callable, Sequence
from typing import Any

from langgraph_idem_saver.backend import INTENT_COLUMNS, LEDGER_COLUMNS, step_params
from langgraph_idem_saver.ledger import StepLookup
from langgraph_idem_saver.sqlite import sql


def supported(version: tuple[int, ...]) -> bool:
    """Whether the SQLite library ``version`` takes the one-statement path: ``RETURNING``
    (3.35; ``UPDATE ... FROM`` 3.33), from the fixes of 3.35.4 ("Fix a defect in the new
    RETURNING syntax"; before them ``RETURNING`` was reported to answer no row for a row
    it wrote, which would read every fresh claim as "taken")."""
    return version >= (3, 35, 4)


AT_ONCE = supported(sqlite3.sqlite_version_info)
# rows a statement: 12 * 64 + 3 = 771 parameters, under the 999 of SQLite before 3.32
# (32766 since); fewer on a connection that binds fewer (``variables``)
ROWS_PER_STATEMENT = 64

_PAIR = operator.itemgetter(0, 1)  # (scope, key) of a claim row
_OUTCOME_PAIR = operator.itemgetter(5, 6)  # (scope, key) of an outcome row (FINISH_ENTRY)
_OUTCOME_WIDTH = 8  # FINISH_ENTRY's parameters
_SHARED = 3  # ?1 owner, ?2 issued_at, ?3 lease_expires_at: bound once a statement

_inserts: dict[int, str] = {}
_updates: dict[int, str] = {}


def insert_sql(n: int) -> str:
    """``sql.INSERT_ISSUED`` for ``n`` rows at once, answering the pairs it inserted."""
    query = _inserts.get(n)
    if query is None:
        width = len(INTENT_COLUMNS)
        rows = ", ".join(
            "("
            + ", ".join(f"?{_SHARED + 1 + width * i + j}" for j in range(width))
            + ", 'issued', 1, ?1, ?2, ?3)"
            for i in range(n)
        )
        query = _inserts[n] = (
            f"INSERT INTO idem_tool_calls ({', '.join(INTENT_COLUMNS)}, status, attempts, "
            f"owner, issued_at, lease_expires_at) VALUES {rows} "
            "ON CONFLICT DO NOTHING RETURNING scope, key"
        )
    return query


def update_sql(n: int) -> str:
    """``sql.FINISH_ENTRY`` for ``n`` rows at once (each row's eight parameters in
    ``FINISH_ENTRY``'s order), answering the pairs it updated."""
    query = _updates.get(n)
    if query is None:
        values = ", ".join(["(?, ?, ?, ?, ?, ?, ?, ?)"] * n)
        query = _updates[n] = (
            "UPDATE idem_tool_calls AS t SET status = v.column1, result_type = v.column2, "
            "result = v.column3, error = v.column4, finished_at = v.column5 "
            f"FROM (VALUES {values}) AS v "
            "WHERE t.scope = v.column6 AND t.key = v.column7 AND t.status = 'issued' "
            "AND t.owner = v.column8 RETURNING scope, key"
        )
    return query


def returned(conn: sqlite3.Connection, query: str, params: Sequence[Any]) -> set[Any]:
    """The ``(scope, key)`` pairs ``query``'s ``RETURNING`` answered, as tuples whatever
    the connection's ``row_factory`` (a user's connection may make ``sqlite3.Row``s, which
    equal no tuple, or lists, which do not hash): a cursor of plain rows."""
    cursor = conn.cursor()
    cursor.row_factory = None
    return set(cursor.execute(query, params).fetchall())


if sys.version_info >= (3, 11):

    def variables(conn: sqlite3.Connection) -> int:
        """The most parameters a statement on ``conn`` may bind: its limit (a build's
        ``SQLITE_MAX_VARIABLE_NUMBER``, or ``setlimit``)."""
        return conn.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)

else:

    def variables(conn: sqlite3.Connection) -> int:
        """999: the least default of any SQLite (Python 3.10 cannot read the limit)."""
        return 999


def rows_per_statement(conn: sqlite3.Connection, width: int, shared: int = 0) -> int:
    """Rows of ``width`` parameters (and ``shared`` once) a statement: at most
    ``ROWS_PER_STATEMENT``, fewer where the connection binds fewer parameters."""
    return min(ROWS_PER_STATEMENT, (variables(conn) - shared) // width)


def distinct(pairs: list[tuple[Any, Any]]) -> bool:
    """Several rows, no (scope, key) twice: what the one-statement path needs."""
    return AT_ONCE and len(pairs) > 1 and len(set(pairs)) == len(pairs)


def claim_inserted(
    conn: sqlite3.Connection, rows: Sequence[tuple[Any, ...]], shared: tuple[Any, ...]
) -> list[int] | None:
    """Per claim row (``INTENT_COLUMNS``), 1 if inserted, 0 if refused (its key or its
    fork slot taken) - ``INSERT_ISSUED``'s rowcount a row; None when the rows are not for
    one statement (``distinct``): the caller inserts them a row at a time."""
    pairs = list(map(_PAIR, rows))
    if not distinct(pairs):
        return None
    per = rows_per_statement(conn, len(INTENT_COLUMNS), _SHARED)
    if per < 2:
        return None
    got: set[tuple[Any, Any]] = set()
    for at in range(0, len(rows), per):
        chunk = rows[at : at + per]
        params = list(shared)
        for row in chunk:
            params.extend(row)
        got.update(returned(conn, insert_sql(len(chunk)), params))
    return [1 if pair in got else 0 for pair in pairs]


def outcomes_matched(
    conn: sqlite3.Connection,
    rows: Sequence[tuple[Any, ...]],
    each: Callable[[sqlite3.Connection, Sequence[tuple[Any, ...]]], list[bool | Exception]],
) -> list[bool | Exception]:
    """Per outcome row (``FINISH_ENTRY``'s parameters), whether its guard matched, or
    its error. ``each`` answers rows a statement each: every row when they are not
    ``distinct``, and the rows of a statement SQLite refused (it undid that statement
    whole). A failure that ended the transaction is raised."""
    pairs = list(map(_OUTCOME_PAIR, rows))
    per = rows_per_statement(conn, _OUTCOME_WIDTH)
    if not distinct(pairs) or per < 2:
        return each(conn, rows)
    matched: list[bool | Exception] = []
    for at in range(0, len(rows), per):
        chunk = rows[at : at + per]
        params = [part for row in chunk for part in row]
        try:
            got = returned(conn, update_sql(len(chunk)), params)
        except Exception:
            if not conn.in_transaction:
                raise
            matched.extend(each(conn, chunk))  # a row refused: its error alone, the rest recorded
            continue
        matched.extend(pair in got for pair in pairs[at : at + len(chunk)])
    return matched


# a step's adoption read with its pairs bound: 2 + 2 * 400 parameters at most
PAIRS_PER_READ = 400
_CANDIDATES = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE rowid IN (
    SELECT t.rowid FROM (VALUES {{signatures}}) AS s
    CROSS JOIN idem_tool_calls AS t ON t.scope = ?1 AND t.agent_path = ?2
        AND t.tool_name = s.column1 AND t.args_hash = s.column2{{spots}})
ORDER BY rowid
"""
_SPOTS = """
    UNION
    SELECT t.rowid FROM (VALUES {spots}) AS s
    CROSS JOIN idem_tool_calls AS t ON t.scope = ?1 AND t.position IS NOT NULL
        AND t.position = s.column1 AND t.tool_name = s.column2"""
_candidates: dict[tuple[int, int], str] = {}


def _pairs(first: int, n: int) -> str:
    return ", ".join(f"(?{first + 2 * i}, ?{first + 2 * i + 1})" for i in range(n))


def step_candidates(
    lookup: StepLookup, conn: sqlite3.Connection | None = None
) -> tuple[str, list[Any] | tuple[Any, ...]]:
    """``sql.SELECT_STEP_CANDIDATES`` and its parameters, or the same read with the
    signatures and spots bound as parameters (each a row of ``VALUES``, each one probe
    of its index, as the JSON pairs are: no ``json_each``/``json_extract`` a pair,
    ~3.4 against ~1.3 µs a call of a 50-call step), for a step of up to
    ``PAIRS_PER_READ`` pairs (fewer where ``conn`` binds fewer parameters)."""
    n, m = len(lookup.signatures), len(lookup.spots)
    most = PAIRS_PER_READ if conn is None else min(PAIRS_PER_READ, (variables(conn) - 2) // 2)
    if not n or n + m > most:
        return sql.SELECT_STEP_CANDIDATES, step_params(lookup)
    query = _candidates.get((n, m))
    if query is None:
        spots = _SPOTS.format(spots=_pairs(3 + 2 * n, m)) if m else ""
        query = _CANDIDATES.format(signatures=_pairs(3, n), spots=spots)
        if len(_candidates) < 256:  # the shapes a process sees: a few step widths
            _candidates[n, m] = query
    params: list[Any] = [lookup.scope, lookup.agent_path]
    for pair in lookup.signatures:
        params.extend(pair)
    for pair in lookup.spots:
        params.extend(pair)
    return query, params
