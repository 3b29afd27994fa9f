"""What every backend's saver shares: config parsing, encoding, versions, the sync bridge.

Backends subclass :class:`IdemSaverBase` and implement the async methods of
``BaseCheckpointSaver`` and :class:`~langgraph_idem_saver.ledger.ToolCallLedger`; the
synchronous methods here run those coroutines on the saver's event loop, as LangGraph's
own async savers do, so ``graph.invoke`` from a worker thread works and a sync call made
on the loop's own thread fails loudly instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
import time
from abc import abstractmethod
from collections.abc import Callable, Coroutine, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.errors import (
    ConfigError,
    CorruptRecordError,
    IdemSaverError,
    SerializationError,
)
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, ToolCallLedger
from langgraph_idem_saver.surrogates import escape_surrogates, has_split_pair, lossless

T = TypeVar("T")

PRUNE_STRATEGIES = ("keep_latest", "delete")
# longest thread id / namespace / checkpoint id accepted, in UTF-8 bytes
MAX_ID_BYTES = 1024
# marks tool args stored encrypted (canonical JSON never starts with a NUL byte)
SEALED_ARGS = b"\x00sealed\x00"


class SyncCallOnEventLoopError(IdemSaverError, asyncio.InvalidStateError):
    """A synchronous saver method was called on the event loop the saver runs on.

    Blocking that thread would deadlock (the result can only be produced by the loop
    we would be blocking). Use the ``a``-prefixed method, or ``await graph.ainvoke``.
    """


def thread_id_of(config: RunnableConfig | None) -> str:
    """The config's ``thread_id`` as a string, or a :class:`ConfigError` naming the key."""
    configurable = (config or {}).get("configurable")
    if not isinstance(configurable, dict):
        raise ConfigError(
            "config has no 'configurable' dict; pass "
            "{'configurable': {'thread_id': ...}} (LangGraph needs a thread_id to checkpoint)"
        )
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise ConfigError(
            "config['configurable'] has no 'thread_id'; pass "
            "{'configurable': {'thread_id': ...}} to use a checkpointer"
        )
    if not isinstance(thread_id, (str, int)) or isinstance(thread_id, bool):
        raise ConfigError(
            f"config['configurable']['thread_id'] must be a str (or int), got "
            f"{type(thread_id).__name__}"
        )
    return _storable(str(thread_id), "thread_id")


def _storable(value: str, what: str) -> str:
    """``value`` if a database can store it as text; a :class:`ConfigError` otherwise
    (lone surrogates cannot be encoded; NUL is refused by PostgreSQL and truncates in
    some SQLite functions)."""
    if "\x00" in value:
        raise ConfigError(f"{what} must not contain NUL (\\x00) characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} is not valid text (lone surrogate): {exc}") from exc
    if size > MAX_ID_BYTES:
        # PostgreSQL cannot index keys much longer (btree rows max out near 2.7 KB); the
        # same limit on every backend keeps a thread portable between them
        raise ConfigError(f"{what} is {size} bytes long; the limit is {MAX_ID_BYTES}")
    return value


def checkpoint_ns_of(config: RunnableConfig) -> str:
    """The config's ``checkpoint_ns`` ('' when absent), validated to be a string."""
    ns = config["configurable"].get("checkpoint_ns", "")
    if ns is None:
        return ""
    if not isinstance(ns, str):
        raise ConfigError(
            f"config['configurable']['checkpoint_ns'] must be a str, got {type(ns).__name__}"
        )
    return _storable(ns, "checkpoint_ns")


def checkpoint_id_of(config: RunnableConfig) -> str | None:
    """The config's ``checkpoint_id`` or None, validated to be a string."""
    cid = config["configurable"].get("checkpoint_id")
    if cid is None or cid == "":
        return None
    if not isinstance(cid, str):
        raise ConfigError(
            f"config['configurable']['checkpoint_id'] must be a str, got {type(cid).__name__}"
        )
    return _storable(cid, "checkpoint_id")


def text_of(value: str, what: str) -> str:
    """``value`` if it is text a database can hold (no lone surrogates); a
    :class:`ConfigError` otherwise, before anything is written (SQLite's and psycopg's
    drivers would raise a raw ``UnicodeEncodeError`` mid-call). For the ids of writes
    and channels, which LangGraph makes and ``_storable``'s other limits do not apply to.
    """
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} {value!r} is not valid text (lone surrogate): {exc}") from exc
    return value


def encode_metadata(metadata: CheckpointMetadata) -> str:
    """Metadata as canonical JSON text (sorted keys), the form filters compare against.

    UTF-8 text, with lone surrogates (which UTF-8 cannot carry) as ``\\uXXXX`` escapes, so
    such strings round-trip exactly. A high surrogate directly followed by a low one
    cannot (JSON reads the two escapes back as one character): :class:`SerializationError`
    before anything is written.
    """
    try:
        text = json.dumps(
            metadata, ensure_ascii=False, sort_keys=True, separators=(",", ":"), allow_nan=False
        )
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"checkpoint metadata must be JSON-serializable (str/int/float/bool/None, "
            f"lists and dicts of them): {exc}"
        ) from exc
    escaped = escape_surrogates(text)
    if escaped is not text and has_split_pair(text):
        raise SerializationError(
            "checkpoint metadata holds a high surrogate directly followed by a low one "
            "(two code points), which JSON cannot store exactly (it would read back as one "
            "character); nothing was written"
        )
    return escaped


def metadata_matches(metadata: dict[str, Any], filter: dict[str, Any]) -> bool:
    """LangGraph's InMemorySaver rule for ``alist(filter=...)``: every filter value
    ``==`` the metadata's (Python equality: ``1 == 1.0 == True``; ``None`` also matches
    an absent key). Backends narrow in SQL, then decide with this."""
    return all(value == metadata.get(key) for key, value in filter.items())


def canonical_json(value: Any) -> str:
    """Canonical JSON for equality comparisons inside the database (metadata filters)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def encode_versions(versions: ChannelVersions) -> str:
    """``channel_versions`` as a JSON object of strings: the blob keys of a checkpoint."""
    return json.dumps({k: str(v) for k, v in versions.items()}, separators=(",", ":"))


def decode_typed(
    serde: SerializerProtocol, type_: str, data: bytes | None, what: str, **location: Any
) -> Any:
    """``serde.loads_typed`` that turns any decoding failure into :class:`CorruptRecordError`."""
    try:
        return serde.loads_typed((type_, data if data is not None else b""))
    except Exception as exc:
        raise CorruptRecordError(what, location=location, cause=exc) from exc


def decode_checkpoint(
    serde: SerializerProtocol, type_: str, data: bytes | None, **location: Any
) -> dict[str, Any]:
    """Decode a stored checkpoint, insisting it decodes to a checkpoint-shaped dict."""
    value = decode_typed(serde, type_, data, "checkpoint", **location)
    if not isinstance(value, dict) or "id" not in value:
        raise CorruptRecordError(
            "checkpoint",
            location=location,
            cause=TypeError(f"decoded to {type(value).__name__}, not a checkpoint dict"),
        )
    return value


def decode_json(text: str | bytes, what: str, **location: Any) -> Any:
    """``json.loads`` that turns a failure into :class:`CorruptRecordError`."""
    try:
        return json.loads(text)
    except Exception as exc:
        raise CorruptRecordError(what, location=location, cause=exc) from exc


def make_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that addresses one stored checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class _LosslessSerde:
    """The ``serde`` attribute of our savers: whatever sets it (``__init__``, LangGraph's
    ``with_allowlist``, a user) gets LangGraph's ``JsonPlusSerializer`` in its lossless
    variant, so lone surrogates are stored exactly instead of as ``?`` (see
    :mod:`langgraph_idem_saver.surrogates`); other serializers are kept as given. Read on
    the class, it is the default serializer, as on LangGraph's savers."""

    default: SerializerProtocol = lossless(JsonPlusSerializer())

    def __get__(self, obj: object, owner: type | None = None) -> SerializerProtocol:
        if obj is None:
            return self.default
        found: SerializerProtocol = obj.__dict__.get("_idem_serde", self.default)
        return found

    def __set__(self, obj: object, value: SerializerProtocol) -> None:
        obj.__dict__["_idem_serde"] = lossless(value)


class IdemSaverBase(BaseCheckpointSaver[str], ToolCallLedger):
    """Shared behaviour of :class:`AsyncSqliteSaver` and :class:`AsyncPostgresSaver`."""

    loop: asyncio.AbstractEventLoop | None

    def __init__(self, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)  # sets self.serde, made lossless (_LosslessSerde)
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None

    # the serializer of checkpoints, writes and ledger results: see _LosslessSerde
    serde = _LosslessSerde()

    def _remember_loop(self) -> None:
        """Record the loop of the first async call, for savers built outside a loop."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    # --- what the ledger keeps in clear --------------------------------------------

    def _encrypts(self) -> bool:
        return isinstance(self.serde, EncryptedSerializer)

    def seal_args(self, args: bytes) -> bytes:
        """Tool args as stored: in clear (canonical JSON), or encrypted by the saver's
        serializer when it encrypts - then the ledger holds no plaintext but keys,
        hashes, names and timestamps."""
        if not self._encrypts():
            return args
        type_, data = self.serde.dumps_typed(args.decode("utf-8"))
        return SEALED_ARGS + type_.encode() + b"\x00" + data

    def ledger_error(self, error: str | None) -> str | None:
        """The error text kept beside a failed call's result: none when encrypting (the
        encrypted result, the error ToolMessage, holds it)."""
        return None if self._encrypts() else error

    def entry_of(self, row: Sequence[Any]) -> LedgerEntry:
        """A ledger row as an entry, its args opened if they were sealed."""
        entry = LedgerEntry.from_row(row)
        if not entry.args.startswith(SEALED_ARGS):
            return entry
        type_, _, data = entry.args[len(SEALED_ARGS) :].partition(b"\x00")
        text = decode_typed(
            self.serde, type_.decode(), data, "tool call args", scope=entry.scope, key=entry.key
        )
        return dataclasses.replace(entry, args=str(text).encode("utf-8"))

    # --- the ledger: policy here, three record primitives per backend ------------------
    #
    # As in AWS Powertools' idempotency persistence layer: statuses, guards, leases and
    # parameters are decided once, here; a backend supplies its SQL module (``_sql``,
    # the same statement names and parameter order in both) and three primitives.

    _sql: Any

    @abstractmethod
    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        """Rows of a SELECT over the ledger, as entries."""

    @abstractmethod
    async def _guarded_update(
        self,
        query: str,
        params: tuple[Any, ...],
        scope: str,
        key: str,
        *,
        before_tool_runs: bool = False,
    ) -> LedgerEntry | None:
        """A guarded UPDATE of one entry, committed: the entry after it, or None when the
        guard did not match. ``before_tool_runs``: the commit lets a tool run (durable)."""

    @abstractmethod
    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        """One ledger statement, committed; the number of rows it changed."""

    async def areclaim(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        lease_seconds: float,
        expected_attempts: int,
        expected_owner: str,
    ) -> LedgerEntry | None:
        now = time.time()
        params = (owner, now, now + lease_seconds, scope, key, expected_attempts, expected_owner)
        return await self._guarded_update(
            self._sql.RECLAIM_ENTRY, params, scope, key, before_tool_runs=True
        )

    async def arelease(self, scope: str, key: str, *, owner: str) -> bool:
        """Drop an ``issued`` claim we own without an outcome (the tool was interrupted
        by ``interrupt()`` before doing anything final, so re-entry must run it again)."""
        return await self._ledger_write(self._sql.RELEASE_ENTRY, (scope, key, owner)) > 0

    async def aadopt(
        self, scope: str, key: str, *, tool_call_id: str, previous: str | None = None
    ) -> LedgerEntry | None:
        return await self._guarded_update(
            self._sql.ADOPT_ENTRY, (tool_call_id, scope, key, previous), scope, key
        )

    async def aabandon(
        self, scope: str, key: str, *, owner: str, error: str
    ) -> LedgerEntry | None:
        params = (time.time(), self.ledger_error(error), scope, key, owner)
        return await self._guarded_update(self._sql.ABANDON_ENTRY, params, scope, key)

    async def aget_entry(self, scope: str, key: str) -> LedgerEntry | None:
        found = await self._select_entries(self._sql.SELECT_ENTRY, (scope, key))
        return found[0] if found else None

    async def afind_orphans(
        self, scope: str, agent_path: str, tool_name: str, args_hash: str
    ) -> list[LedgerEntry]:
        return await self._select_entries(
            self._sql.SELECT_ORPHAN_CANDIDATES, (scope, agent_path, tool_name, args_hash)
        )

    async def afind_at_position(
        self, scope: str, position: str, tool_name: str
    ) -> list[LedgerEntry]:
        return await self._select_entries(
            self._sql.SELECT_AT_POSITION, (scope, position, tool_name)
        )

    async def alist_entries(
        self, thread_id: str | None = None, *, agent_path: str | None = None
    ) -> list[LedgerEntry]:
        if thread_id is None:
            return await self._select_entries(self._sql.SELECT_ALL_ENTRIES, ())
        if agent_path is None:
            return await self._select_entries(self._sql.SELECT_ENTRIES_OF_THREAD, (str(thread_id),))
        return await self._select_entries(
            self._sql.SELECT_ENTRIES_OF_AGENT, (str(thread_id), agent_path)
        )

    async def alist_issued(self) -> list[LedgerEntry]:
        return await self._select_entries(self._sql.SELECT_ISSUED, ())

    async def alist_unknown(self, *, now: float | None = None) -> list[LedgerEntry]:
        at = time.time() if now is None else now
        # an entry an operator approved for a re-run is settled: the next resume runs it
        issued = await self.alist_issued()
        return [e for e in issued if e.is_unknown(at) and not e.rerun_approved()]

    async def aoperator_update(
        self,
        entry: LedgerEntry,
        *,
        status: CallStatus,
        owner: str,
        lease_expires_at: float,
        result_type: str | None,
        result: bytes | None,
        error: str | None,
        finished_at: float | None,
        event: dict[str, Any],
    ) -> LedgerEntry | None:
        history = json.dumps([*entry.events(), event], ensure_ascii=False, default=str)
        params = (
            status.value,
            owner,
            lease_expires_at,
            result_type,
            result,
            self.ledger_error(error),
            finished_at,
            history,
            entry.scope,
            entry.key,
            entry.status.value,
            entry.attempts,
            entry.owner,
        )
        return await self._guarded_update(
            self._sql.OPERATOR_UPDATE, params, entry.scope, entry.key
        )

    async def aresolve(
        self,
        scope: str,
        key: str,
        *,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None,
        expected_attempts: int,
        expected_owner: str,
    ) -> LedgerEntry | None:
        if status is CallStatus.ISSUED:
            raise ValueError("aresolve settles an outcome: status must be completed or failed")
        params = (
            status.value,
            result_type,
            result,
            self.ledger_error(error),
            time.time(),
            scope,
            key,
            expected_attempts,
            expected_owner,
        )
        return await self._guarded_update(self._sql.RESOLVE_ENTRY, params, scope, key)

    async def anote_replay(self, scope: str, key: str, *, conflict: bool = False) -> None:
        query = self._sql.NOTE_CONFLICT if conflict else self._sql.NOTE_REPLAY
        await self._ledger_write(query, (scope, key))

    # --- versions ---------------------------------------------------------------

    def get_next_version(self, current: str | None, channel: None) -> str:
        """LangGraph's string version format, so databases and versions stay compatible.

        ``"<32-digit counter>.<16-digit random>"``: monotonic in the counter, with a random
        tail so that two forks of one checkpoint never mint the same version.
        """
        if current is None:
            current_v = 0
        elif isinstance(current, int):
            current_v = current
        else:
            current_v = int(str(current).split(".")[0])
        return f"{current_v + 1:032}.{random.random():016}"

    # --- the sync bridge ----------------------------------------------------------

    def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T:
        loop = self.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop is None or (running is not None and running is loop):
            coro.close()
            if loop is None:
                raise SyncCallOnEventLoopError(
                    f"{type(self).__name__} has no event loop yet: create it inside a running "
                    "loop (e.g. `async with AsyncSqliteSaver.from_conn_string(...)`) and call "
                    "its sync methods from another thread"
                )
            raise SyncCallOnEventLoopError(
                f"Synchronous calls to {type(self).__name__} are only allowed from a "
                "different thread than its event loop's. On the loop, use the async "
                "interface: `await saver.aget_tuple(...)` or `await graph.ainvoke(...)`."
            )
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self._run_sync(self.aget_tuple(config))

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        async def collect() -> list[CheckpointTuple]:
            return [t async for t in self.alist(config, filter=filter, before=before, limit=limit)]

        yield from self._run_sync(collect())

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return self._run_sync(self.aput(config, checkpoint, metadata, new_versions))

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        self._run_sync(self.aput_writes(config, writes, task_id, task_path))

    def delete_thread(self, thread_id: str) -> None:
        self._run_sync(self.adelete_thread(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self._run_sync(self.adelete_for_runs(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self._run_sync(self.acopy_thread(source_thread_id, target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self._run_sync(self.aprune(thread_ids, strategy=strategy))

    def get_delta_channel_history(
        self, *, config: RunnableConfig, channels: Sequence[str]
    ) -> Mapping[str, DeltaChannelHistory]:
        """The backend's one-statement ``aget_delta_channel_history``, for ``graph.invoke``
        and ``get_state`` from a worker thread (the inherited default would walk the
        chain with one ``get_tuple``, hence one loop hop, per ancestor)."""
        return self._run_sync(self.aget_delta_channel_history(config=config, channels=channels))


def checkpoints_to_keep(
    head_id: str, read: Callable[[str], tuple[str | None, dict[str, Any]] | None]
) -> list[str]:
    """The checkpoint ids ``keep_latest`` must keep for a namespace whose newest is ``head_id``.

    The head, plus the ancestors a ``DeltaChannel`` still needs: such a channel stores a
    full value only every few updates (a ``_DeltaSnapshot``) and rebuilds the others by
    replaying ancestors' writes. A checkpoint's ``counters_since_delta_snapshot``
    metadata lists the channels with updates since their last snapshot; we walk parents
    until each of those reaches the ancestor where it was snapshotted (its counter is
    absent there). Dropping those ancestors would silently empty the channel.
    ``read(id)`` returns ``(parent_id, metadata)`` or None when the row is gone.
    """
    keep = [head_id]
    head = read(head_id)
    if head is None:
        return keep
    parent, metadata = head
    pending = set(metadata.get("counters_since_delta_snapshot") or ())
    while pending and parent is not None:
        row = read(parent)
        if row is None:
            break
        keep.append(parent)
        parent, metadata = row
        pending &= set(metadata.get("counters_since_delta_snapshot") or ())
    return keep


def check_prune_strategy(strategy: str) -> None:
    """Reject an unknown prune strategy before touching anything."""
    if strategy not in PRUNE_STRATEGIES:
        raise ValueError(
            f"unknown prune strategy {strategy!r}; expected one of {', '.join(PRUNE_STRATEGIES)}"
        )
