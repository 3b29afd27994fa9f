"""``ToolLedger``: the tool-call ledger alone, on a database of its own, beside any
checkpointer (LangGraph's ``InMemorySaver`` or official savers, a Redis or Mongo saver,
the Agent Server's own persistence).

Why it looks like this:

* **The savers' ledger, reused.** Our savers *are* ledgers (``ToolCallLedger``), and a
  saver opened on a database of its own and passed as ``ledger=`` already works. This
  object opens that saver from a path or a DSN, runs ``setup()``, and exposes only the
  ledger: no checkpoint method (it is never a graph's checkpointer by mistake) and no
  retention, whose rule "nothing can replay an entry" reads checkpoints this database
  never holds (see ``docs/guarantees.md``, "A ledger beside any checkpointer").
* **One owner of one connection.** ``async with ToolLedger(...)`` opens the connection on
  the running loop and closes it at the block's end; ``with ToolLedger(...)`` opens it on a
  private loop thread (what a sync ``graph.invoke`` needs) and closes it the same way. A
  ledger used before either is opened on first use, on such a thread, and is closed by
  ``close()``/``aclose()`` or at interpreter exit: a graph module can build its front door
  at import time, as the Agent Server loads it.
* **Outcomes durable on their own.** Beside our saver, an outcome reaches the disk with
  the step's synced checkpoint write; here no checkpoint write shares the database, so a
  SQLite ledger syncs every commit (``synchronous="EXTRA"``) by default.
* **Closed is final.** Every call after ``close()`` raises ``ConnectionClosedError``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Coroutine
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from typing import TYPE_CHECKING, Any, TypeVar, cast

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_idem_saver.engine.loops import awaiting, on_loop, running_loop
from langgraph_idem_saver.errors import ConfigError, ConnectionClosedError
from langgraph_idem_saver.forwarding import hopping
from langgraph_idem_saver.retention import RetentionBase
from langgraph_idem_saver.saver_base import IdemSaverBase
from langgraph_idem_saver.sqlite.connection import Synchronous
from langgraph_idem_saver.sqlite.files import parse_target
from langgraph_idem_saver.surrogates import lossless
from langgraph_idem_saver.sync_bridge import ForwardedLedger, _Runtime

if TYPE_CHECKING:
    from typing_extensions import Self

    from langgraph_idem_saver.postgres import AsyncPostgresSaver

__all__ = ["ToolLedger"]

T = TypeVar("T")

_URI_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_POSTGRES_SCHEMES = ("postgres", "postgresql")
# libpq's keyword/value form: ``host=... dbname=...`` (each word a ``key=value``)
_KEYWORD_VALUE = re.compile(r"^\s*(\w+\s*=\s*('([^'\\]|\\.)*'|\S+)\s*)+$")


def backend_of(conn_string: object) -> str:
    """``"sqlite"`` or ``"postgres"`` for a connection string; :class:`ConfigError` for
    anything that is neither a SQLite path (or ``file:`` URI) nor a PostgreSQL DSN, and
    for a SQLite database that lives in memory (it forgets every claim at exit)."""
    if not isinstance(conn_string, str):
        raise ConfigError(
            "ToolLedger needs a SQLite path or a PostgreSQL DSN (a str), got "
            f"{type(conn_string).__name__}"
        )
    if not conn_string.strip():
        raise ConfigError("ToolLedger needs a SQLite path or a PostgreSQL DSN, got ''")
    if "\x00" in conn_string:
        raise ConfigError("a ToolLedger connection string cannot hold a NUL character")
    scheme = _URI_SCHEME.match(conn_string)
    if scheme is not None:
        if scheme.group(1).lower() in _POSTGRES_SCHEMES:
            return "postgres"
        raise ConfigError(
            f"ToolLedger stores its entries in SQLite or PostgreSQL; a {scheme.group(1)}:// "
            "URL is neither (give a SQLite path, a file: URI or a postgresql:// DSN)"
        )
    if not conn_string.startswith("file:") and _KEYWORD_VALUE.match(conn_string):
        return "postgres"
    if parse_target(conn_string, conn_string.startswith("file:")).path is None:
        raise ConfigError(
            f"a ToolLedger in memory ({conn_string!r}) forgets every claim when the process "
            "ends, which is when it is needed: give it a file"
        )
    return "sqlite"


class _OnFirstUse:
    """The saver's methods before the ledger is open (``ToolLedger._bridge_target``):
    each opens it - in a worker thread, so the loop never waits - then awaits the
    saver's method where it lives."""

    __slots__ = ("_ledger",)

    def __init__(self, ledger: ToolLedger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        ledger = self._ledger

        async def call(*args: Any, **kwargs: Any) -> Any:
            saver = await ledger._aready()
            return await ledger._hop(awaiting(getattr(saver, name), *args, **kwargs))

        call.__name__ = call.__qualname__ = name
        return call


class _Closed:
    """The saver's methods after ``close()`` (``ToolLedger._bridge_target``): looking one
    up succeeds, as Python's attribute contract wants (``hasattr``, ``getattr(ledger,
    name, None)``, ``isinstance`` with a runtime-checkable protocol such as
    ``AnswerRecorder``), and calling it raises :class:`ConnectionClosedError` when
    awaited. Only the forwarders ask it for a name, so an unknown name is still the
    ledger's ``AttributeError``."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Callable[..., Coroutine[Any, Any, Any]]:
        if name.startswith("__"):  # copy, pickle and friends probe dunders: not a method
            raise AttributeError(name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            raise _closed_error()

        call.__name__ = call.__qualname__ = name
        return call


_CLOSED = _Closed()


class _Itself:
    """A class attribute read as the class: ``ToolLedger.from_conn_string(...)`` is
    ``ToolLedger(...)`` (same arguments, same checks), named as LangGraph's savers name
    their constructor."""

    def __get__(self, obj: object, owner: type[T]) -> type[T]:
        return owner


S = TypeVar("S", bound=IdemSaverBase)
_LEDGER_ONLY: dict[type[Any], type[Any]] = {}


def _ledger_only(saver_class: type[S]) -> type[S]:
    """``saver_class`` marked ``ledger_only``: its ``setup()`` does not offer to import
    LangGraph's checkpoint tables found beside it (they belong to the checkpointer this
    ledger sits beside, which reads them itself)."""
    found = _LEDGER_ONLY.get(saver_class)
    if found is None:
        found = type(f"LedgerOnly{saver_class.__name__}", (saver_class,), {"ledger_only": True})
        _LEDGER_ONLY[saver_class] = found
    return found


MARKER_DDL = f"CREATE TABLE IF NOT EXISTS {RetentionBase.LEDGER_ONLY_TABLE} (marked_at REAL)"


async def _amark_ledger_only(saver: IdemSaverBase) -> None:
    """Mark the database as a ledger's (an empty table): a retention sweep run on it later
    (``asweep``, ``idem-saver prune --older-than``) refuses, since it cannot see the
    checkpoints that still replay its entries. Workers starting together on a fresh
    PostgreSQL database may race on ``CREATE TABLE``: the loser finds the table."""
    from langgraph_idem_saver.sqlite import AsyncSqliteSaver

    retention = cast(RetentionBase, saver)
    if await retention._ledger_only():
        return
    try:
        if isinstance(saver, AsyncSqliteSaver):
            await saver._write(lambda conn: conn.execute(MARKER_DDL))
        else:
            postgres = cast("AsyncPostgresSaver", saver)

            async def create(cur: Any) -> None:
                await cur.execute(MARKER_DDL, prepare=False)

            await postgres._run(create)
    except Exception:
        if not await retention._ledger_only():
            raise


def _closed_error() -> ConnectionClosedError:
    return ConnectionClosedError(
        "the ToolLedger is closed (close()/aclose() was called or its `with` block ended); "
        "open a new one"
    )


class ToolLedger(ForwardedLedger):
    """A tool-call ledger on a database of its own, for a graph whose checkpointer is not
    one of our savers: pass it as ``ledger=`` to ``IdempotentToolNode``,
    ``IdempotencyMiddleware`` or ``idempotent_task``.

    Args:
        conn_string: a SQLite path (or ``file:`` URI) or a PostgreSQL DSN
            (``postgresql://...`` or ``host=... dbname=...``); anything else, and a SQLite
            database in memory, is refused with :class:`ConfigError`. Nothing is opened
            here: bad paths and unreachable servers are reported when it opens (the
            savers' typed errors).
        serde: the serializer of recorded results (``EncryptedSerializer`` encrypts them
            and the arguments, as with our savers).
        synchronous: SQLite only; ``"EXTRA"`` (default) syncs every commit, outcomes
            included (no checkpoint write shares this database to sync them).
        busy_timeout: SQLite only; seconds to wait for another process's write lock.

    ``async with ToolLedger(...) as ledger`` opens it on the running loop; ``with``
    opens it on a private loop thread (for ``graph.invoke``; works for ``ainvoke`` too);
    unopened, it opens itself that way on first use. ``close()``/``aclose()`` end it.
    """

    def __init__(
        self,
        conn_string: str,
        *,
        serde: SerializerProtocol | None = None,
        synchronous: Synchronous = "EXTRA",
        busy_timeout: float = 5.0,
    ) -> None:
        self.backend = backend_of(conn_string)
        if synchronous not in ("FULL", "NORMAL", "EXTRA"):
            raise ConfigError(f"synchronous must be FULL, NORMAL or EXTRA, got {synchronous!r}")
        self._conn_string = conn_string
        self._synchronous: Synchronous = synchronous
        self._busy_timeout = busy_timeout
        self.serde = lossless(serde if serde is not None else JsonPlusSerializer())
        self._lock = threading.Lock()
        self._saver: IdemSaverBase | None = None
        self._runtime: _Runtime | None = None  # opened on a private loop thread
        self._stack: AsyncExitStack | None = None  # opened on the caller's loop
        self._closed = False

    from_conn_string = _Itself()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open" if self._saver is not None else "not open"
        return f"ToolLedger({self.backend}, {state})"

    # --- where it lives ----------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:  # type: ignore[override]
        """The loop the ledger's connection belongs to (None before it is opened: its
        calls then open it and hop there themselves)."""
        if self._runtime is not None:
            return self._runtime.loop
        saver = self._saver
        return None if saver is None else saver.loop

    @property
    def closed(self) -> bool:
        """Whether :meth:`close`/:meth:`aclose` was called."""
        return self._closed

    def _opener(self) -> AbstractAsyncContextManager[IdemSaverBase]:
        """The saver behind this ledger, as an async context manager (``setup()`` run)."""
        if self.backend == "postgres":
            from langgraph_idem_saver import AsyncPostgresSaver  # ImportError names the extra

            pg = _ledger_only(AsyncPostgresSaver)
            return pg.from_conn_string(self._conn_string, serde=self.serde)
        from langgraph_idem_saver.sqlite import AsyncSqliteSaver

        return _ledger_only(AsyncSqliteSaver).from_conn_string(
            self._conn_string,
            serde=self.serde,
            synchronous=self._synchronous,
            busy_timeout=self._busy_timeout,
        )

    async def _open_on(self, stack: AsyncExitStack) -> IdemSaverBase:
        saver = await stack.enter_async_context(self._opener())
        await _amark_ledger_only(saver)
        return saver

    def _check_unopened(self) -> None:
        if self._closed:
            raise _closed_error()
        if self._saver is not None:
            raise ConfigError("this ToolLedger is already open; open it once")

    async def aopen(self) -> ToolLedger:
        """Open the connection on the running loop (``async with`` does this)."""
        with self._lock:
            self._check_unopened()
        stack = AsyncExitStack()
        try:
            saver = await self._open_on(stack)
        except BaseException:
            await stack.aclose()
            raise
        with self._lock:
            if self._closed or self._saver is not None:  # closed or opened meanwhile
                opened_elsewhere = not self._closed
            else:
                self._stack, self._saver = stack, saver
                return self
        await stack.aclose()
        if opened_elsewhere:
            raise ConfigError("this ToolLedger is already open; open it once")
        raise _closed_error()

    def open(self) -> ToolLedger:
        """Open the connection on a private loop thread (``with`` does this)."""
        with self._lock:
            self._check_unopened()
            self._open_on_thread()
        return self

    def _open_on_thread(self) -> None:
        """Under the lock: the saver, opened on a new private loop thread."""
        runtime = _Runtime("idem-tool-ledger")
        try:
            saver = runtime.call(self._open_on(runtime.stack))
        except BaseException:
            runtime.close()
            raise
        self._runtime, self._saver = runtime, saver

    def _open_on_first_use(self) -> None:
        with self._lock:
            if self._closed:
                raise _closed_error()
            if self._saver is None:
                self._open_on_thread()

    async def _aready(self) -> IdemSaverBase:
        """The open saver; opened on first use (in a worker thread: the loop never waits)."""
        saver = self._saver
        if saver is not None and not self._closed:
            return saver
        if self._closed:
            raise _closed_error()
        await asyncio.to_thread(self._open_on_first_use)
        saver = self._saver
        if saver is None:  # closed while opening
            raise _closed_error()
        return saver

    async def _hop(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` where the saver lives; before it is open, here (``coro`` is
        then ``_OnFirstUse``'s, which opens it and hops there itself)."""
        runtime = self._runtime
        if runtime is not None:
            return await runtime.hop(coro)
        saver = self._saver
        if saver is not None:
            return await on_loop(saver.loop, coro)
        if self._closed:
            coro.close()
            raise _closed_error()
        return await coro

    # --- where the ledger's methods go (sync_bridge.ForwardedLedger) ----------------------

    def _bridge_target(self) -> IdemSaverBase:
        saver = self._saver
        if saver is not None:
            return saver
        if self._closed:  # looked up fine, raises when called (_Closed)
            return cast(IdemSaverBase, _CLOSED)
        return cast(IdemSaverBase, _OnFirstUse(self))

    _run_hopping = _hop

    def _bridge_closed(self) -> bool:
        return self._closed

    # --- lifetime ----------------------------------------------------------------------

    def _take(self) -> tuple[_Runtime | None, AsyncExitStack | None, IdemSaverBase | None]:
        with self._lock:
            if self._closed:
                return None, None, None
            self._closed = True
            taken = self._runtime, self._stack, self._saver
            self._runtime = self._stack = self._saver = None
            return taken

    async def aclose(self) -> None:
        """Close the connection (idempotent); every later call raises
        :class:`ConnectionClosedError`."""
        runtime, stack, saver = self._take()
        if runtime is not None:
            await asyncio.to_thread(runtime.close)
        elif stack is not None and saver is not None:
            await on_loop(saver.loop, stack.aclose())

    def close(self) -> None:
        """:meth:`aclose` from synchronous code. A ledger opened with ``async with`` /
        :meth:`aopen` closes on its own loop: from that loop's thread, ``await aclose()``."""
        if self._stack is not None and not self._closed:
            loop = self.loop
            if loop is None or loop is running_loop() or not loop.is_running():
                raise ConfigError(
                    "this ToolLedger was opened on an event loop: close it there with "
                    "`await ledger.aclose()` (or leave its `async with` block)"
                )
        runtime, stack, saver = self._take()
        if runtime is not None:
            runtime.close()
        elif stack is not None and saver is not None and saver.loop is not None:
            asyncio.run_coroutine_threadsafe(stack.aclose(), saver.loop).result()

    async def __aenter__(self) -> Self:
        await self.aopen()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def __enter__(self) -> Self:
        self.open()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- the ledger: ForwardedLedger's methods, and the thread's ledger rows ----------------

    # for a thread the checkpointer copied or deleted (it does not know this database): the
    # saver's own methods, over a database with no checkpoint
    acopy_thread = hopping(IdemSaverBase.acopy_thread)
    adelete_thread = hopping(IdemSaverBase.adelete_thread)
