"""tests/scheduling.py: the slow files run first, and xdist's workers steal work."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from scheduling import SLOW_FILES, pytest_collection_modifyitems, pytest_xdist_make_scheduler

TESTS_DIR = Path(__file__).resolve().parent


def test_every_slow_file_exists() -> None:
    """A renamed file would silently drop out of the list."""
    assert [name for name in SLOW_FILES if not (TESTS_DIR / name).is_file()] == []
    assert len(set(SLOW_FILES)) == len(SLOW_FILES)


class Item:
    def __init__(self, name: str, test: str) -> None:
        self.path = TESTS_DIR / name
        self.nodeid = f"tests/{name}::{test}"


def test_slow_files_move_to_the_front_whole_and_the_rest_keeps_its_order() -> None:
    names = ["test_a.py", SLOW_FILES[1], "test_b.py", SLOW_FILES[0], SLOW_FILES[1], "test_c.py"]
    items: list[Any] = [Item(name, f"t{i}") for i, name in enumerate(names)]
    pytest_collection_modifyitems(items)
    assert [item.nodeid.rsplit("::", 1)[1] for item in items] == [
        "t3",
        "t1",
        "t4",
        "t0",
        "t2",
        "t5",
    ]


class Config:
    def __init__(self, dist: str) -> None:
        self.dist = dist

    def getvalue(self, name: str) -> Any:
        return {"dist": self.dist, "tx": ["popen", "popen"]}[name]


@pytest.mark.parametrize("dist", ["load", "loadfile", "each", "worksteal"])
def test_the_default_distribution_steals_work_and_an_explicit_one_is_kept(dist: str) -> None:
    from xdist.scheduler import WorkStealingScheduling

    class Log:
        def __getattr__(self, name: str) -> Any:
            return self

        def __call__(self, *args: Any) -> None:
            return None

    scheduler = pytest_xdist_make_scheduler(Config(dist), Log())  # type: ignore[arg-type]
    if dist == "load":
        assert isinstance(scheduler, WorkStealingScheduling)
    else:
        assert scheduler is None
