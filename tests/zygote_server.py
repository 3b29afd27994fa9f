"""The zygote process of tests/zygote.py: ``python tests/zygote_server.py --serve FD``.

It imports :data:`PRELOAD` once, then forks a child per request read on the Unix socket
``FD`` and reports each child's start and exit there (see tests/zygote.py for the why, and
for the test side). In a child, :func:`become_child` sets up what ``python ARGV`` would
have had and the program runs as ``__main__`` at this module's top level, so that the
interpreter's own exit (``SystemExit``, non-daemon threads joined, ``atexit``, stdio
flushed, modules torn down) follows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
from collections.abc import Callable
from typing import Any, NoReturn

PRELOAD: tuple[str, ...] = (
    "aiosqlite",
    "sqlite3",
    "psycopg",
    "psycopg_pool",
    "pydantic",
    "langchain_core.language_models",
    "langchain_core.language_models.fake_chat_models",
    "langchain_core.messages",
    "langchain_core.outputs",
    "langchain_core.runnables",
    "langchain_core.tools",
    "langgraph.graph",
    "langgraph.graph.message",
    "langgraph.prebuilt",
    "langgraph.prebuilt.chat_agent_executor",
    "langgraph.func",
    "langgraph.types",
    "langgraph.checkpoint.memory",
    "langgraph.checkpoint.sqlite",
    "langgraph.checkpoint.sqlite.aio",
    "langgraph.checkpoint.postgres",
    "langgraph.checkpoint.postgres.aio",
    "langchain.agents",
    "langchain.agents.middleware",
    "langgraph_idem_saver",
    "langgraph_idem_saver.middleware",
    "langgraph_idem_saver.task",
    "langgraph_idem_saver.durable_model",
    "langgraph_idem_saver.sqlite",
    "langgraph_idem_saver.postgres",
    "langgraph_idem_saver.cli",
    "psutil",
)
"""What the zygote imports once: the third-party parts and this package - never a test
module (a worker script is run afresh as ``__main__`` in each child anyway)."""

MAX_MESSAGE = 1 << 20
PRELOADED: frozenset[str] = frozenset()
"""The modules the zygote had when it forked: a child's exit leaves them as they are."""


def unsafe_to_fork() -> str | None:
    """Why this process must not fork, if it must not: another thread runs (the child
    would get a copy of any lock that thread holds, held forever)."""
    threads = os.listdir("/proc/self/task")
    return None if len(threads) == 1 else f"{len(threads)} threads run: unsafe to fork"


def send(sock: socket.socket, message: dict[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode())


def serve(fd: int) -> tuple[dict[str, Any], list[int]] | None:
    """The zygote: import :data:`PRELOAD`, then fork a child per request read on socket
    ``fd``. Returns only in a forked child, with its request and stdio fds; returns
    ``None`` in the zygote once the socket is closed (children left were killed).

    Single-threaded: children's exits arrive as SIGCHLD through a wakeup fd, multiplexed
    with the socket by ``selectors``.
    """
    import gc
    import importlib
    import selectors
    import signal
    import traceback

    sock = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a stray Ctrl-C is the test run's
    not_preloaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # a child importing it fails as a fresh interpreter would
            not_preloaded.append(f"{name}: {traceback.format_exc(limit=1).strip()[-300:]}")
    if (problem := unsafe_to_fork()) is not None:
        send(sock, {"fatal": f"after the imports, {problem}"})
        return None
    # what pre-fork servers do (see ``gc.freeze``): the imported objects move to a
    # generation no collection visits, so a child's collections - and its exit - do not
    # touch (and copy) every page of them: a child's exit costs ~0.2 s instead of ~1 s
    gc.collect()
    gc.freeze()
    global PRELOADED
    PRELOADED = frozenset(sys.modules)
    own_path = {os.path.abspath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p}
    base_path = [p for p in sys.path[1:] if p and os.path.abspath(p) not in own_path]

    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)  # a handler: wakeups fire
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    live: dict[int, tuple[int, list[str]]] = {}  # pid -> (request id, argv)

    def reap() -> None:
        while live:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            request_id, _argv = live.pop(pid, (-1, []))
            code = os.waitstatus_to_exitcode(status)
            send(sock, {"exited": pid, "id": request_id, "code": code})

    def fork(request: dict[str, Any], fds: list[int]) -> dict[str, Any] | None:
        """The child's request (in the child) or ``None`` (in the zygote)."""
        problem = None
        if len(fds) != 3:
            problem = f"expected 3 stdio fds, got {len(fds)}"
        elif not os.path.isdir(request["cwd"]):
            problem = f"no such directory: {request['cwd']!r}"
        else:
            problem = unsafe_to_fork()
        if problem is not None:
            for received in fds:
                os.close(received)
            send(sock, {"failed": request["id"], "error": problem})
            return None
        pid = os.fork()
        if pid == 0:  # the child: leave the zygote's plumbing behind, then run
            selector.close()
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            for own in (wake_r, wake_w):
                os.close(own)
            sock.close()
            request["base_path"] = base_path
            return request
        for received in fds:
            os.close(received)
        live[pid] = (request["id"], request["argv"])
        send(sock, {"started": request["id"], "pid": pid})
        return None

    send(sock, {"ready": os.getpid(), "not_preloaded": not_preloaded})
    while True:
        for key, _ in selector.select():
            if key.fd == wake_r:
                while True:
                    try:
                        if not os.read(wake_r, 512):
                            break
                    except BlockingIOError:
                        break
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(sock, MAX_MESSAGE, 3)
            except ConnectionResetError:
                data, fds = b"", []
            if not data:  # the test process closed the socket (or died): stop
                _stop_children(sock, live)
                return None
            request = json.loads(data)
            if request.get("stop"):
                _stop_children(sock, live)
                send(sock, {"stopped": True})
                return None
            if fork(request, fds) is not None:
                return request, fds
        reap()


def _stop_children(sock: socket.socket, live: dict[int, tuple[int, list[str]]]) -> None:
    """SIGKILL every child still running, report it (if anyone listens) and reap it."""
    import signal

    for pid, (_request_id, argv) in live.items():
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        with contextlib.suppress(OSError):
            send(sock, {"left": pid, "argv": argv})
    for pid in list(live):
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)


def become_child(request: dict[str, Any], fds: list[int]) -> Callable[[], None]:
    """In a forked child: set up what ``python ARGV`` would have, and return what runs
    the program (the caller runs it at module level, so the interpreter's normal exit
    follows it)."""
    import importlib.machinery
    import importlib.util
    import random

    for target, fd in enumerate(fds):
        os.dup2(fd, target)  # dup2'd descriptors are inheritable, as a real child's stdio
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    if request["new_session"]:
        os.setsid()
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    random.seed()  # random reseeds after fork anyway; said here, since it matters
    python_path = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    base = request["base_path"]
    argv = request["argv"]
    if argv[0] == "-m":
        spec = importlib.util.find_spec(argv[1])
        if spec is not None and spec.submodule_search_locations is not None:
            spec = importlib.util.find_spec(f"{argv[1]}.__main__")  # a package: its __main__
        if spec is None or spec.loader is None or spec.origin is None:
            raise SystemExit(f"{sys.executable}: No module named {argv[1]}")
        sys.argv = [spec.origin, *argv[2:]]
        sys.path[:] = [os.getcwd(), *python_path, *base]
        code = spec.loader.get_code(spec.name)  # type: ignore[attr-defined]
        names = {"__file__": spec.origin, "__cached__": spec.cached, "__spec__": spec}
        names |= {"__loader__": spec.loader, "__package__": spec.parent}
        return lambda: _run_as_main_module(code, names)
    if argv[0] == "-c":
        sys.argv = ["-c", *argv[2:]]
        sys.path[:] = ["", *python_path, *base]
        code = compile(argv[1], "<string>", "exec")
        return lambda: _run_as_main_module(
            code, {"__loader__": importlib.machinery.BuiltinImporter}
        )
    script = os.path.abspath(argv[0])
    sys.argv = list(argv)
    sys.path[:] = [os.path.dirname(os.path.realpath(script)), *python_path, *base]
    with open(script, "rb") as source:
        code = compile(source.read(), script, "exec")
    loader = importlib.machinery.SourceFileLoader("__main__", script)
    return lambda: _run_as_main_module(code, {"__file__": script, "__loader__": loader})


CHILD_MAIN: list[Any] = []
"""The child's ``__main__`` module (its namespace is torn down at exit, see
:func:`end_process`)."""


def _run_as_main_module(code: Any, names: dict[str, Any]) -> None:
    """Run ``code`` as the ``__main__`` module, as the interpreter runs a program."""
    import types

    main = types.ModuleType("__main__")
    main.__dict__.update({"__builtins__": __builtins__, "__spec__": None, "__package__": None})
    main.__dict__.update({"__cached__": None, **names})
    CHILD_MAIN.append(main)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def run_as_main(program: Callable[[], None]) -> NoReturn:
    """Run the child's program, then end the process as ``python ARGV`` ends: an
    uncaught exception is printed as the interpreter prints it (without this module's
    frames) and the exit status is 1; ``SystemExit`` gives its status."""
    try:
        program()
        code = 0
    except SystemExit as exc:
        code = exit_status(exc)
    except KeyboardInterrupt:
        raise  # the interpreter's own handling: it ends the process by SIGINT
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        code = 1
    end_process(code)


def _clear_namespace(namespace: dict[str, Any]) -> None:
    """What the interpreter does to a module at exit (``_PyModule_ClearDict``): names
    with one leading underscore to None first, then every other name but
    ``__builtins__``."""
    for first in (True, False):
        for name in list(namespace):
            single = name.startswith("_") and not name.startswith("__")
            if name != "__builtins__" and (single or not first):
                namespace[name] = None


def exit_status(exc: SystemExit) -> int:
    """The status the interpreter makes of an uncaught ``SystemExit`` (a message other
    than an int is printed to stderr, and the status is 1)."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    with contextlib.suppress(Exception):
        print(exc.code, file=sys.stderr)
    return 1


def end_process(code: int) -> NoReturn:
    """End the child as the interpreter's exit (``Py_FinalizeEx``) does, in its order:
    non-daemon threads joined, ``atexit`` handlers (``weakref.finalize`` ones included),
    then what the child imported and made is dropped and collected - its files are
    flushed and closed, its SQLite connections closed, its ``__del__`` methods run - and
    stdio flushed. What it does not do is tear down the zygote's own modules, which
    touches (and copies) every page they fill: ~0.2 s of every child. What a preloaded
    module still holds is then not finalized: a test of what a program does at exit
    runs a fresh interpreter (tests/README.md)."""
    import atexit
    import gc
    import threading

    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter calls first
    atexit._run_exitfuncs()
    # as the interpreter tears modules down: the program's namespace, then the modules it
    # imported (last first), each cleared by setting its names to None - objects go in
    # order, a file before the buffer it writes to - then what is left in cycles
    modules = [*CHILD_MAIN]
    modules += [sys.modules.pop(n) for n in reversed(list(sys.modules)) if n not in PRELOADED]
    for module in modules:
        _clear_namespace(getattr(module, "__dict__", {}))
    del modules
    gc.collect()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            code = code or 120  # the interpreter's status when stdout cannot be flushed
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] != ["--serve"] or len(sys.argv) != 3:
        sys.exit(f"usage: {sys.argv[0]} --serve FD")
    _child = serve(int(sys.argv[2]))
    if _child is not None:
        _program = become_child(*_child)
        del _child
        run_as_main(_program)  # as __main__, then the process ends
