"""The tool-call ledger's SQL on PostgreSQL: a :class:`~langgraph_idem_saver.backend.
LedgerStatements` (the base's ``_sql``), plus the batch claim's statements.

Kept apart from the checkpoint SQL (``sql.py``) because the ledger's statements are the
backend contract the policy in ``ledger_policy`` is written against; the tables themselves
are created by ``migrations.MIGRATIONS``.
"""

from __future__ import annotations

from langgraph_idem_saver.backend import LEDGER_COLUMNS
from langgraph_idem_saver.postgres.functions import plpgsql_function

# LEDGER_COLUMNS (imported above): LedgerEntry's fields, in order
_COLUMNS = LEDGER_COLUMNS.split(", ")

# The step's calls as one JSON document (``claim_rows``/``finish_rows``): one parameter
# whatever the batch size - psycopg dumps a 50-element array per column in Python, which
# cost more than the statement itself. ``json``, not ``jsonb``: read once, it is cheaper
# to parse (~35 us for 50 rows).
_CLAIM_ROWS = """
json_to_recordset(%(rows)s::json) AS u(
    scope text, key text, thread_id text, agent_path text, tool_name text,
    args_hash text, args text, tool_call_id text, run_id text, position text,
    branch text, occurrence int, ord int)
"""


# What orphan adoption looks at for a step: the entries of each call signature (the
# signature index) and those each tool made at each position (the fork-slot index);
# signatures and spots are JSON arrays of pairs. Every query below probes one of those
# two indexes by equality on its leading columns, so the plan PostgreSQL caches for it
# (a generic plan, after five calls) is safe however the ledger grows: with sequential
# scans off, it can only be that index.
#
# A step of one call (one signature, at most one spot: most agent steps) takes one static
# query of scalar conditions (migration 8). A row found by both branches comes back once.
#
# A step of several calls (migration 14) takes one static query per tool of its
# signatures - a probe of the signature index per args hash (a nested loop over the
# hashes, the probe fenced with OFFSET 0, all four columns by equality: the hash a plain
# column of ``unnest``, the rest parameters, as in the one-call query) - then the spot
# query once per spot (a step has one position). Before, one query for the whole step
# was planned on every call (EXECUTE: a plan cached while the ledger was small had
# scanned it once per signature, 8 ms a 50-call claim after a few thousand calls); the
# planning cost more than the probes: a 50-call claim took ~1.48 ms, now ~1.31
# (benchmarks/README.md). Not ``args_hash = ANY(hashes)``: the generic plan PostgreSQL
# caches for it under stale statistics probes by tool alone and filters the hashes
# (every row the thread made with that tool, per step).
# ``search_path FROM CURRENT``: the function reads the tables of the schema it was
# created in (migration 7), whoever calls it.
STEP_FOUND_FUNCTION = plpgsql_function(
    """idem_step_found(
    p_scope text, p_agent_path text, p_signatures json, p_spots json)""",
    "SETOF idem_tool_calls",
    """
DECLARE
    v_tool text := p_signatures -> 0 ->> 0;
    v_hash text := p_signatures -> 0 ->> 1;
    v_position text := p_spots -> 0 ->> 0;
    v_spot_tool text := p_spots -> 0 ->> 1;
    v_hashes text[];
BEGIN
    IF json_array_length(p_signatures) = 1 AND json_array_length(p_spots) <= 1 THEN
        RETURN QUERY
        SELECT c.* FROM idem_tool_calls AS c
        WHERE c.scope = p_scope AND c.agent_path = p_agent_path
            AND c.tool_name = v_tool AND c.args_hash = v_hash
        UNION ALL
        SELECT c.* FROM idem_tool_calls AS c
        WHERE c.scope = p_scope AND c.position = v_position AND c.tool_name = v_spot_tool
            AND NOT coalesce(c.agent_path = p_agent_path AND c.tool_name = v_tool
                AND c.args_hash = v_hash, false);
        RETURN;
    END IF;
    FOR v_tool, v_hashes IN
        SELECT s ->> 0, array_agg(DISTINCT s ->> 1) FROM json_array_elements(p_signatures) AS s
        GROUP BY 1
    LOOP
        RETURN QUERY
        SELECT c.* FROM unnest(v_hashes) AS h(hash)
        CROSS JOIN LATERAL (
            SELECT x.* FROM idem_tool_calls AS x
            WHERE x.scope = p_scope AND x.agent_path = p_agent_path
                AND x.tool_name = v_tool AND x.args_hash = h.hash OFFSET 0) AS c;
    END LOOP;
    FOR v_position, v_spot_tool IN
        SELECT DISTINCT s ->> 0, s ->> 1 FROM json_array_elements(p_spots) AS s
    LOOP
        RETURN QUERY
        SELECT c.* FROM idem_tool_calls AS c
        WHERE c.scope = p_scope AND c.position IS NOT NULL AND c.position = v_position
            AND c.tool_name = v_spot_tool
            AND NOT (c.agent_path = p_agent_path AND EXISTS (
                SELECT 1 FROM json_array_elements(p_signatures) AS s
                WHERE s ->> 0 = c.tool_name AND s ->> 1 = c.args_hash));
    END LOOP;
END
""",
)

# the adoption read inside the claim: named parameters, ``seq`` first (oldest first)
_STEP_FOUND = f"""
SELECT seq, {LEDGER_COLUMNS} FROM idem_step_found(
    %(scope)s, %(agent_path)s, %(signatures)s::json, %(spots)s::json)
"""


def _claim_statement(unless_found: bool) -> str:
    """The claim, ONE statement (autocommit: one round trip, one commit).

    It inserts an ``issued`` row for every call whose key and fork slot are free, and
    returns, tagged, the keys it inserted (``i``), the rows already under the keys
    (``k``) and the rows holding the slots (``s``: a claim refused by the slot, not by
    the key). The statement's snapshot cannot see rows a concurrent claimer committed
    after it began (ON CONFLICT waited for them): those calls come back with no row, and
    the caller claims them again (a new statement, a new snapshot).

    ``unless_found``: first the step's adoption read (``f`` rows); when it finds
    anything, nothing is inserted - adoption decides first, then the caller claims -
    unless all it found are inert (``StepLookup.inert``: the entries of the other calls
    of the step's message, adopted by nobody, which adoption never takes): then the
    claim goes on in the same statement and no ``f`` row comes back.

    The ``k`` and ``s`` reads run only when some row was not inserted (``refused``: a
    one-time filter, so a fresh step's claim is the insert alone). Without it they cost
    as much as the insert, and on a table whose statistics are stale the planner scans
    the whole ledger for them: a claim then grows with the table.
    """
    # an inserted row comes back as its key alone (the caller builds its entry:
    # ``Claims.issued_entry``); NULLs take the other rows' column types
    inserted = ", ".join(c if c in ("scope", "key") else "NULL" for c in _COLUMNS)
    found = (
        f""", found AS ({_STEP_FOUND}),
blocking AS (
    SELECT 1 FROM found
    WHERE NOT (key = ANY(%(inert)s::text[]) AND adopted_by IS NULL) LIMIT 1)"""
        if unless_found
        else ""
    )
    only = "AND NOT EXISTS (SELECT 1 FROM blocking)" if unless_found else ""
    refused = "(SELECT count(*) FROM ins) < (SELECT count(*) FROM u)"
    found_rows = (
        "SELECT 'f', * FROM found WHERE EXISTS (SELECT 1 FROM blocking) UNION ALL"
        if unless_found
        else ""
    )
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

# An outcome's commit waits for the WAL flush (the server's ``synchronous_commit``, on by
# default), as a claim's does. It once set ``synchronous_commit`` off for its own
# transaction (flushed with the step's checkpoint write, the WAL being one sequence), but
# a *server* crash does not take the client with it: the unflushed outcome was lost, the
# pool reconnected, the step's checkpoint writes landed on the restarted server, and the
# ledger kept the call ``issued`` under a thread that had used its result
# (tests/test_db_restart.py). The flush is one a batch of outcomes (group_commit.py).

# The outcomes of calls that finished together, ONE statement: per row the entry as
# finished; a row not returned was not ours to finish (no longer issued, or re-owned).
# A function (migration 13), so the statement sent is prepared like any other; its
# UPDATE is planned on every call (``plan_each_call``), for the ledger as it is. A cached
# plan is not safe here: prepared as a plain UPDATE, the generic plan cached while the
# ledger was small hashed a sequential scan of the whole ledger into every later step
# (step times grew 13% over 10k calls), and with hash joins off as well it read the whole
# primary key index instead (the empty table as the outer side of the join). Sent
# unprepared before, as the UPDATE itself: the function saves the outer statement's
# parse and plan, and ``json`` (read once) parses faster than ``jsonb``: 50 outcomes
# ~0.65 -> ~0.59 ms, 5 outcomes ~0.31 -> ~0.26 ms (tests/test_postgres_ledger_statements.py).
FINISH_STEP_FUNCTION = plpgsql_function(
    "idem_finish_step(p_rows json)",
    "SETOF idem_tool_calls",
    """
BEGIN
    RETURN QUERY
    UPDATE idem_tool_calls AS t
    SET status = u.status, result_type = u.result_type,
        result = decode(u.result, 'base64'), error = u.error, finished_at = u.finished_at
    FROM json_to_recordset(p_rows) AS u(
        status text, result_type text, result text, error text,
        finished_at double precision, scope text, key text, owner text)
    WHERE t.scope = u.scope AND t.key = u.key AND t.status = 'issued'
        AND t.owner = u.owner
    RETURNING t.*;
END
""",
    volatile=True,
    plan_each_call=True,
)
# the keys of the rows it finished (all the engine needs: which outcomes were recorded)
FINISH_STEP_KEYS = "SELECT scope, key FROM idem_finish_step(%s::json)"

# One outcome alone (a lone call, or a call finishing by itself): a function of the
# plain UPDATE on the primary key (migration 8), so the statement sent is prepared like
# any other. Sent unprepared in a JSON form, one outcome cost ~0.4 ms instead of ~0.25
# (parse and plan). In a function, with sequential scans off, because a plan
# cached while the ledger was empty (VACUUMed: known to hold no row) is a sequential
# scan even for equality on the whole primary key, and would stay one as the ledger
# grows (tests/test_postgres_ledger_statements.py).
FINISH_ONE_FUNCTION = plpgsql_function(
    """idem_finish_one(
    p_status text, p_result_type text, p_result bytea, p_error text,
    p_finished_at double precision, p_scope text, p_key text, p_owner text)""",
    "SETOF idem_tool_calls",
    """
BEGIN
    RETURN QUERY
    UPDATE idem_tool_calls AS t
    SET status = p_status, result_type = p_result_type, result = p_result,
        error = p_error, finished_at = p_finished_at
    WHERE t.scope = p_scope AND t.key = p_key AND t.status = 'issued' AND t.owner = p_owner
    RETURNING t.*;
END
""",
    volatile=True,
)
FINISH_ONE_KEY = "SELECT scope, key FROM idem_finish_one(%s, %s, %s, %s, %s, %s, %s, %s)"

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
SELECT_STEP_CANDIDATES = f"""
SELECT {LEDGER_COLUMNS} FROM (
    SELECT %s::text AS a_scope, %s::text AS a_agent_path, %s::json AS a_signatures,
        %s::text AS a_same_scope, %s::json AS a_spots) AS a
CROSS JOIN LATERAL idem_step_found(a.a_scope, a.a_agent_path, a.a_signatures, a.a_spots)
ORDER BY seq
"""
