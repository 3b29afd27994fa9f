"""Nothing a test run starts outlives it, however the run ends.

pytest's own cleanup (fixture finalizers, ``atexit``) runs on a normal exit, a failure
and Ctrl-C, but not when pytest is killed (SIGKILL, the OOM killer, a CI timeout's
SIGTERM: Python's default SIGTERM action ends the process without running anything).
And ``pg_ctl start`` detaches PostgreSQL from its starter on purpose. So:

* :func:`exit_with_parent` - the child scripts the tests run (``crash_harness.py``,
  ``resume_worker.py``, ``fault_child.py``, ``subagent_harness.py``) call it first: the
  child ends itself as soon as its parent, or the test run that started it (named by
  ``IDEM_TEST_RUN_PID``, which :func:`mark_test_run` sets), is gone, instead of sleeping
  on as an orphan.
* :func:`watch_postgres` - a watchdog process that stops a throwaway server once the
  process that started it has ended, by any means: it waits for the end of a pipe only
  that process holds, which the kernel closes whatever killed it.
  ``python tests/process_guard.py watch-postgres PGDATA [--delete]`` is the watchdog.
* :func:`end_leftover_children` - at exit, ends the child processes a failed or
  interrupted test left running (the watchdogs excepted), and says which they were.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

RUN_PID_ENV = "IDEM_TEST_RUN_PID"
PARENT_POLL_SECONDS = 0.2
STOP_WAIT_SECONDS = 15.0

_watchdogs: list[subprocess.Popen[bytes]] = []


def mark_test_run() -> None:
    """Name this process (the test run) to every process it starts: they inherit
    ``IDEM_TEST_RUN_PID`` (see :func:`exit_with_parent`)."""
    os.environ[RUN_PID_ENV] = str(os.getpid())


def exit_with_parent() -> None:
    """End this process (``os._exit``) once its parent or the test run is gone: a daemon
    thread polls. An orphan is re-parented, so its parent pid changes - unless the parent
    died before we got here, which the test run's pid still tells. Polling, not Linux's
    ``PR_SET_PDEATHSIG``: that fires when the *thread* that spawned us ends, and tests
    spawn children from worker threads too."""
    parent = os.getppid()
    run = int(os.environ.get(RUN_PID_ENV) or 0)

    def gone() -> bool:
        if parent == 1 or os.getppid() != parent:
            return True
        if run:
            try:
                os.kill(run, 0)
            except ProcessLookupError:
                return True
            except PermissionError:  # alive, as another user
                pass
        return False

    def watch() -> None:
        while not gone():
            time.sleep(PARENT_POLL_SECONDS)
        os._exit(70)  # EX_SOFTWARE: whoever waited for us is gone anyway

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def watch_postgres(pgdata: str | Path, *, delete: bool = True) -> subprocess.Popen[bytes]:
    """Start the watchdog of the server in ``pgdata`` (call it *before* starting the
    server: no moment without a watch). It acts once this process has ended: stops the
    server if it still runs, and with ``delete`` removes ``pgdata``. It runs in a session
    of its own, so a Ctrl-C meant for pytest does not end it first."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).resolve()), "watch-postgres", str(pgdata)]
        + (["--delete"] if delete else []),
        stdin=subprocess.PIPE,  # its end closes when this process ends, however
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    _watchdogs.append(proc)  # keep the pipe open (and the Popen) for our lifetime
    return proc


def postgres_processes(marker: str | Path) -> list[Any]:
    """The running PostgreSQL processes whose command line names ``marker`` (a data
    directory, or a directory above it), as psutil processes."""
    import psutil

    found = []
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if proc.info["name"] == "postgres" and any(str(marker) in part for part in cmdline):
            found.append(proc)
    return found


def stop_postgres(pgdata: str | Path) -> None:
    """Stop the server running on ``pgdata``, if one is: fast shutdown (SIGINT), then
    immediate (SIGQUIT), then SIGKILL. The postmaster pid comes from ``postmaster.pid``
    and is signalled only if that process really is a postgres on this ``pgdata`` (a
    stale file's pid may belong to anyone by now)."""
    import psutil

    try:
        pid = int((Path(pgdata) / "postmaster.pid").read_text().split("\n", 1)[0])
        postmaster = psutil.Process(pid)
        if postmaster.name() != "postgres" or str(pgdata) not in " ".join(postmaster.cmdline()):
            return
    except (OSError, ValueError, psutil.Error):
        return  # never started, already stopped, or not ours
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGKILL):
        try:
            postmaster.send_signal(sig)
            postmaster.wait(STOP_WAIT_SECONDS)
            return
        except psutil.NoSuchProcess:
            return
        except psutil.TimeoutExpired:
            continue


def end_leftover_children() -> None:
    """End the child processes still running (the watchdogs excepted): at exit every
    one of them was left behind by a test that failed or was interrupted."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - installed with pgserver (dev extra)
        return
    keep = {w.pid for w in _watchdogs}
    try:
        children = [c for c in psutil.Process().children(recursive=True) if c.pid not in keep]
    except psutil.Error:
        return
    if not children:
        return
    names = []
    for child in children:
        try:
            names.append(f"{child.pid} {' '.join(child.cmdline())[:120]}")
            child.terminate()
        except psutil.Error:
            continue
    _, alive = psutil.wait_procs(children, timeout=3)
    for child in alive:
        try:
            child.kill()
        except psutil.Error:
            continue
    print(
        "process_guard: ended child processes left running:\n  " + "\n  ".join(names),
        file=sys.stderr,
    )


def _watch_main(argv: list[str]) -> None:
    """The watchdog: wait for EOF on stdin (the starter has ended), then clean up."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    pgdata = Path(argv[0])
    sys.stdin.buffer.read()
    stop_postgres(pgdata)
    if "--delete" in argv[1:]:
        shutil.rmtree(pgdata, ignore_errors=True)


if __name__ == "__main__":
    if sys.argv[1:2] == ["watch-postgres"]:
        _watch_main(sys.argv[2:])
    else:
        raise SystemExit(f"usage: {sys.argv[0]} watch-postgres PGDATA [--delete]")
