"""The PostgreSQL backend's checkpoint SQL: writes, deletion, copy and prune.

The reads (``aget_tuple``, ``alist``) are in ``tuple_sql.py``, the schema and its
migrations in ``migrations.py``, the ledger's statements in ``ledger_sql.py``: SQL-text
modules that import no runtime module. Their names used by the savers and by
``connection.py``'s ``setup()`` are re-exported here, so one ``sql`` namespace serves
the runtime.

All values are bound parameters. Statements that take a variable number of rows take
them as a multi-row VALUES list (built per row count and cached: a handful of distinct,
prepared statements) or as arrays they ``unnest``, so every call is a single statement
(one round trip, atomic on its own under autocommit).
"""

from __future__ import annotations

import json

# Re-exported for the runtime: the schema and its lock keys (connection.py's setup()),
# the checkpoint reads (the savers). Defined in SQL-text modules below this one.
from langgraph_idem_saver.postgres.migrations import INSERT_MIGRATION as INSERT_MIGRATION
from langgraph_idem_saver.postgres.migrations import MIGRATION_LOCK_KEY as MIGRATION_LOCK_KEY
from langgraph_idem_saver.postgres.migrations import MIGRATIONS as MIGRATIONS
from langgraph_idem_saver.postgres.migrations import SCHEMA_VERSION as SCHEMA_VERSION
from langgraph_idem_saver.postgres.migrations import (
    SELECT_MIGRATIONS_TABLE as SELECT_MIGRATIONS_TABLE,
)
from langgraph_idem_saver.postgres.migrations import SELECT_SCHEMA_VERSION as SELECT_SCHEMA_VERSION
from langgraph_idem_saver.postgres.migrations import TAKE_MIGRATION_LOCK as TAKE_MIGRATION_LOCK
from langgraph_idem_saver.postgres.migrations import THREAD_LOCK_SPACE as THREAD_LOCK_SPACE
from langgraph_idem_saver.postgres.tuple_sql import (
    CHECKPOINT_TUPLE_FUNCTION as CHECKPOINT_TUPLE_FUNCTION,
)
from langgraph_idem_saver.postgres.tuple_sql import LIST_AFTER as LIST_AFTER
from langgraph_idem_saver.postgres.tuple_sql import LIST_AFTER_IN_NS as LIST_AFTER_IN_NS
from langgraph_idem_saver.postgres.tuple_sql import LIST_AFTER_IN_THREAD as LIST_AFTER_IN_THREAD
from langgraph_idem_saver.postgres.tuple_sql import LIST_IN_NS_FUNCTION as LIST_IN_NS_FUNCTION
from langgraph_idem_saver.postgres.tuple_sql import LIST_LIMIT as LIST_LIMIT
from langgraph_idem_saver.postgres.tuple_sql import PAGE_BOUND as PAGE_BOUND
from langgraph_idem_saver.postgres.tuple_sql import SELECT_LATEST_TUPLE as SELECT_LATEST_TUPLE
from langgraph_idem_saver.postgres.tuple_sql import SELECT_LIST_IN_NS_CALL as SELECT_LIST_IN_NS_CALL
from langgraph_idem_saver.postgres.tuple_sql import SELECT_TUPLE_BY_ID as SELECT_TUPLE_BY_ID
from langgraph_idem_saver.postgres.tuple_sql import SELECT_TUPLE_CALL as SELECT_TUPLE_CALL
from langgraph_idem_saver.postgres.tuple_sql import SELECT_TUPLES as SELECT_TUPLES
from langgraph_idem_saver.postgres.tuple_sql import WHERE_BY_ID as WHERE_BY_ID
from langgraph_idem_saver.postgres.tuple_sql import WHERE_LATEST as WHERE_LATEST

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
#
# The function's argument - a JSON array of [thread_id, checkpoint_ns, channel,
# base_version], one per delta row - is built by the client (``delta_bases_json``) and
# sent as one parameter after the rows: aggregated here from ``new_rows``
# (``json_agg(json_build_array(...))``) it cost the server 40-60 us more CPU a put (9 of
# the 12 puts of a 10-step ``graph.invoke``; benchmarks/README.md, issue #41).

_PUT_WITH_DELTAS = """
WITH new_rows (thread_id, checkpoint_ns, channel, version, type, blob, base_version) AS (
    VALUES {rows}
), missing AS (
    SELECT m AS channel FROM idem_missing_bases(%s::json) AS m
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
    channel, version, type, blob, base_version), then, with ``deltas``, the bases'
    JSON (``delta_bases_json``), then the checkpoint row's 10 parameters.

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


def delta_bases_json(bases: list[tuple[str, str, str, str]]) -> str:
    """``idem_missing_bases``' argument in ``_PUT_WITH_DELTAS``: the JSON array of each
    delta row's (thread_id, checkpoint_ns, channel, base_version), as the statement once
    built with ``json_agg(json_build_array(...))`` (non-ASCII text as it is, not escaped)."""
    return json.dumps(bases, ensure_ascii=False, separators=(",", ":"))


def put_writes_sql(n_writes: int) -> str:
    """aput_writes' statement for ``n_writes`` rows (9 parameters each)."""
    query = _put_writes_cache.get(n_writes)
    if query is None:
        query = _UPSERT_WRITES.format(rows=", ".join([_WRITE_ROW] * n_writes))
        _put_writes_cache[n_writes] = query
    return query


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
