"""Repeated runs: the same rows in N fresh processes, and each ratio's median and range.

One run's ratio of a row bound by fsync or by the event loop moves by ±5-10% on the
2-core VM this project runs on: the 50-call tool step's ratio took every value from
0.84x to 1.01x in eleven runs of the same code on one day. A target of 0.9x then lands
on either side by chance. ``bench.py --repeat N`` runs the benchmark N times, each in a
process of its own (no heap, cache or server state carried over from one run to the
next), lets each print its tables as usual, then prints per row the median of the N
same-run ratios and their range: the figure to judge a target by. For the tool-step
rows it also gives the ledger (ours - ours+stock) and the ratio a ledger at its floor
would give (``ledger_floor.py``), each as a median over the runs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Any

from ledger_floor import TOOL_STEP_CALLS, ratio_at_floor

# options each child run must not get: the repeat itself, and the JSON file (each child
# writes its own, read back here)
_OWN_OPTIONS = ("--repeat", "--json")


def child_argv(argv: list[str]) -> list[str]:
    """``argv`` without ``--repeat N`` and ``--json PATH`` (either spelling)."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in _OWN_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in _OWN_OPTIONS)):
            out.append(arg)
    return out


def run_repeated(script: str, argv: list[str], n: int, json_path: str | None) -> int:
    """Run ``script`` with ``argv`` ``n`` times, each in a new process, then summarize."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="idem-bench-repeat-") as tmp:
        for i in range(n):
            print(f"\n=== run {i + 1} of {n} ===", flush=True)
            path = os.path.join(tmp, f"run{i}.json")
            done = subprocess.run([sys.executable, script, *child_argv(argv), "--json", path])
            if done.returncode != 0:
                print(f"run {i + 1} failed (exit {done.returncode})", file=sys.stderr)
                return done.returncode
            with open(path, encoding="utf-8") as f:
                runs.append(json.load(f))
    lines = summary_lines(runs)
    print("\n" + "\n".join(lines))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump({"runs": runs, "summary": lines}, f, indent=1)
        print(f"wrote {json_path}")
    return 0


def _span(values: list[float], fmt: str, unit: str) -> str:
    """``median [min–max]`` of ``values``, each formatted with ``fmt``."""
    return (
        f"{format(statistics.median(values), fmt)}{unit} "
        f"[{format(min(values), fmt)}–{format(max(values), fmt)}]"
    )


def summary_lines(runs: list[dict[str, Any]]) -> list[str]:
    """Per row (in the first run's order): its ratio over the runs, and for the tool-step
    rows the ledger a call and the ratio at the ledger's floor."""
    by_row: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    at_floor: dict[tuple[str, str, str], list[float]] = {}
    for run in runs:
        floors = run.get("ledger_floors_us", {})
        for row in run["rows"]:
            where = (row["config"], row.get("state", ""), row["title"])
            by_row.setdefault(where, []).append(row)
            calls = TOOL_STEP_CALLS.get(row["key"])
            floor = floors.get(row["config"], {}).get(str(calls))  # JSON: keys are text
            if calls is not None and floor is not None:
                medians = row["median_us"]
                best = ratio_at_floor(medians["official"], medians["ours+stock"], floor, calls)
                at_floor.setdefault(where, []).append(best)
    if not by_row:
        return ["no timed rows in these runs"]
    width = max(len(title) for _, _, title in by_row)
    sw = max(len(state) for _, state, _ in by_row)
    lines = [
        f"{len(runs)} runs, each in a fresh process: ratio official / ours, the median of "
        "the runs' ratios [lowest–highest]"
    ]
    for (config, state, title), rows in by_row.items():
        ratios = _span([r["ratio"] for r in rows], ".2f", "x")
        line = f"{config:<8} {state:<{sw}} {title:<{width}} {ratios}"
        medians = [r["median_us"] for r in rows if "ours+stock" in r["median_us"]]
        if medians:
            ledger = [m["ours"] - m["ours+stock"] for m in medians]
            line += f"  ledger {_span(ledger, '+,.0f', ' µs')} a call"
        if (config, state, title) in at_floor:
            line += f"  at the floor {_span(at_floor[config, state, title], '.2f', 'x')}"
        lines.append(line)
    return lines
