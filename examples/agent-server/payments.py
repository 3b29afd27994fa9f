"""A stand-in payment provider: each charge is one line of a file, synced to disk.

``charge`` is the side effect the ledger protects; ``find`` is how the agent's ``verify``
hook asks the provider whether a charge happened (a real provider: look the charge up by
its idempotency key). The file is ``$PAYMENTS_FILE``, by default ``payments.log`` beside
this module.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent


def ledger_file() -> Path:
    """Where the charges are written."""
    return Path(os.environ.get("PAYMENTS_FILE") or HERE / "payments.log")


def charge(invoice: str, amount: int) -> str:
    """Charge ``invoice`` (append one line and sync it: it has happened)."""
    with ledger_file().open("a") as f:
        f.write(f"{invoice} {amount}\n")
        f.flush()
        os.fsync(f.fileno())
    return f"charged {invoice} ${amount}"


def find(invoice: str) -> str | None:
    """The charge of ``invoice`` as ``charge`` reported it, or None if there is none."""
    path = ledger_file()
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        name, _, amount = line.partition(" ")
        if name == invoice:
            return f"charged {invoice} ${amount}"
    return None
