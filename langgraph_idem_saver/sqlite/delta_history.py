"""``aget_delta_channel_history`` on SQLite in one worker hand-off (mixed into
:class:`AsyncSqliteSaver`): what LangGraph's default returns for a ``DeltaChannel``
thread, without its one ``aget_tuple`` per ancestor.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import DeltaChannelHistory

from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.list_deltas import resolve_value
from langgraph_idem_saver.saver_codec import decode_typed
from langgraph_idem_saver.saver_config import checkpoint_id_of, checkpoint_ns_of, thread_id_of
from langgraph_idem_saver.sqlite import sql
from langgraph_idem_saver.sqlite.connection import read_tx
from langgraph_idem_saver.surrogates import utf8_ok

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol

T = TypeVar("T")


class SqliteDeltaHistory:
    """The one-hand-off ``DeltaChannel`` history read."""

    if TYPE_CHECKING:
        serde: SerializerProtocol

        async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T: ...

    async def aget_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """Per requested channel: the writes on the parent chain since the nearest
        ancestor that stores the channel's value, and that value (``seed``, absent when
        the walk reaches the root without one) - exactly what LangGraph's default
        returns, in one worker hand-off whatever the chain's length.

        LangGraph calls this whenever it loads a thread with a ``DeltaChannel``. Its
        default walks the chain with one ``aget_tuple`` per ancestor, each decoding every
        channel value and write of that checkpoint. Here one recursive statement walks
        the chain (read lazily: it stops once every channel has its seed, or at an id
        seen before), one more fetches just the requested channels' writes of the
        ancestors each channel's walk visited, and each seed is one primary-key read
        (plus its list-delta bases); all in one read transaction.
        """
        if not channels:
            return {}
        return await self._run(self._delta_history_body(config, channels))

    def _delta_history_body(
        self, config: RunnableConfig, channels: Sequence[str]
    ) -> Callable[[sqlite3.Connection], dict[str, DeltaChannelHistory]]:
        """``aget_delta_channel_history``'s read (one read transaction), to run on the
        connection."""
        wanted = list(dict.fromkeys(channels))
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        # a name SQLite text cannot hold (a lone surrogate) has nothing stored
        walking = [ch for ch in wanted if utf8_ok(ch)]
        paths = [sql.delta_path(ch) for ch in walking]
        params: dict[str, Any] = {
            "thread_id": thread_id,
            "ns": ns,
            "checkpoint_id": checkpoint_id_of(config),
        }
        for i, (ch, path) in enumerate(zip(walking, paths, strict=True)):
            params[f"c{i}"] = ch
            if path is not None:
                params[f"p{i}"] = path
        chain_sql = sql.delta_chain_sql(tuple(p is not None for p in paths))

        def read(conn: sqlite3.Connection) -> dict[str, DeltaChannelHistory]:
            result: dict[str, DeltaChannelHistory] = {ch: {"writes": []} for ch in wanted}
            if not walking:
                return result
            walked: list[str] = []  # ancestor ids, nearest first
            visits: dict[int, int] = {}  # channel index -> ancestors its walk visited
            seeds: dict[str, tuple[str, str]] = {}  # channel -> (checkpoint id, version)
            remaining = dict(enumerate(walking))
            rows = conn.execute(chain_sql, params)
            try:
                target = rows.fetchone()
                if target is None:
                    return result
                _check_versions(target, thread_id, ns)
                seen = {target[0]}
                for row in rows:
                    if row[0] in seen:  # a chain that loops: stop where it repeats
                        break
                    _check_versions(row, thread_id, ns)
                    seen.add(row[0])
                    walked.append(row[0])
                    for i in [i for i in remaining if row[i + 2] is not None]:
                        seeds[remaining.pop(i)] = (row[0], row[i + 2])
                        visits[i] = len(walked)
                    if not remaining:
                        break
            finally:
                rows.close()
            for i in remaining:
                visits[i] = len(walked)
            if walked:
                oldest_first = walked[::-1]
                args: dict[str, Any] = {
                    "thread_id": thread_id,
                    "ns": ns,
                    "chain": json.dumps(oldest_first),
                }
                for i, ch in enumerate(walking):
                    args[f"c{i}"] = ch
                    args[f"f{i}"] = len(walked) - visits[i]
                writes = conn.execute(sql.delta_writes_sql(len(walking)), args).fetchall()
                # oldest checkpoint first, each in writes_sort_key order (get_tuple's)
                writes.sort(key=lambda w: (w[0], w[1], w[2], w[3]))
                for pos, _path, task_id, _idx, channel, wtype, value in writes:
                    value = decode_typed(
                        self.serde, wtype, value, "pending write", thread_id=thread_id,
                        checkpoint_ns=ns, checkpoint_id=oldest_first[pos], task_id=task_id,
                        channel=channel,
                    )  # fmt: skip
                    result[channel]["writes"].append((task_id, channel, value))
            for ch, (checkpoint_id, version) in seeds.items():
                where = {
                    "thread_id": thread_id,
                    "checkpoint_ns": ns,
                    "checkpoint_id": checkpoint_id,
                }

                def fetch(v: str, ch: str = ch) -> Any:
                    return conn.execute(sql.SELECT_BLOB, (thread_id, ns, ch, v)).fetchone()

                row = fetch(version)
                if row is None:  # the chain statement saw it in this same transaction
                    raise CorruptRecordError(
                        "channel value",
                        location={**where, "channel": ch, "version": version},
                        cause=LookupError("the seed's blob vanished within one read"),
                    )
                result[ch]["seed"], _ = resolve_value(
                    self.serde, row[0], row[1], row[2], fetch, channel=ch, **where
                )
            return result

        return lambda conn: read_tx(conn, read)


def _check_versions(row: Sequence[Any], thread_id: str, ns: str) -> None:
    """A walked checkpoint whose ``channel_versions`` is not a JSON object (the chain
    statement's ``corrupt`` column): its row's :class:`CorruptRecordError`."""
    if row[1]:
        raise CorruptRecordError(
            "channel_versions",
            location={"thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": row[0]},
            cause=TypeError("not a JSON object"),
        )
