"""LangGraph's official checkpointer conformance suite, wired into pytest.

Two views of the same 81 spec functions (58 base + 23 optional):

* ``test_conformance_suite`` runs the whole suite through the package's own runner
  (``checkpointer_test`` + ``validate``), prints a per-capability count and asserts every
  capability was detected and passed;
* ``test_conformance_case`` runs each spec function as its own pytest test on a fresh
  saver, so a failure names the spec function and shows its assertion.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.capabilities import (
    ALL_CAPABILITIES,
    BASE_CAPABILITIES,
    EXTENDED_CAPABILITIES,
    Capability,
)
from langgraph.checkpoint.conformance.report import ProgressCallbacks
from langgraph.checkpoint.conformance.spec import (
    test_copy_thread,
    test_delete_for_runs,
    test_delete_thread,
    test_get_tuple,
    test_list,
    test_prune,
    test_put,
    test_put_writes,
)

SPEC_CASES: dict[Capability, list[Any]] = {
    Capability.PUT: test_put.ALL_PUT_TESTS,
    Capability.PUT_WRITES: test_put_writes.ALL_PUT_WRITES_TESTS,
    Capability.GET_TUPLE: test_get_tuple.ALL_GET_TUPLE_TESTS,
    Capability.LIST: test_list.ALL_LIST_TESTS,
    Capability.DELETE_THREAD: test_delete_thread.ALL_DELETE_THREAD_TESTS,
    Capability.DELETE_FOR_RUNS: test_delete_for_runs.ALL_DELETE_FOR_RUNS_TESTS,
    Capability.COPY_THREAD: test_copy_thread.ALL_COPY_THREAD_TESTS,
    Capability.PRUNE: test_prune.ALL_PRUNE_TESTS,
}
CASES = [(cap, fn) for cap, fns in SPEC_CASES.items() for fn in fns]

EXPECTED_BASE = 58
EXPECTED_OPTIONAL = 23
EXPECTED_TOTAL = EXPECTED_BASE + EXPECTED_OPTIONAL


def test_spec_has_81_cases() -> None:
    """The suite we run cannot silently shrink (e.g. a renamed list or a dropped module)."""
    assert set(SPEC_CASES) == set(ALL_CAPABILITIES)
    base = sum(len(SPEC_CASES[c]) for c in BASE_CAPABILITIES)
    optional = sum(len(SPEC_CASES[c]) for c in EXTENDED_CAPABILITIES)
    assert (base, optional) == (EXPECTED_BASE, EXPECTED_OPTIONAL)
    assert len(CASES) == EXPECTED_TOTAL
    assert len({fn.__name__ for _, fn in CASES}) == EXPECTED_TOTAL


async def test_conformance_suite(saver_factory: Any, backend: str) -> None:
    """The official runner: every capability detected, 81/81 passed."""

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
    for cap, fns in SPEC_CASES.items():
        assert passed[cap.value] == len(fns), cap
    assert sum(passed.values()) == EXPECTED_TOTAL


@pytest.mark.parametrize(("capability", "spec_fn"), CASES, ids=[f.__name__ for _, f in CASES])
async def test_conformance_case(saver_factory: Any, capability: Capability, spec_fn: Any) -> None:
    """One spec function on a fresh saver."""
    async with saver_factory() as saver:
        await spec_fn(saver)
