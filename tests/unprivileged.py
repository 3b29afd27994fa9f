"""Run code without the power to ignore file permissions, for read-only file tests.

The test suite runs as root in CI, and root ignores file permissions: a ``chmod 0444``
file is still writable by a root process (``CAP_DAC_OVERRIDE``), so a "read-only" test run
as root would prove nothing. These helpers run the code under test in a child process that
is subject to permissions like any user:

* as root, the child is started through ``setpriv`` (util-linux) with
  ``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH`` and ``CAP_FOWNER`` removed from its
  bounding set - root then obeys the owner's permission bits of its own files, so
  ``0444`` is read-only and ``0555`` a directory it cannot write; it stays uid 0 so it can
  still run this virtualenv's interpreter, which may live under a private ``/root``;
* as an ordinary user, the child is simply started.

Every test also checks in such a child that the operating system really refuses the write
(:func:`os_refuses_write`), so it can never pass vacuously.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
DROPPED = "-dac_override,-dac_read_search,-fowner"

# prints whether this process may append to argv[1], or create a file in directory argv[1]
OS_WRITE_PROBE = r"""
import os, sys
target = sys.argv[1]
try:
    if os.path.isdir(target):
        probe = os.path.join(target, ".probe.tmp")
        open(probe, "x").close()
        os.remove(probe)
    else:
        open(target, "ab").close()
    print("writable")
except PermissionError:
    print("denied")
"""


def _prefix() -> list[str]:
    """The command prefix that takes away root's power over permissions (none otherwise)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    assert setpriv, "tests of read-only files run as root need setpriv (util-linux)"
    return [setpriv, f"--bounding-set={DROPPED}", f"--inh-caps={DROPPED}", "--"]


def run_unprivileged(
    argv: Sequence[str], *, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` subject to file permissions (this Python for a leading ``"python"``)."""
    args = [sys.executable if a == "python" else a for a in argv]
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "COLUMNS": "200"}
    return subprocess.run(
        [*_prefix(), *args],
        cwd=cwd or REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def os_refuses_write(target: Path) -> bool:
    """Whether the OS refuses such a child a write to ``target`` (a file or a directory)."""
    proc = run_unprivileged(["python", "-c", OS_WRITE_PROBE, str(target)])
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "denied"


def listing(directory: Path) -> dict[str, bytes]:
    """Every file in ``directory`` with its contents, to show nothing changed."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()}


def make_writable_again(directory: Path) -> None:
    """Undo the test's chmods so pytest can remove ``directory`` (when not root)."""
    for root, dirs, files in os.walk(directory):
        os.chmod(root, 0o755)
        for name in dirs:
            os.chmod(os.path.join(root, name), 0o755)
        for name in files:
            os.chmod(os.path.join(root, name), 0o644)
