"""What ``saver_base`` gives every backend: ``setup()`` once, ledger rows assembled from
the entry's own fields, and sync/async forwarders typed as their targets."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import aiosqlite
import psycopg
from fault_child import Db

from langgraph_idem_saver import AsyncSqliteSaver, SqliteSaver
from langgraph_idem_saver.backend import INTENT_COLUMNS, LEDGER_COLUMNS
from langgraph_idem_saver.forwarding import blocking, hopping, paging, relaying
from langgraph_idem_saver.ledger import CallIntent, LedgerEntry
from langgraph_idem_saver.postgres import AsyncPostgresSaver, PostgresSaver
from langgraph_idem_saver.sync_bridge import SyncSaverBase


def test_ledger_columns_are_the_entry_fields_and_claims_the_intent_fields() -> None:
    assert LEDGER_COLUMNS.split(", ") == [f.name for f in dataclasses.fields(LedgerEntry)]
    assert list(INTENT_COLUMNS) == [f.name for f in dataclasses.fields(CallIntent)]


async def test_setup_runs_the_backend_hook_once_for_concurrent_callers(db: Db) -> None:
    calls: list[str] = []
    base: Any = AsyncSqliteSaver if db.backend == "sqlite" else AsyncPostgresSaver

    class Counting(base):  # type: ignore[misc, valid-type]
        async def _setup_once(self) -> None:
            calls.append("setup")
            await asyncio.sleep(0.01)  # let the other callers arrive meanwhile
            await super()._setup_once()

    if db.backend == "sqlite":
        conn: Any = aiosqlite.connect(db.where, isolation_level=None)
    else:
        conn = await psycopg.AsyncConnection.connect(db.where, autocommit=True)
    saver = Counting(conn)
    try:
        await asyncio.gather(*(saver.setup() for _ in range(5)))
        await saver.setup()
        assert calls == ["setup"] and saver.is_setup
        assert await saver.alist_entries() == []  # the tables exist
    finally:
        await conn.close()


async def test_an_empty_claim_returns_nothing_and_writes_nothing(saver: Any) -> None:
    assert await saver.aclaim([], owner="o", lease_seconds=60) == []
    assert await saver.alist_entries() == []


@contextmanager
def sync_saver(db: Db) -> Iterator[SyncSaverBase[Any]]:
    if db.backend == "sqlite":
        with SqliteSaver.from_conn_string(db.where) as saver:
            yield saver
    else:
        with PostgresSaver.from_conn_string(db.where) as saver:
            yield saver


def test_forwarded_methods_keep_their_targets_signatures_and_docs(db: Db) -> None:
    # the class's own forwarders and the ledger table it inherits (ForwardedLedger)
    found = {name: inspect.getattr_static(SyncSaverBase, name) for name in dir(SyncSaverBase)}
    forwarders = {
        name: value
        for name, value in found.items()
        if isinstance(value, (blocking, hopping, paging, relaying))
    }
    assert {"get_tuple", "list", "alist", "aput", "aclaim", "aresolve"} <= set(forwarders)
    with sync_saver(db) as saver:
        for name, forwarder in forwarders.items():
            target = getattr(saver.saver, forwarder.target_name)
            method = getattr(saver, name)
            if getattr(type(saver), name) is not forwarder:
                # SqliteSaver's direct methods (sync_saver.py): their own, sync, return
                # types; the target's parameters and docs
                params = inspect.signature(method).parameters
                assert params == inspect.signature(target).parameters, name
                assert method.__doc__ == target.__doc__, name
                continue
            assert inspect.signature(method) == inspect.signature(target), name
            assert method.__doc__ == target.__doc__, name
