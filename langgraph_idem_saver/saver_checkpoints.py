"""The checkpoint methods LangGraph calls that every backend answers alike: ``aput``,
``aput_writes`` and ``alist`` read the config, validate and page here, once, over three
statements each backend writes (``_put_checkpoint``, ``_insert_writes``, ``_list_pages``).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Concatenate, ParamSpec, TypeVar

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
    checkpoint_id_value,
    checkpoint_ns_of,
    make_config,
    storable_text,
    thread_id_of,
)

if TYPE_CHECKING:
    from langgraph_idem_saver.list_deltas import EncodedBlob, ListDeltaEncoder

# reads one page of alist: after the key of the previous page's last row, this many rows
PageReader = Callable[[tuple[str, str, str] | None, int], Awaitable[ListPage]]
# the same, for the sync savers' direct path
SyncPageReader = Callable[[tuple[str, str, str] | None, int], ListPage]

P = ParamSpec("P")
R = TypeVar("R")


def twin_of(
    target: Callable[Concatenate[Any, P], Any],
) -> Callable[[Callable[..., R]], Callable[Concatenate[Any, P], R]]:
    """A sync method typed as the twin of the async ``target``: ``target``'s parameters
    (a method taking ``*args, **kwargs`` passes them on: written once, there), its own
    result; its docstring and ``help()`` are ``target``'s."""

    def typed(method: Callable[..., R]) -> Callable[Concatenate[Any, P], R]:
        own = inspect.signature(method).return_annotation
        method.__signature__ = inspect.signature(target).replace(return_annotation=own)  # type: ignore[attr-defined]
        method.__doc__ = target.__doc__
        return method

    return typed


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
        """``alist``'s arguments (but ``limit``: ``Paging``'s), read and checked once."""
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
        put = self._checkpoint_put(config, checkpoint, metadata, new_versions)
        return self._stored(put, await self._put_checkpoint(put))

    def _checkpoint_put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> CheckpointPut:
        """What ``aput`` stores, read from its arguments."""
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        # the checkpoint's own id, by the rule its config will be read with (NUL, size)
        checkpoint_id_value(checkpoint["id"])
        full_metadata = get_checkpoint_metadata(config, metadata)
        return CheckpointPut(
            thread_id, ns, checkpoint_id_of(config), checkpoint, full_metadata, new_versions
        )

    def _stored(self, put: CheckpointPut, blobs: list[EncodedBlob]) -> RunnableConfig:
        """After ``put`` was stored as ``blobs``: the encoder learns them; ``aput``'s result."""
        self._deltas.remember(put.thread_id, put.ns, blobs)
        return make_config(put.thread_id, put.ns, put.checkpoint["id"])

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Store a task's writes in one transaction: regular writes are never replaced, a
        repeated special write (idx < 0, ``WRITES_IDX_MAP``) replaces the earlier one."""
        rows = self._writes_rows(config, writes, task_id, task_path)
        if rows:
            await self._insert_writes(rows)

    def _writes_rows(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> list[tuple[Any, ...]]:
        """The rows ``aput_writes`` stores (validated, values dumped), by ``idx``."""
        thread_id = thread_id_of(config)
        ns = checkpoint_ns_of(config)
        checkpoint_id = checkpoint_id_of(config)
        if checkpoint_id is None:
            raise ConfigError("put_writes needs config['configurable']['checkpoint_id']")
        # storable_text's own test inline (every put_writes of a graph comes through here)
        if not task_id.isascii():
            storable_text(task_id, "task_id")
        if not task_path.isascii():
            storable_text(task_path, "task_path")
        where = (thread_id, ns, checkpoint_id, task_id, task_path)
        dump, idx_of = self._dump, WRITES_IDX_MAP.get
        by_idx: dict[int, tuple[Any, ...]] = {}
        for idx, (channel, value) in enumerate(writes):
            if not channel.isascii():
                storable_text(channel, "channel")
            at = idx_of(channel, idx)
            by_idx[at] = (*where, at, channel, *dump(value))
        return list(by_idx.values())

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
        query = ListQuery.of(config, filter, before)
        paging = Paging(limit, self._list_page_size)
        if paging.done:
            return
        read_page = self._list_pages(query)
        while (request := paging.next_page()) is not None:
            for tup in paging.take(await read_page(*request)):
                yield tup


# alist's signature, which the sync list binds its arguments to
_ALIST = inspect.signature(CheckpointMethods.alist)


class SyncCheckpointCalls(ABC):
    """The sync savers' direct ``put``, ``put_writes`` and ``list``: read, validated and
    paged here, once, over three hooks each backend writes, which run the async saver's
    own bodies on the caller's thread (or on the loop when the call cannot run there)."""

    saver: CheckpointMethods

    @abstractmethod
    def _direct_put(self, put: CheckpointPut) -> list[EncodedBlob]:
        """``_put_checkpoint`` of the async saver, run as the backend runs direct calls."""

    @abstractmethod
    def _direct_writes(self, rows: list[tuple[Any, ...]]) -> None:
        """``_insert_writes`` of the async saver, likewise."""

    @abstractmethod
    def _direct_pages(self, query: ListQuery) -> SyncPageReader:
        """``_list_pages`` of the async saver, likewise (validates ``query`` at once)."""

    # the direct methods take what their async twins take, and store and read alike

    @twin_of(CheckpointMethods.aput)
    def put(self, *args: Any, **kwargs: Any) -> RunnableConfig:
        saver = self.saver
        put = saver._checkpoint_put(*args, **kwargs)
        return saver._stored(put, self._direct_put(put))

    @twin_of(CheckpointMethods.aput_writes)
    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        rows = self.saver._writes_rows(*args, **kwargs)
        if rows:
            self._direct_writes(rows)

    @twin_of(CheckpointMethods.alist)
    def list(self, *args: Any, **kwargs: Any) -> Iterator[CheckpointTuple]:
        # not a generator itself: alist's parameters (filter, before, limit keyword-only,
        # as in BaseCheckpointSaver.list) are bound now, so a bad call fails when made,
        # not at the first next()
        given = _ALIST.bind(None, *args, **kwargs).arguments
        query = ListQuery.of(given["config"], given.get("filter"), given.get("before"))
        return self._listed(query, given.get("limit"))

    def _listed(self, query: ListQuery, limit: int | None) -> Iterator[CheckpointTuple]:
        paging = Paging(limit, self.saver._list_page_size)
        for page in paging.pages(lambda: self._direct_pages(query)):
            yield from paging.take(page)


class Paging:
    """``alist``'s walk over pages, for any way of reading a page: which page to read
    next (the key after which it starts, its size), and what of each page to yield."""

    def __init__(self, limit: int | None, page_size: int) -> None:
        self.remaining = limit
        self.page_size = page_size
        self.after: tuple[str, str, str] | None = None
        self.size = page_size  # of the page asked for last
        # a limit of 0 or less yields nothing (SQLite's ``LIMIT -1`` would mean "all")
        self.done = limit is not None and limit <= 0

    def next_page(self) -> tuple[tuple[str, str, str] | None, int] | None:
        """The next page to read, or None when the walk is over."""
        if self.done:
            return None
        self.size = self.page_size
        if self.remaining is not None:
            self.size = min(self.remaining, self.size)
        return self.after, self.size

    def pages(self, reader: Callable[[], SyncPageReader]) -> Iterator[ListPage]:
        """The pages a sync reader reads, as :meth:`next_page` asks (``reader()`` makes
        the reader, only when a page is wanted); pass each to :meth:`take`."""
        read_page = None
        while (request := self.next_page()) is not None:
            read_page = read_page or reader()
            yield read_page(*request)

    def take(self, page: ListPage) -> Iterator[CheckpointTuple]:
        """What to yield of ``page`` (read as ``next_page`` asked), lazily: a backend may
        decode its tuples as they are yielded, and none past the limit is."""
        if page.fetched < self.size or page.last is None:
            self.done = True
        self.after = page.last
        for tup in page.tuples:
            yield tup
            if self.remaining is not None:
                self.remaining -= 1
                if self.remaining <= 0:
                    self.done = True
                    return
