"""The schedule of the database-restart test: workers running agents, the server killed.

:func:`run_schedule` starts the worker processes (``db_restart_worker.py``), waits until
each has built its agent, starts them together, then - at moments drawn from ``seed`` -
SIGKILLs the PostgreSQL server (postmaster and backends) and starts it again, and waits
for the workers. :class:`Outcome` is what happened: the effects (each charge one line),
the workers' events (threads finished, exceptions by class, ``verify`` asked), the kills
and restarts, and the recovery time after each restart.
"""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zygote
from pg_restart import CrashableServer

WORKER = Path(__file__).resolve().parent / "db_restart_worker.py"
CALLS = 3  # charges a thread asks for (db_restart_worker.CALLS)


@dataclass
class Outcome:
    threads: list[str]
    effects: list[str]
    events: list[dict[str, Any]]
    restarts: list[tuple[float, float]]  # (killed at, accepting connections again at)
    returncodes: list[int]
    stderr: list[str] = field(default_factory=list)

    def duplicates(self) -> dict[str, int]:
        return {e: n for e, n in Counter(self.effects).items() if n > 1}

    def started(self) -> set[str]:
        """The threads the workers started (the rest were left when the schedule ended)."""
        return {e["thread"] for e in self.events if e["kind"] == "started"}

    def missing(self) -> list[str]:
        done = set(self.effects)
        expected = [f"{t}/inv-{i}" for t in sorted(self.started()) for i in range(CALLS)]
        return [e for e in expected if e not in done]

    def story(self) -> list[dict[str, Any]]:
        """The events of every thread with an effect missing or left unfinished: what a
        failure shows (a ``ToolCallInProgress`` names the claim it waited on)."""
        threads = {e.rsplit("/", 1)[0] for e in self.missing()}
        threads |= self.started() - self.finished()
        return [e for e in self.events if e.get("thread") in threads]

    def finished(self) -> set[str]:
        return {e["thread"] for e in self.events if e["kind"] == "finished"}

    def errors(self) -> Counter[str]:
        return Counter(e["type"] for e in self.events if e["kind"] == "error")

    def raw_driver_errors(self) -> Counter[str]:
        """Exceptions of the database driver or its pool that reached the application."""
        return Counter(
            {t: n for t, n in self.errors().items() if t.startswith(("psycopg.", "psycopg_pool."))}
        )

    def asked(self) -> list[dict[str, Any]]:
        """``verify`` calls (unknown outcomes)."""
        return [e for e in self.events if e["kind"] == "verify"]

    def asked_about_done(self) -> list[dict[str, Any]]:
        """``verify`` calls about an effect that had happened: a result the live process
        had, turned unknown. (A call cancelled mid-run - LangGraph cancels a step's
        other tasks when one raises - is unknown by design; the tool here is cancelled
        only before its effect, so its check finds nothing.)"""
        return [e for e in self.asked() if e["applied"]]

    def recovery_seconds(self) -> list[float]:
        """Per restart: for each worker that finished a thread after it, the time from the
        server accepting connections again to that worker's first finished thread; the
        slowest worker's. (A thread's last steps - outcome, checkpoint writes, the model's
        answer - all run on the restarted server.)"""
        found = []
        for _, back in self.restarts:
            firsts: dict[int, float] = {}
            for e in self.events:
                if e["kind"] == "finished" and e["t"] >= back:
                    firsts[e["pid"]] = min(firsts.get(e["pid"], e["t"]), e["t"])
            if firsts:
                found.append(max(firsts.values()) - back)
        return found


def run_schedule(
    server: CrashableServer,
    dsns: dict[str, str],
    *,
    stack: str,
    seed: int,
    threads_per_worker: int = 400,  # more than any host runs before the schedule ends
    lanes: int = 3,
    kills: int = 2,
    tool_seconds: tuple[float, float] = (0.05, 0.4),
    seconds: float = 45.0,
) -> Outcome:
    """Run one worker per connection kind (``dsns``: ``pool``/``single`` -> DSN) under
    ``kills`` server crashes drawn from ``seed``. Each worker has ``threads_per_worker``
    threads to run, more than the schedule lasts: two seconds after the last restart no
    new one starts (``Outcome.started`` names those that did)."""
    rng = random.Random(seed)
    work = Path(tempfile.mkdtemp(prefix="idem-restart-run-"))
    effects, events, go, stop = work / "effects", work / "events", work / "go", work / "stop"
    procs: list[subprocess.Popen[bytes]] = []
    threads: list[str] = []
    restarts: list[tuple[float, float]] = []
    try:
        for n, (conn, dsn) in enumerate(sorted(dsns.items())):
            mine = [f"{stack}-{conn}-{seed}-{i}" for i in range(threads_per_worker)]
            threads += mine
            config = {
                "dsn": dsn,
                "stack": stack,
                "conn": conn,
                "effects": str(effects),
                "events": str(events),
                "ready": str(work / f"ready-{n}"),
                "go": str(go),
                "stop": str(stop),
                "seed": seed * 100 + n,
                "threads": mine,
                "lanes": lanes,
                "tool_seconds": list(tool_seconds),
                "seconds": seconds,
            }
            # output to files: a pipe nobody reads during the schedule would fill up with
            # the pool's reconnect warnings and block the worker
            with (work / f"out-{n}").open("wb") as out:
                procs.append(
                    zygote.Popen(
                        [sys.executable, str(WORKER), json.dumps(config)],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                    )
                )
        deadline = time.monotonic() + 120  # imports are slow on a busy host
        while not all((work / f"ready-{n}").exists() for n in range(len(procs))):
            assert time.monotonic() < deadline, "the workers did not start"
            assert all(p.poll() is None for p in procs), [
                (work / f"out-{n}").read_text()[-3000:] for n in range(len(procs))
            ]
            time.sleep(0.05)
        go.write_text("go")
        for _ in range(kills):
            time.sleep(rng.uniform(0.6, 1.5))  # the server up, the agents at work
            if all(p.poll() is not None for p in procs):
                break
            killed = server.kill()
            time.sleep(rng.uniform(0.2, 0.8))  # the server down
            restarts.append((killed, server.start()))
        time.sleep(2.0)  # threads finishing on the restarted server
        stop.write_text("stop")  # then no new thread starts; those running finish
        deadline = time.monotonic() + seconds + 30  # the workers stop at `seconds`
        codes = []
        for p in procs:
            try:
                codes.append(p.wait(timeout=max(deadline - time.monotonic(), 1)))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        stderr = [(work / f"out-{n}").read_text()[-3000:] for n in range(len(procs))]
        return Outcome(
            threads,
            effects.read_text().splitlines() if effects.exists() else [],
            [json.loads(x) for x in events.read_text().splitlines()] if events.exists() else [],
            restarts,
            codes,
            stderr,
        )
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(work, ignore_errors=True)
