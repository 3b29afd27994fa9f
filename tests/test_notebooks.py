"""Every notebook in ``notebooks/`` runs top to bottom in a fresh kernel, without errors.

The notebooks are committed without outputs (see ``notebooks/README.md``); this test is
what keeps them working. Each one runs in its own kernel, started from *this* Python (the
venv pytest runs in), whatever kernelspecs the machine has or lacks, with its working
directory in a temp dir and matplotlib on the non-interactive Agg backend.

Nothing a notebook starts may outlive it: the kernel is shut down after the run (a
``KernelManager`` passed to nbclient is not nbclient's to stop: left alone, the kernel
lived on and later ended through its parent poller's ``os._exit``, skipping the exit
hook that stops notebook 04's PostgreSQL server), the kernel's temp files (``TMPDIR``)
go to a directory of the test's own (``server_tmp_dir``), and afterwards no PostgreSQL
runs from there - also when the kernel is killed outright.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

# The dev extra installs these; a missing one must fail the run, never skip the notebooks.
import ipykernel  # noqa: F401
import matplotlib  # noqa: F401
import nbclient
import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpec
from jupyter_client.manager import KernelManager
from process_guard import postgres_processes

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds, per cell
STOP_TIMEOUT = 30  # seconds for a notebook's server to be gone once its kernel is


class ThisPythonKernelManager(KernelManager):
    """An ipykernel on ``sys.executable``: never a user-level or system ``python3``
    kernelspec that may point at another interpreter (or not exist on a fresh CI venv)."""

    @property
    def kernel_spec(self) -> KernelSpec:
        if self._kernel_spec is None:
            self._kernel_spec = KernelSpec(
                argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                display_name=f"Python {sys.version_info.major}.{sys.version_info.minor}",
                language="python",
            )
        return self._kernel_spec


def test_notebooks_exist() -> None:
    assert NOTEBOOKS, f"no notebooks found in {NOTEBOOKS_DIR}"


def test_notebooks_are_committed_without_outputs() -> None:
    """The repository policy (notebooks/README.md): outputs are stripped before commit."""
    dirty: list[str] = []
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        for i, cell in enumerate(nb.cells):
            if cell.cell_type == "code" and (cell.get("outputs") or cell.get("execution_count")):
                dirty.append(f"{path.name} cell {i}")
    assert not dirty, (
        "notebooks are committed without outputs (notebooks/README.md); strip them with "
        "`python notebooks/strip_outputs.py`. Cells with outputs: " + ", ".join(dirty)
    )


def notebook_client(
    path: Path, tmp_path: Path, tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Any, KernelManager]:
    """A client for ``path`` whose kernel runs in ``tmp_path``, with TMPDIR ``tmp_dir``
    (where the notebooks' temp dirs land, PostgreSQL data included)."""
    monkeypatch.setenv("MPLBACKEND", "Agg")  # inherited by the kernel: no display needed
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the notebooks need no API key
    monkeypatch.delenv("IDEM_SAVER_PG_DSN", raising=False)  # notebook 04 starts its own
    monkeypatch.setenv("TMPDIR", str(tmp_dir))
    km = ThisPythonKernelManager()
    client = nbclient.NotebookClient(
        nbformat.read(path, as_version=4),
        km=km,
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's cwd
        allow_errors=False,
    )
    return client, km


def postgres_left(under: Path) -> list[str]:
    """PostgreSQL processes still running from a data directory under ``under``, once
    they have had STOP_TIMEOUT seconds to go."""
    deadline = time.monotonic() + STOP_TIMEOUT
    while (procs := postgres_processes(under)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return [f"{p.pid} {' '.join(p.cmdline())}" for p in procs if p.is_running()]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(
    path: Path, tmp_path: Path, server_tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, km = notebook_client(path, tmp_path, server_tmp_dir, monkeypatch)
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
    finally:
        if km.has_kernel:
            km.shutdown_kernel()  # graceful: the kernel's exit hooks run
    assert not postgres_left(server_tmp_dir), f"{path.name} left PostgreSQL running"


def test_notebook_04_server_is_stopped_when_its_kernel_is_killed(
    tmp_path: Path, server_tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL runs no exit hook: the notebook's watchdog process stops the server."""
    path = NOTEBOOKS_DIR / "04_postgres_workers.ipynb"
    client, km = notebook_client(path, tmp_path, server_tmp_dir, monkeypatch)
    cells = client.nb.cells
    last = next(i for i, c in enumerate(cells) if "pgserver.get_server(" in c.source)
    try:
        with client.setup_kernel():
            for index in range(last + 1):
                client.execute_cell(cells[index], index)
            started = postgres_processes(server_tmp_dir)
            assert started, "the notebook started no PostgreSQL server under its temp dir"
            pgdata = next(Path(a) for a in started[0].cmdline() if "pgdata" in a)
            os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
            assert not postgres_left(server_tmp_dir), "the server outlived its killed kernel"
            deadline = time.monotonic() + STOP_TIMEOUT
            while pgdata.exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert not pgdata.exists(), "the watchdog deletes the data directory"
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)


def test_notebook_04_workers_exit_when_its_kernel_is_killed(
    tmp_path: Path, server_tmp_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGKILL runs no exit hook: the billing launcher notices its kernel is gone and
    exits, and so do the workers it forked, rather than wait for their database forever
    (orphaned under PID 1). The workers are held by a server that accepts their
    connections and never answers (their pool would give up after 30 s): all of them
    gone well before that shows they followed the kernel."""
    import json
    import socket

    import psutil

    path = NOTEBOOKS_DIR / "04_postgres_workers.ipynb"
    client, km = notebook_client(path, tmp_path, server_tmp_dir, monkeypatch)
    cells = client.nb.cells
    script = next(i for i, c in enumerate(cells) if c.source.startswith("%%writefile billing.py"))
    silent = socket.socket()
    try:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        port = silent.getsockname()[1]
        with client.setup_kernel():
            for index in range(script + 1):
                client.execute_cell(cells[index], index)
            batches = json.dumps({"2": ["acct-a", "acct-b"]})
            start = nbformat.v4.new_code_cell(
                f"env = {{**os.environ, 'BILLING_DSN': 'host=127.0.0.1 port={port} "
                "dbname=x connect_timeout=120'}\n"
                f"launcher = subprocess.Popen([sys.executable, 'billing.py', 'resume-batches',"
                f" {batches!r}], env=env)\nprint(launcher.pid)"
            )
            cells.append(start)
            client.execute_cell(start, len(cells) - 1)
            launcher = psutil.Process(int(start.outputs[0]["text"].strip()))
            deadline = time.monotonic() + CELL_TIMEOUT
            while len(launcher.children()) < 2 and time.monotonic() < deadline:
                time.sleep(0.1)
            procs = [launcher, *launcher.children()]
            assert len(procs) == 3, "the launcher did not fork its two workers"
            # the workers are past their start: each runs the thread watching its parent
            while not all(w.num_threads() >= 2 for w in procs[1:]):
                assert time.monotonic() < deadline, "the workers never started watching"
                time.sleep(0.05)
            os.kill(km.provisioner.pid, signal.SIGKILL)  # type: ignore[union-attr]
            _, alive = psutil.wait_procs(procs, timeout=15)
            for proc in alive:
                proc.kill()
            assert not alive, "the billing launcher or a worker outlived its killed kernel"
    finally:
        silent.close()
        if km.has_kernel:
            km.shutdown_kernel(now=True)
