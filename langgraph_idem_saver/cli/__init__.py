"""``idem-saver`` (``python -m langgraph_idem_saver``): look into a database, settle calls.

Point it at a SQLite file or a PostgreSQL DSN with ``--db`` (or ``$IDEM_SAVER_DB``)::

    idem-saver --db app.sqlite threads
    idem-saver --db postgresql://user@host/db pending --json

Commands
--------
``demo [--db PATH]``            the crash-and-resume demonstration; keeps its database
                                (default ./idem-demo.db, overwritten on each run)
``threads``                     every thread: checkpoints, last update, status, unknown outcomes
``history THREAD``              a thread's checkpoints, newest first
``show THREAD [--checkpoint ID]``  the decoded state (messages: role, content, tool calls)
``diff THREAD [--from ID] [--to ID]``  channels added/changed/removed, messages appended
``ledger THREAD [--agent PATH]``  every recorded tool call of the thread (of one agent: the
                                path and every path under it, ``researcher`` holds
                                ``researcher|tools``)
``pending``                     unknown outcomes across all threads
``resolve ENTRY (--completed --result TEXT | --failed [--error TEXT] | --rerun)``
``prune (--keep-latest | --before DATE | --older-than AGE [--strategy S]) [--thread T ...]
[--apply]``  (dry run by default)
``import-langgraph [PATH_OR_DSN] [--batch-size N] [--no-verify]``  (LangGraph's tables in the same
                                database; the database as argument or --db)
``stats``                       row counts, ledger entries by state, size on disk

Checkpoint ids and ledger keys may be abbreviated to a unique prefix (keys: 6+ characters,
as ``ledger``/``pending`` show them).

Thread status (``threads``, ``show``) is read from the latest root checkpoint only, without
the graph: ``interrupted`` when it holds an ``__interrupt__`` write, ``error`` when it holds
an ``__error__`` write, ``pending`` when the channels its step updated trigger a node
(``next`` lists them: LangGraph's ``branch:to:<node>`` channels, ``__start__``, and
pending ``Send``s - named by ``show``, shown as ``(send)`` by ``threads``, which decodes no
channel value) -
i.e. a resume would run something, as after a crash or ``interrupt_before`` - else
``done``. Exact for ``StateGraph`` and ``create_react_agent`` graphs; ``unknown`` when the
checkpoint does not record its updated channels (or cannot be decoded).

Read commands open SQLite read-only (``mode=ro``; ``immutable=1`` when the directory is
not writable, where a WAL database cannot be opened ``mode=ro``) and PostgreSQL sessions
read-only: they never create or change a database, and work on a read-only file or in a
read-only directory. (Like any SQLite reader, a ``mode=ro`` read of a WAL database may
leave the ``-wal``/``-shm`` files SQLite keeps beside it.) Only ``resolve``, ``prune
--apply``, ``prune --older-than`` (its dry run rolls back) and ``import-langgraph`` write.

Exit codes: ``0`` ok; ``1`` refused or not found (missing file, unknown thread, checkpoint
or entry, an entry that is not an unknown outcome or changed, a server that cannot be
reached, a database written by a newer release); ``2`` usage or bad input (bad arguments,
a file that is not an idem-saver database, a malformed DSN, an ambiguous prefix, a bad
date). Errors are one line on stderr, ``idem-saver: error: ...``.

JSON output (``--json``; field names are stable, times are ISO 8601 UTC or null)
--------------------------------------------------------------------------------
* threads: ``{"threads": [{thread_id, checkpoints, subgraph_checkpoints, last_checkpoint_id,
  updated_at, status, next, ledger_entries, unknown_outcomes}]}``; ``checkpoints`` counts
  the root namespace, as ``history`` (``total``) does without ``--ns``;
  ``subgraph_checkpoints`` those of every other namespace
* history: ``{thread_id, checkpoint_ns, total, checkpoints: [{checkpoint_id,
  parent_checkpoint_id, created_at, step, source, pending_writes}]}``
* show: ``{thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, created_at, step,
  source, status, next, channels: {name: value}, pending_writes: [{task_id, channel,
  value}]}``; a message list is a list of ``{index, id, role, content, name, tool_calls:
  [{id, name, args}], tool_call_id, status}``
* diff: ``{thread_id, checkpoint_ns, from, to, added: {name: value}, removed: [name],
  changed: {name: {from, to}}, messages: {channel: {appended, removed, changed}}}``
* ledger / pending: ``{thread_id, agent_path, entries: [entry]}`` / ``{entries: [entry]}``;
  entry: ``{key, key_short, scope, thread_id, agent_path, tool, tool_call_id, args, status,
  state, attempts, replays, conflicts, owner, issued_at, lease_expires_at, finished_at,
  result, error, adopted_by, run_id}``; ``status`` is the stored one (issued, completed,
  failed), ``state`` splits issued into ``unknown`` and ``in_progress``; ``adopted_by`` is
  the call that adopted a lost call's entry, or ``reworded:<id>`` for a reworded call
  only paired with it (``ledger.PAIRED``)
* resolve: ``{key, thread_id, tool, resolution, status}``
* prune: ``{mode, before, applied, threads: [{thread_id, checkpoints, delete_checkpoints,
  delete_writes}], totals: {checkpoints, delete_checkpoints, delete_writes, blobs_deleted}}``
* stats: ``{backend, database, schema_version, threads, checkpoints, blobs, writes,
  ledger: {total, by_status, by_state, replays, conflicts}, size_bytes}``
* import-langgraph: ``{source, checkpoints_total, checkpoints_found, checkpoints_imported,
  checkpoints_present, threads_found, threads_imported, values_written, writes_imported,
  verified, batches, seconds, changed}``; while it runs, one line per batch on stderr:
  ``{"progress": {checkpoints_total, checkpoints_found, checkpoints_imported,
  checkpoints_present, threads_imported, batches}}``
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import sqlite3
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langgraph_idem_saver.cli.common import (
    ENV_DB,
    EXIT_OK,
    EXIT_REFUSED,
    EXIT_USAGE,
    CliError,
    checkpoint_time,
    parse_when,
)
from langgraph_idem_saver.cli.parser import build_parser
from langgraph_idem_saver.cli.render import Out
from langgraph_idem_saver.errors import (
    ConfigError,
    ConnectionClosedError,
    DatabaseLockedError,
    IdemSaverError,
    LedgerStateError,
    NotADatabaseError,
    SchemaVersionError,
)

if TYPE_CHECKING:
    from langgraph_idem_saver.cli.database import is_postgres_target, redact_dsn
    from langgraph_idem_saver.cli.values import diff_messages, head_status

# The commands and the database layer import the savers, the engine and LangGraph's graph
# modules (~0.9 s); ``--help``, ``--version`` and usage errors need none of it, so these
# are imported when a command runs or a name is first asked for (PEP 562).
_LAZY = {
    "is_postgres_target": "langgraph_idem_saver.cli.database",
    "redact_dsn": "langgraph_idem_saver.cli.database",
    "diff_messages": "langgraph_idem_saver.cli.values",
    "head_status": "langgraph_idem_saver.cli.values",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


def _error_code(exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, CliError):
        return exc.code, str(exc)
    if isinstance(exc, (NotADatabaseError, ConfigError)):  # bad input
        return EXIT_USAGE, str(exc)
    if isinstance(exc, LedgerStateError):
        return EXIT_REFUSED, f"refused: {exc}"
    if isinstance(exc, (SchemaVersionError, ConnectionClosedError, DatabaseLockedError)):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, IdemSaverError):
        return EXIT_REFUSED, str(exc)
    if isinstance(exc, sqlite3.Error):
        return EXIT_REFUSED, f"SQLite: {exc}"
    return EXIT_REFUSED, f"{type(exc).__name__}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    """The ``idem-saver`` entry point; returns the exit code."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] == "demo":
        from langgraph_idem_saver.demo import main as demo_main

        return demo_main(args_list[1:])
    try:
        parser = build_parser()
        try:
            args = parser.parse_args(args_list)
        except SystemExit as exc:  # --help / --version
            return int(exc.code or 0)
        if args.command is None:
            parser.print_help()
            return EXIT_USAGE if args_list else EXIT_OK
        if args.command == "demo":  # options before it: the demo's own come after it
            raise CliError(
                "demo takes no option before it: run `idem-saver demo [--db PATH]` (it "
                "overwrites PATH, so it never takes --db or $IDEM_SAVER_DB from the other "
                "commands; and it prints its story, not --json)",
                EXIT_USAGE,
            )
        # import-langgraph also takes it as its argument (as setup()'s warning names it)
        named = getattr(args, "database", None)
        if named and args.db and named != args.db:
            raise CliError(f"two databases given: {named} and --db {args.db}", EXIT_USAGE)
        target = named or args.db or os.environ.get(ENV_DB)
        if not target:
            raise CliError(f"no database: pass --db PATH_OR_DSN or set ${ENV_DB}", EXIT_USAGE)
        if args.command == "resolve":
            if args.completed and args.result is None:
                raise CliError("--completed needs --result TEXT (the tool's answer)", EXIT_USAGE)
            if args.result is not None and not args.completed:
                raise CliError("--result goes with --completed", EXIT_USAGE)
            if args.error is not None and not args.failed:
                raise CliError("--error goes with --failed", EXIT_USAGE)
            if args.force and args.retry:
                raise CliError(
                    "--force settles unknown outcomes; --retry reopens failed calls", EXIT_USAGE
                )
        if args.command in ("history",) and args.limit < 0:
            raise CliError("--limit must be >= 0", EXIT_USAGE)
        out = Out(bool(args.json))
        if args.command == "import-langgraph":
            if args.batch_size < 1:
                raise CliError("--batch-size must be >= 1", EXIT_USAGE)
            from langgraph_idem_saver.cli.commands.adopt import cmd_import_langgraph

            return asyncio.run(cmd_import_langgraph(target, args, out))
        if args.command == "prune" and args.older_than and args.thread:
            raise CliError("--older-than sweeps every thread; it takes no --thread", EXIT_USAGE)
        # a dry run of --older-than counts inside a transaction it rolls back: it writes
        write = args.command == "resolve" or (
            args.command == "prune" and (args.apply or bool(args.older_than))
        )
        return asyncio.run(_run(target, args, out, write=write))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        code, message = _error_code(exc)
        message = " ".join(message.split())
        print(f"idem-saver: error: {message}", file=sys.stderr)
        return code


async def _run(target: str, args: argparse.Namespace, out: Out, *, write: bool) -> int:
    from langgraph_idem_saver.cli.commands import COMMANDS
    from langgraph_idem_saver.cli.database import open_database

    async with open_database(target, write=write) as db:
        return await COMMANDS[args.command](db, args, out)


__all__ = [
    "CliError",
    "build_parser",
    "checkpoint_time",
    "diff_messages",
    "head_status",
    "is_postgres_target",
    "main",
    "parse_when",
    "redact_dsn",
]
