"""``python -m langgraph_idem_saver`` / ``idem-saver``: the command line.

``demo [--db PATH]`` runs the crash-and-resume demonstration (keeping its database,
``./idem-demo.db`` by default, for the other commands to inspect); every other command
inspects or maintains a database (see :mod:`langgraph_idem_saver.cli`).
"""

from __future__ import annotations

from langgraph_idem_saver.cli import main

__all__ = ["main"]

if __name__ == "__main__":
    raise SystemExit(main())
