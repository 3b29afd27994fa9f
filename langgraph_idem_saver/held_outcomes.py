"""Outcomes a process holds while its database cannot take them.

A tool returned, the process has its result, and the write of its outcome fails on a
lost connection (a PostgreSQL server restart kills every session). Dropping that result
would make the call an unknown outcome - a question for ``verify`` or a human about an
effect this very process saw happen - and would leave its claim live under this
process until the lease runs out, so the process's own retry would wait on itself.

So an outcome is never dropped while the process lives:

1. its write is retried (:func:`retry_delays`: short, growing pauses within
   :data:`OUTCOME_RETRY_SECONDS`) on a fresh connection, before the node returns;
2. if the database is still unreachable, the saver *holds* it (:class:`HeldOutcomes`)
   and writes it before its next statement - before any later ledger read or checkpoint
   write of that saver, so the retry of the same call replays it;
3. only when the saver can never write it (its connection was the user's and is closed,
   or the saver is closed while the database is down) does the process give up: the
   call's claim is *given up* (:func:`give_up`), and this process reads it as an unknown
   outcome at once (``LedgerEntry.is_unknown``), as it does a claim whose owner died - no
   wait of ``lease_seconds`` on itself. Other processes wait for the lease, as for any
   live owner.

The same holds for the writes that end a claim of this process's (:class:`Held`): a
claim whose statement failed on a lost connection may have committed though its caller
never learned it (no tool ran under it), and a release or an abandon may not have
landed. Left alone, each is a claim live under this process for ``lease_seconds``; held,
each is undone or written again before the saver's next statement.

Outcome parameters are the tuple ``LedgerPolicy.record_outcome`` builds from an
``Outcome`` (:data:`OutcomeParams`): (status, result_type, result, error, finished_at,
scope, key, owner).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any, NamedTuple

OUTCOME_RETRY_SECONDS = 20.0
"""How long an outcome's write is retried before the saver holds it: a server restart
with crash recovery takes a few seconds, and a retry of the same call from this process
waits ``wait_seconds`` (30 s by default) for a live claim - the outcome lands within it."""

FIRST_DELAY = 0.05
MAX_DELAY = 1.0

# where an outcome's parameters keep what identifies it
STATUS, FINISHED_AT, SCOPE, KEY, OWNER = 0, 4, 5, 6, 7

OutcomeParams = tuple[Any, ...]

# (scope, key, owner) of claims this process gave up on (never written, never to be)
_given_up: set[tuple[str, str, str]] = set()


def retry_delays(seconds: float = OUTCOME_RETRY_SECONDS) -> Iterator[float]:
    """Pauses before each retry: from :data:`FIRST_DELAY`, doubling up to
    :data:`MAX_DELAY` (with a little jitter, so processes restarting together do not
    reconnect in lockstep), until ``seconds`` have passed since the first."""
    deadline = time.monotonic() + seconds
    delay = FIRST_DELAY
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        yield min(delay * random.uniform(0.8, 1.2), left)
        delay = min(delay * 2, MAX_DELAY)


def remaining(deadline: float) -> float:
    """Seconds left until ``deadline`` (``time.monotonic``), at least a little."""
    return max(deadline - time.monotonic(), 0.05)


def identity(outcome: OutcomeParams) -> tuple[str, str, str]:
    """(scope, key, owner): which claim ``outcome`` finishes."""
    return outcome[SCOPE], outcome[KEY], outcome[OWNER]


class Held(NamedTuple):
    """A write a lost connection left undone, kept until the database takes it.

    ``kind`` says what it does to the claim (scope, key, owner):

    * ``"outcome"``: records the call's outcome (``params``: the outcome's parameters);
    * ``"unclaim"``: deletes the ``issued`` row of a claim whose statement failed - it may
      have committed, but its caller never learned it was claimed, so no tool ran under
      it (``params``: ``(issued_at,)``, the claim's own timestamp, which names it alone);
    * ``"end_lease"``: ends the lease of a re-claim that failed the same way, keeping the
      row (``params``: ``(issued_at,)``);
    * ``"statement"``: a guarded statement that ends a claim (release, abandon) to run
      again as it was (``params``: ``(query, parameters)``).
    """

    kind: str
    scope: str
    key: str
    owner: str
    params: tuple[Any, ...]

    @classmethod
    def outcome(cls, outcome: OutcomeParams) -> Held:
        return cls("outcome", *identity(outcome), outcome)


def landed(outcome: OutcomeParams, row: Sequence[Any] | None, columns: Sequence[str]) -> bool:
    """Whether ``row`` (the entry read back, in ``columns`` order) is ``outcome`` itself,
    committed by an attempt whose answer was lost with the connection: same status,
    owner and ``finished_at`` (a float this process chose, stored exactly)."""
    if row is None:
        return False
    values = dict(zip(columns, row, strict=True))
    return bool(
        values["status"] == outcome[STATUS]
        and values["owner"] == outcome[OWNER]
        and values["finished_at"] == outcome[FINISHED_AT]
    )


def give_up(held: Iterable[Held]) -> None:
    """This process will never write these: their claims end now, for it."""
    _given_up.update((h.scope, h.key, h.owner) for h in held)


def given_up(scope: str, key: str, owner: str) -> bool:
    """Whether this process gave up on the claim (``LedgerEntry.is_unknown`` asks)."""
    return bool(_given_up) and (scope, key, owner) in _given_up


class HeldOutcomes:
    """A saver's writes its database could not take yet (:class:`Held`), written before
    its next statement (:meth:`write`). One writer at a time: a statement arriving while
    they are being written waits for them, so nothing of that saver lands before them."""

    __slots__ = ("_items", "_lock")

    def __init__(self) -> None:
        self._items: dict[tuple[str, str, str, str], Held] = {}
        self._lock = asyncio.Lock()

    def __bool__(self) -> bool:
        return bool(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, held: Iterable[Held]) -> None:
        for item in held:
            self._items[item.kind, item.scope, item.key, item.owner] = item

    def give_up(self) -> list[Held]:
        """Drop everything held, given up (:func:`give_up`); returned."""
        dropped = list(self._items.values())
        self._items.clear()
        give_up(dropped)
        return dropped

    async def write(self, write: Callable[[list[Held]], Awaitable[None]]) -> None:
        """Write what is held with ``write`` (which raises while the database is still
        unreachable: it is then held again)."""
        async with self._lock:
            if not self._items:
                return  # written by the statement this one waited for
            items = list(self._items.values())
            self._items.clear()
            try:
                await write(items)
            except BaseException:
                self.hold(i for i in items if (i.kind, i.scope, i.key, i.owner) not in self._items)
                raise
