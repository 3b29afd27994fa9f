"""The sync ``PostgresSaver(pool)``'s ledger, on the user's pool, through a PostgreSQL
server SIGKILLed and restarted (``pg_restart.CrashableServer``, ``fsync=on``): the saver
opens no connection of its own, so what keeps an outcome is the user's pool replacing its
lost connections.

* the server dies before a finished call's outcome is written: the write is retried and
  returns once the outcome is recorded, after the server is back;
* it stays down longer than the outcome's retries: the caller gets the typed error saying
  the outcome is kept, and the saver's next statement, once the server is back, writes it
  first.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from pg_blocking import charge_intent
from pg_restart import CrashableServer
from pg_server import fresh_dsn, require_postgres
from psycopg.rows import dict_row
from psycopg_pool import ConnectionPool

from langgraph_idem_saver import CallStatus
from langgraph_idem_saver.errors import ConnectionClosedError
from langgraph_idem_saver.ledger import Outcome
from langgraph_idem_saver.postgres import PostgresSaver

OWNER = "host:1:owner"


@pytest.fixture(autouse=True)
def _postgres_required() -> None:
    require_postgres()


@pytest.fixture(scope="module")
def crashable() -> Iterator[CrashableServer]:
    server = CrashableServer(prefix="idem-sync-restart-pg-")
    try:
        yield server
    finally:
        server.cleanup()


@contextmanager
def pool_saver(crashable: CrashableServer) -> Iterator[PostgresSaver]:
    kwargs: dict[str, Any] = {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}
    dsn = fresh_dsn(crashable.uri)
    # a pool timeout shorter than the default 30 s: a call waiting for it fails sooner
    with (
        ConnectionPool(dsn, min_size=2, max_size=2, kwargs=kwargs, timeout=5) as pool,
        PostgresSaver(pool) as saver,
    ):
        saver.setup()
        yield saver


def record(saver: PostgresSaver, key: str) -> None:
    type_, data = saver.serde.dumps_typed("charged")
    outcome = Outcome.completed(type_, data)

    async def run() -> None:
        await saver.record_outcome("t", key, owner=OWNER, outcome=outcome)

    asyncio.run(run())


def test_an_outcome_is_written_once_the_server_is_back(crashable: CrashableServer) -> None:
    with pool_saver(crashable) as saver:
        asyncio.run(saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300))
        crashable.kill()
        failed: list[BaseException] = []

        def write() -> None:
            try:
                record(saver, "k")
            except BaseException as exc:  # reported below
                failed.append(exc)

        writing = threading.Thread(target=write)
        writing.start()
        writing.join(0.5)
        assert writing.is_alive(), "retrying, not failed"
        back = crashable.start()
        writing.join(30)
        assert not writing.is_alive() and failed == []
        print(f"outcome recorded {time.time() - back:.2f} s after the server was back")
        entry = asyncio.run(saver.aget_entry("t", "k"))
    assert entry is not None and entry.status is CallStatus.COMPLETED
    assert saver.serde.loads_typed((entry.result_type, entry.result)) == "charged"


def test_an_outcome_held_is_written_before_the_next_statement(
    crashable: CrashableServer,
) -> None:
    with pool_saver(crashable) as saver:
        saver.saver.outcome_retry_seconds = 0.3
        asyncio.run(saver.aclaim([charge_intent("k")], owner=OWNER, lease_seconds=300))
        crashable.kill()
        with pytest.raises(ConnectionClosedError, match="kept by the saver"):
            record(saver, "k")
        crashable.start()
        entry = asyncio.run(saver.aget_entry("t", "k"))  # a read, first
    assert entry is not None and entry.status is CallStatus.COMPLETED
