"""What the SQLite saver's helper modules use of :class:`AsyncSqliteSaver`.

Its connection plumbing (``_run`` reads, ``_write`` commits), serializer, target and
list-delta cache, as a protocol: inspection and the reader of LangGraph's tables are
parts of the saver (it imports them), so they name what they use instead of importing
the saver back.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Awaitable, Callable
from typing import Protocol, TypeVar

from langgraph.checkpoint.serde.base import SerializerProtocol

from langgraph_idem_saver.list_deltas import ListDeltaEncoder
from langgraph_idem_saver.sqlite.files import SqliteTarget

T = TypeVar("T")


class SqliteHost(Protocol):
    """The plumbing of :class:`AsyncSqliteSaver` its helpers run on."""

    @property
    def serde(self) -> SerializerProtocol: ...

    _target: SqliteTarget | None
    _deltas: ListDeltaEncoder

    def _run(self, fn: Callable[[sqlite3.Connection], T]) -> Awaitable[T]: ...

    def _write(
        self, body: Callable[[sqlite3.Connection], T], *, before_tool_runs: bool = False
    ) -> Awaitable[T]: ...
