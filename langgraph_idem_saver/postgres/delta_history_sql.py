"""The SQL text of the PostgreSQL ``DeltaChannel`` history read (``delta_history.py``
runs it): the one-statement query per number of channels, and the one-channel function
migration 12 creates (``migrations.py``).

Text only: this module imports no runtime module, so the migrations can use it without
a circle through the connection code.
"""

from __future__ import annotations

from langgraph_idem_saver.postgres.blob_chain import blob_chain_sql
from langgraph_idem_saver.postgres.functions import plpgsql_function

# Everything get_delta_channel_history needs, in ONE statement (one round trip), built
# per number of requested channels (their names are parameters ``c0``, ``c1``, ...).
#
# ``chain`` walks the parent chain of the target (the latest of the namespace when no
# id is given; its row has ``is_target``) by primary key. Per channel ``i``, each row
# carries ``w{i}``: the channel is still walking there (the checkpoint contributes its
# writes), and ``s{i}``: its value is stored at that checkpoint (what
# ``channel_values[ch]`` of its ``aget_tuple`` holds: a blob of the version it names,
# not ``empty``). That is one primary-key probe per walking channel, as a scalar
# subquery with LIMIT 1 so the planner cannot turn it into a join of all of a thread's
# blobs per ancestor (an EXISTS was planned that way: 2.9 s on a 1,000-step thread). A
# channel stops walking past its seed; the recursion stops when none walks, at the root,
# or at a parent that is gone. UNION (not UNION ALL) ends a corrupt chain that loops: a
# revisit repeats an earlier row (the walking set only shrinks), which UNION discards.
# Booleans rather than channel arrays: measured a quarter cheaper per ancestor.
#
# Three kinds of rows come back, as plain columns (cheaper to build and to load than
# per-ancestor arrays): 0, the chain (``walking``/``seeded``: one '0'/'1' per channel);
# 1, each ancestor's writes to its walking channels (task_path, task_id, idx, channel,
# type, data), one primary-key prefix probe per ancestor (LATERAL ... OFFSET 0: a join
# planned from the CTE's row estimate scanned all of a thread's writes); 2, each seed's
# blob rows: the value and, for a list delta (list_deltas.py), the versions it extends,
# by depth, as SELECT_TUPLES follows them (version in the task_path column, depth in
# idx, base_version in base). The saver re-walks the chain from the target by parent id
# and sorts each checkpoint's writes by ``writes_sort_key``, so no ORDER BY. A chain row
# whose channel_versions is not a JSON object (edited by hand: ``->>`` reads NULL from it,
# so the walk would pass it as if it stored nothing) says so in its ``type`` column
# (``'corrupt'``): the saver raises CorruptRecordError naming it.
_DELTA_HISTORY = """
WITH RECURSIVE target AS (
    SELECT checkpoint_id, parent_checkpoint_id,
        jsonb_typeof(channel_versions) = 'object' AS versions_ok
    FROM idem_checkpoints
    WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s {by_id}
    ORDER BY checkpoint_id DESC
    LIMIT 1
), chain (checkpoint_id, parent_checkpoint_id, is_target, versions_ok, {walking}, {seeded}) AS (
    SELECT t.checkpoint_id, t.parent_checkpoint_id, TRUE, t.versions_ok, {all_true}, {all_false}
    FROM target AS t
  UNION
    SELECT c.checkpoint_id, c.parent_checkpoint_id, FALSE,
        jsonb_typeof(c.channel_versions) = 'object', {walking_next}, {probes}
    FROM chain AS ch
    CROSS JOIN LATERAL (
        SELECT a.checkpoint_id, a.parent_checkpoint_id, a.channel_versions
        FROM idem_checkpoints AS a
        WHERE a.thread_id = %(thread_id)s AND a.checkpoint_ns = %(ns)s
          AND a.checkpoint_id = ch.parent_checkpoint_id
        LIMIT 1
    ) AS c
    WHERE {any_walking}
)
SELECT 0 AS kind, ch.checkpoint_id, ch.parent_checkpoint_id, ch.is_target,
    {walking_flags} AS walking, {seeded_flags} AS seeded,
    NULL::text AS task_path, NULL::text AS task_id, NULL::integer AS idx,
    NULL::text AS channel, CASE WHEN NOT ch.versions_ok THEN 'corrupt' END AS type,
    NULL::bytea AS data, NULL::text AS base
FROM chain AS ch
UNION ALL
SELECT 1, ch.checkpoint_id, NULL, NULL, NULL, NULL, w.task_path, w.task_id, w.idx,
    w.channel, w.type, w.value, NULL
FROM chain AS ch CROSS JOIN LATERAL (
    SELECT w.task_path, w.task_id, w.idx, w.channel, w.type, w.value FROM idem_writes AS w
    WHERE w.thread_id = %(thread_id)s AND w.checkpoint_ns = %(ns)s
      AND w.checkpoint_id = ch.checkpoint_id AND ({walking_writes})
    OFFSET 0
) AS w
WHERE NOT ch.is_target
UNION ALL
SELECT 2, ch.checkpoint_id, NULL, NULL, NULL, NULL, b.version, NULL, b.depth, sv.channel,
    b.type, b.blob, b.base_version
FROM chain AS ch
CROSS JOIN LATERAL ({seed_channels}) AS sv (channel)
CROSS JOIN LATERAL (
    SELECT a.channel_versions ->> sv.channel AS version FROM idem_checkpoints AS a
    WHERE a.thread_id = %(thread_id)s AND a.checkpoint_ns = %(ns)s
      AND a.checkpoint_id = ch.checkpoint_id
    LIMIT 1
) AS cv
CROSS JOIN LATERAL (
    {blob_chain}
) AS b
WHERE {any_seeded}
"""
_DELTA_PROBE = """CASE WHEN ch.w{i} AND NOT ch.s{i} THEN (
            SELECT TRUE FROM idem_blobs AS b
            WHERE b.thread_id = %(thread_id)s AND b.checkpoint_ns = %(ns)s
              AND b.channel = %(c{i})s AND b.version = c.channel_versions ->> %(c{i})s::text
              AND b.type <> 'empty'
            LIMIT 1) IS NOT NULL ELSE FALSE END"""

# the seed value of channel ``sv.channel`` at the version ``cv`` names
_SEED_CHAIN = blob_chain_sql(
    thread_id="%(thread_id)s", ns="%(ns)s", channel="sv.channel", version="cv.version"
)

_delta_history_cache: dict[tuple[int, bool], str] = {}


def delta_history_sql(n_channels: int, by_id: bool) -> str:
    """The history statement for ``n_channels`` channels (parameters thread_id, ns,
    c0..c{n-1}, and checkpoint_id when ``by_id``), built once per shape."""
    key = (n_channels, by_id)
    query = _delta_history_cache.get(key)
    if query is None:
        each = range(n_channels)

        def flags(column: str) -> str:
            return " || ".join(f"CASE WHEN ch.{column}{i} THEN '1' ELSE '0' END" for i in each)

        query = _DELTA_HISTORY.format(
            by_id="AND checkpoint_id = %(checkpoint_id)s" if by_id else "",
            walking=", ".join(f"w{i}" for i in each),
            seeded=", ".join(f"s{i}" for i in each),
            all_true=", ".join("TRUE" for _ in each),
            all_false=", ".join("FALSE" for _ in each),
            walking_next=", ".join(f"ch.w{i} AND NOT ch.s{i}" for i in each),
            probes=", ".join(_DELTA_PROBE.format(i=i) for i in each),
            any_walking=" OR ".join(f"(ch.w{i} AND NOT ch.s{i})" for i in each),
            walking_flags=flags("w"),
            seeded_flags=flags("s"),
            walking_writes=" OR ".join(f"(ch.w{i} AND w.channel = %(c{i})s)" for i in each),
            seed_channels=" UNION ALL ".join(f"SELECT %(c{i})s::text WHERE ch.s{i}" for i in each),
            any_seeded=" OR ".join(f"ch.s{i}" for i in each),
            blob_chain=_SEED_CHAIN,
        )
        _delta_history_cache[key] = query
    return query


def _in_function(query: str) -> str:
    """A one-channel history statement with its parameters as the function's arguments."""
    for param, arg in (
        ("%(thread_id)s", "p_thread_id"),
        ("%(ns)s", "p_ns"),
        ("%(checkpoint_id)s", "p_checkpoint_id"),
        ("%(c0)s", "p_c0"),
    ):
        query = query.replace(param, arg)
    return query


# The one-channel statement (a DeltaChannel state has one such channel, most often) as a
# function, with sequential scans off (migration 12): prepared as it is, the generic plan
# PostgreSQL caches after five executions, built while the tables were small, scanned
# them once per ancestor after they grew (600,000 rows for a 30-step thread in
# tests/test_postgres_specific.py). Several channels send the statement itself (its
# shape depends on their number), unprepared. ``#variable_conflict use_column``: the
# result's column names are also OUT parameters; in the query they mean the columns.
DELTA_HISTORY_FUNCTION = plpgsql_function(
    """idem_delta_history(
    p_thread_id text, p_ns text, p_checkpoint_id text, p_c0 text)""",
    """TABLE (
    kind integer, checkpoint_id text, parent_checkpoint_id text, is_target boolean,
    walking text, seeded text, task_path text, task_id text, idx integer, channel text,
    type text, data bytea, base text)""",
    f"""
BEGIN
    IF p_checkpoint_id IS NULL THEN
        RETURN QUERY {_in_function(delta_history_sql(1, by_id=False))};
    ELSE
        RETURN QUERY {_in_function(delta_history_sql(1, by_id=True))};
    END IF;
END
""",
    use_column=True,
    generic_plan=True,
)
DELTA_HISTORY_CALL = (
    "SELECT * FROM idem_delta_history(%(thread_id)s, %(ns)s, %(checkpoint_id)s, %(c0)s)"
)
