"""Every SQL statement of the SQLite backend, and its migrations.

``MIGRATIONS[i]`` brings a database from schema version ``i - 1`` to ``i``; the versions
applied are recorded in ``idem_saver_migrations`` (as LangGraph's Postgres saver does),
so ``len(MIGRATIONS) - 1`` is the schema version this release writes. Never edit a
migration that has shipped: append a new one.

Tables carry an ``idem_`` prefix so a file that LangGraph's own SQLite saver also uses
(tables ``checkpoints`` / ``writes``) is never misread.

Channel values are stored once per (channel, version) in ``idem_blobs`` and written only
for ``new_versions``: a thread costs what it adds, not the whole state per checkpoint.
"""

from __future__ import annotations

from langgraph_idem_saver.backend import LEDGER_COLUMNS

MIGRATIONS: list[str] = [
    # 0: the bookkeeping table itself
    """
    CREATE TABLE IF NOT EXISTS idem_saver_migrations (v INTEGER PRIMARY KEY);
    """,
    # 1: checkpoints, blobs, writes
    """
    CREATE TABLE IF NOT EXISTS idem_checkpoints (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT NOT NULL,
        parent_checkpoint_id TEXT,
        run_id TEXT,
        type TEXT NOT NULL,
        checkpoint BLOB NOT NULL,
        metadata TEXT NOT NULL,
        channel_versions TEXT NOT NULL,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
    );
    CREATE INDEX IF NOT EXISTS idem_checkpoints_run_id
        ON idem_checkpoints (run_id) WHERE run_id IS NOT NULL;
    CREATE TABLE IF NOT EXISTS idem_blobs (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        channel TEXT NOT NULL,
        version TEXT NOT NULL,
        type TEXT NOT NULL,
        blob BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
    );
    CREATE TABLE IF NOT EXISTS idem_writes (
        thread_id TEXT NOT NULL,
        checkpoint_ns TEXT NOT NULL DEFAULT '',
        checkpoint_id TEXT NOT NULL,
        task_id TEXT NOT NULL,
        task_path TEXT NOT NULL DEFAULT '',
        idx INTEGER NOT NULL,
        channel TEXT NOT NULL,
        type TEXT NOT NULL,
        value BLOB,
        PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    );
    """,
    # 2: the tool-call ledger
    """
    CREATE TABLE IF NOT EXISTS idem_tool_calls (
        scope TEXT NOT NULL,
        key TEXT NOT NULL,
        thread_id TEXT NOT NULL,
        agent_path TEXT NOT NULL DEFAULT '',
        tool_name TEXT NOT NULL,
        args_hash TEXT NOT NULL,
        args BLOB NOT NULL,
        tool_call_id TEXT NOT NULL,
        run_id TEXT,
        status TEXT NOT NULL CHECK (status IN ('issued', 'completed', 'failed')),
        attempts INTEGER NOT NULL DEFAULT 1,
        replays INTEGER NOT NULL DEFAULT 0,
        conflicts INTEGER NOT NULL DEFAULT 0,
        owner TEXT NOT NULL,
        issued_at REAL NOT NULL,
        lease_expires_at REAL NOT NULL,
        finished_at REAL,
        result_type TEXT,
        result BLOB,
        error TEXT,
        adopted_by TEXT,
        PRIMARY KEY (scope, key)
    );
    CREATE INDEX IF NOT EXISTS idem_tool_calls_thread
        ON idem_tool_calls (thread_id, issued_at);
    CREATE INDEX IF NOT EXISTS idem_tool_calls_signature
        ON idem_tool_calls (scope, agent_path, tool_name, args_hash);
    CREATE INDEX IF NOT EXISTS idem_tool_calls_issued
        ON idem_tool_calls (lease_expires_at) WHERE status = 'issued';
    """,
    # 3: list channels stored as appended deltas of an earlier version (list_deltas.py)
    """
    ALTER TABLE idem_blobs ADD COLUMN base_version TEXT;
    """,
    # 4: the ledger's audit trail: what operators and humans decided about an entry
    # (JSON list of {"at", "by", "action", ...})
    """
    ALTER TABLE idem_tool_calls ADD COLUMN history TEXT;
    """,
    # 5: fork slots (engine/forks.py): where in the thread's history a call was made
    # (position: thread, namespace, step), from which checkpoint (branch) and which
    # identical call of its step it is (occurrence). Unique per position, tool and
    # arguments, so two forked branches of one step cannot both claim the same call.
    """
    ALTER TABLE idem_tool_calls ADD COLUMN position TEXT;
    ALTER TABLE idem_tool_calls ADD COLUMN branch TEXT;
    ALTER TABLE idem_tool_calls ADD COLUMN occurrence INTEGER;
    CREATE UNIQUE INDEX IF NOT EXISTS idem_tool_calls_fork_slot
        ON idem_tool_calls (scope, position, tool_name, args_hash, occurrence)
        WHERE position IS NOT NULL;
    """,
]

SCHEMA_VERSION = len(MIGRATIONS) - 1

SELECT_MIGRATIONS_TABLE = (
    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'idem_saver_migrations'"
)
SELECT_SCHEMA_VERSION = "SELECT MAX(v) FROM idem_saver_migrations"
INSERT_MIGRATION = "INSERT INTO idem_saver_migrations (v) VALUES (?)"

# --- checkpoints ------------------------------------------------------------------

UPSERT_CHECKPOINT = """
INSERT OR REPLACE INTO idem_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
     type, checkpoint, metadata, channel_versions)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
"""

UPSERT_BLOB = """
INSERT OR REPLACE INTO idem_blobs
    (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
VALUES (?, ?, ?, ?, ?, ?, ?)
"""
# does a delta's base still exist? (reads the key only, never the blob's pages)
BLOB_EXISTS = """
SELECT 1 FROM idem_blobs
WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?
"""
SELECT_BLOB = """
SELECT type, blob, base_version FROM idem_blobs
WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? AND version = ?
"""

# Regular writes (idx >= 0) are never overwritten: a task's writes are final once saved,
# and a re-run task must not replace them. Special writes (errors, interrupts, resume;
# idx < 0) are replaced, as LangGraph's savers do.
UPSERT_WRITE = """
INSERT INTO idem_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = excluded.task_path, channel = excluded.channel,
    type = excluded.type, value = excluded.value
WHERE excluded.idx < 0
"""

CHECKPOINT_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
    "metadata, channel_versions"
)

SELECT_CHECKPOINT_BY_ID = f"""
SELECT {CHECKPOINT_COLUMNS} FROM idem_checkpoints
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""

SELECT_LATEST_CHECKPOINT = f"""
SELECT {CHECKPOINT_COLUMNS} FROM idem_checkpoints
WHERE thread_id = ? AND checkpoint_ns = ?
ORDER BY checkpoint_id DESC LIMIT 1
"""

# The blobs checkpoints reference (sqlite/reads.py), looked up by primary key, each with
# the value it extends when it is a delta (the base, one level; deeper bases are probed
# one by one): the parameter is a checkpoint's channel_versions column, a JSON object
# {channel: version}. CROSS JOIN fixes the join order (SQLite never reorders it, nor
# the LEFT JOIN): json_each outside, primary-key probes of idem_blobs inside. With a
# plain JOIN the planner may scan every blob of the thread, which makes reads grow with
# history (measured: 23 ms at 5,000 checkpoints vs 0.2 ms).
_BLOB_AND_BASE = """
CROSS JOIN idem_blobs AS b
  ON b.thread_id = ? AND b.checkpoint_ns = ? AND b.channel = w.channel AND b.version = w.version
LEFT JOIN idem_blobs AS p
  ON p.thread_id = b.thread_id AND p.checkpoint_ns = b.checkpoint_ns
 AND p.channel = b.channel AND p.version = b.base_version
"""
_BLOB_COLUMNS = (
    "SELECT b.channel, w.version, b.type, b.blob, b.base_version, p.type, p.blob, p.base_version"
)
SELECT_BLOBS_FOR_VERSIONS = f"""
{_BLOB_COLUMNS}
FROM (SELECT key AS channel, value AS version FROM json_each(?)) AS w{_BLOB_AND_BASE}"""
# the same for the checkpoints of a page: a JSON array of their channel_versions, each
# (channel, version) fetched once however many of them name it
SELECT_BLOBS_FOR_PAGE = f"""
{_BLOB_COLUMNS}
FROM (SELECT DISTINCT j.key AS channel, j.value AS version
      FROM json_each(?) AS r CROSS JOIN json_each(r.value) AS j) AS w{_BLOB_AND_BASE}"""

SELECT_WRITES_FOR_CHECKPOINT = """
SELECT task_id, channel, type, value FROM idem_writes
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
ORDER BY task_path, task_id, idx
"""
# the same for the checkpoints of a page (a JSON array of their ids)
SELECT_WRITES_FOR_CHECKPOINTS = """
SELECT checkpoint_id, task_id, channel, type, value FROM idem_writes
WHERE thread_id = ? AND checkpoint_ns = ?
  AND checkpoint_id IN (SELECT value FROM json_each(?))
ORDER BY checkpoint_id, task_path, task_id, idx
"""

LIST_ORDER = " ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC LIMIT ?"
LIST_SELECT = f"SELECT {CHECKPOINT_COLUMNS} FROM idem_checkpoints"
# keyset pagination: the next page starts strictly after the last row returned
LIST_AFTER = "(checkpoint_id, thread_id, checkpoint_ns) < (?, ?, ?)"

# --- deletion, copy, prune ----------------------------------------------------------

DELETE_THREAD = [
    "DELETE FROM idem_checkpoints WHERE thread_id = ?",
    "DELETE FROM idem_blobs WHERE thread_id = ?",
    "DELETE FROM idem_writes WHERE thread_id = ?",
    # only thread-scoped entries: a named namespace's entries are shared with other
    # threads, which would re-run those calls if the rows went; and only settled ones:
    # an `issued` entry (an unknown outcome, or a call running now) is never forgotten
    "DELETE FROM idem_tool_calls WHERE thread_id = ?1 AND scope = ?1 AND status <> 'issued'",
]

SELECT_CHECKPOINTS_OF_RUN = (
    "SELECT thread_id, checkpoint_ns, checkpoint_id FROM idem_checkpoints WHERE run_id = ?"
)
DELETE_CHECKPOINT = (
    "DELETE FROM idem_checkpoints WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)
DELETE_WRITES_OF_CHECKPOINT = (
    "DELETE FROM idem_writes WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?"
)

SELECT_LIVE_VERSIONS = (
    "SELECT checkpoint_ns, checkpoint_id, channel_versions FROM idem_checkpoints "
    "WHERE thread_id = ?"
)
SELECT_BLOB_KEYS = (
    "SELECT checkpoint_ns, channel, version, base_version FROM idem_blobs WHERE thread_id = ?"
)
DELETE_BLOB = (
    "DELETE FROM idem_blobs WHERE thread_id = ? AND checkpoint_ns = ? AND channel = ? "
    "AND version = ?"
)

COPY_THREAD = [
    """INSERT OR REPLACE INTO idem_checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
         type, checkpoint, metadata, channel_versions)
       SELECT ?, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
         type, checkpoint, metadata, channel_versions
       FROM idem_checkpoints WHERE thread_id = ?""",
    """INSERT OR REPLACE INTO idem_blobs
        (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
       SELECT ?, checkpoint_ns, channel, version, type, blob, base_version
       FROM idem_blobs WHERE thread_id = ?""",
    """INSERT OR REPLACE INTO idem_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
       SELECT ?, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
       FROM idem_writes WHERE thread_id = ?""",
]

# A fork has already done its source's side effects: the ledger rows scoped to the
# source thread come along (rows in a named namespace are shared, not copied).
COPY_TOOL_CALLS = """
INSERT OR REPLACE INTO idem_tool_calls
    (scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     status, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
     result_type, result, error, adopted_by, history)
SELECT ?, key, ?, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     status, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
     result_type, result, error, adopted_by, history
FROM idem_tool_calls WHERE thread_id = ? AND scope = ?
ORDER BY rowid
"""

# keep_latest: the newest checkpoint of each namespace (and what DeltaChannels need)
SELECT_HEADS = """
SELECT checkpoint_ns, MAX(checkpoint_id) FROM idem_checkpoints
WHERE thread_id = ? GROUP BY checkpoint_ns
"""
SELECT_PARENT_AND_METADATA = """
SELECT parent_checkpoint_id, metadata FROM idem_checkpoints
WHERE thread_id = ? AND checkpoint_ns = ? AND checkpoint_id = ?
"""
SELECT_CHECKPOINT_KEYS = (
    "SELECT checkpoint_ns, checkpoint_id FROM idem_checkpoints WHERE thread_id = ?"
)

DELETE_CHECKPOINTS_OF_THREAD = "DELETE FROM idem_checkpoints WHERE thread_id = ?"
DELETE_WRITES_OF_THREAD = "DELETE FROM idem_writes WHERE thread_id = ?"
DELETE_BLOBS_OF_THREAD = "DELETE FROM idem_blobs WHERE thread_id = ?"

# --- ledger -------------------------------------------------------------------------

# LEDGER_COLUMNS (imported above): LedgerEntry's fields, in order. The statements SQLite
# writes like PostgreSQL are ledger_queries.LedgerSql's, with these three:
MARKER = "?"
ORDER = "rowid"
RETURNING = ""  # the saver reads a guarded update's entry back in the same transaction

INSERT_ISSUED = """
INSERT INTO idem_tool_calls
    (scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     position, branch, occurrence, status, attempts, owner, issued_at, lease_expires_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'issued', 1, ?, ?, ?)
ON CONFLICT DO NOTHING
"""

# the entry holding a fork slot (a claim refused by the slot, not by the key)
SELECT_SLOT_HOLDER = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE scope = ? AND position = ? AND tool_name = ? AND args_hash = ? AND occurrence = ?
"""

# every entry made at one position by one tool (calls of the same step, any branch)
SELECT_AT_POSITION = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE scope = ? AND position = ? AND tool_name = ?
ORDER BY rowid
"""

SELECT_ENTRY = f"SELECT {LEDGER_COLUMNS} FROM idem_tool_calls WHERE scope = ? AND key = ?"

# many entries by (scope, key) in one read; bound parameters, not JSON: ids may hold any
# text (a NUL too), which JSON functions would not compare back equal
KEYS_PER_READ = 200  # pairs per statement: 400 parameters, under every SQLite's limit


_T_LEDGER_COLUMNS = ", ".join("t." + c for c in LEDGER_COLUMNS.split(", "))


def select_entries_by_keys(n: int) -> str:
    """The entries of ``n`` (scope, key) pairs, bound as 2n parameters: each pair probes
    the primary key (``WHERE (scope, key) IN (VALUES ...)`` made SQLite scan the whole
    ledger: 2.5 ms for 50 keys at 10k rows, growing with the table)."""
    pairs = ", ".join(["(?, ?)"] * n)
    return (
        f"SELECT {_T_LEDGER_COLUMNS} FROM (VALUES {pairs}) AS v CROSS JOIN idem_tool_calls AS t "
        "ON t.scope = v.column1 AND t.key = v.column2"
    )


# one outcome: LedgerPolicy._finish_soon's parameters (outcomes that finish together
# share a transaction, an UPDATE each: ledger_store._finish_soon)
FINISH_ENTRY = """
UPDATE idem_tool_calls
SET status = ?, result_type = ?, result = ?, error = ?, finished_at = ?
WHERE scope = ? AND key = ? AND status = 'issued' AND owner = ?
"""

RELEASE_ENTRY = """
DELETE FROM idem_tool_calls WHERE scope = ? AND key = ? AND status = 'issued' AND owner = ?
"""

ADOPT_ENTRY = """
UPDATE idem_tool_calls SET adopted_by = ?
WHERE scope = ? AND key = ? AND adopted_by IS ?
"""

# orphan adoption's two look-ups for every call of a step in ONE read (engine/adoption.py):
# the entries of each call signature (the signature index) and those each tool made at
# each position (the fork-slot index); signatures and spots are JSON arrays of pairs, each
# pair one probe of its index (CROSS JOIN fixes the order), each row found one probe by
# rowid. With ``(scope, key) IN (...)`` SQLite scanned the whole ledger (1.6 ms a step at
# 10k rows, growing with the table), and ``(position, tool_name) IN`` every position of
# the scope (tests/test_sqlite_specific.py)
SELECT_STEP_CANDIDATES = f"""
SELECT {LEDGER_COLUMNS} FROM idem_tool_calls
WHERE rowid IN (
    SELECT t.rowid FROM (SELECT ? AS scope, ? AS agent_path) AS p
    CROSS JOIN json_each(?) AS s
    CROSS JOIN idem_tool_calls AS t ON t.scope = p.scope AND t.agent_path = p.agent_path
        AND t.tool_name = json_extract(s.value, '$[0]')
        AND t.args_hash = json_extract(s.value, '$[1]')
    UNION
    SELECT t.rowid FROM (SELECT ? AS scope) AS p
    CROSS JOIN json_each(?) AS s
    CROSS JOIN idem_tool_calls AS t ON t.scope = p.scope AND t.position IS NOT NULL
        AND t.position = json_extract(s.value, '$[0]')
        AND t.tool_name = json_extract(s.value, '$[1]'))
ORDER BY rowid
"""

# --- DeltaChannel history (get_delta_channel_history) --------------------------------

# The parent chain of a target checkpoint (the latest of the namespace when no id is
# given), target first, nearest ancestor next; per requested channel ``i`` a column
# ``s{i}``: the version of its value stored at that checkpoint, or NULL - what
# ``channel_values[ch]`` of the checkpoint's ``aget_tuple`` holds (a blob of the version
# the checkpoint names, not ``empty``). SQLite yields recursive rows lazily, so the
# saver stops reading (and the recursion stops) once every channel has its seed, or at
# an id seen before (a corrupt chain that loops). CROSS JOIN pins the join order: each
# step is one primary-key probe, never a scan of the thread. The channel's version is
# read with json_extract (the cheapest per row) when its name is plain ASCII, which a
# JSON path can quote as is; any other name is matched through json_each (stored
# versions escape non-ASCII keys, which json_extract's path would not match). A row whose
# channel_versions is not a JSON object (corrupted by hand) walks on with NULL versions
# and is flagged in the second column (``corrupt``): the saver raises CorruptRecordError
# naming it, where json_extract would have failed the statement ("malformed JSON") or,
# on valid JSON of another shape, matched nothing.
_VALID_VERSIONS = (
    "CASE WHEN json_valid({c}) THEN CASE json_type({c}) WHEN 'object' THEN {c} END END"
)
_DELTA_CHAIN = f"""
WITH RECURSIVE chain (checkpoint_id, parent_checkpoint_id, channel_versions) AS (
    SELECT checkpoint_id, parent_checkpoint_id,
        {_VALID_VERSIONS.format(c="channel_versions")} FROM idem_checkpoints
    WHERE thread_id = :thread_id AND checkpoint_ns = :ns
      AND checkpoint_id = COALESCE(:checkpoint_id, (
          SELECT MAX(checkpoint_id) FROM idem_checkpoints
          WHERE thread_id = :thread_id AND checkpoint_ns = :ns))
  UNION ALL
    SELECT c.checkpoint_id, c.parent_checkpoint_id, {_VALID_VERSIONS.format(c="c.channel_versions")}
    FROM chain AS ch CROSS JOIN idem_checkpoints AS c
      ON c.thread_id = :thread_id AND c.checkpoint_ns = :ns
     AND c.checkpoint_id = ch.parent_checkpoint_id
)
SELECT ch.checkpoint_id, ch.channel_versions IS NULL AS corrupt{{columns}}
FROM chain AS ch
"""
_DELTA_SEED = """,
    (SELECT b.version FROM idem_blobs AS b
     WHERE b.thread_id = :thread_id AND b.checkpoint_ns = :ns AND b.channel = :c{i}
       AND b.version = {version} AND b.type <> 'empty') AS s{i}"""
_VERSION_BY_PATH = "json_extract(ch.channel_versions, :p{i})"
_VERSION_BY_KEY = "(SELECT v.value FROM json_each(ch.channel_versions) AS v WHERE v.key = :c{i})"

_delta_chain_cache: dict[tuple[bool, ...], str] = {}


def delta_path(channel: str) -> str | None:
    """The JSON path of ``channel``'s key, or None when json_extract cannot address it."""
    if channel.isascii() and channel.isprintable() and '"' not in channel and "\\" not in channel:
        return f'$."{channel}"'
    return None


def delta_chain_sql(by_path: tuple[bool, ...]) -> str:
    """The chain statement for these channels (``by_path[i]``: channel ``i`` has a
    ``delta_path``), built once per shape. Parameters: thread_id, ns, checkpoint_id
    (None: the latest), and per channel ``c{i}`` (its name) and ``p{i}`` (its path)."""
    query = _delta_chain_cache.get(by_path)
    if query is None:
        columns = "".join(
            _DELTA_SEED.format(
                i=i, version=(_VERSION_BY_PATH if path else _VERSION_BY_KEY).format(i=i)
            )
            for i, path in enumerate(by_path)
        )
        query = _delta_chain_cache[by_path] = _DELTA_CHAIN.format(columns=columns)
    return query


# The writes of the walked ancestors to the channels still walking there, in one
# statement: ``:chain`` is the JSON array of ancestor ids, oldest first; channel ``i``
# (``:c{i}``, bound as is: no JSON round trip for its name) contributes the writes of
# positions ``:f{i}`` on (the ancestors its walk visited). Each ancestor is a
# primary-key prefix probe. No ORDER BY: sorting the rows (values included) in SQLite
# costs more than the saver's sort by (position, task_path, task_id, idx), which is
# ``writes_sort_key`` within each checkpoint.
_DELTA_WRITES = """
SELECT a.key, w.task_path, w.task_id, w.idx, w.channel, w.type, w.value
FROM json_each(:chain) AS a
CROSS JOIN idem_writes AS w
  ON w.thread_id = :thread_id AND w.checkpoint_ns = :ns AND w.checkpoint_id = a.value
WHERE {channels}
"""

_delta_writes_cache: dict[int, str] = {}


def delta_writes_sql(n_channels: int) -> str:
    """The writes statement for ``n_channels`` channels, built once per count."""
    query = _delta_writes_cache.get(n_channels)
    if query is None:
        channels = " OR ".join(f"(w.channel = :c{i} AND a.key >= :f{i})" for i in range(n_channels))
        query = _delta_writes_cache[n_channels] = _DELTA_WRITES.format(channels=channels)
    return query
