"""The effects file of the crash workers: one line a side effect, written to disk before
the worker goes on, so a SIGKILL right after an effect never loses it.

The tests count the lines to see whether a call ran once, twice or never; a worker's
``verify`` reads them back to say whether a lost call took effect (:func:`verify_charge`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph_idem_saver import NOT_APPLIED


def effects_of(path: Path) -> list[str]:
    """The effects recorded so far, in order (none if the file does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []


def record(path: Path, line: str) -> None:
    """Append one effect and fsync it."""
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def verify_charge(effects: Path) -> Callable[[dict[str, Any]], Any]:
    """A ``verify`` hook for ``charge(invoice=...)`` whose effect is the line ``invoice``:
    "charged <invoice>" once the file holds that line, else ``NOT_APPLIED``."""

    def verify(args: dict[str, Any]) -> Any:
        invoice = args["invoice"]
        return f"charged {invoice}" if invoice in effects_of(effects) else NOT_APPLIED

    return verify
