"""How ``pytest -n 2`` hands the tests to its workers (hooks that ``conftest.py`` imports).

The tests' durations are very uneven: most take well under a second, a few files hold
tests of 5-35 s (a notebook that starts 16 worker processes, a ``langgraph dev`` server
killed and restarted, a PostgreSQL server killed under load). Two things keep a run from
ending with one worker busy on such a test while the other waits:

* :func:`pytest_collection_modifyitems` moves the files of :data:`SLOW_FILES` to the
  front, whole (their module fixtures are set up once), slowest first; every other test
  keeps its place;
* :func:`pytest_xdist_make_scheduler` makes xdist's default distribution (``load``)
  *work stealing*: each worker starts with half of the tests and, once done, takes half
  of what the other has not started yet - the long tests are started early and the run
  ends on short ones. An explicit other ``--dist`` is left as asked.

Neither changes what any test does; without xdist (``-p no:xdist``, ``-n 0``) only the
order of the files changes.
"""

from __future__ import annotations

from typing import Any

import pytest

SLOW_FILES: tuple[str, ...] = (
    "test_notebooks.py",
    "test_agent_server.py",
    "test_db_restart.py",
    "test_cli.py",
    "test_ledger_beside_server.py",
    "test_saver_model.py",
    "test_bad_paths.py",
    "test_nothing_left_running.py",
    "test_pg_sync_drop_database.py",
    "test_torture.py",
    "test_fuzz_sql_inputs.py",
    "test_postgres_specific.py",
)
"""Files with tests of several seconds each, the slowest first (measured with
``pytest --durations=0``; update when a file's tests grow or shrink)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(SLOW_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: keeps order


@pytest.hookimpl(optionalhook=True, tryfirst=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import WorkStealingScheduling

    return WorkStealingScheduling(config, log)
