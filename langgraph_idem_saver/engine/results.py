"""Results as the ledger stores and replays them.

A recorded result is what the tool returned (a ``ToolMessage`` or a ``Command``),
serialized with the saver's serializer; replaying it re-addresses it to the tool call
that asks now (an adopted orphan's result answers a new id). Answers given by ``verify``
hooks, humans and operators are shaped the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import operator
from itertools import repeat
from typing import Any, Literal, cast

from langchain_core.messages import AIMessage, ToolCall, ToolMessage
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.prebuilt.tool_node import msg_content_output
from langgraph.types import Command, Send

from langgraph_idem_saver.errors import CorruptRecordError, SerializationError
from langgraph_idem_saver.ledger import CallStatus, LedgerEntry, Outcome, adopter_of

_ID = operator.itemgetter("id")


def calls_in_messages(messages: Any) -> list[tuple[str, str]] | None:
    """Every (tool call id, message id) of the AIMessages in a messages list, oldest
    first; None when there is no list (then the state is not visible to the engine)."""
    if not messages or not isinstance(messages, list):
        return None
    pairs: list[tuple[str, str]] = []
    for m in messages:  # a message's calls through map and zip: no Python frame a call
        if isinstance(m, AIMessage) and m.tool_calls:
            ids = map(str, map(_ID, m.tool_calls))
            pairs.extend(zip(ids, repeat(m.id or ""), strict=False))  # repeat: endless
    return pairs


def dumps(serde: SerializerProtocol, result: Any, what: str) -> tuple[str | None, bytes | None]:
    """``serde.dumps_typed(result)``, or :class:`SerializationError` naming ``what``."""
    try:
        return serde.dumps_typed(result)
    except Exception as exc:
        raise unserializable(what, exc) from exc


def unserializable(what: str, exc: Exception) -> SerializationError:
    """The error of a result the serializer refused (``what``: whose result)."""
    return SerializationError(
        f"the result of {what} cannot be serialized for the ledger ({type(exc).__name__}: {exc})"
    )


def loads_recorded(serde: SerializerProtocol, entry: LedgerEntry, what: str) -> Any:
    """The entry's recorded result as the tool returned it; a record the serializer cannot
    read is a :class:`CorruptRecordError` naming ``what`` and the entry, never a raw error."""
    assert entry.result is not None and entry.result_type is not None
    try:
        return serde.loads_typed((entry.result_type, entry.result))
    except Exception as exc:
        raise CorruptRecordError(
            what, location={"scope": entry.scope, "key": entry.key}, cause=exc
        ) from exc


def replayed_result(
    serde: SerializerProtocol,
    entry: LedgerEntry,
    call: ToolCall,
    messages_key: str,
    *,
    raw: bool = False,
) -> Any:
    """The recorded result, re-addressed to the current tool call id (``raw``: the value
    as recorded, for front doors whose results are not tool messages)."""
    if raw and entry.result is not None and entry.result_type is not None:
        return loads_recorded(serde, entry, "task result")
    if entry.result is None or entry.result_type is None:
        status: Literal["success", "error"] = (
            "error" if entry.status is CallStatus.FAILED else "success"
        )
        return ToolMessage(
            content=entry.error or f"{call['name']} already ran (no result was recorded)",
            name=call["name"],
            tool_call_id=call["id"],
            status=status,
        )
    value = loads_recorded(serde, entry, "tool call result")
    adopter = adopter_of(entry.adopted_by)
    recorded_ids = {entry.tool_call_id} | ({adopter} if adopter else set())
    if isinstance(value, ToolMessage):
        recorded_ids.add(value.tool_call_id)
    elif not isinstance(value, (Command, list)):
        return as_result(value, call, messages_key)
    return retarget(value, recorded_ids, call, messages_key)


def collect_tool_calls(value: Any, found: set[tuple[str, str]], depth: int = 0) -> None:
    """Add (tool call id, message id) for the tool calls of every AIMessage found in a
    channel value or a pending write (messages lists, ``Send`` packets carrying a state,
    nested dicts)."""
    if depth > 8:
        return
    if isinstance(value, AIMessage):
        found.update((str(tc["id"]), value.id or "") for tc in value.tool_calls if tc.get("id"))
    elif isinstance(value, dict):
        if value.get("type") == "ai" and isinstance(value.get("tool_calls"), list):
            message_id = str(value.get("id") or "")
            found.update(
                (str(tc["id"]), message_id)
                for tc in value["tool_calls"]
                if isinstance(tc, dict) and tc.get("id")
            )
            return
        for item in value.values():
            collect_tool_calls(item, found, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            collect_tool_calls(item, found, depth + 1)
    elif isinstance(value, Send):
        collect_tool_calls(value.arg, found, depth + 1)


def outcome_of(result: Any, result_type: str | None, data: bytes | None) -> Outcome:
    """The recorded outcome of a call that returned ``result`` (serialized as
    ``result_type``/``data``): ``failed`` for a ``ToolMessage`` with ``status="error"``
    (the tool's own error, handed to the model), ``completed`` otherwise."""
    if isinstance(result, ToolMessage) and result.status == "error":
        return Outcome.failed(text_of(result.content), result_type, data)
    return Outcome.completed(result_type, data)


def text_of(content: Any) -> str:
    return content if isinstance(content, str) else str(content)


def as_result(value: Any, call: ToolCall, messages_key: str = "messages") -> Any:
    """A verify/resume answer as what the tool would have returned for ``call``.

    A ``Command`` (e.g. a state update carrying spend) is kept; when its update holds
    exactly one ToolMessage, that message is re-addressed to ``call`` - a verify hook
    sees only the arguments, not the tool call id.
    """
    if isinstance(value, Command):
        update = value.update
        messages = update.get(messages_key) if isinstance(update, dict) else update
        tool_messages = [
            m
            for m in (messages if isinstance(messages, list) else [])
            if isinstance(m, ToolMessage)
        ]
        ids = {m.tool_call_id for m in tool_messages}
        if len(ids) == 1 and ids != {str(call["id"])}:
            value = retarget(value, ids, call, messages_key)
        elif any(m.name is None for m in tool_messages):
            value = copy.deepcopy(value)
        else:
            return value
        # as ToolNode's own Command validation does, name the answer after the tool
        update = value.update
        messages = update.get(messages_key) if isinstance(update, dict) else update
        for m in messages if isinstance(messages, list) else []:
            if isinstance(m, ToolMessage) and m.tool_call_id == call["id"] and m.name is None:
                m.name = call["name"]
        return value
    if isinstance(value, ToolMessage):
        msg = value.model_copy(update={"tool_call_id": call["id"]})
        if msg.name is None:
            msg.name = call["name"]
        return msg
    content = cast("str | list[str | dict[Any, Any]]", msg_content_output(value))
    return ToolMessage(content=content, name=call["name"], tool_call_id=call["id"])


def retarget(value: Any, old_ids: set[str], call: ToolCall, messages_key: str) -> Any:
    """Deep copy of a recorded result with its ToolMessages answering ``call`` instead.

    A message re-addressed to a different call also loses its message id, so that it is
    appended to the state rather than replacing the original message.
    """
    new_id = str(call["id"])

    def fix_message(msg: Any) -> Any:
        if isinstance(msg, ToolMessage) and msg.tool_call_id in old_ids:
            update: dict[str, Any] = {"tool_call_id": new_id}
            if msg.tool_call_id != new_id:
                update["id"] = None
            return msg.model_copy(update=update, deep=True)
        if (
            isinstance(msg, dict)
            and msg.get("tool_call_id") in old_ids
            and msg.get("type", msg.get("role")) in ("tool", None)
        ):
            fixed = dict(msg, tool_call_id=new_id)
            if msg.get("tool_call_id") != new_id:
                fixed.pop("id", None)
            return fixed
        return msg

    def fix(item: Any) -> Any:
        if isinstance(item, (ToolMessage, dict)):
            return fix_message(item)
        if isinstance(item, Command):
            update = item.update
            if isinstance(update, dict) and isinstance(update.get(messages_key), list):
                update = {**update, messages_key: [fix_message(m) for m in update[messages_key]]}
            elif isinstance(update, list):
                update = [fix_message(m) for m in update]
            return dataclasses.replace(item, update=update)
        return item

    value = copy.deepcopy(value)  # never hand out (or mutate) the recorded/leader object
    if isinstance(value, list):
        return [fix(v) for v in value]
    return fix(value)
