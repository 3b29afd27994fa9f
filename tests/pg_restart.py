"""A PostgreSQL server the tests crash: SIGKILL, then a restart with crash recovery.

:class:`CrashableServer` wraps a :func:`pg_server.throwaway_server` (watched: stopped
however the test run ends) started with PostgreSQL's defaults - ``fsync=on``,
``synchronous_commit=on``, unlike the session's shared server - so that what a crash
keeps is what a real server keeps. :meth:`CrashableServer.kill` SIGKILLs the postmaster
and every backend at once (nothing is flushed, nothing shut down: a server crash, the
clients stay alive), :meth:`CrashableServer.start` starts it again on the same socket
(WAL replay on the way up) and returns when it accepts connections.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from pathlib import Path
from typing import Any

from pg_server import throwaway_server
from process_guard import postgres_processes


class CrashableServer:
    """A throwaway server (fsync on) to SIGKILL and restart; :meth:`cleanup` stops it."""

    def __init__(self, prefix: str = "idem-restart-pg-") -> None:
        self.server: Any = throwaway_server(prefix)
        self.pgdata = Path(self.server.pgdata)
        info = self.server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.uri = str(self.server.get_uri())
        self.kills = 0

    def kill(self) -> float:
        """SIGKILL the postmaster and all its backends; returns when none is left (the
        time of the kill, ``time.time()``)."""
        at = time.time()
        procs = postgres_processes(self.pgdata)
        for proc in procs:
            with contextlib.suppress(Exception):  # already gone
                proc.kill()
        deadline = time.monotonic() + 15
        while postgres_processes(self.pgdata) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not postgres_processes(self.pgdata), "the server survived SIGKILL"
        # The killed postmaster may stay a zombie (pg_ctl detached it: its parent is the
        # container's init, which need not reap it), and PostgreSQL reads a live pid in
        # its lock files as a server still running. Every process is gone: the lock
        # files are stale, and removing them is what a reboot's cleanup would do.
        for lock in (self.pgdata / "postmaster.pid", Path(self.socket_dir) / ".s.PGSQL.5432.lock"):
            lock.unlink(missing_ok=True)
        self.kills += 1
        return at

    def start(self) -> float:
        """Start the server again (crash recovery included); returns once it accepts
        connections (``time.time()`` then)."""
        from pgserver._commands import pg_ctl

        args = ["-w", "-o", '-h ""', "-o", f"-k {self.socket_dir}"]
        args += ["-l", str(self.server.log), "start"]
        pg_ctl(args, pgdata=self.pgdata, user=self.server.system_user, timeout=60)
        return time.time()

    def setting(self, name: str) -> str:
        import psycopg

        with psycopg.connect(self.uri, autocommit=True) as conn:
            row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
            assert row is not None
            return str(row[0])

    def cleanup(self) -> None:
        """Kill the server and delete its data directory. A throwaway server needs no
        clean shutdown: with fsync on, ``pg_ctl stop``'s shutdown checkpoint took ~8 s
        after the worker test's writes, for data deleted right after."""
        if postgres_processes(self.pgdata):
            self.kill()
        self.server.cleanup_mode = None  # nothing left for pgserver to stop or delete
        self.server.cleanup()
        shutil.rmtree(self.pgdata, ignore_errors=True)
        assert not self.pgdata.exists(), f"{self.pgdata} was not deleted"
