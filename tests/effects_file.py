"""The effects file of the crash workers: one line a side effect, written to disk before
the worker goes on, so a SIGKILL right after an effect never loses it.

The tests count the lines to see whether a call ran once, twice or never; a worker's
``verify`` reads them back to say whether a lost call took effect.
"""

from __future__ import annotations

import os
from pathlib import Path


def effects_of(path: Path) -> list[str]:
    """The effects recorded so far, in order (none if the file does not exist yet)."""
    return path.read_text().splitlines() if path.exists() else []


def record(path: Path, line: str) -> None:
    """Append one effect and fsync it."""
    with path.open("a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())
