"""The tool-call ledger's SQL on PostgreSQL: a :class:`~langgraph_idem_saver.backend.
LedgerStatements` (the base's ``_sql``), plus the batch claim's statements.

Kept apart from the checkpoint SQL (``sql.py``) because the ledger's statements are the
backend contract the policy in ``saver_base`` is written against; the tables themselves
are created by ``sql.MIGRATIONS``.
"""

from __future__ import annotations

from langgraph_idem_saver.backend import LEDGER_COLUMNS

# LEDGER_COLUMNS (imported above): LedgerEntry's fields, in order

# The claim: one INSERT for the whole batch (an array per INTENT_COLUMNS name); the keys
# it inserted come back.
INSERT_ISSUED = """
INSERT INTO idem_tool_calls
    (scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     position, branch, occurrence, status, attempts, owner, issued_at, lease_expires_at)
SELECT u.scope, u.key, u.thread_id, u.agent_path, u.tool_name, u.args_hash, u.args,
       u.tool_call_id, u.run_id, u.position, u.branch, u.occurrence,
       'issued', 1, %(owner)s, %(now)s, %(lease)s
FROM unnest(%(scope)s::text[], %(key)s::text[], %(thread_id)s::text[],
            %(agent_path)s::text[], %(tool_name)s::text[], %(args_hash)s::text[],
            %(args)b::bytea[], %(tool_call_id)s::text[], %(run_id)s::text[],
            %(position)s::text[], %(branch)s::text[], %(occurrence)s::int[])
     WITH ORDINALITY AS u(scope, key, thread_id, agent_path, tool_name, args_hash, args,
                          tool_call_id, run_id, position, branch, occurrence, ord)
ORDER BY u.ord
ON CONFLICT DO NOTHING
RETURNING scope, key
"""

# the entries holding fork slots (claims refused by the slot, not by the key)
SELECT_SLOT_HOLDERS = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE position IS NOT NULL
  AND (scope, position, tool_name, args_hash, occurrence) IN (
      SELECT * FROM unnest(%(scope)s::text[], %(position)s::text[], %(tool_name)s::text[],
                           %(args_hash)s::text[], %(occurrence)s::int[]))
"""

# every entry made at one position by one tool (calls of the same step, any branch)
SELECT_AT_POSITION = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE scope = %s AND position = %s AND tool_name = %s
ORDER BY seq
"""

# The read-back, a separate statement of the same transaction: under READ COMMITTED it
# takes a new snapshot, so it sees a row a concurrent claimer committed after ours began.
SELECT_ENTRIES_BY_KEYS = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE (scope, key) IN (SELECT * FROM unnest(%(scope)s::text[], %(key)s::text[]))
"""

SELECT_ENTRY = f"SELECT {LEDGER_COLUMNS} FROM idem_tool_calls WHERE scope = %s AND key = %s"

FINISH_ENTRY = f"""
UPDATE idem_tool_calls
SET status = %s, result_type = %s, result = %s, error = %s, finished_at = %s
WHERE scope = %s AND key = %s AND status = 'issued' AND owner = %s
RETURNING {LEDGER_COLUMNS}
"""

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

# orphan adoption's two look-ups for every call of a step in ONE read (engine/adoption.py):
# the entries of each call signature (the signature index) and those each tool made at
# each position (the fork-slot index); signatures and spots are JSON arrays of pairs
SELECT_STEP_CANDIDATES = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE (scope, key) IN (
    SELECT scope, key FROM idem_tool_calls
    WHERE scope = %s AND agent_path = %s AND (tool_name, args_hash) IN (
        SELECT s ->> 0, s ->> 1 FROM json_array_elements(%s::json) AS s)
    UNION
    SELECT scope, key FROM idem_tool_calls
    WHERE scope = %s AND position IS NOT NULL AND (position, tool_name) IN (
        SELECT s ->> 0, s ->> 1 FROM json_array_elements(%s::json) AS s))
ORDER BY seq
"""
