"""The ``idem-saver`` argument parser: every command, its options and their help."""

from __future__ import annotations

import argparse
from typing import Any

from langgraph_idem_saver.cli.common import ENV_DB, EXIT_USAGE, MIN_KEY_PREFIX, CliError


class _Parser(argparse.ArgumentParser):
    """argparse that reports errors as one line (exit 2), like the rest of the CLI."""

    def error(self, message: str) -> Any:
        raise CliError(f"{message} (see: {self.prog} --help)", EXIT_USAGE)


# ``resolve``'s outcomes, one of which must be given: flag -> what it tells the ledger.
_SETTLEMENTS = {
    "--completed": "it happened; needs --result",
    "--failed": "it failed; --error says why",
    "--rerun": "it did not happen: run it again",
    "--retry": "a failed call's failure was transient: run again",
}


def build_parser() -> argparse.ArgumentParser:
    common = _Parser(add_help=False)
    common.add_argument(
        "--db",
        default=argparse.SUPPRESS,
        help=f"SQLite file or PostgreSQL DSN (default: ${ENV_DB})",
    )
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON for scripts"
    )

    parser = _Parser(
        prog="idem-saver",
        description="Inspect and maintain langgraph-idem-saver databases (SQLite or "
        "PostgreSQL): threads, checkpoints, the tool-call ledger.",
        epilog="Exit codes: 0 ok, 1 refused or not found, 2 usage or bad input. "
        "More: python -c 'import langgraph_idem_saver.cli as c; help(c)'",
    )
    parser.add_argument("--db", help=f"SQLite file or PostgreSQL DSN (default: ${ENV_DB})")
    parser.add_argument("--json", action="store_true", help="print JSON for scripts")
    from langgraph_idem_saver import __version__

    parser.add_argument("--version", action="version", version=f"idem-saver {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    sub.add_parser(
        "demo",
        help="crash a ReAct agent mid tool batch and resume it; keeps its database "
        "(demo --db PATH, default ./idem-demo.db, overwritten on each run)",
    )
    p = sub.add_parser("threads", parents=[common], help="threads: status, updates, unknowns")
    p.add_argument("--limit", type=int, default=0, help="show the N most recently updated")

    def thread_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("thread", help="thread id")
        p.add_argument("--ns", default="", help="checkpoint namespace (default: root)")

    p = sub.add_parser("history", parents=[common], help="a thread's checkpoints, newest first")
    thread_args(p)
    p.add_argument("--limit", type=int, default=50, help="at most N (default 50; 0 = all)")

    p = sub.add_parser("show", parents=[common], help="a checkpoint's decoded state")
    thread_args(p)
    p.add_argument("--checkpoint", help="checkpoint id or unique prefix (default: latest)")
    p.add_argument("--all", action="store_true", help="include LangGraph's internal channels")

    p = sub.add_parser("diff", parents=[common], help="what changed between two checkpoints")
    thread_args(p)
    p.add_argument("--from", dest="from_", help="older checkpoint (default: parent of --to)")
    p.add_argument("--to", help="newer checkpoint (default: latest)")
    p.add_argument("--all", action="store_true", help="include LangGraph's internal channels")

    p = sub.add_parser("ledger", parents=[common], help="a thread's recorded tool calls")
    p.add_argument("thread", help="thread id")
    p.add_argument(
        "--agent",
        help="only this agent and the agents under it (e.g. 'researcher' also lists "
        "'researcher|tools')",
    )

    p = sub.add_parser("pending", parents=[common], help="unknown outcomes across all threads")
    p.add_argument(
        "--stale",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="also list live claims older than this, with their owner (default 600)",
    )

    p = sub.add_parser(
        "resolve",
        parents=[common],
        help="settle an unknown outcome",
        description="Settle an unknown outcome after checking the outside world.",
    )
    p.add_argument(
        "entry", metavar="ENTRY", help=f"ledger key or unique prefix (>= {MIN_KEY_PREFIX})"
    )
    how = p.add_mutually_exclusive_group(required=True)
    for flag, meaning in _SETTLEMENTS.items():
        how.add_argument(flag, action="store_true", help=meaning)
    p.add_argument(
        "--force",
        action="store_true",
        help="settle a claim whose lease still runs (its process, e.g. on another host, is gone)",
    )
    p.add_argument("--note", help="why, kept in the entry's audit trail")
    p.add_argument("--result", help="the tool's answer, replayed to the model")
    p.add_argument("--error", help="the error replayed to the model")
    p.add_argument("--thread", help="the entry's thread (when its key is in several)")
    p.add_argument(
        "--expect-attempts",
        type=int,
        help="refuse unless the entry is still at this attempt (as shown by --json)",
    )

    p = sub.add_parser(
        "prune",
        parents=[common],
        help="delete old checkpoints (dry run unless --apply)",
        description="Delete old checkpoints; a dry run unless --apply. --keep-latest and "
        "--before keep the latest checkpoint of each namespace and never touch the ledger; "
        "--older-than applies a retention window to whole threads and removes ledger "
        "entries only when nothing can replay them (docs/guarantees.md, Retention).",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--keep-latest", action="store_true", help="keep only the latest (the saver's aprune)"
    )
    what.add_argument(
        "--before",
        metavar="DATE",
        help="delete checkpoints created before DATE (YYYY-MM-DD[THH:MM], UTC; or 30d, 12h)",
    )
    what.add_argument(
        "--older-than",
        metavar="AGE",
        help="threads idle longer than AGE (30d, 12h, 90m, 2w) get --strategy, and ledger "
        "entries nothing can replay any more are removed (the saver's asweep)",
    )
    p.add_argument(
        "--strategy",
        choices=["delete", "keep_latest"],
        default="delete",
        help="with --older-than: delete idle threads (default) or keep their latest checkpoint",
    )
    p.add_argument("--thread", nargs="+", action="extend", metavar="T", help="only these threads")
    p.add_argument("--apply", action="store_true", help="really delete")

    p = sub.add_parser(
        "import-langgraph",
        parents=[common],
        help="copy the threads LangGraph's own saver left in this database into ours",
        description="Copy every thread, checkpoint and pending write from LangGraph's own "
        "checkpoint tables (langgraph-checkpoint-sqlite / -postgres) in the same SQLite file "
        "or Postgres schema into langgraph-idem-saver's tables. Idempotent and resumable: "
        "re-run it after an interruption; a thread is imported whole or not at all. Stop the "
        "application that writes them first. Progress goes to stderr: a bar on a terminal, "
        "a JSON line of counts per batch with --json.",
    )
    p.add_argument(
        "database",
        nargs="?",
        metavar="PATH_OR_DSN",
        help="SQLite file or PostgreSQL DSN (or --db, or $" + ENV_DB + ")",
    )
    p.add_argument("--batch-size", type=int, default=200, help="checkpoints read per round trip")
    p.add_argument(
        "--no-verify", action="store_true", help="skip reading each copy back and comparing"
    )

    sub.add_parser("stats", parents=[common], help="row counts, ledger states, size")
    return parser
