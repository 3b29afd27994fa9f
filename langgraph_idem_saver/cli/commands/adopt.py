"""``import-langgraph``: copy the threads LangGraph's own saver left in the same database.

Unlike every other command it may create our tables (that is its point), so it opens the
database as a saver would (``from_conn_string``, then ``setup()``) rather than through
:func:`~langgraph_idem_saver.cli.database.open_database`, which refuses a database
without them. The file must exist: importing from nothing is a typo, not a request.
The database is named as ``setup()``'s warning names it (``idem-saver import-langgraph
PATH``) or with ``--db`` like every other command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from langgraph_idem_saver.cli.common import EXIT_OK, EXIT_USAGE, CliError
from langgraph_idem_saver.cli.database import is_postgres_target
from langgraph_idem_saver.cli.render import Out
from langgraph_idem_saver.import_rows import ImportReport


@contextlib.asynccontextmanager
async def open_for_import(target: str) -> AsyncIterator[Any]:
    """Our saver over ``target`` (a SQLite file that exists, or a PostgreSQL DSN)."""
    if is_postgres_target(target):
        try:
            from langgraph_idem_saver.postgres import AsyncPostgresSaver
        except ImportError:
            raise CliError(
                "PostgreSQL needs the postgres extra: pip install 'langgraph-idem-saver[postgres]'"
            ) from None
        async with AsyncPostgresSaver.from_conn_string(target) as saver:
            yield saver
        return
    from langgraph_idem_saver.sqlite import AsyncSqliteSaver

    path = Path(target).expanduser()
    if not path.is_file():
        raise CliError(f"no such database file: {target} (nothing to import)", EXIT_USAGE)
    async with AsyncSqliteSaver.from_conn_string(str(path)) as saver:
        yield saver


async def cmd_import_langgraph(target: str, args: argparse.Namespace, out: Out) -> int:
    with import_progress(out.as_json) as progress:
        async with open_for_import(target) as saver:
            report = await saver.aimport_langgraph(
                batch_size=args.batch_size, verify=not args.no_verify, progress=progress
            )
    if out.as_json:
        doc = {k: v for k, v in vars(report).items() if not k.startswith("_")}
        out.json({**doc, "changed": report.changed})
        return EXIT_OK
    out.line(str(report))
    if report.source != "none" and not report.changed:
        out.line("nothing new: every checkpoint was already imported")
    return EXIT_OK


@contextlib.contextmanager
def import_progress(as_json: bool) -> Iterator[Callable[[ImportReport], None] | None]:
    """How an import shows its progress on stderr (stdout keeps the report): with
    ``--json``, one JSON object of counts per batch (one line each); on a terminal, a
    rich progress bar over the checkpoints; otherwise nothing."""
    if as_json:

        def counts(report: ImportReport) -> None:
            doc = {name: getattr(report, name) for name in PROGRESS_FIELDS}
            print(json.dumps({"progress": doc}), file=sys.stderr, flush=True)

        yield counts
        return
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        transient=True,
    ) as bar:
        task = bar.add_task("importing checkpoints", total=None)

        def advance(report: ImportReport) -> None:
            bar.update(task, completed=report.checkpoints_found, total=report.checkpoints_total)

        yield advance


# the counts ``--json`` prints after each batch
PROGRESS_FIELDS = (
    "checkpoints_total",
    "checkpoints_found",
    "checkpoints_imported",
    "checkpoints_present",
    "threads_imported",
    "batches",
)
