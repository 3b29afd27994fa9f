"""What every backend's saver shares: ``setup()`` once, the ledger, versions, and the sync
methods (config parsing: :mod:`.saver_config`; encoding: :mod:`.saver_codec`).

Backends subclass :class:`IdemSaverBase`, implement the checkpoint methods of
``BaseCheckpointSaver`` and the narrow hooks of :mod:`~langgraph_idem_saver.backend`
(``_setup_once``, ``_insert_claims`` and three ledger record primitives over their
``LedgerStatements``); the ledger's policy is written once, here. The synchronous methods
run the coroutines on the saver's event loop, as LangGraph's own async savers do, so
``graph.invoke`` from a worker thread works and a sync call made on the loop's own
thread fails loudly instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import operator
import random
import time
from abc import abstractmethod
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver import saver_codec, saver_config
from langgraph_idem_saver.backend import (
    INTENT_COLUMNS,
    Claims,
    Guarded,
    LedgerStatements,
    step_params,
)
from langgraph_idem_saver.errors import (
    IdemSaverError,
    LedgerStateError,
)
from langgraph_idem_saver.forwarding import blocking, paging
from langgraph_idem_saver.ledger import (
    CallIntent,
    CallStatus,
    ClaimOutcome,
    LedgerEntry,
    StepCandidates,
    StepClaim,
    StepLookup,
    ToolCallLedger,
)
from langgraph_idem_saver.saver_checkpoints import CheckpointMethods
from langgraph_idem_saver.saver_codec import *  # noqa: F403  (re-exported, see __all__)
from langgraph_idem_saver.saver_codec import decode_typed
from langgraph_idem_saver.saver_config import *  # noqa: F403
from langgraph_idem_saver.surrogates import LosslessJsonPlusSerializer, lossless

if TYPE_CHECKING:
    from langgraph_idem_saver.import_langgraph import ImportReport

# config parsing (saver_config.py) and encoding (saver_codec.py) moved out; importable
# from here as before
__all__ = [
    "PRUNE_STRATEGIES",
    "SEALED_ARGS",
    "IdemSaverBase",
    "SyncCallOnEventLoopError",
    "check_prune_strategy",
    "checkpoints_to_keep",
]
__all__ += saver_codec.__all__
__all__ += saver_config.__all__

T = TypeVar("T")

PRUNE_STRATEGIES = ("keep_latest", "delete")
# marks tool args stored encrypted (canonical JSON never starts with a NUL byte)
SEALED_ARGS = b"\x00sealed\x00"
# a claim row (INTENT_COLUMNS values) from a CallIntent, and where its args stand
_INTENT_ROW = operator.attrgetter(*INTENT_COLUMNS)
_ARGS = INTENT_COLUMNS.index("args")


class SyncCallOnEventLoopError(IdemSaverError, asyncio.InvalidStateError):
    """A synchronous saver method was called on the event loop the saver runs on.

    Blocking that thread would deadlock (the result can only be produced by the loop
    we would be blocking). Use the ``a``-prefixed method, or ``await graph.ainvoke``.
    """


# serializer classes that are not ``EncryptedSerializer``s (``_encrypts``' fast path)
_PLAIN_SERDES = (LosslessJsonPlusSerializer, JsonPlusSerializer)


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


class IdemSaverBase(CheckpointMethods, ToolCallLedger):
    """Shared behaviour of :class:`AsyncSqliteSaver` and :class:`AsyncPostgresSaver`."""

    loop: asyncio.AbstractEventLoop | None

    _sql: ClassVar[LedgerStatements]

    def __init__(self, *, serde: SerializerProtocol | None = None) -> None:
        super().__init__(serde=serde)  # sets self.serde, made lossless (_LosslessSerde)
        try:
            self.loop = asyncio.get_running_loop()
        except RuntimeError:
            self.loop = None
        self.is_setup = False
        self._setup_lock: asyncio.Lock | None = None

    async def setup(self) -> None:
        """Make the database ready (idempotent; also runs on first use): the backend's
        ``_setup_once``, run by one caller while concurrent ones wait for it.

        The lock is made on first use, on the loop that uses it (a saver may be built
        outside any loop).
        """
        if self.is_setup:
            return
        self._remember_loop()
        if self._setup_lock is None:
            self._setup_lock = asyncio.Lock()
        async with self._setup_lock:
            if self.is_setup:
                return
            await self._setup_once()
            self.is_setup = True
            from langgraph_idem_saver.import_langgraph import awarn_if_unimported

            await awarn_if_unimported(self)  # LangGraph's own tables beside ours

    @abstractmethod
    async def _setup_once(self) -> None:
        """Connect, configure and migrate; raise the backend's typed errors."""

    # the serializer of checkpoints, writes and ledger results: see _LosslessSerde
    serde = _LosslessSerde()

    def _remember_loop(self) -> None:
        """Record the loop of the first async call, for savers built outside a loop."""
        if self.loop is None:
            self.loop = asyncio.get_running_loop()

    # --- what the ledger keeps in clear --------------------------------------------

    def _encrypts(self) -> bool:
        serde = self.serde
        # asked once a call; ``isinstance`` of ``EncryptedSerializer`` (a subclass of a
        # ``typing.Protocol``) runs ~45 bytecodes of typing's and abc's checks, and the
        # default serializer, by far the most used, is never one
        return type(serde) not in _PLAIN_SERDES and isinstance(serde, EncryptedSerializer)

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
        if error is None:  # most outcomes: no serializer asked
            return None
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
    # parameters are decided once, here; a backend supplies its SQL module (``_sql``, a
    # ``LedgerStatements``), three primitives and ``_insert_claims``.

    @abstractmethod
    async def _select_entries(self, query: str, params: tuple[Any, ...]) -> list[LedgerEntry]:
        """Rows of a SELECT over the ledger, as entries."""

    @abstractmethod
    async def _guarded_update(self, update: Guarded) -> LedgerEntry | None:
        """``update``, committed: the entry after it, or None when the guard did not match."""

    @abstractmethod
    async def _ledger_write(self, query: str, params: tuple[Any, ...]) -> int:
        """One ledger statement, committed; the number of rows it changed."""

    @abstractmethod
    async def _insert_claims(self, claims: Claims) -> list[ClaimOutcome]:
        """Insert an ``issued`` row per claim row whose key is free, in one transaction
        committed durably (a tool runs after it); per row, whether it was inserted and its
        entry (``Claims.issued_entry`` for the rows inserted, read back for the others)."""

    @abstractmethod
    async def _claim_unless_found(
        self, claims: Claims, lookup: StepLookup
    ) -> tuple[list[LedgerEntry], list[ClaimOutcome] | None]:
        """In one round trip: the entries ``lookup`` finds (``SELECT_STEP_CANDIDATES``,
        oldest first) and, only when there are none, ``_insert_claims(claims)``'s
        outcomes (None when something was found: nothing is written then)."""

    def _claims(self, intents: Sequence[CallIntent], owner: str, lease_seconds: float) -> Claims:
        now = time.time()
        rows = [_INTENT_ROW(i) for i in intents]
        if not self._encrypts():
            return Claims(rows, owner, now, now + lease_seconds)
        sealed = [(*r[:_ARGS], self.seal_args(r[_ARGS]), *r[_ARGS + 1 :]) for r in rows]
        return Claims(sealed, owner, now, now + lease_seconds, [r[_ARGS] for r in rows])

    async def aclaim(
        self, intents: Sequence[CallIntent], *, owner: str, lease_seconds: float
    ) -> list[ClaimOutcome]:
        if not intents:
            return []
        return await self._insert_claims(self._claims(intents, owner, lease_seconds))

    async def aclaim_step(
        self,
        intents: Sequence[CallIntent],
        lookup: StepLookup,
        *,
        owner: str,
        lease_seconds: float,
    ) -> StepClaim:
        claims = self._claims(intents, owner, lease_seconds)
        found, claimed = await self._claim_unless_found(claims, lookup)
        candidates = StepCandidates.sorted_out(
            found, lookup.agent_path, lookup.signatures, lookup.spots
        )
        return StepClaim(candidates, claimed)

    async def afinish(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None = None,
    ) -> LedgerEntry:
        params = self._outcome(scope, key, owner, status, result_type, result, error)
        done, entry = await self._finish_entry(params, read_back=True)
        if done and entry is not None:
            return entry
        raise await self._not_finished(scope, key, owner)

    async def arecord_outcome(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None = None,
    ) -> None:
        await self.record_outcome_soon(
            scope,
            key,
            owner=owner,
            status=status,
            result_type=result_type,
            result=result,
            error=error,
        )

    def record_outcome_soon(
        self,
        scope: str,
        key: str,
        *,
        owner: str,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None = None,
    ) -> Awaitable[None]:
        # no task of its own: the write is submitted to the backend's group commit now,
        # and its answer checked when the caller awaits (one coroutine, nothing else)
        params = self._outcome(scope, key, owner, status, result_type, result, error)
        return self._recorded(self._finish_soon(params), scope, key, owner)

    async def _recorded(
        self, finishing: asyncio.Future[Any], scope: str, key: str, owner: str
    ) -> None:
        if not self._finish_matched(await finishing):
            raise await self._not_finished(scope, key, owner)

    def _outcome(
        self,
        scope: str,
        key: str,
        owner: str,
        status: CallStatus,
        result_type: str | None,
        result: bytes | None,
        error: str | None,
    ) -> tuple[Any, ...]:
        """An outcome's parameters, as ``_finish_entry`` takes them."""
        if status is CallStatus.ISSUED:
            raise ValueError("afinish records an outcome: status must be completed or failed")
        # status._value_, not .value: Enum's .value is a property, a Python call an outcome
        return (
            status._value_, result_type, result, self.ledger_error(error), time.time(), scope,
            key, owner,
        )  # fmt: skip

    async def _not_finished(self, scope: str, key: str, owner: str) -> LedgerStateError:
        """Why an outcome was refused: the entry as it is now."""
        found = await self.aget_entry(scope, key)
        state = "missing" if found is None else f"{found.status.value} (owner {found.owner!r})"
        return LedgerStateError(
            f"cannot record the outcome of tool call {key!r} in scope {scope!r}: "
            f"entry is {state}, not issued to {owner!r}"
        )

    @abstractmethod
    async def _finish_entry(
        self, outcome: tuple[Any, ...], *, read_back: bool
    ) -> tuple[bool, LedgerEntry | None]:
        """Record one outcome, committed: ``outcome`` is (status, result_type, result,
        error, finished_at, scope, key, owner), applied only while the entry is ``issued``
        to ``owner``. Returns whether that guard matched, and (``read_back`` only) the
        entry after it. Backends batch the outcomes of calls that finish together (one
        commit for all), and read back only the entries asked for."""

    @abstractmethod
    def _finish_soon(self, outcome: tuple[Any, ...]) -> asyncio.Future[Any]:
        """``_finish_entry`` without the read back, submitted now (``record_outcome_soon``):
        the future of its answer, which ``_finish_matched`` reads."""

    @abstractmethod
    def _finish_matched(self, answer: Any) -> bool:
        """Whether ``_finish_soon``'s answer says the guard matched (or its error, raised)."""

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
        reclaim = Guarded(self._sql.RECLAIM_ENTRY, params, scope, key, before_tool_runs=True)
        return await self._guarded_update(reclaim)

    async def arelease(self, scope: str, key: str, *, owner: str) -> bool:
        """Drop an ``issued`` claim we own without an outcome (the tool was interrupted
        by ``interrupt()`` before doing anything final, so re-entry must run it again)."""
        return await self._ledger_write(self._sql.RELEASE_ENTRY, (scope, key, owner)) > 0

    async def aadopt(
        self, scope: str, key: str, *, tool_call_id: str, previous: str | None = None
    ) -> LedgerEntry | None:
        params = (tool_call_id, scope, key, previous)
        return await self._guarded_update(Guarded(self._sql.ADOPT_ENTRY, params, scope, key))

    async def aabandon(self, scope: str, key: str, *, owner: str, error: str) -> LedgerEntry | None:
        params = (time.time(), self.ledger_error(error), scope, key, owner)
        return await self._guarded_update(Guarded(self._sql.ABANDON_ENTRY, params, scope, key))

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

    async def afind_step_candidates(
        self,
        scope: str,
        agent_path: str,
        signatures: Sequence[tuple[str, str]],
        spots: Sequence[tuple[str, str]],
    ) -> StepCandidates:
        """One read for the whole step (``SELECT_STEP_CANDIDATES``): the signatures and
        spots go as JSON arrays, the one list parameter both dialects can bind."""
        params = step_params(StepLookup(scope, agent_path, list(signatures), list(spots)))
        found = await self._select_entries(self._sql.SELECT_STEP_CANDIDATES, params)
        return StepCandidates.sorted_out(found, agent_path, signatures, spots)

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
        update = Guarded(self._sql.OPERATOR_UPDATE, params, entry.scope, entry.key)
        return await self._guarded_update(update)

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
        return await self._guarded_update(Guarded(self._sql.RESOLVE_ENTRY, params, scope, key))

    async def anote_replay(self, scope: str, key: str, *, conflict: bool = False) -> None:
        query = self._sql.NOTE_CONFLICT if conflict else self._sql.NOTE_REPLAY
        await self._ledger_write(query, (scope, key))

    # --- adopting a database LangGraph's own saver filled --------------------------

    async def aimport_langgraph(
        self,
        *,
        batch_size: int = 200,
        verify: bool = True,
        progress: Callable[[ImportReport], None] | None = None,
    ) -> ImportReport:
        """Copy the threads of LangGraph's own tables in this database into ours (our
        tables are separate, so they are invisible until imported); idempotent and
        resumable. See :func:`langgraph_idem_saver.import_langgraph.aimport_langgraph`."""
        from langgraph_idem_saver.import_langgraph import aimport_langgraph

        return await aimport_langgraph(
            self, batch_size=batch_size, verify=verify, progress=progress
        )

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

    def _bridge_target(self) -> IdemSaverBase:
        return self

    _run_blocking = _run_sync

    async def _run_hopping(self, coro: Coroutine[Any, Any, T]) -> T:
        return await coro

    def _bridge_closed(self) -> bool:
        return self.loop is None or self.loop.is_closed()

    get_tuple = blocking(BaseCheckpointSaver.aget_tuple)
    put = blocking(BaseCheckpointSaver.aput)
    put_writes = blocking(BaseCheckpointSaver.aput_writes)
    delete_thread = blocking(BaseCheckpointSaver.adelete_thread)
    delete_for_runs = blocking(BaseCheckpointSaver.adelete_for_runs)
    copy_thread = blocking(BaseCheckpointSaver.acopy_thread)
    prune = blocking(BaseCheckpointSaver.aprune)
    # the backend's one-statement history, for graph.invoke and get_state from a worker
    # thread (the inherited default would walk the chain one get_tuple, one hop, each)
    get_delta_channel_history = blocking(BaseCheckpointSaver.aget_delta_channel_history)

    list = paging(BaseCheckpointSaver.alist)


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
