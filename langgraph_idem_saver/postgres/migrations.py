"""The PostgreSQL backend's schema: its migrations, and the advisory lock keys.

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

Later migrations create functions over the runtime statements; their text comes from
the SQL-text modules (``tuple_sql``, ``ledger_sql``, ``delta_history_sql``), which import
no runtime module: this module sits below ``connection.py`` with no circle.
"""

from __future__ import annotations

from langgraph_idem_saver.postgres.delta_history_sql import DELTA_HISTORY_FUNCTION
from langgraph_idem_saver.postgres.functions import plpgsql_function
from langgraph_idem_saver.postgres.ledger_sql import (
    FINISH_ONE_FUNCTION,
    FINISH_STEP_FUNCTION,
    STEP_FOUND_FUNCTION,
)
from langgraph_idem_saver.postgres.tuple_sql import CHECKPOINT_TUPLE_FUNCTION, LIST_IN_NS_FUNCTION

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

# a delta put's check of its bases (see sql._PUT_WITH_DELTAS for why a function)
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


TAKE_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(%s)"
SELECT_MIGRATIONS_TABLE = "SELECT to_regclass('idem_saver_migrations') IS NOT NULL"
SELECT_SCHEMA_VERSION = "SELECT MAX(v) FROM idem_saver_migrations"
INSERT_MIGRATION = "INSERT INTO idem_saver_migrations (v) VALUES (%s) ON CONFLICT DO NOTHING"


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
    # 16: the same reads return a row's channel_versions column for the saver to check
    # against its checkpoint, and never call jsonb_each_text on a column that is not an
    # object (a corrupt row is a CorruptRecordError naming it, tuple_sql.SELECT_TUPLES);
    # the DeltaChannel history flags such a row (delta_history_sql._DELTA_HISTORY)
    [CHECKPOINT_TUPLE_FUNCTION, LIST_IN_NS_FUNCTION, DELTA_HISTORY_FUNCTION],
]

SCHEMA_VERSION = len(MIGRATIONS) - 1
