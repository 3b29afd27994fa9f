"""The PostgreSQL backend's checkpoint SQL, and its migrations.

``MIGRATIONS[i]`` brings a database from schema version ``i - 1`` to ``i``; the versions
applied are recorded in ``idem_saver_migrations (v INTEGER PRIMARY KEY)``, so
``len(MIGRATIONS) - 1`` is the schema version this release writes. Never edit a migration
that has shipped: append a new one. Each migration is a list of single statements (no
``CREATE INDEX CONCURRENTLY``: every migration runs inside one transaction, under an
advisory lock, so ``setup()`` works on any connection, inside or outside a transaction,
and concurrent workers calling it do not race).

The layout mirrors the SQLite backend (``idem_`` prefix, blobs per (thread, ns, channel,
version) written only for ``new_versions``). Every text key column uses ``COLLATE "C"``:
checkpoint ids, task paths and ledger keys then sort by code point, exactly as SQLite and
LangGraph's in-memory saver sort them, whatever the database's default locale, and the
primary-key indexes serve those orders.

All values are bound parameters. Statements that take a variable number of rows take
them as a multi-row VALUES list (built per row count and cached: a handful of distinct,
prepared statements) or as arrays they ``unnest``, so every call is a single statement
(one round trip, atomic on its own under autocommit).
"""

from __future__ import annotations

from langgraph_idem_saver.postgres.blob_chain import blob_chain_sql
from langgraph_idem_saver.postgres.delta_history import DELTA_HISTORY_FUNCTION
from langgraph_idem_saver.postgres.functions import TUPLE_RESULT, plpgsql_function
from langgraph_idem_saver.postgres.ledger_sql import (
    FINISH_ONE_FUNCTION,
    FINISH_STEP_FUNCTION,
    STEP_FOUND_FUNCTION,
)

# The pg_advisory_xact_lock key setup() holds while it migrates (an arbitrary constant,
# fixed forever: every release must take the same lock).
MIGRATION_LOCK_KEY = 0x1DE3_5A7E_0C1D_0001

# Per-thread advisory locks, (THREAD_LOCK_SPACE, hashtext(thread_id)) in the two-key
# space (apart from the bigint migration lock and from other applications' keys). What
# deletes blobs (delete, prune) holds the thread's lock exclusively for its transaction;
# an aput that writes a delta holds it shared while it checks that the delta's base is
# still stored. So no blob is deleted between that check and the delta's commit, and a
# delete or prune sees every delta committed before it started deleting. Two threads
# whose ids hash alike merely share a lock. Fixed forever, like MIGRATION_LOCK_KEY.
THREAD_LOCK_SPACE = 0x1DE3_5A7E

# a delta put's check of its bases (see _PUT_WITH_DELTAS for why a function)
MISSING_BASES_FUNCTION = plpgsql_function(
    "idem_missing_bases(p_bases json)",
    "SETOF text",
    f"""
DECLARE
    r json;
BEGIN
    IF p_bases IS NULL THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock_shared({THREAD_LOCK_SPACE}, hashtext(p_bases -> 0 ->> 0));
    FOR r IN SELECT * FROM json_array_elements(p_bases) LOOP
        IF NOT EXISTS (
            SELECT 1 FROM idem_blobs AS b
            WHERE b.thread_id = r ->> 0 AND b.checkpoint_ns = r ->> 1
                AND b.channel = r ->> 2 AND b.version = r ->> 3
        ) THEN
            RETURN NEXT r ->> 2;
        END IF;
    END LOOP;
END
""",
    volatile=True,
)


# MIGRATIONS (the schema, by version) is at the end of this module: its later entries
# create functions over statements defined below.


TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(%s)"
SELECT_MIGRATIONS_TABLE = "SELECT to_regclass('idem_saver_migrations') IS NOT NULL"
SELECT_SCHEMA_VERSION = "SELECT MAX(v) FROM idem_saver_migrations"
INSERT_MIGRATION = "INSERT INTO idem_saver_migrations (v) VALUES (%s) ON CONFLICT DO NOTHING"

# --- checkpoints ------------------------------------------------------------------

# aput: the new blobs and the checkpoint row in ONE statement (one round trip, atomic).
# A data-modifying CTE always runs to completion, referenced or not. The blobs are a
# multi-row VALUES list (scalar parameters: cheaper to send and to plan than unnest()ed
# arrays); put_checkpoint_sql(n) builds, and caches, the statement for n blobs.
_UPSERT_CHECKPOINT = """
INSERT INTO idem_checkpoints
    (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
     type, checkpoint, metadata, metadata_exact, channel_versions)
VALUES (%s, %s, %s, %s, %s, %s, %b, %s::jsonb, %s, %s::jsonb)
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
    parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id,
    type = excluded.type, checkpoint = excluded.checkpoint, metadata = excluded.metadata,
    metadata_exact = excluded.metadata_exact, channel_versions = excluded.channel_versions
"""
_UPSERT_BLOBS = """
WITH new_blobs AS (
    INSERT INTO idem_blobs
        (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
    VALUES {rows}
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = excluded.type, blob = excluded.blob, base_version = excluded.base_version
)"""
_BLOB_ROW = "(%s, %s, %s, %s, %s, %b, %s)"

# aput when some blob rows are deltas (list_deltas.py): a delta may only be written if
# the version it extends is still stored (another process may have deleted the thread,
# or pruned it, or be doing so right now). The same single statement checks that first;
# if any base is missing it writes NOTHING and returns the channels concerned, and the
# saver sends the statement again with those values stored whole. In the common case:
# one round trip, as above.
#
# The check (``idem_missing_bases``, migration 9) must hold until the delta is committed,
# against a delete running at the same time: it first takes the thread's lock shared
# (THREAD_LOCK_SPACE) - a delete or prune in progress holds it exclusively, so this
# waits for it to commit - and then reads the bases. The function is VOLATILE, so that
# read takes its snapshot after the lock is held: a base deleted while we waited is
# missing. Deleters take the lock before deciding what is garbage, so they see this
# delta once it is committed. (``missing`` is a one-time filter of both inserts: the
# lock always comes before any row is written.)
#
# A function, with sequential scans off, because the check used to be a join in this
# statement: prepared (``prepare_threshold=0``) and cached as a generic plan while the
# blobs table was small, it was a sequential scan of every blob, kept as the table grew
# (a fresh database: 657 scans reading 888,224 rows over 1,100 puts, each put 0.2 ms
# slower). Each base is now one probe of the primary key, whatever plan is cached.

_PUT_WITH_DELTAS = """
WITH new_rows (thread_id, checkpoint_ns, channel, version, type, blob, base_version) AS (
    VALUES {rows}
), missing AS (
    SELECT m AS channel FROM idem_missing_bases((
        SELECT json_agg(json_build_array(thread_id, checkpoint_ns, channel, base_version))
        FROM new_rows WHERE base_version IS NOT NULL)) AS m
), new_blobs AS (
    INSERT INTO idem_blobs
        (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
    SELECT * FROM new_rows WHERE NOT EXISTS (SELECT 1 FROM missing)
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = excluded.type, blob = excluded.blob, base_version = excluded.base_version
), new_checkpoint AS (
    INSERT INTO idem_checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
         type, checkpoint, metadata, metadata_exact, channel_versions)
    SELECT %s, %s, %s, %s, %s, %s, %b, %s::jsonb, %s, %s::jsonb
    WHERE NOT EXISTS (SELECT 1 FROM missing)
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id,
        type = excluded.type, checkpoint = excluded.checkpoint,
        metadata = excluded.metadata, metadata_exact = excluded.metadata_exact,
        channel_versions = excluded.channel_versions
)
SELECT channel FROM missing
"""

# Regular writes (idx >= 0) are never overwritten: a task's writes are final once saved,
# and a re-run task must not replace them. Special writes (errors, interrupts, resume;
# idx < 0) are replaced, as LangGraph's savers do. The caller de-duplicates the rows of
# one call (the last special write of an idx wins), since one INSERT may not update a
# row twice.
_UPSERT_WRITES = """
INSERT INTO idem_writes
    (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
VALUES {rows}
ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
    task_path = excluded.task_path, channel = excluded.channel,
    type = excluded.type, value = excluded.value
WHERE excluded.idx < 0
"""
_WRITE_ROW = "(%s, %s, %s, %s, %s, %s::integer, %s, %s, %b)"

_put_checkpoint_cache: dict[tuple[int, bool], str] = {}
_put_writes_cache: dict[int, str] = {}


def put_checkpoint_sql(n_blobs: int, deltas: bool = False) -> str:
    """aput's statement for ``n_blobs`` blob rows (7 parameters each: thread_id, ns,
    channel, version, type, blob, base_version), then the checkpoint row's 10 parameters.

    With ``deltas`` (some rows have a base_version), the statement first checks that
    every base is stored and returns the channels whose base is not (writing nothing).
    """
    key = (n_blobs, deltas)
    query = _put_checkpoint_cache.get(key)
    if query is None:
        rows = ", ".join([_BLOB_ROW] * n_blobs)
        if deltas and n_blobs:
            query = _PUT_WITH_DELTAS.format(rows=rows)
        else:
            query = _UPSERT_CHECKPOINT
            if n_blobs:
                query = _UPSERT_BLOBS.format(rows=rows) + query
        _put_checkpoint_cache[key] = query
    return query


def put_writes_sql(n_writes: int) -> str:
    """aput_writes' statement for ``n_writes`` rows (9 parameters each)."""
    query = _put_writes_cache.get(n_writes)
    if query is None:
        query = _UPSERT_WRITES.format(rows=", ".join([_WRITE_ROW] * n_writes))
        _put_writes_cache[n_writes] = query
    return query


# Checkpoint tuples with their channel values and pending writes, in one statement.
# The inner query picks the rows (by an index, stopping at LIMIT); only then are the
# blobs looked up, one primary-key probe per entry of the checkpoint's channel_versions
# ({channel: version}) — the LATERAL ... LIMIT 1 keeps the planner from turning that into
# a hash join over all of a thread's blobs, which it would pick for a thread that is
# most of the table — and the writes, by the writes table's primary-key prefix. A blob
# stored as a delta (list_deltas.py) brings its chain along: the versions it extends,
# followed by primary key (recursively, LATERAL ... LIMIT 1 again: a plain join there
# gets planned as a scan of the channel's blobs) back to one stored whole, ordered by
# depth; a whole value costs nothing more. Text columns come back as bytea
# (convert_to) so that each aggregate is one 2-D bytea array. The recursion stops
# after ``blob_chain.CHAIN_LIMIT`` bases: a longer chain is corrupt (reported by resolve_value).
#
# The inner LIMIT is a constant (PAGE_BOUND, the largest page any read asks for) and the
# rows wanted are cut by the outer LIMIT. With prepared statements PostgreSQL
# switches to a generic plan after five executions; a generic plan cannot see a LIMIT
# parameter's value and assumes 10% of the table, and then plans a sequential scan and
# a sort of every checkpoint (22 ms instead of 0.1 ms on 50k checkpoints). A constant
# bound keeps the index scan in every plan, generic or custom; the outer LIMIT still stops
# the scan (and the blob look-ups) after the rows asked for. aget_tuple's outer LIMIT is
# the constant 1 (its generic plan then costs what its custom plan does, so PostgreSQL
# keeps it and stops planning each call); alist's is ``%(limit)s``.
PAGE_BOUND = 100
SELECT_TUPLES = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
    c.checkpoint, c.metadata, c.metadata_exact,
    (SELECT array_agg(ARRAY[convert_to(v.key, 'UTF8'), convert_to(b.type, 'UTF8'), b.blob,
                            convert_to(b.version, 'UTF8'), convert_to(b.base_version, 'UTF8')]
                      ORDER BY v.key, b.depth)
     FROM jsonb_each_text(c.channel_versions) AS v
     CROSS JOIN LATERAL (
        _BLOB_CHAIN
     ) AS b
     WHERE b.type <> 'empty') AS channel_values,
    (SELECT array_agg(ARRAY[convert_to(w.task_id, 'UTF8'), convert_to(w.channel, 'UTF8'),
                            convert_to(w.type, 'UTF8'), w.value]
                      ORDER BY w.task_path, w.task_id, w.idx)
     FROM idem_writes AS w
     WHERE w.thread_id = c.thread_id AND w.checkpoint_ns = c.checkpoint_ns
       AND w.checkpoint_id = c.checkpoint_id) AS pending_writes
FROM (
    SELECT thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint,
        metadata, metadata_exact, channel_versions
    FROM idem_checkpoints
    {where}
    ORDER BY checkpoint_id DESC, thread_id DESC, checkpoint_ns DESC
    LIMIT _PAGE_BOUND
) AS c
ORDER BY c.checkpoint_id DESC, c.thread_id DESC, c.checkpoint_ns DESC
LIMIT {limit}
""".replace("_PAGE_BOUND", str(PAGE_BOUND)).replace(
    "_BLOB_CHAIN",
    blob_chain_sql(
        thread_id="c.thread_id", ns="c.checkpoint_ns", channel="v.key", version="v.value"
    ),
)

WHERE_BY_ID = (
    "WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s "
    "AND checkpoint_id = %(checkpoint_id)s"
)
WHERE_LATEST = "WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s"

SELECT_TUPLE_BY_ID = SELECT_TUPLES.format(where=WHERE_BY_ID, limit=1)
SELECT_LATEST_TUPLE = SELECT_TUPLES.format(where=WHERE_LATEST, limit=1)

# aget_tuple sends these two reads through a function (migration 10), with sequential
# scans off: sent as they are, prepared (``prepare_threshold=0``), the generic plan
# PostgreSQL caches after five executions was built for the tables as they were then.
# On a fresh database that is a sequential scan of the checkpoints, of the writes and of
# the blobs (once per channel): kept as the tables grew, each aget_tuple then read every
# row (40,000 blobs, 20,000 checkpoints and 20,000 writes in the test) until autovacuum
# next analyzed them. In the function every plan PostgreSQL may cache probes indexes.
_IN_NS = "WHERE thread_id = p_thread_id AND checkpoint_ns = p_ns"
CHECKPOINT_TUPLE_FUNCTION = plpgsql_function(
    "idem_checkpoint_tuple(p_thread_id text, p_ns text, p_checkpoint_id text)",
    TUPLE_RESULT,
    f"""
BEGIN
    IF p_checkpoint_id IS NULL THEN
        RETURN QUERY {SELECT_TUPLES.format(where=_IN_NS, limit=1)};
    ELSE
        RETURN QUERY {
        SELECT_TUPLES.format(where=_IN_NS + " AND checkpoint_id = p_checkpoint_id", limit=1)
    };
    END IF;
END
""",
    use_column=True,
    generic_plan=True,
)
# alist's pages in one namespace of a thread (what ``get_state_history`` reads), with no
# metadata filter, through a function for the same reason (migration 11); ``p_upper``:
# only checkpoints older than it (``before``, and the last row of the previous page).
# The caller orders by ordinality: the result's columns lack the tables' "C" collation.
LIST_IN_NS_FUNCTION = plpgsql_function(
    "idem_list_in_ns(p_thread_id text, p_ns text, p_upper text, p_limit integer)",
    TUPLE_RESULT,
    f"""
BEGIN
    IF p_upper IS NULL THEN
        RETURN QUERY {SELECT_TUPLES.format(where=_IN_NS, limit="p_limit")};
    ELSE
        RETURN QUERY {
        SELECT_TUPLES.format(where=_IN_NS + " AND checkpoint_id < p_upper", limit="p_limit")
    };
    END IF;
END
""",
    use_column=True,
    generic_plan=True,
)
_TUPLE_COLUMNS = (
    "thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, type, checkpoint, "
    "metadata, metadata_exact, channel_values, pending_writes"
)
SELECT_LIST_IN_NS_CALL = (
    f"SELECT {_TUPLE_COLUMNS} FROM idem_list_in_ns("
    "%(thread_id)s, %(ns)s, %(upper)s, %(limit)s) WITH ORDINALITY AS f ORDER BY f.ordinality"
)

# the tuple of a checkpoint (``checkpoint_id`` given) or the latest (``checkpoint_id`` None)
SELECT_TUPLE_CALL = "SELECT * FROM idem_checkpoint_tuple(%(thread_id)s, %(ns)s, %(checkpoint_id)s)"
LIST_LIMIT = "%(limit)s"  # alist's outer LIMIT: the page size, bound per call

# keyset pagination: the next page starts strictly after the last row returned. The
# columns a config fixes are left out, so the comparison matches an index's columns
# (the primary key, or idem_checkpoints_thread_order) and seeks instead of filtering.
LIST_AFTER_IN_NS = "checkpoint_id < %(c_id)s"
LIST_AFTER_IN_THREAD = "(checkpoint_id, checkpoint_ns) < (%(c_id)s, %(c_ns)s)"
LIST_AFTER = "(checkpoint_id, thread_id, checkpoint_ns) < (%(c_id)s, %(c_thread)s, %(c_ns)s)"

# --- deletion, copy, prune ----------------------------------------------------------

# Every statement below that deletes blobs runs in a transaction that first took the
# exclusive THREAD_LOCK_SPACE lock of each thread it touches (see _PUT_WITH_DELTAS),
# in one order (by key), so deleters never deadlock each other either.
LOCK_THREADS = f"""
SELECT pg_advisory_xact_lock({THREAD_LOCK_SPACE}, s.h)
FROM (SELECT DISTINCT hashtext(t) AS h FROM unnest(%(threads)s::text[]) AS t) AS s
ORDER BY s.h
"""

DELETE_THREAD = """
WITH c AS (DELETE FROM idem_checkpoints WHERE thread_id = %(t)s),
     b AS (DELETE FROM idem_blobs WHERE thread_id = %(t)s),
     w AS (DELETE FROM idem_writes WHERE thread_id = %(t)s)
-- only thread-scoped entries: a named namespace's entries are shared with other
-- threads, which would re-run those calls if the rows went; and only settled ones:
-- an `issued` entry (an unknown outcome, or a call running now) is never forgotten
DELETE FROM idem_tool_calls WHERE thread_id = %(t)s AND scope = %(t)s AND status <> 'issued'
"""

# The threads that hold checkpoints of these runs: the ones adelete_for_runs locks
# (LOCK_THREADS) before DELETE_RUNS.
SELECT_THREADS_OF_RUNS = """
SELECT DISTINCT thread_id FROM idem_checkpoints WHERE run_id = ANY(%(runs)s)
"""

# The checkpoints of the runs, with their writes, in the (locked) threads found by
# SELECT_THREADS_OF_RUNS: a run's first checkpoint in another thread committed since
# then counts as written after the delete. The runs' ledger entries stay (their effects
# may have happened: docs/guarantees.md, "Lifecycle"). Returns the threads touched
# (whose unreferenced blobs are then collected).
DELETE_RUNS = """
WITH gone AS (
    DELETE FROM idem_checkpoints
    WHERE run_id = ANY(%(runs)s) AND thread_id = ANY(%(threads)s)
    RETURNING thread_id, checkpoint_ns, checkpoint_id
), gone_writes AS (
    DELETE FROM idem_writes AS w USING gone AS g
    WHERE w.thread_id = g.thread_id AND w.checkpoint_ns = g.checkpoint_ns
      AND w.checkpoint_id = g.checkpoint_id
)
SELECT DISTINCT thread_id FROM gone
"""

# Delete the blobs of these threads that no remaining checkpoint references, directly
# or as the base (recursively) of a referenced delta. The live set is computed once (a
# hashed subplan), not per blob; UNION ends the recursion even on a corrupt cycle. Each
# step of the recursion is one primary-key probe per live version (LATERAL ... LIMIT 1):
# written as a join, it was planned as a hash join over a sequential scan of every blob
# in the database, on every prune of a thread holding deltas, analyzed tables or not.
COLLECT_BLOBS = """
WITH RECURSIVE live (thread_id, checkpoint_ns, channel, version) AS (
    SELECT c.thread_id, c.checkpoint_ns, v.key COLLATE "C", v.value COLLATE "C"
    FROM idem_checkpoints AS c CROSS JOIN LATERAL jsonb_each_text(c.channel_versions) AS v
    WHERE c.thread_id = ANY(%(threads)s)
  UNION
    SELECT b.thread_id, b.checkpoint_ns, b.channel, b.base_version
    FROM live AS l CROSS JOIN LATERAL (
        SELECT x.thread_id, x.checkpoint_ns, x.channel, x.base_version
        FROM idem_blobs AS x
        WHERE x.thread_id = l.thread_id AND x.checkpoint_ns = l.checkpoint_ns
          AND x.channel = l.channel AND x.version = l.version
        LIMIT 1) AS b
    WHERE b.base_version IS NOT NULL
)
DELETE FROM idem_blobs AS b
WHERE b.thread_id = ANY(%(threads)s)
  AND (b.thread_id, b.checkpoint_ns, b.channel, b.version) NOT IN (SELECT * FROM live)
"""

COPY_THREAD = """
WITH cp AS (
    INSERT INTO idem_checkpoints
        (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
         type, checkpoint, metadata, metadata_exact, channel_versions)
    SELECT %(dst)s, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id,
         type, checkpoint, metadata, metadata_exact, channel_versions
    FROM idem_checkpoints WHERE thread_id = %(src)s
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id) DO UPDATE SET
        parent_checkpoint_id = excluded.parent_checkpoint_id, run_id = excluded.run_id,
        type = excluded.type, checkpoint = excluded.checkpoint,
        metadata = excluded.metadata, metadata_exact = excluded.metadata_exact,
        channel_versions = excluded.channel_versions
), bl AS (
    INSERT INTO idem_blobs
        (thread_id, checkpoint_ns, channel, version, type, blob, base_version)
    SELECT %(dst)s, checkpoint_ns, channel, version, type, blob, base_version
    FROM idem_blobs WHERE thread_id = %(src)s
    ON CONFLICT (thread_id, checkpoint_ns, channel, version) DO UPDATE SET
        type = excluded.type, blob = excluded.blob, base_version = excluded.base_version
), wr AS (
    INSERT INTO idem_writes
        (thread_id, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value)
    SELECT %(dst)s, checkpoint_ns, checkpoint_id, task_id, task_path, idx, channel, type, value
    FROM idem_writes WHERE thread_id = %(src)s
    ON CONFLICT (thread_id, checkpoint_ns, checkpoint_id, task_id, idx) DO UPDATE SET
        task_path = excluded.task_path, channel = excluded.channel,
        type = excluded.type, value = excluded.value
)
-- A fork has already done its source's side effects: the ledger rows scoped to the
-- source thread come along (rows in a named namespace are shared, not copied).
INSERT INTO idem_tool_calls
    (scope, key, thread_id, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     status, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
     result_type, result, error, adopted_by, history)
SELECT %(dst)s, key, %(dst)s, agent_path, tool_name, args_hash, args, tool_call_id, run_id,
     status, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
     result_type, result, error, adopted_by, history
FROM idem_tool_calls WHERE thread_id = %(src)s AND scope = %(src)s
ORDER BY seq
ON CONFLICT (scope, key) DO UPDATE SET
    thread_id = excluded.thread_id, agent_path = excluded.agent_path,
    tool_name = excluded.tool_name, args_hash = excluded.args_hash, args = excluded.args,
    tool_call_id = excluded.tool_call_id, run_id = excluded.run_id,
    status = excluded.status, attempts = excluded.attempts, replays = excluded.replays,
    conflicts = excluded.conflicts, owner = excluded.owner, issued_at = excluded.issued_at,
    lease_expires_at = excluded.lease_expires_at, finished_at = excluded.finished_at,
    result_type = excluded.result_type, result = excluded.result, error = excluded.error,
    adopted_by = excluded.adopted_by, history = excluded.history, seq = excluded.seq
"""

# prune "delete": every checkpoint, write and blob of the threads (ledger rows stay)
PRUNE_DELETE = """
WITH c AS (DELETE FROM idem_checkpoints WHERE thread_id = ANY(%(threads)s)),
     w AS (DELETE FROM idem_writes WHERE thread_id = ANY(%(threads)s))
DELETE FROM idem_blobs WHERE thread_id = ANY(%(threads)s)
"""

# prune "keep_latest": the newest checkpoint of each namespace, with the parent and the
# DeltaChannel counters that say whether ancestors must be kept too (saver_base's
# checkpoints_to_keep walks them).
SELECT_HEADS = """
SELECT DISTINCT ON (checkpoint_ns) checkpoint_ns, checkpoint_id, parent_checkpoint_id,
    metadata -> 'counters_since_delta_snapshot'
FROM idem_checkpoints WHERE thread_id = %s
ORDER BY checkpoint_ns, checkpoint_id DESC
"""
# a namespace's lineage, only read when its head has DeltaChannel counters
SELECT_LINEAGE = """
SELECT checkpoint_id, parent_checkpoint_id, metadata -> 'counters_since_delta_snapshot'
FROM idem_checkpoints WHERE thread_id = %s AND checkpoint_ns = %s
"""
# every checkpoint of the thread older than its namespace's head (as SELECT_HEADS saw
# it) but the kept (namespace, id) pairs, with the writes of the checkpoints deleted. A
# checkpoint committed since SELECT_HEADS (a newer head, a new namespace: an aput that
# wrote no delta does not wait for the thread's lock) is kept, never taken for an old
# one. Blobs are collected by a second statement (COLLECT_BLOBS), which sees this one's
# deletions.
PRUNE_KEEP = """
WITH gone AS (
    DELETE FROM idem_checkpoints AS c
    USING unnest(%(head_ns)s::text[], %(head_ids)s::text[]) AS h (ns, id)
    WHERE c.thread_id = %(thread)s
      AND c.checkpoint_ns = h.ns AND c.checkpoint_id < h.id
      AND (c.checkpoint_ns, c.checkpoint_id) NOT IN (
        SELECT * FROM unnest(%(keep_ns)s::text[], %(keep_ids)s::text[]))
    RETURNING c.checkpoint_ns, c.checkpoint_id
)
DELETE FROM idem_writes AS w USING gone AS g
WHERE w.thread_id = %(thread)s AND w.checkpoint_ns = g.checkpoint_ns
  AND w.checkpoint_id = g.checkpoint_id
"""


MIGRATIONS: list[list[str]] = [
    # 0: the bookkeeping table itself
    [
        "CREATE TABLE IF NOT EXISTS idem_saver_migrations (v INTEGER PRIMARY KEY)",
    ],
    # 1: checkpoints, blobs, writes
    [
        """
        CREATE TABLE IF NOT EXISTS idem_checkpoints (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            parent_checkpoint_id TEXT COLLATE "C",
            run_id TEXT COLLATE "C",
            type TEXT NOT NULL,
            checkpoint BYTEA NOT NULL,
            metadata JSONB NOT NULL,
            -- the exact metadata JSON, only when JSONB cannot hold it as is (NUL
            -- characters, unpaired surrogates, floats JSONB would print as integers);
            -- ``metadata`` then holds a filterable approximation
            metadata_exact TEXT,
            channel_versions JSONB NOT NULL,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id)
        )
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_checkpoints_thread_order
            ON idem_checkpoints (thread_id, checkpoint_id, checkpoint_ns)
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_checkpoints_run_id
            ON idem_checkpoints (run_id) WHERE run_id IS NOT NULL
        """,
        """
        CREATE TABLE IF NOT EXISTS idem_blobs (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            channel TEXT COLLATE "C" NOT NULL,
            version TEXT COLLATE "C" NOT NULL,
            type TEXT NOT NULL,
            blob BYTEA,
            PRIMARY KEY (thread_id, checkpoint_ns, channel, version)
        )
        """,
        """
        CREATE TABLE IF NOT EXISTS idem_writes (
            thread_id TEXT COLLATE "C" NOT NULL,
            checkpoint_ns TEXT COLLATE "C" NOT NULL DEFAULT '',
            checkpoint_id TEXT COLLATE "C" NOT NULL,
            task_id TEXT COLLATE "C" NOT NULL,
            task_path TEXT COLLATE "C" NOT NULL DEFAULT '',
            idx INTEGER NOT NULL,
            channel TEXT COLLATE "C" NOT NULL,
            type TEXT NOT NULL,
            value BYTEA,
            PRIMARY KEY (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
        )
        """,
    ],
    # 2: the tool-call ledger
    [
        """
        CREATE TABLE IF NOT EXISTS idem_tool_calls (
            scope TEXT COLLATE "C" NOT NULL,
            key TEXT COLLATE "C" NOT NULL,
            thread_id TEXT COLLATE "C" NOT NULL,
            agent_path TEXT COLLATE "C" NOT NULL DEFAULT '',
            tool_name TEXT COLLATE "C" NOT NULL,
            args_hash TEXT COLLATE "C" NOT NULL,
            args BYTEA NOT NULL,
            tool_call_id TEXT COLLATE "C" NOT NULL,
            run_id TEXT COLLATE "C",
            status TEXT NOT NULL CHECK (status IN ('issued', 'completed', 'failed')),
            attempts INTEGER NOT NULL DEFAULT 1,
            replays INTEGER NOT NULL DEFAULT 0,
            conflicts INTEGER NOT NULL DEFAULT 0,
            owner TEXT COLLATE "C" NOT NULL,
            issued_at DOUBLE PRECISION NOT NULL,
            lease_expires_at DOUBLE PRECISION NOT NULL,
            finished_at DOUBLE PRECISION,
            result_type TEXT,
            result BYTEA,
            error TEXT,
            adopted_by TEXT COLLATE "C",
            -- insertion order (SQLite's rowid): listings come back in the order claimed
            seq BIGINT GENERATED BY DEFAULT AS IDENTITY,
            PRIMARY KEY (scope, key)
        )
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_tool_calls_thread
            ON idem_tool_calls (thread_id, seq)
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_tool_calls_signature
            ON idem_tool_calls (scope, agent_path, tool_name, args_hash)
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_tool_calls_issued
            ON idem_tool_calls (seq) WHERE status = 'issued'
        """,
        """
        CREATE INDEX IF NOT EXISTS idem_tool_calls_run_id
            ON idem_tool_calls (run_id) WHERE run_id IS NOT NULL
        """,
    ],
    # 3: list channels stored as appended deltas of an earlier version (list_deltas.py):
    # a row with a base_version holds only the items appended to that version's list.
    # In a DO block: a statement whose status is "ALTER ..." makes psycopg drop its
    # prepared statements, and on a pipelined connection the DEALLOCATE ALL it queues
    # for that is sent *after* the next statement was prepared, which then fails with
    # "prepared statement _pg3_N does not exist".
    [
        """
        DO $$ BEGIN
            ALTER TABLE idem_blobs ADD COLUMN IF NOT EXISTS base_version TEXT COLLATE "C";
        END $$
        """,
    ],
    # 4: the ledger's audit trail: what operators and humans decided about an entry
    # (JSON list of {"at", "by", "action", ...}); in a DO block for the reason above
    [
        """
        DO $$ BEGIN
            ALTER TABLE idem_tool_calls ADD COLUMN IF NOT EXISTS history TEXT;
        END $$
        """,
    ],
    # 5: fork slots (engine/forks.py): where in the thread's history a call was made
    # (position: thread, namespace, step), from which checkpoint (branch) and which
    # identical call of its step it is (occurrence). Unique per position, tool and
    # arguments, so two forked branches of one step cannot both claim the same call.
    [
        """
        DO $$ BEGIN
            ALTER TABLE idem_tool_calls ADD COLUMN IF NOT EXISTS position TEXT COLLATE "C";
            ALTER TABLE idem_tool_calls ADD COLUMN IF NOT EXISTS branch TEXT COLLATE "C";
            ALTER TABLE idem_tool_calls ADD COLUMN IF NOT EXISTS occurrence INTEGER;
        END $$
        """,
        """
        CREATE UNIQUE INDEX IF NOT EXISTS idem_tool_calls_fork_slot
            ON idem_tool_calls (scope, position, tool_name, args_hash, occurrence)
            WHERE position IS NOT NULL
        """,
    ],
    # 6: a call's outcome is a HOT update (heap-only: no index entry written). Recording
    # it changes status/result/error/finished_at; the partial index of issued rows had
    # status in its predicate, which made PostgreSQL add an entry to all six indexes for
    # every outcome (~7 WAL records a call). Without it, and with room left in each page
    # for the finished versions of its rows (fillfactor 25: a 50-call step with results
    # of ~200 bytes is all HOT, ~1 KB results two thirds, results TOASTed out of line
    # all), the outcome writes the row alone: on a 50-call step the statement's execution
    # went 2.5 -> 1.0 ms and its WAL 64 -> 17 KB. Pages hold fewer fresh rows but no
    # dead versions, so the table is about the same size. Listing every issued call
    # (``alist_issued``: operator commands) now reads the table; no statement on a tool
    # call's path used that index. In a DO block for the reason given at 3.
    [
        """
        DO $$ BEGIN
            DROP INDEX IF EXISTS idem_tool_calls_issued;
            ALTER TABLE idem_tool_calls SET (fillfactor = 25);
        END $$
        """,
    ],
    # 7: the adoption read of a step (ledger_sql.STEP_FOUND_FUNCTION): a function that
    # plans it on every call, so that no plan cached while the ledger was small (a
    # prepared statement's generic plan) reads it as it grows
    [STEP_FOUND_FUNCTION],
    # 8: the same function reads a one-call step with a static query (no planning per
    # call), and one outcome alone is a function too (ledger_sql.FINISH_ONE_FUNCTION).
    # 7 and 8 both run the current definition (CREATE OR REPLACE): a database at any
    # version ends with it.
    [STEP_FOUND_FUNCTION, FINISH_ONE_FUNCTION],
    # 9: a delta put's check of its bases is a function (MISSING_BASES_FUNCTION),
    # so no plan cached while the blobs table was small scans it later
    [MISSING_BASES_FUNCTION],
    # 10: aget_tuple's read is a function (CHECKPOINT_TUPLE_FUNCTION): no plan cached
    # while the tables were small scans them later
    [CHECKPOINT_TUPLE_FUNCTION],
    # 11: alist's pages in one namespace are a function too (LIST_IN_NS_FUNCTION)
    [LIST_IN_NS_FUNCTION],
    # 12: and the DeltaChannel history of one channel (delta_history.py)
    [DELTA_HISTORY_FUNCTION],
    # 13: the outcomes of calls that finish together are a function too, prepared like
    # any statement (ledger_sql.FINISH_STEP_FUNCTION)
    [FINISH_STEP_FUNCTION],
    # 14: a step's adoption read of several calls is static queries, one per tool and
    # one per spot (ledger_sql.STEP_FOUND_FUNCTION), not one planned on each call.
    # 7, 8 and 14 all run the current definition: a database at any version ends with it.
    [STEP_FOUND_FUNCTION],
    # 15: the checkpoint reads (aget_tuple, alist in a namespace, the DeltaChannel
    # history) use their generic plan - index probes, with sequential scans off - in
    # every session, whatever the statistics (functions.plpgsql_function's
    # ``generic_plan``); 10, 11, 12 and 15 all run the current definitions
    [CHECKPOINT_TUPLE_FUNCTION, LIST_IN_NS_FUNCTION, DELTA_HISTORY_FUNCTION],
]

SCHEMA_VERSION = len(MIGRATIONS) - 1


# The ledger's statements (ledger_sql.py) and the DeltaChannel history query
# (delta_history.py) live with their jobs; reachable from here as before.
from langgraph_idem_saver.postgres.delta_history import (  # noqa: E402
    delta_history_sql as delta_history_sql,
)
from langgraph_idem_saver.postgres.ledger_sql import *  # noqa: E402, F403
