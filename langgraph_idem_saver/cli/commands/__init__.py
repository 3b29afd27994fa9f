"""Every ``idem-saver`` command by name: ``async def cmd(db, args, out) -> exit code``."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable

from langgraph_idem_saver.cli.commands.ledger import cmd_ledger, cmd_pending, cmd_resolve
from langgraph_idem_saver.cli.commands.maintain import cmd_prune, cmd_stats
from langgraph_idem_saver.cli.commands.state import cmd_diff, cmd_history, cmd_show, cmd_threads
from langgraph_idem_saver.cli.database import Db
from langgraph_idem_saver.cli.render import Out

Command = Callable[[Db, argparse.Namespace, Out], Awaitable[int]]

COMMANDS: dict[str, Command] = {
    "threads": cmd_threads,
    "history": cmd_history,
    "show": cmd_show,
    "diff": cmd_diff,
    "ledger": cmd_ledger,
    "pending": cmd_pending,
    "resolve": cmd_resolve,
    "prune": cmd_prune,
    "stats": cmd_stats,
}
WRITE_COMMANDS = {"resolve", "prune"}

__all__ = ["COMMANDS", "WRITE_COMMANDS", "Command"]
