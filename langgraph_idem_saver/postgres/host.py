"""What the Postgres saver's helper modules use of :class:`AsyncPostgresSaver`.

Its connection plumbing (``_run``, on a cursor, optionally in one transaction), value
decoding, serializer, versions and list-delta cache, as a protocol: inspection and the
reader of LangGraph's tables are parts of the saver (it imports them), so they name what
they use instead of importing the saver back.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol
from psycopg import AsyncCursor
from psycopg.rows import TupleRow

from langgraph_idem_saver.list_deltas import ListDeltaEncoder

T = TypeVar("T")
Cursor = AsyncCursor[TupleRow]


class PostgresHost(Protocol):
    """The plumbing of :class:`AsyncPostgresSaver` its helpers run on."""

    @property
    def serde(self) -> SerializerProtocol: ...

    _deltas: ListDeltaEncoder

    def _run(
        self, fn: Callable[[Cursor], Awaitable[T]], *, tx: bool = False, pipeline: bool = False
    ) -> Awaitable[T]: ...

    def _unpack(
        self, type_: str, data: bytes | None, what: str, **location: Any
    ) -> tuple[str, bytes | None]: ...

    def get_next_version(self, current: str | None, channel: None) -> str: ...
