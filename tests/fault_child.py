"""Child processes for the fault tests, and small helpers the bad-input tests share.

As a script, ``python tests/fault_child.py '<json>'`` runs one *mode* in a fresh process
(so it can be SIGKILLed, hold a lock, run under ``RLIMIT_FSIZE`` or with
``LANGGRAPH_STRICT_MSGPACK`` set before LangGraph is imported):

* ``put-loop``    - aput checkpoints forever, printing ``ok <n>`` after each commit;
* ``ledger-loop`` - claim + finish ledger entries forever, printing ``issued <n>`` /
  ``done <n>`` after each commit;
* ``hold-lock``   - take SQLite's write lock (``BEGIN IMMEDIATE``), print ``locked``,
  release it when stdin closes or a line arrives;
* ``disk-full``   - cap the file size with ``RLIMIT_FSIZE`` (SIGXFSZ ignored) and aput
  until a write fails; prints one JSON line describing the failure;
* ``strict-replay`` - run an IdempotentToolNode graph twice (run, then re-run the tool step
  from history) under ``LANGGRAPH_STRICT_MSGPACK=true``; prints the replayed artifact's type.

As a module, it holds :class:`Db` (a database the tests can reopen and inspect behind the
saver's back, on either backend) and config helpers.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
if str(HERE.parent) not in sys.path:
    sys.path.insert(0, str(HERE.parent))
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from tool_node_helpers import cfg  # noqa: E402 - importable once the path is set

TABLES = ("idem_checkpoints", "idem_blobs", "idem_writes", "idem_tool_calls")


@dataclass
class Secret:
    """A type no msgpack allowlist names: strict mode must not revive it."""

    value: str


@dataclass
class Tripwire:
    """Constructing one creates the file ``path``: proof that a stored type was revived."""

    path: str

    def __post_init__(self) -> None:
        Path(self.path).touch()


@dataclass
class Db:
    """One database of either backend: ``where`` is a file path (SQLite) or a DSN."""

    backend: str
    where: str

    @asynccontextmanager
    async def open(self, **kwargs: Any) -> AsyncIterator[Any]:
        if self.backend == "sqlite":
            from langgraph_idem_saver import AsyncSqliteSaver

            async with AsyncSqliteSaver.from_conn_string(self.where, **kwargs) as saver:
                yield saver
        else:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver

            async with AsyncPostgresSaver.from_conn_string(self.where, **kwargs) as saver:
                yield saver

    async def execute(self, statement: str, params: tuple[Any, ...] = ()) -> int:
        """Run one statement behind the saver's back (``?`` placeholders); rowcount."""
        if self.backend == "sqlite":
            with sqlite3.connect(self.where) as conn:
                return conn.execute(statement, params).rowcount
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.where, autocommit=True) as conn:
            cur = await conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
            return cur.rowcount

    async def query(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        if self.backend == "sqlite":
            with sqlite3.connect(self.where) as conn:
                return list(conn.execute(statement, params).fetchall())
        import psycopg

        async with await psycopg.AsyncConnection.connect(self.where, autocommit=True) as conn:
            cur = await conn.execute(statement.replace("?", "%s"), params)  # type: ignore[arg-type]
            return list(await cur.fetchall())

    async def snapshot(self) -> list[str]:
        """Every row of every table, as text: for "nothing was lost or altered" checks."""
        rows: list[str] = []
        for table in TABLES:
            if self.backend == "sqlite":
                found = await self.query(f"SELECT * FROM {table}")
                rows += sorted(f"{table}:{r!r}" for r in found)
            else:
                found = await self.query(f"SELECT t::text FROM {table} AS t")
                rows += sorted(f"{table}:{r[0]}" for r in found)
        return rows

    def files_bytes(self) -> bytes:
        """The SQLite database with its WAL and shared-memory files, as raw bytes."""
        data = b""
        for suffix in ("", "-wal", "-shm", "-journal"):
            p = Path(self.where + suffix)
            if p.exists():
                data += p.read_bytes()
        return data

    async def all_text(self) -> str:
        """Every stored value as text (bytea as its raw bytes decoded leniently)."""
        if self.backend == "sqlite":
            return self.files_bytes().decode("latin-1")
        out: list[str] = []
        for table in TABLES:
            for (row,) in await self.query(f"SELECT t::text FROM {table} AS t"):
                out.append(row)
        # bytea columns print as hex in ``t::text``: decode them too
        for table, col in (
            ("idem_checkpoints", "checkpoint"),
            ("idem_blobs", "blob"),
            ("idem_writes", "value"),
            ("idem_tool_calls", "result"),
            ("idem_tool_calls", "args"),
        ):
            for (value,) in await self.query(f"SELECT {col} FROM {table}"):
                if value is not None:
                    out.append(bytes(value).decode("latin-1"))
        return "\n".join(out)


# ----------------------------------------------------------------------------- child modes


def emit(*parts: Any) -> None:
    print(*parts, flush=True)


async def put_loop(spec: dict[str, Any]) -> None:
    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    db = Db(spec["backend"], spec["where"])
    async with db.open() as saver:
        parent = None
        n = 0
        while True:
            n += 1
            values = {"payload": "p" * spec.get("size", 2000) + str(n), "n": n}
            versions = {ch: saver.get_next_version(None, None) for ch in values}
            cp = generate_checkpoint(channel_values=values, channel_versions=versions)
            config = cfg(spec["thread"], "", parent)
            stored = await saver.aput(config, cp, {"source": "loop", "step": n}, versions)
            await saver.aput_writes(stored, [("payload", f"w{n}")], f"task-{n}")
            parent = stored["configurable"]["checkpoint_id"]
            emit("ok", n, parent)


async def ledger_loop(spec: dict[str, Any]) -> None:
    from langgraph_idem_saver.ledger import CallIntent, Outcome
    from langgraph_idem_saver.owners import make_owner

    db = Db(spec["backend"], spec["where"])
    owner = make_owner()
    async with db.open() as saver:
        n = 0
        while True:
            n += 1
            intent = CallIntent(
                scope=spec["thread"],
                key=f"key-{n}",
                thread_id=spec["thread"],
                agent_path="tools",
                tool_name="charge",
                args_hash=f"h{n}",
                args=json.dumps({"n": n}).encode(),
                tool_call_id=f"call-{n}",
            )
            [outcome] = await saver.aclaim([intent], owner=owner, lease_seconds=600)
            assert outcome.claimed
            emit("issued", n)
            type_, data = saver.serde.dumps_typed({"charged": n, "pad": "r" * 3000})
            await saver.record_outcome(
                intent.scope, intent.key, owner=owner, outcome=Outcome.completed(type_, data)
            )
            emit("done", n)


def hold_lock(spec: dict[str, Any]) -> None:
    conn = sqlite3.connect(spec["where"], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    emit("locked")
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    conn.close()
    emit("released")


async def disk_full(spec: dict[str, Any]) -> None:
    import resource
    import signal

    from langgraph.checkpoint.conformance.test_utils import generate_checkpoint

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    db = Db("sqlite", spec["where"])
    async with db.open() as saver:
        await saver.setup()
        size = sum(
            Path(spec["where"] + s).stat().st_size
            for s in ("", "-wal")
            if Path(spec["where"] + s).exists()
        )
        limit = size + spec["headroom"]
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        n = 0
        error: BaseException | None = None
        while n < 1000:
            n += 1
            blob = os.urandom(spec["chunk"]).hex()
            versions = {"big": saver.get_next_version(None, None)}
            cp = generate_checkpoint(channel_values={"big": blob}, channel_versions=versions)
            try:
                await saver.aput(cfg(spec["thread"]), cp, {"step": n}, versions)
            except BaseException as exc:
                error = exc
                break
        # the connection must still serve reads after the failed write
        readable = (await saver.aget_tuple(cfg("before"))) is not None
    emit(
        json.dumps(
            {
                "written": n - 1,
                "error_type": None if error is None else type(error).__name__,
                "error_mro": [] if error is None else [c.__name__ for c in type(error).__mro__],
                "message": str(error),
                "readable_after": readable,
            }
        )
    )


async def strict_replay(spec: dict[str, Any]) -> None:
    from langchain_core.tools import tool
    from tool_node_helpers import ai_calls, intent_for, plant_completed, tool_graph

    from langgraph_idem_saver import IdempotentToolNode

    assert os.environ.get("LANGGRAPH_STRICT_MSGPACK") == "true"
    from fault_child import Tripwire

    effects: list[str] = []

    @tool
    def fetch(name: str) -> str:
        """Fetch (a side effect)."""
        effects.append(name)
        return "ran"

    call = {"name": "fetch", "args": {"name": "s1"}, "id": "call-1", "type": "tool_call"}
    db = Db(spec["backend"], spec["where"])
    async with db.open() as saver:
        intent = intent_for("strict", call, checkpoint_ns="tools:x")
        await plant_completed(saver, intent, {"planted": Tripwire(spec["tripwire"])})
        Path(spec["tripwire"]).unlink()  # constructing it to plant it tripped it once
        graph = tool_graph(IdempotentToolNode([fetch]), saver)
        out = await graph.ainvoke(
            {"messages": [ai_calls(("fetch", {"name": "s1"}, "call-1"))]},
            cfg("strict"),
            durability="sync",
        )
        replayed = out["messages"][-1]
    emit(
        json.dumps(
            {
                "effects": len(effects),
                "same_saver": graph.checkpointer is saver,
                "replayed_content": replayed.content,
                "tripped": Path(spec["tripwire"]).exists(),
            }
        )
    )


def main() -> None:
    spec = json.loads(sys.argv[1])
    mode = spec["mode"]
    if mode == "hold-lock":
        hold_lock(spec)
        return
    runner = {
        "put-loop": put_loop,
        "ledger-loop": ledger_loop,
        "disk-full": disk_full,
        "strict-replay": strict_replay,
    }[mode]
    asyncio.run(runner(spec))


if __name__ == "__main__":
    from process_guard import exit_with_parent

    exit_with_parent()  # never outlive the test that started us (tests/process_guard.py)
    main()
