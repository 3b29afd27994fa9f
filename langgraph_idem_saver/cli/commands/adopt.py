"""``import-langgraph``: copy the threads LangGraph's own saver left in the same database.

Unlike every other command it may create our tables (that is its point), so it opens the
database as a saver would (``from_conn_string``, then ``setup()``) rather than through
:func:`~langgraph_idem_saver.cli.database.open_database`, which refuses a database
without them. The file must exist: importing from nothing is a typo, not a request.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from langgraph_idem_saver.cli.common import EXIT_OK, EXIT_USAGE, CliError
from langgraph_idem_saver.cli.database import is_postgres_target
from langgraph_idem_saver.cli.render import Out
from langgraph_idem_saver.import_langgraph import ImportReport


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
    def progress(report: ImportReport) -> None:
        if sys.stderr.isatty() and not out.as_json:
            print(
                f"  ... {report.checkpoints_imported + report.checkpoints_present} of "
                "the checkpoints read so far",
                file=sys.stderr,
            )

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
