"""Child process of the import tests: imports LangGraph's tables and is killed midway.

``python tests/import_worker.py <backend> <path or dsn> <batches>`` opens our saver on
the database, imports with one checkpoint per batch, and sends itself SIGKILL once
``<batches>`` batches are in: an import killed halfway, as by the OOM killer.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from process_guard import exit_with_parent


def kill_after(batches: int) -> Any:
    def progress(report: Any) -> None:
        if report.batches >= batches:
            os.kill(os.getpid(), signal.SIGKILL)

    return progress


async def main(backend: str, where: str, batches: int) -> None:
    if backend == "sqlite":
        from langgraph_idem_saver import AsyncSqliteSaver as Saver
    else:
        from langgraph_idem_saver.postgres import AsyncPostgresSaver as Saver
    async with Saver.from_conn_string(where) as saver:
        await saver.aimport_langgraph(batch_size=1, progress=kill_after(batches))
    print("finished without being killed")


if __name__ == "__main__":
    exit_with_parent()
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
