"""Output for people (rich tables, one line of text) and for scripts (``--json``).

Rich is imported on first use: ``--json`` and error paths never pay for it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from langgraph_idem_saver.cli.common import compact_json, short, short_time

if TYPE_CHECKING:
    from rich.console import Console

PIPE_WIDTH = 160
STATE_STYLE = {"unknown": "UNKNOWN", "in_progress": "in progress"}


class Out:
    """Where a command writes: JSON for scripts, rich tables for people."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self._console: Console | None = None

    @property
    def console(self) -> Console:
        if self._console is None:
            from rich.console import Console

            width = None  # a terminal's own width; piped output is not cut at 80 columns
            if not sys.stdout.isatty():
                width = int(os.environ.get("COLUMNS") or 0) or PIPE_WIDTH
            self._console = Console(file=sys.stdout, highlight=False, soft_wrap=False, width=width)
        return self._console

    def json(self, value: Any) -> None:
        sys.stdout.write(json.dumps(value, indent=2, ensure_ascii=False, default=repr) + "\n")

    def table(
        self, title: str | None, columns: Sequence[str], rows: Iterable[Sequence[Any]]
    ) -> None:
        from rich.table import Table

        table = Table(title=title, title_justify="left", show_lines=False)
        for name in columns:
            no_wrap = name in ("key", "checkpoint", "status", "state", "created (UTC)")
            table.add_column(name, no_wrap=no_wrap, overflow="fold")
        for row in rows:
            table.add_row(*("-" if v is None else str(v) for v in row))
        self.console.print(table)

    def line(self, text: str) -> None:
        self.console.print(text, markup=False)


def tool_calls_text(m: dict[str, Any]) -> str:
    return "\n".join(f"{c['name']}({compact_json(c['args'])}) [{c['id']}]" for c in m["tool_calls"])


def render_messages(out: Out, title: str, messages: list[dict[str, Any]]) -> None:
    rows = []
    for m in messages:
        extra = tool_calls_text(m)
        if m["role"] == "tool":
            extra = f"{m['name'] or ''} [{m['tool_call_id']}]" + (
                f" {m['status']}" if m["status"] and m["status"] != "success" else ""
            )
        rows.append([m["index"], m["role"], short(m["content"], 2000), extra])
    out.table(title, ["#", "role", "content", "tool calls / call id"], rows)


def ledger_rows(entries: list[dict[str, Any]], with_thread: bool) -> Iterable[list[Any]]:
    for e in entries:
        outcome = e["error"] if e["state"] == "failed" else e["result"]
        row = [
            e["key_short"],
            STATE_STYLE.get(e["state"], e["state"]),
            e["tool"],
            e["agent_path"] or "",
            short(compact_json(e["args"]), 60),
            short_time(datetime.fromisoformat(e["issued_at"])),
            short_time(datetime.fromisoformat(e["finished_at"])) if e["finished_at"] else "",
            e["attempts"],
            e["replays"],
            "" if outcome is None else short(str(outcome), 60),
        ]
        if with_thread:
            row.insert(1, e["thread_id"])
        yield row


LEDGER_COLUMNS = [
    "key",
    "state",
    "tool",
    "agent",
    "args",
    "issued (UTC)",
    "finished",
    "att",
    "rpl",
    "result / error",
]


def human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"  # pragma: no cover
