"""What every backend's saver shares: ``setup()`` once, the serializer, versions, the
import of LangGraph's tables, and the sync methods.

Backends subclass :class:`IdemSaverBase`, implement the checkpoint statements of
:class:`~langgraph_idem_saver.saver_checkpoints.CheckpointMethods`, the record
primitives of :class:`~langgraph_idem_saver.ledger_policy.LedgerPolicy` (the ledger's
policy, written once there) and the hooks here: ``_setup_once`` and
``_langgraph_tables``. (Config parsing: :mod:`.saver_config`; encoding:
:mod:`.saver_codec`.) The synchronous methods run the coroutines on the saver's event
loop, as LangGraph's own async savers do, so ``graph.invoke`` from a worker thread works
and a sync call made on the loop's own thread fails loudly instead of deadlocking.
"""

from __future__ import annotations

import asyncio
import random
from abc import abstractmethod
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, TypeVar

from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.errors import IdemSaverError
from langgraph_idem_saver.forwarding import blocking, paging
from langgraph_idem_saver.import_langgraph import aimport_langgraph, awarn_if_unimported
from langgraph_idem_saver.import_rows import ImportReport, LangGraphTables
from langgraph_idem_saver.ledger_policy import LedgerPolicy
from langgraph_idem_saver.saver_checkpoints import CheckpointMethods
from langgraph_idem_saver.surrogates import lossless

__all__ = [
    "PRUNE_STRATEGIES",
    "IdemSaverBase",
    "SyncCallOnEventLoopError",
    "check_prune_strategy",
    "checkpoints_to_keep",
]

T = TypeVar("T")

PRUNE_STRATEGIES = ("keep_latest", "delete")


class SyncCallOnEventLoopError(IdemSaverError, asyncio.InvalidStateError):
    """A synchronous saver method was called on the event loop the saver runs on.

    Blocking that thread would deadlock (the result can only be produced by the loop
    we would be blocking). Use the ``a``-prefixed method, or ``await graph.ainvoke``.
    """


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


class IdemSaverBase(CheckpointMethods, LedgerPolicy):
    """Shared behaviour of :class:`AsyncSqliteSaver` and :class:`AsyncPostgresSaver`."""

    loop: asyncio.AbstractEventLoop | None

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

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (with their writes) of these runs; never a ledger entry.

        The server's ``multitask_strategy="rollback"`` calls it on a run it cancelled: the
        run's effects happened (or may have), so its entries stay for a later identical
        call to replay or ask about (docs/guarantees.md, "Lifecycle").
        """
        ids = [str(r) for r in run_ids]
        if ids:
            await self._delete_runs(ids)
            self._deltas.forget()

    @abstractmethod
    async def _delete_runs(self, run_ids: list[str]) -> None:
        """``adelete_for_runs`` of these runs (at least one), in one transaction: their
        checkpoints and writes, and the blobs no checkpoint needs any more."""

    # --- adopting a database LangGraph's own saver filled --------------------------

    @abstractmethod
    def _langgraph_tables(self) -> LangGraphTables:
        """The reader of LangGraph's own tables beside ours (the backend's
        ``import_sql``): the one hook :mod:`~langgraph_idem_saver.import_langgraph` reads
        them through, so it names no backend."""

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
