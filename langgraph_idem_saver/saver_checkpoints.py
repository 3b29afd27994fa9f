"""The checkpoint methods LangGraph calls that every backend answers alike: ``aput``,
``aput_writes`` and ``alist`` read the config, validate and page here, once, over three
statements each backend writes (``_put_checkpoint``, ``_insert_writes``, ``_list_pages``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_metadata,
)

from langgraph_idem_saver.backend import CheckpointPut, ListPage
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.saver_config import (
    checkpoint_id_of,
    checkpoint_ns_of,
    make_config,
    text_of,
    thread_id_of,
)

if TYPE_CHECKING:
    from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder

# reads one page of alist: after the key of the previous page's last row, this many rows
PageReader = Callable[[tuple[str, str, str] | None, int], Awaitable[ListPage]]


@dataclass(frozen=True)
class ListQuery:
    """What ``alist(config, filter=, before=)`` asks for, read once for every backend:
    ``None`` where it does not narrow (``ns`` None: every namespace of the thread, since
    a config without ``checkpoint_ns`` means all of them, not the root one)."""

    thread_id: str | None
    ns: str | None
    checkpoint_id: str | None
    before_id: str | None
    filter: dict[str, Any] | None

    @classmethod
    def of(
        cls,
        config: RunnableConfig | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
    ) -> ListQuery:
        thread_id = ns = checkpoint_id = None
        if config is not None:
            thread_id = thread_id_of(config)
            if "checkpoint_ns" in config["configurable"]:
                ns = checkpoint_ns_of(config)
            checkpoint_id = checkpoint_id_of(config)
        before_id = None if before is None else checkpoint_id_of(before)
        return cls(thread_id, ns, checkpoint_id, before_id, filter or None)


class CheckpointMethods(BaseCheckpointSaver[str], ABC):
    """``aput``, ``aput_writes`` and ``alist`` of :class:`IdemSaverBase`."""

    _list_page_size: ClassVar[int]  # rows per page alist reads
    _deltas: ListDeltaEncoder

    @abstractmethod
    async def _put_checkpoint(self, put: CheckpointPut) -> list[EncodedBlob]:
        """Validate and store one checkpoint with its new channel values, atomically; the
        blobs as stored (a delta whose base is gone is stored whole)."""

    @abstractmethod
    async def _insert_writes(self, rows: list[tuple[Any, ...]]) -> None:
        """Store writes rows (thread, ns, checkpoint, task id, task path, idx, channel,
        type, value) in one transaction; an existing row is replaced only for idx < 0."""

    @abstractmethod
    def _list_pages(self, query: ListQuery) -> PageReader:
        """How to read the pages of ``query``, newest first (validates it at once)."""

    def _dump(self, value: Any) -> tuple[str, bytes]:
        """A value as stored: ``serde.dumps_typed`` (a backend may compress it)."""
        return self.serde.dumps_typed(value)

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store the checkpoint and its new channel values (one transaction); the list
        delta encoder then learns what was stored, which the next put extends."""
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        full_metadata = get_checkpoint_metadata(config, metadata)
        put = CheckpointPut(
            thread_id, ns, checkpoint_id_of(config), checkpoint, full_metadata, new_versions
        )
        self._deltas.remember(thread_id, ns, await self._put_checkpoint(put))
        return make_config(thread_id, ns, checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes in one transaction: regular writes are never replaced, a
        repeated special write (idx < 0, ``WRITES_IDX_MAP``) replaces the earlier one."""
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)
        if checkpoint_id is None:
            raise ConfigError("put_writes needs config['configurable']['checkpoint_id']")
        text_of(task_id, "task_id")
        text_of(task_path, "task_path")
        by_idx: dict[int, tuple[str, str, bytes]] = {}
        for idx, (channel, value) in enumerate(writes):
            by_idx[WRITES_IDX_MAP.get(channel, idx)] = (
                text_of(channel, "channel"),
                *self._dump(value),
            )
        if by_idx:
            where = (thread_id, ns, checkpoint_id, task_id, task_path)
            await self._insert_writes([(*where, idx, *row) for idx, row in by_idx.items()])

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """Checkpoints newest first, a page per trip to the database (nothing held between
        pages, so the caller may write while iterating).

        ``limit`` of 0 or less yields nothing (SQLite's ``LIMIT -1`` would mean "all").
        """
        if limit is not None and limit <= 0:
            return
        read_page = self._list_pages(ListQuery.of(config, filter, before))
        remaining = limit
        after: tuple[str, str, str] | None = None
        while True:
            size = self._list_page_size
            if remaining is not None:
                size = min(remaining, size)
            page = await read_page(after, size)
            for tup in page.tuples:
                yield tup
                if remaining is not None:
                    remaining -= 1
                    if remaining <= 0:
                        return
            if page.fetched < size or page.last is None:
                return
            after = page.last
