"""Owner ids of ledger claims, and whether the process behind one is still alive.

Every ``issued`` entry names its owner: ``host:pid:<process nonce>-<call nonce>``. The
ledger's data and protocol (:mod:`~langgraph_idem_saver.ledger`) only store and compare
these strings; what they mean about processes lives here - minting them, telling this
process's from any other's, and asking ``/proc`` whether an owner on this host has died
(so a crash here need not wait out the lease).
"""

from __future__ import annotations

import os
import socket
import threading
import uuid

_HOST = socket.gethostname()

RERUN_APPROVED = "rerun-approved:"
"""Owner prefix of an ``issued`` entry an operator released for a re-run (its lease is
over, so it reads as an unknown outcome that needs no question)."""


_process_lock = threading.Lock()
_process_prefix: tuple[int, str] = (-1, "")


def process_owner_prefix() -> str:
    """``host:pid:<process nonce>-``: what every owner minted by this process starts with.

    The process nonce tells apart two processes that got the same pid (after a reboot, in
    containers sharing a host name, or a ``fork`` child): it is renewed whenever the pid
    changes. Computed under a lock, so threads never see half of it.
    """
    global _process_prefix
    pid = os.getpid()
    current = _process_prefix
    if current[0] == pid:
        return current[1]
    with _process_lock:
        if _process_prefix[0] != pid:
            _process_prefix = (pid, f"{_HOST}:{pid}:{uuid.uuid4().hex[:8]}-")
        return _process_prefix[1]


def make_owner() -> str:
    """An owner id for claims: ``host:pid:nonce``, unique per call.

    The nonce starts with this process's nonce (:func:`process_owner_prefix`), so
    :func:`minted_here` can tell this process's claims from any other's without keeping a
    registry of owners (which would grow with every node built).
    """
    return f"{process_owner_prefix()}{uuid.uuid4().hex[:12]}"


def minted_here(owner: str) -> bool:
    """Whether ``owner`` was minted by this very process (not a forked parent, not an
    earlier process that had the same pid)."""
    return owner.startswith(process_owner_prefix())


def owner_is_dead(owner: str) -> bool:
    """Whether ``owner`` names a process on this host that has exited.

    Conservative: an owner on another host, in an unparsable format, or whose pid is
    alive (even if the pid was reused by an unrelated process) counts as alive, so the
    caller waits for the lease - never the other way round.
    """
    parts = owner.split(":")
    if len(parts) < 3:
        return False
    host, pid_text = ":".join(parts[:-2]), parts[-2]
    if host != _HOST or not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return _is_zombie(pid)


def _is_zombie(pid: int) -> bool:
    """A killed child not yet reaped by its parent still answers ``kill(pid, 0)``."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            return stat.read().rpartition(")")[2].split()[0] == "Z"
    except OSError:
        return False
