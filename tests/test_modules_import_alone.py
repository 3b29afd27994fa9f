"""Every module of the package imports first, alone, in a fresh interpreter: an import
cycle that the usual order hides (the engine imported before ``sync_step_writes``, say)
fails here instead of in the program that happens to import the other one first."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import langgraph_idem_saver

MODULES = sorted(
    m.name for m in pkgutil.walk_packages(langgraph_idem_saver.__path__, "langgraph_idem_saver.")
)

# one interpreter a module: each import starts from an empty sys.modules
PROBE = """
import importlib, sys
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith("langgraph_idem_saver")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception as exc:
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print("\\n".join(failed))
"""


def test_every_module_imports_first() -> None:
    assert "langgraph_idem_saver.sync_step_writes" in MODULES
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *MODULES], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == ""
