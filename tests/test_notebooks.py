"""Every notebook in ``notebooks/`` runs top to bottom in a fresh kernel, without errors.

The notebooks are committed without outputs (see ``notebooks/README.md``); this test is
what keeps them working. Each one runs in its own kernel, started from *this* Python (the
venv pytest runs in), whatever kernelspecs the machine has or lacks, with its working
directory in a temp dir and matplotlib on the non-interactive Agg backend.
"""

from __future__ import annotations

import sys
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

NOTEBOOKS_DIR = Path(__file__).resolve().parent.parent / "notebooks"
NOTEBOOKS = sorted(NOTEBOOKS_DIR.glob("*.ipynb"))
CELL_TIMEOUT = 120  # seconds, per cell


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


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_runs(path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPLBACKEND", "Agg")  # inherited by the kernel: no display needed
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # the notebooks need no API key
    nb: Any = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        km=ThisPythonKernelManager(),
        timeout=CELL_TIMEOUT,
        resources={"metadata": {"path": str(tmp_path)}},  # the kernel's cwd
        allow_errors=False,
    )
    try:
        client.execute()
    except nbclient.exceptions.CellExecutionError as exc:
        pytest.fail(f"{path.name} failed:\n{exc}", pytrace=False)
