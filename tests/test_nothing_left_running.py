"""A test run leaves nothing running, however it ends (tests/process_guard.py).

Each case runs a real pytest (or a real process tree) in a subprocess and ends it the
way it happens in practice: Ctrl-C (SIGINT), a CI timeout or ``kill`` (SIGTERM), the OOM
killer (SIGKILL), a failing test. Then nothing it started may still run: not the
session's PostgreSQL server (the notebook's is covered in test_notebooks.py), not a
child process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from process_guard import postgres_processes

TESTS_DIR = Path(__file__).resolve().parent
DEADLINE = 60  # seconds for a server to start, or for anything to be gone

# The inner pytest, started with Python's own Ctrl-C handler. A process started in the
# background of a shell without job control (`nohup cmd &`, `cmd &` in a script: how some
# CI runners start a job) inherits SIGINT *ignored*, and Python then leaves it ignored, so
# the SIGINT case below would send a Ctrl-C that nothing hears. An interactive terminal,
# where Ctrl-C happens, always delivers it; the case needs that precondition whatever
# started the outer run.
INNER_PYTEST = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "import pytest; sys.exit(pytest.main(sys.argv[1:]))"
)


def wait_for(predicate: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + DEADLINE
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def ended(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie waiting for init to reap it has)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ignore_sigint() -> None:
    """What a shell without job control does to a command it starts in the background."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_pytest(
    where: Path, test_source: str, *, started_in_background: bool = False
) -> subprocess.Popen[str]:
    """Start pytest on one test file, with tests/pg_server.py loaded as a plugin (its
    fixtures and exit hooks, as tests/conftest.py loads them), in and with TMPDIR
    ``where``; ``started_in_background``: with SIGINT ignored, as `nohup cmd &` starts it."""
    (where / "test_inner.py").write_text(textwrap.dedent(test_source))
    env = {**os.environ, "TMPDIR": str(where), "PYTHONPATH": str(TESTS_DIR)}
    env.pop("IDEM_SAVER_PG_DSN", None)  # the inner run starts its own throwaway server
    # only the plugins named here: the installed ones (LangSmith's, Hypothesis', ...) cost
    # seconds of imports a run and take no part in how it ends
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    plugins = ["-p", "pg_server", "-p", "no:cacheprovider"]
    return subprocess.Popen(
        [sys.executable, "-c", INNER_PYTEST, "-q", *plugins, str(where / "test_inner.py")],
        cwd=where,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=ignore_sigint if started_in_background else None,
    )


def test_a_process_started_in_the_background_ignores_ctrl_c_unless_told_otherwise(
    tmp_path: Path,
) -> None:
    """Why INNER_PYTEST restores Python's Ctrl-C handler: started as `nohup cmd &`
    starts it, a plain Python keeps SIGINT ignored (the SIGINT case below would then wait
    for a pytest that never hears it), and the inner pytest of these cases does not."""
    plain = subprocess.run(
        [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"],
        capture_output=True,
        text=True,
        preexec_fn=ignore_sigint,
        check=True,
    )
    assert plain.stdout.strip() == str(signal.SIG_IGN)
    proc = run_pytest(
        tmp_path,
        """
        import signal

        def test_ctrl_c_raises_keyboard_interrupt():
            assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
        """,
        started_in_background=True,
    )
    out, _ = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 0, out


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_the_session_server_stops_when_pytest_is_interrupted_or_killed(
    server_tmp_dir: Path, sig: signal.Signals
) -> None:
    ready = server_tmp_dir / "ready"
    proc = run_pytest(
        server_tmp_dir,
        f"""
        import time
        from pathlib import Path

        def test_waits(pg_server_dsn):
            Path({str(ready)!r}).write_text(pg_server_dsn)
            time.sleep(120)
        """,
    )
    try:
        wait_for(lambda: ready.exists() or proc.poll() is not None, "pytest never got a server")
        assert ready.exists(), proc.communicate()[0]
        started = postgres_processes(server_tmp_dir)
        assert started, "the server runs from a data directory under TMPDIR"
        assert all("idem-" in " ".join(p.cmdline()) for p in started), "named idem-*"
        proc.send_signal(sig)
        # Ctrl-C: pytest's own "interrupted" exit (2); SIGTERM and SIGKILL end it outright
        returncode = proc.wait(DEADLINE)
        assert returncode == (2 if sig is signal.SIGINT else -sig), proc.communicate()[0]
        wait_for(lambda: not postgres_processes(server_tmp_dir), f"the server outlived {sig.name}")
        wait_for(
            lambda: not list(server_tmp_dir.glob("idem-saver-pg-*")),
            "its data directory is deleted",
        )
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_children_a_failed_test_left_running_are_ended_at_exit(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    proc = run_pytest(
        tmp_path,
        f"""
        import subprocess, sys
        from pathlib import Path

        def test_leaks_a_child():
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
            Path({str(pid_file)!r}).write_text(str(child.pid))
            assert False, "fails with its child still running"
        """,
    )
    out, _ = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 1, out
    child = int(pid_file.read_text())
    assert ended(child), out
    assert f"ended child processes left running:\n  {child} " in out


@pytest.mark.parametrize("when", ["running", "starting"])
def test_a_child_script_exits_when_its_parent_is_killed(tmp_path: Path, when: str) -> None:
    """What crash_harness.py, resume_worker.py, fault_child.py and subagent_harness.py
    do first (process_guard.exit_with_parent): a grandchild orphaned by SIGKILL ends,
    whether its guard was already watching or the parent died while it was starting."""
    watching = tmp_path / "watching"
    grandchild = (
        f"import sys, time; time.sleep({0.5 if when == 'starting' else 0}); "
        f"sys.path.insert(0, {str(TESTS_DIR)!r}); "
        "from process_guard import exit_with_parent; exit_with_parent(); "
        f"open({str(watching)!r}, 'w').close(); time.sleep(120)"
    )
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; "
            f"p = subprocess.Popen([sys.executable, '-c', {grandchild!r}]); "
            "print(p.pid, flush=True); time.sleep(120)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert parent.stdout is not None
    child = psutil.Process(int(parent.stdout.readline()))
    if when == "running":
        wait_for(watching.exists, "the child never started its guard")
    parent.send_signal(signal.SIGKILL)
    parent.wait(DEADLINE)
    parent.stdout.close()
    wait_for(lambda: ended(child.pid), "the orphaned child lived on")
    assert when == "running" or not watching.exists(), "it ended as soon as it started"


ZYGOTE_TEST = """
    import os, sys, time
    from pathlib import Path
    import zygote

    def test_leaves_a_zygote_child():
        child = zygote.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        Path({tmp!r}).write_text(f"{{zygote.zygote_pid()}} {{child.pid}}")
        os.rename({tmp!r}, {pids!r})
        {then}
"""


def zygote_pids(pids: Path, proc: subprocess.Popen[str]) -> tuple[int, int]:
    """The inner run's zygote and its child, once the inner test has started both."""
    wait_for(lambda: pids.exists() or proc.poll() is not None, "no zygote child started")
    assert pids.exists(), proc.communicate()[0]
    zygote_pid, child_pid = map(int, pids.read_text().split())
    return zygote_pid, child_pid


@pytest.mark.parametrize(
    "sig", [signal.SIGINT, signal.SIGTERM, signal.SIGKILL], ids=lambda s: s.name
)
def test_the_zygote_and_its_children_end_when_pytest_is_interrupted_or_killed(
    tmp_path: Path, sig: signal.Signals
) -> None:
    """tests/zygote.py: the zygote ends with the run that started it (its socket closes,
    however the run ends), and SIGKILLs the children it forked first."""
    pids = tmp_path / "pids"
    source = ZYGOTE_TEST.format(
        tmp=str(tmp_path / "pids.tmp"), pids=str(pids), then="time.sleep(120)"
    )
    proc = run_pytest(tmp_path, source)
    try:
        zygote_pid, child_pid = zygote_pids(pids, proc)
        assert psutil.Process(child_pid).ppid() == zygote_pid
        proc.send_signal(sig)
        proc.wait(DEADLINE)
        wait_for(lambda: ended(child_pid), f"the zygote's child outlived {sig.name}")
        wait_for(lambda: ended(zygote_pid), f"the zygote outlived {sig.name}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_zygote_children_a_failed_test_left_running_are_ended_at_exit(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    then = 'assert False, "fails with its child still running"'
    proc = run_pytest(
        tmp_path, ZYGOTE_TEST.format(tmp=str(tmp_path / "pids.tmp"), pids=str(pids), then=then)
    )
    out, _ = proc.communicate(timeout=DEADLINE)
    assert proc.returncode == 1, out
    zygote_pid, child_pid = zygote_pids(pids, proc)
    assert ended(child_pid) and ended(zygote_pid), out
    assert f"zygote: ended child processes left running:\n  {child_pid} " in out
