"""What recording a model answer costs, against a model call of realistic latency.

``python benchmarks/model_record.py [--calls N] [--latency-ms 300] [--postgres DSN]``

A one-node graph calls ``durable_model(model)``; the model is a fake that sleeps
``--latency-ms`` (default 300 ms, a short real LLM call) and answers with two tool calls.
Around each ``ainvoke`` the node times the whole call and, inside the model, the model's
own time; the difference is what recording added (the input's digest, the read that
finds no record, the record committed - one commit - before the answer is returned). A
second pass re-runs the same steps after their checkpoints were lost (as durability
``"exit"`` loses them in a crash): each answer is replayed (one read, one count), no model
is asked. Reported: the median of each, and the fresh call's cost as a fraction of the
model's latency.

SQLite by default (a file in a temporary directory); ``--postgres DSN`` for PostgreSQL.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import START, MessagesState, StateGraph

from langgraph_idem_saver import AsyncSqliteSaver
from langgraph_idem_saver.durable_model import durable_model


class SlowModel(BaseChatModel):
    """Sleeps ``latency`` seconds, then asks for two charges under fresh ids."""

    latency: float
    model_ms: list[float]

    @property
    def _llm_type(self) -> str:
        return "slow-fake"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, **kw: Any) -> ChatResult:
        raise NotImplementedError("async only")

    async def _agenerate(
        self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **kw: Any
    ) -> ChatResult:
        start = time.perf_counter()
        await asyncio.sleep(self.latency)
        calls = [
            {"name": "charge", "args": {"invoice": f"inv-{i}"}, "id": uuid.uuid4().hex[:12]}
            for i in range(2)
        ]
        message = AIMessage(
            "",
            tool_calls=[{**c, "type": "tool_call"} for c in calls],  # type: ignore[typeddict-item]
            usage_metadata={"input_tokens": 120, "output_tokens": 40, "total_tokens": 160},
        )
        self.model_ms.append((time.perf_counter() - start) * 1000)
        return ChatResult(generations=[ChatGeneration(message=message)])


def losing(saver_class: type) -> type:
    """The saver, dropping checkpoints and writes while ``losing`` (a crash's loss)."""

    class Losing(saver_class):  # type: ignore[misc,valid-type]
        losing = False

        async def aput(self, config: Any, checkpoint: Any, metadata: Any, versions: Any) -> Any:
            if self.losing:
                c = config["configurable"]
                return {"configurable": {**c, "checkpoint_id": checkpoint["id"]}}
            return await super().aput(config, checkpoint, metadata, versions)

        async def aput_writes(self, config: Any, writes: Any, task_id: str, path: str = "") -> None:
            if not self.losing:
                await super().aput_writes(config, writes, task_id, path)

    return Losing


async def measure(saver: Any, calls: int, latency: float) -> dict[str, float]:
    model = SlowModel(latency=latency, model_ms=[])
    llm = durable_model(model)
    total_ms: list[float] = []

    async def node(state: MessagesState) -> dict[str, Any]:
        start = time.perf_counter()
        answer = await llm.ainvoke(state["messages"])
        total_ms.append((time.perf_counter() - start) * 1000)
        return {"messages": [answer]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", node)
    builder.add_edge(START, "agent")
    graph = builder.compile(checkpointer=saver)
    history = [
        HumanMessage(f"turn {i}: please pay the invoices in the attachment") for i in range(6)
    ]

    saver.losing = True  # the fresh calls' checkpoints are lost: the second pass re-runs them
    for i in range(calls):
        config = {"configurable": {"thread_id": f"bench-{i}"}}
        await graph.ainvoke({"messages": history}, config, durability="exit")
    saver.losing = False
    fresh = [t - m for t, m in zip(total_ms, model.model_ms, strict=True)]
    total_ms.clear()
    for i in range(calls):
        config = {"configurable": {"thread_id": f"bench-{i}"}}
        await graph.ainvoke({"messages": history}, config, durability="exit")
    assert len(model.model_ms) == calls, "the second pass asked the model"
    assert llm.recorder.counts.replayed == calls
    return {
        "fresh_ms": statistics.median(fresh),
        "replay_ms": statistics.median(total_ms),
        "model_ms": statistics.median(model.model_ms),
    }


async def main(args: argparse.Namespace) -> None:
    if args.postgres:
        from langgraph_idem_saver import AsyncPostgresSaver

        opener = losing(AsyncPostgresSaver).from_conn_string(args.postgres)
        where = "PostgreSQL"
    else:
        path = Path(tempfile.mkdtemp(prefix="model-record-")) / "bench.sqlite"
        opener = losing(AsyncSqliteSaver).from_conn_string(str(path))
        where = "SQLite (file)"
    async with opener as saver:
        result = await measure(saver, args.calls, args.latency_ms / 1000)
    fraction = result["fresh_ms"] / result["model_ms"]
    print(f"{where}, {args.calls} model calls of {result['model_ms']:.0f} ms (median):")
    print(f"  recorded call: +{result['fresh_ms']:.2f} ms ({fraction:.2%} of the model's latency)")
    print(f"  replayed call: {result['replay_ms']:.2f} ms, no model asked")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--latency-ms", type=float, default=300.0)
    parser.add_argument("--postgres", metavar="DSN", default=None)
    asyncio.run(main(parser.parse_args()))
