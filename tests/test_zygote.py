"""The zygote (tests/zygote.py) gives the crash tests what a fresh interpreter gives them.

A child forked by the zygote must be indistinguishable, to a test, from
``subprocess.run([sys.executable, ...])``: same output, exit code and traceback; a
process of its own (its own pid, killable with SIGKILL); nothing of a previous child
(module state, random numbers); and the zygote itself holds nothing a child could
inherit by accident (no thread, no database, no connection).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import psutil
import pytest
import zygote

PROGRAMS = {
    "exit-code": "import sys; print('out'); print('err', file=sys.stderr); sys.exit(3)",
    "uncaught": "def f():\n    raise ValueError('boom')\nf()\n",
    "argv-cwd-env-path": (
        "import os, sys; print(sys.argv, os.getcwd(), os.environ.get('ZY_PROBE'), sys.path[0])"
    ),
    "exit-sequence": textwrap.dedent(
        """
        import atexit, threading, time
        atexit.register(lambda: print('atexit ran', flush=True))
        def late():
            time.sleep(0.2)
            print('thread joined before atexit', flush=True)
        threading.Thread(target=late).start()
        print('main done', flush=True)
        """
    ),
    "stdin": "import sys; print(sys.stdin.read().upper())",
    "exit-message": "raise SystemExit('a message')",
}


def both(argv_tail: list[str], **kwargs: Any) -> tuple[Any, Any]:
    """The same command as a fresh interpreter and as a fork of the zygote."""
    fresh = subprocess.run([sys.executable, *argv_tail], **kwargs)
    forked = zygote.run([sys.executable, *argv_tail], **kwargs)
    return fresh, forked


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_child_behaves_as_a_fresh_interpreter(name: str, tmp_path: Path) -> None:
    script = tmp_path / f"{name}.py"
    script.write_text(PROGRAMS[name])
    kwargs: dict[str, Any] = {
        "capture_output": True,
        "text": True,
        "timeout": 120,
        "cwd": tmp_path,
        "env": {**os.environ, "ZY_PROBE": name},
    }
    if name == "stdin":
        kwargs["input"] = "fed through a pipe"
    fresh, forked = both([str(script), "an-arg"], **kwargs)
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        fresh.returncode,
        fresh.stdout,
        fresh.stderr,
    )
    code_fresh, code_forked = both(["-c", PROGRAMS[name], "an-arg"], **kwargs)
    assert (code_forked.returncode, code_forked.stdout, code_forked.stderr) == (
        code_fresh.returncode,
        code_fresh.stdout,
        code_fresh.stderr,
    )


def test_a_module_runs_as_with_dash_m(tmp_path: Path) -> None:
    fresh, forked = both(
        ["-m", "langgraph_idem_saver", "--help"], capture_output=True, text=True, timeout=120
    )
    assert fresh.returncode == forked.returncode == 0
    assert forked.stdout == fresh.stdout and forked.stderr == fresh.stderr


def test_a_child_is_a_process_of_its_own_and_sigkill_ends_it() -> None:
    probe = "import os, sys, time; print(os.getpid(), os.getppid(), flush=True); time.sleep(120)"
    procs = [
        zygote.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    try:
        said = [tuple(map(int, p.stdout.readline().split())) for p in procs]  # type: ignore[union-attr]
        zygote_pid = zygote.zygote_pid()
        assert zygote_pid is not None and zygote_pid != os.getpid()
        assert [pid for pid, _ in said] == [p.pid for p in procs]
        assert len({os.getpid(), zygote_pid, *(p.pid for p in procs)}) == 4
        assert all(parent == zygote_pid for _, parent in said)
        procs[0].kill()
        assert procs[0].wait(30) == -signal.SIGKILL
        assert not psutil.pid_exists(procs[0].pid) or (
            psutil.Process(procs[0].pid).status() == psutil.STATUS_ZOMBIE
        )
        assert procs[1].poll() is None, "killing one child leaves the other running"
    finally:
        for p in procs:
            p.kill()
            p.wait(30)
            if p.stdout is not None:
                p.stdout.close()


def test_a_fresh_child_has_nothing_of_the_one_before_it(tmp_path: Path) -> None:
    marker = tmp_path / "marked"
    mark = (
        "import random, sys, time, langgraph_idem_saver as p; p.zygote_probe = 'dirty'; "
        f"open({str(marker)!r}, 'w').close(); print(random.random(), flush=True); time.sleep(120)"
    )
    first = zygote.Popen([sys.executable, "-c", mark], stdout=subprocess.PIPE, text=True)
    try:
        assert first.stdout is not None
        first_random = first.stdout.readline().strip()
        assert marker.exists()
    finally:
        first.kill()
        first.wait(30)
        if first.stdout is not None:
            first.stdout.close()
    look = (
        "import random, langgraph_idem_saver as p; "
        "print(getattr(p, 'zygote_probe', 'clean'), random.random())"
    )
    second = zygote.run([sys.executable, "-c", look], capture_output=True, text=True, timeout=60)
    state, second_random = second.stdout.split()
    assert state == "clean"
    assert second_random != first_random, "each child draws its own random numbers"


def test_the_zygote_holds_no_thread_no_file_and_no_connection() -> None:
    zygote.run([sys.executable, "-c", "pass"], timeout=60, check=True)
    pid = zygote.zygote_pid()
    assert pid is not None
    process = psutil.Process(pid)
    assert process.num_threads() == 1
    assert process.open_files() == []
    assert [c for c in process.net_connections(kind="inet")] == []


OPEN_FDS = """
import os
kinds = []
for name in sorted(os.listdir("/proc/self/fd"), key=int):
    try:  # a pipe, a socket, an epoll instance or a file, without its inode
        kinds.append((int(name), os.readlink(f"/proc/self/fd/{name}").split(":")[0]))
    except OSError:
        pass  # the listing's own descriptor, closed by now
print(kinds)
"""


def test_a_child_holds_the_descriptors_a_fresh_interpreter_holds() -> None:
    """Nothing of the zygote's plumbing (its socket to the test process, its wake-up
    pipe, its selector) nor of another child's stdio reaches a child: its open
    descriptors are a fresh interpreter's, number and kind."""
    kwargs: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "capture_output": True,
        "text": True,
        "timeout": 120,
    }
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    other = zygote.Popen(sleeper, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE)
    try:  # another child running, its pipes open in the test process
        fresh, forked = both(["-c", OPEN_FDS], **kwargs)
    finally:
        other.kill()
        other.communicate()
    assert fresh.returncode == forked.returncode == 0, forked.stderr
    assert forked.stdout == fresh.stdout, (forked.stdout, fresh.stdout)
    assert "socket" not in forked.stdout, forked.stdout


def test_a_timeout_kills_the_child() -> None:
    with pytest.raises(subprocess.TimeoutExpired):
        zygote.run(
            [
                sys.executable,
                "-c",
                "import os, time; print(os.getpid(), flush=True); time.sleep(120)",
            ],
            capture_output=True,
            text=True,
            timeout=3,
        )


def test_an_import_time_setting_gets_a_fresh_interpreter() -> None:
    """``LANGGRAPH_STRICT_MSGPACK`` is read when LangGraph is imported: a child that sets
    it otherwise than the zygote's environment is a fresh interpreter, not a fork."""
    parent = "import os; print(os.getppid())"
    plain = zygote.run([sys.executable, "-c", parent], capture_output=True, text=True)
    assert plain.stdout.strip() == str(zygote.zygote_pid())
    strict = "false" if os.environ.get("LANGGRAPH_STRICT_MSGPACK") == "true" else "true"
    env = {**os.environ, "LANGGRAPH_STRICT_MSGPACK": strict}
    done = zygote.run([sys.executable, "-c", parent], env=env, capture_output=True, text=True)
    assert done.stdout.strip() == str(os.getpid())


def test_the_switch_turns_the_zygote_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(zygote.SWITCH_ENV, "0")
    done = zygote.run(
        [sys.executable, "-c", "import os; print(os.getppid())"], capture_output=True, text=True
    )
    assert done.stdout.strip() == str(os.getpid())


def test_the_zygote_refuses_to_fork_once_a_thread_runs() -> None:
    """What the zygote checks after its imports and before every fork."""
    from zygote_server import unsafe_to_fork

    alone = zygote.run(
        [sys.executable, "-c", "from zygote_server import unsafe_to_fork as u; print(u())"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent)},
        timeout=60,
    )
    assert alone.stdout.strip() == "None", alone.stderr
    stop = threading.Event()
    thread = threading.Thread(target=stop.wait)
    thread.start()
    try:
        assert "unsafe to fork" in (unsafe_to_fork() or "")
    finally:
        stop.set()
        thread.join()


LEAVES_OPEN = """
import sqlite3, sys
where = sys.argv[1]
notes = open(where + "/notes.txt", "w")
notes.write("buffered, never flushed nor closed")
conn = sqlite3.connect(where + "/db.sqlite")
conn.execute("PRAGMA journal_mode=wal")
conn.execute("CREATE TABLE t (x)")
conn.execute("INSERT INTO t VALUES (1)")
conn.commit()

class Noisy:
    def __del__(self):
        print("finalized at exit", flush=True)

left = Noisy()
"""


@pytest.mark.parametrize("how", ["script", "-c"])
def test_what_a_child_leaves_open_is_closed_as_at_interpreter_exit(
    tmp_path: Path, how: str
) -> None:
    """A child's exit closes what the program left open as the interpreter's does: the
    buffered file is written, SQLite's write-ahead log is gone (the last connection
    closed), and ``__del__`` ran."""
    script = tmp_path / "leaves_open.py"
    script.write_text(LEAVES_OPEN)
    seen = []
    for start in (subprocess.run, zygote.run):
        where = tmp_path / start.__module__
        where.mkdir()
        argv = [str(script)] if how == "script" else ["-c", LEAVES_OPEN]
        done = start(
            [sys.executable, *argv, str(where)], capture_output=True, text=True, timeout=120
        )
        seen.append(
            (
                done.returncode,
                done.stdout,
                done.stderr,
                (where / "notes.txt").read_text(),
                sorted(p.name for p in where.iterdir()),
            )
        )
    fresh, forked = seen
    assert fresh[3] == "buffered, never flushed nor closed"
    assert fresh[4] == ["db.sqlite", "notes.txt"], "no -wal, no -shm"
    assert fresh[1] == "finalized at exit\n"
    assert forked == fresh
