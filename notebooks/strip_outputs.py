"""Strip outputs and execution counts from the notebooks before committing them.

    python notebooks/strip_outputs.py            # every notebooks/*.ipynb
    python notebooks/strip_outputs.py FILE ...   # just these

Needs only nbformat (in the ``dev`` extra). tests/test_notebooks.py fails on a notebook
committed with outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nbformat


def strip(path: Path) -> bool:
    """Clear one notebook's outputs in place; True if it changed."""
    nb = nbformat.read(path, as_version=4)
    changed = False
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        if cell.get("outputs") or cell.get("execution_count") is not None:
            cell.outputs, cell.execution_count = [], None
            changed = True
        if cell.metadata.pop("execution", None) is not None:
            changed = True
    if changed:
        nbformat.write(nb, path)
    return changed


def main(argv: list[str]) -> int:
    paths = [Path(a) for a in argv] or sorted(Path(__file__).parent.glob("*.ipynb"))
    for path in paths:
        if strip(path):
            print(f"stripped {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
