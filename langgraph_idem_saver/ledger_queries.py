"""The ledger's SQL, written once for both dialects.

Most ledger statements read the same in SQLite and PostgreSQL but for three things: the
parameter marker (``?`` or ``%s``), the column that orders entries oldest first
(``rowid`` or ``seq``) and what a guarded UPDATE yields (nothing, the saver reads the
entry back; or ``RETURNING`` its columns). Those are written here once, with ``?`` for a
parameter; each backend's SQL module is a :class:`Dialect` (the three, and the
statements it writes its own way) and its saver's ``_sql`` is ``LedgerSql(module)``.
"""

from __future__ import annotations

from typing import Protocol

from langgraph_idem_saver.backend import INTENT_COLUMNS, LEDGER_COLUMNS


class Dialect(Protocol):
    """What a backend's ledger SQL module provides (bound as ``LedgerStatements`` says)."""

    MARKER: str  # a positional parameter
    ORDER: str  # the column ordering entries oldest first
    RETURNING: str  # what a guarded UPDATE yields ("" when the saver reads the row back)
    # written per dialect: read by the backend's ledger_store too, or unlike in SQL
    SELECT_ENTRY: str
    SELECT_AT_POSITION: str
    SELECT_STEP_CANDIDATES: str
    RELEASE_ENTRY: str
    ADOPT_ENTRY: str


_SELECT = f"SELECT {LEDGER_COLUMNS} FROM idem_tool_calls"

# every entry of one call signature, adopted or not (the idem_tool_calls_signature index)
_SELECT_ORPHAN_CANDIDATES = f"""
{_SELECT}
WHERE scope = ? AND agent_path = ? AND tool_name = ? AND args_hash = ?
ORDER BY {{order}}
"""

_RECLAIM_ENTRY = """
UPDATE idem_tool_calls
SET attempts = attempts + 1, owner = ?, issued_at = ?, lease_expires_at = ?
WHERE scope = ? AND key = ? AND status = 'issued' AND attempts = ? AND owner = ?
{returning}"""

# the tool raised: keep the row issued (its effect may have happened) and end the lease
_ABANDON_ENTRY = """
UPDATE idem_tool_calls SET lease_expires_at = ?, error = ?
WHERE scope = ? AND key = ? AND status = 'issued' AND owner = ?
{returning}"""

_RESOLVE_ENTRY = """
UPDATE idem_tool_calls
SET status = ?, result_type = ?, result = ?, error = ?, finished_at = ?
WHERE scope = ? AND key = ? AND status = 'issued' AND attempts = ? AND owner = ?
{returning}"""

# A model's answer recorded in one commit (answer_records.py): the entry inserted
# ``completed``, or nothing when its key is taken (the caller reads the winner back).
_INSERT_ANSWER = f"""
INSERT INTO idem_tool_calls
    ({", ".join(INTENT_COLUMNS)}, status, attempts, owner, issued_at, lease_expires_at,
     result_type, result, finished_at)
VALUES ({", ".join("?" * len(INTENT_COLUMNS))}, 'completed', 1, ?, ?, ?, ?, ?, ?)
ON CONFLICT DO NOTHING
"""

# An operator's decision, guarded by what they looked at (status, attempts, owner).
_OPERATOR_UPDATE = """
UPDATE idem_tool_calls
SET status = ?, owner = ?, lease_expires_at = ?, result_type = ?, result = ?,
    error = ?, finished_at = ?, history = ?
WHERE scope = ? AND key = ? AND status = ? AND attempts = ? AND owner = ?
{returning}"""


class LedgerSql:
    """The ``LedgerStatements`` of one dialect: its own statements as it writes them, the
    shared ones from the templates above."""

    def __init__(self, dialect: Dialect) -> None:
        def shared(template: str) -> str:
            filled = template.format(order=dialect.ORDER, returning=dialect.RETURNING)
            return filled.replace("?", dialect.MARKER)

        self.SELECT_ENTRY = dialect.SELECT_ENTRY
        self.SELECT_AT_POSITION = dialect.SELECT_AT_POSITION
        self.SELECT_STEP_CANDIDATES = dialect.SELECT_STEP_CANDIDATES
        self.RELEASE_ENTRY = dialect.RELEASE_ENTRY
        self.ADOPT_ENTRY = dialect.ADOPT_ENTRY
        self.SELECT_ORPHAN_CANDIDATES = shared(_SELECT_ORPHAN_CANDIDATES)
        self.SELECT_ALL_ENTRIES = shared(f"{_SELECT} ORDER BY {{order}}")
        self.SELECT_ENTRIES_OF_THREAD = shared(f"{_SELECT} WHERE thread_id = ? ORDER BY {{order}}")
        self.SELECT_ENTRIES_OF_AGENT = shared(
            f"{_SELECT} WHERE thread_id = ? AND agent_path = ? ORDER BY {{order}}"
        )
        # every issued row (few: the partial index holds only them); the caller keeps those
        # whose lease expired or whose owner process is gone (LedgerEntry.is_unknown).
        # ``+``: ordered by the bare rowid, SQLite without statistics scans the whole
        # table in rowid order rather than sort the few rows its partial index finds
        # (18 against 0.2 ms at 200,000 entries); PostgreSQL has no such index.
        self.SELECT_ISSUED = shared(f"{_SELECT} WHERE status = 'issued' ORDER BY +{{order}}")
        self.RECLAIM_ENTRY = shared(_RECLAIM_ENTRY)
        self.ABANDON_ENTRY = shared(_ABANDON_ENTRY)
        self.RESOLVE_ENTRY = shared(_RESOLVE_ENTRY)
        self.OPERATOR_UPDATE = shared(_OPERATOR_UPDATE)
        self.INSERT_ANSWER = shared(_INSERT_ANSWER)
        note = "UPDATE idem_tool_calls SET {0} = {0} + 1 WHERE scope = ? AND key = ?"
        self.NOTE_REPLAY = shared(note.format("replays"))
        self.NOTE_CONFLICT = shared(note.format("conflicts"))
