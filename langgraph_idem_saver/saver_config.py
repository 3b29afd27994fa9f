"""Reading a ``RunnableConfig`` the way every saver must: the thread, namespace and
checkpoint ids, each checked once (a :class:`ConfigError` naming the key, before anything
is written) so that no backend's driver sees text it cannot store.
"""

from __future__ import annotations

from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata, CheckpointTuple

from langgraph_idem_saver.errors import ConfigError

# longest thread id / namespace / checkpoint id accepted, in UTF-8 bytes
MAX_ID_BYTES = 1024


def thread_id_of(config: RunnableConfig | None) -> str:
    """The config's ``thread_id`` as a string, or a :class:`ConfigError` naming the key.

    The common id (a non-empty ``str`` of ASCII without NUL, at most ``MAX_ID_BYTES``
    characters, which are its bytes) passes one test here; any other value takes
    :func:`_thread_id_checked`, which decides it (the fast test accepts nothing it refuses).
    """
    configurable = (config or {}).get("configurable")
    if type(configurable) is dict:
        tid = configurable.get("thread_id")
        if (
            type(tid) is str
            and tid.isascii()
            and 0 < len(tid) <= MAX_ID_BYTES
            and "\x00" not in tid
        ):
            return tid
    return _thread_id_checked(config)


def _thread_id_checked(config: RunnableConfig | None) -> str:
    """:func:`thread_id_of`'s general path: every check, in order."""
    configurable = (config or {}).get("configurable")
    if not isinstance(configurable, dict):
        raise ConfigError(
            "config has no 'configurable' dict; pass "
            "{'configurable': {'thread_id': ...}} (LangGraph needs a thread_id to checkpoint)"
        )
    thread_id = configurable.get("thread_id")
    if thread_id is None or thread_id == "":
        raise ConfigError(
            "config['configurable'] has no 'thread_id'; pass "
            "{'configurable': {'thread_id': ...}} to use a checkpointer"
        )
    if not isinstance(thread_id, (str, int)) or isinstance(thread_id, bool):
        raise ConfigError(
            f"config['configurable']['thread_id'] must be a str (or int), got "
            f"{type(thread_id).__name__}"
        )
    return _storable(str(thread_id), "thread_id")


def _storable(value: str, what: str) -> str:
    """``value`` if a database can store it as text; a :class:`ConfigError` otherwise
    (lone surrogates cannot be encoded; NUL is refused by PostgreSQL and truncates in
    some SQLite functions)."""
    if "\x00" in value:
        raise ConfigError(f"{what} must not contain NUL (\\x00) characters")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} is not valid text (lone surrogate): {exc}") from exc
    if size > MAX_ID_BYTES:
        # PostgreSQL cannot index keys much longer (btree rows max out near 2.7 KB); the
        # same limit on every backend keeps a thread portable between them
        raise ConfigError(f"{what} is {size} bytes long; the limit is {MAX_ID_BYTES}")
    return value


def checkpoint_ns_of(config: RunnableConfig) -> str:
    """The config's ``checkpoint_ns`` ('' when absent), validated to be a string (the
    common one, ASCII without NUL and not too long, by one test)."""
    ns = config["configurable"].get("checkpoint_ns", "")
    if type(ns) is str and ns.isascii() and len(ns) <= MAX_ID_BYTES and "\x00" not in ns:
        return ns
    return _checkpoint_ns_checked(ns)


def _checkpoint_ns_checked(ns: Any) -> str:
    """:func:`checkpoint_ns_of`'s general path for the config's value ``ns``."""
    if ns is None:
        return ""
    if not isinstance(ns, str):
        raise ConfigError(
            f"config['configurable']['checkpoint_ns'] must be a str, got {type(ns).__name__}"
        )
    return _storable(ns, "checkpoint_ns")


def checkpoint_id_of(config: RunnableConfig) -> str | None:
    """The config's ``checkpoint_id`` or None, validated to be a string."""
    return checkpoint_id_value(config["configurable"].get("checkpoint_id"))


def checkpoint_id_value(cid: Any) -> str | None:
    """A checkpoint id as :func:`checkpoint_id_of` reads it from a config (None for None
    or ''), for an id not in a config (a checkpoint's own ``id``); the common one (ASCII
    without NUL, not too long) by one test."""
    if type(cid) is str and cid.isascii() and 0 < len(cid) <= MAX_ID_BYTES and "\x00" not in cid:
        return cid
    return _checkpoint_id_checked(cid)


def _checkpoint_id_checked(cid: Any) -> str | None:
    """:func:`checkpoint_id_value`'s general path: every check, in order."""
    if cid is None or cid == "":
        return None
    if not isinstance(cid, str):
        raise ConfigError(
            f"config['configurable']['checkpoint_id'] must be a str, got {type(cid).__name__}"
        )
    return _storable(cid, "checkpoint_id")


def storable_text(value: str, what: str) -> str:
    """``value`` if it is text a database can hold (no lone surrogates); a
    :class:`ConfigError` otherwise, before anything is written (SQLite's and psycopg's
    drivers would raise a raw ``UnicodeEncodeError`` mid-call). For the ids of writes
    and channels, which LangGraph makes and ``_storable``'s other limits do not apply to.
    """
    if value.isascii():
        return value
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ConfigError(f"{what} {value!r} is not valid text (lone surrogate): {exc}") from exc
    return value


def make_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    """The config that addresses one stored checkpoint."""
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def stored_tuple(
    thread_id: str,
    ns: str,
    checkpoint_id: str,
    parent_id: str | None,
    checkpoint: dict[str, Any],
    values: dict[str, Any],
    metadata: dict[str, Any],
    pending: list[tuple[str, str, Any]],
) -> CheckpointTuple:
    """The ``CheckpointTuple`` of a stored checkpoint, as every backend returns it: its
    config and its parent's (None for a thread's first), the decoded checkpoint with its
    channel values, its metadata and its pending writes."""
    return CheckpointTuple(
        config=make_config(thread_id, ns, checkpoint_id),
        checkpoint=cast(Checkpoint, {**checkpoint, "channel_values": values}),
        metadata=cast(CheckpointMetadata, metadata),
        parent_config=make_config(thread_id, ns, parent_id) if parent_id else None,
        pending_writes=pending,
    )


__all__ = [
    "MAX_ID_BYTES",
    "checkpoint_id_of",
    "checkpoint_id_value",
    "checkpoint_ns_of",
    "make_config",
    "storable_text",
    "stored_tuple",
    "thread_id_of",
]
