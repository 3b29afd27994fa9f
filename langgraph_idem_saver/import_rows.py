"""What an import of LangGraph's tables reads and reports: the rows a backend's reader
(``*/import_sql.py``) yields, the protocol it implements, and the report.

Apart from :mod:`langgraph_idem_saver.import_langgraph` (which runs the import) so that
the readers, the copier (``import_copy.py``) and the savers' hook can name these types
without importing the import itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property, partial
from typing import Any, Protocol

__all__ = [
    "ImportReport",
    "Key",
    "LangGraphTables",
    "Layout",
    "SourceRow",
    "SourceWrite",
    "with_writes",
]

Key = tuple[str, str, str]  # thread_id, checkpoint_ns, checkpoint_id


@dataclass(frozen=True)
class Layout:
    """Which of LangGraph's table layouts a database holds."""

    name: str  # shown in reports, e.g. "langgraph-checkpoint-sqlite 3.x"
    task_path: bool  # whether the writes table has task_path (older ones: '' for all)


@dataclass(frozen=True)
class SourceWrite:
    """One pending write as LangGraph stored it (value still serialized)."""

    task_id: str
    task_path: str
    idx: int
    channel: str
    type: str | None
    value: bytes | None


@dataclass
class SourceRow:
    """One of LangGraph's checkpoints. ``load`` decodes it as LangGraph's ``aget_tuple``
    would, on first use of ``checkpoint``/``metadata``: a re-run skips what it already
    imported without decoding it (LangGraph's SQLite rows hold whole conversations)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    parent_id: str | None
    load: Callable[[], tuple[dict[str, Any], dict[str, Any]]] = field(repr=False)
    writes: list[SourceWrite] = field(default_factory=list)

    @cached_property
    def _decoded(self) -> tuple[dict[str, Any], dict[str, Any]]:
        return self.load()

    @property
    def checkpoint(self) -> dict[str, Any]:
        return self._decoded[0]

    @property
    def metadata(self) -> dict[str, Any]:
        return self._decoded[1]

    @property
    def key(self) -> Key:
        return (self.thread_id, self.checkpoint_ns, self.checkpoint_id)

    @property
    def where(self) -> dict[str, str]:
        return {
            "thread_id": self.thread_id,
            "checkpoint_ns": self.checkpoint_ns,
            "checkpoint_id": self.checkpoint_id,
        }


def with_writes(
    rows: Sequence[Any],
    writes: Sequence[Any],
    load: Callable[[Any], tuple[dict[str, Any], dict[str, Any]]],
) -> list[SourceRow]:
    """A page's checkpoint rows with their writes. Both kinds of row start with the
    checkpoint's key (a checkpoint row then has its parent id, a write row the fields of
    :class:`SourceWrite`); ``load(row)`` decodes a checkpoint row when it is needed."""
    by_key: dict[Key, list[SourceWrite]] = {}
    for w in writes:
        by_key.setdefault((w[0], w[1], w[2]), []).append(SourceWrite(*w[3:]))
    return [
        SourceRow(row[0], row[1], row[2], row[3], partial(load, row), by_key.get(row[:3], []))
        for row in rows
    ]


class LangGraphTables(Protocol):
    """What a backend's reader of LangGraph's tables offers (``*/import_sql.py``)."""

    def target(self) -> str:
        """The database as the CLI command should name it."""
        ...

    def where(self) -> str:
        """The database as a message names it."""
        ...

    async def alayout(self) -> Layout | None:
        """The layout, or None when LangGraph's tables are absent; raises
        :class:`ImportLayoutError` for tables we cannot read."""
        ...

    async def apage(self, layout: Layout, after: Key | None, limit: int) -> list[SourceRow]:
        """Up to ``limit`` checkpoints after ``after`` in key order, with their writes."""
        ...

    async def aimported(self, first: Key, last: Key) -> dict[Key, set[tuple[str, int]]]:
        """The keys between ``first`` and ``last`` (inclusive) already in our tables, each
        with the (task id, index) of the pending writes it has."""
        ...

    async def ahas_unimported_threads(self) -> bool:
        """Whether LangGraph's tables hold a thread ours does not have."""
        ...

    async def acount(self) -> int:
        """How many checkpoints LangGraph's tables hold (the total a progress bar shows)."""
        ...

    async def apublish(self, staged: str, thread_id: str) -> None:
        """In one transaction: the rows of thread ``staged`` become ``thread_id``'s."""
        ...

    async def adiscard_staged(self) -> None:
        """Delete every staged row (of a failed or killed import)."""
        ...


@dataclass
class ImportReport:
    """What an import did; ``str(report)`` is a short table for the CLI."""

    source: str = "none"
    checkpoints_total: int = 0  # in LangGraph's tables when the import started
    checkpoints_found: int = 0
    checkpoints_imported: int = 0
    checkpoints_present: int = 0
    threads_found: int = 0
    threads_imported: int = 0
    values_written: int = 0
    writes_imported: int = 0
    verified: int = 0
    batches: int = 0
    seconds: float = 0.0
    _threads: set[str] = field(default_factory=set, repr=False, compare=False)
    _imported_threads: set[str] = field(default_factory=set, repr=False, compare=False)

    def count_thread(self, thread_id: str, *, imported: bool = False) -> None:
        """Count a thread found (or imported), each one once."""
        (self._imported_threads if imported else self._threads).add(thread_id)
        self.threads_found = len(self._threads)
        self.threads_imported = len(self._imported_threads)

    @property
    def changed(self) -> bool:
        """Whether this run wrote anything (False for a re-run of a finished import)."""
        return self.checkpoints_imported > 0 or self.writes_imported > 0

    def __str__(self) -> str:
        if self.source == "none":
            return "no LangGraph checkpoint tables found: nothing to import"
        rows = [
            ("source", self.source),
            ("threads", f"{self.threads_imported} imported of {self.threads_found}"),
            (
                "checkpoints",
                f"{self.checkpoints_imported} imported, {self.checkpoints_present} "
                f"already present, of {self.checkpoints_found}",
            ),
            ("channel values", str(self.values_written)),
            ("pending writes", str(self.writes_imported)),
            ("verified", f"{self.verified} read back equal"),
            ("time", f"{self.seconds:.1f} s in {self.batches} batches"),
        ]
        width = max(len(name) for name, _ in rows)
        return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)
