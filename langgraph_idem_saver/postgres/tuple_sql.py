"""The PostgreSQL backend's checkpoint reads: ``aget_tuple``'s and ``alist``'s statements,
and the two functions migrations 10, 11 and 15 create over them (``migrations.py``).

Text only: this module imports no runtime module, so the migrations can use it without
a circle through the connection code (``sql.py`` re-exports its names for the savers).
"""

from __future__ import annotations

from langgraph_idem_saver.postgres.blob_chain import blob_chain_sql
from langgraph_idem_saver.postgres.functions import TUPLE_RESULT, plpgsql_function

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
#
# The first entry of ``channel_values`` is the row's channel_versions column itself (a
# NULL channel, then the column as text): the saver checks it against the versions its
# checkpoint names (``saver_codec.check_versions``), so a column edited by hand is a
# CorruptRecordError naming the row, never a checkpoint read without its values. Only an
# object is looked up: jsonb_each_text raises on an array or a scalar, which failed the
# whole statement (every row of a page) with a driver error.
PAGE_BOUND = 100
SELECT_TUPLES = """
SELECT c.thread_id, c.checkpoint_ns, c.checkpoint_id, c.parent_checkpoint_id, c.type,
    c.checkpoint, c.metadata, c.metadata_exact,
    ARRAY[ARRAY[NULL, convert_to(c.channel_versions::text, 'UTF8'), NULL, NULL, NULL]]::bytea[]
    || (SELECT array_agg(ARRAY[convert_to(v.key, 'UTF8'), convert_to(b.type, 'UTF8'), b.blob,
                            convert_to(b.version, 'UTF8'), convert_to(b.base_version, 'UTF8')]
                      ORDER BY v.key, b.depth)
     FROM jsonb_each_text(CASE jsonb_typeof(c.channel_versions)
                          WHEN 'object' THEN c.channel_versions END) AS v
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
