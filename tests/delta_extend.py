"""``extend``: the reducer the tests give ``DeltaChannel`` for a list that only grows.

A ``DeltaChannel`` stores each step's writes as a delta and rebuilds the value by
replaying them through its reducer, so the reducer must give the same list whether the
writes come one at a time or in one batch (batching-invariant), and keep their order.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def extend(state: Sequence[Any] | None, writes: Iterable[Sequence[Any]]) -> list[Any]:
    """``state`` (none yet: empty) followed by every write's items, in order."""
    out = list(state or [])
    for w in writes:
        out.extend(w)
    return out
