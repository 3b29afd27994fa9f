"""A Postgres test that cannot get a server skips locally and fails in CI.

``pg_server_dsn`` (``tests/pg_server.py``) skips a test when no PostgreSQL can be had (no
``$IDEM_SAVER_PG_DSN``, pgserver not installed). In CI that would turn every Postgres test
green without running it, so under ``CI=true`` the same fixture fails the test. Checked on
a real inner pytest run whose only test asks for the fixture, with pgserver made
unimportable (as if it were not installed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys

sys.modules["pgserver"] = None  # importing it raises ImportError: as if not installed
sys.path.insert(0, {str(TESTS)!r})
from pg_server import pg_server_dsn  # noqa: E402, F401
"""

TEST = """
def test_needs_postgres(pg_server_dsn):
    assert pg_server_dsn
"""


def inner_run(tmp_path: Path, ci: str | None) -> tuple[int, str]:
    """Run the one-test project in a fresh pytest; its exit code and output."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TEST)
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("CI", "IDEM_SAVER_PG_DSN", "PYTEST_ADDOPTS") and not k.startswith("PYTEST_")
    }
    if ci is not None:
        env["CI"] = ci
    # only the plugins it needs: the installed ones (LangSmith's, Hypothesis', ...) cost
    # seconds of imports and have no say in whether a fixture skips or fails
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-rA", "-q"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_in_ci_a_postgres_test_without_a_server_fails(tmp_path: Path) -> None:
    code, out = inner_run(tmp_path, "true")
    assert code == 1, out
    # pytest.fail in a fixture: the test errors at setup (a red run), it is not skipped
    assert "1 error" in out and "skipped" not in out, out
    assert "CI: a Postgres test never skips" in out


@pytest.mark.parametrize(
    ("value", "ci"), [("true", True), ("1", True), ("", False), ("false", False)]
)
def test_what_counts_as_ci(monkeypatch: pytest.MonkeyPatch, value: str, ci: bool) -> None:
    from pg_server import in_ci

    monkeypatch.setenv("CI", value)
    assert in_ci() is ci


def test_outside_ci_it_is_skipped(tmp_path: Path) -> None:
    code, out = inner_run(tmp_path, None)
    assert code == 0, out
    assert "1 skipped" in out and "failed" not in out, out
