"""Stored values as stable JSON: messages, channel values, ledger entries, thread status.

Pure functions over what the saver returns; both the JSON output and the tables are
built from these, so the two never disagree.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Any

from langgraph_idem_saver.cli.common import KEY_SHORT, compact_json, from_epoch, iso
from langgraph_idem_saver.errors import CorruptRecordError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry

TASKS = "__pregel_tasks"
BRANCH_PREFIX = "branch:to:"


def head_status(
    head: dict[str, Any] | None, *, interrupted: bool, errored: bool, exists: bool = True
) -> tuple[str, list[str]]:
    """``(status, next)`` of a thread from its latest root checkpoint (see the module doc).

    ``head`` is the stored checkpoint; when it carries ``channel_values`` (``show``), the
    nodes of pending ``Send``s are named, else they show as ``(send)``.
    """
    if not exists:
        return "empty", []
    updated = head.get("updated_channels") if head is not None else None
    nxt: list[str] = []
    if updated is not None:
        for channel in sorted(updated):
            if channel.startswith(BRANCH_PREFIX):
                nxt.append(channel[len(BRANCH_PREFIX) :])
            elif channel == "__start__":
                nxt.append("__start__")
            elif channel == TASKS:
                sends = (head or {}).get("channel_values", {}).get(TASKS)
                nodes = [getattr(s, "node", None) for s in sends or ()]
                if nodes and all(isinstance(n, str) for n in nodes):
                    nxt += sorted(set(nodes) - set(nxt))  # type: ignore[arg-type]
                else:
                    nxt.append("(send)")
    if interrupted:
        return "interrupted", nxt
    if errored:
        return "error", nxt
    if updated is None:
        return "unknown", nxt
    return ("pending" if nxt else "done"), nxt


ROLES = {"human": "user", "ai": "assistant", "tool": "tool", "system": "system"}


def content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, str):
                parts.append(block)
            elif isinstance(block, dict) and isinstance(block.get("text"), str):
                parts.append(block["text"])
            else:
                parts.append(compact_json(jsonable(block)))
        return "\n".join(parts)
    return compact_json(jsonable(content))


def message_dict(message: Any, index: int | None = None) -> dict[str, Any]:
    """A message as stable JSON: role, content (text), tool calls, tool-call id."""
    tool_calls = getattr(message, "tool_calls", None) or []
    return {
        "index": index,
        "id": message.id,
        "role": ROLES.get(message.type, message.type),
        "content": content_text(message.content),
        "name": getattr(message, "name", None),
        "tool_calls": [
            {"id": c.get("id"), "name": c.get("name"), "args": jsonable(c.get("args"))}
            for c in tool_calls
        ],
        "tool_call_id": getattr(message, "tool_call_id", None),
        "status": getattr(message, "status", None) if message.type == "tool" else None,
    }


def is_message(value: Any) -> bool:
    from langchain_core.messages import BaseMessage

    return isinstance(value, BaseMessage)


def is_message_list(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(is_message(m) for m in value)


def jsonable(value: Any) -> Any:
    """Any channel value as JSON data (messages as :func:`message_dict`, else repr)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if is_message(value):
        return message_dict(value)
    if is_message_list(value):
        return [message_dict(m, i) for i, m in enumerate(value)]
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return jsonable(value.value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    dump = getattr(value, "model_dump", None)
    if callable(dump):
        try:
            return jsonable(dump())
        except Exception:
            return repr(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    return repr(value)


def is_internal_channel(name: str) -> bool:
    """LangGraph's bookkeeping channels (``branch:to:x``, ``__start__``, ...)."""
    return name.startswith("__") or ":" in name


def message_signature(m: dict[str, Any]) -> tuple[Any, ...]:
    return (m["role"], m["content"], compact_json(m["tool_calls"]), m["tool_call_id"])


def diff_messages(
    old: list[dict[str, Any]], new: list[dict[str, Any]]
) -> dict[str, list[dict[str, Any]]]:
    """Messages appended, removed and changed between two versions of a message list."""
    if [message_signature(m) for m in old] == [
        message_signature(m) for m in new[: len(old)]
    ] and len(new) >= len(old):
        return {"appended": new[len(old) :], "removed": [], "changed": []}
    old_by_id = {m["id"]: m for m in old if m["id"]}
    new_ids = {m["id"] for m in new if m["id"]}
    appended, changed = [], []
    for m in new:
        before = old_by_id.get(m["id"]) if m["id"] else None
        if before is None:
            appended.append(m)
        elif message_signature(before) != message_signature(m):
            changed.append(m)
    removed = [m for m in old if not m["id"] or m["id"] not in new_ids]
    return {"appended": appended, "removed": removed, "changed": changed}


def entry_dict(saver: Any, e: LedgerEntry, now: float) -> dict[str, Any]:
    """A ledger entry as stable JSON (see the module doc)."""
    from langgraph_idem_saver.inspection import decode_args, decode_result

    if e.status is CallStatus.ISSUED:
        state = "unknown" if e.is_unknown(now) else "in_progress"
    else:
        state = e.status.value
    try:
        args: Any = decode_args(e)
    except CorruptRecordError:
        args = e.args.decode("utf-8", "replace") if isinstance(e.args, bytes) else str(e.args)
    result: Any = None
    if e.result is not None:
        try:
            decoded = decode_result(saver, e)
        except CorruptRecordError as exc:
            result = f"<undecodable: {exc}>"
        else:
            result = content_text(decoded.content) if is_message(decoded) else jsonable(decoded)
    return {
        "key": e.key,
        "key_short": e.key[:KEY_SHORT],
        "scope": e.scope,
        "thread_id": e.thread_id,
        "agent_path": e.agent_path,
        "tool": e.tool_name,
        "tool_call_id": e.tool_call_id,
        "args": args,
        "status": e.status.value,
        "state": state,
        "attempts": e.attempts,
        "replays": e.replays,
        "conflicts": e.conflicts,
        "owner": e.owner,
        "issued_at": iso(from_epoch(e.issued_at)),
        "lease_expires_at": iso(from_epoch(e.lease_expires_at)),
        "finished_at": iso(from_epoch(e.finished_at)),
        "result": result,
        "error": e.error,
        "adopted_by": e.adopted_by,
        "run_id": e.run_id,
        "history": e.events(),
    }


def agent_matches(agent_path: str, wanted: str) -> bool:
    """Whether an entry of ``agent_path`` belongs to agent ``wanted``: the path itself or
    any path under it (``researcher`` holds ``researcher|tools``; not ``researcher2``)."""
    return agent_path == wanted or agent_path.startswith(wanted + "|")
