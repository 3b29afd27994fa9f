"""What every part of the CLI shares: exit codes, the one-line error, times and text.

Kept free of any database or rendering import, so each command module can use it.
"""

from __future__ import annotations

import json
import re
import uuid
from datetime import datetime, timedelta, timezone
from typing import Any

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2

ENV_DB = "IDEM_SAVER_DB"
KEY_SHORT = 12
MIN_KEY_PREFIX = 6
MIN_CHECKPOINT_PREFIX = 4
INTERRUPT, ERROR = "__interrupt__", "__error__"
_UUID_EPOCH = datetime(1582, 10, 15, tzinfo=timezone.utc)


class CliError(Exception):
    """A failure reported as one line on stderr with an exit code (no traceback)."""

    def __init__(self, message: str, code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.code = code


def checkpoint_time(checkpoint_id: str | None) -> datetime | None:
    """When a checkpoint was created, read from its id (LangGraph mints UUIDv6 ids, whose
    leading bits are a timestamp); None for ids of another form."""
    if not checkpoint_id:
        return None
    try:
        u = uuid.UUID(checkpoint_id)
    except ValueError:
        return None
    if u.version != 6:
        return None
    h = u.hex
    ticks = int(h[0:12] + h[13:16], 16)  # 100 ns intervals since 1582-10-15
    return _UUID_EPOCH + timedelta(microseconds=ticks // 10)


def from_epoch(value: float | None) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, tz=timezone.utc)


def iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def short_time(value: datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_when(text: str, *, now: datetime | None = None) -> datetime:
    """``2025-01-31``, ``2025-01-31T12:00[:00][+02:00|Z]`` (naive = UTC), or an age such
    as ``30d``, ``12h``, ``90m``, ``2w`` (that long before now)."""
    now = now or datetime.now(timezone.utc)
    if m := _DURATION.match(text):
        return now - timedelta(seconds=float(m.group(1)) * _UNITS[m.group(2)])
    raw = text.strip()
    if raw.endswith(("Z", "z")):
        raw = raw[:-1] + "+00:00"
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise CliError(
            f"bad date {text!r}: use YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS][+HH:MM] (UTC when no "
            "offset) or an age like 30d, 12h, 90m",
            EXIT_USAGE,
        ) from None
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


def short(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def compact_json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=repr)
