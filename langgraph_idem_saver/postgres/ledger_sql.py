"""The tool-call ledger's SQL on PostgreSQL: a :class:`~langgraph_idem_saver.backend.
LedgerStatements` (the base's ``_sql``), plus the batch claim's statements.

Kept apart from the checkpoint SQL (``sql.py``) because the ledger's statements are the
backend contract the policy in ``saver_base`` is written against; the tables themselves
are created by ``sql.MIGRATIONS``.
"""

from __future__ import annotations

from langgraph_idem_saver.backend import LEDGER_COLUMNS

# LEDGER_COLUMNS (imported above): LedgerEntry's fields, in order
_COLUMNS = LEDGER_COLUMNS.split(", ")

# The step's calls as one JSON document (``claim_rows``/``finish_rows``): one parameter
# whatever the batch size - psycopg dumps a 50-element array per column in Python, which
# cost more than the statement itself.
_CLAIM_ROWS = """
jsonb_to_recordset(%(rows)s::jsonb) AS u(
    scope text, key text, thread_id text, agent_path text, tool_name text,
    args_hash text, args text, tool_call_id text, run_id text, position text,
    branch text, occurrence int, ord int)
"""


def _step_found(scope: str, agent_path: str, signatures: str, spots: str, columns: str) -> str:
    """What orphan adoption looks at for a step: the entries of each call signature (the
    signature index) and those each tool made at each position (the fork-slot index);
    signatures and spots are JSON arrays of pairs. Each pair is one index probe, and so
    is the read of each row found: LATERAL subqueries fenced with ``OFFSET 0``. Written
    as joins or ``IN``, the planner hashed every row of the scope, or scanned the table:
    10-20 ms a step for a thread with 20k ledger rows. The parameters come first, in a
    one-row subquery, to keep ``step_params``' order. Written once for its two uses:
    with positional parameters (``SELECT_STEP_CANDIDATES``) and named, in the claim."""
    return f"""
SELECT {columns} FROM (
    SELECT t.scope AS found_scope, t.key AS found_key
    FROM (SELECT {scope} AS scope, {agent_path} AS agent_path) AS p
    CROSS JOIN json_array_elements({signatures}::json) AS s
    CROSS JOIN LATERAL (
        SELECT scope, key FROM idem_tool_calls
        WHERE scope = p.scope AND agent_path = p.agent_path
            AND tool_name = s ->> 0 AND args_hash = s ->> 1
        OFFSET 0) AS t
    UNION
    SELECT t.scope, t.key
    FROM (SELECT {scope} AS scope) AS p CROSS JOIN json_array_elements({spots}::json) AS s
    CROSS JOIN LATERAL (
        SELECT scope, key FROM idem_tool_calls
        WHERE scope = p.scope AND position IS NOT NULL
            AND position = s ->> 0 AND tool_name = s ->> 1
        OFFSET 0) AS t
) AS f
CROSS JOIN LATERAL (
    SELECT * FROM idem_tool_calls WHERE scope = f.found_scope AND key = f.found_key OFFSET 0
) AS e
"""


# the adoption read inside the claim: named parameters, ``seq`` first (oldest first)
_STEP_FOUND = _step_found(
    "%(scope)s", "%(agent_path)s", "%(signatures)s", "%(spots)s", f"seq, {LEDGER_COLUMNS}"
)


def _claim_statement(unless_found: bool) -> str:
    """The claim, ONE statement (autocommit: one round trip, one commit).

    It inserts an ``issued`` row for every call whose key and fork slot are free, and
    returns, tagged, the keys it inserted (``i``), the rows already under the keys
    (``k``) and the rows holding the slots (``s``: a claim refused by the slot, not by
    the key). The statement's snapshot cannot see rows a concurrent claimer committed
    after it began (ON CONFLICT waited for them): those calls come back with no row, and
    the caller claims them again (a new statement, a new snapshot).

    ``unless_found``: first the step's adoption read (``f`` rows); when it finds
    anything, nothing is inserted - adoption decides first, then the caller claims.

    The ``k`` and ``s`` reads run only when some row was not inserted (``refused``: a
    one-time filter, so a fresh step's claim is the insert alone). Without it they cost
    as much as the insert, and on a table whose statistics are stale the planner scans
    the whole ledger for them: a claim then grows with the table.
    """
    # an inserted row comes back as its key alone (the caller builds its entry:
    # ``Claims.issued_entry``); NULLs take the other rows' column types
    inserted = ", ".join(c if c in ("scope", "key") else "NULL" for c in _COLUMNS)
    found = f", found AS ({_STEP_FOUND})" if unless_found else ""
    only = "AND NOT EXISTS (SELECT 1 FROM found)" if unless_found else ""
    refused = "(SELECT count(*) FROM ins) < (SELECT count(*) FROM u)"
    found_rows = "SELECT 'f', * FROM found UNION ALL" if unless_found else ""
    return f"""
WITH u AS (SELECT * FROM {_CLAIM_ROWS}){found},
ins AS (
    INSERT INTO idem_tool_calls
        (scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id,
         run_id, position, branch, occurrence, status, attempts, owner, issued_at,
         lease_expires_at)
    SELECT scope, key, thread_id, agent_path, tool_name, args_hash,
           decode(args, 'base64'), tool_call_id, run_id, position, branch, occurrence,
           'issued', 1, %(owner)s, %(now)s, %(lease)s
    FROM u WHERE true {only} ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING seq, scope, key
)
{found_rows}
SELECT 'i', seq, {inserted} FROM ins
UNION ALL
SELECT 'k', seq, {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE {refused} AND (scope, key) IN (SELECT scope, key FROM u) {only}
UNION ALL
SELECT 's', seq, {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE {refused} AND position IS NOT NULL
AND (scope, position, tool_name, args_hash, occurrence) IN (
    SELECT scope, position, tool_name, args_hash, occurrence FROM u
    WHERE position IS NOT NULL) {only}
"""


CLAIM_STEP = _claim_statement(unless_found=False)
CLAIM_STEP_UNLESS_FOUND = _claim_statement(unless_found=True)

# every entry made at one position by one tool (calls of the same step, any branch)
SELECT_AT_POSITION = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE scope = %s AND position = %s AND tool_name = %s
ORDER BY seq
"""

SELECT_ENTRY = f"SELECT {LEDGER_COLUMNS} FROM idem_tool_calls WHERE scope = %s AND key = %s"

# The outcomes of calls that finished together, ONE statement: per row the entry as
# finished; a row not returned was not ours to finish (no longer issued, or re-owned).
FINISH_STEP = f"""
UPDATE idem_tool_calls AS t
SET status = u.status, result_type = u.result_type, result = decode(u.result, 'base64'),
    error = u.error, finished_at = u.finished_at
FROM jsonb_to_recordset(%s::jsonb) AS u(
    status text, result_type text, result text, error text, finished_at double precision,
    scope text, key text, owner text)
WHERE t.scope = u.scope AND t.key = u.key AND t.status = 'issued' AND t.owner = u.owner
RETURNING {", ".join("t." + c for c in LEDGER_COLUMNS.split(", "))}
"""
# the same, returning the keys alone (what the engine needs: which outcomes were recorded)
FINISH_STEP_KEYS = FINISH_STEP.split("RETURNING")[0] + "RETURNING t.scope, t.key\n"

RELEASE_ENTRY = """
DELETE FROM idem_tool_calls
WHERE scope = %s AND key = %s AND status = 'issued' AND owner = %s
RETURNING 1
"""

ADOPT_ENTRY = f"""
UPDATE idem_tool_calls SET adopted_by = %s
WHERE scope = %s AND key = %s AND adopted_by IS NOT DISTINCT FROM %s
RETURNING {LEDGER_COLUMNS}
"""

# the statements PostgreSQL writes like SQLite are ledger_queries.LedgerSql's, with these
MARKER = "%s"
ORDER = "seq"
RETURNING = f"RETURNING {LEDGER_COLUMNS}"

# orphan adoption's two look-ups for every call of a step in ONE read (engine/adoption.py);
# parameters: scope, agent_path, signatures, scope, spots (backend.step_params)
SELECT_STEP_CANDIDATES = _step_found("%s", "%s", "%s", "%s", LEDGER_COLUMNS) + "ORDER BY seq\n"
