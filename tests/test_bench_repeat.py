"""``bench.py --repeat N`` (benchmarks/repeat.py): each child run gets the benchmark's own
options but never ``--repeat`` again (a child that repeated would start children of its
own) nor the parent's ``--json``, and the summary is the median and range of the runs'
same-run ratios."""

from __future__ import annotations

import json
import statistics
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"


@pytest.fixture(scope="module")
def repeat() -> Any:
    sys.path.insert(0, str(BENCHMARKS))  # the benchmarks import each other by module name
    try:
        import repeat as module  # type: ignore[import-not-found]

        return module
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--only", "ledger", "--repeat", "9"], ["--only", "ledger"]),
        (["--repeat=3", "--quick", "--json", "out.json"], ["--quick"]),
        (["--json=out.json", "--configs", "sqlite", "--repeat", "2"], ["--configs", "sqlite"]),
        (["--quick"], ["--quick"]),
    ],
)
def test_a_child_run_gets_every_option_but_repeat_and_json(
    repeat: Any, argv: list[str], expected: list[str]
) -> None:
    assert repeat.child_argv(argv) == expected


def _row(config: str, key: str, official: float, ours: float, **more: float) -> dict[str, Any]:
    return {
        "config": config,
        "key": key,
        "title": key.replace("_", " "),
        "median_us": {"official": official, "ours": ours, **more},
        "ratio": official / ours,
    }


def test_the_summary_is_the_median_and_range_of_the_runs_ratios(repeat: Any) -> None:
    runs = [
        {
            "rows": [
                _row("sqlite", "aput", 100, 50),
                _row("sqlite", "tool_step_50", 400, 500, **{"ours+stock": 350}),
            ],
            "ledger_floors_us": {"sqlite": {"1": 600.0, "50": 2000.0}},  # JSON: text keys
        },
        {
            "rows": [
                _row("sqlite", "aput", 100, 80),
                _row("sqlite", "tool_step_50", 400, 420, **{"ours+stock": 360}),
            ],
            "ledger_floors_us": {"sqlite": {"1": 600.0, "50": 2500.0}},
        },
        {
            "rows": [
                _row("sqlite", "aput", 100, 40),
                _row("sqlite", "tool_step_50", 400, 450, **{"ours+stock": 355}),
            ],
            "ledger_floors_us": {"sqlite": {"1": 600.0, "50": 1500.0}},
        },
    ]
    lines = repeat.summary_lines(runs)
    assert lines[0].startswith("3 runs, each in a fresh process")
    aput, step = lines[1], lines[2]
    assert aput.startswith("sqlite") and "aput" in aput
    assert "2.00x [1.25–2.50]" in aput  # ratios 2.0, 1.25, 2.5
    assert "ledger" not in aput and "at the floor" not in aput
    ratios = [400 / 500, 400 / 420, 400 / 450]
    assert f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}–{max(ratios):.2f}]" in step
    assert "ledger +95 µs [+60–+150] a call" in step  # 150, 60, 95
    floors = [400 / (350 + 40), 400 / (360 + 50), 400 / (355 + 30)]
    best = f"{statistics.median(floors):.2f}x [{min(floors):.2f}–{max(floors):.2f}]"
    assert f"at the floor {best}" in step


def test_runs_each_child_in_a_process_of_its_own_and_summarizes_them(
    repeat: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A stand-in for bench.py: it records the options it got and writes one row."""
    seen = tmp_path / "argv.jsonl"
    child = tmp_path / "child.py"
    child.write_text(
        textwrap.dedent(
            f"""
            import json, os, sys
            argv = sys.argv[1:]
            with open({str(seen)!r}, "a") as f:
                f.write(json.dumps([os.getpid(), argv]) + "\\n")
            out = argv[argv.index("--json") + 1]
            n = sum(1 for _ in open({str(seen)!r}))
            row = {{"config": "sqlite", "key": "aput", "title": "aput",
                    "median_us": {{"official": 100, "ours": 100 / n}}, "ratio": n}}
            json.dump({{"rows": [row]}}, open(out, "w"))
            """
        )
    )
    out = tmp_path / "summary.json"
    argv = ["--only", "aput", "--repeat", "3", "--json", str(out)]
    assert repeat.run_repeated(str(child), argv, 3, str(out)) == 0

    calls = [json.loads(line) for line in seen.read_text().splitlines()]
    assert len(calls) == 3
    assert len({pid for pid, _ in calls}) == 3  # a fresh process each
    for _, child_argv in calls:
        assert child_argv[:2] == ["--only", "aput"]
        assert "--repeat" not in child_argv
        assert child_argv[2] == "--json" and child_argv[3] != str(out)
    assert "2.00x [1.00–3.00]" in capsys.readouterr().out
    written = json.loads(out.read_text())
    assert len(written["runs"]) == 3 and written["summary"][1].endswith("2.00x [1.00–3.00]")


def test_a_failed_run_stops_the_series_with_its_exit_code(repeat: Any, tmp_path: Path) -> None:
    child = tmp_path / "child.py"
    child.write_text("import sys\nsys.exit(3)\n")
    assert repeat.run_repeated(str(child), ["--repeat", "2"], 2, None) == 3
