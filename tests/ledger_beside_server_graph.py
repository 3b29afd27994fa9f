"""A ``create_agent`` graph served by ``langgraph dev`` with the server's OWN persistence
(no ``checkpointer`` in ``langgraph.json``) and a ``ToolLedger`` beside it, for
``tests/test_ledger_beside_server.py``. Also the ``langgraph`` command those tests start
(``python tests/ledger_beside_server_graph.py langgraph dev ...``), which ends itself
once the test run is gone.

Environment: ``LEDGER_BESIDE_WORK`` (a directory: the effects file, the markers),
``LEDGER_BESIDE_MODE`` (``ours``: ``IdempotencyMiddleware(ledger=ToolLedger(...))``;
``stock``: no middleware, the control) and ``LEDGER_BESIDE_LEDGER`` (the ledger's SQLite
path or DSN). The ledger is built at import, unopened, as a graph module would build it:
it opens on first use.

The first charge of ``inv-1`` (``fired`` marker: once per test) records its effect,
writes ``parked`` and waits; once the test has seen the server save its runs, it writes
``kill``, and the tool SIGKILLs the server's process group from inside the call.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' directory

WORK = Path(os.environ.get("LEDGER_BESIDE_WORK", "."))
PARK_SECONDS = 180.0


def _build() -> Any:
    from effects_file import record, verify_charge
    from langchain.agents import create_agent
    from langchain_core.tools import tool
    from ledger_beside_worker import FreshIdsModel
    from process_guard import exit_with_parent

    from langgraph_idem_saver import IdempotencyMiddleware, ToolLedger

    exit_with_parent()  # the server never outlives the test run
    effects = WORK / "effects"

    @tool
    def charge(invoice: str) -> str:
        """Charge an invoice."""
        record(effects, invoice)
        fired = WORK / "fired"
        if invoice == "inv-1" and not fired.exists():
            fired.write_text("")
            (WORK / "parked").write_text("")
            deadline = time.monotonic() + PARK_SECONDS
            while not (WORK / "kill").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            os.killpg(os.getpgrp(), signal.SIGKILL)
        return f"charged {invoice}"

    verify = verify_charge(effects)

    middleware = []
    if os.environ.get("LEDGER_BESIDE_MODE") == "ours":
        ledger = ToolLedger.from_conn_string(os.environ["LEDGER_BESIDE_LEDGER"])
        middleware = [IdempotencyMiddleware(ledger=ledger, verify={"charge": verify})]
    return create_agent(FreshIdsModel(), tools=[charge], middleware=middleware)


if __name__ == "__main__":
    from dev_server_knobs import flush_often
    from langgraph_cli.cli import cli
    from process_guard import exit_with_parent

    exit_with_parent()
    flush_often()  # the server saves its runs every second, not every ten
    cli(sys.argv[2:], prog_name="langgraph")
else:
    agent = _build()
