"""Child Python processes forked from a pre-imported parent: ``zygote.Popen`` / ``zygote.run``.

Why: most slow tests start real child Python processes (a crash test kills a child at the
point under test and resumes in a fresh one). Each fresh interpreter spends ~1-2 s of CPU
importing LangGraph, LangChain and this package before doing ~0.2 s of work. So each test
process (each xdist worker) starts ONE *zygote*, ``python tests/zygote.py --serve FD``,
which imports those modules once (``zygote_server.PRELOAD``) and then forks a child per request.

What a child is: a new OS process with its own pid, made by ``fork()`` from a process that
has only imported modules - the zygote never opens a database, never runs a graph, never
starts a thread (it checks ``/proc/self/task`` before every fork and refuses otherwise,
since forking a threaded process can copy a lock another thread held). The child then
sets up what ``python script.py args`` would have - stdio (the parent's pipes, passed
over a Unix socket), environment, working directory, ``sys.argv``, ``sys.path`` - and
runs the script as ``__main__``; it ends like any interpreter: ``SystemExit``
or an uncaught exception, non-daemon threads joined, ``atexit`` handlers run, what the
program imported and made torn down (``zygote_server.end_process``). Killing it
(``kill()``: SIGKILL) is a real kill of a real process; a "fresh process" that resumes
is another fork of the zygote, with no memory of the killed one. See tests/README.md.

The test side is :class:`Popen`, a ``subprocess.Popen`` whose ``_execute_child`` asks the
zygote instead of ``fork+exec``: pipes, ``communicate``, text mode, ``timeout``,
``kill``/``terminate``/``send_signal`` are subprocess' own code. Only the zygote can
``waitpid`` its children, so it reports every exit over the socket. Accepted commands:
``[sys.executable, SCRIPT, *args]``, ``[sys.executable, "-m", MODULE, *args]`` and
``[sys.executable, "-c", CODE, *args]``; options ``stdin``/``stdout``/``stderr``,
``text``/``encoding``/``errors``/``universal_newlines``, ``bufsize``, ``env``, ``cwd``,
``start_new_session``; anything else (``preexec_fn``, ``pass_fds``, ...) raises
:class:`ZygoteError` (use ``subprocess`` there). A child whose environment sets a variable
of :data:`IMPORT_TIME_ENV` differently from the zygote's, or any child under
``IDEM_TEST_ZYGOTE=0``, is a fresh interpreter (plain ``subprocess``).

Lifetime: the zygote runs in a session of its own (a Ctrl-C for pytest does not reach
it) and ends when the test process closes the socket - at exit (``atexit``), or because
the test process died, however: the kernel closes the socket then. Either way it SIGKILLs
the children left running, reaps them and exits; :func:`stop` says which were left.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from zygote_server import MAX_MESSAGE, send

ZYGOTE = Path(__file__).resolve().with_name("zygote_server.py")

IMPORT_TIME_ENV = ("PYTHON", "LANGGRAPH_", "LANGCHAIN_", "LANGSMITH_")
"""Prefixes of variables an interpreter or a preloaded library reads when it starts or is
imported (``PYTHONHASHSEED``, ``LANGGRAPH_STRICT_MSGPACK``, LangSmith's cached settings):
a child whose environment sets one of them differently from the zygote's runs as a fresh
interpreter instead (``PYTHONPATH`` excepted: a child's ``sys.path`` is built from its own)."""
SWITCH_ENV = "IDEM_TEST_ZYGOTE"
"""``IDEM_TEST_ZYGOTE=0``: every child is a fresh interpreter (``subprocess``), e.g. to
tell a problem of the zygote from a problem of the code under test."""
START_TIMEOUT = 120.0
REPLY_TIMEOUT = 60.0


class ZygoteError(RuntimeError):
    """The zygote cannot start this child (or could not start at all)."""


class _Zygote:
    """The test process's handle on its zygote: requests go out on a SOCK_SEQPACKET
    socket (with the child's stdio fds attached), replies and exits come back and a
    reader thread files them."""

    def __init__(self) -> None:
        self.owner = os.getpid()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ)
        self.env = env
        try:
            self.proc = subprocess.Popen(
                [sys.executable, str(ZYGOTE), "--serve", str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,  # a test's captured output is no place for it
                start_new_session=True,
                env=env,
                cwd=str(ZYGOTE.parent),
            )
        finally:
            theirs.close()
        self.sock = ours
        self.lock = threading.Condition()
        self.replies: dict[int, dict[str, Any]] = {}
        self.exits: dict[int, int] = {}  # request id -> exit code (pids get reused)
        self.left: list[str] = []
        self.not_preloaded: list[str] = []  # failed to import: each child imports them
        self.pid = 0
        self.fatal: str | None = None
        self.closed = False
        self.ids = 0
        self.sending = threading.Lock()
        self.reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self.reader.start()
        with self.lock:
            if not self.lock.wait_for(lambda: self.pid or self.closed, START_TIMEOUT):
                self.fatal = "the zygote did not start in time"
            if not self.pid:
                self.stop()
                raise ZygoteError(self.fatal or "the zygote ended while starting")

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MAX_MESSAGE)  # a longer message would be cut
            except OSError:
                data = b""
            if not data:
                with self.lock:
                    self.closed = True
                    self.lock.notify_all()
                return
            message = json.loads(data)
            with self.lock:
                if "ready" in message:
                    self.pid = int(message["ready"])
                    self.not_preloaded = list(message["not_preloaded"])
                elif "exited" in message:
                    self.exits[int(message["id"])] = int(message["code"])
                elif "left" in message:
                    self.left.append(f"{message['left']} {' '.join(message['argv'])[:120]}")
                elif "fatal" in message:
                    self.fatal = str(message["fatal"])
                else:
                    key = message.get("started", message.get("failed", -1))
                    self.replies[int(key)] = message
                self.lock.notify_all()

    def spawn(
        self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int], *, new_session: bool
    ) -> tuple[int, int]:
        """Fork a child running ``python *argv``; its pid and request id (what its exit
        is filed under: its pid may be another child's later)."""
        with self.sending:
            self.ids += 1
            request_id = self.ids
            request = {
                "id": request_id,
                "argv": argv,
                "env": env,
                "cwd": cwd,
                "new_session": new_session,
            }
            try:
                socket.send_fds(self.sock, [json.dumps(request).encode()], fds)
            except OSError as exc:
                raise ZygoteError(f"the zygote is gone: {exc}") from exc
        with self.lock:
            self.lock.wait_for(lambda: request_id in self.replies or self.closed, REPLY_TIMEOUT)
            reply = self.replies.pop(request_id, None)
        if reply is None:
            raise ZygoteError(self.fatal or "the zygote did not answer")
        if "failed" in reply:
            raise ZygoteError(str(reply["error"]))
        return int(reply["pid"]), request_id

    def exitcode(self, request_id: int) -> int | None:
        with self.lock:
            return self.exits.get(request_id)

    def wait(self, request_id: int, timeout: float | None) -> int | None:
        with self.lock:
            self.lock.wait_for(lambda: request_id in self.exits or self.closed, timeout)
            return self.exits.get(request_id)

    def stop(self) -> list[str]:
        """Ask the zygote to kill the children left and exit; reap it. Returns the
        children that were still running."""
        if self.owner == os.getpid() and not self.closed:
            with contextlib.suppress(OSError):
                send(self.sock, {"stop": True})
            with self.lock:
                self.lock.wait_for(lambda: self.closed, 30)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        if self.owner == os.getpid():
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.left


_current: _Zygote | None = None
_current_lock = threading.Lock()


def zygote() -> _Zygote:
    """This process's zygote, started on first use (each xdist worker has its own)."""
    global _current
    with _current_lock:
        if _current is None or _current.owner != os.getpid() or _current.closed:
            _current = _Zygote()
            if not getattr(zygote, "_registered", False):
                atexit.register(stop)
                zygote._registered = True  # type: ignore[attr-defined]
        return _current


def stop() -> None:
    """Stop this process's zygote, if it runs, saying which children it had to end."""
    global _current
    with _current_lock:
        current, _current = _current, None
    if current is None or current.owner != os.getpid():
        return
    left = current.stop()
    if current.not_preloaded:  # the run was slower than it should be: say why
        print("zygote: could not preload\n  " + "\n  ".join(current.not_preloaded), file=sys.stderr)
    if left:
        print(
            "zygote: ended child processes left running:\n  " + "\n  ".join(left), file=sys.stderr
        )


def zygote_pid() -> int | None:
    """The pid of this process's zygote, if one runs."""
    current = _current
    return current.proc.pid if current is not None and current.owner == os.getpid() else None


UNSUPPORTED = (
    "executable",
    "preexec_fn",
    "close_fds",
    "pass_fds",
    "shell",
    "startupinfo",
    "creationflags",
    "restore_signals",
    "user",
    "group",
    "extra_groups",
    "umask",
    "pipesize",
    "process_group",
)


def enabled() -> bool:
    """Whether children are forked by the zygote (``IDEM_TEST_ZYGOTE`` is not ``0``)."""
    return os.environ.get(SWITCH_ENV, "1") != "0"


def needs_fresh_interpreter(env: Any) -> bool:
    """Whether a child with environment ``env`` (``None``: ours) must be a fresh
    interpreter: it sets a variable of :data:`IMPORT_TIME_ENV` otherwise than the
    environment the zygote started (or will start) with."""
    child = {
        os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()
    }
    current = _current
    started = current.env if current is not None and current.owner == os.getpid() else os.environ
    names = (set(child) | set(started)) - {"PYTHONPATH"}
    return any(
        name.startswith(IMPORT_TIME_ENV) and child.get(name) != started.get(name) for name in names
    )


class Popen(subprocess.Popen):  # type: ignore[type-arg]
    """``subprocess.Popen`` for ``[sys.executable, ...]`` commands, forked by the zygote."""

    def __init__(self, args: Sequence[Any], **kwargs: Any) -> None:
        bad = [name for name in UNSUPPORTED if name in kwargs]
        if bad:
            raise ZygoteError(f"zygote.Popen does not support {bad}: use subprocess")
        argv = [os.fspath(a) for a in args]
        if len(argv) < 2 or argv[0] != sys.executable:
            raise ZygoteError(f"not a [sys.executable, ...] command: {argv[:2]}")
        if argv[1].startswith("-") and argv[1] not in ("-m", "-c"):
            raise ZygoteError(f"interpreter option {argv[1]!r}: use subprocess")
        if argv[1] in ("-m", "-c") and len(argv) < 3:
            raise ZygoteError(f"{argv[1]} needs an argument")
        self._zygote_argv = argv[1:]
        self._zygote: _Zygote | None = None
        if enabled() and not needs_fresh_interpreter(kwargs.get("env")):
            self._zygote_session = bool(kwargs.pop("start_new_session", False))
            self._zygote = zygote()
        super().__init__(args, **kwargs)

    def _execute_child(  # type: ignore[override]
        self,
        args: Any,
        executable: Any,
        preexec_fn: Any,
        close_fds: Any,
        pass_fds: Any,
        cwd: Any,
        env: Any,
        startupinfo: Any,
        creationflags: Any,
        shell: Any,
        p2cread: int,
        p2cwrite: int,
        c2pread: int,
        c2pwrite: int,
        errread: int,
        errwrite: int,
        *rest: Any,
    ) -> None:
        if self._zygote is None:
            return super()._execute_child(  # type: ignore[misc, no-any-return]
                args,
                executable,
                preexec_fn,
                close_fds,
                pass_fds,
                cwd,
                env,
                startupinfo,
                creationflags,
                shell,
                p2cread,
                p2cwrite,
                c2pread,
                c2pwrite,
                errread,
                errwrite,
                *rest,
            )
        child_env = {
            os.fsdecode(k): os.fsdecode(v) for k, v in (os.environ if env is None else env).items()
        }
        where = os.path.abspath(os.fspath(cwd)) if cwd is not None else os.getcwd()
        fds = [
            p2cread if p2cread != -1 else 0,
            c2pwrite if c2pwrite != -1 else 1,
            errwrite if errwrite != -1 else 2,
        ]
        try:
            self.pid, self._zygote_id = self._zygote.spawn(
                self._zygote_argv, child_env, where, fds, new_session=self._zygote_session
            )
            self._child_created = True
        finally:
            self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)
            self._closed_child_pipe_fds = True

    def _internal_poll(self, _deadstate: Any = None, **kwargs: Any) -> int | None:
        if self._zygote is None:
            return super()._internal_poll(_deadstate, **kwargs)  # type: ignore[misc, no-any-return]
        if self.returncode is None:
            code = self._zygote.exitcode(self._zygote_id)
            if code is not None:
                self.returncode = code
            elif self._zygote.closed:
                self.returncode = -9 if _deadstate is None else _deadstate
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self._zygote is None:
            return super()._wait(timeout)  # type: ignore[misc, no-any-return]
        if self.returncode is not None:
            return self.returncode
        code = self._zygote.wait(self._zygote_id, timeout)
        if code is None:
            if not self._zygote.closed:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            code = -9  # the zygote ended: it killed its children first
        self.returncode = code
        return code


def run(
    args: Sequence[Any],
    *,
    input: Any = None,
    capture_output: bool = False,
    timeout: float | None = None,
    check: bool = False,
    **kwargs: Any,
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run`` with :class:`Popen` (same arguments, same results, same
    ``TimeoutExpired`` after killing the child)."""
    if input is not None:
        kwargs["stdin"] = subprocess.PIPE
    if capture_output:
        kwargs["stdout"] = subprocess.PIPE
        kwargs["stderr"] = subprocess.PIPE
    with Popen(args, **kwargs) as process:
        try:
            stdout, stderr = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired as exc:
            process.kill()
            exc.stdout, exc.stderr = process.communicate()
            raise
        except BaseException:
            process.kill()
            raise
        retcode = process.poll()
        assert retcode is not None
        if check and retcode:
            raise subprocess.CalledProcessError(retcode, process.args, output=stdout, stderr=stderr)
    return subprocess.CompletedProcess(process.args, retcode, stdout, stderr)
