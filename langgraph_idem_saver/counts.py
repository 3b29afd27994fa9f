"""Named counters reported as one dict: the base of the engine's, the ledger's and a
retention sweep's counts."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


@dataclass
class Counts:
    """Counters kept as dataclass fields. ``as_dict`` reports every public field (logs,
    ``--json`` output, benchmarks), so a counter added to a subclass is reported without
    a second list of names to keep in step."""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
