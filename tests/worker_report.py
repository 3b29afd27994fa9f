"""``report``: how a scenario worker (``fork_worker.py``, ``earlier_call_worker.py``) runs.

It ends itself with the test that started it (``process_guard.exit_with_parent``), runs
the JSON scenario of ``argv[1]`` and prints one JSON line: the run's payload with the
worker's pid, exit code 0; or ``{"ok": false, "error", "traceback"}`` with exit code
:data:`resume_worker.FAILED_EXIT_CODE` when the run raised, so a test tells a failed run
from a killed one (``CRASH_EXIT_CODE`` or a signal).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import traceback
from collections.abc import Callable, Coroutine
from typing import Any

from resume_worker import FAILED_EXIT_CODE

Run = Callable[[dict[str, Any]], Coroutine[Any, Any, dict[str, Any]]]


def report(run: Run) -> None:
    """Run ``run(scenario)`` and print its one line (see the module's docstring); first
    make sure the worker never outlives the test that started it (tests/process_guard.py)."""
    from process_guard import exit_with_parent

    exit_with_parent()
    try:
        payload = asyncio.run(run(json.loads(sys.argv[1])))
    except Exception as exc:
        payload = {"ok": False, "error": type(exc).__name__, "traceback": traceback.format_exc()}
        print(json.dumps(payload), flush=True)
        sys.exit(FAILED_EXIT_CODE)
    print(json.dumps({**payload, "pid": os.getpid()}), flush=True)
