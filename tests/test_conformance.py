"""LangGraph's official checkpointer conformance suite, wired into pytest.

Two views of the same spec functions - 81 in ``langgraph-checkpoint-conformance`` 0.0.2
(58 base + 23 optional); releases that add the ``delta_channel_history`` group (LangGraph's
repository has it: 89 with 8 in the group) add them, and they run too:

* ``test_conformance_suite`` runs the whole suite through the package's own runner
  (``checkpointer_test`` + ``validate``), prints a per-capability count and asserts every
  capability was detected and passed;
* ``test_conformance_case`` runs each spec function as its own pytest test on a fresh
  saver, so a failure names the spec function and shows its assertion.

The groups are found by the suite's own naming (``spec.test_<capability>`` holds
``ALL_<CAPABILITY>_TESTS``) for every capability the installed release lists, so a group
the release adds is run without a change here; :func:`check_sizes` keeps the suite from
silently shrinking.
"""

from __future__ import annotations

import importlib
from collections import Counter
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    Capability,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks

SPEC_PACKAGE = "langgraph.checkpoint.conformance.spec"

EXPECTED_BASE = 58
"""put, put_writes, get_tuple, list, delete_thread: as in 0.0.2."""
EXPECTED_OPTIONAL = 23
"""delete_for_runs, copy_thread, prune: as in 0.0.2."""
OPTIONAL_OF_0_0_2 = frozenset({"delete_for_runs", "copy_thread", "prune"})
DELTA_HISTORY = "delta_channel_history"
DELTA_HISTORY_AT_LEAST = 8
"""The group's size when it first appeared in LangGraph's repository (81 + 8 = 89)."""


def discover(
    capabilities: Iterable[Any], load: Callable[[str], ModuleType]
) -> dict[str, list[Any]]:
    """``{capability value: its spec functions}`` for every capability listed."""
    groups: dict[str, list[Any]] = {}
    for cap in capabilities:
        module = load(f"{SPEC_PACKAGE}.test_{cap.value}")
        cases = getattr(module, f"ALL_{cap.name}_TESTS", None)
        assert cases, f"no ALL_{cap.name}_TESTS in {module.__name__}: the suite's layout moved"
        groups[cap.value] = list(cases)
    return groups


def check_sizes(groups: dict[str, list[Any]], base: Iterable[str]) -> int:
    """The suite's size, after checking no group of 0.0.2 shrank and the
    ``delta_channel_history`` group, when present, is whole; returns the total."""
    base = set(base)
    sizes = {cap: len(cases) for cap, cases in groups.items()}
    assert sum(sizes[c] for c in base) == EXPECTED_BASE, sizes
    assert sum(sizes.get(c, 0) for c in OPTIONAL_OF_0_0_2) == EXPECTED_OPTIONAL, sizes
    if DELTA_HISTORY in sizes:
        assert sizes[DELTA_HISTORY] >= DELTA_HISTORY_AT_LEAST, sizes
    names = [fn.__name__ for cases in groups.values() for fn in cases]
    assert len(set(names)) == len(names), "a spec function listed twice"
    return len(names)


SPEC_CASES = discover(Capability, importlib.import_module)
CASES = [(cap, fn) for cap, fns in SPEC_CASES.items() for fn in fns]
SUITE_SIZE = check_sizes(SPEC_CASES, (c.value for c in BASE_CAPABILITIES))


def test_the_suite_is_whole() -> None:
    """The suite we run cannot silently shrink (e.g. a renamed list or a dropped module):
    81 cases, or more with the groups a later release adds."""
    assert set(SPEC_CASES) == {c.value for c in ALL_CAPABILITIES}
    assert len(CASES) == SUITE_SIZE >= EXPECTED_BASE + EXPECTED_OPTIONAL


def release_with_delta_history(size: int) -> tuple[list[Any], Callable[[str], ModuleType]]:
    """The installed release's capabilities and spec modules plus a
    ``delta_channel_history`` group of ``size`` cases, as LangGraph's repository has it."""
    listed: list[Any] = [
        *Capability,
        type("Cap", (), {"name": "DELTA_CHANNEL_HISTORY", "value": DELTA_HISTORY})(),
    ]
    group = ModuleType(f"{SPEC_PACKAGE}.test_{DELTA_HISTORY}")

    def make_case(i: int) -> Callable[[Any], Any]:
        async def case(saver: Any) -> None:  # pragma: no cover - collected, not run here
            pass

        case.__name__ = f"test_history_{i}"
        return case

    group.ALL_DELTA_CHANNEL_HISTORY_TESTS = [make_case(i) for i in range(size)]  # type: ignore[attr-defined]

    def load(name: str) -> ModuleType:
        return group if name == group.__name__ else importlib.import_module(name)

    return listed, load


@pytest.mark.parametrize(("size", "total"), [(8, 89), (10, 91)])
def test_a_release_with_the_delta_history_group_is_accepted_and_its_cases_run(
    size: int, total: int
) -> None:
    listed, load = release_with_delta_history(size)
    groups = discover(listed, load)
    assert check_sizes(groups, (c.value for c in BASE_CAPABILITIES)) == total
    assert len(groups[DELTA_HISTORY]) == size, "the group's cases are collected to run"


def test_a_shrunk_suite_is_refused() -> None:
    listed, load = release_with_delta_history(DELTA_HISTORY_AT_LEAST - 1)
    with pytest.raises(AssertionError):
        check_sizes(discover(listed, load), (c.value for c in BASE_CAPABILITIES))
    groups = {**SPEC_CASES, "prune": SPEC_CASES["prune"][:-1]}
    with pytest.raises(AssertionError):
        check_sizes(groups, (c.value for c in BASE_CAPABILITIES))


async def test_conformance_suite(saver_factory: Any, backend: str) -> None:
    """The official runner: every capability detected, every case passed."""

    async def factory() -> Any:
        async with saver_factory() as saver:
            yield saver

    registered = checkpointer_test(name=f"idem-saver-{backend}")(factory)
    results: list[tuple[str, str, bool, str | None]] = []
    report = await validate(
        registered,
        progress=ProgressCallbacks(
            on_test_result=lambda cap, name, ok, err: results.append((cap, name, ok, err))
        ),
    )

    passed = Counter(cap for cap, _, ok, _ in results if ok)
    failed = Counter(cap for cap, _, ok, _ in results if not ok)
    print(f"\nconformance [{backend}]")
    for cap in Capability:
        r = report.results[cap.value]
        print(
            f"  {cap.value:16s} detected={r.detected!s:5s} "
            f"passed={r.tests_passed:2d} failed={r.tests_failed:2d}"
        )
    print(f"  total passed={sum(passed.values())} failed={sum(failed.values())}")

    undetected = sorted(c.value for c in Capability if not report.results[c.value].detected)
    assert undetected == [], f"capabilities not implemented: {undetected}"
    failures = [f"{cap}.{name}:\n{err}" for cap, name, ok, err in results if not ok]
    assert failures == [], "\n\n".join(failures)
    assert report.conformance_level() == "FULL"
    for group, fns in SPEC_CASES.items():
        assert passed[group] == len(fns), group
    assert sum(passed.values()) == SUITE_SIZE


@pytest.mark.parametrize(("capability", "spec_fn"), CASES, ids=[f.__name__ for _, f in CASES])
async def test_conformance_case(saver_factory: Any, capability: str, spec_fn: Any) -> None:
    """One spec function on a fresh saver."""
    async with saver_factory() as saver:
        await spec_fn(saver)
