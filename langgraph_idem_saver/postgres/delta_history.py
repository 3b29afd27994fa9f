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
from langgraph_idem_saver.postgres.codec import ZLIB_PREFIX
from langgraph_idem_saver.postgres.connection import Statement, Steps
from langgraph_idem_saver.postgres.delta_history_sql import DELTA_HISTORY_CALL, delta_history_sql
from langgraph_idem_saver.postgres.jsonb import as_text, clean_str
from langgraph_idem_saver.saver_config import checkpoint_id_of, checkpoint_ns_of, thread_id_of

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
        # one channel: the function (delta_history_sql.DELTA_HISTORY_FUNCTION); several:
        # the statement, unprepared (planned for the tables as they are, like the
        # function's reads)
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
        """``result`` filled from the statement's rows (see ``delta_history_sql._DELTA_HISTORY``).

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
        _check_versions(target, thread_id, ns)
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
            _check_versions(here[0], thread_id, ns)
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


def _check_versions(row: TupleRow, thread_id: str, ns: str) -> None:
    """A chain row whose ``channel_versions`` is not a JSON object (its ``type`` column
    says ``'corrupt'``): its row's :class:`CorruptRecordError`."""
    if row[10] is not None:
        raise CorruptRecordError(
            "channel_versions",
            location={"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": row[1]},
            cause=TypeError("not a JSON object"),
        )
