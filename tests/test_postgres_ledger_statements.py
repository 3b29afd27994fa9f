"""The Postgres ledger's batch statements (issue 16): a step's claim is ONE statement and
the outcomes of calls that finish together are ONE statement, whatever their number;
what they carry (bytes, floats, text) comes back exactly; a claim that races a
concurrent claimer of the same key still ends with that claimer's row, never a second
``issued`` row; text PostgreSQL cannot hold is a typed error that loses nothing; and
a fresh step's claim reads no ledger rows, and a step's outcomes only their own rows,
however large the ledger and however stale its statistics; an outcome writes no index
entry (a HOT update, migration 6).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import pytest
from pg_reads import plans_cached_on_empty_tables, table_reads

from langgraph_idem_saver.errors import SerializationError
from langgraph_idem_saver.ledger import CallIntent, CallStatus, Outcome, StepLookup
from langgraph_idem_saver.postgres import AsyncPostgresSaver

EVERY_BYTE = bytes(range(256))


@pytest.fixture
async def saver(pg_dsn: str) -> AsyncIterator[AsyncPostgresSaver]:
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as s:
        await s.setup()
        yield s


@contextmanager
def count_statements(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every statement any async psycopg cursor executes inside the block."""
    seen: list[str] = []
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(" ".join(str(query).split())[:60])
        return await original(self, query, *args, **kwargs)

    with monkeypatch.context() as patch:
        patch.setattr(psycopg.AsyncCursor, "execute", execute)
        yield seen


def intent(i: int, *, key: str | None = None, args: bytes = b'{"i":1}') -> CallIntent:
    return CallIntent(
        scope="t", key=key or f"k{i}", thread_id="t", agent_path="tools", tool_name="send",
        args_hash=f"h{i}", args=args, tool_call_id=f"c{i}", run_id="r",
        position="p", branch="b", occurrence=i,
    )  # fmt: skip


async def complete(saver: AsyncPostgresSaver, key: str, i: int) -> None:
    result = EVERY_BYTE + bytes([i])
    await saver.record_outcome("t", key, owner="me", outcome=Outcome.completed("bytes", result))


async def test_a_claim_of_20_calls_and_their_20_outcomes_are_two_statements(
    saver: AsyncPostgresSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    with count_statements(monkeypatch) as seen:
        claimed = await saver.aclaim([intent(i) for i in range(20)], owner="me", lease_seconds=60)
        assert len(seen) == 1, seen
        assert all(c.claimed for c in claimed)
        await asyncio.gather(*(complete(saver, f"k{i}", i) for i in range(20)))
        assert len(seen) == 2, seen
    stored = {e.key: e for e in await saver.alist_entries("t")}
    assert [stored[f"k{i}"].result for i in range(20)] == [
        EVERY_BYTE + bytes([i]) for i in range(20)
    ]
    assert stored["k7"].status is CallStatus.COMPLETED


async def test_claimed_values_come_back_exactly(saver: AsyncPostgresSaver) -> None:
    """Bytes (every value), floats (the lease) and non-ASCII text survive the JSON trip."""
    odd = intent(0, args=EVERY_BYTE)
    odd = CallIntent(**{**odd.__dict__, "tool_call_id": "c-é-😀-\u2028", "run_id": None})
    [out] = await saver.aclaim([odd], owner="me", lease_seconds=12.345678)
    entry = out.entry
    assert out.claimed
    assert entry.args == EVERY_BYTE
    assert entry.tool_call_id == "c-é-😀-\u2028" and entry.run_id is None
    assert entry.lease_expires_at - entry.issued_at == pytest.approx(12.345678, abs=1e-6)
    assert (entry.position, entry.branch, entry.occurrence) == ("p", "b", 0)


async def test_a_claim_that_races_a_concurrent_claimer_takes_its_row(
    saver: AsyncPostgresSaver, pg_dsn: str
) -> None:
    """Another claimer inserted the key and has not committed: our claim's INSERT waits
    on it, does nothing once it commits, and its snapshot (older than that commit)
    cannot see the row: the call is claimed again in a new statement, which returns the
    other claimer's row - not ours, and no second row."""
    await saver.aclaim([intent(9)], owner="warm-up", lease_seconds=60)
    rival = await psycopg.AsyncConnection.connect(pg_dsn)
    try:
        await rival.execute(
            "INSERT INTO idem_tool_calls (scope, key, thread_id, agent_path, tool_name, "
            "args_hash, args, tool_call_id, status, attempts, owner, issued_at, "
            "lease_expires_at) VALUES ('t', 'k0', 't', 'tools', 'send', 'h0', '{}', 'c0', "
            "'issued', 1, 'rival', 1, 2)"
        )
        claim = asyncio.create_task(saver.aclaim([intent(0)], owner="me", lease_seconds=60))
        async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as watch:
            for _ in range(250):
                cur = await watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                    "AND datname = current_database()"
                )
                row = await cur.fetchone()
                if row and row[0]:
                    break
                await asyncio.sleep(0.02)
            else:
                raise AssertionError("the claim never waited for the rival's row")
        await rival.commit()
        [out] = await claim
    finally:
        await rival.close()
    assert not out.claimed
    assert out.entry.owner == "rival"
    assert [e.owner for e in await saver.alist_entries("t") if e.key == "k0"] == ["rival"]


@pytest.mark.parametrize("together", [1, 2], ids=["alone-FINISH_ONE", "with-another-JSON"])
async def test_an_outcome_with_a_nul_is_typed_and_leaves_the_call_issued(
    saver: AsyncPostgresSaver, together: int
) -> None:
    """A failed call's error text with a NUL (PostgreSQL text cannot hold one): a
    SerializationError, and the entry stays ``issued`` (an unknown outcome, surfaced),
    never silently changed - recorded alone (a text parameter) or with another outcome
    (the JSON form, where the other outcome of that transaction is not recorded either)."""
    await saver.aclaim([intent(i) for i in range(together)], owner="me", lease_seconds=60)

    async def fail(i: int, error: str) -> None:
        outcome = Outcome.failed(error, "bytes", b"x")
        await saver.record_outcome("t", f"k{i}", owner="me", outcome=outcome)

    outcomes = [fail(0, "bad\x00news"), *(fail(i, "fine") for i in range(1, together))]
    results = await asyncio.gather(*outcomes, return_exceptions=True)
    assert all(isinstance(r, SerializationError) and "NUL" in str(r) for r in results)
    entries = await saver.alist_entries("t")
    assert len(entries) == together
    assert all(e.status is CallStatus.ISSUED and e.error is None for e in entries)


LEDGER_FILL = """
INSERT INTO idem_tool_calls (scope, key, thread_id, agent_path, tool_name, args_hash, args,
    tool_call_id, status, owner, issued_at, lease_expires_at, position, branch, occurrence)
SELECT 'other-' || (g / 50), 'key-' || g, 'other-' || (g / 50), 'tools', 'send',
    md5(g::text), '\\x00', 'c' || g, 'completed', 'me', 0, 0, 'p' || (g / 50), 'b', g % 50
FROM generate_series(1, 20000) AS g
"""


def ledger_scans(plan: dict[str, Any]) -> list[tuple[str, float]]:
    """(node type, rows read) of every executed scan of the ledger table in ``plan``."""
    found = []
    nodes = [plan]
    while nodes:
        node = nodes.pop()
        nodes += node.get("Plans", [])
        ledger = node.get("Relation Name") == "idem_tool_calls"
        if ledger and "Scan" in node["Node Type"] and node["Actual Loops"]:
            found.append((node["Node Type"], node["Actual Rows"] * node["Actual Loops"]))
    return found


@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-stats", "analyzed"])
async def test_a_fresh_steps_claim_reads_no_ledger_rows(pg_dsn: str, analyzed: bool) -> None:
    """A step whose calls are all new is claimed by its inserts alone: the reads of the
    rows holding a key or a fork slot run only when a row was refused. Before, they ran
    every time, and with statistics older than the table (a ledger that grew since the
    last ANALYZE) they scanned the whole ledger: the claim grew with the table."""
    from langgraph_idem_saver.postgres import ledger_sql
    from langgraph_idem_saver.postgres.ledger_rows import claim_rows

    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute("ANALYZE idem_tool_calls")  # statistics of the empty table
        await conn.execute(LEDGER_FILL)
        if analyzed:
            await conn.execute("ANALYZE idem_tool_calls")
        rows = [(*intent(i, key=f"fresh-{i}").__dict__.values(),) for i in range(50)]
        params = {"rows": claim_rows(rows), "owner": "me", "now": 1.0, "lease": 2.0}
        cur = await conn.execute(
            "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) " + ledger_sql.CLAIM_STEP, params
        )
        [(doc,)] = await cur.fetchall()
        assert ledger_scans(doc[0]["Plan"]) == []
        # a refused row: the reads run, and find what refused it
        refused = [(*intent(0, key="fresh-0").__dict__.values(),)]
        cur = await conn.execute(ledger_sql.CLAIM_STEP, {**params, "rows": claim_rows(refused)})
        # (EXPLAIN ANALYZE ran the claim: its row holds both the key and the slot)
        assert sorted((r[0], r[3]) for r in await cur.fetchall()) == [
            ("k", "fresh-0"),
            ("s", "fresh-0"),
        ]


async def claim_fresh(conn: psycopg.AsyncConnection[Any], n: int) -> None:
    """Claim ``n`` fresh calls (``fresh-0``...)."""
    from langgraph_idem_saver.postgres import ledger_sql
    from langgraph_idem_saver.postgres.ledger_rows import claim_rows

    rows = [(*intent(i, key=f"fresh-{i}").__dict__.values(),) for i in range(n)]
    params = {"rows": claim_rows(rows), "owner": "me", "now": 1.0, "lease": 2.0}
    await conn.execute(ledger_sql.CLAIM_STEP, params)


async def finish_fresh(conn: psycopg.AsyncConnection[Any], n: int) -> None:
    """Record the outcomes of the ``n`` fresh calls together (``FINISH_STEP_KEYS``, the
    statement the saver sends for outcomes that finish together)."""
    from langgraph_idem_saver.postgres import ledger_sql
    from langgraph_idem_saver.postgres.ledger_rows import finish_rows

    # a ToolMessage of a few words serializes to about this size
    outcomes = [
        ("completed", "msgpack", b"r" * 200, None, 3.0, "t", f"fresh-{i}", "me") for i in range(n)
    ]
    cur = await conn.execute(ledger_sql.FINISH_STEP_KEYS, (finish_rows(outcomes),))
    assert len(await cur.fetchall()) == n


@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-stats", "analyzed"])
async def test_a_steps_outcomes_read_their_own_rows_by_key(pg_dsn: str, analyzed: bool) -> None:
    """The outcomes of a step find their rows through the primary key: 50 rows read for
    50 outcomes, however large the ledger and however stale its statistics. (Before
    migration 6 they went through the partial index of issued rows, which also returns
    an entry for every call finished since the table was last vacuumed.) Counted from the
    server's statistics, which see inside the function the statement calls."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute("ANALYZE idem_tool_calls")  # statistics of the empty table
        await conn.execute(LEDGER_FILL)
        if analyzed:
            await conn.execute("ANALYZE idem_tool_calls")
        await claim_fresh(conn, 50)
        async with ledger_reads(conn) as reads, pkey_scans(conn) as probes:
            await finish_fresh(conn, 50)
    assert reads == [0, 0, 50, 50], reads  # no sequential scan; 50 index probes
    assert probes == [50]  # ... of the primary key


@contextlib.asynccontextmanager
async def pkey_scans(conn: psycopg.AsyncConnection[Any]) -> AsyncIterator[list[int]]:
    """Yields a list that holds, after the block, the scans of the ledger's primary key
    during it (flushed like ``pg_reads.table_reads``)."""

    async def scans() -> int:
        await conn.execute("SELECT pg_stat_force_next_flush()", prepare=False)
        cur = await conn.execute(
            "SELECT idx_scan FROM pg_stat_user_indexes WHERE indexrelid = %s::regclass",
            ("idem_tool_calls_pkey",),
            prepare=False,
        )
        row = await cur.fetchone()
        assert row is not None
        return int(row[0] or 0)

    counts: list[int] = []
    before = await scans()
    yield counts
    counts.append(await scans() - before)


async def test_an_outcome_writes_no_index_entry(pg_dsn: str) -> None:
    """Recording an outcome is a heap-only (HOT) update: no index covers a column an
    outcome changes, and each page keeps room for the finished versions of its rows
    (migration 6). Before, every outcome wrote a new entry into all six indexes of the
    ledger: ~7 WAL records a call instead of ~1."""
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=False) as conn:
        await claim_fresh(conn, 50)
        await finish_fresh(conn, 50)
        cur = await conn.execute(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_xact_user_tables "
            "WHERE relid = 'idem_tool_calls'::regclass"
        )
        counts = await cur.fetchone()
        await conn.commit()
    assert counts == (50, 50)


async def test_migration_6_applies_to_an_existing_ledger(pg_dsn: str) -> None:
    """A database at schema 5 (with the index of issued rows) is migrated in place: the
    index is gone, new pages keep room for outcomes, and its calls are still there."""
    from langgraph_idem_saver.postgres import sql

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        for version in range(6):
            for statement in sql.MIGRATIONS[version]:
                await conn.execute(statement)
            await conn.execute(sql.INSERT_MIGRATION, (version,))
        await conn.execute(LEDGER_FILL)
        cur = await conn.execute("SELECT to_regclass('idem_tool_calls_issued') IS NOT NULL")
        assert await cur.fetchone() == (True,)
    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
        assert len(await saver.alist_entries("other-7")) == 50
        assert [e.key for e in await saver.alist_issued()] == []
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT to_regclass('idem_tool_calls_issued') IS NULL, reloptions "
            "FROM pg_class WHERE oid = 'idem_tool_calls'::regclass"
        )
        assert await cur.fetchone() == (True, ["fillfactor=25"])


def ledger_reads(conn: psycopg.AsyncConnection[Any]) -> Any:
    """What the block read of the ledger table (``pg_reads.table_reads``)."""
    return table_reads(conn, "idem_tool_calls")


STEP_CASES = (  # scope, spots, entries found
    ("fresh", [["p5", "send"]], 0),
    ("big", [["nowhere", "send"]], 3),  # three signatures of the thread's 20,000 rows
    ("big", [["p5", "send"]], 50),  # and every call made at position p5 (50, those included)
)
HASHES = [hashlib.md5(str(g).encode()).hexdigest() for g in (250, 251, 252)]


async def fill_ledger(dsn: str, analyzed: bool) -> None:
    """20,000 rows of 400 threads, and one thread ("big") with 20,000 of its own."""
    async with await psycopg.AsyncConnection.connect(dsn, autocommit=True) as conn:
        await conn.execute(LEDGER_FILL)
        await conn.execute(LEDGER_FILL.replace("'other-' || (g / 50), 'key-'", "'big', 'bkey-'"))
        if analyzed:
            await conn.execute("ANALYZE idem_tool_calls")


@pytest.mark.parametrize("plans", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("analyzed", [False, True], ids=["stale-stats", "analyzed"])
async def test_the_adoption_read_reads_only_the_rows_it_finds(
    pg_dsn: str, analyzed: bool, plans: str
) -> None:
    """The read a step's claim starts with (every call signature and fork-slot position
    of the step) probes indexes: no sequential scan, and rows fetched in proportion to
    the entries found, on a ledger of 20,000 rows of other threads plus a thread with
    20,000 of its own; fresh statistics or not, generic plan or custom. Written as joins,
    the planner hashed the whole thread or scanned the table (8-20 ms a step); SQLite's
    form scanned too (tests/test_sqlite_specific.py)."""
    import json

    from langgraph_idem_saver.postgres import ledger_sql

    async with AsyncPostgresSaver.from_conn_string(pg_dsn) as saver:
        await saver.setup()
    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True) as conn:
        await conn.execute("ANALYZE idem_tool_calls")  # statistics of the empty table
    await fill_ledger(pg_dsn, analyzed)
    async with await psycopg.AsyncConnection.connect(
        pg_dsn, autocommit=True, prepare_threshold=0
    ) as conn:
        signatures = json.dumps([["send", h] for h in HASHES])
        await conn.execute(f"SET plan_cache_mode = {plans}")
        for scope, spots, expected in STEP_CASES:
            params = (scope, "tools", signatures, scope, json.dumps(spots))
            async with ledger_reads(conn) as reads:
                cur = await conn.execute(ledger_sql.SELECT_STEP_CANDIDATES, params)
                assert len(await cur.fetchall()) == expected
            seq_scans, _, _, fetched = reads
            assert seq_scans == 0, (scope, plans)
            # each row found is read twice: by its index, then by its key
            assert fetched <= 2 * (expected + 3), (scope, fetched)


async def test_a_claim_planned_while_the_ledger_was_small_never_scans_it(pg_dsn: str) -> None:
    """On a connection that prepares every statement (``prepare_threshold=0``, as
    LangGraph's savers open theirs) PostgreSQL caches a generic plan of the claim after
    five executions. Cached while the ledger held a few rows, it scanned the whole ledger
    once per signature from then on (a 50-call claim: 8 ms after a few thousand calls,
    instead of 1.2); with sequential scans off it probed the primary key by thread alone
    (1,020,000 rows fetched for one claim here). The adoption read is a function that
    plans it on each call (migration 7): after the ledger grew to 40,000 rows, a step's
    claim on the thread with 20,000 still reads only what it finds."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):

        def step(scope: str, n: int, first: int) -> tuple[list[CallIntent], StepLookup]:
            intents = [
                CallIntent(
                    scope=scope,
                    key=f"{scope}-{first + i}",
                    thread_id=scope,
                    agent_path="tools",
                    tool_name="send",
                    args_hash=f"fresh-{first + i}",
                    args=b"{}",
                    tool_call_id=f"c{first + i}",
                    position=f"q{first}",
                    branch="b",
                    occurrence=i,
                )
                for i in range(n)
            ]
            lookup = StepLookup(
                scope=scope,
                agent_path="tools",
                signatures=[("send", i.args_hash) for i in intents],
                spots=[(f"q{first}", "send")],
            )
            return intents, lookup

        for k in range(8):  # the plans are cached now, the ledger holding a few rows
            intents, lookup = step(f"small-{k}", 3, 0)
            claim = await saver.aclaim_step(intents, lookup, owner="me", lease_seconds=60)
            assert claim.claimed is not None and all(c.claimed for c in claim.claimed)
        await fill_ledger(pg_dsn, analyzed=False)
        intents, lookup = step("big", 50, 100_000)
        async with ledger_reads(conn) as reads:
            claim = await saver.aclaim_step(intents, lookup, owner="me", lease_seconds=60)
        assert claim.claimed is not None and all(c.claimed for c in claim.claimed)
        seq_scans, _, _, fetched = reads
        assert (seq_scans, fetched) == (0, 0), reads
        # a step asking again for three calls the thread made: found, by their signatures
        _, lookup = step("big", 3, 0)
        lookup = dataclasses.replace(lookup, signatures=[("send", h) for h in HASHES])
        fresh = [dataclasses.replace(i, key=f"again-{n}") for n, i in enumerate(intents[:3])]
        async with ledger_reads(conn) as reads:
            claim = await saver.aclaim_step(fresh, lookup, owner="me", lease_seconds=60)
        assert claim.claimed is None and len(claim.candidates.by_signature) == 3
        seq_scans, _, _, fetched = reads
        assert seq_scans == 0 and fetched <= 2 * 3, reads


async def test_outcomes_together_are_one_prepared_statement_whose_plan_cannot_go_stale(
    pg_dsn: str,
) -> None:
    """The outcomes of calls that finish together are one call of ``idem_finish_step``
    (migration 13), prepared like any statement. On a connection that prepares every
    statement (``prepare_threshold=0``, as LangGraph's savers open theirs) PostgreSQL
    caches generic plans; the plan of the plain UPDATE cached while the ledger was small
    hashed a seq scan of the whole ledger into every later step (a 50-call step grew
    from 21.0 to 23.7 ms over 10k calls), and with hash joins off it read the whole
    primary key instead. The function plans its UPDATE on every call, whatever the
    session's ``plan_cache_mode``: with every other plan built and cached on the empty
    ledger, a step's outcomes still probe their own keys once it holds 40,000 rows."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        for step in range(8):  # the plans are built and cached now, on the empty ledger
            keys = [f"s{step}-{i}" for i in range(5)]
            await saver.aclaim(
                [intent(step * 10 + i, key=k) for i, k in enumerate(keys)],
                owner="me",
                lease_seconds=60,
            )
            with count_statements_on(conn) as seen:
                await asyncio.gather(*(record(saver, "t", key) for key in keys))
            assert seen == ["SELECT scope, key FROM"], seen  # one statement for the five
        cur = await conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement LIKE %s",
            ["%idem_finish_step%"],
            prepare=False,
        )
        assert await cur.fetchone() == (1,)
        await fill_ledger(pg_dsn, analyzed=False)
        keys = [f"late-{i}" for i in range(5)]
        await saver.aclaim(
            [intent(90 + i, key=k) for i, k in enumerate(keys)], owner="me", lease_seconds=60
        )
        async with ledger_reads(conn) as reads:
            await asyncio.gather(*(record(saver, "t", key) for key in keys))
    assert reads == [0, 0, 5, 5], reads  # an index probe per outcome, no sequential scan
    entries = await alist(pg_dsn, "t")
    assert len(entries) == 45 and {e.status for e in entries} == {CallStatus.COMPLETED}


def count_statements_on(conn: psycopg.AsyncConnection[Any]) -> Any:
    """The first words of every statement sent through ``conn`` inside the block."""
    seen: list[str] = []
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        if self.connection is conn:
            seen.append(" ".join(str(query).split()[:4]))
        return await original(self, query, *args, **kwargs)

    @contextmanager
    def block() -> Iterator[list[str]]:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(psycopg.AsyncCursor, "execute", execute)
            yield seen

    return block()


async def record(saver: AsyncPostgresSaver, scope: str, key: str) -> None:
    await saver.record_outcome(scope, key, owner="me", outcome=Outcome.completed("bytes", b"r"))


async def test_one_outcome_is_a_prepared_probe_of_the_primary_key(pg_dsn: str) -> None:
    """An outcome recorded alone (a lone call; a call finishing by itself) is one call of
    ``idem_finish_one``, prepared like any statement (planning the JSON form for one row
    cost ~0.15 ms of a ~0.4 ms outcome). Its plan cannot go stale: cached while the
    ledger was empty and VACUUMed (a plain UPDATE's plan was then a sequential scan,
    kept as the ledger grew), it still reads one row once the ledger holds 40,000."""
    async with plans_cached_on_empty_tables(pg_dsn) as (conn, saver):
        for i in range(8):  # the plan is built and cached now, on the empty ledger
            await saver.aclaim([intent(i, key=f"small-{i}")], owner="me", lease_seconds=60)
            with count_statements_on(conn) as seen:
                await record(saver, "t", f"small-{i}")
            assert seen == ["SELECT scope, key FROM"], seen
        await fill_ledger(pg_dsn, analyzed=False)
        await saver.aclaim([intent(99, key="late")], owner="me", lease_seconds=60)
        async with ledger_reads(conn) as reads:
            await record(saver, "t", "late")
    assert reads[:3] == [0, 0, 1], reads  # one index scan, no sequential scan
    [late] = [e for e in await alist(pg_dsn, "t") if e.key == "late"]
    assert late.status is CallStatus.COMPLETED and late.result == b"r"


async def alist(dsn: str, scope: str) -> list[Any]:
    async with AsyncPostgresSaver.from_conn_string(dsn) as saver:
        return list(await saver.alist_entries(scope))


ONE_CALL_CASES = (  # scope, signature's hash, spot, entries found
    ("fresh", "nothing", ["p5", "send"], 0),
    ("big", HASHES[0], ["nowhere", "send"], 1),  # the call of that signature
    ("big", "nothing", ["p5", "send"], 50),  # every call made at position p5
    ("big", HASHES[0], ["p5", "send"], 50),  # both: the call of p5 of that signature once
)


@pytest.mark.parametrize("plans", ["force_generic_plan", "force_custom_plan"])
async def test_a_one_call_steps_adoption_read_is_static_and_reads_what_it_finds(
    pg_dsn: str, plans: str
) -> None:
    """A step of one call (one signature, one spot) is read by the function's static
    query (migration 8; no planning per call), whose plan is cached: cached while the
    ledger was empty, it still probes the signature and fork-slot indexes (two index
    scans, no sequential one) once the ledger holds a thread of 20,000 rows among 20,000
    of others; a row found by both comes back once."""
    import json

    from langgraph_idem_saver.postgres import ledger_sql

    async with plans_cached_on_empty_tables(pg_dsn, plans) as (conn, _saver):
        for i in range(8):  # the function's plans are cached now, on the empty ledger
            params = ("fresh", "tools", json.dumps([["send", f"h{i}"]]), "fresh", "[]")
            cur = await conn.execute(ledger_sql.SELECT_STEP_CANDIDATES, params)
            assert await cur.fetchall() == []
        await fill_ledger(pg_dsn, analyzed=False)
        for scope, digest, spot, expected in ONE_CALL_CASES:
            params = (scope, "tools", json.dumps([["send", digest]]), scope, json.dumps([spot]))
            async with ledger_reads(conn) as reads:
                cur = await conn.execute(ledger_sql.SELECT_STEP_CANDIDATES, params)
                found = await cur.fetchall()
            seq_scans, seq_rows, index_scans, fetched = reads
            assert len(found) == expected == len({(r[0], r[1]) for r in found}), scope
            assert (seq_scans, seq_rows, index_scans) == (0, 0, 2), (scope, spot)
            # each branch reads the rows it finds (+1 when both find the same row)
            assert fetched <= expected + 1, (scope, spot, fetched)


@pytest.mark.parametrize("calls", [1, 3], ids=["one outcome", "outcomes together"])
async def test_outcomes_and_claims_commit_after_the_wal_flush(
    pg_dsn: str, monkeypatch: pytest.MonkeyPatch, calls: int
) -> None:
    """An outcome's transaction keeps the session's ``synchronous_commit`` (on), as a
    claim's does: a server crash cannot roll back an outcome whose step's checkpoint
    writes then land on the restarted server (tests/test_db_restart.py). Observed inside
    each statement's transaction, on a connection that is not in autocommit (the saver
    then wraps each call in a transaction)."""
    inside: dict[str, str] = {}
    original = psycopg.AsyncCursor.execute

    async def execute(self: Any, query: Any, *args: Any, **kwargs: Any) -> Any:
        result = await original(self, query, *args, **kwargs)
        text = " ".join(str(query).split())
        kind = "claim" if "INSERT INTO idem_tool_calls" in text else None
        if "idem_finish_one" in text:
            kind = "outcome"
        elif "idem_finish_step" in text:
            kind = "outcomes"  # several in one statement
        if kind:
            async with self.connection.cursor() as other:  # same transaction
                await original(other, "SHOW synchronous_commit")
                inside[kind] = (await other.fetchone())[0]
        return result

    async with await psycopg.AsyncConnection.connect(pg_dsn, autocommit=False) as conn:
        await conn.execute("SET synchronous_commit = on")
        await conn.commit()
        saver = AsyncPostgresSaver(conn)
        await saver.setup()
        with monkeypatch.context() as patch:
            patch.setattr(psycopg.AsyncCursor, "execute", execute)
            batch = [intent(i, key=f"sc-{calls}-{i}") for i in range(calls)]
            await saver.aclaim(batch, owner="me", lease_seconds=60)
            await asyncio.gather(*(record(saver, "t", i.key) for i in batch))
        assert inside == {"claim": "on", "outcome" if calls == 1 else "outcomes": "on"}
        cur = await conn.execute("SHOW synchronous_commit")
        assert (await cur.fetchone())[0] == "on"  # type: ignore[index]
        await conn.rollback()
    done = [e for e in await alist(pg_dsn, "t") if e.key.startswith(f"sc-{calls}-")]
    assert [e.status for e in done] == [CallStatus.COMPLETED] * calls
