"""What OpenTelemetry costs the ledger: a 50-call ``IdempotentToolNode`` step on SQLite,
in four modes, each in fresh processes, interleaved:

* ``none`` - OpenTelemetry not importable (``sys.modules["opentelemetry"] = None``): the
  engine's hooks are the undecorated functions (``telemetry.ENABLED`` is False);
* ``api``  - the API installed, no SDK configured: OpenTelemetry's no-op spans;
* ``sdk``  - the SDK with a ``BatchSpanProcessor`` over an exporter that drops the spans,
  and a ``MeterProvider`` whose reader exports to nowhere every 60 s;
* ``sdk-1%`` - the same, sampling 1% of traces (``ParentBased(TraceIdRatioBased(0.01))``).

``python benchmarks/otel_cost.py [--rounds 3] [--steps 30]`` prints each mode's median
milliseconds a step, wall-clock and CPU (the process's, all threads: what a busy host
moves least), and their ratio to ``none``. One process a mode and round (the mode is
decided at import); the rounds alternate the modes so a noisy host moves them alike.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = ("none", "api", "sdk", "sdk-1%")

CHILD = r"""
import asyncio, json, sys, time
mode, path, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
if mode == "none":
    sys.modules["opentelemetry"] = None
if mode.startswith("sdk"):
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        MetricExporter, MetricExportResult, PeriodicExportingMetricReader)
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    class Drop(SpanExporter):
        def export(self, spans):
            return SpanExportResult.SUCCESS

    class DropMetrics(MetricExporter):
        def __init__(self):
            super().__init__()
        def export(self, metrics_data, timeout_millis=10_000, **kwargs):
            return MetricExportResult.SUCCESS
        def force_flush(self, timeout_millis=10_000):
            return True
        def shutdown(self, timeout_millis=30_000, **kwargs):
            pass

    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    sampler = ParentBased(TraceIdRatioBased(0.01)) if mode == "sdk-1%" else None
    provider = TracerProvider(sampler=sampler)
    provider.add_span_processor(BatchSpanProcessor(Drop()))
    trace.set_tracer_provider(provider)
    reader = PeriodicExportingMetricReader(DropMetrics(), export_interval_millis=60_000)
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph_idem_saver import AsyncSqliteSaver, IdempotentToolNode, telemetry

@tool
async def send(to: str) -> str:
    '''Send a message (a no-op).'''
    return f"sent to {to}"

def message(step):
    calls = [{"name": "send", "args": {"to": f"u{i}"}, "id": f"c{step}-{i}", "type": "tool_call"}
             for i in range(50)]
    return AIMessage("", id=f"ai-{step}", tool_calls=calls)

async def main():
    async with AsyncSqliteSaver.from_conn_string(path) as saver:
        builder = StateGraph(MessagesState)
        builder.add_node("tools", IdempotentToolNode([send]))
        builder.add_edge(START, "tools")
        graph = builder.compile(checkpointer=saver)
        times, cpus = [], []
        for step in range(steps + 5):
            config = {"configurable": {"thread_id": f"t{step}"}}
            started, cpu = time.perf_counter(), time.process_time()
            await graph.ainvoke({"messages": [message(step)]}, config, durability="sync")
            if step >= 5:  # warmed up
                times.append(time.perf_counter() - started)
                cpus.append(time.process_time() - cpu)
    print(json.dumps({"enabled": telemetry.ENABLED, "times": times, "cpu": cpus}))

asyncio.run(main())
"""


def run(mode: str, steps: int, where: Path, round_: int) -> tuple[list[float], list[float]]:
    path = where / f"{mode}-{round_}.sqlite"
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(path), str(steps)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    if done.returncode != 0:
        raise SystemExit(f"the {mode} run failed:\n{done.stderr[-3000:]}")
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["enabled"] is (mode != "none"), seen
    return seen["times"], seen["cpu"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    samples: dict[str, list[float]] = {m: [] for m in MODES}
    cpu: dict[str, list[float]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            order = MODES[round_ % len(MODES) :] + MODES[: round_ % len(MODES)]
            for mode in order:
                wall, used = run(mode, args.steps, Path(tmp), round_)
                samples[mode] += wall
                cpu[mode] += used
    base = statistics.median(samples["none"])
    base_cpu = statistics.median(cpu["none"])
    n = args.rounds * args.steps
    print(f"50 calls a step, SQLite, n={n} steps a mode; medians")
    print(f"{'mode':<7} {'wall ms':>9} {'vs none':>8} {'cpu ms':>9} {'vs none':>8}")
    for mode in MODES:
        wall_ms, cpu_ms = statistics.median(samples[mode]), statistics.median(cpu[mode])
        print(
            f"{mode:<7} {wall_ms * 1000:>9.2f} {wall_ms / base:>8.3f}"
            f" {cpu_ms * 1000:>9.2f} {cpu_ms / base_cpu:>8.3f}"
        )


if __name__ == "__main__":
    main()
