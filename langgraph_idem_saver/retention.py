"""Retention: threads idle past a TTL are deleted or cut down to their latest checkpoint,
and ledger entries nothing can replay any more are removed.

Why it looks like this:

* **Last activity, without a new column.** LangGraph's checkpoint ids are UUIDv6, whose
  text sorts by creation time; a thread's newest id (any namespace) is when it last
  checkpointed, and its ledger rows' ``issued_at``/``finished_at`` when it last ran or
  settled a tool. So "idle since" needs no schema change, and candidates are found in
  SQL (``MAX(checkpoint_id) < first id of the cutoff``). A thread whose newest id is not
  a UUIDv6 (ids chosen by hand) has no known age and is never expired.
* **The ledger safety rule.** A thread-scoped entry is removed only when its thread has
  no checkpoint and no pending write left (nothing can resume and replay it), it is not
  ``issued`` (an unknown outcome is settled, not forgotten), and it was last touched
  before ``ledger_after``. So ``keep_latest`` keeps a thread's entries (its head can
  still be resumed or forked); ``delete`` lets them go. Entries of a named namespace
  (``namespace="billing"``) are shared across threads: they follow ``namespace_ttl``
  only (never by default), and never while the thread that made the call remains.
* **Bounded batches, safe beside writers.** Each batch is one short transaction that
  re-checks every thread it touches; a thread that checkpointed or claimed a call since
  it was found is skipped (see the backends' ``retention.py``).
* **A new conversation is told apart.** ``delete`` (and ``adelete_thread``) leave some
  entries behind (unknown outcomes, entries touched after ``ledger_after``); each gets a
  ``conversation_ended`` event appended to its history in the deleting transaction, so a
  call of a new conversation on the same thread id that reaches it is decided
  explicitly (``engine/earlier.py``), never answered by it silently. An event, not a
  column: no migration, and the entry's read already carries its history.
* **No sweeping inside ``put``.** A sweep is maintenance: run ``asweep()`` / ``sweep()``
  from a scheduler (or ``idem-saver prune``). Sweeping from the hot path would add its
  latency to a user's step, and every process would repeat it.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from collections.abc import Coroutine, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from langgraph_idem_saver.counts import Counts
from langgraph_idem_saver.errors import ConfigError
from langgraph_idem_saver.forwarding import blocking, hopping

if TYPE_CHECKING:
    from langgraph_idem_saver.list_deltas import ListDeltaEncoder

T = TypeVar("T")

ENDED = "conversation_ended"
"""History event of an entry kept when its thread's checkpoints were deleted (a sweep's
``delete``, ``adelete_thread``): made by a conversation that ended."""


def ended_event(by: str, at: float | None = None) -> str:
    """The :data:`ENDED` event as JSON text (``by``: ``"sweep"`` or ``"adelete_thread"``),
    what the backends' ``MARK_ENDED`` appends to each kept entry's history."""
    at = time.time() if at is None else at
    return json.dumps({"at": at, "by": by, "action": ENDED}, separators=(",", ":"))


Strategy = Literal["delete", "keep_latest"]
STRATEGIES: tuple[Strategy, ...] = ("delete", "keep_latest")
DEFAULT_BATCH = 100
MAX_BATCH = 10_000
NAMESPACE_PREFIX = "ns:"
# UUIDv1/v6 time: 100 ns intervals since 1582-10-15 (LangGraph's uuid6 adds this offset)
_UUID_EPOCH = 0x01B21DD213814000


def _positive(value: Any, what: str, *, optional: bool = False) -> timedelta | None:
    if value is None and optional:
        return None
    if not isinstance(value, timedelta):
        raise ConfigError(f"{what} must be a datetime.timedelta, got {type(value).__name__}")
    if value <= timedelta(0):
        raise ConfigError(f"{what} must be positive, got {value}")
    return value


@dataclass(frozen=True)
class TTLConfig:
    """How long data is kept (a saver's ``ttl=``; applied by ``asweep()``/``sweep()``).

    Args:
        after: a thread idle this long (no checkpoint, no tool claimed or settled) gets
            ``strategy``.
        strategy: ``"delete"`` removes its checkpoints, blobs and writes;
            ``"keep_latest"`` keeps the newest checkpoint of each namespace (and the
            ancestors a ``DeltaChannel`` rebuilds it from), so the thread still loads
            and resumes.
        ledger_after: a settled thread-scoped ledger entry untouched this long is removed
            once its thread has no checkpoint or write left (default: ``after``).
        namespace_ttl: retention of named-namespace entries: one window for all, or
            ``{"billing": timedelta(days=365)}``; namespaces not named are kept forever
            (the default, None, keeps them all).
        batch_size: threads (or ledger entries) per transaction.
    """

    after: timedelta
    strategy: Strategy = "delete"
    ledger_after: timedelta | None = None
    namespace_ttl: timedelta | Mapping[str, timedelta] | None = None
    batch_size: int = DEFAULT_BATCH

    def __post_init__(self) -> None:
        _positive(self.after, "ttl after")
        if self.strategy not in STRATEGIES:
            raise ConfigError(
                f"unknown ttl strategy {self.strategy!r}; expected 'delete' or 'keep_latest'"
            )
        _positive(self.ledger_after, "ttl ledger_after", optional=True)
        if isinstance(self.namespace_ttl, Mapping):
            # a read-only copy: a later change to the caller's dict cannot bypass this check
            object.__setattr__(self, "namespace_ttl", MappingProxyType(dict(self.namespace_ttl)))
            for name, window in self.namespace_ttl.items():
                if not isinstance(name, str) or not name or "\x00" in name:
                    raise ConfigError(f"namespace_ttl names must be non-empty str, got {name!r}")
                _positive(window, f"namespace_ttl[{name!r}]")
        else:
            _positive(self.namespace_ttl, "ttl namespace_ttl", optional=True)
        size = self.batch_size
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= MAX_BATCH:
            raise ConfigError(f"ttl batch_size must be an int from 1 to {MAX_BATCH}, got {size!r}")

    @classmethod
    def of(cls, value: Any) -> TTLConfig | None:
        """A saver's ``ttl=`` argument as a config: a :class:`TTLConfig`, None, or the
        mapping LangGraph Platform's ``checkpointer.ttl`` uses (``{"strategy": "delete",
        "default_ttl": <minutes>}``)."""
        if value is None or isinstance(value, TTLConfig):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"ttl must be a TTLConfig or a mapping, got {type(value).__name__}")
        unknown = set(value) - {"strategy", "default_ttl"}
        if unknown:
            raise ConfigError(
                f"ttl has unknown keys {sorted(map(str, unknown))}; expected 'strategy' and "
                "'default_ttl' (minutes). There is no background sweep: call sweep() on a "
                "schedule"
            )
        minutes = value.get("default_ttl")
        if isinstance(minutes, bool) or not isinstance(minutes, (int, float)):
            raise ConfigError(f"ttl default_ttl must be a number of minutes, got {minutes!r}")
        if not math.isfinite(minutes) or minutes <= 0:
            raise ConfigError(f"ttl default_ttl must be positive minutes, got {minutes!r}")
        return cls(after=timedelta(minutes=minutes), strategy=value.get("strategy", "delete"))


@dataclass
class SweepReport(Counts):
    """What one sweep removed (counts of rows), for logs and ``idem-saver prune``."""

    threads_deleted: int = 0
    threads_pruned: int = 0
    checkpoints_deleted: int = 0
    writes_deleted: int = 0
    blobs_deleted: int = 0
    ledger_entries_deleted: int = 0
    namespace_entries_deleted: int = 0
    # issued entries (unknown outcomes) old enough to go, kept until someone settles them
    issued_kept: int = 0
    batches: int = 0
    # counted, then rolled back: nothing was removed (see asweep's dry_run)
    dry_run: bool = False


@dataclass(frozen=True)
class RowCounts:
    """Rows of the three checkpoint tables: a thread's, counted before and after a
    sweep's batch changes it, or those ``adelete_checkpoints`` removed (``DeletedCounts``)."""

    checkpoints: int
    writes: int
    blobs: int

    @classmethod
    def by_thread(
        cls, rows: Iterable[Sequence[Any]], threads: Sequence[str]
    ) -> dict[str, RowCounts]:
        """``(table, thread_id, count)`` rows (table ``c``, ``w`` or ``b``) as counts per
        thread, zero for what has no row."""
        found = {t: {"c": 0, "w": 0, "b": 0} for t in threads}
        for table, thread_id, n in rows:
            found[thread_id][table] = int(n)
        return {t: cls(v["c"], v["w"], v["b"]) for t, v in found.items()}


@dataclass(frozen=True)
class LedgerRule:
    """Which ledger entries one pass may remove: thread-scoped (``scopes`` None) or the
    named-namespace scopes from ``scopes[0]`` to ``scopes[1]``; last touched before
    ``since`` (epoch seconds)."""

    since: float
    scopes: tuple[str, str] | None = None

    def sql(self, template: str, marker: str) -> str:
        """``template`` with ``{which}`` (this rule's scopes), ``{removable}`` (the safety
        rule) and a page's ``{s}``, ``{k}``, ``{n}`` filled in; ``marker`` is the backend's
        named parameter (``":{}"``, ``"%({})s"``)."""
        names = _markers(marker, "since", "lo", "hi")
        which = _THREAD_SCOPED if self.scopes is None else _NAMED_SCOPES.format(**names)
        removable = _REMOVABLE.format(**names)
        return template.format(which=which, removable=removable, **_markers(marker, "s", "k", "n"))

    def params(self) -> dict[str, Any]:
        """The parameters :meth:`sql`'s markers name."""
        lo, hi = self.scopes or ("", "")
        return {"since": self.since, "lo": lo, "hi": hi}


# The ledger safety rule (docs/guarantees.md) as SQL both backends run, over
# ``idem_tool_calls AS l``: settled, untouched since before ``since``, and no checkpoint
# or pending write of the entry's thread left to replay it. ``{since}``, ``{lo}`` and
# ``{hi}`` become the backend's parameter markers.
_REMOVABLE = """l.status <> 'issued' AND l.issued_at < {since}
  AND COALESCE(l.finished_at, 0) < {since}
  AND NOT EXISTS (SELECT 1 FROM idem_checkpoints AS c WHERE c.thread_id = l.thread_id)
  AND NOT EXISTS (SELECT 1 FROM idem_writes AS w WHERE w.thread_id = l.thread_id)"""
_THREAD_SCOPED = "l.scope = l.thread_id"
_NAMED_SCOPES = "l.scope <> l.thread_id AND l.scope BETWEEN {lo} AND {hi}"

# ledger entries a rule may remove, in (scope, key) pages after ({s}, {k})
_SELECT_REMOVABLE = """
SELECT l.scope, l.key FROM idem_tool_calls AS l
WHERE (l.scope, l.key) > ({s}, {k}) AND {which} AND {removable}
ORDER BY l.scope, l.key LIMIT {n}
"""

# threads whose newest checkpoint id (any namespace) sorts below {bound}, in id order
# after {after} (keyset pages; an index on thread_id, checkpoint_id serves it); under
# keep_latest only threads with something left to prune (a thread kept at its head is
# not re-pruned by every sweep)
_EXPIRED_THREADS = """
SELECT thread_id, MAX(checkpoint_id) FROM idem_checkpoints
WHERE thread_id > {after}
GROUP BY thread_id HAVING MAX(checkpoint_id) < {bound} {more}
ORDER BY thread_id LIMIT {n}
"""
_ONLY_PRUNABLE = "AND COUNT(*) > COUNT(DISTINCT checkpoint_ns)"


def _markers(marker: str, *names: str) -> dict[str, str]:
    """The backend's named parameter (``":{}"``, ``"%({})s"``) for each of ``names``."""
    return {name: marker.format(name) for name in names}


@dataclass(frozen=True)
class Cutoffs:
    """One sweep's limits, all computed from one ``now``."""

    strategy: Strategy
    since: float  # threads: idle since before this (epoch seconds)
    bound_id: str  # the first checkpoint id at ``since``: older ids sort below it
    ledger: LedgerRule
    namespaces: tuple[LedgerRule, ...] = field(default=())
    batch_size: int = DEFAULT_BATCH
    dry_run: bool = False

    @classmethod
    def at(cls, ttl: TTLConfig, now: float, *, dry_run: bool = False) -> Cutoffs:
        since = now - ttl.after.total_seconds()
        ledger = now - (ttl.ledger_after or ttl.after).total_seconds()
        rules: list[LedgerRule] = []
        if isinstance(ttl.namespace_ttl, Mapping):
            for name, window in sorted(ttl.namespace_ttl.items()):
                scope = NAMESPACE_PREFIX + name
                rules.append(LedgerRule(now - window.total_seconds(), (scope, scope)))
        elif ttl.namespace_ttl is not None:
            # every "ns:..." scope ('ns;' sorts right after the prefix)
            rules.append(LedgerRule(now - ttl.namespace_ttl.total_seconds(), ("ns:", "ns;")))
        return cls(
            strategy=ttl.strategy,
            since=since,
            bound_id=first_checkpoint_id_at(since),
            ledger=LedgerRule(ledger),
            namespaces=tuple(rules),
            batch_size=ttl.batch_size,
            dry_run=dry_run,
        )

    def batch_counts(
        self,
        threads: Sequence[str],
        before: Mapping[str, RowCounts],
        after: Mapping[str, RowCounts],
    ) -> list[tuple[RowCounts, RowCounts]]:
        """A batch's result: each thread's counts before and after it. On a dry run it
        raises them in a :class:`DryRun` instead, which rolls the batch's transaction back."""
        counts = [(before[t], after[t]) for t in threads]
        if self.dry_run:
            raise DryRun(counts)
        return counts

    def idle(self, head_id: str | None, ledger_last: float | None) -> bool:
        """Whether a thread whose newest checkpoint is ``head_id`` and whose ledger was
        last touched at ``ledger_last`` has been idle since before ``since``."""
        if head_id is None:
            return False
        made = checkpoint_time(head_id)
        if made is None or made >= self.since:
            return False
        return ledger_last is None or ledger_last < self.since


def checkpoint_time(checkpoint_id: str) -> float | None:
    """When a LangGraph checkpoint id (a UUIDv6) was made, in epoch seconds; None for an
    id that is not a UUIDv6 (its age is unknown)."""
    try:
        parsed = uuid.UUID(checkpoint_id)
    except (ValueError, TypeError, AttributeError):
        return None
    if parsed.version != 6 or str(parsed) != checkpoint_id:
        return None
    ticks = (parsed.time_low << 28) | (parsed.time_mid << 12) | (parsed.time_hi_version & 0xFFF)
    return (ticks - _UUID_EPOCH) / 1e7


def first_checkpoint_id_at(ts: float) -> str:
    """The smallest UUIDv6 text made at ``ts`` (epoch seconds): every checkpoint id made
    earlier sorts below it, every one made at or after it does not."""
    ticks = max(0, min(int(ts * 1e7) + _UUID_EPOCH, (1 << 60) - 1))
    value = ((ticks >> 12) << 80) | (0x6000 | (ticks & 0xFFF)) << 64 | (0x8000 << 48)
    return str(uuid.UUID(int=value))


def sweep_time(now: float | datetime | None) -> float:
    """``asweep``'s ``now`` as epoch seconds (the current time when None)."""
    if now is None:
        return time.time()
    if isinstance(now, datetime):
        if now.tzinfo is None:
            raise ConfigError("sweep now= must be a timezone-aware datetime (or epoch seconds)")
        return now.timestamp()
    if isinstance(now, bool) or not isinstance(now, (int, float)) or not math.isfinite(now):
        raise ConfigError(f"sweep now= must be epoch seconds or a datetime, got {now!r}")
    return float(now)


class DryRun(Exception):
    """Raised inside a batch's transaction to roll it back; carries what it counted."""

    def __init__(self, counts: list[tuple[RowCounts, RowCounts]]) -> None:
        super().__init__("dry run: rolled back")
        self.counts = counts


class RetentionBase:
    """``asweep``/``sweep`` over a backend's four primitives (its ``retention.py``)."""

    ttl: TTLConfig | None = None
    _MARKER: ClassVar[str]  # the backend's named parameter: ":{}", "%({})s"

    if TYPE_CHECKING:
        _deltas: ListDeltaEncoder

        def _run_sync(self, coro: Coroutine[Any, Any, T]) -> T: ...

    async def _read_pairs(self, query: str, params: dict[str, Any]) -> list[tuple[str, str]]:
        """The rows of a read of two text columns (a sweep's pages), as pairs."""
        raise NotImplementedError

    async def _expired_threads(self, cut: Cutoffs, after: str, limit: int) -> list[tuple[str, str]]:
        """Up to ``limit`` (thread id, newest checkpoint id) with ids sorting below
        ``cut.bound_id``, thread ids above ``after``, in thread id order (a read)."""
        more = _ONLY_PRUNABLE if cut.strategy == "keep_latest" else ""
        markers = _markers(self._MARKER, "after", "bound", "n")
        query = _EXPIRED_THREADS.format(more=more, **markers)
        return await self._read_pairs(query, {"after": after, "bound": cut.bound_id, "n": limit})

    async def _sweep_threads(
        self, cut: Cutoffs, threads: list[str]
    ) -> list[tuple[RowCounts, RowCounts]]:
        """One transaction: re-check which of ``threads`` are still idle and apply the
        strategy to those; the row counts of each before and after (raised in a
        :class:`DryRun`, which rolls the transaction back, when ``cut.dry_run``)."""
        raise NotImplementedError

    async def _removable_entries(
        self, rule: LedgerRule, after: tuple[str, str], limit: int
    ) -> list[tuple[str, str]]:
        """Up to ``limit`` (scope, key) the rule may remove, after ``after`` (a read)."""
        query = rule.sql(_SELECT_REMOVABLE, self._MARKER)
        params = {**rule.params(), "s": after[0], "k": after[1], "n": limit}
        return await self._read_pairs(query, params)

    async def _remove_entries(self, rule: LedgerRule, keys: list[tuple[str, str]]) -> int:
        """One transaction: remove those of ``keys`` the rule still allows; how many."""
        raise NotImplementedError

    async def _count_issued_before(self, since: float) -> int:
        """Issued entries last claimed before ``since`` (kept: unknown outcomes)."""
        raise NotImplementedError

    # marks a ToolLedger's database (standalone_ledger.py): it holds no checkpoint, so
    # the ledger safety rule would find every thread gone and remove entries that a
    # checkpointer elsewhere can still replay; ``asweep`` refuses it
    LEDGER_ONLY_TABLE: ClassVar[str] = "idem_ledger_only"

    async def _ledger_only(self) -> bool:
        """Whether this database is a ``ToolLedger``'s (it has ``LEDGER_ONLY_TABLE``)."""
        return False

    async def asweep(
        self,
        now: float | datetime | None = None,
        *,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> SweepReport:
        """Apply ``ttl`` (default: the saver's ``ttl=``) as of ``now`` (default: the
        current time; epoch seconds or an aware datetime), in bounded batches.

        Threads idle past ``ttl.after`` get the strategy; then ledger entries that nothing
        can replay are removed (see the module docstring for the rule). Safe while
        other processes write: each batch is one short transaction that re-checks what
        it removes. Returns the counts of what was removed.
        """
        config = TTLConfig.of(ttl) if ttl is not None else self.ttl
        if config is None:
            raise ConfigError("no retention configured: pass ttl=TTLConfig(...) to the saver")
        if await self._ledger_only():
            raise ConfigError(
                "this database is a ToolLedger's: its checkpoints are in another store, so "
                "no sweep here can tell which entries nothing can replay; nothing was removed"
            )
        cut = Cutoffs.at(config, sweep_time(now), dry_run=dry_run)
        report = SweepReport(dry_run=dry_run)
        await self._sweep_all_threads(cut, report)
        report.ledger_entries_deleted = await self._sweep_entries(cut.ledger, cut, report)
        for rule in cut.namespaces:
            report.namespace_entries_deleted += await self._sweep_entries(rule, cut, report)
        report.issued_kept = await self._count_issued_before(cut.ledger.since)
        return report

    def sweep(
        self,
        now: float | datetime | None = None,
        *,
        ttl: TTLConfig | Mapping[str, Any] | None = None,
        dry_run: bool = False,
    ) -> SweepReport:
        """:meth:`asweep` from synchronous code (not on the saver's event loop)."""
        return self._run_sync(self.asweep(now, ttl=ttl, dry_run=dry_run))

    async def _sweep_all_threads(self, cut: Cutoffs, report: SweepReport) -> None:
        after = ""
        while True:
            found = await self._expired_threads(cut, after, cut.batch_size)
            if not found:
                return
            after = found[-1][0]
            # the SQL bound is a text comparison; the id must also be a real UUIDv6
            idle = [t for t, head in found if cut.idle(head, None)]
            if idle:
                try:
                    counts = await self._sweep_threads(cut, idle)
                except DryRun as dry:
                    counts = dry.counts
                else:  # what the list delta encoder knew of them may be gone
                    self._deltas.forget(idle)
                report.batches += 1
                _tally(report, counts, cut.strategy)
            if len(found) < cut.batch_size:
                return

    async def _sweep_entries(self, rule: LedgerRule, cut: Cutoffs, report: SweepReport) -> int:
        removed = 0
        after = ("", "")
        while True:
            keys = await self._removable_entries(rule, after, cut.batch_size)
            if not keys:
                return removed
            after = keys[-1]
            removed += len(keys) if cut.dry_run else await self._remove_entries(rule, keys)
            report.batches += 1
            if len(keys) < cut.batch_size:
                return removed


def _tally(
    report: SweepReport, counts: list[tuple[RowCounts, RowCounts]], strategy: Strategy
) -> None:
    """Add one batch's before/after counts of each thread it changed to the report."""
    for before, after in counts:
        report.checkpoints_deleted += before.checkpoints - after.checkpoints
        report.writes_deleted += before.writes - after.writes
        report.blobs_deleted += before.blobs - after.blobs
        if strategy == "delete" and before.checkpoints and not after.checkpoints:
            report.threads_deleted += 1
        elif strategy == "keep_latest" and before != after:
            report.threads_pruned += 1


class SyncRetention:
    """``sweep``/``asweep`` of the sync savers: the async saver's, on its loop."""

    if TYPE_CHECKING:
        saver: Any

    @property
    def ttl(self) -> TTLConfig | None:
        """The retention ``asweep`` applies by default (the saver's ``ttl=``)."""
        ttl: TTLConfig | None = self.saver.ttl
        return ttl

    # the async saver's asweep, run on its loop (forwarding.py: typed as the target)
    sweep = blocking(RetentionBase.asweep)
    asweep = hopping(RetentionBase.asweep)
