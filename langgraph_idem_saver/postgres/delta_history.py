"""``aget_delta_channel_history`` on PostgreSQL in one statement (mixed into
:class:`AsyncPostgresSaver`): what LangGraph's default returns for a ``DeltaChannel``
thread, without its one ``aget_tuple`` per ancestor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory
from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg.rows import TupleRow

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.postgres.blob_chain import blob_chain_sql
from langgraph_idem_saver.postgres.codec import ZLIB_PREFIX
from langgraph_idem_saver.postgres.connection import Statement, Steps
from langgraph_idem_saver.postgres.functions import plpgsql_function
from langgraph_idem_saver.postgres.jsonb import as_text, clean_str
from langgraph_idem_saver.saver_config import checkpoint_id_of, checkpoint_ns_of, thread_id_of

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
# and sorts each checkpoint's writes by ``writes_sort_key``, so no ORDER BY.
_DELTA_HISTORY = """
WITH RECURSIVE target AS (
    SELECT checkpoint_id, parent_checkpoint_id FROM idem_checkpoints
    WHERE thread_id = %(thread_id)s AND checkpoint_ns = %(ns)s {by_id}
    ORDER BY checkpoint_id DESC
    LIMIT 1
), chain (checkpoint_id, parent_checkpoint_id, is_target, {walking}, {seeded}) AS (
    SELECT t.checkpoint_id, t.parent_checkpoint_id, TRUE, {all_true}, {all_false}
    FROM target AS t
  UNION
    SELECT c.checkpoint_id, c.parent_checkpoint_id, FALSE, {walking_next}, {probes}
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
    NULL::text AS channel, NULL::text AS type, NULL::bytea AS data, NULL::text AS base
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

T = TypeVar("T")


class PostgresDeltaHistory:
    """The one-statement ``DeltaChannel`` history read."""

    if TYPE_CHECKING:
        serde: SerializerProtocol

        def _load(self, type_: str, data: bytes | None, what: str, **location: Any) -> Any: ...

        def _resolve(
            self, chain: list[tuple[str, bytes | None, str | None, str | None]], **where: Any
        ) -> tuple[Any, int]: ...

        async def _read_steps(self, make_steps: Callable[[], Steps[T]]) -> T: ...

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per requested channel: the writes on the parent chain since the nearest
        ancestor that stores the channel's value, and that value (``seed``, absent when
        the walk reaches the root without one) - exactly what LangGraph's default
        returns, in ONE statement (one round trip) whatever the chain's length.

        LangGraph calls this whenever it loads a thread with a ``DeltaChannel``. Its
        default walks the chain with one ``aget_tuple`` (one round trip, every channel
        value and write decoded) per ancestor. Here one recursive statement
        (``delta_history_sql``) follows the parent ids by primary key, stops each
        channel at its seed, and returns only the requested channels' writes and seeds.
        (LangGraph's own Postgres saver pages the namespace by checkpoint id instead,
        which misses a parent whose id sorts after its child's - ids are only ordered
        within one process.)
        """
        if not channels:
            return {}
        return await self._read_steps(lambda: self._delta_history_steps(config, channels))

    def _delta_history_steps(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Steps[dict[str, DeltaChannelHistory]]:
        """The read as a :data:`Steps` body: its one statement, then the decoding. Shared
        with ``PostgresSaver.get_delta_channel_history``, which runs it on the caller's
        thread (the direct path)."""
        wanted = list(dict.fromkeys(channels))
        thread_id = as_text(thread_id_of(config), "thread_id")
        ns = as_text(checkpoint_ns_of(config), "checkpoint_ns")
        checkpoint_id = checkpoint_id_of(config)
        # a channel name PostgreSQL text cannot hold has nothing stored: no writes, no seed
        walking = [ch for ch in wanted if clean_str(ch)]
        result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in wanted}
        if not walking:
            return result
        params: dict[str, Any] = {"thread_id": thread_id, "ns": ns}
        params.update((f"c{i}", ch) for i, ch in enumerate(walking))
        if checkpoint_id:
            params["checkpoint_id"] = as_text(checkpoint_id, "checkpoint_id")
        # one channel: the function (DELTA_HISTORY_FUNCTION); several: the statement,
        # unprepared (planned for the tables as they are, like the function's reads)
        if len(walking) == 1:
            params.setdefault("checkpoint_id", None)
            statement = Statement(DELTA_HISTORY_CALL, params, "all")
        else:
            query = delta_history_sql(len(walking), bool(checkpoint_id))
            statement = Statement(query, params, "all", prepare=False)
        rows: list[TupleRow] = yield statement
        return self._delta_history_of(rows, walking, result, thread_id, ns)

    def _delta_history_of(
        self,
        rows: list[TupleRow],
        walking: list[str],
        result: dict[str, DeltaChannelHistory],
        thread_id: str,
        ns: str,
    ) -> dict[str, DeltaChannelHistory]:
        """``result`` filled from the statement's rows (see ``_DELTA_HISTORY``).

        Hot: LangGraph calls it on every load of a ``DeltaChannel`` thread, and a walk is
        as long as the distance to the seed (100 writes to decode for a 100-step thread).
        Hence the flags of a step computed once per distinct pair of flag strings, and
        values decoded through :func:`_decoder` (no keyword arguments per value)."""
        target: TupleRow | None = None
        chain: dict[str, list[TupleRow]] = {}  # checkpoint id -> its chain rows
        # checkpoint id -> (task_id, idx) -> write; (checkpoint id, channel) -> depth -> blob.
        # Keyed so that a chain that loops (its rows repeat) yields each row once.
        writes: dict[str, dict[tuple[str, int], TupleRow]] = {}
        blobs: dict[tuple[str, str], dict[int, TupleRow]] = {}
        for row in rows:
            kind, cid = row[0], row[1]
            if kind == 0 and row[3]:
                target = row
            elif kind == 0:
                chain.setdefault(cid, []).append(row)
            elif kind == 1:
                writes.setdefault(cid, {})[(row[7], row[8])] = row
            else:
                blobs.setdefault((cid, row[9]), {})[row[8]] = row
        if target is None:
            return result
        # re-walk from the target: the chain rows of the channels' walks, nearest first
        walk: list[tuple[str, frozenset[str], tuple[str, ...]]] = []  # (id, walking, seeded)
        steps: dict[tuple[str, str], tuple[frozenset[str], tuple[str, ...], str]] = {}
        remaining = "1" * len(walking)
        seen = {target[1]}
        parent: str | None = target[2]
        while parent is not None and "1" in remaining and parent not in seen:
            seen.add(parent)
            # one row per ancestor; more only when a corrupt chain loops back
            here = [r for r in chain.get(parent, ()) if r[4] == remaining]
            if not here:  # the parent is gone (pruned, deleted)
                break
            flags = (remaining, here[0][5])
            step = steps.get(flags)
            if step is None:
                step = steps[flags] = _walk_step(walking, *flags)
            walking_here, seeded_here, remaining = step
            walk.append((parent, walking_here, seeded_here))
            parent = here[0][2]
        decode = _decoder(self, thread_id, ns)
        for cid, walking_here, seeded_here in reversed(walk):
            found = writes.get(cid)
            if found:
                # writes_sort_key order, as get_tuple returns them
                in_order = (
                    sorted(found.values(), key=_write_order) if len(found) > 1 else found.values()
                )
                for w in in_order:
                    channel = w[9]
                    if channel in walking_here:
                        value = decode(w[10], w[11], cid, channel, w[7])
                        result[channel]["writes"].append((w[7], channel, value))
            for channel in seeded_here:
                where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
                stored = [
                    (r[10], r[11], r[6], r[12])  # type, blob, version, base_version
                    for _, r in sorted(blobs.get((cid, channel), {}).items())
                ]
                if not stored:  # the chain saw it in this same statement
                    raise CorruptRecordError(
                        "channel value",
                        location={**where, "channel": channel},
                        cause=LookupError("the seed's blob vanished within one statement"),
                    )
                btype, blob, _, base_version = stored[0]
                if base_version is None:
                    seed = self._load(btype, blob, "channel value", channel=channel, **where)
                else:
                    seed, _ = self._resolve(stored, channel=channel, **where)
                result[channel]["seed"] = seed
        return result


def _write_order(w: TupleRow) -> tuple[Any, ...]:
    """A write row's place among its checkpoint's writes: task_path, task_id, idx."""
    return (w[6], w[7], w[8])


def _walk_step(
    walking: list[str], remaining: str, seeded: str
) -> tuple[frozenset[str], tuple[str, ...], str]:
    """One ancestor of the walk, from its flag strings (one '0'/'1' per channel): the
    channels it contributes writes to, those whose seed it stores, and the flags of the
    channels still walking past it."""
    flags = list(zip(walking, remaining, seeded, strict=True))
    return (
        frozenset(ch for ch, w, _ in flags if w == "1"),
        tuple(ch for ch, w, s in flags if w == "1" and s == "1"),
        "".join("1" if w == "1" and s == "0" else "0" for _, w, s in flags),
    )


def _decoder(
    saver: PostgresDeltaHistory, thread_id: str, ns: str
) -> Callable[[str, bytes | None, str, str, str], Any]:
    """``decode(type, data, checkpoint_id, channel, task_id)``: a pending write's value,
    a :class:`CorruptRecordError` naming where it is stored when it cannot be read."""
    serde_load = saver.serde.loads_typed

    def decode(type_: str, data: bytes | None, cid: str, channel: str, task_id: str) -> Any:
        if not type_.startswith(ZLIB_PREFIX):
            try:
                return serde_load((type_, data if data is not None else b""))
            except Exception:
                pass  # _load below raises it, typed and located
        where = {"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": cid}
        return saver._load(type_, data, "pending write", task_id=task_id, channel=channel, **where)

    return decode
