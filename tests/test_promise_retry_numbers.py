"""docs/guarantees.md, "When the database server restarts": an outcome's write "is retried
on a fresh connection ... with pauses doubling from about 50 ms to about 1 s (±20%
jitter), for up to ``outcome_retry_seconds`` (20 s; an attribute of the saver)".
The pauses are :func:`held_outcomes.retry_delays`'s (the retry loop sleeps each); the
default is the saver's attribute."""

from __future__ import annotations

import itertools

from langgraph_idem_saver import AsyncPostgresSaver
from langgraph_idem_saver.held_outcomes import retry_delays


def test_the_pauses_double_from_about_50_ms_to_about_1_s() -> None:
    pauses = list(itertools.islice(retry_delays(60.0), 10))
    assert 0.04 <= pauses[0] <= 0.06
    for n, pause in enumerate(pauses):
        nominal = min(0.05 * 2**n, 1.0)
        assert nominal * 0.8 <= pause <= nominal * 1.2, (n, pause)
    assert all(0.8 <= p <= 1.2 for p in pauses[5:])  # capped at about 1 s


def test_outcome_retry_seconds_is_20_s_and_an_attribute_of_the_saver() -> None:
    assert AsyncPostgresSaver.outcome_retry_seconds == 20.0
