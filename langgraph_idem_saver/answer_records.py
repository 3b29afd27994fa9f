"""A model's answer recorded in ONE commit: a ``completed`` ledger entry inserted if its
key is free, else the entry already there (the winner).

A recorded model answer (``model_record.py``) was written as a tool call is: an
``issued`` claim, committed and synced, then its ``completed`` outcome - two commits
after the model returned. A claim exists so that a side effect never runs twice: it is
on disk *before* the tool runs. A model call is not a side effect - asking twice costs
tokens, not correctness - and its record is written only *after* the model answered, so
the claim guarded nothing: a crash between the two writes only left an ``issued`` row
to be taken over later. Written as one ``INSERT ... ON CONFLICT DO NOTHING`` of the
finished entry, the record costs one commit; a record another run of the same step
wrote first is left as it is and read back, and that answer wins, as before.

Mixed into the savers of this package, SQLite and PostgreSQL (:class:`AnswerRecords`,
over the backend's ``_ledger_write`` and ``_select_entries``), and forwarded by the
ledgers that hand their calls to one (the sync savers, ``ToolLedger``):
``model_record`` takes this path on any ledger that is an :class:`AnswerRecorder`, and
falls back to the claim and its outcome for other ledgers (a ``ToolCallLedger`` written
elsewhere).
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from typing import Protocol, runtime_checkable

from langgraph_idem_saver.errors import LedgerStateError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, LedgerEntry
from langgraph_idem_saver.ledger_policy import LedgerPolicy

__all__ = ["ANSWER_READ_RETRIES", "AnswerRecorder", "AnswerRecords"]

# a record inserted by another run and deleted (its thread deleted) between our INSERT
# and our read: insert again, this many times
ANSWER_READ_RETRIES = 3


@runtime_checkable
class AnswerRecorder(Protocol):
    """A ledger that records a model answer in one commit: :class:`AnswerRecords` or a
    forward of its :meth:`~AnswerRecords.arecord_answer` (what ``model_record`` checks).
    ``isinstance`` only sees that the attribute is there (from Python 3.12 without
    reading it), so a forwarder must forward to an :class:`AnswerRecords`: both savers
    of this package are one."""

    @property
    def arecord_answer(self) -> Callable[..., Awaitable[tuple[bool, LedgerEntry]]]:
        """:meth:`AnswerRecords.arecord_answer`, bound."""


class AnswerRecords(LedgerPolicy):
    """:meth:`arecord_answer`, written once for every backend."""

    async def arecord_answer(
        self,
        intent: CallIntent,
        *,
        owner: str,
        lease_seconds: float,
        result_type: str | None,
        result: bytes | None,
    ) -> tuple[bool, LedgerEntry]:
        """Insert ``intent`` as a ``completed`` entry holding ``result``, in one commit
        (on PostgreSQL durable as a claim's; on SQLite committed as the saver's
        ``synchronous`` setting says - synced under FULL); (True, that entry) - or, when
        its key is taken, (False, the entry under it), unchanged. ``owner`` and the lease
        are kept as a claim's would be (``idem-saver ledger`` shows who recorded it)."""
        claims = self._claims([intent], owner, lease_seconds)
        [row] = claims.rows
        now = time.time()
        params = (*claims.params(row), result_type, result, now)
        for _ in range(ANSWER_READ_RETRIES):
            if await self._ledger_write(self._sql.INSERT_ANSWER, params) == 1:
                entry = replace(claims.issued_entry(0), status=CallStatus.COMPLETED)
                return True, replace(entry, result_type=result_type, result=result, finished_at=now)
            found = await self._select_entries(self._sql.SELECT_ENTRY, (intent.scope, intent.key))
            if found:
                return False, found[0]
        raise LedgerStateError(
            f"could not record the model answer {intent.key!r}: its entry kept being "
            "deleted concurrently"
        )
