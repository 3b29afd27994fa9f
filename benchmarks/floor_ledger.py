"""The floor of the ledger protocol: what any implementation of it must write, no more.

``scale_out.py --stacks floor`` runs LangGraph's own ``AsyncPostgresSaver`` with this
hand-written middleware and nothing else: per tool call one synced ``INSERT`` of an
``issued`` row before the tool runs and one ``UPDATE`` with its result after; per model
call one ``INSERT`` of its answer. No engine, no adoption, no replay, no checks: it is not
a ledger anyone should use (a crash leaves rows nobody reads), only the price tag of the
writes the guarantees need (docs/guarantees.md: an ``issued`` row durable before the
effect, the outcome recorded after, the model's answer recorded before LangGraph gets it).
Its statements go over the saver's own connection, under the saver's lock, as ours do:
one connection a worker.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from langchain.agents.middleware import AgentMiddleware
from langchain.agents.middleware.types import ModelRequest, ModelResponse, ToolCallRequest
from langchain_core.messages import ToolMessage
from langgraph.config import get_config

FLOOR_TABLES = (
    """CREATE TABLE IF NOT EXISTS floor_tool_calls (
        thread_id text, call_id text, tool text, args text, status text, result text,
        PRIMARY KEY (thread_id, call_id))""",
    """CREATE TABLE IF NOT EXISTS floor_answers (
        thread_id text, ns text, step int, answer text, PRIMARY KEY (thread_id, ns, step))""",
)

_ISSUE = "INSERT INTO floor_tool_calls VALUES (%s, %s, %s, %s, 'issued', NULL)"
_FINISH = "UPDATE floor_tool_calls SET status = 'completed', result = %s WHERE thread_id = %s AND call_id = %s"  # noqa: E501
_ANSWER = "INSERT INTO floor_answers VALUES (%s, %s, %s, %s)"


class FloorLedgerMiddleware(AgentMiddleware):
    """The protocol's unavoidable writes over ``saver``'s connection (see the module)."""

    def __init__(self, saver: Any) -> None:
        super().__init__()
        self.saver = saver  # langgraph.checkpoint.postgres.aio.AsyncPostgresSaver

    @property
    def name(self) -> str:
        return "FloorLedgerMiddleware"

    async def _write(self, query: str, params: tuple[Any, ...]) -> None:
        # the saver's connection is in autocommit: each statement its own synced commit
        async with self.saver.lock, self.saver.conn.cursor() as cur:
            await cur.execute(query, params)

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        response = await handler(request)
        config = get_config()
        configurable = config.get("configurable", {})
        answer = json.dumps([m.model_dump() for m in response.result], default=str)
        step = int(config.get("metadata", {}).get("langgraph_step", 0))
        ns = str(configurable.get("checkpoint_ns", ""))
        await self._write(_ANSWER, (str(configurable["thread_id"]), ns, step, answer))
        return response

    async def awrap_tool_call(
        self, request: ToolCallRequest, handler: Callable[[ToolCallRequest], Awaitable[Any]]
    ) -> Any:
        call = request.tool_call
        thread_id = str(request.runtime.config.get("configurable", {})["thread_id"])
        args = json.dumps(call["args"], sort_keys=True)
        await self._write(_ISSUE, (thread_id, call["id"], call["name"], args))
        result = await handler(request)
        text = result.content if isinstance(result, ToolMessage) else str(result)
        await self._write(_FINISH, (json.dumps(text, default=str), thread_id, call["id"]))
        return result
