"""Shared fixtures: one place that knows which backends exist and how to open a saver.

Every test that needs a checkpointer asks for ``saver_factory`` (or ``saver``), which is
parametrized over :data:`BACKENDS`. Adding the Postgres backend means adding one entry to
``BACKENDS`` and one branch to :func:`open_saver`; every test then runs on it too.

Set ``IDEM_TEST_SAVER=official`` to run the suite against LangGraph's own
``langgraph.checkpoint.sqlite.aio.AsyncSqliteSaver`` (useful to tell a bug in our saver
from a bug in a test: the optional capabilities and our error types are missing there).
"""

from __future__ import annotations

import itertools
import os
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:  # run from a checkout without an editable install
    sys.path.insert(0, str(REPO_ROOT))

# fixtures, and the helper to make fresh schemas
from pg_server import afresh_dsn, pg_dsn, pg_server_dsn, server_tmp_dir  # noqa: E402, F401

# the slow files first, and work stealing between xdist workers (see scheduling.py)
from scheduling import pytest_collection_modifyitems, pytest_xdist_make_scheduler  # noqa: E402, F401

# --- Hypothesis profiles ------------------------------------------------------------
#
# ``ci`` (chosen when the CI environment variable is set, as .ci/run does): derandomized,
# so every run tries the same examples and a red build is red again on a re-run, with
# the reproduction blob printed. ``dev`` (the default locally): random, so local runs
# keep exploring, and failures are replayed from .hypothesis/. ``explore`` (pick it
# with HYPOTHESIS_PROFILE=explore): ten times the examples, random, for a deliberate
# bug hunt. A failure found anywhere is pinned as an ``@example`` of its test.
# Tests state their budget relative to ``settings.default.max_examples``. Each profile
# derives from Hypothesis' own "default" (with CI set, Hypothesis would otherwise start
# from its built-in "ci" profile and derandomize everything).
_BASE = settings.get_profile("default")
settings.register_profile(
    "ci",
    _BASE,
    max_examples=40,
    derandomize=True,
    deadline=None,
    print_blob=True,
    database=None,
)
settings.register_profile("dev", _BASE, max_examples=40, deadline=None, print_blob=True)
settings.register_profile("explore", _BASE, max_examples=400, deadline=None, print_blob=True)
HYPOTHESIS_PROFILE = os.environ.get("HYPOTHESIS_PROFILE") or (
    "ci" if os.environ.get("CI") else "dev"
)
settings.load_profile(HYPOTHESIS_PROFILE)

# The single list of backends: every saver and ledger test runs on each.
BACKENDS: list[str] = ["sqlite", "postgres"]

SAVER_IMPL = os.environ.get("IDEM_TEST_SAVER", "ours")


def sqlite_saver_class() -> Any:
    """The AsyncSqliteSaver class under test."""
    if SAVER_IMPL == "official":
        from langgraph.checkpoint.sqlite.aio import AsyncSqliteSaver
    else:
        from langgraph_idem_saver import AsyncSqliteSaver
    return AsyncSqliteSaver


SaverFactory = Callable[[], AbstractAsyncContextManager[Any]]

_counter = itertools.count()


@asynccontextmanager
async def open_saver(backend: str, where: Any) -> AsyncIterator[Any]:
    """Open a fresh, empty saver of ``backend``; must be entered in the loop that uses it.

    ``where`` is what :func:`backend_resource` gave for the backend: a directory for
    SQLite (each call gets its own new file in it).
    """
    if backend == "sqlite":
        path = Path(where) / f"db-{next(_counter)}.sqlite"
        async with sqlite_saver_class().from_conn_string(str(path)) as saver:
            yield saver
    elif backend == "postgres":
        # `where` is the server's DSN; each saver gets a fresh, empty schema on it
        if SAVER_IMPL == "official":
            from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
        else:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver
        async with AsyncPostgresSaver.from_conn_string(await afresh_dsn(where)) as saver:
            if SAVER_IMPL == "official":
                await saver.setup()
            yield saver
    else:  # pragma: no cover - guarded by BACKENDS
        raise ValueError(f"unknown backend {backend!r}")


def make_factory(backend: str, where: Any) -> SaverFactory:
    """A zero-argument factory of fresh, independent savers (a new database each call)."""

    def factory() -> AbstractAsyncContextManager[Any]:
        return open_saver(backend, where)

    return factory


def backend_resource(backend: str, request: pytest.FixtureRequest) -> Any:
    """What a backend needs to create databases: SQLite a directory (Postgres: a DSN,
    e.g. ``request.getfixturevalue("pg_server_dsn")``)."""
    if backend == "sqlite":
        return request.getfixturevalue("tmp_path")
    if backend == "postgres":
        return request.getfixturevalue("pg_server_dsn")
    raise ValueError(f"unknown backend {backend!r}")  # pragma: no cover


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def saver_factory(backend: str, request: pytest.FixtureRequest) -> SaverFactory:
    """Returns ``factory()``; ``async with factory() as saver`` gives a fresh saver."""
    return make_factory(backend, backend_resource(backend, request))


@pytest.fixture
async def saver(saver_factory: SaverFactory) -> AsyncIterator[Any]:
    async with saver_factory() as s:
        yield s


@pytest.fixture
async def db(backend: str, request: pytest.FixtureRequest) -> Any:
    """A fresh database of ``backend`` as a ``fault_child.Db``: open savers on it as often
    as a test likes (``async with db.open() as saver``) and read or change its rows
    behind their back (``db.query``/``db.execute``, ``?`` placeholders)."""
    from fault_child import Db

    if backend == "sqlite":
        return Db("sqlite", str(request.getfixturevalue("tmp_path") / "db.sqlite"))
    return Db("postgres", await afresh_dsn(request.getfixturevalue("pg_server_dsn")))
